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
