# t_image.sh - arena convert, verify, export and inspect on images.
# Sourced by run.sh; see there for the helpers.

convert_help() {
	for c in convert verify export; do
		run "$c" --help
		expect_rc 0
		expect_out "usage: arena $c"
		expect_no_err
	done
}

convert_usage_errors() {
	run convert "$REF/tiny_flux.safetensors"
	expect_rc 2
	expect_error_line
	expect_err "no output given"
	run convert -o "$T/x.arena"
	expect_rc 2
	expect_err "no INPUT given"
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --chunk-size 1000
	expect_rc 2
	expect_error_line
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --threads 0
	expect_rc 2
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --bogus
	expect_rc 2
	expect_error_line
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --block-pattern 'a(b'
	expect_rc 2
	expect_error_line
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --block-order nothing_like_this
	expect_rc 2
	expect_err "nothing_like_this"
	[ ! -e "$T/x.arena" ] || fail "a failed convert left $T/x.arena"
}

convert_verify_export_flux() {
	run convert "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	expect_rc 0
	expect_out "6 blocks, 126 tensors"
	run verify "$T/f.arena"
	expect_rc 0
	expect_out "ok: $T/f.arena"
	run inspect "$T/f.arena"
	expect_rc 0
	expect_out "single_transformer_blocks.2"
	run inspect --json "$T/f.arena"
	expect_rc 0
	expect_json_tensors 126
	run export "$T/f.arena" -o "$T/f.safetensors"
	expect_rc 0
	cmp -s "$T/f.safetensors" "$REF/tiny_flux.safetensors" || fail "export is not byte-identical to the source"
	ls -A "$T" | grep -q '^\.' && fail "a temporary was left in $T"
	:
}

convert_sharded_folder() {
	run convert "$REF/tiny_llama_sharded" -o "$T/l.arena" -q
	expect_rc 0
	expect_no_out
	run inspect --json "$T/l.arena"
	python3 -c '
import json, sys
d = json.load(sys.stdin)
names = [b["name"] for b in d["blocks"]]
want = ["globals", "model.layers.0", "model.layers.1", "model.layers.2"]
sys.exit(0 if names == want else "blocks %s" % names)' <"$T/out" || fail "wrong blocks"
}

convert_bad_input_leaves_nothing() {
	make_st "$T/bad.safetensors" '{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}' 8
	run convert "$T/bad.safetensors" -o "$T/x.arena"
	expect_rc 1
	expect_error_line
	expect_err "tensor 'w'"
	[ ! -e "$T/x.arena" ] || fail "output exists"
	run convert "$REF/tiny_flux.safetensors" "$REF/tiny_flux.safetensors" -o "$T/x.arena"
	expect_rc 1
	expect_err "defined in both"
	run convert "$REF/tiny_flux.safetensors" -o "$T/nodir/x.arena"
	expect_rc 2
	expect_error_line
	left=$(ls -A "$T" | grep -v -e '^out$' -e '^err$' -e '^json-err$' -e '^bad.safetensors$')
	[ -z "$left" ] || fail "files left behind: $left"
}

verify_corrupt() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena" --chunk-size 64K
	# flip one byte in the data region, about 100 KiB in
	printf '\377' | dd of="$T/f.arena" bs=1 seek=102400 conv=notrunc 2>/dev/null
	run verify "$T/f.arena"
	expect_rc 1
	expect_error_line
	expect_err "checksum mismatch"
	expect_err "block"
	run verify --json "$T/f.arena"
	expect_rc 1
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["ok"] is False and len(d["bad_chunks"]) == 1, d
b = d["bad_chunks"][0]
assert b["blocks"] and b["tensors"], b
assert d["error"]["code"] == "IMG_CHUNK_CHECKSUM", d' <"$T/out" || fail "verify --json"
	run export "$T/f.arena" -o "$T/f.safetensors"
	expect_rc 1
	[ ! -e "$T/f.safetensors" ] || fail "export of a corrupt image wrote a file"
}

verify_not_an_image() {
	run verify "$REF/tiny_flux.safetensors"
	expect_rc 1
	expect_error_line
	expect_err "not an arena image"
	run verify "$T/none.arena"
	expect_rc 2
	expect_error_line
	run verify --json "$REF/tiny_flux.safetensors"
	expect_rc 1
	python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["error"]["code"]=="IMG_MAGIC"' <"$T/out" ||
		fail "verify --json on a non-image"
}

cases convert_help convert_usage_errors convert_verify_export_flux convert_sharded_folder \
	convert_bad_input_leaves_nothing verify_corrupt verify_not_an_image

