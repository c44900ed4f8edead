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
	run inspect "$REF/tiny_flux.safetensors" --json
	expect_rc 0
	expect_json_tensors 126
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

cases inspect_help inspect_no_path inspect_two_paths inspect_unknown_option inspect_nonexistent \
	inspect_corrupt_file inspect_short_file inspect_unknown_dtype inspect_no_checkpoint \
	inspect_bad_index inspect_dtypes inspect_tiny_flux inspect_quant_reference inspect_llama_sharded
