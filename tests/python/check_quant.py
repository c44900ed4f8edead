"""Check a quantized export (compressed-tensors convention) with the reference
safetensors library: `<name>` F8_E4M3 / I8 data and `<name>_scale` F32 scales
that dequantize to within the scheme's error of the source values; for the
int4 schemes `<name>` U8 codes (two a byte, the even column in the low
nibble), `<name>_scale` in the source's dtype and `<name>_zero` U8 zero
points, one a group, that dequantize ((q - z) * scale) to within half a step
of the source values.

usage: check_quant.py SOURCE.safetensors EXPORTED.safetensors MIN_PAIRS
Prints "N passed, N failed"; exits 1 on failure.
"""
import sys

import ml_dtypes
import numpy as np

# safetensors' numpy loader names the fp8 dtypes after numpy attributes that
# only ml_dtypes provides.
np.float8_e4m3fn = ml_dtypes.float8_e4m3fn
np.float8_e5m2 = ml_dtypes.float8_e5m2
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402


def int4_ok(x, codes, scale, zero):
    """An int4 export: shapes by the layout, codes and zero points in [0, 15],
    the scale in the source's dtype, values within half a step (plus the
    rounding to the source's dtype) of the source's."""
    rows = x.shape[0] if x.ndim >= 2 else 1
    cols = x.size // rows
    groups = zero.shape[1] if zero.ndim == 2 else 0
    if codes.dtype != np.uint8 or zero.dtype != np.uint8 or scale.dtype != x.dtype:
        return False, "%s codes, %s scale, %s zero points" % (codes.dtype, scale.dtype, zero.dtype)
    if codes.shape != (rows, (cols + 1) // 2) or scale.shape != (rows, groups) or zero.shape != (rows, groups) \
            or groups == 0 or zero.max() > 15:
        return False, "shapes %s %s %s for %s" % (codes.shape, scale.shape, zero.shape, x.shape)
    # the group size: the one of 32, 64, 128 that makes this many groups (two
    # that do make the same groups: then the row is one group)
    sizes = [n for n in (32, 64, 128) if -(-cols // n) == groups]
    if not sizes:
        return False, "%d groups fit no group size for %d columns" % (groups, cols)
    n = sizes[0]
    q = np.stack([codes & 15, codes >> 4], axis=2).reshape(rows, -1)[:, :cols].astype(np.float32)
    s = np.repeat(scale.astype(np.float32), n, axis=1)[:, :cols]
    z = np.repeat(zero.astype(np.float32), n, axis=1)[:, :cols]
    v = (q - z) * s
    xs = x.astype(np.float32).reshape(rows, cols)
    tol = s * 0.5 + np.abs(xs) * 2.0**-7 + 1e-30
    if not np.all(np.abs(v - xs) <= tol):
        return False, "max error past half a step: %g" % float(np.max(np.abs(v - xs) - tol))
    return True, ""


def main(src, out, min_pairs):
    want = load_file(src)
    got = load_file(out)
    with safe_open(out, "numpy") as f:
        meta = f.metadata()
    with safe_open(src, "numpy") as f:
        if meta != f.metadata():
            print("FAIL metadata differs")
            return 1
    passed = failed = 0
    pairs = [n for n in got if n + "_scale" in got]
    for name in pairs:
        if name + "_zero" in got:
            ok, why = int4_ok(want[name], got[name], got[name + "_scale"], got[name + "_zero"])
            passed += ok
            failed += not ok
            if not ok:
                print("FAIL %s: %s" % (name, why))
            continue
        q, s = got[name], got[name + "_scale"]
        x = want[name].astype(np.float32)
        deq = q.astype(np.float32) * s.astype(np.float32)
        # fp8 e4m3 has 3 mantissa bits: relative error <= 2^-4, plus the
        # subnormal step of the scaled range.
        tol = np.abs(x) * 2.0**-4 + s.astype(np.float32) * 2.0**-9 + 1e-12
        if q.dtype not in (ml_dtypes.float8_e4m3fn, np.int8) or s.dtype != np.float32:
            failed += 1
            print("FAIL %s: %s data, %s scale" % (name, q.dtype, s.dtype))
        elif not np.all(np.abs(deq - x) <= tol):
            failed += 1
            print("FAIL %s: max error %g" % (name, float(np.max(np.abs(deq - x) - tol))))
        else:
            passed += 1
    pairs += [n + "_zero" for n in pairs if n + "_zero" in got]
    others = [n for n in want if n not in pairs]
    for name in others:
        if want[name].tobytes() != got[name].tobytes() or want[name].dtype != got[name].dtype:
            failed += 1
            print("FAIL %s: unquantized tensor changed" % name)
        else:
            passed += 1
    if len(pairs) < min_pairs:
        failed += 1
        print("FAIL only %d quantized tensors, want at least %d" % (len(pairs), min_pairs))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
