# t_messages.sh - what errors say: every one names its file and object and
# is one line; sizes in units that fit the number; the same rule from
# inspect as from convert; quantized names that cannot be exported are
# refused at convert. Sourced by run.sh.

messages_name_the_file() {
	make_st "$T/empty.safetensors" '{}' 0
	run convert "$T/empty.safetensors" -o "$T/x.arena"
	expect_rc 1
	expect_error_line
	expect_err "error: $T/empty.safetensors: "
	run load "$T/empty.safetensors" --backend sim
	expect_rc 1
	expect_error_line
	expect_err "error: $T/empty.safetensors: "
	python3 -c '
import json, struct, sys
h = json.dumps({"x": {"dtype": "F32", "shape": [1] * 10001, "data_offsets": [0, 4]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(4))' "$T/rank.safetensors"
	run convert "$T/rank.safetensors" -o "$T/x.arena"
	expect_rc 1
	expect_error_line
	expect_err "error: $T/rank.safetensors: tensor 'x': rank 10001"
	[ ! -e "$T/x.arena" ] || fail "a refused convert wrote its output"
}

# inspect applies the rules convert does: the same error, exit 1.
messages_inspect_same_rule_as_convert() {
	python3 -c '
import json, struct, sys
h = json.dumps({"x": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(4))' "$T/rank.safetensors"
	run convert "$T/rank.safetensors" -o "$T/x.arena"
	expect_rc 1
	cp "$T/err" "$T/convert-err"
	run inspect "$T/rank.safetensors"
	expect_rc 1
	expect_error_line
	expect_no_out
	cmp -s "$T/err" "$T/convert-err" || fail "inspect says '$(cat "$T/err")', convert '$(cat "$T/convert-err")'"
	run inspect "$T/rank.safetensors" --json
	expect_rc 1
	expect_no_out
}

messages_over_cap_in_units_that_fit() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	run load "$T/f.arena" --backend sim --vram-cap 100K
	expect_rc 2
	expect_error_line
	grep -q '0\.00 GiB\| 0 B\b' "$T/err" && fail "sizes in units too large: $(cat "$T/err")"
	expect_err "the smallest plan needs 280.50 KiB for weights (globals 49.50 KiB"
	expect_err "it needs 307.00 KiB of device memory, 100.00 KiB is the cap"
	run load "$T/f.arena" --backend sim --vram-cap 1K
	expect_rc 2
	expect_err "the budget for weights is 753 B;"
	expect_err "it needs 280.76 KiB of device memory, 1.00 KiB is the cap"
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

# A weight and an unrelated tensor named like its scale: quantizing the weight
# with a scaled scheme would give two tensors one name.
messages_quant_name_clash() {
	make_st "$T/c.safetensors" '{"transformer_blocks.0.attn.to_q.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}, "transformer_blocks.0.attn.to_q.weight_scale": {"dtype": "F32", "shape": [4], "data_offsets": [32, 48]}}' 48
	for q in fp8-e4m3-row fp8-e4m3-tensor int8-row; do
		run convert "$T/c.safetensors" -o "$T/c.arena" --quant $q
		expect_rc 1
		expect_error_line
		expect_err "error: $T/c.safetensors: tensor 'transformer_blocks.0.attn.to_q.weight': "
		expect_err "'transformer_blocks.0.attn.to_q.weight_scale'"
		[ ! -e "$T/c.arena" ] || fail "--quant $q wrote an image that cannot be exported"
	done
	# unscaled schemes give no second name; bf16 keeps it no pair
	for q in bf16 fp8-e5m2; do
		run convert "$T/c.safetensors" -o "$T/c.arena" --quant $q
		expect_rc 0
		run export "$T/c.arena" -o "$T/c2.safetensors"
		expect_rc 0
		rm -f "$T/c.arena" "$T/c2.safetensors"
	done
	# fp8-e4m3 would make the two a compressed-tensors pair: exported and read
	# again, the weight would be scaled by the other tensor
	make_st "$T/p.safetensors" '{"transformer_blocks.0.attn.to_q.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}, "transformer_blocks.0.attn.to_q.weight_scale": {"dtype": "F32", "shape": [1], "data_offsets": [32, 36]}}' 36
	run convert "$T/p.safetensors" -o "$T/p.arena" --quant fp8-e4m3
	expect_rc 1
	expect_error_line
	expect_err "error: $T/p.safetensors: tensor 'transformer_blocks.0.attn.to_q.weight': "
	expect_err "'transformer_blocks.0.attn.to_q.weight_scale'"
	# excluded, it converts and exports
	run convert "$T/c.safetensors" -o "$T/c.arena" --quant fp8-e4m3-row --quant-exclude '*.to_q.weight'
	expect_rc 0
	run export "$T/c.arena" -o "$T/c2.safetensors"
	expect_rc 0
	# a real compressed-tensors pair is kept and exports as it came
	python3 -c '
import json, struct, sys
t = {"transformer_blocks.0.attn.to_q.weight": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]},
     "transformer_blocks.0.attn.to_q.weight_scale": {"dtype": "F32", "shape": [4, 1], "data_offsets": [16, 32]},
     "transformer_blocks.0.attn.to_k.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [32, 64]}}
h = json.dumps(t).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(64))' "$T/ct.safetensors"
	run convert "$T/ct.safetensors" -o "$T/ct.arena" --quant fp8-e4m3-row
	expect_rc 0
	run export "$T/ct.arena" -o "$T/ct2.safetensors"
	expect_rc 0
}

cases messages_name_the_file messages_inspect_same_rule_as_convert messages_over_cap_in_units_that_fit messages_verify_one_line messages_quant_name_clash

# An unknown --quant scheme is a usage error of the command like any other
# bad option: named by the command, the schemes listed, a pointer to --help.
messages_quant_scheme_unknown() {
	for c in "convert $REF/tiny_flux.safetensors -o $T/x.arena" "load $REF/tiny_flux.safetensors --backend sim --no-probe"; do
		# shellcheck disable=SC2086
		run $c --quant fp8
		expect_rc 2
		expect_error_line
		expect_err "error: ${c%% *}: --quant 'fp8' is not a scheme: none, bf16, fp8-e4m3, fp8-e4m3-tensor, fp8-e4m3-row"
		expect_err "int4-g64"
		expect_err "(see 'arena ${c%% *} --help')"
	done
	[ ! -e "$T/x.arena" ] || fail "a refused convert wrote its output"
}
cases messages_quant_scheme_unknown

# A count of one takes the singular: "1 block", "1 tensor", "1 chunk",
# "1 thread" (not "1 blocks"), in every command's output on a model of one
# tensor.
messages_counts_singular() {
	make_st "$T/one.safetensors" '{"w": {"dtype": "BF16", "shape": [2048], "data_offsets": [0, 4096]}}' 4096
	: >"$T/all"
	for c in "convert $T/one.safetensors -o $T/one.arena" "convert $T/one.safetensors -o $T/one-hb4.arena --codec hb4" \
		"verify $T/one.arena" "inspect $T/one.arena" "inspect $T/one.safetensors" "export $T/one.arena -o $T/back.safetensors" \
		"plan $T/one.arena --vram 1G" "load $T/one.arena --backend sim --no-probe --threads 1" \
		"load $T/one.safetensors --backend sim --no-probe --threads 1" "bench stream $T/one.arena --steps 2" \
		"bench stream $T/one.arena --steps 1"; do
		# shellcheck disable=SC2086
		run $c
		expect_rc 0
		cat "$T/out" "$T/err" >>"$T/all"
	done
	# a corrupt chunk: "1 bad chunk"
	python3 -c '
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-100] ^= 1
open(p, "wb").write(bytes(b))' "$T/one.arena"
	run verify "$T/one.arena"
	expect_rc 1
	cat "$T/out" "$T/err" >>"$T/all"
	grep -E '(^|[^0-9.])1 (blocks|tensors|chunks|bad chunks|threads|slots|copies|steps|files|bytes|units|parameters|streamed blocks)\b' "$T/all" &&
		fail "a count of one with a plural noun (above)"
	grep -q '1 block' "$T/all" || fail "no '1 block' said"
	grep -q '^steady state (step 0): ' "$T/all" || fail "one step's steady state is not '(step 0)'"
}
cases messages_counts_singular
