"""Write the option lists of docs/CLI.md from the arena command's own --help.

usage: python3 scripts/cli_doc.py ARENA [OUT]

Each command's section of docs/CLI.md ends with its lists as `arena CMD --help`
prints them (``options:``, and synth's ``layouts:``), between the markers

    <!-- arena CMD --help: written by scripts/cli_doc.py -->
    ...
    <!-- end of arena CMD --help -->

This rewrites those blocks (adding a block at the end of a section that has
none) in docs/CLI.md, or writes the result to OUT. tests/cli/t_docs.sh checks
that docs/CLI.md is what this writes, and that every option in each command's
parser table is in its --help.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List

DOC = Path(__file__).resolve().parent.parent / "docs" / "CLI.md"


def commands(arena: str) -> List[str]:
    out = subprocess.run([arena, "--help"], capture_output=True, text=True, check=True).stdout
    listed = out.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def lists(arena: str, cmd: str) -> str:
    """The labelled lists of `arena CMD --help` ("options:" and the like, each to its blank line)."""
    out = subprocess.run([arena, cmd, "--help"], capture_output=True, text=True, check=True).stdout
    parts = [p for p in out.split("\n\n") if re.match(r"[a-z]+:\n", p)]
    return "\n\n".join(p.rstrip("\n") for p in parts)


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python3 scripts/cli_doc.py ARENA [OUT]")
    arena, out = sys.argv[1], Path(sys.argv[2]) if len(sys.argv) == 3 else DOC
    text = DOC.read_text(encoding="utf-8")
    for cmd in commands(arena):
        body = lists(arena, cmd)
        if not body:
            continue
        title = "bench stream" if cmd == "bench" else cmd
        begin = f"<!-- arena {cmd} --help: written by scripts/cli_doc.py -->"
        end = f"<!-- end of arena {cmd} --help -->"
        block = f"{begin}\n\n**Options**, as `arena {title} --help` lists them:\n\n```text\n{body}\n```\n{end}"
        if begin in text:
            text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, count=1, flags=re.S)
            continue
        head = re.search(r"^## `arena " + re.escape(title) + r"`.*$", text, flags=re.M)
        if not head:
            sys.exit(f"docs/CLI.md: no section '## `arena {title}`'")
        nxt = re.search(r"^## ", text[head.end():], flags=re.M)
        at = head.end() + nxt.start() if nxt else len(text)
        text = text[:at].rstrip("\n") + "\n\n" + block + "\n\n" + text[at:]
    out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
