"""gpu_hostile.py - arena's steps beside another program that takes device memory at random (GPU).

  python bench/gpu_hostile.py RUN --image F.arena [--vram V] [--share-card S] [--steps N]
                              [--hostile] [--leave SIZE] [--seed S] [--blocks N]
                              [--squeeze SLACK] [--squeeze-at K [--squeeze-steps N]] [--grow-at K]
  python bench/gpu_hostile.py other --leave SIZE [--min 256M] [--max 8G] [--squeeze SLACK] [--seed S] [--stop FILE]

RUN is sample or train: the FLUX.1-dev transformer (bench/torch_flux.py's model and inputs,
1024x1024; train: LoRA r16 on the attention projections, AdamW, checkpointing every block)
attached to IMAGE with arena.torch.attach(vram=V, share_card=S), N steps, each on the same
inputs. Every step is timed (wall clock, the device synchronized) and its output hashed
(sample: the output tensor's bytes; train: the loss and, at the end, the LoRA weights), so
that a disturbed run can be compared with an undisturbed one step for step. A step that
raises is counted as failed and the loop goes on.

--hostile: `gpu_hostile.py other` runs beside it (the other program), started before
the attach and stopped after the last step. The other program first takes a ballast so
that the device has --leave bytes free (default 30G: the card as a smaller one, shared
with arena), and once arena's first step is done (a file it waits for), forever: waits 0.05-1 s, asks ONCE for a random size between --min and --max
(log-uniform, 256 MiB to 8 GiB by default; torch.empty on the device, an out-of-memory
error counted as a failure, not retried), holds it 0.2-2 s, frees it and gives it back to
the driver (torch.cuda.empty_cache). It writes its record (asks, successes, failures by
size) when stopped. --squeeze SLACK: each ask is instead for all the free memory but SLACK, so
that arena's own allocations run out inside a step (its out-of-memory retries, timed).
--squeeze-at K (with --hostile): no random asks; the other program takes all the free memory
but --squeeze (512M) right before step K and holds it for --squeeze-steps steps. With
--grow-at K (a larger image from step K: a work arena has not seen, whose activations torch
must allocate anew) it makes torch run out inside arena's forward at step K, for certain: the
step is retried by arena (h.retries(), OomRetryWarning); compare with the same run without
--hostile for the outputs.

Prints one JSON line: steps_s, the outputs' hashes, failed steps and their errors, arena's
retries (Handle.retries()), the OomRetryWarnings seen, the plan's decisions, each step
record's oom_retries, the NVML-free peak (the process's own use: total - least free is
not its own with another program beside it, so the driver's per-process count is read
through NVML where it can be), the other program's record.
Needs an NVIDIA GPU, torch, diffusers, peft and the arena package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


def other(a) -> None:
    """The other program: a ballast, then random sizes asked once each."""
    import arena_gpu as arena

    torch.cuda.init()
    rng = random.Random(a.seed)
    free, total = torch.cuda.mem_get_info()
    leave = arena.parse_size(a.leave)
    ballast = None
    if free > leave:
        ballast = torch.empty(free - leave, dtype=torch.uint8, device="cuda")
    lo, hi = math.log(arena.parse_size(a.min)), math.log(arena.parse_size(a.max))
    rec = {"ballast": 0 if ballast is None else ballast.numel(), "free_after_ballast": torch.cuda.mem_get_info()[0],
           "asks": 0, "ok": 0, "failed": 0, "asked_bytes": 0, "got_bytes": 0, "failed_sizes": [], "ok_sizes": []}
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    print("ready", flush=True)
    while a.go and not os.path.exists(a.go) and not stop["now"]:
        time.sleep(0.01)
    if a.hold:  # --squeeze-at: all the free memory but SLACK, taken and given back when told
        rec["holds"] = []
        held = None
        while not stop["now"] and not (a.stop and os.path.exists(a.stop)):
            want = os.path.exists(a.hold)
            if want and held is None:
                size = max(torch.cuda.mem_get_info()[0] - arena.parse_size(a.squeeze or "512M"), 1 << 20) & ~((1 << 20) - 1)
                held = torch.empty(size, dtype=torch.uint8, device="cuda")
                held[:: 1 << 20].fill_(1)
                torch.cuda.synchronize()
                rec["holds"].append({"bytes": size, "free_after": torch.cuda.mem_get_info()[0]})
                open(a.hold + ".held", "w").close()
            elif not want and held is not None:
                del held
                held = None
                torch.cuda.empty_cache()
                os.unlink(a.hold + ".held")
            time.sleep(0.005)
        with open(a.out, "w") as f:
            json.dump(rec, f)
        return
    while not stop["now"] and not (a.stop and os.path.exists(a.stop)):
        time.sleep(rng.uniform(0.05, 1.0))
        if stop["now"]:
            break
        if a.squeeze:  # all but SLACK of what is free: arena's next new allocation runs out
            size = max(torch.cuda.mem_get_info()[0] - arena.parse_size(a.squeeze), 1 << 20) & ~((1 << 20) - 1)
        else:
            size = int(math.exp(rng.uniform(lo, hi))) & ~((1 << 20) - 1)
        hold = rng.uniform(0.2, 2.0)
        rec["asks"] += 1
        rec["asked_bytes"] += size
        try:
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            x[:: 1 << 20].fill_(1)  # touch it: the memory is really used
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            rec["failed"] += 1
            rec["failed_sizes"].append(size)
            torch.cuda.empty_cache()
            continue
        rec["ok"] += 1
        rec["got_bytes"] += size
        rec["ok_sizes"].append(size)
        time.sleep(hold)
        del x
        torch.cuda.empty_cache()
    rec["success_rate"] = rec["ok"] / rec["asks"] if rec["asks"] else None
    with open(a.out, "w") as f:
        json.dump(rec, f)


def run(a) -> None:
    import arena_gpu as arena
    import arena_gpu.torch as at
    import torch_flux as tf

    torch.backends.cuda.enable_cudnn_sdp(False)
    if a.deterministic:  # a training run comparable bit for bit with another (cuBLAS and attention's backward)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    torch.cuda.init()
    tf.BLOCKS = a.blocks
    train = a.run == "train"
    res: dict = {"run": a.run, "vram": a.vram, "share_card": a.share_card, "hostile": a.hostile, "leave": a.leave,
                 "steps": a.steps}
    try:
        from arena_gpu.bench._meter import Nvml

        nv = Nvml()
    except Exception:  # no NVML: the peak is not recorded
        nv = None
    stop = tempfile.mktemp(prefix="hostile-stop-")
    go = tempfile.mktemp(prefix="hostile-go-")
    hold = tempfile.mktemp(prefix="hostile-hold-")
    peer_out = tempfile.mktemp(prefix="hostile-", suffix=".json")
    peer = None
    if a.hostile:  # the ballast before arena plans: a smaller card; the random asks after step 0
        peer = subprocess.Popen([sys.executable, os.path.abspath(__file__), "other", "--leave", a.leave, "--min", a.min,
                                 "--max", a.max, "--seed", str(a.seed), "--stop", stop, "--go", go, "--out", peer_out]
                                + (["--squeeze", a.squeeze] if a.squeeze else [])
                                + (["--hold", hold] if a.squeeze_at is not None else []),
                                stdout=subprocess.PIPE, text=True)
        if peer.stdout.readline().strip() != "ready":
            sys.exit("gpu_hostile.py: the other program did not start")
    res["free_at_attach"] = torch.cuda.mem_get_info()[0]
    m = tf.meta_model()
    kw: dict = {}
    if a.vram:
        kw["vram"] = a.vram
    if a.share_card:
        kw["share_card"] = True if a.share_card == "on" else (float(a.share_card) if "." in a.share_card else a.share_card)
    t0 = time.perf_counter()
    h = at.attach(m, a.image, mode="train" if train else "sample", device="cuda", **kw)
    res["setup_s"] = time.perf_counter() - t0
    x = tf.inputs()
    grown = None
    if a.grow_at is not None:  # a larger image from step K: a work whose activations arena has not seen
        from arena_gpu.bench._flux import LAYOUTS, Device, inputs as _inputs
        import dataclasses

        grown = _inputs(dataclasses.replace(LAYOUTS["flux-dev"], image_tokens=a.grow_tokens), Device("cuda"), 0)
    cur = {"x": x}
    if train:
        tf.add_lora(m)
        m.enable_gradient_checkpointing()
        m.train()
        ps = {n: p for n, p in m.named_parameters() if p.requires_grad}
        opt = torch.optim.AdamW(ps.values(), lr=1e-4)

        def step() -> str:
            opt.zero_grad(set_to_none=True)
            loss = m(**cur["x"]).sample.float().square().mean()
            loss.backward()
            opt.step()
            return digest(loss)
    else:

        def step() -> str:
            with torch.no_grad():
                return digest(m(**cur["x"]).sample)

    seen: list = []
    warnings.simplefilter("always", arena.OomRetryWarning)
    orig_show = warnings.showwarning

    def show(message, category, *args, **kw2):  # count arena's retry warnings, print them too
        if issubclass(category, arena.OomRetryWarning):
            seen.append(str(message))
        orig_show(message, category, *args, **kw2)

    warnings.showwarning = show
    hashes, times, failed, used = [], [], [], []
    def wait_for(path: str, there: bool) -> None:
        t = time.perf_counter()
        while os.path.exists(path) != there:
            if time.perf_counter() - t > 60:
                sys.exit(f"gpu_hostile.py: the other program did not {'take' if there else 'give back'} its hold")
            time.sleep(0.005)

    for i in range(a.steps):
        if i == 1 and peer is not None:
            open(go, "w").close()
        if grown is not None and i == a.grow_at:
            cur["x"] = grown
        if peer is not None and a.squeeze_at is not None and i == a.squeeze_at:
            open(hold, "w").close()
            wait_for(hold + ".held", True)
        if peer is not None and a.squeeze_at is not None and i == a.squeeze_at + a.squeeze_steps:
            os.unlink(hold)
            wait_for(hold + ".held", False)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        try:
            hashes.append(step())
            torch.cuda.synchronize()
        except (arena.Error, torch.OutOfMemoryError) as e:
            failed.append({"step": i, "error": f"{type(e).__name__}: {e}"[:400]})
            hashes.append(None)
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t1)
        used.append(nv.process_used(os.getpid()) if nv is not None else None)
        print(f"step {i} {times[-1]:.3f} s {hashes[-1]}", file=sys.stderr, flush=True)
    if peer is not None:
        open(stop, "w").close()
        peer.send_signal(signal.SIGTERM)
        peer.wait(timeout=60)
        with open(peer_out) as f:
            res["other"] = json.load(f)
        for f in (peer_out, stop, go, hold, hold + ".held"):
            if os.path.exists(f):
                os.unlink(f)
    res["steps_s"] = [round(t, 4) for t in times]
    res["hashes"] = hashes
    if train:
        res["lora_hash"] = hashlib.sha256(b"".join(bytes.fromhex(digest(p)) for p in ps.values())).hexdigest()[:16]
    res["failed_steps"] = failed
    res["retries"] = h.retries()
    res["retry_warnings"] = len(seen)
    res["decisions"] = h.decisions()
    st = h.stats()
    res["oom_retries_by_step"] = [r.get("oom_retries", 0) for r in st]
    res["nvml_used_peak"] = max((u for u in used if u is not None), default=None)
    ok = sorted(t for t, hh in zip(times[1:], hashes[1:]) if hh is not None)
    res["step_s_median"] = ok[len(ok) // 2] if ok else None
    h.detach()
    print(json.dumps(res), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", choices=["sample", "train", "other"])
    ap.add_argument("--image")
    ap.add_argument("--vram", default=None)
    ap.add_argument("--share-card", default=None, help="attach(share_card=...): on, a size, or a fraction")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=None, help="the first N blocks of each kind (arena synth --blocks N)")
    ap.add_argument("--hostile", action="store_true", help="run the other program beside the steps")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True): training runs comparable bit for bit (torch "
                         "raises where an operation has no deterministic kernel)")
    ap.add_argument("--leave", default="30G", help="the other program's ballast leaves this much of the device free")
    ap.add_argument("--min", default="256M")
    ap.add_argument("--max", default="8G")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--squeeze", default=None, metavar="SLACK",
                    help="each ask takes all the free memory but SLACK (instead of --min..--max): arena's own "
                         "allocations run out mid-step, and its retries are what keep the run going")
    ap.add_argument("--stop", default=None, help="other: stop when this file appears")
    ap.add_argument("--go", default=None, help="other: begin the random asks when this file appears")
    ap.add_argument("--hold", default=None, help="other: hold all the free memory but --squeeze while this file is "
                                                  "there (FILE.held says it is held), instead of random asks")
    ap.add_argument("--squeeze-at", type=int, default=None, metavar="K",
                    help="with --hostile: the other program takes all the free memory but --squeeze (default 512M) "
                         "right before step K and gives it back after --squeeze-steps steps, instead of random asks")
    ap.add_argument("--squeeze-steps", type=int, default=3)
    ap.add_argument("--grow-at", type=int, default=None, metavar="K",
                    help="from step K the image is larger (--grow-tokens image tokens): a work arena has not seen, "
                         "whose activations need memory its first steps did not")
    ap.add_argument("--grow-tokens", type=int, default=6400, help="image tokens from --grow-at (6400: 1280x1280)")
    ap.add_argument("--out", default=None, help="other: its record")
    a = ap.parse_args()
    if a.run == "other":
        other(a)
    else:
        run(a)


if __name__ == "__main__":
    main()
