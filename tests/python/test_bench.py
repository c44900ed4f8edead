"""python -m arena_gpu.bench end to end on the simulated device (the flux-tiny layout);
bench/gpu_wan_qwen.sh with bench/torch_wan_qwen.py and bench/wan_qwen_summary.py at
the tiny configs of Wan and Qwen-Image on the CPU; bench/gpu_wan22.sh with
bench/torch_wan22.py (the Wan 2.2 two-expert pipeline) and wan_qwen_summary.py --wan22
at the tiny configs on the CPU.

    python tests/python/test_bench.py -v      (torch, diffusers, peft and arena installed)

The command as a user runs it, `--backend sim --quick`, with the small
sampling row's cap impossible (`--vram-floor 1K`): the table has every row,
each row but that one a figure, a limit and a ratio (the table, the line
under it and --json agree), each run in a process of its own (their pids),
and the failed row says why in its cell while the others ran. Then the
per-block compute runs (the limit of a card the model does not fit) on the
image the command kept, and the table's words for that limit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Dict, List

import torch

import arena_gpu as arena
import arena_gpu.torch as at
from arena_gpu.bench import _report
from tiers import slow

PREFIX = "ARENA_BENCH_ROW "
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import torch_wan_qwen as twq  # noqa: E402  (bench/: the harness's models and its image reader)


@slow
class Bench(unittest.TestCase):
    tmp: str
    out: "subprocess.CompletedProcess[str]"
    rec: Dict[str, Any]
    rows: List[str]

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="arena-test-bench-")
        cls.out = subprocess.run(
            [sys.executable, "-m", "arena_gpu.bench", "--backend", "sim", "--quick", "--vram-floor", "1K",
             "--dir", os.path.join(cls.tmp, "w"), "--keep", "--json", os.path.join(cls.tmp, "r.json")],
            capture_output=True, text=True, cwd=cls.tmp, timeout=600)
        with open(os.path.join(cls.tmp, "r.json")) as f:
            cls.rec = json.load(f)
        cls.rows = [ln for ln in cls.out.stdout.splitlines() if ln.startswith("| ")]

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_table(self) -> None:
        """The README's five rows under its header; a failed row makes exit status 1."""
        self.assertEqual(self.out.returncode, 1, self.out.stderr[-2000:])
        self.assertTrue(self.rows[0].startswith("| FLUX.1-dev-shaped transformer at the flux-tiny layout, "
                                                "arena's simulated device | arena | for comparison |"), self.rows)
        labels = [r.split(" | ")[0][2:] for r in self.rows[1:]]
        self.assertEqual(labels, ["load, warm page cache (hb4 image)",
                                  'sampling step, `vram="200K"` (all the process holds, simulated)',
                                  'sampling step, `vram="1K"`',
                                  'LoRA training step, `vram="380K"`',
                                  "set-up (attach from a warm image)"])
        self.assertIn("not run: safetensors' load_file, diffusers' group offloading, the 12G training row",
                      self.out.stdout)

    def test_rows(self) -> None:
        """Every row that ran: a figure, a limit and a ratio, in the table, the line under it and the JSON."""
        rows = self.rec["rows"]
        self.assertEqual([r["key"] for r in rows], ["load", "sample", "floor", "train", "setup"])
        line = [ln for ln in self.out.stdout.splitlines() if ln.startswith("Measured by")]
        self.assertEqual(len(line), 1, self.out.stdout)
        for r, cells in zip(rows, self.rows[1:]):
            if r["key"] == "floor":
                continue
            self.assertTrue(r["ok"], r)
            self.assertRegex(r["figure"], r"[0-9.]+ (s|GB/s)")
            self.assertIn(r["figure"], cells)
            lim = r.get("limit_s", r.get("limit_gbps"))
            for x in lim if isinstance(lim, list) else [lim]:
                self.assertGreater(x, 0, r)
            for x in r["ratio"] if isinstance(r["ratio"], list) else [r["ratio"]]:
                self.assertGreater(x, 0, r)
            self.assertIn(f"{r['key']} {r['ratio_text']}", line[0])
        sample = rows[1]
        self.assertRegex(sample["figure"], r"^[0-9.]+ s at [0-9.]+ KiB$")  # the simulated peak
        self.assertRegex(sample["comparison"], r"its (copy )?limit [0-9.]+ s")
        self.assertIn("× its limit", sample["ratio_text"])
        self.assertIn("resident ", rows[3]["comparison"])

    def test_failed_row(self) -> None:
        """The impossible cap's row says why in its cell; the rows after it still ran."""
        floor = self.rec["rows"][2]
        self.assertFalse(floor["ok"])
        self.assertIn("does not fit", floor["error"])
        self.assertIn("[BUDGET]", floor["error"])
        self.assertIn("failed: sample-b failed: Error: ", self.rows[3])
        self.assertIn("floor failed", self.out.stdout)
        self.assertTrue(self.rec["rows"][3]["ok"] and self.rec["rows"][4]["ok"])

    def test_processes(self) -> None:
        """Each run in a process of its own: its pid in its record, all different, none the command's."""
        runs = self.rec["runs"]
        self.assertEqual(sorted(runs), ["sample-a", "sample-b", "sample-resident", "train-0", "train-resident"])
        pids = [r["pid"] for r in runs.values()]
        self.assertEqual(len(set(pids)), len(pids), pids)
        self.assertNotIn(os.getpid(), pids)
        for name, r in runs.items():
            self.assertIn("arena_gpu.bench._row", r["cmd"], name)
            if name != "sample-b":  # the failed one
                self.assertGreater(r["peak_bytes"], 0, name)
        self.assertEqual(len(self.rec["load"]["runs"]), 2)  # --quick: two loads

    def test_per_block(self) -> None:
        """Per-block compute on the kept image: each block's forward (and for training its
        forward and backward) summed with the rest; the table's words for that limit."""
        w = Path(self.tmp) / "w"
        img = w / "flux.arena"
        self.assertTrue(img.exists(), sorted(os.listdir(w)))
        self.assertFalse((w / "flux.safetensors").exists())  # gone once the images were made
        recs = {}
        for run in ("blocks-sample", "blocks-train"):
            p = subprocess.run([sys.executable, "-m", "arena_gpu.bench._row", run, "--layout", "flux-tiny",
                                "--backend", "sim", "--image", str(img), "--warmup", "1", "--steps", "1"],
                               capture_output=True, text=True, timeout=300)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith(PREFIX)]
            self.assertEqual(p.returncode, 0, p.stderr[-2000:])
            recs[run] = json.loads(line[0][len(PREFIX):])
            self.assertEqual(recs[run]["n_blocks"], 5)
            self.assertGreater(recs[run]["step_s"], recs[run]["rest_forward_s"])
        f, b, opt = recs["blocks-train"]["phases_s"][0]
        self.assertTrue(f > 0 and b > 0 and opt > 0, recs["blocks-train"])
        # the report from these as the limits of a card the model does not fit
        R = json.loads(json.dumps(self.rec))
        R["runs"].pop("sample-resident")
        R["runs"].pop("train-resident")
        R["runs"].update({k: dict(v, ok=True) for k, v in recs.items()})
        R["runs"]["sample-b"] = dict(R["runs"]["sample-a"])
        R["per_block"], R["per_block_why"] = {"sample": True, "train": True}, "the model does not fit"
        rows = _report.build_rows(R)
        self.assertTrue(all(r["ok"] for r in rows), [r.get("error") for r in rows])
        self.assertIn("per-block compute", rows[2]["comparison"])
        self.assertIn("limit: per-block compute, the model does not fit", rows[2]["comparison"])
        self.assertIn("limit: per-block compute, the model does not fit", rows[3]["comparison"])
        self.assertTrue(re.search(r"× its limit", rows[3]["ratio_text"]), rows[3])



