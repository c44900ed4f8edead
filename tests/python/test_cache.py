"""The cache of converted images (arena_gpu._cache, arena.cache_info, arena cache ...).

Run with the package installed (no torch needed):
    python tests/python/test_cache.py -v
Fixtures: $ARENA_FIXTURES_DIR (default: fixtures/ beside tests/).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path
from typing import Any, Dict, List, Tuple

import arena_gpu as arena
from arena_gpu import _cache
from tiers import ctrl_c

ROOT = Path(__file__).resolve().parent.parent.parent
FIX = Path(os.environ.get("ARENA_FIXTURES_DIR", ROOT / "fixtures"))
FLUX = str(FIX / "tiny_flux.safetensors")


def cli(*args: str, env: Dict[str, str]) -> "subprocess.CompletedProcess[str]":
    """The package's arena command (python -m arena_gpu), as a user runs it."""
    return subprocess.run([sys.executable, "-m", "arena_gpu", *args], capture_output=True, text=True,
                          env={**os.environ, **env})


def script(code: str, env: Dict[str, str]) -> "subprocess.Popen[str]":
    """A Python process running ``code`` (this interpreter, the package as installed)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


class Cache(unittest.TestCase):
    tmp: str

    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="arena-cache-")
        self.root = os.path.join(self.tmp, "cache")
        self.src = os.path.join(self.tmp, "model.safetensors")
        shutil.copyfile(FLUX, self.src)
        self.calls: List[Path] = []

    def tearDown(self) -> None:
        for top, dirs, _files in os.walk(self.tmp):  # a test may leave a folder unwritable
            for d in dirs:
                os.chmod(os.path.join(top, d), 0o700)
        os.chmod(self.tmp, 0o700)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def make(self, path: Path) -> None:
        self.calls.append(path)
        arena.convert(self.src, path, progress=False)

    def key(self, **options: Any) -> str:
        return _cache.source_key([self.src], options)

    def entry(self, key: str, **kw: Any) -> _cache.CacheEntry:
        kw.setdefault("record", {"sources": [self.src], "options": {}})
        return _cache.entry(key, kw.pop("make", self.make), cache=self.root, **kw)

    def quiet_entry(self, key: str, **kw: Any) -> Tuple[_cache.CacheEntry, str]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            e = self.entry(key, **kw)
        return e, err.getvalue()

    def names(self) -> List[str]:
        return sorted(os.listdir(self.root))

    def test_made_once_then_found(self) -> None:
        k = self.key(quant=None)
        e, said = self.quiet_entry(k, label="tiny flux")
        self.assertTrue(e.made)
        self.assertEqual(len(self.calls), 1)
        self.assertEqual(self.calls[0].name, "image.arena")
        self.assertNotEqual(self.calls[0].parent, e.dir)  # made elsewhere, renamed into place
        self.assertEqual(e.image, Path(self.root) / k / "image.arena")
        self.assertTrue(arena.verify(e.image, progress=False)["ok"])
        self.assertEqual(arena.inspect(e.image)["totals"]["tensors"], 126)
        self.assertEqual(e.record, {"sources": [self.src], "options": {}})
        self.assertEqual(e.size, os.path.getsize(e.image) + os.path.getsize(e.dir / "entry.json"))
        self.assertEqual(said.strip(), f"arena: cached tiny flux as {e.image} ({_cache._fmt_bytes(e.size)})")
        self.assertEqual(stat.S_IMODE(os.stat(self.root).st_mode), 0o700)
        self.assertEqual(self.names(), [k, f"{k}.lock"])
        doc = json.loads((e.dir / "entry.json").read_text())
        self.assertEqual((doc["key"], doc["label"], doc["image"]["verified"]), (k, "tiny flux", True))
        self.assertEqual(doc["image"]["size"], os.path.getsize(e.image))
        self.assertEqual(doc["library_version"], arena.library_version())
        e.release()
        # the second call finds it: make is not called, nothing is said, its last use moves
        used = os.stat(e.dir / "entry.json").st_mtime_ns
        time.sleep(0.02)
        e2, said = self.quiet_entry(k, record={"other": 1})
        self.assertFalse(e2.made)
        self.assertEqual(len(self.calls), 1)
        self.assertEqual(said, "")
        self.assertEqual((e2.image, e2.size, e2.record), (e.image, e.size, e.record))  # the maker's record
        self.assertGreater(os.stat(e.dir / "entry.json").st_mtime_ns, used)
        # files beside the image are kept and counted
        (e2.dir / "compiled").mkdir()
        (e2.dir / "compiled" / "artifacts.bin").write_bytes(b"x" * 1000)
        e3, _ = self.quiet_entry(k)
        self.assertFalse(e3.made)
        self.assertEqual(e3.size, e.size + 1000)
        info = arena.cache_info(self.root)
        self.assertEqual([(i["key"], i["size"], i["label"], i["record"], i["problem"]) for i in info],
                         [(k, e.size + 1000, "tiny flux", e.record, None)])
        self.assertEqual(info[0]["image"], str(e.image))
        self.assertAlmostEqual(info[0]["used"], os.stat(e.dir / "entry.json").st_mtime, places=3)
        self.assertEqual(info[0]["made"], doc["made"])
        # the command lists the same entries
        r = cli("cache", "list", "--json", env={"ARENA_CACHE": self.root})
        self.assertEqual(r.returncode, 0, r.stderr)
        listed = json.loads(r.stdout)
        self.assertEqual(listed["root"], self.root)
        self.assertEqual([(x["key"], x["size"], x["record"]) for x in listed["entries"]],
                         [(i["key"], i["size"], i["record"]) for i in info])
        r = cli("cache", "list", env={"ARENA_CACHE": self.root})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"{k[:12]}  ", r.stdout)
        self.assertIn(f"tiny flux from {self.src}", r.stdout)
        self.assertIn(f"1 entry, {_cache._fmt_bytes(e.size + 1000)} in {self.root}", r.stdout)

    def test_keys_name_the_sources_and_options(self) -> None:
        k = self.key()
        self.assertRegex(k, r"\A[0-9a-f]{32}\Z")
        self.assertEqual(self.key(), k)
        self.assertNotEqual(self.key(quant="fp8-e4m3-row"), k)
        self.assertNotEqual(self.key(codec="hb4"), k)
        self.assertEqual(_cache.source_key([self.src], {"b": 1, "a": [1, 2]}),
                         _cache.source_key([self.src], {"a": [1, 2], "b": 1}))
        # the same file by another name (a symbolic link: the resolved path counts)
        link = os.path.join(self.tmp, "link.safetensors")
        os.symlink(self.src, link)
        self.assertEqual(_cache.source_key([link], {}), k)
        # touched: another key
        st = os.stat(self.src)
        os.utime(self.src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        k2 = self.key()
        self.assertNotEqual(k2, k)
        # rewritten with the same size and time, its header changed: another key
        data = bytearray(Path(self.src).read_bytes())
        at = data.index(b'"dtype"')
        data[at + 1] = ord("D")
        Path(self.src).write_bytes(bytes(data))
        os.utime(self.src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        self.assertEqual(os.path.getsize(self.src), st.st_size)
        self.assertNotEqual(self.key(), k2)
        # a config beside it counts by its bytes
        cfg = os.path.join(self.tmp, "config.json")
        Path(cfg).write_text('{"a": 1}')
        c1 = _cache.source_key([self.src, cfg], {})
        Path(cfg).write_text('{"a": 2}')
        os.utime(cfg, ns=(0, 0))
        c2 = _cache.source_key([self.src, cfg], {})
        os.utime(cfg, ns=(0, 0))
        Path(cfg).write_text('{"a": 3}')
        os.utime(cfg, ns=(0, 0))
        self.assertEqual(len({c1, c2, _cache.source_key([self.src, cfg], {})}), 3)
        with self.assertRaises(arena.Error) as e:
            _cache.source_key([os.path.join(self.tmp, "none.safetensors")], {})
        self.assertEqual(e.exception.code, "NOT_FOUND")
        with self.assertRaises(arena.Error) as e:
            _cache.source_key([self.tmp], {})
        self.assertIn("not a regular file", e.exception.message)
        with self.assertRaises(arena.Error) as e:
            _cache.source_key([self.src], {"x": object()})
        self.assertIn("not JSON-able", e.exception.message)

    def test_a_changed_source_makes_a_new_entry(self) -> None:
        k1 = self.key()
        self.quiet_entry(k1)[0].release()
        time.sleep(0.01)
        Path(self.src).touch()
        k2 = self.key()
        self.assertNotEqual(k1, k2)
        e, _ = self.quiet_entry(k2)
        self.assertTrue(e.made)
        self.assertEqual(len(self.calls), 2)
        self.assertEqual(sorted(i["key"] for i in arena.cache_info(self.root)), sorted([k1, k2]))

    def damaged(self, k: str, why: str) -> _cache.CacheEntry:
        """entry() makes the entry again, saying why it was damaged."""
        n = len(self.calls)
        e, said = self.quiet_entry(k)
        self.assertTrue(e.made, said)
        self.assertEqual(len(self.calls), n + 1)
        self.assertIn(f"arena: the cache entry {Path(self.root) / k} is damaged (", said)
        self.assertIn(why, said)
        self.assertTrue(arena.verify(e.image, progress=False)["ok"])
        self.assertEqual(self.names(), [k, f"{k}.lock"])
        return e

    def test_a_damaged_entry_is_made_again(self) -> None:
        k = self.key()
        e, _ = self.quiet_entry(k)
        size = os.path.getsize(e.image)
        data_at = arena.inspect(e.image)["layout"]["data_offset"]
        e.release()
        # truncated
        os.truncate(e.image, size - 4096)
        e = self.damaged(k, f"image.arena is {size - 4096} bytes, its record says {size}")
        e.release()
        # a byte of the manifest flipped: its checksum does not hold (arena.inspect)
        with open(e.image, "r+b") as f:
            f.seek(4096 + 10)
            b = f.read(1)
            f.seek(4096 + 10)
            f.write(bytes([b[0] ^ 0x20]))
        e = self.damaged(k, "image.arena does not read")
        e.release()
        # a byte of the data flipped through the file system: its time moved, so it is verified again
        with open(e.image, "r+b") as f:
            f.seek(data_at + 100)
            b = f.read(1)
            f.seek(data_at + 100)
            f.write(bytes([b[0] ^ 0x01]))
        e = self.damaged(k, "changed since it was verified, and does not verify: ")
        e.release()
        # the record gone, or not JSON
        os.unlink(e.dir / "entry.json")
        self.damaged(k, "it has no entry.json").release()
        (Path(self.root) / k / "entry.json").write_text("{")
        self.damaged(k, "its entry.json is not JSON").release()
        # touched but whole: verified again, kept, its record's time brought up to date
        os.utime(e.image)
        n = len(self.calls)
        e, said = self.quiet_entry(k)
        self.assertFalse(e.made, said)
        self.assertEqual((len(self.calls), said), (n, ""))
        self.assertEqual(json.loads((e.dir / "entry.json").read_text())["image"]["mtime_ns"],
                         os.stat(e.image).st_mtime_ns)
        e.release()
        e, said = self.quiet_entry(k)
        self.assertEqual((e.made, said), (False, ""))

    def test_a_corrupt_entry_found_at_open_is_invalidated(self) -> None:
        """A data byte flipped with the file's time kept (no cheap check sees it): arena.open
        finds it, invalidate removes the entry, the next entry() makes it again."""
        k = self.key()
        e, _ = self.quiet_entry(k)
        data_at = arena.inspect(e.image)["layout"]["data_offset"]
        st = os.stat(e.image)
        e.release()
        with open(e.image, "r+b") as f:
            f.seek(data_at + 100)
            b = f.read(1)
            f.seek(data_at + 100)
            f.write(bytes([b[0] ^ 0x01]))
        os.utime(e.image, ns=(st.st_atime_ns, st.st_mtime_ns))
        e, said = self.quiet_entry(k)
        self.assertFalse(e.made, said)
        with self.assertRaises(arena.Error) as err:
            arena.open(e.image, device="sim").close()
        self.assertEqual(err.exception.code, "IMG_CHUNK_CHECKSUM")
        # an entry made again since e was found is another's: left alone
        stale = _cache.CacheEntry(key=k, dir=e.dir, image=e.image, made=False, size=0, record={}, _ident=(0, 1))
        with contextlib.redirect_stderr(io.StringIO()):
            _cache.invalidate(stale)
        self.assertTrue(e.image.exists())
        said_io = io.StringIO()
        with contextlib.redirect_stderr(said_io):
            _cache.invalidate(e)
        self.assertIn(f"removed the damaged cache entry {e.dir}", said_io.getvalue())
        self.assertFalse(e.dir.exists())
        self.assertEqual(e._fd, -1)
        e, _ = self.quiet_entry(k)
        self.assertTrue(e.made)
        with arena.open(e.image, device="sim") as a:
            self.assertEqual(len(a.blocks), 6)

    def test_an_image_read_back_as_written_is_not_read_again(self) -> None:
        """A make that wrote with read_back (each chunk compared with what the disk kept)
        returns True: the entry checks the image's header, manifest and chunk table, not
        every byte a second time; a damaged header is still caught, and leaves nothing."""
        k = self.key(read_back=True)
        verified: List[Path] = []
        real = _cache._verify

        def counting(path: Any, **kw: Any) -> Dict[str, Any]:
            verified.append(Path(path))
            return real(path, **kw)

        def read_back(path: Path) -> bool:
            arena.convert(self.src, path, progress=False, read_back=True)
            return True

        _cache._verify = counting
        try:
            e, _ = self.quiet_entry(k, make=read_back)
            self.assertTrue(e.made)
            self.assertEqual(verified, [])
            doc = json.loads((e.dir / "entry.json").read_text())
            self.assertTrue(doc["image"]["verified"])
            self.assertEqual(doc["image"]["chunks"], arena.inspect(e.image)["layout"]["chunk_count"])
            self.assertTrue(arena.verify(e.image, progress=False)["ok"])
            e.release()
            # a make that says it read back, but whose header is not what an image's is
            k2 = self.key(read_back="damaged")

            def damaged(path: Path) -> bool:
                arena.convert(self.src, path, progress=False, read_back=True)
                with open(path, "r+b") as f:
                    f.seek(8)
                    b = f.read(1)
                    f.seek(8)
                    f.write(bytes([b[0] ^ 1]))
                return True

            with self.assertRaises(arena.Error) as err:
                self.quiet_entry(k2, make=damaged)
            self.assertTrue(err.exception.code.startswith("IMG_"), err.exception.code)
            self.assertEqual(verified, [])
            self.assertNotIn(k2, self.names())
            self.assertEqual([n for n in self.names() if n.startswith(".tmp")], [])
        finally:
            _cache._verify = real

    def test_an_error_or_ctrl_c_in_make_leaves_nothing(self) -> None:
        k = self.key()

        def fails(path: Path) -> None:
            arena.convert(self.src, path, progress=False)
            raise ValueError("make failed")

        with self.assertRaisesRegex(ValueError, "make failed"):
            self.entry(k, make=fails)
        self.assertEqual(self.names(), [f"{k}.lock"])

        def interrupted(path: Path) -> None:
            arena.convert(self.src, path, progress=False)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as a terminal sends it
            time.sleep(5)

        with ctrl_c(), self.assertRaises(KeyboardInterrupt):
            self.entry(k, make=interrupted)
        self.assertEqual(self.names(), [f"{k}.lock"])

        # Ctrl-C in the library's conversion itself (the progress callback stands for the user)
        def converts(path: Path) -> None:
            arena.convert(self.src, path, progress=lambda d, t: os.kill(os.getpid(), signal.SIGINT),
                          chunk_size="64K", codec="zstd", zstd_level=19, threads=1)

        with ctrl_c(), self.assertRaises(KeyboardInterrupt):
            self.entry(k, make=converts)
        self.assertEqual(self.names(), [f"{k}.lock"])

        def writes_nothing(path: Path) -> None:
            pass

        with self.assertRaises(arena.Error) as e:
            self.entry(k, make=writes_nothing)
        self.assertIn("make wrote no image", e.exception.message)

        def writes_garbage(path: Path) -> None:
            path.write_bytes(b"\0" * 8192)

        with self.assertRaises(arena.Error) as e:
            self.entry(k, make=writes_garbage)
        self.assertEqual(e.exception.code, "IMG_MAGIC")
        self.assertEqual(self.names(), [f"{k}.lock"])
        self.assertEqual(arena.cache_info(self.root), [])
        # and then it is made
        self.assertTrue(self.quiet_entry(k)[0].made)

    def test_two_processes_make_it_once(self) -> None:
        """Two processes asking for one entry at once: one makes it (the other waits, says
        so, and finds it), one good entry, make called once."""
        k = self.key()
        log = os.path.join(self.tmp, "made.log")
        code = f"""
            import os, sys, time
            from pathlib import Path
            import arena_gpu as arena
            from arena_gpu import _cache
            _cache.WAIT_SAY_S = 0.2
            def make(path):
                with open({log!r}, "a") as f:
                    f.write(f"{{os.getpid()}}\\n")
                time.sleep(1.5)  # the other process asks meanwhile
                arena.convert({self.src!r}, path, progress=False)
            print("asking", flush=True)
            e = _cache.entry({k!r}, make, record={{"sources": [{self.src!r}]}}, cache={self.root!r})
            print(e.made, e.image, flush=True)
        """
        procs = [script(code, {}) for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        made = sorted(out.split()[1] for out, _ in outs)
        self.assertEqual(made, ["False", "True"])
        self.assertEqual({out.split()[2] for out, _ in outs}, {str(Path(self.root) / k / "image.arena")})
        makers = Path(log).read_text().split()
        self.assertEqual(len(makers), 1)
        waited = [err for out, err in outs if out.split()[1] == "False"][0]
        self.assertIn(f"arena: waiting for process {makers[0]}, which is making or checking the cache entry", waited)
        self.assertEqual(self.names(), [k, f"{k}.lock"])
        self.assertTrue(arena.verify(Path(self.root) / k / "image.arena", progress=False)["ok"])

    def test_a_killed_makers_folder_is_swept(self) -> None:
        k = self.key()
        code = f"""
            import time
            from arena_gpu import _cache
            def make(path):
                path.write_bytes(b"half an image")
                print("writing", flush=True)
                time.sleep(60)
            _cache.entry({k!r}, make, record={{}}, cache={self.root!r})
        """
        p = script(code, {})
        assert p.stdout is not None
        self.assertEqual(p.stdout.readline().strip(), "writing")
        tmp = f".tmp-{k}-{p.pid}"
        self.assertEqual(self.names(), [tmp, f"{k}.lock"])
        # the command sees the key's lock held: a folder being made, not removed
        r = cli("cache", "prune", "--all", env={"ARENA_CACHE": self.root})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.names(), [tmp, f"{k}.lock"])
        p.kill()  # kill -9: nothing of the process's own runs
        p.communicate()
        self.assertEqual(self.names(), [tmp, f"{k}.lock"])
        e, _ = self.quiet_entry(k)
        self.assertTrue(e.made)
        self.assertEqual(self.names(), [k, f"{k}.lock"])
        # and prune sweeps one left beside an entry
        os.mkdir(os.path.join(self.root, tmp))
        r = cli("cache", "list", env={"ARENA_CACHE": self.root})
        self.assertIn("1 folder (0 B) of entries being made or removed", r.stdout)
        r = cli("cache", "prune", "--older-than", "1d", env={"ARENA_CACHE": self.root})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"removed: {self.root}/{tmp}", r.stdout)
        self.assertEqual(self.names(), [k, f"{k}.lock"])

    def test_an_entry_in_use_is_not_pruned(self) -> None:
        k = self.key()
        e, _ = self.quiet_entry(k)
        env = {"ARENA_CACHE": self.root}
        r = cli("cache", "prune", "--all", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"left: {k[:12]}  in use by process {os.getpid()}", r.stdout)
        self.assertTrue(e.image.exists())
        r = cli("cache", "list", env=env)
        self.assertIn(f"(in use by process {os.getpid()})", r.stdout)
        e.release()
        r = cli("cache", "prune", "--older-than", "1h", env=env)  # used just now: kept
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(e.image.exists())
        r = cli("cache", "prune", "--all", "--dry-run", env=env)
        self.assertIn(f"would remove: {k[:12]}", r.stdout)
        self.assertTrue(e.image.exists())
        with _cache.entry(k, self.make, record={}, cache=self.root):
            pass  # released at the end of the block
        r = cli("cache", "prune", "--all", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"removed: {k[:12]}", r.stdout)
        self.assertIn(f"freed {_cache._fmt_bytes(e.size)}: 1 entry", r.stdout)
        self.assertEqual(self.names(), [])
        self.assertEqual(arena.cache_info(self.root), [])

    def test_the_cache_must_be_this_users_alone(self) -> None:
        k = self.key()
        os.mkdir(self.root, 0o700)
        os.chmod(self.root, 0o777)
        with self.assertRaises(arena.Error) as e:
            self.entry(k)
        self.assertEqual(e.exception.code, "USAGE")
        self.assertIn(f"other users can write the cache folder {self.root} (mode 777", e.exception.message)
        self.assertIn(f"chmod go-w {self.root}", e.exception.message)
        with self.assertRaises(arena.Error):
            arena.cache_info(self.root)
        r = cli("cache", "list", env={"ARENA_CACHE": self.root})
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"error: other users can write the cache folder {self.root}", r.stderr)
        self.assertEqual(self.calls, [])
        os.chmod(self.root, 0o755)  # others may read, not write: the user's choice
        self.quiet_entry(k)[0].release()
        # a symbolic link as the root, or as an entry
        link = os.path.join(self.tmp, "link")
        os.symlink(self.root, link)
        with self.assertRaises(arena.Error) as e:
            _cache.entry(k, self.make, record={}, cache=link)
        self.assertIn("is a symbolic link", e.exception.message)
        r = cli("cache", "list", "--cache", link, env={})
        self.assertEqual(r.returncode, 2)
        self.assertIn("is a symbolic link", r.stderr)
        other = os.path.join(self.tmp, "elsewhere")
        os.rename(os.path.join(self.root, k), other)
        os.symlink(other, os.path.join(self.root, k))
        with self.assertRaises(arena.Error) as e:
            self.entry(k)
        self.assertIn(f"the cache entry {self.root}/{k} is a symbolic link", e.exception.message)
        self.assertEqual(len(self.calls), 1)

    def test_where_the_cache_is(self) -> None:
        env = {k: os.environ.get(k) for k in ("ARENA_CACHE", "XDG_CACHE_HOME", "HOME")}
        try:
            os.environ.pop("ARENA_CACHE", None)
            os.environ.pop("XDG_CACHE_HOME", None)
            os.environ["HOME"] = self.tmp
            self.assertEqual(_cache.cache_root(), Path(self.tmp) / ".cache" / "arena")
            os.environ["XDG_CACHE_HOME"] = "relative"  # not absolute: ignored, as XDG says
            self.assertEqual(_cache.cache_root(), Path(self.tmp) / ".cache" / "arena")
            os.environ["XDG_CACHE_HOME"] = os.path.join(self.tmp, "xdg")
            self.assertEqual(_cache.cache_root(), Path(self.tmp) / "xdg" / "arena")
            os.environ["ARENA_CACHE"] = self.root
            self.assertEqual(_cache.cache_root(), Path(self.root))
            self.assertEqual(_cache.cache_root(os.path.join(self.tmp, "given")), Path(self.tmp) / "given")
            # the command reads the same rules
            for arena_cache, xdg, want in ((self.root, "", self.root), ("", os.path.join(self.tmp, "xdg"),
                                                                        os.path.join(self.tmp, "xdg", "arena")),
                                           ("", "", os.path.join(self.tmp, ".cache", "arena"))):
                r = cli("cache", "list", "--json", env={"ARENA_CACHE": arena_cache, "XDG_CACHE_HOME": xdg,
                                                        "HOME": self.tmp})
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(json.loads(r.stdout)["root"], want)
            # made on first write, 0700, its parents too
            os.environ["ARENA_CACHE"] = deep = os.path.join(self.tmp, "a", "b", "cache")
            with contextlib.redirect_stderr(io.StringIO()):
                e = _cache.entry(self.key(), self.make, record={})
            self.assertTrue(e.made)
            self.assertEqual(e.dir.parent, Path(deep))
            self.assertEqual(stat.S_IMODE(os.stat(deep).st_mode), 0o700)
            self.assertEqual(arena.cache_info()[0]["key"], self.key())
        finally:
            for name, v in env.items():
                if v is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = v

    def test_keys_are_folder_names(self) -> None:
        for bad in ("../x", "ABCDEF0123456789", "0123", "g" * 32, "/tmp/" + "a" * 32):
            with self.assertRaises(arena.Error, msg=bad) as e:
                self.entry(bad)
            self.assertIn("lowercase hex digits", e.exception.message)
        self.assertEqual(self.calls, [])


if __name__ == "__main__":
    unittest.main()
