# t_inspect.sh - arena inspect: help, usage errors, bad inputs, the reference
# fixtures in text and JSON. Sourced by run.sh; see there for the helpers.

inspect_help() {
	run help inspect
	expect_rc 0
	expect_out "usage: arena inspect"
	expect_no_err
	run inspect --help
	expect_rc 0
	expect_out "usage: arena inspect"
	expect_out "--json"
	expect_no_err
	run inspect -h
	expect_rc 0
	expect_out "usage: arena inspect"
}

inspect_no_path() {
	run inspect
	expect_rc 2
	expect_no_out
	expect_err "error: inspect:"
}

inspect_two_paths() {
	run inspect "$REF/dtypes.safetensors" "$REF/tiny_flux.safetensors"
	expect_rc 2
	expect_no_out
	expect_err "error: inspect:"
}

inspect_unknown_option() {
	run inspect --frobnicate "$REF/dtypes.safetensors"
	expect_rc 2
	expect_no_out
	expect_err "error: inspect: unknown option '--frobnicate'"
}

inspect_nonexistent() {
	run inspect "$T/nonexistent.safetensors"
	expect_rc 2
	expect_no_out
	expect_error_line
	expect_err "$T/nonexistent.safetensors"
}

inspect_corrupt_file() {
	make_st "$T/bad.safetensors" '{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}' 8
	run inspect "$T/bad.safetensors"
	expect_rc 1
	expect_no_out
	expect_error_line
	expect_err "$T/bad.safetensors"
	expect_err "'w'"
	run inspect --json "$T/bad.safetensors"
	expect_rc 1
	expect_no_out
}

inspect_short_file() {
	printf 'abc' >"$T/short.safetensors"
	run inspect "$T/short.safetensors"
	expect_rc 1
	expect_error_line
	expect_err "$T/short.safetensors"
}

inspect_unknown_dtype() {
	make_st "$T/bf.safetensors" '{"w":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}}' 2
	run inspect "$T/bf.safetensors"
	expect_rc 1
	expect_error_line
	expect_err "unknown dtype 'bf16'"
}

inspect_no_checkpoint() {
	mkdir "$T/empty"
	run inspect "$T/empty"
	expect_rc 1
	expect_error_line
	expect_err "$T/empty"
}

inspect_bad_index() {
	make_st "$T/a.safetensors" '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}' 1
	printf '{"weight_map":{"w":"a.safetensors","v":"b.safetensors"}}' >"$T/model.safetensors.index.json"
	run inspect "$T"
	expect_rc 1
	expect_error_line
	expect_err "'b.safetensors'"
}

inspect_dtypes() {
	run inspect "$REF/dtypes.safetensors"
	expect_rc 0
	expect_no_err
	expect_out "bf16"
	expect_out "F8_E4M3"
	expect_out "C64"
	expect_out "format: pt"
	run inspect --json "$REF/dtypes.safetensors"
	expect_rc 0
	expect_json_tensors 18
}

inspect_tiny_flux() {
	run inspect "$REF/tiny_flux.safetensors"
	expect_rc 0
	expect_no_err
	expect_out "single_transformer_blocks.2."
	expect_out "blocks: transformer_blocks (2, repeating), single_transformer_blocks (3, repeating); globals: 20 tensors"
	run inspect "$REF/tiny_flux.safetensors" --json
	expect_rc 0
	expect_json_tensors 126
	expect_out '"verdict": "sequence"'
	expect_out '"reason": "repeating"'
}

# A valid file with no tensors (a header of only __metadata__, or {}):
# inspect, a reader, shows it (0 tensors, its metadata) and exits 0, in text
# and JSON; convert and load refuse it, and convert writes nothing.
inspect_no_tensors() {
	make_st "$T/meta.safetensors" '{"__metadata__":{"format":"pt","note":"no weights yet"}}' 0
	make_st "$T/none.safetensors" '{}' 0
	for f in meta none; do
		run inspect "$T/$f.safetensors"
		expect_rc 0
		expect_no_err
		expect_out "tensors:    0 in 1 file, 0 B (0 bytes)"
		expect_out "blocks: none; globals: 0 tensors"
		expect_out "file $T/$f.safetensors: "
		run inspect --json "$T/$f.safetensors"
		expect_rc 0
		expect_no_err
		expect_json_tensors 0
		python3 - "$T/out" "$f" <<'PY' || fail "inspect --json $f.safetensors: metadata or totals wrong"
import json, sys
d = json.load(open(sys.argv[1]))
want = {"format": "pt", "note": "no weights yet"} if sys.argv[2] == "meta" else {}
assert [x["metadata"] for x in d["files"]] == [want] and d["files"][0]["tensors"] == 0, d["files"]
assert d["totals"]["bytes"] == 0 and d["totals"]["by_dtype"] == [], d["totals"]
assert d["discovery"]["blocks"] == 0 and d["discovery"]["found"] == [], d["discovery"]
PY
		run convert "$T/$f.safetensors" -o "$T/$f.arena"
		expect_rc 1
		expect_error_line
		expect_err "checkpoint has no tensors"
		[ ! -e "$T/$f.arena" ] || fail "convert of a file with no tensors wrote $f.arena"
		run load "$T/$f.safetensors" --backend sim
		expect_rc 1
		expect_error_line
		expect_err "checkpoint has no tensors"
	done
	run inspect "$T/meta.safetensors"
	expect_out "  note: no weights yet"
}

