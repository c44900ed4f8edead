"""The cache of converted images: a folder of entries, each an image made once from its sources.

Private: the public name is :func:`arena.cache_info`; ``arena.torch.from_pretrained``
and ``offload`` make and use entries through :func:`entry`. The command ``arena cache
list|verify|prune`` (cli/cmd_cache.c) reads and removes the same entries by the same
rules. docs/PYTHON.md, "The cache", says it for users.

The folder (the root) is ``cache`` when given, else ``$ARENA_CACHE``, else
``$XDG_CACHE_HOME/arena``, else ``~/.cache/arena``; it is made (mode 0700) when an
entry is first written. It and every entry in it must be this user's: a folder, not
a symbolic link, that no other user can write (as the share folder of ``share_host``,
docs/SHARING.md, "Security"); anything else is refused with what to fix.

An entry is ``<root>/<key>/`` holding ``image.arena`` and ``entry.json`` (the
caller's record, the image's size and header checksum, when it was made and
verified, the library's version), and whatever else a user of the entry stores
beside the image (kept, counted in its size). ``<key>`` names the sources and the
options (:func:`source_key`). The last use is ``entry.json``'s modification time.

Locks (flock(2)), which the command takes by the same rules:

- ``<root>/<key>.lock``, exclusive while the entry is made, checked again after it
  changed, or removed (the holder writes its pid into it, for the message of a
  process that waits). Whoever removes the lock file does so holding it; a locker
  checks, once it holds a lock, that the file is still the one at that path.
- ``image.arena``, shared while an entry is in use (a :class:`CacheEntry` holds it
  until :meth:`CacheEntry.release`); ``arena cache prune`` takes it exclusive, and
  leaves an entry in use alone.

An entry appears whole or not at all: it is written into ``<root>/.tmp-<key>-<pid>``,
verified, and renamed into place. An error or Ctrl-C removes the temporary folder; one
left by a killed process is removed by the next process that holds the key's lock (or
by ``arena cache prune``). A damaged entry is renamed to ``<root>/.trash-<key>-<pid>``
before it is removed, so that a process reading it keeps its files while the entry is
made again.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._errors import Error
from ._files import inspect as _inspect
from ._files import verify as _verify

PathLike = Union[str, "os.PathLike[str]"]

FORMAT = 1  # entry.json's "arena_cache": the entry's layout; an entry of another number is made again
IMAGE = "image.arena"
RECORD = "entry.json"
KEY_RE = re.compile(r"[0-9a-f]{16,128}\Z")  # a key: lowercase hex (a folder name, never a path)
KEY_LEN = 32  # hex digits of source_key's keys: 128 bits of SHA-256
_HEAD_SMALL = 1 << 20  # files up to this size are hashed whole; larger ones (not safetensors) their first bytes
_ST_HEADER_MAX = 100_000_000  # the safetensors reader's limit on a header (ST_HEADER_TOO_LARGE)
_HEADER_SUM_AT = 4088  # the image's header_xxh3, the last 8 bytes of its 4096-byte header (docs/FORMAT.md)
WAIT_SAY_S = 5.0  # a process waiting for another's lock says so after this long


def _fmt_bytes(n: int) -> str:
    """Bytes as the command prints them (common/units.c, arena_size_str): "512 B", "331.50 KiB"."""
    if n < 1024:
        return f"{n} B"
    v, u = float(n), 0
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    while v >= 1023.995 and u < 6:
        v /= 1024
        u += 1
    return f"{v:.2f} {units[u]}"


def _say(msg: str) -> None:
    print(f"arena: {msg}", file=sys.stderr, flush=True)


def _io_error(e: OSError, what: str) -> Error:
    return Error("IO", f"{what}: {e.strerror or e}", error_class="system")


# ---- the root and what may be in it ------------------------------------------------------


def cache_root(cache: Optional[PathLike] = None) -> Path:
    """The cache's folder, absolute: ``cache`` when given, else ``$ARENA_CACHE``, else
    ``$XDG_CACHE_HOME/arena`` (an absolute ``XDG_CACHE_HOME`` only, as the XDG rules say),
    else ``~/.cache/arena``; a relative path is taken from the current folder, and ``~`` is
    expanded in ``cache`` (an environment variable is taken as it is, as the command takes
    it). Nothing is made or checked here."""
    if cache is not None:
        p = os.path.expanduser(os.fspath(cache))
        if not p:
            raise Error("USAGE", "cache: an empty path; give a folder, or None for $ARENA_CACHE or ~/.cache/arena")
    elif os.environ.get("ARENA_CACHE"):
        p = os.environ["ARENA_CACHE"]
    elif os.path.isabs(os.environ.get("XDG_CACHE_HOME", "")):
        p = os.path.join(os.environ["XDG_CACHE_HOME"], "arena")
    else:
        home = os.path.expanduser("~")
        if home == "~":
            raise Error("USAGE", "the cache folder: no home folder (HOME unset and no passwd entry); set ARENA_CACHE")
        p = os.path.join(home, ".cache", "arena")
    return Path(os.path.abspath(p))


def _refuse(path: Path, st: os.stat_result, what: str, fix: str) -> Optional[Error]:
    """None when ``st`` (an lstat) is a folder of this user's that no other user can write, else
    the error that says what is wrong and ``fix``."""
    if stat.S_ISLNK(st.st_mode):
        return Error("USAGE", f"{what} {path} is a symbolic link, not a folder of this user's: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        return Error("USAGE", f"{what} {path} is not a folder: {fix}")
    if st.st_uid != os.geteuid():
        return Error("USAGE", f"{what} {path} belongs to user {st.st_uid}, not to this process's user "
                              f"{os.geteuid()}: {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Error("USAGE", f"other users can write {what} {path} (mode {stat.S_IMODE(st.st_mode):03o}; it must "
                              f"be the user's alone): chmod go-w {path}")
    return None


def _root_dir(root: Path, make: bool) -> bool:
    """Check the root (made, 0700, when ``make`` and missing). True when it is there."""
    fix = "set ARENA_CACHE (or pass cache=) to a folder of your own"
    if make:
        try:
            root.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise _io_error(e, f"cannot make the cache folder {root} ({fix})") from None
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _io_error(e, f"cannot read the cache folder {root}") from None
    bad = _refuse(root, st, "the cache folder", fix)
    if bad is not None:
        raise bad
    return True


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise Error("USAGE", f"cache key {key!r}: 16 to 128 lowercase hex digits (arena.torch's source_key makes one)")


def _open_file(path: Path, what: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A regular file of this user's at ``path``, opened without following a symbolic link;
    an Error saying what to fix when it is anything else."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Error("USAGE", f"{what} {path} is a symbolic link, not a file of this user's: remove it") from None
        raise
    st = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"belongs to user {st.st_uid}, not to this process's user {os.geteuid()}"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"can be written by other users (mode {stat.S_IMODE(st.st_mode):03o})"
    if why:
        os.close(fd)
        raise Error("USAGE", f"{what} {path} {why}: remove it")
    return fd


# ---- locks ---------------------------------------------------------------------------------


def _lock_holder(fd: int) -> str:
    """The pid the lock's holder wrote into it ("" when none)."""
    try:
        s = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return s if s.isdigit() else ""


