"""python -m arena_gpu.bench: the README's table, measured on this machine's card.

One command reproduces the README's table (llama-bench's way: a table any
user can post from their own card). It reports the card, its driver and the
link, makes FLUX.1-dev-shaped weights, runs each row in a process of its own
under an NVML meter, measures each row's limit in the same run, and prints
the table with each row's ratio to its limit. ``--help`` says what it runs,
how long it takes, the disk and memory it needs and what each limit is.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import _report
from ._meter import Meter, Nvml, NvmlError
from ._row import PREFIX

HELP = """\
Prints the README's table for this machine's card: FLUX.1-dev's transformer
(diffusers' FluxTransformer2DModel at the FLUX.1-dev config, 1024x1024: 4096
image + 512 text tokens, batch 1, bf16, flash attention) loaded, sampled and
LoRA-trained through arena, each figure beside its limit measured in the
same run and the ratio between them.

What it runs, in this order (each run a process of its own, under an NVML
meter that polls the device's used memory every 2 ms from before the
process starts: a peak is all the process held, its CUDA context included):
  weights   `arena synth --layout flux-dev` (random values, the real shapes;
            23.8 GB of safetensors), converted by `arena convert` to an hb4
            image (17.9 GB) and a plain one (23.8 GB); or the images given
  load      `arena load --json` of the hb4 image from the page cache (3 runs,
            --quick 2): GB/s of weights, against safetensors'
            load_file(device="cuda") of the same weights, warm, and the PCIe
            rate `arena load` measures. Limit: the pinned host-to-device rate
            x the weights a stored byte carries (hb4: 1.33), or the file's
            read rate if lower. Then (not --quick) once with O_DIRECT, past
            the page cache: the disk's read rate, printed under the table
  sample    attach(vram="8G") sampling steps: seconds a step, NVML peak.
            Limit: the longer of the step's compute (the resident step) and
            its copies (the bytes the engine moved a step over the pinned
            host-to-device rate the same process measures after its steps);
            beside it diffusers' group offloading (block_level, use_stream)
  floor     attach(vram="2G") sampling: the same limit, beside the resident
            step and its peak
  train     LoRA (rank 16 on to_q/k/v/out.0, AdamW, checkpointing every
            block) at vram="12G" (not with --quick) and "8G". Limit: each
            phase (forward, backward) the longer of the resident step's
            phase and half the moved bytes at the link's rate, plus the
            optimizer (the per-phase limit bench/RESULTS.md holds training to)
  set-up    attach from the warm plain image (the sampling runs' set-up),
            against diffusers group offloading's set-up (load_file to the
            CPU, enable_group_offload). Limit: one read of the image at the
            page cache's rate `arena load` measures