# Blocks found from the structure whatever the container's name; what was
# looked at and not taken is named with the reason.
inspect_discovery() {
	make_st "$T/t5.safetensors" '{"encoder.block.0.w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"encoder.block.1.w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},"encoder.block.2.w":{"dtype":"U8","shape":[4],"data_offsets":[8,12]},"head.0.w":{"dtype":"U8","shape":[4],"data_offsets":[12,16]},"shared.weight":{"dtype":"U8","shape":[4],"data_offsets":[16,20]}}' 20
	run inspect "$T/t5.safetensors"
	expect_rc 0
	expect_no_err
	expect_out "blocks: encoder.block (3, repeating); globals: 2 tensors; rejected: head (one member)"
	run inspect --json "$T/t5.safetensors"
	expect_rc 0
	expect_out '"path": "head"'
	expect_out '"verdict": "rejected"'
}

inspect_quant_reference() {
	run inspect "$REF/quant_reference.safetensors"
	expect_rc 0
	expect_no_err
	run inspect --json "$REF/quant_reference.safetensors"
	expect_rc 0
	expect_json_tensors 12
}

inspect_llama_sharded() {
	run inspect "$REF/tiny_llama_sharded"
	expect_rc 0
	expect_no_err
	expect_out "model-00001-of-00002.safetensors"
	expect_out "model-00002-of-00002.safetensors"
	expect_out "model.layers.2."
	run inspect --json "$REF/tiny_llama_sharded"
	expect_rc 0
	expect_json_tensors 30
	run inspect --json "$REF/tiny_llama_sharded/model.safetensors.index.json"
	expect_rc 0
	expect_json_tensors 30
}

# ---- blocks found from the checkpoint's structure (convert/plan.h) ----------

# st_of_names FILE NAME:SHAPE...: a safetensors file of U8 zeros, tensors as named
st_of_names() {
	python3 - "$@" <<'PY'
import json, struct, sys
h, off = {}, 0
for spec in sys.argv[2:]:
    name, shape = spec.split(":")
    dims = [int(x) for x in shape.split(",")] if shape else []
    n = 1
    for d in dims:
        n *= d
    h[name] = {"dtype": "U8", "shape": dims, "data_offsets": [off, off + n]}
    off += n
b = json.dumps(h).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(b)) + b + bytes(off))
PY
}

# convert_expect_blocks CHECKPOINT BLOCK...: arena convert makes an image
# whose blocks (arena inspect --json) are these, in this order; BLOCK is
# name=container=index ("-" for none)
convert_expect_blocks() {
	ck=$1
	shift
	run convert "$ck" -o "$T/b.arena"
	expect_rc 0
	run inspect --json "$T/b.arena"
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
got = ["%s=%s=%s" % (b["name"], b["container"] if b["container"] is not None else "-",
                     b["container_index"] if b["container_index"] is not None else "-") for b in d["blocks"]]
want = sys.argv[2:]
if got != want:
    sys.exit("blocks %s, want %s" % (" ".join(got), " ".join(want)))
' "$T/out" "$@" 2>"$T/py" || fail "$ck: $(tail -n 1 "$T/py")"
	rm -f "$T/b.arena"
}

# T5's names: no built-in name, a list all alike (block 0 holds one name more)
inspect_blocks_t5_encoder() {
	set -- "$T/t5.safetensors" shared.weight:16,4 encoder.final_layer_norm.weight:4 \
		encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight:8,2
	for b in 0 1 2; do
		set -- "$@" encoder.block.$b.layer.0.SelfAttention.q.weight:4,4 encoder.block.$b.layer.0.layer_norm.weight:4 \
			encoder.block.$b.layer.1.DenseReluDense.wo.weight:4,8 encoder.block.$b.layer.1.layer_norm.weight:4
	done
	st_of_names "$@"
	convert_expect_blocks "$T/t5.safetensors" globals=-=- encoder.block.0=encoder.block=0 \
		encoder.block.1=encoder.block=1 encoder.block.2=encoder.block=2
}

