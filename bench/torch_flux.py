"""torch_flux.py - the PyTorch adapter on the real diffusers Flux transformer (GPU).

One run per process (peak host RSS and device memory are the process's own):

  python bench/torch_flux.py RUN --image F.arena --safetensors F.safetensors [--vram 8G] ...
                            [--trace T.json]   (arena runs: 3 more steps traced)
                            [--trace-timed T.json]   (arena runs: the timed steps traced)
                            [--host-timing]    (host seconds per step: arena's calls, each
                                                training phase and whether the device waited
                                                for the host at its end, the host thread's
                                                CPU seconds, CPU stolen by the hypervisor)
                            [--fp8-compute on|off|auto] [--fp8-grad on|off]
                                               (an fp8 image: attach's fp8_compute, and the
                                                input's gradient as an FP8 product or not)
                            [--profile P.txt]  (one more step under torch's profiler: its
                                                kernels' device time, the top 40)

RUN is one of
  plain-sample     the plain model, weights loaded with safetensors to the GPU: the resident step
  arena-sample     arena.torch.attach (--vram: streamed when the model does not fit)
  diffusers-sample diffusers group offloading (block_level, use_stream) from CPU weights
  plain-train      LoRA (rank 16, attention projections), AdamW, checkpointing, all resident
  arena-train      the same through arena.torch.attach (--vram)
  pretrained-sample / pretrained-train
                   arena.torch.from_pretrained(FluxTransformer2DModel, --folder, cache=--cache,
                   vram=--vram, compile=--compile): "converted" says whether it made the cache's entry
                   (cold) or found it (warm); with --compile, torch's compile counters after the
                   first step and after all (recompiles under streaming: none)
and prints one JSON line: step times (CUDA events on torch's stream between steps, the host not
waiting between them; --sync: a device-wide synchronize after each step, see time_steps),
the set-up time, the wall time per step, the peak device memory the process used (all of it:
total - min free, read after every step; torch's and arena's), peak host
RSS, and for arena runs the plan and the engine's records. Train runs save
the LoRA gradients of their first step (--grads FILE) so that two runs can
be compared. The limit, measured in the same process after the steps:
h2d_bytes_per_s, the pinned host-to-device rate (a streamed sample step's
bound is its moved bytes over it; bench/train_bound.py gives a training
step's); a resident run beside it, on the same machine, for the ratio to
resident. Needs a machine with an NVIDIA GPU, torch, diffusers and the
arena package. The model is the FLUX.1-dev config built on the meta device;
1024x1024: 4096 image tokens and 512 text tokens, batch 1, bf16; flash
attention (cuDNN's SDPA backward crashed on this torch, so it is off).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import time

import torch

# The model and its inputs are those of `python -m arena_gpu.bench`, the README's table.
from arena_gpu.bench._flux import FLUX_DEV, LAYOUTS, Device
from arena_gpu.bench._flux import inputs as _inputs


def rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_parts() -> dict:
    """This process's resident memory now, by kind (/proc/self/status, bytes):
    VmHWM (peak), VmRSS, RssAnon (heap, pinned host copies), RssFile (mapped
    files: libraries, an mmapped image), RssShmem."""
    out = {}
    try:
        for line in open("/proc/self/status"):
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


TIMING_EVENTS: list = []  # the step boundaries of the last time_steps
# train runs: (forward end, backward end, the last double block's recompute
# start or None) CUDA events of each timed step
PHASES: list | None = None
# the backward's turn from the single blocks to the double blocks: an event
# recorded when the last double block's recompute starts (its forward's
# pre-hook, first of its hooks, while a backward runs; arena's acquire of a
# whole block runs around the module's call, so a wait for its bytes falls
# before the event, one for a piece's after it)
SPLIT: dict = {"in_backward": False, "ev": None}


def split_hook(module, args) -> None:
    if SPLIT["in_backward"] and SPLIT["ev"] is None and PHASES is not None:
        SPLIT["ev"] = torch.cuda.Event(enable_timing=True)
        SPLIT["ev"].record()


def block_table(h) -> list:
    """[name, bytes, resident] of each of the arena's blocks (pieces) now."""
    return [[b.name, b.nbytes, h.arena.block_state(b.index)[0]] for b in h.arena.blocks]


