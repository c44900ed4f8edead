"""Check arena's safetensors output with the reference library.

usage: check_export.py SOURCE EXPORTED [SOURCE EXPORTED ...]

SOURCE is a .safetensors file or a folder with a sharded checkpoint's
model.safetensors.index.json. Every tensor of SOURCE must appear in EXPORTED
with the same dtype, shape and bytes, and the metadata must match (for a
sharded source: the first shard's metadata). Prints one line per pair and
"N passed, N failed" at the end; exits 1 on any failure.
"""
import json
import os
import sys

import ml_dtypes  # noqa: F401  (registers bfloat16 and fp8 dtypes with numpy)
from safetensors import safe_open
from safetensors.numpy import load_file


def load_source(path):
    if os.path.isdir(path):
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
        tensors = {}
        for s in shards:
            tensors.update(load_file(os.path.join(path, s)))
        with safe_open(os.path.join(path, shards[0]), "numpy") as f:
            meta = f.metadata()
        return tensors, meta
    with safe_open(path, "numpy") as f:
        meta = f.metadata()
    return load_file(path), meta


def keys_and_meta(path):
    with safe_open(path, "numpy") as f:
        return set(f.keys()), f.metadata()


def check(src, out):
    try:
        want, want_meta = load_source(src)
    except (AttributeError, TypeError):
        # numpy lacks some dtypes (fp8 in this safetensors version): the
        # library still reads the header; the bytes must be identical.
        if keys_and_meta(src) != keys_and_meta(out):
            return "tensor names or metadata differ"
        with open(src, "rb") as a, open(out, "rb") as b:
            return None if a.read() == b.read() else "files differ"
    got = load_file(out)
    with safe_open(out, "numpy") as f:
        got_meta = f.metadata()
    if set(want) != set(got):
        return "tensor names differ: %s" % sorted(set(want) ^ set(got))[:5]
    for name, a in want.items():
        b = got[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            return "%s: %s%s vs %s%s" % (name, a.dtype, a.shape, b.dtype, b.shape)
        if a.tobytes() != b.tobytes():
            return "%s: bytes differ" % name
    if (want_meta or {}) != (got_meta or {}):
        return "metadata differs: %r vs %r" % (want_meta, got_meta)
    return None


def main(argv):
    pairs = list(zip(argv[0::2], argv[1::2]))
    passed = failed = 0
    for src, out in pairs:
        err = check(src, out)
        if err:
            failed += 1
            print("FAIL %s -> %s: %s" % (src, out, err))
        else:
            passed += 1
            print("ok   %s -> %s" % (src, out))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or not pairs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
