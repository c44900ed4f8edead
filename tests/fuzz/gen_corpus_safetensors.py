#!/usr/bin/env python3
"""gen_corpus_safetensors.py - write the seed corpus for fuzz_safetensors.

One small file per validation rule of formats/safetensors.h (named after the
error it must raise), plus small valid files. Run from the project root:
    python3 tests/fuzz/gen_corpus_safetensors.py tests/fuzz/corpus/safetensors
The files are committed; rerunning rewrites the same bytes."""
import os
import struct
import sys


def st(header, data=b"", n=None):
    """A safetensors file: header string (or bytes) + data bytes."""
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def ent(name, dtype, shape, b, e):
    return '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}' % (
        name, dtype, shape, b, e)


CASES = {
    # valid
    "ok-empty": st("{}"),
    "ok-one-f32": st("{" + ent("w", "F32", "[2]", 0, 8) + "}", b"\0\0\x80?\0\0\0@"),
    "ok-two": st("{" + ent("a", "BF16", "[2,2]", 0, 8) + "," + ent("b", "U8", "[3]", 8, 11) + "}",
                 bytes(range(11))),
    "ok-metadata": st('{"__metadata__":{"format":"pt","k":"\u00fcnic\u00f8de"},' + ent("x", "I8", "[1]", 0, 1) + "}",
                      b"\x7f"),
    "ok-scalar": st("{" + ent("s", "F64", "[]", 0, 8) + "}", bytes(8)),
    "ok-zero-size": st("{" + ent("z", "F32", "[0,4]", 0, 0) + "," + ent("y", "U8", "[1]", 0, 1) + "}", b"\1"),
    "ok-padded": st("  {" + ent("w", "F16", "[1]", 0, 2) + "}    ", b"\0<"),
    "ok-f4": st("{" + ent("q", "F4", "[2]", 0, 1) + "}", b"\x21"),
    "ok-f6": st("{" + ent("q", "F6_E2M3", "[4]", 0, 3) + "}", b"\1\2\3"),
    # invalid, in rule order
    "too-short-0": b"",
    "too-short-7": b"\2\0\0\0\0\0\0",
    "header-too-large": struct.pack("<Q", 100000001) + b"{}",
    "header-past-eof": st("{}", n=3),
    "utf8-overlong": st('{"__metadata__":{"a":"\xc0\xaf"}}'.encode("latin-1")),
    "utf8-surrogate": st(b'{"__metadata__":{"a":"\xed\xa0\x80"}}'),
    "utf8-truncated": st(b'{"__metadata__":{"a":"\xe2\x9c"}}'),
    "json-bad": st("{not json}"),
    "json-trailing": st("{} x"),
    "dup-key-top": st("{" + ent("a", "U8", "[1]", 0, 1) + "," + ent("a", "U8", "[1]", 0, 1) + "}", b"\0"),
    "dup-key-entry": st('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\0"),
    "not-object-array": st("[]"),
    "not-object-string": st('"x"'),
    "entry-not-object": st('{"a":[1,2]}'),
    "unknown-field": st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}}', b"\0"),
    "missing-dtype": st('{"a":{"shape":[1],"data_offsets":[0,1]}}', b"\0"),
    "missing-shape": st('{"a":{"dtype":"U8","data_offsets":[0,1]}}', b"\0"),
    "missing-offsets": st('{"a":{"dtype":"U8","shape":[1]}}', b"\0"),
    "dtype-not-string": st('{"a":{"dtype":8,"shape":[1],"data_offsets":[0,1]}}', b"\0"),
    "shape-not-list": st('{"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}}', b"\0"),
    "shape-negative": st('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', b"\0"),
    "shape-float": st('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\0"),
    "offsets-len": st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', b"\0"),
    "offsets-negative": st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,1]}}', b"\0"),
    "offsets-float": st('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.5]}}', b"\0"),
    "neg-zero-shape": st('{"__metadata__":{"-0":"-0"},"a":{"dtype":"U8","shape":[1,-0],"data_offsets":[0,0]}}'),
    "neg-zero-offsets": st('{"a":{"dtype":"U8","shape":[0],"data_offsets":[-0,0]}}'),
    "deep-nesting": st("[" * 3000 + "]" * 3000),
    "dtype-unknown": st("{" + ent("a", "bf16", "[1]", 0, 2) + "}", b"\0\0"),
    "metadata-not-object": st('{"__metadata__":[]}'),
    "metadata-value": st('{"__metadata__":{"a":1}}'),
    "offset-start": st("{" + ent("a", "U8", "[1]", 1, 2) + "}", b"\0\0"),
    "offset-reversed": st("{" + ent("a", "U8", "[1]", 2, 1) + "}", b"\0\0"),
    "offset-gap": st("{" + ent("a", "U8", "[1]", 0, 1) + "," + ent("b", "U8", "[1]", 2, 3) + "}", b"\0\0\0"),
    "offset-overlap": st("{" + ent("a", "U8", "[2]", 0, 2) + "," + ent("b", "U8", "[2]", 1, 3) + "}", b"\0\0\0"),
    "size-overflow": st("{" + ent("a", "F32", "[4294967296,4294967296]", 0, 4) + "}", bytes(4)),
    "partial-f4": st("{" + ent("a", "F4", "[3]", 0, 2) + "}", b"\0\0"),
    "partial-f6": st("{" + ent("a", "F6_E3M2", "[3]", 0, 3) + "}", b"\0\0\0"),
    "size-mismatch": st("{" + ent("a", "F32", "[2]", 0, 4) + "}", bytes(4)),
    "data-past-eof": st("{" + ent("a", "F32", "[2]", 0, 8) + "}", bytes(4)),
    "trailing-bytes": st("{" + ent("a", "U8", "[1]", 0, 1) + "}", b"\0\0"),
}