def tiny_images(d: str) -> Dict[str, str]:
    """The tiny Wan and Qwen-Image models' random weights as images: Wan by
    arena.torch.save_image, Qwen-Image saved with safetensors and converted (plain, hb4,
    and fp8-e4m3-row)."""
    from safetensors.torch import save_file

    out = {"wan": os.path.join(d, "wan.arena")}
    at.save_image(twq.random_model("wan14b", True), out["wan"])
    st = os.path.join(d, "qwen.safetensors")
    save_file({k: v.contiguous() for k, v in twq.random_model("qwen-image", True).state_dict().items()}, st)
    for key, kw in (("qwen", {}), ("qwen_hb4", {"codec": "hb4"}), ("qwen_fp8", {"quant": "fp8-e4m3-row"})):
        out[key] = os.path.join(d, key + ".arena")
        arena.convert(st, out[key], **kw)
    return out


class WanQwenRead(unittest.TestCase):
    """How bench/torch_wan_qwen.py's plain and diffusers runs get their weights: the
    image read a block at a time into tensors of their own."""

    def test_read_image(self) -> None:
        """Every tensor of the image, as the model holds it, the same from a plain and an
        hb4 image (streamed blocks acquired one at a time); a quantized image refused."""
        with tempfile.TemporaryDirectory(prefix="arena-test-wq-") as d:
            im = tiny_images(d)
            ref = twq.random_model("qwen-image", True).state_dict()
            for key in ("qwen", "qwen_hb4"):
                got = twq.read_image(im[key], torch.device("cpu"))
                self.assertEqual(sorted(got), sorted(ref), key)
                for n, t in ref.items():
                    self.assertEqual(got[n].dtype, t.dtype, n)
                    self.assertTrue(torch.equal(got[n], t), f"{key}: {n}")
            with self.assertRaises(arena.Error) as cm:
                twq.read_image(im["qwen_fp8"], torch.device("cpu"))
            self.assertEqual(cm.exception.code, "USAGE")
            self.assertIn("the BF16 image", str(cm.exception))


