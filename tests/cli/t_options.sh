# t_options.sh - sizes and numbers on the command line: one grammar for every
# size option of every command, strict whole numbers and rates, and each
# --help that takes a SIZE says what one is. Sourced by run.sh.

# The size options, each as "command words|option" (a size goes after the option).
SIZE_OPTS="plan|--vram
plan --vram 1G|--headroom
plan --vram 1G|--reserve
bench stream|--vram-cap
bench stream|--sim-capacity
bench stream|--device-free
bench stream|--headroom
bench stream|--reserve
load --backend sim|--vram-cap
load --backend sim|--pin-budget
load --backend sim|--slot-size
convert -o @T/x.arena|--chunk-size"

# Run every size option with $1 (on an image that exists), expect exit 2 and
# one error line naming the option and the value.
refuse_size() {
	echo "$SIZE_OPTS" | sed "s#@T#$T#" | while IFS='|' read -r cmd opt; do
		# shellcheck disable=SC2086
		run $cmd "$T/f.arena" "$opt" "$1"
		expect_rc 2
		expect_error_line
		expect_err "$opt '$1'"
	done
	run bench stream "$T/f.arena" --pressure "$1@2"
	expect_rc 2
	expect_error_line
	expect_err "--pressure '$1@2'"
}

options_sizes_refused() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	for v in nan NaN inf -inf -1 -0 +8G 0x10 0X1G " 8G" "8G " "8 G" "" . G 1e9 1E3 8Q 8GiBB 8g8 1..5G \
		18446744073709551616 16777216T 99999999999999999999999; do
		refuse_size "$v"
	done
}

# Accepted sizes, as plan --json reports them (units are powers of 1024,
# whatever the spelling).
options_sizes_accepted() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	for pair in 8G=8589934592 8g=8589934592 8GiB=8589934592 8GB=8589934592 1.5G=1610612736 \
		1.5GiB=1610612736 512M=536870912 1T=1099511627776 .5M=524288 600K=614400 614400=614400 \
		614400B=614400 0.3G=322122547 1.G=1073741824; do
		v=${pair%%=*}
		want=${pair#*=}
		run plan "$T/f.arena" --vram "$v" --headroom 0 --reserve 0 --json
		expect_rc 0
		python3 -c '
import json, sys
d = json.load(sys.stdin)
if d["vram"] != int(sys.argv[1]):
    sys.exit("vram %s, want %s" % (d["vram"], sys.argv[1]))
' "$want" <"$T/out" 2>"$T/json-err" || fail "--vram $v: $(tail -n 1 "$T/json-err")"
	done
	# the least each option takes
	run load "$T/f.arena" --backend sim --slot-size 2K
	expect_rc 2
	expect_error_line
	run load "$T/f.arena" --backend sim --vram-cap 0
	expect_rc 2
	expect_error_line
	run convert "$REF/tiny_flux.safetensors" -o "$T/x.arena" --chunk-size 96K
	expect_rc 2
	expect_error_line
	expect_err "power of two"
	[ ! -e "$T/x.arena" ] || fail "a refused convert wrote its output"
}

# Whole numbers and rates: decimal digits only (rates may have an exponent).
options_numbers_refused() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	for v in " 4" "4 " +4 -4 0x10 "" 4.0 1e1 nan 99999999999999999999; do
		for c in "load $T/f.arena --backend sim --threads" "load $T/f.arena --backend sim --slots" \
			"load $T/f.arena --backend sim --device" "convert $REF/tiny_flux.safetensors -o $T/x.arena --threads" \
			"verify $T/f.arena --threads" "bench stream $T/f.arena --steps" "bench stream $T/f.arena --tokens" \
			"bench stream $T/f.arena --depth" "bench stream $T/f.arena --keep-last" "plan $T/f.arena --vram 1G --depth" \
			"synth --layout flux-tiny -o $T/s.st --threads" "synth --layout flux-tiny -o $T/s.st --blocks"; do
			# shellcheck disable=SC2086
			run $c "$v"
			expect_rc 2
			expect_error_line
			expect_err "'$v'"
		done
		run bench stream "$T/f.arena" --pressure "1G@$v"
		expect_rc 2
		expect_error_line
	done
	for v in nan inf -1 0 " 1e14" "1e14 " 0x1p40 1e14x "" e9 1e 1e999; do
		for o in --flops --sim-bandwidth; do
			run bench stream "$T/f.arena" "$o" "$v"
			expect_rc 2
			expect_error_line
			expect_err "$o '$v'"
		done
	done
	[ ! -e "$T/x.arena" ] && [ ! -e "$T/s.st" ] || fail "a refused command wrote its output"
}

options_help_says_what_a_size_is() {
	for c in plan bench load convert; do
		run "$c" --help
		expect_rc 0
		expect_out "SIZE: "
		expect_out "K, M,"
	done
}

# --help texts are printed as they are, not through printf.
options_help_percent() {
	run convert --help
	grep -qF '%%' "$T/out" && fail "convert --help prints a doubled percent sign"
	expect_out "75% of the bytes"
}

cases options_help_percent options_sizes_refused options_sizes_accepted options_numbers_refused \
	options_help_says_what_a_size_is
