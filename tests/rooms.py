#!/usr/bin/env python3
"""rooms.py - the library's folders include one another one way only.

    python3 tests/rooms.py [ROOT]

The library is a chain of folders (rooms), each using only those below it:

    common <- formats <- convert <- device <- engine <- runtime <- cli

Every `#include "..."` in a room's .c, .h and .cu files is resolved as the
compiler resolves it (the including file's folder first, then include/, the
build's one -I) and must land in the same room, a room below it, or
include/ (arena.h). An include of a room above, of any other file of the
tree (tests/, bench/), or of no file at all is reported with the file, the
line and the include, and the exit status is 1. The rooms the Makefile
builds the library from (LIB_SRC) must be the chain's, so that a new room
cannot be left out of it. Run by `make test-cli` (tests/cli/t_rooms.sh).
"""
import os
import re
import sys
from typing import List, Tuple

# Lowest first. convert sits below device: what runs at convert time
# (discovery, quantizers, convert, verify, inspect, export, synth) uses
# files and numbers only, never a device, so it may not include one.
ROOMS = ["common", "formats", "convert", "device", "engine", "runtime", "cli"]
LIBRARY = ROOMS[:-1]  # cli/ is the command on top, not part of libarena
SUFFIXES = (".c", ".h", ".cu")
INCLUDE = re.compile(r'^\s*#\s*include\s*(?:"([^"]+)"|<(\.\.?/[^>]+)>)')


def makefile_rooms(root: str) -> List[str]:
    """The folders the Makefile's LIB_SRC wildcard compiles."""
    with open(os.path.join(root, "Makefile"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\s*LIB_SRC\s*:=\s*\$\(wildcard\s+([^)]*)\)", line)
            if m:
                return sorted({p.split("/")[0] for p in m.group(1).split()})
    raise SystemExit("rooms: no 'LIB_SRC := $(wildcard ...)' line in %s/Makefile"
                     % root)


def where(root: str, path: str) -> str:
    """The top folder of the tree a resolved path is in ("" when outside)."""
    rel = os.path.relpath(path, root)
    if rel.startswith(".."):
        return ""
    return rel.split(os.sep)[0]


def check(root: str) -> Tuple[List[str], int, int]:
    problems: List[str] = []
    built = makefile_rooms(root)
    if built != sorted(LIBRARY):
        problems.append(
            "Makefile: LIB_SRC builds the library from %s, the chain in "
            "tests/rooms.py has %s: add the new folder to ROOMS at its place "
            "(and to docs/DESIGN.md's chain)" % (", ".join(built), ", ".join(sorted(LIBRARY))))
    files = 0
    includes = 0
    for level, room in enumerate(ROOMS):
        base = os.path.join(root, room)
        if not os.path.isdir(base):
            problems.append("%s/: no such folder; the chain in tests/rooms.py names it" % room)
            continue
        allowed = ROOMS[:level + 1]
        for dirpath, _, names in sorted(os.walk(base)):
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
                for no, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1) or m.group(2)
                    includes += 1
                    here = os.path.normpath(os.path.join(dirpath, inc))
                    there = os.path.normpath(os.path.join(root, "include", inc))
                    if os.path.isfile(here):
                        target = here
                    elif os.path.isfile(there):
                        target = there
                    else:
                        problems.append(
                            '%s:%d: #include "%s" names no file, neither next to it '
                            'nor in include/ (a system header is included with <>)'
                            % (rel, no, inc))
                        continue
                    to = where(root, target)
                    if to == "include" or to in allowed:
                        continue
                    if to in ROOMS:
                        why = "%s/ is above %s/" % (to, room)
                    else:
                        why = "%s is in no room of the library" % os.path.relpath(target, root)
                    problems.append(
                        '%s:%d: #include "%s": %s/ may include only %s and include/ (%s)'
                        % (rel, no, inc, room,
                           ", ".join(r + "/" for r in reversed(allowed)), why))
    return problems, files, includes


def main(argv: List[str]) -> int:
    if len(argv) > 2:
        print("usage: python3 tests/rooms.py [ROOT]", file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1] if len(argv) == 2 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    problems, files, includes = check(root)
    for p in problems:
        print("rooms: " + p)
    if problems:
        print("rooms: %d include(s) break the chain %s; move the code a room "
              "needs into a room below it" % (len(problems), " <- ".join(ROOMS)))
        return 1
    print("rooms: %d includes in %d files follow the chain %s"
          % (includes, files, " <- ".join(ROOMS)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