convert_coded_round_trip() {
	run convert "$REF/tiny_flux.safetensors" -o "$T/c.arena" --codec hb4 --chunk-size 64K
	expect_rc 0
	expect_out "coded 5 of 5 chunks with hb4"
	run verify "$T/c.arena"
	expect_rc 0
	run inspect "$T/c.arena"
	expect_rc 0
	expect_out "format 1.1"
	expect_out "5 chunks hb4"
	run inspect --json "$T/c.arena"
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
c = d["coding"]
assert c["coded_image"] and c["hb4_chunks"] == 5 and c["stored_length"] < d["layout"]["data_length"], c' <"$T/out" ||
		fail "inspect --json coding"
	run export "$T/c.arena" -o "$T/c.safetensors"
	expect_rc 0
	cmp -s "$T/c.safetensors" "$REF/tiny_flux.safetensors" || fail "export of a coded image is not byte-identical"
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --codec lz4
	expect_rc 2
	expect_error_line
	expect_err "--codec 'lz4' is not none, hb4 or zstd"
	[ ! -e "$T/x.arena" ] || fail "a refused convert left a file"
}

verify_coded_corrupt() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/c.arena" --codec hb4 --chunk-size 64K
	# A byte of the second chunk's stored data.
	off=$(python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(4096 * 64)
cto, dof = struct.unpack_from("<Q", b, 48)[0], struct.unpack_from("<Q", b, 72)[0]
print(dof + struct.unpack_from("<Q", b, cto + 32)[0] + 5000)' "$T/c.arena")
	printf '\377' | dd of="$T/c.arena" bs=1 seek="$off" conv=notrunc 2>/dev/null
	run verify "$T/c.arena"
	expect_rc 1
	expect_err "chunk 1"
	run export "$T/c.arena" -o "$T/c.safetensors"
	expect_rc 1
	[ ! -e "$T/c.safetensors" ] || fail "export of a corrupt coded image wrote a file"
}

