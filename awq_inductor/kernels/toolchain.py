"""The C++ compiler: found once, named clearly when missing (no torch._inductor imports).

The eager kernels are built with it at first use and Inductor compiles the generated kernels with
it too, so a machine without one gets a :class:`CompilerNotFoundError` saying what is missing and
how to install it, at the first call that needs it, instead of a traceback from deep inside.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess

INSTALL_HINT = ("install g++ (Debian/Ubuntu: `apt-get install g++`; Fedora/RHEL: `dnf install gcc-c++`; "
                "conda: `conda install -c conda-forge gxx`) or point $CXX at a C++17 compiler")


class CompilerNotFoundError(RuntimeError):
    """No C++ compiler: $CXX unset (or not executable) and no g++ on PATH."""


def find_cxx():
    """$CXX if set and runnable (a name on PATH or a path), else g++ on PATH, else None."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if os.path.isfile(cxx) and os.access(cxx, os.X_OK) else None)
    return shutil.which("g++")


def require_cxx() -> str:
    cxx = find_cxx()
    if cxx:
        return cxx
    env = os.environ.get("CXX")
    what = f"$CXX={env!r} is not an executable" if env else "$CXX is unset and there is no g++ on PATH"
    raise CompilerNotFoundError(
        f"awq_inductor: no C++ compiler found ({what}). awq_inductor builds its int4 kernels with "
        f"one at first use, and torch.compile (Inductor) needs one as well: {INSTALL_HINT}.")


@functools.lru_cache(maxsize=None)
def compiler_id(cxx: str) -> str:
    """``cxx`` and the first line of ``cxx --version`` (part of the eager kernel's cache key)."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
        first = out.splitlines()[0] if out else ""
    except (OSError, subprocess.SubprocessError) as e:
        first = f"<{type(e).__name__}>"
    return f"{cxx} {first}"
