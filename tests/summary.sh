#!/bin/sh
# summary.sh - make test's last line (make check's), from what its sections left in DIR
# (BUILD/test-summary): DIR/SECTION holds what the section checked ("unit
# 410", "CLI 82", ...), written when it passed; DIR/SECTION.skipped what it
# skipped and why, written by a section that skipped all or part of its tests.
# Prints "NAME: passed: A, B, ...; skipped: X; Y" ("skipped: none" when
# nothing was; NAME "make test" unless -n says otherwise). Exits 1 when a
# section left neither (it did not run, or it failed before saying so).
# usage: sh tests/summary.sh [-n NAME] DIR SECTION...
set -u
NAME="make test"
if [ "${1:-}" = -n ]; then
	NAME=$2
	shift 2
fi
D=$1
shift
passed=
skipped=
for s in "$@"; do
	if [ -s "$D/$s" ]; then
		passed="${passed:+$passed, }$(cat "$D/$s")"
	elif ! [ -s "$D/$s.skipped" ]; then
		echo "$NAME: the $s section left no record in $D (it did not run, or it failed)"
		exit 1
	fi
	if [ -s "$D/$s.skipped" ]; then
		skipped="${skipped:+$skipped; }$(cat "$D/$s.skipped")"
	fi
done
echo "$NAME: passed: ${passed:-nothing}; skipped: ${skipped:-none}"
