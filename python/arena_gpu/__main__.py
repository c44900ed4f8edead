"""The arena command: ``arena ...`` (the wheel's console script) and ``python -m arena_gpu ...``.

Both run the binary the package ships (``arena/bin/arena``, the command the
C build makes), in place of this process: its messages, exit status and
handling of Ctrl-C are the command's own. One subcommand is the package's:
``synth-image`` (an image of any diffusers or transformers model with random
weights, ``arena_gpu.torch.synth_image``), which needs torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional


def binary() -> str:
    """The path of the arena binary the package ships (or ``ARENA_BIN``'s)."""
    env = os.environ.get("ARENA_BIN")
    if env:
        return env
    p = Path(__file__).resolve().parent / "bin" / "arena"
    if not p.exists():
        raise SystemExit(
            f"arena: the arena command is not in this package ({p} is missing): reinstall the wheel, "
            "or build it from the repository (make cli) and set ARENA_BIN to build/arena"
        )
    return str(p)


def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["synth-image"]:
        from .torch._synth import cli

        raise SystemExit(cli(args[1:]))
    exe = binary()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(exe, ["arena", *args])
    except OSError as e:
        raise SystemExit(f"arena: cannot run {exe}: {e.strerror}") from None


if __name__ == "__main__":
    main()
