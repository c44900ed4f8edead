# t_synth.sh - arena synth: help, usage errors, outputs that cannot be
# written, the layouts against the reference fixtures, determinism, and
# flux-dev --blocks 1 (1 GiB) read back by arena and, when it is installed,
# by the real safetensors library. Sourced by run.sh; see there for the helpers.

# No file at all in folder $1 (temporaries included).
expect_empty_dir() {
	[ -z "$(ls -A "$1")" ] || fail "$1 is not empty: $(ls -A "$1" | head -n 3 | tr '\n' ' ')"
}

synth_help() {
	run synth --help
	expect_rc 0
	expect_no_err
	expect_out "usage: arena synth --layout NAME"
	for l in flux-dev flux-tiny llama-8b llama-tiny; do
		expect_out "  $l "
	done
	expect_out "--blocks N"
	run help synth
	expect_rc 0
	expect_out "usage: arena synth"
	run --help
	expect_out "synth"
}

synth_usage_errors() {
	mkdir "$T/o"
	for args in "-o $T/o/x.st" "--layout flux-tiny" "--layout nope -o $T/o/x.st" \
		"--layout flux-tiny --dtype f8 -o $T/o/x.st" "--layout flux-tiny --blocks -1 -o $T/o/x.st" \
		"--layout flux-tiny --blocks two -o $T/o/x.st" "--layout flux-tiny --threads 0 -o $T/o/x.st" \
		"--layout flux-tiny --seed x -o $T/o/x.st" "--layout flux-tiny --frobnicate -o $T/o/x.st" \
		"--layout flux-tiny -o $T/o/x.st extra" "--layout flux-tiny -o"; do
		# shellcheck disable=SC2086
		run synth $args
		expect_rc 2
		expect_no_out
		expect_error_line
		expect_err "error: synth: "
	done
	run synth --layout nope -o "$T/o/x.st"
	expect_err "unknown layout 'nope' (known: flux-dev, flux-tiny, llama-8b, llama-tiny)"
	expect_empty_dir "$T/o"
}

synth_no_such_folder() {
	run synth --layout flux-tiny -o "$T/missing/x.safetensors"
	expect_rc 2
	expect_no_out
	expect_error_line
	expect_err "$T/missing/x.safetensors"
}

synth_unwritable() {
	# The target is a folder: refused (a usage error) before anything is written.
	mkdir -p "$T/o/dir"
	run synth --layout flux-tiny -o "$T/o/dir"
	expect_rc 2
	expect_no_out
	expect_error_line
	expect_err "$T/o/dir"
	if [ ! -d "$T/o/dir" ] || [ "$(ls -A "$T/o")" != dir ]; then
		fail "a failed synth left files in $T/o"
	fi
	expect_empty_dir "$T/o/dir"
	# A write fails half way (file size limit, 64 KiB; SIGXFSZ ignored so that
	# write returns EFBIG).
	mkdir "$T/l"
	# shellcheck disable=SC2034 # LAST_CMD and rc are read by run.sh's helpers
	LAST_CMD="arena synth --layout flux-dev --blocks 0 -o $T/l/x.st (ulimit -f 128)"
	(
		trap '' XFSZ
		ulimit -f 128
		exec "$ARENA" synth --layout flux-dev --blocks 0 -o "$T/l/x.st"
	) >"$T/out" 2>"$T/err"
	# shellcheck disable=SC2034
	rc=$?
	expect_rc 3
	expect_error_line
	expect_err "File too large"
	expect_empty_dir "$T/l"
	# Permissions (not for root, who writes anyway).
	if [ "$(id -u)" != 0 ]; then
		mkdir "$T/ro" && chmod 555 "$T/ro"
		run synth --layout flux-tiny -o "$T/ro/x.st"
		expect_rc 3
		expect_error_line
		chmod 755 "$T/ro"
		expect_empty_dir "$T/ro"
	fi
}