# The driver's sets at the tiny configs on the CPU: arena on its simulated device at
# caps in KiB that stream (or fail), diffusers' offloading without a stream (CPU to CPU:
# use_stream needs an accelerator, so its three variants are one run here, and the
# stream's path, with record_stream and low_cpu_mem_usage, runs on a GPU only).
WQ_ENV = dict(METER="none", ARGS="--tiny --device cpu --warmup 1", STEPS="2", WAN_V="60K none", WAN_TRAIN="60K 60K:saved",
              QWEN_V="300K", QWEN_FP8_V="250K", QWEN_TRAIN_V="300K", QWEN_TRAIN_RES="128x128", DIFFUSERS="stream",
              FLOOR_V="60K 20K", SAVED="512")
WQ_SETS = ["wan-sample", "wan-train", "qwen-sample", "qwen-fp8-sample", "qwen-train", "floor"]
WQ_NAMES = ["wan-sample-plain", "wan-sample-arena-60K", "wan-sample-arena-none", "wan-sample-diffusers",
            "wan-train-plain", "wan-train-arena-60K", "wan-train-arena-60K-saved",
            "qwen-sample-plain", "qwen-sample-arena-300K", "qwen-sample-diffusers",
            "qwen-fp8-sample-arena-250K", "qwen-train-plain", "qwen-train-fp8-arena-300K",
            "floor-wan-sample-60K", "floor-wan-sample-20K", "floor-wan-train-60K", "floor-wan-train-20K",
            "floor-qwen-sample-60K", "floor-qwen-fp8-sample-60K", "floor-qwen-train-60K"]
# the caps the tiny models do not fit (the floors stop at them)
WQ_FAILED = ["floor-wan-train-20K", "floor-qwen-sample-60K", "floor-qwen-fp8-sample-60K", "floor-qwen-train-60K"]


