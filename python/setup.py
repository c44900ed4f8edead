"""Build libarena.so and the arena command with the repository's Makefile and put them in the package.

`pip install ./python` (from the repository root) or `python -m build --wheel
python` run `make lib cli` in the repository (BUILD=build/python; the CUDA
backend is built when a CUDA toolkit is found, else the simulator only) and
copy build/python/libarena.so and build/python/arena into the package (the
`arena` command of the wheel runs that binary). Such a build links the
system's jansson, xxHash and zstd: it runs where those are installed. `make
wheel` builds the self-contained one (scripts/wheel.sh): it sets
ARENA_PREBUILT_LIBRARY and ARENA_PREBUILT_CLI to the files to package (no
make) and ARENA_WHEEL_PLAT to the platform tag (manylinux_2_28_x86_64). The
wheel is tagged py3-none-<platform>: the package is ctypes over the C
library, with nothing compiled against Python or torch.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # older setuptools
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class BuildWithLibrary(build_py):
    def run(self):
        # The package as the tree has it: what an earlier build left in build_lib
        # goes first (a module that became a package, arena/torch.py before
        # arena/torch/, or the package by its name before, arena/, would
        # otherwise travel in the wheel beside it).
        for old in ("arena", "arena_gpu"):
            shutil.rmtree(Path(self.build_lib) / old, ignore_errors=True)
        super().run()
        pre_lib = os.environ.get("ARENA_PREBUILT_LIBRARY")
        pre_cli = os.environ.get("ARENA_PREBUILT_CLI")
        if pre_lib:
            lib = Path(pre_lib)
            cli = Path(pre_cli) if pre_cli else None
        else:
            if not (ROOT / "Makefile").exists() or not (ROOT / "include" / "arena.h").exists():
                raise SystemExit(
                    "arena: the C sources are not beside this package (build from the repository: "
                    "pip install ./python), or set ARENA_PREBUILT_LIBRARY to a libarena.so"
                )
            build = ROOT / "build" / "python"
            jobs = str(os.cpu_count() or 2)
            subprocess.check_call(["make", "-C", str(ROOT), "-j", jobs, f"BUILD={build}", "lib", "cli"])
            lib, cli = build / "libarena.so", build / "arena"
        dst = Path(self.build_lib) / "arena_gpu"
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dst / "libarena.so")
        if cli is not None:
            (dst / "bin").mkdir(exist_ok=True)
            shutil.copy2(cli, dst / "bin" / "arena")


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", os.environ.get("ARENA_WHEEL_PLAT") or plat


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel}, distclass=BinaryDistribution)
