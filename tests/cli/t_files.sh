# t_files.sh - what every command does with paths that are not plain files:
# FIFOs, devices, folders, symlink loops, unreadable files (inputs), folders
# and inputs named as the output. Sourced by run.sh; see there for the helpers.

# run, with a time limit: a command that blocks (on a FIFO) fails the case.
run_t() {
	LAST_CMD="arena $*"
	timeout -s KILL 20 "$ARENA" "$@" >"$T/out" 2>"$T/err"
	rc=$?
	[ "$rc" != 137 ] || fail "hung (killed after 20 s)"
}

# A sharded checkpoint in $T/sh (copy of the reference); $S2 its second shard.
make_sharded() {
	cp -R "$REF/tiny_llama_sharded" "$T/sh"
	S2=$T/sh/model-00002-of-00002.safetensors
}

# Every "not a readable regular file" case exits 1 with one error line that
# names the path.
expect_not_file() {
	expect_rc 1
	expect_error_line
	expect_err "$1"
}

files_fifo_input() {
	mkfifo "$T/f.safetensors" "$T/f.arena" "$T/p.json"
	run_t inspect "$T/f.safetensors"
	expect_not_file "$T/f.safetensors: not a regular file"
	run_t convert "$T/f.safetensors" -o "$T/x.arena"
	expect_not_file "$T/f.safetensors: not a regular file"
	run_t verify "$T/f.arena"
	expect_not_file "$T/f.arena: not a regular file"
	run_t verify --json "$T/f.arena"
	expect_rc 1
	run_t inspect "$T/f.arena"
	expect_not_file "$T/f.arena: not a regular file"
	run_t export "$T/f.arena" -o "$T/x.safetensors"
	expect_not_file "$T/f.arena: not a regular file"
	run_t load "$T/f.arena" --backend sim
	expect_not_file "$T/f.arena: not a regular file"
	run_t plan "$T/f.arena" --vram 8G
	expect_not_file "$T/f.arena: not a regular file"
	# a FIFO as a compute profile
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/g.arena"
	run_t plan "$T/g.arena" --vram 8G --profile "$T/p.json"
	expect_not_file "$T/p.json: not a regular file"
	# a FIFO as a shard, as the index, as the one file of a folder
	make_sharded
	rm "$S2"
	mkfifo "$S2"
	run_t inspect "$T/sh"
	expect_not_file "$S2: not a regular file"
	run_t convert "$T/sh" -o "$T/x.arena"
	expect_not_file "$S2: not a regular file"
	run_t load "$T/sh" --backend sim
	expect_not_file "$S2: not a regular file"
	mkdir "$T/i" "$T/d"
	mkfifo "$T/i/model.safetensors.index.json" "$T/d/only.safetensors"
	run_t inspect "$T/i"
	expect_not_file "$T/i/model.safetensors.index.json: not a regular file"
	run_t inspect "$T/i/model.safetensors.index.json"
	expect_not_file "not a regular file"
	run_t convert "$T/d" -o "$T/x.arena"
	expect_not_file "$T/d/only.safetensors: not a regular file"
	[ ! -e "$T/x.arena" ] || fail "a refused convert wrote $T/x.arena"
}