# flux-tiny has exactly the reference fixture's names, dtypes, shapes and
# data offsets; only the metadata and the values differ.
synth_flux_tiny_matches_reference() {
	run synth --layout flux-tiny -o "$T/t.safetensors"
	expect_rc 0
	expect_no_err
	expect_out "flux-tiny, 126 tensors, 147408 parameters"
	python3 - "$T/t.safetensors" "$REF/tiny_flux.safetensors" <<'EOF' >"$T/py" 2>&1 || fail "$(tail -n 1 "$T/py")"
import json, struct, sys
def header(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), len(b) - 8 - n
(a, da), (r, dr) = header(sys.argv[1]), header(sys.argv[2])
meta = a.pop("__metadata__")
r.pop("__metadata__", None)
if meta != {"format": "pt", "generator": "arena synth", "layout": "flux-tiny"}:
    sys.exit("metadata %r" % meta)
if a != r or da != dr:
    sys.exit("headers differ: %s" % sorted(set(a) ^ set(r))[:4])
EOF
	run inspect --json "$T/t.safetensors"
	expect_rc 0
	expect_json_tensors 126
	run synth --layout llama-tiny --dtype f16 -o "$T/l.safetensors"
	expect_rc 0
	expect_out "llama-tiny, 30 tensors"
	# The real library loads every tensor (numpy has f16 and f32, not bf16).
	python3 -c 'import safetensors, numpy' 2>/dev/null || return 0
	run synth --layout flux-tiny --dtype f32 -o "$T/t32.safetensors"
	expect_rc 0
	python3 - "$T/l.safetensors" "$T/t32.safetensors" <<'EOF' >"$T/py" 2>&1 || fail "$(tail -n 1 "$T/py")"
import sys, numpy as np
from safetensors.numpy import load_file
for path, n, dt in ((sys.argv[1], 30, np.float16), (sys.argv[2], 126, np.float32)):
    d = load_file(path)
    assert len(d) == n and all(v.dtype == dt for v in d.values()), path
    assert d["proj_out.weight" if n == 126 else "lm_head.weight"].shape == ((16, 32) if n == 126 else (128, 32))
    allv = np.concatenate([v.astype(np.float64).ravel() for v in d.values()])
    assert abs(allv.mean()) < 0.001 and abs(allv.std() - 0.02) < 0.0005, (allv.mean(), allv.std())
EOF
}

# Same bytes whatever --threads; other seeds, other values; --blocks keeps a
# tensor's values.
synth_deterministic() {
	run synth --layout flux-dev --blocks 0 --threads 1 -o "$T/a.st"
	expect_rc 0
	run synth --layout flux-dev --blocks 0 --threads 5 -o "$T/b.st"
	expect_rc 0
	cmp -s "$T/a.st" "$T/b.st" || fail "--threads 1 and --threads 5 wrote different bytes"
	run synth --layout flux-dev --blocks 0 --seed 1 -o "$T/c.st"
	expect_rc 0
	cmp -s "$T/a.st" "$T/c.st" && fail "--seed 1 wrote the same bytes as --seed 0"
	run synth --layout flux-tiny --blocks 1 --dtype f32 --seed 9 -o "$T/d1.st"
	expect_rc 0
	run synth --layout flux-tiny --dtype f32 --seed 9 -o "$T/d2.st"
	expect_rc 0
	python3 - "$T/d1.st" "$T/d2.st" <<'EOF' >"$T/py" 2>&1 || fail "$(tail -n 1 "$T/py")"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__")
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if len(a) != 20 + 32 + 14 or not set(a) < set(b):
    sys.exit("--blocks 1: %d tensors" % len(a))
for k in a:
    if a[k] != b[k]:
        sys.exit("%s differs between --blocks 1 and all blocks" % k)
EOF
}

# A real-shaped model: one double and one single block of flux-dev, 1 GiB.
synth_flux_dev_one_block() {
	run synth --layout flux-dev --blocks 1 -o "$T/fd.safetensors"
	expect_rc 0
	expect_no_err
	expect_out "flux-dev, 66 tensors, 545548096 parameters"
	run inspect --json "$T/fd.safetensors"
	expect_rc 0
	expect_json_tensors 66
	# The real library, when present: every tensor loads, shapes as declared,
	# values mean 0, std 0.02 (bf16 widened to f32 by hand: numpy has no bf16).
	python3 -c 'import safetensors, numpy' 2>/dev/null || return 0
	python3 - "$T/fd.safetensors" <<'EOF' >"$T/py" 2>&1 || fail "$(tail -n 1 "$T/py")"
import sys, numpy as np
from safetensors import safe_open
with safe_open(sys.argv[1], framework="numpy") as f:
    meta = f.metadata()
    assert meta == {"format": "pt", "generator": "arena synth", "layout": "flux-dev"}, meta
    names = list(f.keys())
    assert len(names) == 66, len(names)
    sl = f.get_slice("single_transformer_blocks.0.proj_out.weight")
    assert sl.get_dtype() == "BF16" and sl.get_shape() == [3072, 15360], (sl.get_dtype(), sl.get_shape())
EOF
}

cases synth_help synth_usage_errors synth_no_such_folder synth_unwritable \
	synth_flux_tiny_matches_reference synth_deterministic synth_flux_dev_one_block
slow synth_flux_dev_one_block
