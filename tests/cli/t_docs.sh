# t_docs.sh - docs/CLI.md is the full reference: every option in a command's
# parser table (its getopt_long table, the macros in it expanded by the C
# preprocessor, so the very entries the parser reads) is in the command's
# --help and in its section of docs/CLI.md, whose option lists are the
# --help's own (scripts/cli_doc.py writes them); so is every synth layout.
# Sourced by run.sh; see there for the helpers.

# The long options of the table in cli/cmd_$1.c, one a line. CLI_CPP: the
# preprocessor with the build's flags (make test-cli sets it).
table_options() {
	# shellcheck disable=SC2086
	${CLI_CPP:-${CC:-cc} -E -D_GNU_SOURCE -Iinclude} -P "cli/cmd_$1.c" 2>"$T/cpp-err" |
		grep -oE '\{ *"[a-z0-9-]+" *, *[012] *, *\(\(void \*\)0\)' | sed 's/^{ *"\([a-z0-9-]*\)".*/\1/' | sort -u
}

# The section of docs/CLI.md that documents `arena $1`: its heading to the next.
doc_section() {
	awk -v h="## \`arena $1\`" 'index($0, h) == 1 { on = 1; print; next } /^## / { on = 0 } on' docs/CLI.md
}

docs_every_option_documented() {
	run --help
	cmds=$(sed -n '/^commands:/,/^$/s/^  \([a-z]*\) .*/\1/p' "$T/out")
	[ -n "$cmds" ] || fail "arena --help lists no commands"
	total=0
	for c in $cmds; do
		table_options "$c" >"$T/opts"
		sec=$c
		[ "$c" = bench ] && sec="bench stream"
		doc_section "$sec" >"$T/doc"
		[ -s "$T/doc" ] || { fail "docs/CLI.md has no section '## \`arena $sec\`'"; continue; }
		run "$c" --help
		if grep -q '^options:' "$T/out" && [ ! -s "$T/opts" ]; then
			fail "no option table read from cli/cmd_$c.c: $(head -c 300 "$T/cpp-err")"
		fi
		for o in $(cat "$T/opts"); do
			total=$((total + 1))
			[ "$o" = help ] && continue # -h, --help: every command's, said once at the top
			grep -qE -- "--$o([^a-z0-9-]|\$)" "$T/out" || fail "arena $c --help does not say --$o"
			grep -qE -- "--$o([^a-z0-9-]|\$)" "$T/doc" || fail "docs/CLI.md, arena $sec: no --$o"
		done
	done
	# the tables were found: at least the options of convert, load, plan and bench
	[ "$total" -gt 60 ] || fail "only $total options in the parser tables: the extraction broke"
	# the option lists in docs/CLI.md are the --help's, as they are now
	python3 scripts/cli_doc.py "$ARENA" "$T/CLI.md" 2>"$T/py-err" || fail "scripts/cli_doc.py: $(cat "$T/py-err")"
	cmp -s docs/CLI.md "$T/CLI.md" ||
		fail "docs/CLI.md's option lists are not the --help's: python3 scripts/cli_doc.py build/arena rewrites them ($(diff docs/CLI.md "$T/CLI.md" | head -n 3 | tr '\n' ' '))"
	# every layout of synth
	run synth --help
	layouts=$(sed -n '/^layouts:/,/^$/s/^  \([a-z0-9-]*\) .*/\1/p' "$T/out")
	[ -n "$layouts" ] || fail "arena synth --help lists no layouts"
	doc_section synth >"$T/doc"
	for l in $layouts; do
		grep -q -- "\`$l\`" "$T/doc" || fail "docs/CLI.md, arena synth: no layout $l"
	done
}
cases docs_every_option_documented

# `make help` says what `make demo` runs: every arena command scripts/demo.sh
# runs is named on its lines; and the README's progress bar says it needs the
# package's [progress] extra (tqdm), which a plain install lacks.
docs_make_help_and_readme() {
	LAST_CMD="make -s help"
	make -s --no-print-directory help >"$T/out" 2>"$T/err"
	rc=$?
	expect_rc 0
	sed -n '/^  make demo /,/^  make [a-z]/p' "$T/out" | sed '$d' >"$T/demo"
	[ -s "$T/demo" ] || fail "make help has no 'make demo' line"
	for c in $(sed -n 's/^step "\$A" \([a-z]*\) .*/\1/p' scripts/demo.sh | sort -u); do
		grep -q "$c" "$T/demo" || fail "make help's demo lines do not name '$c', which the demo runs: $(cat "$T/demo")"
	done
	grep -q "/demo" "$T/demo" || fail "make help does not say where the demo's files go"
	grep -n 'tqdm' README.md | grep -v '\[progress\]' | grep -q . &&
		fail "README.md names a tqdm bar without the [progress] extra: $(grep -n 'tqdm' README.md | grep -v '\[progress\]')"
	:
}
cases docs_make_help_and_readme

# bench/RESULTS.md is today's figures, at most 500 lines; every link into it
# from README.md and docs/ names a heading it has (GitHub's anchor: the
# heading in lower case, punctuation dropped, spaces as hyphens); every file
# in bench/ is named in it (a harness no figure cites does not stay), every
# bench/ file it names exists, and the Makefile builds no bench/ program
# whose source is gone.
docs_results_links_and_bench() {
	LAST_CMD="docs_results_links_and_bench"
	lines=$(wc -l <bench/RESULTS.md)
	[ "$lines" -le 500 ] || fail "bench/RESULTS.md has $lines lines (at most 500: today's figures only)"
	python3 - >"$T/out" 2>"$T/err" <<'PY' || fail "$(cat "$T/out" "$T/err" | head -n 20)"
import glob, os, re, sys
bad = []
res = open("bench/RESULTS.md", encoding="utf-8").read()
def slug(h):
    h = h.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")
anchors = {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", res, re.M)}
for doc in ["README.md"] + sorted(glob.glob("docs/*.md")):
    text = open(doc, encoding="utf-8").read()
    for m in re.finditer(r"RESULTS\.md#([A-Za-z0-9_\-]+)", text):
        if m.group(1) not in anchors:
            bad.append(f"{doc}: link to RESULTS.md#{m.group(1)}: no such heading in bench/RESULTS.md")
for path in sorted(glob.glob("bench/**", recursive=True)):
    if os.path.isdir(path) or "__pycache__" in path or path == "bench/RESULTS.md":
        continue
    rel = path[len("bench/"):]
    stem = os.path.splitext(rel)[0]
    if not re.search(r"(?<![\w/])(bench/)?" + re.escape(stem) + r"(?![\w])", res):
        bad.append(f"bench/{rel}: not named in bench/RESULTS.md (a harness no figure cites leaves bench/)")
for m in re.finditer(r"bench/([\w./-]*\w)", res):
    name = m.group(1)
    if name == "RESULTS.md" or os.path.exists("bench/" + name):
        continue
    if not glob.glob("bench/" + name + ".*"):
        bad.append(f"bench/RESULTS.md names bench/{name}, which does not exist")
for m in re.finditer(r"\$\(BUILD\)/bench/([\w-]+)", open("Makefile", encoding="utf-8").read()):
    if m.group(1) != "%" and not os.path.exists(f"bench/{m.group(1)}.c"):
        bad.append(f"Makefile: $(BUILD)/bench/{m.group(1)} has no bench/{m.group(1)}.c")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}
cases docs_results_links_and_bench