# convert / export must not write over one of their inputs, by any name.
files_output_is_input() {
	cp "$REF/tiny_flux.safetensors" "$T/t.safetensors"
	ln -s t.safetensors "$T/l.safetensors"
	ln "$T/t.safetensors" "$T/h.safetensors"
	for o in t l h; do
		run convert "$T/t.safetensors" -o "$T/$o.safetensors"
		expect_rc 2
		expect_error_line
		expect_err "$T/$o.safetensors: is an input"
	done
	run convert "$T/l.safetensors" -o "$T/t.safetensors"
	expect_rc 2
	expect_err "is an input"
	cmp -s "$T/t.safetensors" "$REF/tiny_flux.safetensors" || fail "convert wrote over its input"
	[ -L "$T/l.safetensors" ] || fail "convert replaced the symlink"
	# every file of a sharded or multi-file input, and the index
	make_sharded
	for o in "$S2" "$T/sh/model.safetensors.index.json"; do
		run convert "$T/sh" -o "$o"
		expect_rc 2
		expect_err "is an input"
		run convert "$T/sh/model.safetensors.index.json" -o "$o"
		expect_rc 2
		expect_err "is an input"
	done
	run convert "$T/sh/model-00001-of-00002.safetensors" "$S2" -o "$S2"
	expect_rc 2
	expect_err "is an input"
	run convert "$T/t.safetensors" "$T/sh" -o "$T/sh/model.safetensors.index.json"
	expect_rc 2
	expect_err "is an input"
	cmp -s "$S2" "$REF/tiny_llama_sharded/model-00002-of-00002.safetensors" || fail "convert wrote over a shard"
	cmp -s "$T/sh/model.safetensors.index.json" "$REF/tiny_llama_sharded/model.safetensors.index.json" ||
		fail "convert wrote over the index"
	# export
	"$ARENA" convert -q "$T/t.safetensors" -o "$T/x.arena"
	ln -s x.arena "$T/xl.arena"
	ln "$T/x.arena" "$T/xh.arena"
	for o in x xl xh; do
		run export "$T/x.arena" -o "$T/$o.arena"
		expect_rc 2
		expect_error_line
		expect_err "$T/$o.arena: is an input"
	done
	# a profile saved over the image it was measured on
	for o in x xl xh; do
		run bench stream "$T/x.arena" --vram-cap 400K --sim-capacity 1G --steps 2 --save-profile "$T/$o.arena"
		expect_rc 2
		expect_error_line
		expect_err "$T/$o.arena' is the image"
	done
	run verify "$T/x.arena"
	expect_rc 0
	left=$(ls -A "$T" | grep '^\.')
	[ -z "$left" ] || fail "temporaries left: $left"
}

# One class per kind of bad path, whatever the cause (README, "Exit status").
files_exit_codes() {
	make_sharded
	mv "$S2" "$T/s2"
	# a shard that is missing, a symlink loop, a folder, a device, a FIFO
	run inspect "$T/sh"
	expect_not_file "is missing"
	ln -s loop-b "$T/loop-a"
	ln -s loop-a "$T/loop-b"
	ln -s "$T/loop-a" "$S2"
	run inspect "$T/sh"
	expect_not_file "$S2: "
	run convert "$T/sh" -o "$T/x.arena"
	expect_not_file "$S2: "
	rm "$S2"
	mkdir "$S2"
	run inspect "$T/sh"
	expect_not_file "$S2: not a regular file"
	rmdir "$S2"
	ln -s /dev/null "$S2"
	run inspect "$T/sh"
	expect_not_file "$S2: not a regular file"
	rm "$S2"
	mkfifo "$S2"
	run_t inspect "$T/sh"
	expect_not_file "$S2: not a regular file"
	rm "$S2"
	# the same named on the command line
	run inspect "$T/loop-a"
	expect_not_file "$T/loop-a: "
	run verify "$T/loop-a"
	expect_not_file "$T/loop-a: "
	run verify "$T/sh"
	expect_not_file "$T/sh: not a regular file"
	run export "$T/sh" -o "$T/x.safetensors"
	expect_not_file "$T/sh: not a regular file"
	run verify /dev/null
	expect_not_file "/dev/null: not a regular file"
	run inspect /dev/null
	expect_not_file "/dev/null: not a regular file"
	# a named input that does not exist is a usage error
	run inspect "$T/none.safetensors"
	expect_rc 2
	expect_error_line
	run verify "$T/none.arena"
	expect_rc 2
	# unreadable (as root: as nobody, where setpriv can run arena)
	cp "$T/s2" "$S2"
	chmod 000 "$S2"
	if [ "$(id -u)" != 0 ]; then
		run inspect "$T/sh"
		expect_not_file "$S2: "
	elif command -v setpriv >/dev/null &&
		chmod o+x "$(dirname "$T")" && chmod -R o+rX "$T" && chmod 000 "$S2" &&
		setpriv --reuid=65534 --regid=65534 --clear-groups "$ARENA" version >/dev/null 2>&1; then
		LAST_CMD="arena inspect $T/sh (as nobody)"
		setpriv --reuid=65534 --regid=65534 --clear-groups "$ARENA" inspect "$T/sh" >"$T/out" 2>"$T/err"
		rc=$?
		expect_not_file "$S2: "
		LAST_CMD="arena verify $S2 (as nobody)"
		setpriv --reuid=65534 --regid=65534 --clear-groups "$ARENA" verify "$S2" >"$T/out" 2>"$T/err"
		rc=$?
		expect_not_file "$S2: "
	else
		echo "note $CASE: an unreadable file is not tried (root, and setpriv cannot run arena as nobody)"
	fi
	chmod 644 "$S2"
	# outputs: a folder (with or without the slash), a missing folder, a FIFO
	mkdir "$T/od"
	mkfifo "$T/fo"
	for o in "$T/od" "$T/od/" "$T/nodir/x.arena" "$T/fo"; do
		run convert "$REF/tiny_flux.safetensors" -o "$o"
		expect_rc 2
		expect_error_line
	done
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/x.arena"
	for o in "$T/od" "$T/od/" "$T/nodir/x.safetensors" "$T/fo"; do
		run export "$T/x.arena" -o "$o"
		expect_rc 2
		expect_error_line
	done
	[ -p "$T/fo" ] || fail "the FIFO named as output was replaced"
	[ -z "$(ls -A "$T/od")" ] || fail "something was written in $T/od"
	left=$(ls -A "$T" | grep '^\.')
	[ -z "$left" ] || fail "temporaries left: $left"
}