class DevPeak:
    """The process's peak device memory: total - the least free seen."""

    def __init__(self) -> None:
        self.total = torch.cuda.mem_get_info()[1]
        self.base = self.total - torch.cuda.mem_get_info()[0]  # the CUDA context before anything
        self.min_free = self.total

    def read(self) -> None:
        f = torch.cuda.mem_get_info()[0]
        self.min_free = min(self.min_free, f)

    def used(self) -> int:
        """Bytes the process took after the CUDA context (torch's and arena's)."""
        return self.total - self.min_free - self.base


def h2d_rate(nbytes: int = 256 << 20, n: int = 5) -> float:
    """The host-to-device copy rate of pinned memory now, in bytes/s (the median of n
    copies of nbytes): the limit a streamed step is held to, measured in the same run."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rates = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        rates.append(nbytes / (a.elapsed_time(b) / 1e3))
    del src, dst
    torch.cuda.empty_cache()
    return sorted(rates)[n // 2]


def with_memory_steps(step, h, res: dict):
    """step, then arena's view of the process's memory (h.arena.memory()) appended to
    res["memory_steps"]: process, other, arena, rest, rest_need, rest_limit, learned."""
    mem_steps: list = []
    res["memory_steps"] = mem_steps
    keys = ("process", "other", "arena", "rest", "rest_need", "rest_limit", "learned")

    def recorded():
        step()
        mi = h.arena.memory()
        mem_steps.append([mi[k] for k in keys])

    return recorded


def inputs(seed: int = 0):
    return _inputs(LAYOUTS["flux-dev"], Device("cuda"), seed)


BLOCKS = None  # --blocks N: the first N of each repeated container (arena synth --blocks N)


def meta_model():
    from diffusers import FluxTransformer2DModel

    cfg = dict(FLUX_DEV)
    if BLOCKS is not None:
        cfg.update(num_layers=BLOCKS, num_single_layers=BLOCKS)
    with torch.device("meta"):
        m = FluxTransformer2DModel(**cfg).to(torch.bfloat16)
    m.requires_grad_(False)
    return m


def add_lora(m) -> None:
    from peft import LoraConfig

    torch.manual_seed(1)
    m.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                             init_lora_weights="gaussian"))
    torch.manual_seed(2)
    for n, p in m.named_parameters():
        if "lora_" in n:
            p.data = p.data.to(device="cuda", dtype=torch.bfloat16)
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.01)


SYNC = False  # --sync: a device-wide synchronize after every step (see time_steps)


HOST_TIMING = False
HOST: dict = {}  # --host-timing: host seconds in arena's calls, this step


def host_timing(a) -> None:
    """Time arena's step_end, acquire and release on the host (per step, in HOST)."""
    for name in ("step_end", "acquire", "release", "step_begin"):
        f = getattr(a, name)

        def wrap(*args, _f=f, _n=name, **kw):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kw)
            finally:
                HOST[_n] = HOST.get(_n, 0.0) + time.perf_counter() - t0
                HOST["n_" + _n] = HOST.get("n_" + _n, 0) + 1

        setattr(a, name, wrap)
    # Python's collector: its seconds and collections a step (a pause on the host
    # thread that queues the step's work).
    gc_t0 = [0.0]

    def gc_cb(phase, info):
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            HOST["gc_s"] = HOST.get("gc_s", 0.0) + time.perf_counter() - gc_t0[0]
            HOST["n_gc%d" % info["generation"]] = HOST.get("n_gc%d" % info["generation"], 0) + 1

    gc.callbacks.append(gc_cb)


