"""examples/sample_flux.py, examples/train_lora.py and examples/train_lora_ddp.py at their tiny configs, run as a user runs them.

    python tests/python/test_examples.py -v      (torch, diffusers, peft and arena installed)

Each --tiny run as a user first runs one: with a new, empty TMPDIR, which is
empty again when it ends; on the CPU its transformer's blocks are streamed
(the simulated device under a small --vram). sample_flux: with no --out, a
PNG in the folder it runs in, the size asked for, the same pixels as the plain
transformer's (--plain). train_lora: with no --out or --steps, a few steps
into ./flux-lora, each said with its loss, its time and the time left;
previews; the files written as the umask says; a run stopped and resumed
from its checkpoint (every block resident: --vram) ends with the same LoRA
bit for bit as one that was not stopped, and the LoRA file loads back into a
FLUX pipeline (diffusers' load_lora_weights) and changes its transformer's
output. train_lora_ddp: two
processes (torchrun, gloo) compute the LoRA gradients one process computes
with --grad-accum 2, bit for bit, and hold one host copy of the streamed
blocks (the sum of their PSS of the shared region is its size, each holding
about half), which is gone once they end; with --share-host off they share
nothing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

# The LoRA file is checked here, in this process, with models of transformers
# and diffusers, whose warnings (a processor without torchvision, modules kept
# in float32 at .to(dtype), no LoRA keys for the text encoder) would split
# unittest's "test_x ... ok" line in two: their errors only (the examples'
# runs inherit it; their output is captured and shown on a failure).
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from tiers import slow

EXAMPLES = Path(os.environ.get("ARENA_EXAMPLES_DIR", Path(__file__).resolve().parent.parent.parent / "examples"))


# A run that has not ended after this many seconds is stopped and fails the
# test (a tiny config takes 5-40 s on a 2-core machine): a hang is a failure
# that says where each of its Python processes was, not a CI run cut off.
TIMEOUT = float(os.environ.get("ARENA_EXAMPLE_TIMEOUT", "600"))


# torch's own race at the end of a process of a gloo group (pytorch/pytorch
# issues 75097 and 190489: the process group's destructor, run with the GIL
# held where the last reference to the DDP model goes, joins a gloo thread
# that waits for the GIL to let go of a tensor): a worker whose run is done
# and said so now and then never exits (seen once in about 100 runs on a
# loaded 2-core machine: its stacks, its main thread at the module's last
# line and the other thread in C). A torchrun run stuck so, after its last
# line, is run again once; stuck before it, or twice, it fails.
DDP_TIMEOUT = float(os.environ.get("ARENA_EXAMPLE_DDP_TIMEOUT", "240"))


def run(script: str, *args: str, nproc: int = 0, env: Any = None, cwd: Any = None,
        done: Optional[str] = None) -> str:
    """The example run as a user runs it: ``python script``, or with nproc
    ``torchrun --standalone --nproc_per_node=nproc script`` (a free port), its
    store on 127.0.0.1: torchrun's own default, the host's name, need not
    resolve on a CI machine (the rendezvous then waits for good).

    ``done``: the run's last line's start; a torchrun run that printed it and
    then did not end within DDP_TIMEOUT is run again once (torch's race at
    exit, above), saying so on stderr.

    On a timeout every process of the run gets SIGABRT, workers first, and
    Python's faulthandler (on for the run) writes each one's threads' stacks to
    the stderr shown in the failure; what is still there 30 s later gets
    SIGKILL. The processes are found by their parents (descendants()), not by
    process group: torchrun starts each worker in a session of its own, which a
    signal to the run's group never reaches (a worker left waiting on a
    collective then held the output pipes open, and the test waited for good)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1",
              f"--nproc_per_node={nproc}"] if nproc else [sys.executable]
    env = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    limit = DDP_TIMEOUT if nproc and done else TIMEOUT
    for attempt in range(2 if nproc and done else 1):
        p = subprocess.Popen([*launch, str(EXAMPLES / script), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True)
        try:
            out, err = p.communicate(timeout=limit)
            break
        except subprocess.TimeoutExpired:
            out, err = stop(p)
            if attempt == 0 and done and any(line.startswith(done) for line in out.splitlines()):
                print(f"\n{script}: done but not ended after {limit:.0f} s (torch's race at exit): run again",
                      file=sys.stderr)
                continue
            raise AssertionError(f"{script} {' '.join(args)}: still running after {limit:.0f} s, stopped; "
                                 f"its output and stacks:\n{out[-2000:]}\n{err[-12000:]}") from None
    if p.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)}: exit {p.returncode}\n{out[-2000:]}\n{err[-3000:]}")
    return out