cases files_fifo_input files_output_is_input files_exit_codes

# An existing output is refused unless --force (one error line that says
# so; the file as it was, no temporary left); with --force it is replaced,
# whole. convert, export and synth alike, and a symlink at the output counts
# as one (dangling or not).
files_existing_output_needs_force() {
	"$ARENA" convert -q "$REF/tiny_flux.safetensors" -o "$T/f.arena" || fail "convert"
	for c in "convert $REF/tiny_flux.safetensors" "export $T/f.arena" "synth --layout flux-tiny"; do
		for o in "$T/out.x" "$T/link.x"; do
			rm -f "$T/out.x" "$T/link.x"
			printf 'keep' >"$T/out.x"
			[ "$o" = "$T/link.x" ] && ln -s "$T/nowhere" "$T/link.x"
			# shellcheck disable=SC2086
			run $c -o "$o"
			expect_rc 2
			expect_error_line
			expect_err "error: $o: exists; --force replaces it"
			[ "$(cat "$T/out.x")" = keep ] || fail "$c: the existing output changed"
			[ ! -e "$T/nowhere" ] || fail "$c: wrote through the symlink"
			ls -A "$T" | grep -q '^\.' && fail "$c: a temporary was left"
			# shellcheck disable=SC2086
			run $c -o "$o" --force
			expect_rc 0
			[ -f "$o" ] && [ ! -L "$o" ] || fail "$c --force: $o is not the new file"
			[ "$(head -c 4 "$o")" != keep ] || fail "$c --force: $o not replaced"
		done
	done
	# replaced whole: synth's checkpoint written over the symlink is good
	"$ARENA" convert -q "$T/link.x" -o "$T/again.arena" || fail "the replaced checkpoint does not convert"
	# the output is an input: that error, not 'exists'
	run convert "$REF/tiny_flux.safetensors" -o "$REF/tiny_flux.safetensors"
	expect_rc 2
	expect_err "is an input"
	for c in convert export synth; do
		run "$c" --help
		expect_out "--force"
	done
}
cases files_existing_output_needs_force