def _lock_key(root: Path, key: str, *, wait: bool = True) -> int:
    """The key's lock, exclusive: its descriptor (close it to release), or -1 when ``wait`` is
    False and another process holds it. A process waiting says so after WAIT_SAY_S seconds
    (which process, where known). Ctrl-C stops the wait."""
    path = root / f"{key}.lock"
    t0 = time.monotonic()
    said = False
    pause = 0.01
    while True:
        try:
            fd = _open_file(path, "the cache lock", os.O_RDWR | os.O_CREAT)
        except OSError as e:
            raise _io_error(e, f"cannot open the cache lock {path}") from None
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait:
                        os.close(fd)
                        return -1
                if not said and time.monotonic() - t0 >= WAIT_SAY_S:
                    pid = _lock_holder(fd)
                    who = f"process {pid}" if pid else "another process"
                    _say(f"waiting for {who}, which is making or checking the cache entry {root / key} (its lock: {path})")
                    said = True
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
            # Removing a lock file is done holding it: the one held must still be the one there.
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            mine = os.fstat(fd)
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


# ---- entries -----------------------------------------------------------------------------------


@dataclass
class CacheEntry:
    """An entry of the cache: ``image`` is the image (``dir / "image.arena"``), whole and
    verified when it was made. ``made``: this call made it (False: it was there). ``size``:
    the bytes of every file in ``dir``. ``record``: the caller's facts given when it was made.

    The entry is held in use (``arena cache prune`` leaves it) until :meth:`release`, the
    end of a ``with`` block, or the object's collection: keep it while the image is open."""

    key: str
    dir: Path
    image: Path
    made: bool
    size: int
    record: Dict[str, Any]
    _fd: int = field(default=-1, repr=False, compare=False)  # image.arena, flock shared
    _ident: Tuple[int, int] = field(default=(0, 0), repr=False, compare=False)  # its (st_dev, st_ino)

    def release(self) -> None:
        """No longer in use: prune may remove it."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "CacheEntry":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def _entry_size(d: Path) -> int:
    """The bytes of the regular files in ``d``, its folders followed, symbolic links not."""
    total = 0
    for top, _dirs, files in os.walk(d):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


class _State:
    """What the cheap checks say of an entry: absent, bad (``why``), changed since it was
    verified (its image's modification time moved: ``changed``), or whole."""

    def __init__(self, doc: Optional[Dict[str, Any]] = None, why: str = "", changed: bool = False,
                 present: bool = True):
        self.doc = doc
        self.why = why
        self.changed = changed
        self.present = present

    @property
    def whole(self) -> bool:
        return self.doc is not None and not self.changed


def _read_doc(d: Path) -> Tuple[Optional[Dict[str, Any]], str]:
    try:
        fd = _open_file(d / RECORD, "the cache record")
    except FileNotFoundError:
        return None, f"it has no {RECORD}"
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(16 << 20)
    except OSError as e:
        return None, f"its {RECORD} cannot be read: {e.strerror}"
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, f"its {RECORD} is not JSON ({e})"
    if not isinstance(doc, dict):
        return None, f"its {RECORD} is not a JSON object"
    return doc, ""


def _header_sum(fd: int) -> str:
    b = os.pread(fd, 8, _HEADER_SUM_AT)
    return b.hex() if len(b) == 8 else ""


def _check(d: Path, key: str, fd: int = -1) -> _State:
    """The cheap checks of the entry at ``d`` (its image open at ``fd`` when >= 0): the folder
    this user's, its record this library's and of this key, the image's size and header
    checksum those it was verified with, and ``arena.inspect`` reads it (header, manifest and
    chunk table, each checked against its checksum). Not its data chunks: ``arena.open``
    checks those as it loads (and :func:`invalidate` removes an entry found bad then), and an
    image whose modification time moved is verified again by :func:`entry`."""
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return _State(present=False)
    bad = _refuse(d, st, "the cache entry", f"remove it (rm -r {d})")
    if bad is not None:
        raise bad
    doc, why = _read_doc(d)
    if doc is None:
        return _State(why=why)
    im = doc.get("image")
    if doc.get("arena_cache") != FORMAT or doc.get("key") != key or not isinstance(im, dict):
        return _State(why=f"its {RECORD} is not a record of this library's for key {key}")
    size, hsum, mtime = im.get("size"), im.get("header_xxh3"), im.get("mtime_ns")
    if not isinstance(size, int) or not isinstance(hsum, str) or not isinstance(mtime, int):
        return _State(why=f"its {RECORD} lacks the image's size, header checksum or time")
    own = fd < 0
    try:
        if own:
            fd = _open_file(d / IMAGE, "the cached image")
    except FileNotFoundError:
        return _State(why=f"it has no {IMAGE}")
    try:
        ist = os.fstat(fd)
        if ist.st_size != size:
            return _State(why=f"{IMAGE} is {ist.st_size} bytes, its record says {size} (truncated or rewritten)")
        if _header_sum(fd) != hsum:
            return _State(why=f"{IMAGE}'s header checksum is not the one it was verified with")
        changed = ist.st_mtime_ns != mtime
    finally:
        if own:
            os.close(fd)
    try:
        kind = _inspect(d / IMAGE).get("kind")
    except Error as e:
        return _State(why=f"{IMAGE} does not read: {e.message or e.code}")
    if kind != "arena-image":
        return _State(why=f"{IMAGE} is not an arena image")
    return _State(doc, changed=changed)


def _hold(d: Path, wait: bool = False) -> int:
    """``d``'s image opened and locked shared (in use); -1 when it is not there or another
    process holds it exclusive (prune removing it)."""
    try:
        fd = _open_file(d / IMAGE, "the cached image")
    except (FileNotFoundError, NotADirectoryError):
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return -1
    except BaseException:
        os.close(fd)
        raise
    return fd


def _touch(d: Path) -> None:
    """The entry was used now (``entry.json``'s modification time, which ``list`` and
    ``prune --older-than`` read)."""
    try:
        os.utime(d / RECORD, follow_symlinks=False)
    except OSError:
        pass  # a read-only cache still serves its entries


def _entry_of(d: Path, key: str, doc: Dict[str, Any], fd: int, made: bool) -> CacheEntry:
    st = os.fstat(fd)
    rec = doc.get("record")
    return CacheEntry(key=key, dir=d, image=d / IMAGE, made=made, size=_entry_size(d),
                      record=dict(rec) if isinstance(rec, dict) else {}, _fd=fd, _ident=(st.st_dev, st.st_ino))


def _discard(root: Path, d: Path, key: str) -> None:
    """Remove the entry at ``d``: renamed aside first (a process that reads its files keeps
    them), then removed. The caller holds the key's lock."""
    trash = root / f".trash-{key}-{os.getpid()}"
    shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(d, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _sweep(root: Path, key: str) -> None:
    """Temporary and trash folders of ``key`` left by a process that was killed: the caller
    holds the key's lock, so no live process is writing them."""
    for name in os.listdir(root):
        if name.startswith((f".tmp-{key}-", f".trash-{key}-")):
            p = root / name
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                shutil.rmtree(p, ignore_errors=True)


def _fsync_path(p: Path, directory: bool = False) -> None:
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_doc(path: Path, doc: Dict[str, Any]) -> None:
    """``doc`` written to ``path`` whole (a temporary file renamed over it), synced."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _image_facts(img: Path) -> Dict[str, Any]:
    fd = _open_file(img, "the image made for the cache")
    try:
        os.fsync(fd)
        st = os.fstat(fd)
        return {"file": IMAGE, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_xxh3": _header_sum(fd)}
    finally:
        os.close(fd)


def _plain(v: Any, what: str) -> Any:
    """``v`` as JSON keeps it (a copy); an Error when it is not JSON-able."""
    try:
        return json.loads(json.dumps(v, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise Error("USAGE", f"{what}: not JSON-able ({e}); give strings, numbers, bools, None, lists and dicts") from None


def entry(key: str, make: Callable[[Path], Optional[bool]], *, record: Mapping[str, Any],
          cache: Optional[PathLike] = None, label: str = "") -> CacheEntry:
    """The cache's entry for ``key``, made by ``make`` when it is not there whole.

    An entry there and whole (:func:`_check`'s cheap checks) is returned (``made=False``)
    and its last use set to now. Otherwise, holding the key's lock (a second process asking
    for it meanwhile waits, then finds it): a damaged entry is removed (one whose image's
    modification time moved is verified again first, and kept if it verifies), folders left
    by a killed maker are removed, ``make(path)`` writes the image at ``path`` (in a
    temporary folder), :func:`arena.verify` checks every byte of it (where ``make`` returns
    True, having written with ``read_back``: each chunk was read back from the disk and
    compared as it was written, and only the header, manifest and chunk table's checksums
    are checked), its record is written, and the folder is renamed into place: whole or not
    at all (an exception or Ctrl-C in ``make`` or after leaves no entry and no temporary
    folder). One line on stderr says what was cached where. ``record``: JSON-able facts kept
    in ``entry.json`` (``sources``, a list of paths, and ``options`` are what ``arena cache
    list`` shows); ``label`` names the entry in messages. The entry returned is held in use
    until released (:class:`CacheEntry`).
    """
    _check_key(key)
    rec = _plain(dict(record), "record")
    if not isinstance(label, str):
        raise Error("USAGE", f"label: a string, not {type(label).__name__}")
    root = cache_root(cache)
    _root_dir(root, make=True)
    d = root / key
    what = label or key

    fd = _hold(d)
    if fd >= 0:
        try:
            s = _check(d, key, fd)
            here = os.stat(d / IMAGE, follow_symlinks=False)
            mine = os.fstat(fd)
            if s.whole and s.doc is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                _touch(d)
                return _entry_of(d, key, s.doc, fd, made=False)
        except FileNotFoundError:
            pass  # replaced or removed meanwhile: the locked path below decides
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)

    lock = _lock_key(root, key)
    try:
        s = _check(d, key)
        if s.changed and s.doc is not None:
            try:
                _verify(d / IMAGE, progress=None)
                s.doc["image"].update(_image_facts(d / IMAGE), verified=True, verified_at=time.time())
                _write_doc(d / RECORD, s.doc)
                s.changed = False
            except Error as e:
                s = _State(why=f"{IMAGE} changed since it was verified, and does not verify: {e.message or e.code}")
        if s.whole and s.doc is not None:
            fd = _hold(d, wait=True)
            if fd < 0:
                raise Error("INTERNAL", f"{d / IMAGE}: held exclusive by another process while its key's lock is ours")
            _touch(d)
            return _entry_of(d, key, s.doc, fd, made=False)
        if s.present:
            _say(f"the cache entry {d} is damaged ({s.why}): making it again")
            _discard(root, d, key)
        _sweep(root, key)
        tmp = root / f".tmp-{key}-{os.getpid()}"
        try:
            os.mkdir(tmp, 0o700)
        except OSError as e:
            raise _io_error(e, f"cannot make {tmp} for the cache entry of {what}") from None
        published = False
        try:
            t0 = time.time()
            img = tmp / IMAGE
            read_back = make(img) is True
            if not img.exists():
                raise Error("INTERNAL", f"the cache entry of {what}: make wrote no image at {img}")
            if read_back:  # every chunk compared with what the disk kept as it was written
                v = {"chunks": int(_inspect(img)["layout"]["chunk_count"])}
            else:
                v = _verify(img, progress=None)
            facts = _image_facts(img)
            now = time.time()
            from . import __version__
            from ._arena import library_version
            doc: Dict[str, Any] = {
                "arena_cache": FORMAT,
                "key": key,
                "label": label,
                "record": rec,
                "image": dict(facts, chunks=v["chunks"], verified=True, verified_at=now),
                "made": now,
                "make_seconds": round(now - t0, 3),
                "library_version": library_version(),
                "package_version": __version__,
            }
            try:
                _write_doc(tmp / RECORD, doc)
                _fsync_path(tmp, directory=True)
                os.rename(tmp, d)
                published = True
                _fsync_path(root, directory=True)
            except OSError as e:
                raise _io_error(e, f"cannot write the cache entry {d}") from None
        finally:
            if not published:
                shutil.rmtree(tmp, ignore_errors=True)
        fd = _hold(d, wait=True)
        if fd < 0:
            raise Error("INTERNAL", f"{d / IMAGE}: not there after it was made")
        new = _entry_of(d, key, doc, fd, made=True)
        _say(f"cached {what} as {new.image} ({_fmt_bytes(new.size)})")
        return new
    finally:
        os.close(lock)


def invalidate(e: CacheEntry) -> None:
    """A user of the entry found it bad (``arena.open`` raised a checksum error): remove it,
    so that the next :func:`entry` makes it again. An entry already made again since ``e``
    was returned is left alone. Releases ``e``."""
    root = e.dir.parent
    try:
        lock = _lock_key(root, e.key)
        try:
            try:
                st = os.stat(e.image, follow_symlinks=False)
            except FileNotFoundError:
                return
            if (st.st_dev, st.st_ino) == e._ident:
                _discard(root, e.dir, e.key)
                _say(f"removed the damaged cache entry {e.dir}: the next use makes it again")
        finally:
            os.close(lock)
    finally:
        e.release()


def cache_info(cache: Optional[PathLike] = None) -> List[Dict[str, Any]]:
    """Every entry of the cache, the most recently used first, as ``arena cache list --json``
    lists them: ``key``, ``path`` (its folder), ``image``, ``size`` (bytes of every file in
    it), ``made`` and ``used`` (Unix times), ``label``, ``record`` (the facts its maker kept:
    ``sources``, ``options``...), and ``problem``: None, or why the entry will be made again
    (no record, not this library's). The images are not read: ``arena cache verify`` checks
    them. An empty list when the cache folder does not exist; :class:`arena.Error` when it,
    or an entry, is not this user's alone."""
    root = cache_root(cache)
    if not _root_dir(root, make=False):
        return []
    out: List[Dict[str, Any]] = []
    for name in sorted(os.listdir(root)):
        if not KEY_RE.match(name):
            continue
        d = root / name
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue
        bad = _refuse(d, st, "the cache entry", f"remove it (rm -r {d})")
        if bad is not None:
            raise bad
        doc, why = _read_doc(d)
        if doc is not None and (doc.get("arena_cache") != FORMAT or doc.get("key") != name):
            doc, why = None, f"its {RECORD} is not a record of this library's for key {name}"
        try:
            used = os.lstat(d / RECORD).st_mtime
        except OSError:
            used = st.st_mtime
        rec = doc.get("record") if doc else None
        made = doc.get("made") if doc else None
        out.append({
            "key": name,
            "path": str(d),
            "image": str(d / IMAGE),
            "size": _entry_size(d),
            "made": float(made) if isinstance(made, (int, float)) else None,
            "used": used,
            "label": str(doc.get("label") or "") if doc else "",
            "record": rec if isinstance(rec, dict) else {},
            "problem": why or None,
        })
    out.sort(key=lambda r: -float(r["used"]))
    return out


# ---- keys ----------------------------------------------------------------------------------------


def _head_hash(path: str, size: int) -> str:
    """SHA-256 of what names a file's content cheaply: a safetensors file's 8-byte length and
    JSON header (its tensors' names, dtypes, shapes and offsets); any other file's bytes, whole
    up to 1 MiB, else its first MiB (its size and modification time stand for the rest)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        n = _HEAD_SMALL
        if path.endswith(".safetensors") and size >= 8:
            first = f.read(8)
            (hlen,) = struct.unpack("<Q", first)
            h.update(first)
            n = hlen if 8 + hlen <= size and hlen <= _ST_HEADER_MAX else _HEAD_SMALL - 8
        while n > 0:
            b = f.read(min(n, 1 << 20))
            if not b:
                break
            h.update(b)
            n -= len(b)
    return h.hexdigest()


def source_key(files: Sequence[PathLike], options: Mapping[str, Any]) -> str:
    """A key naming the image that ``files`` (in this order) converted with ``options`` make:
    hex, KEY_LEN digits. Each file counts by its resolved path, size, modification time (ns)
    and a hash of its header (:func:`_head_hash`); ``options`` (quant, codec, ...: JSON-able)
    by their canonical JSON. A file changed in any of these gives another key."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    parts = []
    for f in files:
        p = os.fspath(f)
        try:
            rp = os.path.realpath(p)
            st = os.stat(rp)
        except OSError as e:
            raise Error("NOT_FOUND", f"{p}: {e.strerror or e}: a source of a cached image must exist") from None
        if not stat.S_ISREG(st.st_mode):
            raise Error("USAGE", f"{p}: not a regular file (a cache key names files: list a folder's files)")
        try:
            head = _head_hash(rp, st.st_size)
        except OSError as e:
            raise _io_error(e, f"cannot read {p}") from None
        parts.append({"path": rp, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head": head})
    if not parts:
        raise Error("USAGE", "source_key: no files")
    opts = _plain(dict(options), "options")
    text = json.dumps({"arena_cache": FORMAT, "files": parts, "options": opts}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LEN]
