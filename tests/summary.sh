#!/bin/sh
# summary.sh - make test's last line, from what its sections left in DIR
# (BUILD/test-summary): DIR/SECTION holds what the section checked ("unit
# 410", "CLI 82", ...), written when it passed; DIR/SECTION.skipped what it
# skipped and why, written by a section that skipped all or part of its tests.
# Prints "make test: passed: A, B, ...; skipped: X; Y" ("skipped: none" when
# nothing was). Exits 1 when a section left neither (it did not run, or it
# failed before saying so).
# usage: sh tests/summary.sh DIR SECTION...
set -u
D=$1
shift
passed=
skipped=
for s in "$@"; do
	if [ -s "$D/$s" ]; then
		passed="${passed:+$passed, }$(cat "$D/$s")"
	elif ! [ -s "$D/$s.skipped" ]; then
		echo "make test: the $s section left no record in $D (it did not run, or it failed)"
		exit 1
	fi
	if [ -s "$D/$s.skipped" ]; then
		skipped="${skipped:+$skipped; }$(cat "$D/$s.skipped")"
	fi
done
echo "make test: passed: ${passed:-nothing}; skipped: ${skipped:-none}"
