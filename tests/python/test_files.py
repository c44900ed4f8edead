"""arena.convert, arena.verify, arena.inspect and the arena command of the installed package.

Run with the package installed (no torch needed):
    python tests/python/test_files.py -v
Fixtures: $ARENA_FIXTURES_DIR (default: fixtures/ beside tests/).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path
from typing import List, Tuple

import arena_gpu as arena
from tiers import ctrl_c, slow

ROOT = Path(__file__).resolve().parent.parent.parent
FIX = Path(os.environ.get("ARENA_FIXTURES_DIR", ROOT / "fixtures"))
FLUX = str(FIX / "tiny_flux.safetensors")


def cli(*args: str) -> "subprocess.CompletedProcess[str]":
    """The package's arena command (python -m arena_gpu), as a user runs it."""
    return subprocess.run([sys.executable, "-m", "arena_gpu", *args], capture_output=True, text=True)


class Files(unittest.TestCase):
    tmp: str
    slow: str  # a checkpoint that takes seconds to convert with zstd -19 on one thread

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="arena-files-")
        # flux-dev's layers outside its blocks: 55 M parameters (110 MB)
        cls.slow = os.path.join(cls.tmp, "slow.safetensors")
        r = cli("synth", "--layout", "flux-dev", "--blocks", "0", "-q", "-o", cls.slow)
        assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, name: str) -> str:
        return os.path.join(self.tmp, name)

    def leftovers(self) -> List[str]:
        """What is in the folder besides the shared checkpoint and its image."""
        return sorted(set(os.listdir(self.tmp)) - {"slow.safetensors", "slow.arena"})

    def test_convert_verify_inspect(self) -> None:
        out = self.path("f.arena")
        seen: List[Tuple[int, int]] = []
        info = arena.convert(FLUX, out, codec="zstd", zstd_level=3, chunk_size="64K", threads=2,
                             progress=lambda d, t: seen.append((d, t)))
        self.assertEqual((info["n_blocks"], info["n_tensors"]), (6, 126))
        self.assertEqual(info["file_size"], os.path.getsize(out))
        self.assertLess(info["stored_bytes"], info["data_bytes"])
        self.assertTrue(seen and seen[-1][0] == seen[-1][1], seen)
        self.assertEqual([d for d, _ in seen], sorted(d for d, _ in seen))
        v = arena.verify(out)
        self.assertEqual((v["ok"], v["file_size"], v["chunks"]), (True, info["file_size"], info["chunk_count"]))
        d = arena.inspect(out)
        self.assertEqual(d["kind"], "arena-image")
        self.assertEqual(len(d["tensors"]), 126)
        # the command prints the same document
        r = cli("inspect", "--json", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout), d)
        r = cli("verify", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ok: ", r.stdout)
        c = arena.inspect(FLUX)
        self.assertEqual((c["kind"], c["totals"]["tensors"]), ("safetensors", 126))
        # quantized, and from several inputs (a sharded folder)
        q = arena.convert(FLUX, self.path("q.arena"), quant="fp8-e4m3-row", quant_exclude=["*proj_out*"], progress=False)
        schemes = {t["name"]: t["scheme"] for t in arena.inspect(self.path("q.arena"))["tensors"]}
        self.assertEqual(schemes["transformer_blocks.0.attn.to_q.weight"], "fp8-e4m3-row")
        self.assertEqual(schemes["single_transformer_blocks.0.proj_out.weight"], "none")
        self.assertEqual(q["n_tensors"], 126)
        info = arena.convert([FIX / "tiny_llama_sharded"], self.path("l.arena"), progress=False)
        self.assertGreater(info["n_blocks"], 1)
        for f in ("f.arena", "q.arena", "l.arena"):
            os.unlink(self.path(f))

    def test_errors_are_the_librarys(self) -> None:
        out = self.path("x.arena")
        cases = [
            (dict(codec="lz4"), "USAGE", "codec 'lz4'"),
            (dict(chunk_size=1000), "USAGE", "chunk_size 1000"),
            (dict(codec="hb4", zstd_level=3), "USAGE", "zstd_level is for codec zstd"),
            (dict(quant="fp9"), "QUANT_UNKNOWN_SCHEME", "fp9"),
            (dict(block_patterns=["a("]), "PLAN_BAD_PATTERN", "a("),
        ]
        for kw, code, says in cases:
            with self.assertRaises(arena.Error, msg=str(kw)) as e:
                arena.convert(FLUX, out, progress=False, **kw)  # type: ignore[arg-type]
            self.assertEqual(e.exception.code, code, e.exception.message)
            self.assertIn(says, e.exception.message)
        with self.assertRaises(arena.Error) as e:
            arena.convert(self.path("none.safetensors"), out)
        self.assertEqual((e.exception.code, e.exception.error_class), ("NOT_FOUND", "usage"))
        self.assertIn("none.safetensors", str(e.exception))
        with self.assertRaises(arena.Error) as e:
            arena.convert(FLUX, FLUX)
        self.assertEqual(e.exception.code, "OUTPUT_IS_INPUT")
        with self.assertRaises(arena.Error) as e:
            arena.verify(FLUX)
        self.assertEqual(e.exception.code, "IMG_MAGIC")
        with self.assertRaises(arena.Error) as e:
            arena.inspect(self.path("none"))
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertEqual(self.leftovers(), [])

    def test_existing_output_needs_force(self) -> None:
        """An existing output is refused (OUTPUT_EXISTS, before any work: no progress)
        and left as it was, unless force=True, as the arena command's --force."""
        out = self.path("e.arena")
        with open(out, "w") as f:
            f.write("keep")
        seen: List[Tuple[int, int]] = []
        with self.assertRaises(arena.Error) as e:
            arena.convert(FLUX, out, progress=lambda d, t: seen.append((d, t)))
        self.assertEqual((e.exception.code, e.exception.error_class), ("OUTPUT_EXISTS", "usage"))
        self.assertIn(out, e.exception.message)
        self.assertIn("force=True", e.exception.message)
        self.assertEqual(seen, [])
        with open(out) as f:
            self.assertEqual(f.read(), "keep")
        r = cli("convert", FLUX, "-o", out)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--force", r.stderr)
        info = arena.convert(FLUX, out, force=True, progress=False)
        self.assertEqual(os.path.getsize(out), info["file_size"])
        self.assertTrue(arena.verify(out, progress=False)["ok"])
        os.unlink(out)
        self.assertEqual(self.leftovers(), [])

    def test_read_back(self) -> None:
        """read_back=True (arena convert --read-back) writes the same image, each chunk
        compared with what the disk kept as it was written."""
        a, b = self.path("a.arena"), self.path("rb.arena")
        ia = arena.convert(FLUX, a, chunk_size="64K", progress=False)
        ib = arena.convert(FLUX, b, chunk_size="64K", progress=False, read_back=True)
        self.assertEqual(ia, ib)
        with open(a, "rb") as fa, open(b, "rb") as fb:
            self.assertEqual(fa.read(), fb.read())
        r = cli("convert", FLUX, "-o", self.path("c.arena"), "--read-back", "--chunk-size", "64K", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(a, "rb") as fa, open(self.path("c.arena"), "rb") as fc:
            self.assertEqual(fa.read(), fc.read())
        for p in ("a.arena", "rb.arena", "c.arena"):
            os.unlink(self.path(p))
        self.assertEqual(self.leftovers(), [])

    def test_bad_chunks(self) -> None:
        out = self.path("b.arena")
        arena.convert(FLUX, out, chunk_size="64K", progress=False)
        data_offset = arena.inspect(out)["layout"]["data_offset"]
        with open(out, "r+b") as f:  # a byte in the first and the third chunk
            for at in (data_offset + 10, data_offset + 2 * 65536 + 10):
                f.seek(at)
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ 0x5A]))
        with self.assertRaises(arena.Error) as e:
            arena.verify(out)
        self.assertEqual(e.exception.code, "IMG_CHUNK_CHECKSUM")
        self.assertIn("chunk 0", e.exception.message)
        self.assertEqual([b["chunk"] for b in e.exception.bad_chunks], [0, 2])
        self.assertEqual(e.exception.bad_chunks[0]["blocks"][0], "globals")
        self.assertTrue(e.exception.bad_chunks[0]["tensors"])
        r = cli("verify", "--json", out)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(json.loads(r.stdout)["bad_chunks"], e.exception.bad_chunks)
        os.unlink(out)

    def test_a_progress_function_that_raises_cancels(self) -> None:
        out = self.path("s.arena")

        def boom(done: int, total: int) -> None:
            raise ValueError("stop here")

        with self.assertRaisesRegex(ValueError, "stop here"):
            arena.convert(self.slow, out, codec="zstd", zstd_level=19, threads=1, progress=boom)
        self.assertEqual(self.leftovers(), [])
        with self.assertRaisesRegex(ValueError, "stop here"):
            arena.verify(self.image(), progress=boom)

    def image(self) -> str:
        p = self.path("slow.arena")
        if not os.path.exists(p):
            arena.convert(self.slow, p, progress=False)
        return p

    def test_ctrl_c_in_convert_leaves_nothing(self) -> None:
        # In this process: SIGINT while the library converts.
        out = self.path("c.arena")
        t0 = time.monotonic()
        with ctrl_c(), self.assertRaises(KeyboardInterrupt):
            arena.convert(self.slow, out, codec="zstd", zstd_level=19, threads=1,
                          progress=lambda d, t: os.kill(os.getpid(), signal.SIGINT))
        self.assertLess(time.monotonic() - t0, 20, "the convert was not cancelled")
        self.assertFalse(os.path.exists(out))
        self.assertEqual(self.leftovers(), [])
        # From outside, as a terminal's Ctrl-C: a script converting, interrupted once it has started.
        started = self.path("started")
        script = textwrap.dedent(f"""
            import arena_gpu as arena, signal, sys
            signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground job
            def p(d, t):
                open({started!r}, "w").close()
            try:
                arena.convert({self.slow!r}, {out!r}, codec="zstd", zstd_level=19, threads=1, progress=p)
            except KeyboardInterrupt:
                print("interrupted")
                sys.exit(130)
            print("finished")
        """)
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(started) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertTrue(os.path.exists(started), "the convert never reported progress")
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
        self.assertEqual((proc.returncode, stdout.strip()), (130, "interrupted"))
        os.unlink(started)
        self.assertFalse(os.path.exists(out))
        self.assertEqual(self.leftovers(), [])

    def test_a_tqdm_bar(self) -> None:
        try:
            import tqdm  # noqa: F401
        except ImportError:
            self.skipTest("tqdm is not installed")
        out = self.path("t.arena")
        script = f"import arena_gpu as arena; arena.convert({FLUX!r}, {out!r}, progress=True)"
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("convert: 100%", r.stderr)
        # None: a bar on a terminal only (stderr is a pipe here)
        script = f"import arena_gpu as arena; arena.convert({FLUX!r}, {out!r}, force=True)"
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        os.unlink(out)

    def test_tensors_without_torch_say_what_to_install(self) -> None:
        """Where torch cannot be imported (``pip install ./python`` installs no extra),
        tensors() and ``import arena_gpu.torch`` raise an ImportError naming the packages
        of python/pyproject.toml's [torch] extra, by pip's name, and the extra."""
        import re

        extra = re.search(r'^torch = \[(.*)\]$', (ROOT / "python" / "pyproject.toml").read_text(), re.M)
        assert extra, "python/pyproject.toml has no [torch] extra"
        pkgs = " ".join(f"'{p}'" if ">" in p or "<" in p else p for p in re.findall(r'"([^"]+)"', extra[1]))
        # A finder first on sys.meta_path that refuses torch and its modules, as where
        # torch is not installed (whatever this interpreter has).
        script = textwrap.dedent(f"""
            import importlib.abc, sys

            class NoTorch(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name == "torch" or name.startswith("torch."):
                        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                    return None

            sys.meta_path.insert(0, NoTorch())
            import arena_gpu as arena
            a = arena.open({FLUX!r}, device="sim")
            for f in (a.tensors, lambda: a.slab(0, 0, "host"), lambda: __import__("arena_gpu.torch")):
                try:
                    f()
                    print("no error")
                except ImportError as e:
                    print(type(e).__name__, e.name, e)
        """)
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 3, r.stdout)
        for line in lines:
            self.assertTrue(line.startswith("ModuleNotFoundError torch arena: "), line)
            self.assertIn(f"needs torch, which is not installed: pip install {pkgs} ", line)
            self.assertIn("pip install './python[torch]' from a checkout", line)

    def test_dir_lists_the_public_names(self) -> None:
        """dir(arena) is the package's public API (__all__, and the arena.torch
        subpackage where torch is installed), not the modules and typing names it uses."""
        import importlib.util

        names = dir(arena)
        self.assertEqual(sorted(set(names) - {"torch"}), sorted(arena.__all__))
        self.assertEqual("torch" in names, importlib.util.find_spec("torch") is not None)
        for n in ("os", "re", "ctypes", "threading", "dataclass", "Any", "Optional"):
            self.assertNotIn(n, names)
        for n in arena.__all__:
            self.assertTrue(hasattr(arena, n), n)
        self.assertTrue(callable(arena.open) and issubclass(arena.Error, Exception))

    def test_public_names_are_the_packages_own(self) -> None:
        """The public classes and functions, whichever private module defines them,
        are named arena_gpu's: a traceback says arena_gpu.Error, a pickle refers to
        arena_gpu.TensorInfo (and loads), typing.get_type_hints reads the records'
        annotations; convert, verify, inspect and parse_size stay their modules'."""
        import pickle
        import typing

        for n in ("Error", "ShareWarning", "OomRetryWarning", "Arena", "Block", "Component", "TensorInfo", "open",
                  "library_version", "torch_dtype", "ImageWriter"):
            o = getattr(arena, n)
            self.assertEqual(o.__module__, "arena_gpu", n)
            self.assertIs(pickle.loads(pickle.dumps(o)), o, n)
        for n, module in (("convert", "_files"), ("verify", "_files"), ("inspect", "_files"),
                          ("parse_size", "_units")):
            self.assertEqual(getattr(arena, n).__module__, f"arena_gpu.{module}", n)
        self.assertEqual(repr(arena.Error), "<class 'arena_gpu.Error'>")
        c = arena.Component("data", "BF16", (2, 3), 12, 0)
        t = arena.TensorInfo("w", "BF16", (2, 3), "none", 1, (c,))
        b = arena.Block(0, "b", None, -1, 0)
        for v in (c, t, b):
            self.assertIn(f"carena_gpu\n{type(v).__name__}\n".encode(), pickle.dumps(v, 0))
            self.assertEqual(pickle.loads(pickle.dumps(v)), v)
        self.assertEqual(typing.get_type_hints(arena.TensorInfo)["subclass"], typing.Optional[str])
        self.assertEqual(typing.get_type_hints(arena.TensorInfo)["components"], typing.Tuple[arena.Component, ...])
        self.assertEqual(typing.get_type_hints(arena.Block)["container"], typing.Optional[str])
        r = subprocess.run([sys.executable, "-c", f"import arena_gpu as arena; arena.open({self.path('none')!r})"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertTrue(r.stderr.splitlines()[-1].startswith("arena_gpu.Error: "), r.stderr)
        with arena.open(FLUX, device="sim") as a:
            self.assertEqual(repr(a), f"<arena.Arena {FLUX!r} (sim, 6 blocks, 126 tensors)>")

    def test_the_distribution(self) -> None:
        """The package is installed as the distribution python/pyproject.toml names,
        arena-gpu, its module arena_gpu: the name arena on PyPI is another
        project's (an Are.na client, 0.0.5), whose module is arena too. Its
        version is the package's."""
        import importlib.metadata as md
        import re

        name = re.search(r'^name = "([^"]+)"$', (ROOT / "python" / "pyproject.toml").read_text(), re.M)
        assert name, "python/pyproject.toml names no distribution"
        self.assertEqual(name[1], "arena-gpu")
        self.assertEqual(md.metadata("arena-gpu")["Name"], "arena-gpu")
        self.assertEqual(md.version("arena-gpu"), arena.__version__)
        # its module arena_gpu, not arena (the other project's)
        self.assertEqual(arena.__name__, "arena_gpu")
        self.assertEqual(md.packages_distributions().get("arena_gpu"), ["arena-gpu"])
        self.assertNotIn("arena-gpu", md.packages_distributions().get("arena", []))

    @slow
    def test_a_checkpoint_cut_while_it_is_read_is_an_error_not_a_signal(self) -> None:
        # 40,000 tensors: a 2.6 MB header, half a second of parsing. Cut to 4 KiB
        # at several delays after the call starts: the call fails with an
        # arena.Error of class invalid (or ends whole, having read everything
        # first), never a SIGBUS that kills the interpreter.
        n = 40000
        h = {f"t.{i}": {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)}
        text = json.dumps(h, separators=(",", ":")).encode()
        whole = len(text).to_bytes(8, "little") + text + bytes(n)
        path = self.path("cut.safetensors")
        child = textwrap.dedent("""
            import sys
            import arena_gpu as arena
            path, what = sys.argv[1], sys.argv[2]
            print("ready", flush=True)
            sys.stdin.readline()
            try:
                if what == "inspect":
                    arena.inspect(path)
                else:
                    with arena.open(path, device="sim", learn=False):
                        pass
            except arena.Error as e:
                print(e.code, e.error_class, flush=True)
                sys.exit(1)
        """)
        for what in ("inspect", "open"):
            for delay in (0.0, 0.005, 0.02, 0.05, 0.2):
                with open(path, "wb") as f:
                    f.write(whole)
                p = subprocess.Popen([sys.executable, "-c", child, path, what], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                assert p.stdin is not None and p.stdout is not None
                self.assertEqual(p.stdout.readline().strip(), "ready")
                p.stdin.write("go\n")
                p.stdin.flush()
                time.sleep(delay)
                os.truncate(path, 4096)
                out, err = p.communicate(timeout=120)
                at = f"{what}, cut after {delay} s: exit {p.returncode}, {out.strip()!r} {err.strip()[-300:]!r}"
                self.assertIn(p.returncode, (0, 1), at)
                if p.returncode:
                    self.assertTrue(out.strip().endswith(" invalid"), at)
        os.unlink(path)
        self.assertEqual(self.leftovers(), [])

    def test_the_command(self) -> None:
        r = cli("version")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"arena {arena.library_version()}", r.stdout)
        r = cli("nope")
        self.assertEqual(r.returncode, 2)
        self.assertIn("'nope' is not an arena command", r.stderr)
        # the console script beside this interpreter (a venv's bin/arena), when installed so
        script = Path(sys.executable).parent / "arena"
        if script.exists():
            r = subprocess.run([str(script), "convert", "-q", FLUX, "-o", self.path("e.arena")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            r = subprocess.run([str(script), "verify", self.path("e.arena")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            os.unlink(self.path("e.arena"))


if __name__ == "__main__":
    unittest.main()