@slow
class WanQwen(unittest.TestCase):
    """bench/gpu_wan_qwen.sh's sets at the tiny configs on the CPU (ARGS="--tiny --device
    cpu --warmup 1", no NVML meter), every RUN of bench/torch_wan_qwen.py a process of its own for
    both models, and bench/wan_qwen_summary.py's tables from their records."""

    tmp: str
    images: Dict[str, str]
    out: "subprocess.CompletedProcess[str]"
    recs: List[Dict[str, Any]]
    by: Dict[str, Dict[str, Any]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="arena-test-wq-")
        cls.images = tiny_images(cls.tmp)
        env = dict(os.environ, PY=sys.executable, OUT=os.path.join(cls.tmp, "out"), WAN=cls.images["wan"],
                   QWEN=cls.images["qwen"], QWEN_FP8=cls.images["qwen_fp8"], **WQ_ENV)
        cls.out = subprocess.run(["sh", "bench/gpu_wan_qwen.sh", *WQ_SETS], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=1500)
        with open(os.path.join(cls.tmp, "out", "wan_qwen.jsonl")) as f:
            cls.recs = [json.loads(ln) for ln in f if ln.strip()]
        cls.by = {r["name"]: r for r in cls.recs}

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def resident(self, r: Dict[str, Any]) -> Dict[str, Any]:
        kind = "train" if r["run"].endswith("-train") else "sample"
        name = {"wan14b": "wan", "qwen-image": "qwen"}[r["model"]] + f"-{kind}-plain"
        return self.by[name]

    def test_runs(self) -> None:
        """Every run of the sets, in order, a record each from a process of its own; every
        RUN for both models ran; the floors stopped at the first cap that failed, which
        says why (the least that fits)."""
        self.assertEqual(self.out.returncode, 0, self.out.stderr[-3000:])
        self.assertEqual([r["name"] for r in self.recs], WQ_NAMES, self.out.stderr[-3000:])
        pids = [r["pid"] for r in self.recs]
        self.assertEqual(len(set(pids)), len(pids))
        self.assertNotIn(os.getpid(), pids)
        for r in self.recs:
            self.assertEqual(r["ok"], r["name"] not in WQ_FAILED, (r["name"], r.get("error")))
            self.assertTrue(r["tiny"] and r["device"] == "cpu", r["name"])
            self.assertIsNone(r["nvml"], r["name"])  # METER=none
        ran = {(r["model"], r["run"]) for r in self.recs if r["ok"]}
        for model in ("wan14b", "qwen-image"):
            for run in ("plain-sample", "arena-sample", "diffusers-sample", "plain-train", "arena-train"):
                self.assertIn((model, run), ran)
        for name in WQ_FAILED:
            err = self.by[name]["error"]
            self.assertIn("does not fit", err)
            self.assertIn("[BUDGET]", err)
            self.assertIn("is the cap", err)
        self.assertIn("failed: floor-wan-train-20K", self.out.stderr)
        errs = Path(self.tmp, "out", "wan_qwen-errors.txt").read_text()
        self.assertIn("== floor-wan-train-20K (exit 1)", errs)
        self.assertIn("== wan-sample-plain (exit 0)", errs)

    def test_bit_for_bit(self) -> None:
        """Arena's runs and diffusers' on the BF16 images give the resident run's outputs
        bit for bit: sampling, the guided prediction and the latents of the first and the
        last step (the same: every step has the same inputs); training, the first step's
        LoRA gradients and the LoRA weights after every step. The fp8 image's runs give
        others (the weights they ran are not the BF16 ones)."""
        n = 0
        for r in self.recs:
            if not r["ok"] or r["run"].startswith("plain-"):
                continue
            res = self.resident(r)
            self.assertGreater(r["out_abs_mean"], 0, r["name"])
            if r["image_schemes"] == ["none"]:
                self.assertEqual(r["out_hash"], res["out_hash"], r["name"])
                self.assertEqual(r["out_hash_last"], res["out_hash_last"], r["name"])
                n += 1
            else:
                self.assertIn("fp8-e4m3-row", r["image_schemes"], r["name"])
                self.assertNotEqual(r["out_hash"], res["out_hash"], r["name"])
        self.assertGreaterEqual(n, 9)
        for name in ("wan-sample-plain", "qwen-sample-plain"):
            self.assertEqual(self.by[name]["out_hash"], self.by[name]["out_hash_last"], name)
        for name in ("wan-train-plain", "qwen-train-plain"):  # the optimizer moved the weights
            self.assertNotEqual(self.by[name]["out_hash"], self.by[name]["out_hash_last"], name)
        self.assertNotEqual(self.by["wan-sample-plain"]["out_hash"], self.by["qwen-sample-plain"]["out_hash"])

    def test_streamed(self) -> None:
        """A run under a cap streamed (blocks or pieces moved every step, both passes
        counted) and the simulated device's peak stayed in the cap; without one the model
        was resident; offload_saved kept the saved tensors in host memory."""
        for r in self.recs:
            if not (r["ok"] and r["run"].startswith("arena-")):
                continue
            cap = r["vram"]
            if cap is None:
                self.assertEqual(r["plan"]["n_streamed"], 0, r["name"])
                self.assertEqual(r["moved_bytes_step"], 0, r["name"])
                continue
            self.assertGreater(r["plan"]["n_streamed"], 0, r["name"])
            self.assertGreater(r["moved_bytes_step"], 0, r["name"])
            self.assertLessEqual(r["sim_peak_bytes"], arena.parse_size(cap), r["name"])
            passes = 1 if r["run"] == "arena-train" else 2
            self.assertEqual(len(r["records"]), passes * r["steps"], r["name"])
            per = sorted(sum(x["moved_bytes"] for x in r["records"][i:i + passes])
                         for i in range(0, len(r["records"]), passes))
            self.assertEqual(r["moved_bytes_step"], per[len(per) // 2], r["name"])
        saved = self.by["wan-train-arena-60K-saved"]  # tensors of 512 B or more (SAVED)
        self.assertEqual(saved["offload_saved"], "512")
        self.assertGreater(saved["offload"]["bytes"], 0)
        self.assertEqual(self.by["wan-train-arena-60K"]["offload"]["bytes"], 0)

    def test_records(self) -> None:
        """Each record's steps, set-up, memory, inputs and the limit of its link."""
        tokens = {"wan14b": (32, "64x64x5", 6, 6), "qwen-image": (64, "128x128", 8, 3)}
        for r in self.recs:
            if not r["ok"]:
                continue
            name = r["name"]
            self.assertEqual(len(r["steps_s"]), 2, name)
            self.assertTrue(all(s > 0 for s in r["steps_s"]), name)
            self.assertEqual(r["step_s_median"], r["steps_s"][1], name)  # the steps after the first
            self.assertGreater(r["setup_s"], 0, name)
            self.assertGreater(r["host_peak_rss"], 0, name)
            self.assertEqual((r["h2d_bytes_per_s"], r["link"]), (twq.SIM_LINK, "sim"), name)
            img, res, tt, nt = tokens[r["model"]]
            if r["run"].endswith("-train") and r["model"] == "qwen-image":
                res = "128x128"  # QWEN_TRAIN_RES
            self.assertEqual((r["image_tokens"], r["resolution"], r["text_tokens"], r["neg_tokens"]),
                             (img, res, tt, nt), name)
            if r["run"].endswith("-train"):
                self.assertEqual(len(r["phases_s"]), 2, name)
                self.assertTrue(all(x > 0 for p in r["phases_s"] for x in p), name)
                self.assertGreater(r["lora_params"], 0, name)
        for name in ("wan-sample-diffusers", "qwen-sample-diffusers"):
            self.assertEqual(self.by[name]["diffusers"], dict(use_stream=False, record_stream=False,
                                                              low_cpu_mem_usage=False, non_blocking=False))
            self.assertTrue(0 < self.by[name]["read_s"] < self.by[name]["setup_s"], name)
            self.assertGreater(self.by[name]["offload_setup_s"], 0, name)

    def test_summary(self) -> None:
        """The tables from the records: a table per model, kind and resolution with every
        run a row, the ratios to resident, outputs against resident's, the peak against
        the cap, the failures' reasons; the smallest cap each ran at."""
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "wan_qwen_summary.py"),
                            os.path.join(self.tmp, "out", "wan_qwen.jsonl")], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        text = p.stdout
        heads = [ln for ln in text.splitlines() if ln.startswith("### ")]
        self.assertEqual([h.split("; ")[0] for h in heads], [
            "### wan14b (tiny), sampling, 64x64x5, text 6/6 tokens",
            "### wan14b (tiny), LoRA training, 64x64x5, text 6/6 tokens",
            "### qwen-image (tiny), sampling, 128x128, text 8/3 tokens",
            "### qwen-image (tiny), LoRA training, 128x128, text 8/3 tokens",
            "### The smallest vram that ran"])
        self.assertIn(f"; resident {self.by['wan-sample-plain']['step_s_median']:.4f} s", heads[0])
        rows = {ln.split(" | ")[0][2:]: ln.split(" | ") for ln in text.splitlines() if ln.startswith("| ")}
        for r in self.recs:
            cells = rows[r["name"]]
            if not r["ok"]:
                self.assertEqual(cells[3], "failed: " + r["error"])
                continue
            res = self.resident(r)
            self.assertEqual(cells[3], f"{r['step_s_median']:.4f}")
            self.assertEqual(cells[4], f"{r['step_s_median'] / res['step_s_median']:.3f}")
            want = "-" if r is res else ("yes" if r["image_schemes"] == ["none"] else "no")
            self.assertEqual(cells[-1].rstrip(" |"), want, r["name"])
            if r["run"].startswith("arena-"):
                self.assertIn("(sim)", cells[7])
                self.assertIn(", simulated)", cells[5])
                self.assertEqual(cells[8], "yes" if r["vram"] else "-", r["name"])
        floors = {ln.split(" | ")[0][2:]: ln.split(" | ")[1:] for ln in text.split("### The smallest vram")[1]
                  .splitlines() if ln.startswith("| ") and not ln.startswith("| model")}
        self.assertEqual(sorted(floors), sorted(["wan14b sample bf16 64x64x5", "wan14b train bf16 64x64x5",
                                                 "qwen-image sample bf16 128x128",
                                                 "qwen-image sample fp8-e4m3-row 128x128",
                                                 "qwen-image train fp8-e4m3-row 128x128"]))
        self.assertEqual(floors["wan14b sample bf16 64x64x5"][0], "20K")
        self.assertEqual(floors["wan14b sample bf16 64x64x5"][-1], "none tried |")
        self.assertEqual(floors["wan14b train bf16 64x64x5"][0], "60K")
        self.assertTrue(floors["wan14b train bf16 64x64x5"][-1].startswith("20K: Error: "))
        self.assertEqual(floors["qwen-image sample bf16 128x128"][0], "300K")
        self.assertEqual(floors["qwen-image sample fp8-e4m3-row 128x128"][0], "250K")
        self.assertEqual(floors["qwen-image train fp8-e4m3-row 128x128"][0], "300K")
        self.assertIn("[BUDGET]", floors["qwen-image train fp8-e4m3-row 128x128"][-1])

    def test_plain_refuses_a_quantized_image(self) -> None:
        """A plain run on the fp8 image: its record says to give the BF16 one."""
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "torch_wan_qwen.py"), "plain-sample", "--model",
                            "qwen-image", "--image", self.images["qwen_fp8"], "--tiny", "--device", "cpu"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 1)
        rec = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertFalse(rec["ok"])
        self.assertIn("[USAGE]", rec["error"])
        self.assertIn("give --image the BF16 one", rec["error"])