verify_coded_padding() {
	# A byte in the padding after the first chunk's stored bytes: no checksum
	# covers it, so every reader checks that it is zero.
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/c.arena" --codec hb4 --chunk-size 64K
	off=$(python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(4096 * 64)
cto, dof, cc = (struct.unpack_from("<Q", b, o)[0] for o in (48, 72, 96))
for i in range(cc):
    off, stored = struct.unpack_from("<QI", b, cto + 32 * i)
    if stored % 4096:
        print(dof + off + stored + 100)
        break' "$T/c.arena")
	printf '\001' | dd of="$T/c.arena" bs=1 seek="$off" conv=notrunc 2>/dev/null
	for c in verify "load --backend sim"; do
		run $c "$T/c.arena"
		expect_rc 1
		expect_error_line
		expect_err "file byte $off is padding"
	done
	run export "$T/c.arena" -o "$T/c.safetensors"
	expect_rc 1
	expect_err "file byte $off is padding"
	[ ! -e "$T/c.safetensors" ] || fail "export of an image with bad padding wrote a file"
}

cases convert_coded_round_trip verify_coded_corrupt verify_coded_padding

# The zstd codec (format 1.2): convert, verify, inspect, export byte for
# byte, load --check; levels; and what is refused.
convert_zstd_round_trip() {
	run convert "$REF/tiny_flux.safetensors" -o "$T/z.arena" --codec zstd --chunk-size 64K
	expect_rc 0
	expect_out "coded 5 of 5 chunks with zstd"
	run verify "$T/z.arena"
	expect_rc 0
	run inspect "$T/z.arena"
	expect_rc 0
	expect_out "format 1.2"
	expect_out "5 chunks zstd, 0 as is"
	run inspect --json "$T/z.arena"
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
c = d["coding"]
assert d["version"] == "1.2", d["version"]
assert c["coded_image"] and c["zstd_chunks"] == 5 and c["hb4_chunks"] == 0 and c["plain_chunks"] == 0, c
assert c["stored_length"] < d["layout"]["data_length"] * 3 // 4, c' <"$T/out" || fail "inspect --json coding (zstd)"
	run export "$T/z.arena" -o "$T/z.safetensors"
	expect_rc 0
	cmp -s "$T/z.safetensors" "$REF/tiny_flux.safetensors" || fail "export of a zstd image is not byte-identical"
	run load "$T/z.arena" --backend sim --check --no-probe --json
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["check"] is True, d
dec = d["decoded"]
assert dec["cpu_bytes"] == d["device_bytes"] and dec["gpu_bytes"] == 0 and dec["cpu_seconds"] >= 0, dec
assert d["file_bytes"] < d["device_bytes"], d
assert d["reader_thread_s"]["decode"] >= 0, d' <"$T/out" || fail "load --json of a zstd image"
	run load "$T/z.arena" --backend sim --check --no-probe --vram-cap 400K
	expect_rc 0
	expect_out "by the CPU"
	expect_out "match"
	# Levels: each a valid image of the same bytes; higher levels no larger here.
	for l in 1 3 19; do
		run convert "$REF/tiny_llama_sharded" -o "$T/l$l.arena" --codec zstd --zstd-level "$l" --chunk-size 64K -q
		expect_rc 0
		run export "$T/l$l.arena" -o "$T/l$l.safetensors"
		expect_rc 0
	done
	cmp -s "$T/l1.safetensors" "$T/l19.safetensors" || fail "levels 1 and 19 export different bytes"
	[ "$(wc -c <"$T/l19.arena")" -le "$(wc -c <"$T/l1.arena")" ] || fail "level 19 larger than level 1"
	for bad in 0 20 -1 x 1.5; do
		run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --codec zstd --zstd-level "$bad"
		expect_rc 2
		expect_error_line
		expect_err "--zstd-level '$bad'"
	done
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --codec hb4 --zstd-level 3
	expect_rc 2
	expect_error_line
	expect_err "--zstd-level is for --codec zstd"
	[ ! -e "$T/x.arena" ] || fail "a refused convert left a file"
	run convert --help
	expect_out "--zstd-level N"
}

# A stored byte flipped: every reader refuses before decoding, export writes
# nothing. (Damage under a resealed checksum: tests/unit, image/zstd_*.)
verify_zstd_corrupt() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/z.arena" --codec zstd --chunk-size 64K
	off=$(python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(4096 * 64)
cto, dof = struct.unpack_from("<Q", b, 48)[0], struct.unpack_from("<Q", b, 72)[0]
print(dof + struct.unpack_from("<Q", b, cto + 32)[0] + 5000)' "$T/z.arena")
	printf '\377' | dd of="$T/z.arena" bs=1 seek="$off" conv=notrunc 2>/dev/null
	for c in verify "load --backend sim --no-probe"; do
		run $c "$T/z.arena"
		expect_rc 1
		expect_error_line
		expect_err "chunk 1"
		expect_err "checksum mismatch"
	done
	run export "$T/z.arena" -o "$T/z.safetensors"
	expect_rc 1
	[ ! -e "$T/z.safetensors" ] || fail "export of a corrupt zstd image wrote a file"
}

verify_zstd_padding() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/z.arena" --codec zstd --chunk-size 64K
	off=$(python3 -c '
import struct, sys
b = open(sys.argv[1], "rb").read(4096 * 64)
cto, dof, cc = (struct.unpack_from("<Q", b, o)[0] for o in (48, 72, 96))
for i in range(cc):
    off, stored = struct.unpack_from("<QI", b, cto + 32 * i)
    if stored % 4096:
        print(dof + off + stored + 100)
        break' "$T/z.arena")
	printf '\001' | dd of="$T/z.arena" bs=1 seek="$off" conv=notrunc 2>/dev/null
	for c in verify "load --backend sim --no-probe" "load --backend sim --no-probe --check"; do
		run $c "$T/z.arena"
		expect_rc 1
		expect_error_line
		expect_err "file byte $off is padding"
	done
	run export "$T/z.arena" -o "$T/z.safetensors"
	expect_rc 1
	expect_err "file byte $off is padding"
	[ ! -e "$T/z.safetensors" ] || fail "export of an image with bad padding wrote a file"
}

cases convert_zstd_round_trip verify_zstd_corrupt verify_zstd_padding

# hb4 codes 16-bit words: chunks of other data stay plain, and the summary
# says why, once, in words (a bare "coded 0 of 1 chunks" said nothing).
convert_hb4_says_why() {
	"$ARENA" synth -q --layout flux-tiny --dtype f32 -o "$T/f32.safetensors" || fail "synth"
	run convert "$T/f32.safetensors" --codec hb4 -o "$T/a.arena"
	expect_rc 0
	expect_out "coded 0 of 1 chunk with hb4: data 100.0% of its raw size"
	expect_out "1 chunk stays plain: hb4 codes 16-bit words (BF16, F16), and its data is F32"
	[ "$(grep -c 'stay' "$T/out")" = 1 ] || fail "the reason is not said once"
	run convert "$T/f32.safetensors" --codec hb4 --chunk-size 64K -o "$T/b.arena"
	expect_rc 0
	expect_out "coded 0 of 10 chunks with hb4"
	expect_out "10 chunks stay plain: hb4 codes 16-bit words (BF16, F16), and their data is F32"
	run convert "$REF/tiny_flux.safetensors" --codec hb4 --quant fp8-e4m3-row --chunk-size 64K -o "$T/c.arena"
	expect_rc 0
	expect_out "3 chunks stay plain: hb4 codes 16-bit words (BF16, F16), and their data is fp8-e4m3-row"
	# bf16, all coded: nothing to explain
	run convert "$REF/tiny_flux.safetensors" --codec hb4 --chunk-size 64K -o "$T/d.arena"
	expect_rc 0
	expect_out "coded 5 of 5 chunks with hb4"
	grep -q 'plain' "$T/out" && fail "a reason given where every chunk was coded"
	# 16-bit chunks that coding would not make a page smaller
	run convert "$REF/tiny_llama_sharded" --codec hb4 --chunk-size 64K -o "$T/e.arena"
	expect_rc 0
	expect_out "coded 0 of 2 chunks with hb4"
	expect_out "2 chunks of 16-bit data stay plain: coded, they would not be a page smaller"
	run convert -q "$T/f32.safetensors" --codec hb4 -o "$T/q.arena"
	expect_rc 0
	expect_no_out
}
cases convert_hb4_says_why
