"""python -m arena_gpu.bench end to end on the simulated device (the flux-tiny layout).

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

from arena_gpu.bench import _report
from tiers import slow

PREFIX = "ARENA_BENCH_ROW "


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


if __name__ == "__main__":
    unittest.main()
