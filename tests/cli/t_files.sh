# t_files.sh - what every command does with paths that are not plain files:
# FIFOs, devices, folders, symlink loops, unreadable files (inputs).
# Sourced by run.sh; see there for the helpers.

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

cases files_fifo_input