# The Wan 2.2 pipeline's sets at the tiny configs on the CPU: a bf16 image (--quant none),
# arena on its simulated device under a cap that streams both experts and without one,
# then fp8_compute off at the cap, model offload (its hooks onto the CPU itself), resident.
W22_ENV = dict(METER="none", ARGS="--tiny --device cpu", QUANT="none", ARENA_V="300K none", STEPS="6", VIDEOS="2")
W22_NAMES = ["make", "arena-300K", "arena-none", "arena-300K-exact", "model-offload", "resident"]


def boundary_step(steps: int, shift: float = 12.0, ratio: float = 0.875) -> int:
    """Where the pipeline switches experts: the first timestep of Wan 2.2 A14B's scheduler
    under ratio x 1000."""
    import diffusers

    s = diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift)
    s.set_timesteps(steps, device="cpu")
    return next(i for i, t in enumerate(s.timesteps) if float(t) < ratio * 1000)


@slow
class Wan22(unittest.TestCase):
    """bench/gpu_wan22.sh's sets at the tiny configs on the CPU, every run of
    bench/torch_wan22.py a process of its own, and wan_qwen_summary.py --wan22's table."""

    tmp: str
    out: "subprocess.CompletedProcess[str]"
    recs: List[Dict[str, Any]]
    by: Dict[str, Dict[str, Any]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="arena-test-w22-")
        env = dict(os.environ, PY=sys.executable, OUT=os.path.join(cls.tmp, "out"),
                   IMAGE=os.path.join(cls.tmp, "wan22.arena"), **W22_ENV)
        cls.out = subprocess.run(["sh", "bench/gpu_wan22.sh", "make", "arena", "offload", "resident"], cwd=ROOT,
                                 env=env, capture_output=True, text=True, timeout=900)
        with open(os.path.join(cls.tmp, "out", "wan22.jsonl")) as f:
            cls.recs = [json.loads(ln) for ln in f if ln.strip()]
        cls.by = {r["name"]: r for r in cls.recs}

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_runs(self) -> None:
        """Every run, in order, a record each from a process of its own; the image is one
        pipeline's, its names what attach binds."""
        self.assertEqual(self.out.returncode, 0, self.out.stderr[-3000:])
        self.assertEqual([r["name"] for r in self.recs], W22_NAMES, self.out.stderr[-3000:])
        pids = [r["pid"] for r in self.recs]
        self.assertEqual(len(set(pids)), len(pids))
        for r in self.recs:
            self.assertTrue(r["ok"], (r["name"], r.get("error")))
            self.assertTrue(r["tiny"], r["name"])
        info = arena.inspect(os.path.join(self.tmp, "wan22.arena"))
        self.assertEqual({t["name"].split(".", 1)[0] for t in info["tensors"]},
                         {"text_encoder", "transformer", "transformer_2", "vae"})
        self.assertEqual({t["scheme"] for t in info["tensors"]}, {"none"})  # QUANT=none
        blocks = [b["name"] for b in info["blocks"]]
        for e in ("transformer", "transformer_2"):
            self.assertEqual(sum(1 for b in blocks if b.startswith(e + ".blocks.")), 4, blocks)

    def test_videos(self) -> None:
        """Each run's videos: both experts ran, two calls a step (guidance's both passes),
        the switch where boundary_ratio puts it; the figures there; the same latents in
        every video; arena's latents the resident pipeline's bit for bit (bf16 image), and
        model offload's."""
        switch = boundary_step(6)
        self.assertTrue(0 < switch < 6)
        res = self.by["resident"]
        self.assertGreater(res["out_abs_mean"], 0)
        for name in W22_NAMES[1:]:
            r = self.by[name]
            self.assertEqual(r["experts"], ["transformer"] * switch + ["transformer_2"] * (6 - switch), name)
            self.assertEqual((r["switch_step"], r["boundary_step"]), (switch, switch), name)
            self.assertEqual(len(r["steps_s"]), 6, name)
            self.assertTrue(all(s > 0 for s in r["steps_s"]), name)
            self.assertEqual(len(r["videos_s"]), 2, name)
            self.assertTrue(r["same_every_video"], name)
            self.assertGreater(r["video_s"], r["denoise_s"], name)
            self.assertAlmostEqual(r["denoise_s"], sum(r["steps_s"]), places=6)
            per = r["per_expert"]
            self.assertEqual((per["transformer"]["steps"], per["transformer_2"]["steps"]), (switch, 6 - switch))
            self.assertAlmostEqual(r["switch_extra_s"], r["steps_s"][switch] - per["transformer_2"]["steady_median_s"])
            self.assertEqual(r["out_hash"], res["out_hash"], name)
            self.assertEqual(r["video_hash"], res["video_hash"], name)
            self.assertGreater(r["setup_s"], 0, name)
            self.assertGreater(r["host_peak_rss"], 0, name)

    def test_arena(self) -> None:
        """Under the cap both experts streamed and the simulated device's peak stayed in
        it; each denoising step's records are its two passes; the switch moved the
        low-noise expert's blocks in (its copies at the link recorded), the steps after it
        nothing more; without a cap nothing moved."""
        for name in ("arena-300K", "arena-300K-exact"):
            r = self.by[name]
            self.assertGreater(r["plan"]["n_streamed"], 0, name)
            self.assertLessEqual(r["sim_peak_bytes"], arena.parse_size("300K"), name)
            recs = r["step_records"]
            self.assertEqual(len(recs), 6)
            self.assertTrue(all(len(x["engine_steps"]) == 2 for x in recs[1:]), recs)
            sw = r["switch_step"]
            self.assertGreater(recs[sw]["moved_bytes"], 0, name)
            self.assertEqual(r["switch_moved_bytes"], recs[sw]["moved_bytes"])
            self.assertEqual(r["switch_copies_s"], r["switch_moved_bytes"] / r["h2d_bytes_per_s"])
            self.assertTrue(any(d["why"] == "schedule" for d in r["switch_decisions"]), r["switch_decisions"])
            self.assertFalse(r["fp8_native"])
            self.assertTrue(r["bit_for_bit_with_resident"])
        self.assertEqual(self.by["arena-300K-exact"]["fp8_compute"], "off")
        free = self.by["arena-none"]
        self.assertEqual(free["plan"]["n_streamed"], 0)
        self.assertEqual(free["switch_moved_bytes"], 0)

    def test_summary(self) -> None:
        """The table: a row a run, its ratios to resident and model offload, the switch
        and its copies, the peak against the cap, outputs against resident's."""
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "wan_qwen_summary.py"), "--wan22",
                            os.path.join(self.tmp, "out", "wan22.jsonl")], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        text = p.stdout
        self.assertTrue(text.startswith("Image: "), text[:200])
        heads = [ln for ln in text.splitlines() if ln.startswith("### ")]
        self.assertEqual(heads, [f"### Wan 2.2 A14B pipeline (tiny), 32x32x5, 6 steps a video; resident "
                                 f"{self.by['resident']['video_s']:.2f} s"])
        rows = {ln.split(" | ")[0][2:]: ln.split(" | ") for ln in text.splitlines()
                if ln.startswith("| ") and not ln.startswith("| run ")}
        self.assertEqual(sorted(rows), sorted(W22_NAMES[1:]))
        res, off = self.by["resident"], self.by["model-offload"]
        switch = boundary_step(6)
        for name, cells in rows.items():
            r = self.by[name]
            self.assertEqual(cells[3], f"{r['video_s']:.2f}", name)
            self.assertEqual(cells[4], f"{r['video_s'] / res['video_s']:.3f}", name)
            self.assertEqual(cells[5], f"{r['video_s'] / off['video_s']:.3f}", name)
            self.assertEqual(cells[6], f"6 ({switch}/{6 - switch})", name)
            self.assertEqual(cells[9], f"{switch} ({switch})", name)
            self.assertEqual(cells[-1].rstrip(" |"), "-" if name == "resident" else "yes", name)
        self.assertIn(", simulated)", rows["arena-300K"][11])
        self.assertIn("(sim)", rows["arena-300K"][12])
        self.assertEqual(rows["arena-300K"][13], "yes")
        self.assertEqual(rows["arena-none"][13], "-")

    def test_fp8_image(self) -> None:
        """The default image: the experts' block Linears fp8-e4m3-row, the text encoder
        bf16; resident and model offload compute with its values dequantized by arena's
        rule, arena dequantizing at each bind gives their latents bit for bit (on the CPU
        no FP8 products: fp8_compute's default dequantizes too), and they differ from the
        bf16 image's."""
        img = os.path.join(self.tmp, "fp8.arena")

        def run(*args: str) -> Dict[str, Any]:
            p = subprocess.run([sys.executable, str(ROOT / "bench" / "torch_wan22.py"), *args, "--image", img,
                                "--tiny", "--device", "cpu"], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])
            rec: Dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
            return rec

        made = run("make")
        self.assertEqual(made["image_schemes"], ["fp8-e4m3-row", "none"])
        q = {t["name"].split(".", 1)[0] for t in arena.inspect(img)["tensors"] if t["scheme"] != "none"}
        self.assertEqual(q, {"transformer", "transformer_2"})
        res = run("resident")
        self.assertNotEqual(res["out_hash"], self.by["resident"]["out_hash"])
        for r in (run("arena", "--vram", "300K"), run("model-offload")):
            self.assertEqual(r["out_hash"], res["out_hash"], r["run"])
        with self.assertRaises(AssertionError):  # the image is there: make refuses to write over it
            run("make")


if __name__ == "__main__":
    unittest.main()