def cpu_steal() -> float:
    """Seconds of CPU time stolen from this machine's CPUs so far (all CPUs, /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = f.readline().split()
        return int(v[8]) / os.sysconf("SC_CLK_TCK") if len(v) > 8 else 0.0
    except OSError:
        return 0.0


def profile_step(step, path: str) -> None:
    """One step under torch.profiler (CPU and CUDA activity): the kernels' device
    seconds, top 40 by CUDA time, and the step's, written to path."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        step()
        e1.record()
        torch.cuda.synchronize()
    with open(path, "w") as f:
        f.write(f"step {e0.elapsed_time(e1) / 1e3:.4f} s (device, under the profiler)\n")
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60))


def cprofile_steps(step, path: str, n: int = 2) -> None:
    """n steps under Python's cProfile (the host's time by Python function and
    the C calls it makes: where a host-bound step goes), the top 60 by own
    time and by cumulative time, written to path."""
    import cProfile
    import io
    import pstats

    torch.cuda.synchronize()
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    pr.disable()
    wall = time.perf_counter() - t0
    out = io.StringIO()
    out.write(f"{n} steps under cProfile: {wall:.3f} s wall\n")
    st = pstats.Stats(pr, stream=out)
    st.sort_stats("tottime").print_stats(60)
    st.sort_stats("cumulative").print_stats(60)
    with open(path, "w") as f:
        f.write(out.getvalue())


