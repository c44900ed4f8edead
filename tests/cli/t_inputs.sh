# t_inputs.sh - inputs that change while they are read, and empty models:
# every command that reads them ends with one error line and the exit status
# of an invalid input (1), never a signal, and a convert that fails leaves
# nothing. Sourced by run.sh; see there for the helpers.

# What $T holds besides the files a case made ($1...): nothing, or fail.
expect_only() {
	for f in "$T"/* "$T"/.[!.]*; do
		[ -e "$f" ] || continue
		case " out err json-err $* " in
		*" ${f##*/} "*) ;;
		*) fail "left behind: ${f##*/}" ;;
		esac
	done
}

# Start "arena ARGS" in the background with $T/c.safetensors (a fresh copy of
# $T/whole.safetensors), cut it to 4 KiB after $1 seconds, and wait: $rc.
run_cut() {
	d=$1
	shift
	cp "$T/whole.$EXT" "$T/c.$EXT"
	# shellcheck disable=SC2034 # fail() names it
	LAST_CMD="arena $* (the input cut to 4 KiB after $d s)"
	"$ARENA" "$@" >"$T/out" 2>"$T/err" &
	pid=$!
	sleep "$d"
	truncate -s 4096 "$T/c.$EXT"
	wait "$pid"
	rc=$?
}

# rc is 0 (the command read what it needed before the cut) or 1 with one
# error line; never a signal (exit 128 + N).
expect_whole_or_invalid() {
	case $rc in
	0) ;;
	1) expect_error_line ;;
	*) fail "exit status $rc, want 0, or 1 for the changed input" ;;
	esac
}

# A checkpoint whose header alone is 2.6 MB (40,000 one-byte tensors): its
# parse takes a good part of a second, the window a cut falls in. The same
# as an image. Cut at several delays after the start (before the open,
# inside the header's read, after it) while inspect, convert and load read
# them: 0 or 1, never a SIGBUS (a mapped header read after the file shrank
# killed all three with "Bus error", exit 135).
inputs_cut_while_read() {
	python3 - "$T/whole.safetensors" <<'PY' || fail "cannot write the checkpoint"
import json, struct, sys
n = 40000
h = {"t.%d" % i: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i in range(n)}
t = json.dumps(h, separators=(",", ":")).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(t)) + t + bytes(n))
PY
	EXT=safetensors
	for d in 0 0.005 0.02 0.05 0.2; do
		run_cut "$d" inspect "$T/c.safetensors"
		expect_whole_or_invalid
		run_cut "$d" convert -q "$T/c.safetensors" -o "$T/c.arena"
		expect_whole_or_invalid
		[ "$rc" = 0 ] || [ ! -e "$T/c.arena" ] || fail "a failed convert left its output"
		rm -f "$T/c.arena"
		expect_only whole.safetensors c.safetensors
		run_cut "$d" load "$T/c.safetensors" --backend sim
		expect_whole_or_invalid
	done
	"$ARENA" convert -q "$T/whole.safetensors" -o "$T/whole.arena" || fail "convert"
	EXT=arena
	for d in 0 0.005 0.02 0.05 0.2; do
		run_cut "$d" load "$T/c.arena" --backend sim
		expect_whole_or_invalid
		run_cut "$d" verify "$T/c.arena"
		expect_whole_or_invalid
	done
}
cases inputs_cut_while_read
slow inputs_cut_while_read

# An image cut while the disk tier reads it again at every step is exit 1,
# as the same cut found at the open (IMG_TRUNCATED) is: a changed input,
# not a system error (it was exit 3). 64 KiB chunks: a block is read again
# from the file each time it is streamed (a chunk the size of the whole
# image would be read once and kept).
inputs_cut_under_the_disk_tier() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" --chunk-size 64K -o "$T/whole.arena" || fail "convert"
	EXT=arena
	set -- bench stream "$T/c.arena" --vram-cap 285K --headroom 0 --reserve 0 --host-budget 0 \
		--sim-bandwidth 1e6 --steps 60
	# at the open
	cp "$T/whole.arena" "$T/c.arena"
	truncate -s 100000 "$T/c.arena"
	run "$@"
	expect_rc 1
	expect_error_line
	expect_err "the header says"
	# mid-run: 60 steps of a quarter of a second (250 KiB streamed a step
	# at 1 MB/s), cut after 4 s
	run_cut 4 "$@"
	expect_rc 1
	expect_error_line
	expect_err "re-reading it from the image"
	expect_err "file changed while reading"
}
cases inputs_cut_under_the_disk_tier
slow inputs_cut_under_the_disk_tier

# A model without tensors (an index with an empty weight_map, a `{}`
# safetensors, a folder holding one): inspect, a reader, shows it (0
# tensors); convert and load refuse it, with the same line and exit status.
inputs_empty_model() {
	printf '{"weight_map": {}}' >"$T/model.safetensors.index.json"
	make_st "$T/e.safetensors" '{}' 0
	mkdir "$T/dir"
	make_st "$T/dir/model.safetensors" '{}' 0
	for p in "$T/model.safetensors.index.json" "$T/e.safetensors" "$T/dir"; do
		run inspect "$p"
		expect_rc 0
		expect_no_err
		expect_out "tensors:    0 in "
		run inspect --json "$p"
		expect_rc 0
		expect_json_tensors 0
		for c in "convert -q $p -o $T/x.arena" "load $p --backend sim"; do
			# shellcheck disable=SC2086
			run $c
			expect_rc 1
			expect_no_out
			expect_error_line
			expect_err "checkpoint has no tensors"
			[ ! -e "$T/x.arena" ] || fail "convert left $T/x.arena"
		done
	done
}
cases inputs_empty_model
