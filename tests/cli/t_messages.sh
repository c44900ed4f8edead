# t_messages.sh - what errors say: every one names its file and object and
# is one line; sizes in units that fit the number; the same rule from
# inspect as from convert; quantized names that cannot be exported are
# refused at convert. Sourced by run.sh.

messages_over_cap_in_units_that_fit() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	run load "$T/f.arena" --backend sim --vram-cap 100K
	expect_rc 2
	expect_error_line
	grep -q '0\.00 GiB\| 0 B\b' "$T/err" && fail "sizes in units too large: $(cat "$T/err")"
	expect_err "over the 100.00 KiB cap"
	expect_err "KiB) would fit"
	run load "$T/f.arena" --backend sim --vram-cap 1K
	expect_rc 2
	expect_err "over the 1.00 KiB cap; not even the first of its "
	expect_err "KiB) would fit"
}

# verify: errors are one line, however many chunks are bad; --json lists them all.
messages_verify_one_line() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena" --chunk-size 64K
	python3 -c '
import json, subprocess, sys
d = json.loads(subprocess.run([sys.argv[1], "inspect", sys.argv[2], "--json"], capture_output=True, check=True).stdout)
off = d["layout"]["data_offset"]
f = open(sys.argv[2], "r+b")
for k in (0, 2, 3):
    f.seek(off + k * 65536 + 100)
    b = f.read(1)
    f.seek(off + k * 65536 + 100)
    f.write(bytes([b[0] ^ 0xFF]))' "$ARENA" "$T/f.arena"
	run verify "$T/f.arena"
	expect_rc 1
	expect_error_line
	expect_err "chunk 0 "
	expect_err "3 bad chunks in all"
	run verify "$T/f.arena" --json
	expect_rc 1
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert [c["chunk"] for c in d["bad_chunks"]] == [0, 2, 3], d["bad_chunks"]' <"$T/out" || fail "verify --json"
}

cases messages_over_cap_in_units_that_fit messages_verify_one_line
