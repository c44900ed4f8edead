#!/bin/sh
# deps.sh - make sure the build's Debian dependencies are present.
# Probes each library with a tiny compile (headers + link). Missing ones are
# installed with apt-get when running as root; otherwise prints the exact
# command to run and fails.
set -u
CC=${CC:-cc}
missing=""
probe() { # header lib package
	printf '#include <%s>\nint main(void){return 0;}\n' "$1" |
		$CC -x c - -o /dev/null "-l$2" >/dev/null 2>&1 || missing="$missing $3"
}
command -v "$CC" >/dev/null 2>&1 || missing="$missing build-essential"
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
probe zstd.h zstd libzstd-dev
probe xxhash.h xxhash libxxhash-dev
probe jansson.h jansson libjansson-dev
probe criterion/criterion.h criterion libcriterion-dev
[ -x /usr/bin/time ] || missing="$missing time" # GNU time: the tests' peak RSS checks
[ -z "$missing" ] && exit 0

echo "arena: missing build dependencies:$missing" >&2
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "arena: installing them with apt-get" >&2
	export DEBIAN_FRONTEND=noninteractive
	# A fresh machine has no package lists until 'apt-get update' has run.
	apt-get update -qq >&2 || { echo "arena: apt-get update failed" >&2; exit 1; }
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >&2 || {
		echo "arena: apt-get install failed; run: apt-get update && apt-get install -y$missing" >&2
		exit 1
	}
	exit 0
fi
echo "arena: run: sudo apt-get update && sudo apt-get install -y$missing" >&2
exit 1