On a card the model does not fit (its free memory under the image + a
step's activations), "resident" cannot run: the compute a step is held to
is then measured block by block (each block's weights on the device one at
a time, its forward, and for training its forward and backward, timed with
CUDA events, summed with the rest of the model's), and the row says so.

How long: the whole run took 5 min 25 s on an H100 (2026-12-07), --quick
about 3 minutes (2 warm-up + 3 timed steps a row; no safetensors or
diffusers runs, no 12G training row, no O_DIRECT read); an estimate is
printed first. Disk: a scratch folder (--dir; default a new folder under
$TMPDIR, else the current folder, removed at the end unless --keep). With
68 GB free the safetensors (23.8 GB) and both images (17.9 + 23.8 GB) are
on it at once and the two conversions run side by side; with 48 GB (44.4
GiB) free it holds two of them at a time: the safetensors goes as soon as
the images it makes are written, and is written again when needed. Memory: 30 GB of host memory
(the page cache holds the image while the rows run; diffusers' offloading
holds the weights in host memory), a card with 8 GB free for the rows that
stream (--quick: the same).

Post it: paste the table and the line under it (the card, driver, link,
date and ratios) as printed; --json FILE has every figure and each run's
raw record. A row whose run failed says so (and why, one line) and the
others still run; exit status 0 when every row ran, 1 when a row failed,
2 for a usage error or a machine that cannot run it.

--backend sim runs the whole flow on arena's simulated device, torch on
the CPU, at the flux-tiny layout with caps scaled to it: a check of the
command, not a measurement.
"""

# flux-tiny's caps on the simulator: as 8G and 2G leave a FLUX.1-dev sampling step
# streaming much of the model and pieces, these leave the tiny one; training's
# streams part of it (its smallest plan needs 353K)
SIM_CAPS = {"sample": "200K", "floor": "150K", "train": ["420K", "380K"]}
DEV_CAPS = {"sample": "8G", "floor": "2G", "train": ["12G", "8G"]}
# the sizes of flux-dev's files (bytes): the safetensors (as the plain image), the hb4 image
DEV_BYTES = {"safetensors": 23_802_601_000, "hb4": 17_880_000_000}


class Fatal(Exception):
    """The command cannot go on: one line, exit status 2."""


def _arena_bin(given: Optional[str]) -> str:
    """The arena command: --arena, $ARENA_BIN, the package's own, or the repository's build/arena."""
    if given:
        if not (os.access(given, os.X_OK) and Path(given).is_file()):
            raise Fatal(f"--arena {given}: not an executable file (the arena command: build/arena, or the wheel's)")
        return given
    here = Path(__file__).resolve().parent.parent
    for cand in (os.environ.get("ARENA_BIN"), str(here / "bin" / "arena"),
                 str(here.parent.parent / "build" / "arena")):
        if cand and os.access(cand, os.X_OK) and Path(cand).is_file():
            return cand
    raise Fatal("the arena command is not in this package nor in the repository's build/: give it with "
                "--arena PATH (or reinstall the wheel)")


def _say(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, a: argparse.Namespace, workdir: Path) -> None:
        self.a = a
        self.dir = workdir
        self.arena = _arena_bin(a.arena)
        self.sim = a.backend == "sim"
        self.layout = a.layout or ("flux-tiny" if self.sim else "flux-dev")
        self.R: Dict[str, Any] = {"backend": a.backend, "layout": self.layout, "quick": a.quick, "runs": {},
                                  "skipped": {}, "phases": {}, "date": datetime.date.today().isoformat(),
                                  "arena": self.arena}
        base = SIM_CAPS if self.layout == "flux-tiny" else DEV_CAPS
        self.caps: Dict[str, Any] = {"sample": a.vram_sample or base["sample"], "floor": a.vram_floor or base["floor"],
                                     "train": (a.vram_train.split(",") if a.vram_train else list(base["train"]))}
        if a.quick and not a.vram_train:
            self.caps["train"] = self.caps["train"][-1:]
        self.R["caps"] = self.caps
        self.nvml: Optional[Nvml] = None
        if not self.sim:
            try:
                self.nvml = Nvml(a.device)
            except NvmlError as e:
                raise Fatal(f"{e}; --backend sim runs the flow on the simulator") from None
            self.R["card"] = self.nvml.card()
        else:
            self.R["card"] = {"name": "arena's simulated device", "total_bytes": 16 << 30, "driver": "none",
                              "free_bytes": 16 << 30}
        self.meter = Meter(self.nvml)
        self.warmup, self.steps = (2, 3) if a.quick else (2, 10)
        self.train_warmup, self.train_steps = (2, 3) if a.quick else (3, 8)
        if self.sim:
            self.warmup, self.steps, self.train_warmup, self.train_steps = 1, 2, 1, 2
        self.timeout = 240.0 if a.quick else 900.0
        self.made: List[Path] = []
        pkg_parent = str(Path(__file__).resolve().parent.parent.parent)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = pkg_parent + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")

    # -- files -------------------------------------------------------------
    def cmd(self, *args: str, what: str) -> None:
        self.cmds([list(args)], [what])

    def cmds(self, argvs: List[List[str]], whats: List[str]) -> None:
        """Run arena commands side by side (each its own process, waited on by a
        thread of its own), wait for all; each one's own seconds go to the
        record's "phases"."""

        def run(argv: List[str]) -> Tuple["subprocess.CompletedProcess[str]", float]:
            t0 = time.perf_counter()
            p = subprocess.run([self.arena, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            return p, time.perf_counter() - t0

        with concurrent.futures.ThreadPoolExecutor(len(argvs)) as pool:
            done = list(pool.map(run, argvs))
        fail = ""
        for argv, what, (p, secs) in zip(argvs, whats, done):
            self.R["phases"][what] = round(secs, 2)
            if p.returncode != 0 and not fail:
                last = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
                fail = f"{what} failed (arena {argv[0]}, exit {p.returncode}): {last}"
        if fail:
            raise Fatal(fail)

    def warm(self, path: Path) -> None:
        """Read the file once: the page cache holds it, as a second start finds it."""
        buf = bytearray(16 << 20)
        with open(path, "rb") as f:
            while f.readinto(buf):
                pass

    def free(self) -> int:
        return shutil.disk_usage(self.dir).free

    def file_bytes(self, kind: str) -> int:
        if self.layout == "flux-dev":
            return DEV_BYTES[kind]
        return 1 << 20

    def synth(self) -> Path:
        st = self.dir / "flux.safetensors"
        if st.exists():
            return st
        if self.a.image:
            _say(f"writing the image's weights to {st} (arena export)")
            self.cmd("export", "-q", "--force", self.a.image, "-o", str(st), what="export of --image")
        else:
            _say(f"synthesizing {self.layout} weights into {st} (arena synth)")
            self.cmd("synth", "--layout", self.layout, "-q", "--force", "-o", str(st), what="synth")
        self.made.append(st)
        return st

    def drop(self, p: Path) -> None:
        """A file this command made goes (the safetensors once the images are
        written, the hb4 image when the plain one needs its room), --keep or not."""
        if p in self.made:
            p.unlink(missing_ok=True)
            self.made.remove(p)

    # -- runs --------------------------------------------------------------
    def child(self, name: str, run: str, *args: str, warmup: int, steps: int) -> Dict[str, Any]:
        cmd = [sys.executable, "-m", "arena_gpu.bench._row", run, "--layout", self.layout,
               "--backend", self.a.backend, "--warmup", str(warmup), "--steps", str(steps), *args]
        _say(f"run {name}: {run} {' '.join(args)}")
        m = self.meter.run(cmd, self.timeout, env=self.env)
        rec: Dict[str, Any] = {}
        for line in m["stdout"].splitlines():
            if line.startswith(PREFIX):
                rec = json.loads(line[len(PREFIX):])
        if not rec:
            tail = [ln for ln in m["stderr"].strip().splitlines() if ln.strip()]
            why = (f"ran past {self.timeout:.0f} s" if m["rc"] is None
                   else f"exit {m['rc']}: {tail[-1] if tail else 'no message'}")
            rec = {"ok": False, "error": why, "run": run}
        if self.sim and "sim_peak_bytes" in rec:
            rec["peak_bytes"] = rec["sim_peak_bytes"]
        elif "peak_bytes" in m:
            rec["peak_bytes"] = m["peak_bytes"]
            rec["nvml"] = {k: m[k] for k in ("peak_bytes", "baseline_bytes", "polls")}
        rec["cmd"] = cmd
        rec["meter_wall_s"] = m["wall_s"]
        if not rec.get("ok"):
            _say(f"{name} failed: {rec.get('error')}")
            rec["stderr_tail"] = m["stderr"].strip().splitlines()[-20:]
        self.R["runs"][name] = rec
        return rec

    def skip(self, name: str, why: str) -> None:
        self.R["skipped"][name] = why

    def load_json(self, image: Path, *opts: str) -> Dict[str, Any]:
        p = subprocess.run([self.arena, "load", "--json", "-q", "--backend", self.a.backend, *opts, str(image)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            last = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise _report.RowFailed(f"arena load exit {p.returncode}: {last}")
        d: Dict[str, Any] = json.loads(p.stdout)
        return d

    def anchors(self, st: Path) -> None:
        if self.a.quick:
            self.skip("st-load", "--quick")
            self.skip("diffusers", "--quick")
            return
        self.warm(st)
        self.child("st-load", "st-load", "--safetensors", str(st), warmup=0, steps=2)
        if self.sim:
            self.skip("diffusers", "needs a CUDA device")
        else:
            self.child("diffusers", "diffusers", "--safetensors", str(st), warmup=self.warmup, steps=self.steps)

    def row_load(self, hb4: Path) -> None:
        self.warm(hb4)
        runs = []
        try:
            for _ in range(2 if self.a.quick else 3):
                runs.append(self.load_json(hb4))
            self.R["load"] = {"runs": runs}
        except _report.RowFailed as e:
            self.R["load"] = {"runs": [], "error": str(e)}
            _say(f"load failed: {e}")
        if self.a.quick:
            self.skip("disk", "--quick")
            return
        # the disk's rate: the same image read with O_DIRECT (past the page cache)
        try:
            self.R["disk_load"] = self.load_json(hb4, "--io", "direct")
            self.R["disk_gbps"] = self.R["disk_load"]["limits"]["read_gbps"]
        except (_report.RowFailed, KeyError) as e:
            _say(f"the O_DIRECT load failed: {e}")

    def fits(self, image: Path, train: bool) -> bool:
        if self.nvml is None:
            return True
        from ._flux import LAYOUTS

        lay = LAYOUTS[self.layout]
        need = image.stat().st_size + (lay.train_extra if train else lay.sample_extra)
        return int(self.nvml.card()["free_bytes"]) >= need

    def main(self) -> int:
        a = self.a
        est = "about 3 minutes" if a.quick else "about 6 minutes"
        if self.sim:
            est = "about 2 minutes on 2 CPU cores"
        _say(f"{self.R['card']['name']}: {est} ({self.layout}; {'--quick' if a.quick else 'the whole run'})")
        plain = Path(a.image) if a.image else self.dir / "flux.arena"
        hb4 = Path(a.hb4_image) if a.hb4_image else self.dir / "flux-hb4.arena"
        st_bytes = self.file_bytes("safetensors")
        margin = 1 << 30
        # A: the safetensors (for the anchors, and to make the images not given)
        if not a.quick or not hb4.exists() or not plain.exists():
            st = self.synth()
            self.anchors(st)
            # the two conversions side by side where the disk holds both (the hb4
            # coder is CPU-bound, the plain image the disk's writes), else hb4 alone
            todo: List[Tuple[List[str], str, Path]] = []
            room = self.free()
            if not hb4.exists():
                todo.append((["convert", "-q", "--force", "--codec", "hb4", str(st), "-o", str(hb4)],
                             "convert to hb4", hb4))
                room -= self.file_bytes("hb4")
            if not plain.exists() and room >= st_bytes + margin:
                todo.append((["convert", "-q", "--force", str(st), "-o", str(plain)], "convert", plain))
            if todo:
                _say("converting to " + " and ".join(str(t[2]) for t in todo))
                self.made.extend(t[2] for t in todo)
                self.cmds([t[0] for t in todo], [t[1] for t in todo])
            self.drop(st)
        # B: the load row, hb4; it goes when the plain image needs its room
        self.row_load(hb4)
        if not plain.exists():
            if self.free() < 2 * st_bytes + margin:
                self.drop(hb4)
            st = self.synth()
            _say(f"converting to {plain}")
            self.cmd("convert", "-q", "--force", str(st), "-o", str(plain), what="convert")
            self.made.append(plain)
            self.drop(st)
        # C: the rows on the plain image, warm
        self.warm(plain)
        if not a.quick:  # --quick: the page cache's rate from the hb4 image's loads
            try:
                self.R["plain_load"] = self.load_json(plain)
            except _report.RowFailed as e:
                _say(f"arena load of the plain image failed: {e}")
        lds = [r for r in self.R.get("load", {}).get("runs", [])]
        if lds:
            self.R["link_gbps"] = _report._med([x["limits"]["h2d_gbps"] for x in lds])
        if self.R.get("plain_load"):
            self.R["read_gbps"] = self.R["plain_load"]["limits"]["read_gbps"]
        elif lds:
            self.R["read_gbps"] = _report._med([x["limits"]["read_gbps"] for x in lds])
        self.R["plain_bytes"] = plain.stat().st_size
        img = ["--image", str(plain)]
        if self.sim:
            img += ["--sim-capacity", "16G"]
        # whether the model fits, read once (free memory moves): the resident run
        # or the per-block one gives each kind its compute, never neither
        fit = {kind: self.fits(plain, kind == "train") for kind in ("sample", "train")}
        pb = {kind: bool(a.per_block) or not fit[kind] for kind in fit}
        why = "the model does not fit" if not all(fit.values()) else \
            "asked for (--per-block)" if a.per_block else ""
        self.R["per_block"], self.R["per_block_why"] = pb, why
        sw, ss, tw, ts = self.warmup, self.steps, self.train_warmup, self.train_steps
        if fit["sample"]:
            self.child("sample-resident", "sample", *img, warmup=sw, steps=ss)
        else:
            self.skip("sample-resident", "the model does not fit")
        if pb["sample"]:
            self.child("blocks-sample", "blocks-sample", *img, warmup=1, steps=2)
        self.child("sample-a", "sample", *img, "--vram", self.caps["sample"], warmup=sw, steps=ss)
        self.child("sample-b", "sample", *img, "--vram", self.caps["floor"], warmup=sw, steps=ss)
        if fit["train"]:
            self.child("train-resident", "train", *img, warmup=tw, steps=ts)
        else:
            self.skip("train-resident", "the model does not fit")
        if pb["train"]:
            self.child("blocks-train", "blocks-train", *img, warmup=1, steps=2)
        for i, v in enumerate(self.caps["train"]):
            self.child(f"train-{i}", "train", *img, "--vram", v, warmup=tw, steps=ts)
        if a.quick:
            self.skip("train-12G", "--quick")
        # the table
        lay = "FLUX.1-dev transformer, 1024×1024" if self.layout == "flux-dev" else \
            f"FLUX.1-dev-shaped transformer at the {self.layout} layout"
        self.R["title"] = f"{lay}, {self.R['card']['name']}"
        rows = _report.build_rows(self.R)
        self.R["rows"] = rows
        print(_report.table(self.R, rows))
        print()
        print(_report.summary(self.R, rows))
        notes = []
        if a.quick:
            notes.append("--quick: 2 warm-up + 3 timed steps a row; not run: safetensors' load_file, diffusers' "
                         "group offloading, the 12G training row, the disk's O_DIRECT rate")
        for k, v in self.R["skipped"].items():
            if not (a.quick and v == "--quick"):
                notes.append(f"{k}: not run ({v})")
        if self.R["phases"]:
            notes.append("weights made: " + "; ".join(f"{k} {v:.1f} s" for k, v in self.R["phases"].items()))
        for n in notes:
            print(n)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(self.R, f, indent=1)
        return 0 if all(r["ok"] for r in rows) else 1


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arena_gpu.bench", description=HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about 3 minutes: fewer steps, no anchors, no 12G training")
    ap.add_argument("--dir", help="scratch folder (default: a new one under $TMPDIR or the current folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder and what was made in it")
    ap.add_argument("--image", metavar="PLAIN.arena", help="a plain FLUX.1-dev image to use (not synthesized)")
    ap.add_argument("--hb4-image", metavar="HB4.arena", help="its hb4 image (arena convert --codec hb4)")
    ap.add_argument("--arena", metavar="PATH", help="the arena command (default: the package's, or build/arena)")
    ap.add_argument("--json", metavar="FILE", help="write every figure and each run's raw record to FILE")
    ap.add_argument("--backend", choices=["cuda", "sim"], default="cuda",
                    help="cuda (default), or sim: the flow on the simulated device at the flux-tiny layout")
    ap.add_argument("--layout", choices=["flux-dev", "flux-tiny"], help="default flux-dev (sim: flux-tiny)")
    ap.add_argument("--device", type=int, default=0, help="the CUDA device NVML meters (default 0; set "
                                                         "CUDA_VISIBLE_DEVICES to the same card)")
    ap.add_argument("--vram-sample", metavar="SIZE", help='the sampling row\'s cap (default "8G")')
    ap.add_argument("--vram-floor", metavar="SIZE", help='the small sampling row\'s cap (default "2G")')
    ap.add_argument("--vram-train", metavar="SIZE,SIZE", help='the training row\'s caps (default "12G,8G"; --quick: "8G")')
    ap.add_argument("--per-block", action="store_true",
                    help="hold the steps to per-block compute even where the model fits (a check of that limit)")
    a = ap.parse_args(argv)
    made_dir = False
    try:
        if a.dir:
            workdir = Path(a.dir)
            workdir.mkdir(parents=True, exist_ok=True)
        else:
            workdir = Path(tempfile.mkdtemp(prefix="arena-bench-", dir=os.environ.get("TMPDIR") or os.getcwd()))
            made_dir = True
        try:
            b = Bench(a, workdir)
            return b.main()
        finally:
            if not a.keep:
                for p in b.made if "b" in locals() else []:
                    p.unlink(missing_ok=True)
                if made_dir:
                    shutil.rmtree(workdir, ignore_errors=True)
    except Fatal as e:
        print(f"python -m arena_gpu.bench: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"python -m arena_gpu.bench: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("python -m arena_gpu.bench: interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