DTYPES = [("BOOL", 8), ("U8", 8), ("I8", 8), ("U16", 16), ("I16", 16), ("U32", 32), ("I32", 32),
          ("U64", 64), ("I64", 64), ("F16", 16), ("BF16", 16), ("F32", 32), ("F64", 64), ("C64", 64),
          ("F8_E4M3", 8), ("F8_E5M2", 8), ("F8_E8M0", 8), ("F8_E4M3FNUZ", 8), ("F8_E5M2FNUZ", 8),
          ("F4", 4), ("F6_E2M3", 6), ("F6_E3M2", 6)]


def all_dtypes():
    ents, off = [], 0
    for name, bits in DTYPES:
        n = 8 * bits // 8  # 8 elements
        ents.append(ent(name.lower(), name, "[2,4]", off, off + n))
        off += n
    return st("{" + ",".join(ents) + "}", bytes((i * 37) & 0xFF for i in range(off)))


CASES["ok-all-dtypes"] = all_dtypes()


def slice_of(path, n_tensors, max_elems):
    """A small valid file made from the first tensors of a reference fixture:
    real names and dtypes, shapes cut to at most max_elems elements, real bytes."""
    import json
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    out, data = {}, b""
    if meta:
        out["__metadata__"] = meta
    for name in sorted(hdr)[:n_tensors]:
        t = hdr[name]
        bits = dict(DTYPES)[t["dtype"]]
        k = min(max_elems, 1 if not t["shape"] else t["shape"][-1])
        b0 = 8 + n + t["data_offsets"][0]
        chunk = raw[b0:b0 + k * bits // 8]
        out[name] = {"dtype": t["dtype"], "shape": [k], "data_offsets": [len(data), len(data) + len(chunk)]}
        data += chunk
    return st(json.dumps(out, separators=(",", ":"), ensure_ascii=False), data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/safetensors"
    os.makedirs(out, exist_ok=True)
    ref = os.environ.get("ARENA_FIXTURES_DIR") or "fixtures"
    for name, n_tensors in (("tiny_flux", 6), ("dtypes", 19)):
        path = os.path.join(ref, name + ".safetensors")
        if os.path.exists(path):
            CASES["slice-" + name] = slice_of(path, n_tensors, 8)
    for name, data in CASES.items():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
