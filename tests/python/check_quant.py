"""Check a quantized export (compressed-tensors convention) with the reference
safetensors library: `<name>` F8_E4M3 / I8 data and `<name>_scale` F32 scales
that dequantize to within the scheme's error of the source values.

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
    others = [n for n in want if n not in pairs]
    for name in others:
        if want[name].tobytes() != got[name].tobytes() or want[name].dtype != got[name].dtype:
            failed += 1
            print("FAIL %s: unquantized tensor changed" % name)
        else:
            passed += 1
    if len(pairs) < min_pairs:
        failed += 1
        print("FAIL only %d quantized pairs, want at least %d" % (len(pairs), min_pairs))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