def time_steps(step, n: int, peak: DevPeak, res: dict | None = None):
    """Seconds of each of n steps on the device: between CUDA events recorded on
    torch's stream after each step, the host never waiting in between (as a
    sampling or training loop runs: .item() waits for torch's stream only). With
    --sync, the old way: torch.cuda.synchronize() after each step, which also waits
    for arena's copy stream, already copying the next step's first blocks (that
    time then counts in this step, and the next starts with the copies idle).
    res gets the wall seconds of all n steps / n."""
    out = []
    if SYNC:
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
            peak.read()
        return out
    torch.cuda.synchronize()
    w0 = time.perf_counter()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    TIMING_EVENTS[:] = ev
    ev[0].record()
    hosts = []
    for i in range(n):
        HOST.clear()
        t0 = time.perf_counter()
        c0, st0 = time.thread_time(), cpu_steal()
        step()
        ev[i + 1].record()
        if HOST_TIMING:
            HOST["step_host_s"] = time.perf_counter() - t0
            # the host thread's own CPU seconds in the step, and the seconds the
            # hypervisor gave the machine's CPUs to others meanwhile (/proc/stat steal)
            HOST["thread_cpu_s"] = time.thread_time() - c0
            HOST["steal_s"] = cpu_steal() - st0
            hosts.append({k: round(v, 4) if isinstance(v, float) else v for k, v in HOST.items()})
        peak.read()
    if res is not None and hosts:
        res["host_steps"] = hosts
    torch.cuda.synchronize()
    if res is not None:
        res["wall_per_step_s"] = (time.perf_counter() - w0) / n
    return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--image")
    ap.add_argument("--safetensors")
    ap.add_argument("--vram", default=None)
    ap.add_argument("--reserve", default=None)
    ap.add_argument("--depth", type=int, default=None, help="arena runs: copies in flight ahead (ring = depth + 1 slots)")
    ap.add_argument("--host-timing", action="store_true", help="arena runs: host seconds in step_end/acquire/release per step")
    ap.add_argument("--piece-size", default=None, help="arena runs: stream blocks in pieces of at most this size")
    ap.add_argument("--keep-last", type=int, default=None, help="arena train runs: the ring's extra slots")
    ap.add_argument("--rest-extra", default=None, metavar="SIZE@A-B",
                    help="arena runs: report SIZE more device memory held by the rest of the process at step ends A..B "
                         "(counted from 0): blocks leave the device and come back; records the host copies and RSS at "
                         "every step end (rest_trace)")
    ap.add_argument("--offload-saved", default=None, metavar="on|SIZE",
                    help="arena train runs: attach(offload_saved=...): saved tensors wait in host memory")
    ap.add_argument("--host-budget", default=None, metavar="SIZE",
                    help="arena runs: attach(host_budget=SIZE): host copies of streamed blocks up to SIZE, the rest read from the image")
    ap.add_argument("--no-learn", action="store_true", help="arena runs: plan by bytes, no learned profile (learn=False)")
    ap.add_argument("--fp8-compute", default=None, choices=["on", "off", "auto"],
                    help="arena runs on an fp8-e4m3 image: attach(fp8_compute=True|False|'auto'); default attach's")
    ap.add_argument("--fp8-grad", default=None, choices=["on", "off"],
                    help="native FP8 training: the input's gradient as an FP8 product (on, the default: "
                         "arena.torch._fp8.GRAD_FP8) or with the weight dequantized for it (off)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="after the timed steps, one more under torch.profiler: its kernels' device time "
                         "(top 40 by CUDA time) and the step's device seconds written to FILE")
    ap.add_argument("--cprofile", default=None, metavar="FILE",
                    help="after the timed steps, two more under Python's cProfile: the host's time by function, "
                         "the top 60 by own and by cumulative time")
    ap.add_argument("--folder", default=None, help="pretrained runs: the model's folder (config.json, safetensors)")
    ap.add_argument("--cache", default=None, help="pretrained runs: the cache's folder (default arena's)")
    ap.add_argument("--quant", default=None, help="pretrained runs: from_pretrained(quant=...)")
    ap.add_argument("--compile", action="store_true",
                    help="pretrained runs: compile=True; plain runs: each block compiled (fullgraph=True) as arena does")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() before the timed steps (the collector stays on)")
    ap.add_argument("--no-gc", action="store_true", help="Python's cyclic collector off during the timed steps (gc.freeze + gc.disable)")
    ap.add_argument("--grads", default=None)
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--sync", action="store_true", help="time each step with a device-wide synchronize (see time_steps)")
    ap.add_argument("--trace", default=None, help="arena runs: after the timed steps, trace 3 more into this file")
    ap.add_argument("--trace-timed", default=None, metavar="T.json",
                    help="arena runs: trace the timed steps themselves into this file (moves, looks and all)")
    ap.add_argument("--contend-bwd", default=None, metavar="SIZE",
                    help="train runs: host-to-device copies of SIZE in all (pinned, 256 MiB each, on a stream "
                         "of their own) started with each backward, beside its compute: the resident backward "
                         "as a streamed run's copies leave it (the copy engines share the device's memory); "
                         "records contend_bwd_bytes and contend_copy_s (the copies' own seconds a step)")
    a = ap.parse_args()
    global BLOCKS, SYNC, PHASES
    BLOCKS = a.blocks
    SYNC = a.sync
    global HOST_TIMING
    HOST_TIMING = a.host_timing
    torch.backends.cuda.enable_cudnn_sdp(False)
    t_start = time.perf_counter()
    torch.cuda.init()
    peak = DevPeak()
    res = {"run": a.run, "vram": a.vram, "reserve": a.reserve, "depth": a.depth, "piece_size": a.piece_size, "context_bytes": peak.base}
    train = a.run.endswith("-train")
    h = None
    if a.run.startswith("plain"):
        from safetensors.torch import load_file

        m = meta_model()
        t0 = time.perf_counter()
        sd = load_file(a.safetensors, device="cuda")
        m.load_state_dict(sd, assign=True)
        del sd
        m.requires_grad_(False)
        res["setup_s"] = time.perf_counter() - t0
    elif a.run.startswith("arena"):
        import arena_gpu.torch as at

        t0 = time.perf_counter()
        m = meta_model()
        res["model_build_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        _open = at._open

        def timed_open(*args, **kw):
            t1 = time.perf_counter()
            r = _open(*args, **kw)
            res["open_s"] = time.perf_counter() - t1
            return r

        at._open = timed_open
        # only the options given: attach's defaults are the product's (vram None, the
        # reserve learned, piece_size "auto")
        kw = {k: v for k, v in dict(vram=a.vram, reserve=a.reserve, depth=a.depth, piece_size=a.piece_size,
                                      keep_last=a.keep_last, host_budget=a.host_budget).items() if v is not None}
        if a.no_learn:
            kw["learn"] = False
        if a.fp8_compute is not None:
            kw["fp8_compute"] = {"on": True, "off": False, "auto": "auto"}[a.fp8_compute]
        if a.fp8_grad is not None:
            from arena_gpu.torch import _fp8

            _fp8.GRAD_FP8 = a.fp8_grad == "on"
        if a.offload_saved:
            kw["offload_saved"] = True if a.offload_saved == "on" else a.offload_saved
        h = at.attach(m, a.image, mode="train" if train else "sample", device="cuda", **kw)
        res["setup_s"] = time.perf_counter() - t0
        res["rss_after_setup"] = rss_parts()
        res["plan"] = h.plan()
        if a.rest_extra:
            import arena_gpu as arena

            size, _, span = a.rest_extra.partition("@")
            extra, (lo, hi) = arena.parse_size(size), (int(x) for x in span.split("-"))
            base, trace = h._rest_memory, []
            res["rest_trace"] = trace

            def rest() -> int:
                k = len(trace)
                pl = h.plan()
                trace.append([k, pl["host_bytes"], pl["n_resident"], rss_parts().get("VmRSS", 0)])
                return (base() or 0) + (extra if lo <= k <= hi else 0)

            h._rest_memory = rest
        if a.host_timing:
            host_timing(h.arena)
        res["memory_after_setup"] = h.arena.memory()
    elif a.run.startswith("pretrained"):
        # arena.torch.from_pretrained of a model folder (config.json and its safetensors):
        # converted into the cache (--cache) on a first call, found there on the next;
        # --compile: compile=True (each block compiled, torch's artifacts kept in the entry)
        import arena_gpu as arena
        import arena_gpu.torch as at
        from diffusers import FluxTransformer2DModel

        before = {e["key"] for e in arena.cache_info(a.cache)}
        kw = {k: v for k, v in dict(vram=a.vram, piece_size=a.piece_size).items() if v is not None}
        if a.fp8_compute is not None:
            kw["fp8_compute"] = {"on": True, "off": False, "auto": "auto"}[a.fp8_compute]
        t0 = time.perf_counter()
        m = at.from_pretrained(FluxTransformer2DModel, a.folder, cache=a.cache, compile=a.compile,
                               mode="train" if train else "sample", **({"quant": a.quant} if a.quant else {}), **kw)
        res["setup_s"] = time.perf_counter() - t0
        m.requires_grad_(False)
        h = at.handle(m)
        info = arena.cache_info(a.cache)
        res["converted"] = any(e["key"] not in before for e in info)
        res["cache_entries"] = [{k: e.get(k) for k in ("key", "size", "made")} for e in info]
        res["plan"] = h.plan()
    elif a.run == "diffusers-sample":
        from safetensors.torch import load_file

        m = meta_model()
        t0 = time.perf_counter()
        m.load_state_dict(load_file(a.safetensors, device="cpu"), assign=True)
        m.enable_group_offload(onload_device=torch.device("cuda"), offload_device=torch.device("cpu"),
                               offload_type="block_level", num_blocks_per_group=1, use_stream=True)
        res["setup_s"] = time.perf_counter() - t0
    else:
        sys.exit(f"unknown run {a.run}")
    if a.compile and a.run.startswith("plain"):  # the compiled resident model: each block as arena compiles it
        for blk in list(m.transformer_blocks) + list(m.single_transformer_blocks):
            blk.compile(fullgraph=True)
    peak.read()
    x = inputs()
    if train:
        add_lora(m)
        m.enable_gradient_checkpointing()
        m.train()
        m.transformer_blocks[-1].register_forward_pre_hook(split_hook, prepend=True)
        ps = {n: p for n, p in m.named_parameters() if p.requires_grad}
        res["lora_params"] = sum(p.numel() for p in ps.values())
        opt = torch.optim.AdamW(ps.values(), lr=1e-4)
        first = {}

        def caught_up(name: str, t0: float, ev=None) -> None:
            # --host-timing: the host's seconds for a phase, and whether the device had
            # already done all it was given when the host got here (an event recorded
            # now is complete at once: the device waits for the host, not the other way)
            if HOST_TIMING:
                if ev is None:
                    ev = torch.cuda.Event()
                    ev.record()
                HOST[name + "_host_s"] = time.perf_counter() - t0
                HOST[name + "_device_waiting"] = bool(ev.query())

        contend = None
        if a.contend_bwd:
            import arena_gpu as _arena

            n_copies = max(1, _arena.parse_size(a.contend_bwd) // (256 << 20))
            contend = {"src": torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True),
                       "dst": torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
                       "stream": torch.cuda.Stream(), "n": n_copies, "evs": []}
            res["contend_bwd_bytes"] = n_copies * (256 << 20)

        def copies_beside() -> None:
            # the copies start with the backward (the side stream waits for the forward)
            # and run beside it; the step's end waits for them
            c = contend
            c["stream"].wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(c["stream"]):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(c["n"]):
                    c["dst"].copy_(c["src"], non_blocking=True)
                e1.record()
            c["evs"].append((e0, e1))

        def step():
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = m(**x).sample.float().square().mean()
            ev = None
            if PHASES is not None:
                PHASES.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                PHASES[-1][0].record()
                ev = PHASES[-1][0]
            caught_up("fwd", t0, ev)
            if contend is not None:
                copies_beside()
            t0 = time.perf_counter()
            SPLIT["in_backward"], SPLIT["ev"] = True, None
            loss.backward()
            SPLIT["in_backward"] = False
            ev = None
            if PHASES is not None:
                PHASES[-1][1].record()
                PHASES[-1] = (*PHASES[-1], SPLIT["ev"])
                ev = PHASES[-1][1]
            caught_up("bwd", t0, ev)
            if not first:
                first.update({n: p.grad.detach().float().cpu() for n, p in ps.items()})
            t0 = time.perf_counter()
            opt.step()
            caught_up("opt", t0)
            if contend is not None:
                torch.cuda.current_stream().wait_stream(contend["stream"])
    else:

        def step():
            with torch.no_grad():
                m(**x)

    if h is not None:
        step = with_memory_steps(step, h, res)

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    res["first_step_s"] = time.perf_counter() - t0
    if a.compile:
        from torch._dynamo.utils import counters

        res["compile_counters_first_step"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "inductor")}
    res["start_to_first_step_end_s"] = time.perf_counter() - t_start
    peak.read()
    # the timed steps' own peak too: the engine gives back what torch took past
    # its reserve at the first step's end (device_peak_bytes keeps the first step)
    steady = DevPeak()
    steady.base = peak.base
    res["sync"] = SYNC
    if a.no_gc or a.gc_freeze:
        gc.collect()
        gc.freeze()
    if a.no_gc:
        gc.disable()
    if train and not SYNC:
        PHASES = []
    if h is not None and a.trace_timed:
        with h.trace(a.trace_timed, max_events=1 << 20):
            res["steps_s"] = time_steps(step, a.steps, steady, res)
    else:
        res["steps_s"] = time_steps(step, a.steps, steady, res)
    peak.min_free = min(peak.min_free, steady.min_free)
    res["device_peak_steady_bytes"] = steady.used()
    if PHASES:
        # forward (step start to the loss), backward, the rest (optimizer): device seconds
        res["phases_s"] = [[round(s0.elapsed_time(f) / 1e3, 4), round(f.elapsed_time(b) / 1e3, 4),
                            round(b.elapsed_time(s1) / 1e3, 4)]
                           for s0, (f, b, _), s1 in zip(TIMING_EVENTS[:-1], PHASES, TIMING_EVENTS[1:])]
        # the backward's two parts: the single blocks (to the last double block's
        # recompute), then the double blocks
        if all(d is not None for _, _, d in PHASES):
            res["backward_parts_s"] = [[round(f.elapsed_time(d) / 1e3, 4), round(d.elapsed_time(b) / 1e3, 4)]
                                       for f, b, d in PHASES]
    PHASES = None
    if train and contend is not None:  # the copies beside each backward: their own seconds
        res["contend_copy_s"] = [round(e0.elapsed_time(e1) / 1e3, 4) for e0, e1 in contend["evs"]]
    if a.compile:
        from torch._dynamo.utils import counters

        res["compile_counters"] = {k: dict(v) for k, v in counters.items() if k in ("stats", "recompiles", "inductor")}
    ss = sorted(res["steps_s"][1:])
    res["step_s_median"] = ss[len(ss) // 2]
    res["device_peak_bytes"] = peak.used()
    res["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    res["torch_max_allocated"] = torch.cuda.max_memory_allocated()
    ms = torch.cuda.memory_stats()
    res["torch_alloc_retries"] = ms.get("num_alloc_retries", 0)
    res["torch_device_frees"] = ms.get("num_device_free", 0)
    res["host_peak_rss"] = rss()
    if h is not None:
        res["offload"] = h.offload_stats()
    res["rss_after_steps"] = rss_parts()
    if h is not None and a.trace:
        with h.trace(a.trace):
            res["traced_steps_s"] = time_steps(step, 3, peak)
    if a.profile:
        profile_step(step, a.profile)
    if a.cprofile:
        cprofile_steps(step, a.cprofile)
    if h is not None:
        h.end_step()
        h.arena.sync()
        res["plan_after"] = h.plan()
        res["blocks"] = block_table(h)
        res["resident_blocks"] = sorted(nm for nm, _, resident in res["blocks"] if resident)
        from arena_gpu.torch import _fp8
        res["fp8_dequantize_way"] = dict(_fp8._DEQ_WAY)
        st = h.stats()
        res["decisions"] = h.decisions()
        res["records"] = [{k: r[k] for k in ("mode", "streamed_bytes", "moved_bytes", "misses", "stalls", "stall_s", "resident_bytes",
                                             "demotions", "promotions", "schedule_learned", "end_s", "plan_s", "move_s", "budget", "over_budget",
                                             "looked", "look_s", "look_now_s", "look_plan_s", "move_est_s", "move_gain_s", "move_held", "profile_learned",
                                             "disk_bytes", "disk_wait_s", "promoted_bytes", "host_read_bytes", "prepared_bytes")
                           if k in r} for r in st]
        res["streamed_bytes_median"] = sorted(r["streamed_bytes"] for r in st[2:])[len(st[2:]) // 2] if len(st) > 2 else 0
        res["moved_bytes_median"] = sorted(r["moved_bytes"] for r in st[2:])[len(st[2:]) // 2] if len(st) > 2 else 0
    if train and a.grads:
        torch.save(first, a.grads)
    gc.enable()
    t0 = time.perf_counter()
    gc.collect()
    res["gc_full_s"] = time.perf_counter() - t0
    res["gc_objects"] = len(gc.get_objects()) + (gc.get_freeze_count() if hasattr(gc, "get_freeze_count") else 0)
    # The rate probe last, with arena's memory given back first (detach closes the
    # arena) and 256 MiB copies (the rate is the same from 64 MiB up): the process
    # then holds less than it did in its steps, so a peak read from outside
    # (bench/vram_peak.py) is the steps'.
    if h is not None:
        h.detach()
    torch.cuda.empty_cache()
    res["h2d_bytes_per_s"] = h2d_rate(256 << 20)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
