# t_load.sh - arena load on the simulator (CI has no GPU). Sourced by run.sh.

load_help() {
	run load --help
	expect_rc 0
	expect_out "usage: arena load"
	expect_out "--pin-budget"
}

load_usage_errors() {
	run load
	expect_rc 2
	expect_error_line
	run load "$REF/tiny_flux.safetensors" --backend tpu
	expect_rc 2
	expect_error_line
	run load "$REF/tiny_flux.safetensors" --io sideways
	expect_rc 2
	run load "$T/none.arena" --backend sim
	expect_rc 2
	expect_error_line
}

load_sim_image_checked() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	run load "$T/f.arena" --backend sim --check --json
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["backend"] == "sim" and d["check"] is True and d["device_bytes"] > 300000, d
assert set(d["phases"]) == {"open", "ring", "prepare", "populate", "commit"}, d
assert d["limits"] is not None' <"$T/out" || fail "load --json"
	run load "$T/f.arena" --backend sim --pin-budget 4K --no-probe
	expect_rc 0
	expect_out "pageable"
}

load_vram_cap_says_what_fits() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	run load "$T/f.arena" --backend sim --vram-cap 100K
	expect_rc 2
	expect_error_line
	expect_err "does not fit: the smallest plan needs 280.50 KiB for weights"
	expect_err "it needs 307.00 KiB of device memory, 100.00 KiB is the cap"
	# Under the model's size but above what its smallest plan needs: what fits
	# goes to the device, the rest to host slabs (the engine streams it).
	run load "$T/f.arena" --backend sim --vram-cap 290K --headroom 0 --reserve 0 --json --check --no-probe
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["host_bytes"] > 0 and d["device_bytes"] > 0, d
assert d["check"] is True, d' <"$T/out" || fail "load under a cap smaller than the model"
}

load_corrupt_image() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	printf '\377' | dd of="$T/f.arena" bs=1 seek=200000 conv=notrunc 2>/dev/null
	run load "$T/f.arena" --backend sim
	expect_rc 1
	expect_error_line
	expect_err "caught while loading"
}

load_safetensors_quantized() {
	run load "$REF/tiny_flux.safetensors" --backend sim --quant fp8-e4m3-row --no-probe
	expect_rc 0
	expect_out "loaded"
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	run load "$T/f.arena" --backend sim --quant fp8-e4m3-row
	expect_rc 2
	expect_error_line
	run load "$REF/tiny_flux.safetensors" --backend sim --quant fp7
	expect_rc 2
	expect_error_line
}

cases load_help load_usage_errors load_sim_image_checked load_vram_cap_says_what_fits load_corrupt_image \
	load_safetensors_quantized

load_coded_image_checked() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/c.arena" --codec hb4 --chunk-size 64K
	run load "$T/c.arena" --backend sim --check --json
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["check"] is True, d
dec = d["decoded"]
assert dec["gpu_bytes"] == d["device_bytes"] and dec["cpu_bytes"] == 0, dec
assert d["file_bytes"] < d["device_bytes"], d
assert d["limits"]["payload_bound_gbps"] > d["limits"]["moved_bound_gbps"], d' <"$T/out" || fail "load --json of a coded image"
	run load "$T/c.arena" --backend sim --check
	expect_rc 0
	expect_out "decoded by the device"
	expect_out "match"
}

cases load_coded_image_checked
slow load_coded_image_checked