# a UNet's shape: down and up lists whose blocks differ, and mid_block alike
# them (a single block of its own, between them)
inspect_blocks_unet_mid_block() {
	set -- "$T/unet.safetensors" conv_in.weight:8,4 time_embedding.linear_1.weight:8,8
	for b in 0 1; do
		for r in 0 1; do
			set -- "$@" down_blocks.$b.resnets.$r.conv1.weight:8,8,3,3 down_blocks.$b.resnets.$r.norm1.weight:8
		done
	done
	set -- "$@" down_blocks.0.downsamplers.0.conv.weight:8,8,3,3
	for r in 0 1; do
		set -- "$@" mid_block.resnets.$r.conv1.weight:8,8,3,3 mid_block.resnets.$r.norm1.weight:8
	done
	set -- "$@" mid_block.attentions.0.proj_in.weight:8,8
	for b in 0 1; do
		for r in 0 1 2; do
			set -- "$@" up_blocks.$b.resnets.$r.conv1.weight:8,16,3,3 up_blocks.$b.resnets.$r.norm1.weight:16
		done
	done
	set -- "$@" up_blocks.0.upsamplers.0.conv.weight:8,8,3,3
	st_of_names "$@"
	convert_expect_blocks "$T/unet.safetensors" globals=-=- down_blocks.0=down_blocks=0 down_blocks.1=down_blocks=1 \
		mid_block=mid_block=- up_blocks.0=up_blocks=0 up_blocks.1=up_blocks=1
}

# numbers that are not lists of blocks: one member (to_out.0), a Sequential
# with a parameter-free layer between (mlp.0, mlp.2), members that differ
inspect_blocks_not_containers() {
	st_of_names "$T/n.safetensors" to_out.0.weight:4,4 to_out.0.bias:4 mlp.0.weight:16,4 mlp.2.weight:4,16 \
		mix.0.attn.weight:4,4 mix.1.norm.weight:4 mix.2.fc.weight:4,4
	convert_expect_blocks "$T/n.safetensors" globals=-=-
}

# other names for a list: GPT-2's h.N, open_clip's resblocks.N
inspect_blocks_any_name() {
	st_of_names "$T/g.safetensors" wte.weight:16,4 ln_f.weight:4 h.0.attn.c_attn.weight:4,12 h.0.ln_1.weight:4 \
		h.1.attn.c_attn.weight:4,12 h.1.ln_1.weight:4 visual.transformer.resblocks.0.ln_1.weight:8 \
		visual.transformer.resblocks.1.ln_1.weight:8
	convert_expect_blocks "$T/g.safetensors" globals=-=- h.0=h=0 h.1=h=1 \
		visual.transformer.resblocks.0=visual.transformer.resblocks=0 \
		visual.transformer.resblocks.1=visual.transformer.resblocks=1
	# --block-pattern still decides alone
	run convert "$T/g.safetensors" -o "$T/p.arena" --block-pattern '^h\.([0-9]+)\.'
	expect_rc 0
	run inspect --json "$T/p.arena"
	expect_rc 0
	python3 -c '
import json, sys
names = [b["name"] for b in json.load(open(sys.argv[1]))["blocks"]]
if names != ["globals", "h.0", "h.1"]:
    sys.exit("blocks %s" % names)' "$T/out" 2>"$T/py" || fail "$(tail -n 1 "$T/py")"
}

# the synthesized layouts and the fixtures: the blocks their built-in names gave
inspect_blocks_synth_layouts() {
	run synth --layout flux-tiny --blocks 2 -o "$T/f.safetensors"
	expect_rc 0
	convert_expect_blocks "$T/f.safetensors" globals=-=- transformer_blocks.0=transformer_blocks=0 \
		transformer_blocks.1=transformer_blocks=1 single_transformer_blocks.0=single_transformer_blocks=0 \
		single_transformer_blocks.1=single_transformer_blocks=1
	run synth --layout flux-tiny --blocks 1 -o "$T/f1.safetensors"
	expect_rc 0
	convert_expect_blocks "$T/f1.safetensors" globals=-=- transformer_blocks.0=transformer_blocks=0 \
		single_transformer_blocks.0=single_transformer_blocks=0
	run synth --layout llama-tiny --blocks 2 -o "$T/l.safetensors"
	expect_rc 0
	convert_expect_blocks "$T/l.safetensors" globals=-=- model.layers.0=model.layers=0 model.layers.1=model.layers=1
	convert_expect_blocks "$REF/tiny_llama_sharded" globals=-=- model.layers.0=model.layers=0 \
		model.layers.1=model.layers=1 model.layers.2=model.layers=2
	convert_expect_blocks "$REF/tiny_flux.safetensors" globals=-=- transformer_blocks.0=transformer_blocks=0 \
		transformer_blocks.1=transformer_blocks=1 single_transformer_blocks.0=single_transformer_blocks=0 \
		single_transformer_blocks.1=single_transformer_blocks=1 single_transformer_blocks.2=single_transformer_blocks=2
}

cases inspect_blocks_t5_encoder inspect_blocks_unet_mid_block inspect_blocks_not_containers inspect_blocks_any_name \
	inspect_blocks_synth_layouts

cases inspect_help inspect_no_path inspect_two_paths inspect_unknown_option inspect_nonexistent \
	inspect_corrupt_file inspect_short_file inspect_unknown_dtype inspect_no_checkpoint \
	inspect_bad_index inspect_dtypes inspect_tiny_flux inspect_discovery inspect_quant_reference inspect_llama_sharded \
	inspect_no_tensors
