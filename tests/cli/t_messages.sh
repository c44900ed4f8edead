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

cases messages_over_cap_in_units_that_fit
