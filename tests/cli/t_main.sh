# t_main.sh - the arena command itself: help, dispatch, usage errors.
# Sourced by run.sh; see there for the helpers.

main_help() {
	run --help
	expect_rc 0
	expect_out "usage: arena <command>"
	expect_out "inspect"
	expect_no_err
	run -h
	expect_rc 0
	expect_out "usage: arena <command>"
	run help
	expect_rc 0
	expect_out "usage: arena <command>"
}

main_no_command() {
	run
	expect_rc 2
	expect_no_out
	expect_err "usage: arena"
}

main_unknown_command() {
	run frobnicate
	expect_rc 2
	expect_no_out
	expect_err "error: 'frobnicate' is not an arena command"
}

main_version() {
	run version
	expect_rc 0
	expect_out "arena "
	run --version
	expect_rc 0
	expect_out "arena "
}

cases main_help main_no_command main_unknown_command main_version

# make demo (scripts/demo.sh) runs, and runs again over its own folder:
# its outputs exist then, and arena replaces none unasked.
main_demo_runs_twice() {
	mkdir -p "$T/b"
	ln -s "$ARENA" "$T/b/arena"
	for i in 1 2; do
		LAST_CMD="sh scripts/demo.sh $T/b (run $i)"
		sh scripts/demo.sh "$T/b" >"$T/out" 2>"$T/err"
		rc=$?
		expect_rc 0
		expect_out "demo: the round trip is byte-identical"
	done
}
cases main_demo_runs_twice
slow main_demo_runs_twice