def stop(p: "subprocess.Popen[str]") -> Tuple[str, str]:
    """Every process of run ``p`` stopped (SIGABRT, workers first; SIGKILL 30 s
    later): what it wrote, its stacks included."""
    tree = descendants(p.pid)
    signal_all(reversed(tree), signal.SIGABRT)  # the workers first: torchrun, stopped, would stop them
    signal_all([p.pid], signal.SIGABRT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        signal_all([p.pid, *tree, *descendants(p.pid)], signal.SIGKILL)
        out, err = p.communicate(timeout=30)
    return out, err


def descendants(pid: int) -> List[int]:
    """The processes below ``pid`` (children, their children, ...), parents
    before their children, read off /proc: [] where there is none."""
    children: Dict[int, List[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state"
        children.setdefault(ppid, []).append(int(d))
    out: List[int] = []
    todo = list(children.get(pid, []))
    while todo:
        c = todo.pop(0)
        out.append(c)
        todo.extend(children.get(c, []))
    return out


def signal_all(pids: Iterable[int], sig: int) -> None:
    for q in pids:
        try:
            os.kill(q, sig)
        except ProcessLookupError:
            pass


def umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def streams(out: str) -> bool:
    """The run's first line says its transformer streams blocks (``--tiny`` on the
    CPU: the simulated device under a small --vram); on a GPU a tiny model fits."""
    m = re.search(r"^transformer \(.*image\.arena\): (\d+) blocks resident, (\d+) streamed", out, re.M)
    assert m, out
    return int(m[2]) > 0


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Examples(unittest.TestCase):
    tmp: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="arena-examples-")

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def fresh(self, name: str) -> Tuple[str, Dict[str, str]]:
        """A new empty folder to run in, and the environment of a run whose TMPDIR
        is a new empty folder (torch's own cache, which it keeps in TMPDIR from one
        run to the next, elsewhere): what a run leaves in TMPDIR is in it after."""
        cwd = os.path.join(self.tmp, name)
        os.makedirs(os.path.join(cwd + "-tmp"))
        os.makedirs(cwd)
        return cwd, dict(os.environ, TMPDIR=cwd + "-tmp", TORCHINDUCTOR_CACHE_DIR=os.path.join(self.tmp, "inductor"))

    def test_sample_flux(self) -> None:
        """--tiny as a user first runs it: no --out (flux.png in the folder it runs in),
        blocks streamed on the CPU, nothing left in TMPDIR; the plain transformer's
        pixels (--plain)."""
        cwd, env = self.fresh("sample")
        out = run("sample_flux.py", "--tiny", "--steps", "3", "--prompt", "a cat", env=env, cwd=cwd)
        self.assertEqual(streams(out), not torch.cuda.is_available(), out)
        self.assertIn("wrote flux.png", out)
        self.assertEqual(os.listdir(env["TMPDIR"]), [], "left in TMPDIR")
        a, p = os.path.join(cwd, "flux.png"), os.path.join(self.tmp, "plain.png")
        self.assertEqual(os.stat(a).st_mode & 0o777, 0o666 & ~umask())
        run("sample_flux.py", "--tiny", "--plain", "--steps", "3", "--prompt", "a cat", "--out", p, env=env)
        self.assertEqual(os.listdir(env["TMPDIR"]), [], "left in TMPDIR")
        ia, ip = np.asarray(Image.open(a)), np.asarray(Image.open(p))
        self.assertEqual(ia.shape, (32, 32, 3))
        self.assertGreater(ia.std(), 0, "a flat image")
        self.assertTrue(np.array_equal(ia, ip), "arena's transformer gave other pixels than the plain one")

    @slow
    def test_train_lora(self) -> None:
        """--tiny as a user first runs it: no --out (./flux-lora), a few steps, each
        said with its time and the time left, blocks streamed on the CPU, the files
        written as the umask says, nothing left in TMPDIR. Then a run stopped at step
        4 and resumed from its checkpoint (with --vram: every block resident) ends
        with the same LoRA bit for bit."""
        cwd, env = self.fresh("train")
        out = run("train_lora.py", "--tiny", "--rank", "4", env=env, cwd=cwd)
        self.assertEqual(streams(out), not torch.cuda.is_available(), out)
        steps = re.findall(r"^step (\d+)/(\d+): loss ([^,]+), ([\d.]+) s a step, ([^,]+) left$", out, re.M)
        self.assertEqual([(int(i), int(n)) for i, n, *_ in steps], [(i, 8) for i in range(1, 9)], out)
        self.assertTrue(all(np.isfinite(float(x[2])) for x in steps), out)
        self.assertEqual(steps[-1][4], "0 s", out)
        self.assertEqual(os.listdir(env["TMPDIR"]), [], "left in TMPDIR")
        a = os.path.join(cwd, "flux-lora")
        self.assertIn(f"wrote {os.path.join('flux-lora', 'pytorch_lora_weights.safetensors')}: 8 steps", out)
        for s in (4, 8):
            self.assertEqual(Image.open(os.path.join(a, f"preview-{s:06d}.png")).size, (32, 32))
        for f in os.listdir(a):
            self.assertEqual(os.stat(os.path.join(a, f)).st_mode & 0o777, 0o666 & ~umask(), f)
        # stopped at step 4, then resumed from the checkpoint, every block resident
        b = os.path.join(self.tmp, "b")
        common = ["--tiny", "--rank", "4", "--out", b, "--preview-every", "0"]
        run("train_lora.py", *common, "--steps", "4", env=env)
        out = run("train_lora.py", *common, "--steps", "8", "--resume", "--vram", "16G", env=env)
        self.assertIn("resumed at step 4", out)
        self.assertFalse(streams(out), out)
        self.assertEqual(os.listdir(env["TMPDIR"]), [], "left in TMPDIR")
        la = load_file(os.path.join(a, "pytorch_lora_weights.safetensors"))
        lb = load_file(os.path.join(b, "pytorch_lora_weights.safetensors"))
        self.assertEqual(sorted(la), sorted(lb))
        self.assertTrue(la and all(torch.equal(la[k], lb[k]) for k in la), "the resumed run's LoRA differs")
        self.assertTrue(all(k.startswith("transformer.") and ".lora_" in k for k in la), list(la)[:3])

        # The LoRA loads into a plain FLUX pipeline (diffusers) and changes what it computes.
        from diffusers import FluxPipeline, FluxTransformer2DModel

        ex = load_example("train_lora")
        parts, config, weights = ex.random_models(self.tmp, "tiny")
        tr = FluxTransformer2DModel(**config).to(torch.bfloat16)
        tr.load_state_dict(load_file(weights))
        pipe = FluxPipeline(transformer=tr, **parts)
        g = torch.Generator().manual_seed(0)
        inputs = dict(hidden_states=torch.randn(1, 64, 16, generator=g).to(torch.bfloat16),
                      encoder_hidden_states=torch.randn(1, 8, 32, generator=g).to(torch.bfloat16),
                      pooled_projections=torch.randn(1, 32, generator=g).to(torch.bfloat16),
                      timestep=torch.tensor([0.5]).to(torch.bfloat16), img_ids=torch.zeros(64, 3),
                      txt_ids=torch.zeros(8, 3), guidance=torch.tensor([1.0]), return_dict=False)
        with torch.no_grad():
            before = tr(**inputs)[0]
            pipe.load_lora_weights(a)
            self.assertEqual(len(pipe.get_active_adapters()), 1)
            after = tr(**inputs)[0]
        self.assertTrue(torch.isfinite(after).all())
        self.assertFalse(torch.equal(before, after), "the LoRA changed nothing")

    @slow
    def test_train_lora_ddp(self) -> None:
        shm = tempfile.mkdtemp(dir=self.tmp)  # the registry of shared regions: this test's own
        _, env = self.fresh("ddp")
        env.update(ARENA_SHARE_DIR=shm, OMP_NUM_THREADS="1")
        if os.path.isdir("/sys/class/net/lo"):
            # gloo's pairs on the loopback interface: otherwise gloo takes the
            # address the host's name resolves to, which a CI machine's network
            # may not let its own processes reach.
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        common = ["--tiny", "--rank", "4", "--steps", "2", "--preview-every", "0", "--checkpoint-every", "0"]
        d = {k: os.path.join(self.tmp, f"ddp-{k}") for k in ("two", "one", "off", "w2", "w1", "w0")}
        g2, g1 = os.path.join(self.tmp, "grads-2.pt"), os.path.join(self.tmp, "grads-1.pt")
        line = re.compile(r"host copies of the streamed blocks: (\d+) bytes; shared region (\d+) bytes; "
                          r"its PSS in the (\d+) processes: ([\d +]+) = (\d+) bytes")
        out = run("train_lora_ddp.py", *common, "--out", d["two"], "--workdir", d["w2"], "--save-grads", g2,
                  nproc=2, env=env, done="host copies of the streamed blocks:")
        self.assertIn("2 processes", out)
        m = line.search(out)
        assert m, out
        host, size, n = int(m[1]), int(m[2]), int(m[3])
        pss = [int(x) for x in m[4].split(" + ")]
        self.assertEqual(n, 2)
        self.assertGreater(host, 100_000, "the tiny caps stream most blocks")
        self.assertGreaterEqual(size, host, out)  # the slabs, page aligned, and a header page
        self.assertLess(size, 2 * host, out)
        # One copy between them: their PSS of it sums to its size, each about half.
        self.assertLessEqual(abs(sum(pss) - size), size // 10, out)
        self.assertTrue(all(0.3 * size < p < 0.7 * size for p in pss), out)
        self.assertEqual(os.listdir(shm), [], "the registry outlived the processes")
        # One process taking both examples of each step: the same gradients.
        # (its random models in a temporary folder of its own, gone when it ends; torchrun
        # leaves its own, torchelastic_*, in TMPDIR)
        before = os.listdir(env["TMPDIR"])
        out1 = run("train_lora_ddp.py", *common, "--out", d["one"], "--grad-accum", "2", "--save-grads", g1, env=env)
        self.assertIn("1 processes", out1)
        self.assertEqual(os.listdir(env["TMPDIR"]), before, "left in TMPDIR")
        a, b = torch.load(g2), torch.load(g1)
        self.assertTrue(a and sorted(a) == sorted(b), (sorted(a)[:3], sorted(b)[:3]))
        self.assertTrue(all(".lora_" in k for k in a), list(a)[:3])
        diff = [k for k in a if not torch.equal(a[k], b[k])]
        self.assertEqual(diff, [], "two processes' LoRA gradients differ from one process's")
        la = load_file(os.path.join(d["two"], "pytorch_lora_weights.safetensors"))
        lb = load_file(os.path.join(d["one"], "pytorch_lora_weights.safetensors"))
        self.assertTrue(la and all(torch.equal(la[k], lb[k]) for k in la), "the LoRAs after 2 steps differ")
        # share_host off: no shared region at all.
        out0 = run("train_lora_ddp.py", *common, "--out", d["off"], "--workdir", d["w0"], "--share-host", "off",
                   nproc=2, env=env, done="host copies of the streamed blocks:")
        m = line.search(out0)
        assert m, out0
        self.assertEqual((int(m[2]), int(m[5])), (0, 0), out0)


if __name__ == "__main__":
    unittest.main()
