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

# --sim-bandwidth: from 1 KB/s to 1e15 B/s. A rate near 0 put a copy's end
# past any clock (1e-300 B/s: 5e304 s), and the simulator spun a core on it
# for good; each refused value is one error line, at once.
options_sim_bandwidth_bounds() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	for v in 1e-300 1e-3 999 999.99 1.01e15 1e16; do
		LAST_CMD="arena bench stream $T/f.arena --sim-bandwidth $v --steps 1"
		timeout 20 "$ARENA" bench stream "$T/f.arena" --sim-bandwidth "$v" --steps 1 >"$T/out" 2>"$T/err"
		rc=$?
		expect_rc 2
		expect_error_line
		expect_err "--sim-bandwidth '$v'"
		expect_err "from 1000 to 1e+15"
	done
	for v in 1e7 1e15; do # (1e3 is the backend's test: a load at 1 KB/s takes minutes)
		run bench stream "$T/f.arena" --sim-bandwidth "$v" --steps 1 --json
		expect_rc 0
	done
}

# Sizes near 2^64 given to load and plan are summed without wrapping: a
# headroom of 16 EiB needs 16 EiB, not what the sum wrapped to ("it needs
# 280.50 KiB"), and a reserve that large is that large (it was read as the
# library's own "not learned yet" and became 0).
options_huge_sizes_summed_without_wrapping() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	big=18446744073709551614 # 2^64 - 2
	run load "$T/f.arena" --backend sim --headroom $big
	expect_rc 2
	expect_error_line
	expect_err "headroom of 16.00 EiB it needs 16.00 EiB of device memory"
	run load "$T/f.arena" --backend sim --reserve $big
	expect_rc 2
	expect_error_line
	expect_err "working reserve of 16.00 EiB"
	expect_err "it needs 16.00 EiB of device memory"
	run load "$T/f.arena" --backend sim --vram-cap $big --headroom 18446744073709551000 --reserve $big
	expect_rc 2
	expect_error_line
	expect_err "it needs 16.00 EiB of device memory"
	run plan "$T/f.arena" --vram 1G --reserve $big
	expect_rc 2
	expect_error_line
	expect_err "does not fit in 1.00 GiB"
	run plan "$T/f.arena" --vram $big --headroom $big --reserve $big --json
	expect_rc 2
	expect_error_line
	# (JSON integers stop at 2^63 - 1, the floor's search at 2^62: 4000000T is below)
	run plan "$T/f.arena" --vram 4000000T --headroom 3999999T --reserve 1000G --context 1G --json
	expect_rc 0
	python3 -c '
import json, sys
d = json.load(sys.stdin)
if d["budget"] != 23 * 2**30 or d["headroom"] != 3999999 * 2**40:  # 1T - 1000G - 1G
    sys.exit("budget %d, headroom %d: want 23G and 3999999T" % (d["budget"], d["headroom"]))
' <"$T/out" 2>"$T/json-err" || fail "$(tail -n 1 "$T/json-err")"
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

# One size grammar: every case of tests/sizes.json (the C parser's and
# arena.parse_size's cases) reads the same through a size option: the
# accepted ones as plan --json reports them (as --headroom: any size below
# the device's goes), the others one error line.
options_sizes_as_the_shared_cases() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	python3 - "$ARENA" "$T/f.arena" tests/sizes.json <<'PY' >"$T/py-out" 2>&1 || fail "$(cat "$T/py-out")"
import json, subprocess, sys
arena, img, cases = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3], encoding="utf-8"))
bad = []
for text, want in cases["accepted"]:
    if int(want) >= 2**61:
        continue  # more than the device below: it does not fit
    r = subprocess.run([arena, "plan", img, "--vram", "4000000T", "--headroom", text, "--reserve", "0", "--json"],
                       capture_output=True, text=True)
    got = json.loads(r.stdout)["headroom"] if r.returncode == 0 else "exit %d: %s" % (r.returncode, r.stderr.strip())
    if got != int(want):
        bad.append("--headroom %r: %s, want %s" % (text, got, want))
for key in ("too_large", "not_a_size"):
    for text in cases[key]:
        r = subprocess.run([arena, "plan", img, "--vram", text], capture_output=True, text=True)
        if r.returncode != 2 or not r.stderr.startswith("error: plan: --vram '"):
            bad.append("--vram %r: exit %d, %r (%s: want exit 2, one error line)" % (text, r.returncode, r.stderr, key))
if bad:
    sys.exit("\n".join(bad))
PY
}

# The VRAM a command may use has one name, --vram, on plan, load and bench
# stream alike (--vram-cap: the same option, by its older name).
options_one_vram_name() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena"
	for o in --vram --vram-cap; do
		run plan "$T/f.arena" "$o" 8gb --json
		expect_rc 0
		expect_out '"vram": 8589934592'
		run load "$T/f.arena" --backend sim --no-probe "$o" 8gb --headroom 0 --reserve 0 --json
		expect_rc 0
		run load "$T/f.arena" --backend sim --no-probe "$o" 100K --headroom 0 --reserve 0
		expect_rc 2
		expect_err "100.00 KiB is the cap"
		run bench stream "$T/f.arena" "$o" 8GiB --steps 1 --json
		expect_rc 0
		expect_out '"vram_cap": 8589934592'
		run load "$T/f.arena" --backend sim "$o" 8X
		expect_rc 2
		expect_error_line
		expect_err "$o '8X' is not a size"
	done
	for c in plan load bench; do
		run "$c" --help
		expect_out "  --vram SIZE "
		expect_out "--vram-cap"
	done
	grep -q -- '--vram-cap' docs/CLI.md && ! grep -v 'another name\|older name' docs/CLI.md | grep -q -- '--vram-cap' ||
		fail "docs/CLI.md names --vram-cap other than as --vram's other name"
}

cases options_help_percent options_sizes_refused options_sizes_accepted options_numbers_refused \
	options_help_says_what_a_size_is options_sim_bandwidth_bounds options_huge_sizes_summed_without_wrapping \
	options_sizes_as_the_shared_cases options_one_vram_name
slow options_sizes_refused
