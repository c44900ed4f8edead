# t_options.sh - sizes and numbers on the command line: one grammar for every
# size option of every command, strict whole numbers and rates, and each
# --help that takes a SIZE says what one is. Sourced by run.sh.

# --help texts are printed as they are, not through printf.
options_help_percent() {
	run convert --help
	grep -qF '%%' "$T/out" && fail "convert --help prints a doubled percent sign"
	expect_out "75% of the bytes"
}

cases options_help_percent
