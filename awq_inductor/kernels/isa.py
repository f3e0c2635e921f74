"""The micro-kernel ISAs: names, compiler flags, and the one rule that picks one for a CPU.

``amx``      AMX tiles (bf16 and int8) for many rows, AVX512 kernels otherwise
``avx512``   AVX512F/BW/VL/DQ + AVX512-BF16 + AVX512-VNNI kernels
``portable`` plain C++ (any CPU the compiler targets)

:func:`select` is the only place that maps CPU capabilities to one of those. The eager kernels
ask the CPU (:func:`hardware`); the Inductor lowering hands in the capabilities of Inductor's own
``pick_vec_isa()`` so our code compiles under Inductor's flags. ``config.force_isa`` wins over both.
"""
from __future__ import annotations

import functools
from typing import Callable, List, Optional, Tuple

import torch

from .. import config

ISAS = config.ISAS

_AVX512_FLAGS = [
    "-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx512bf16", "-mavx512vnni",
    "-mfma", "-mf16c",
]
_AMX_FLAGS = ["-mamx-tile", "-mamx-bf16", "-mamx-int8"]
# ``#pragma GCC target`` around our AVX512 / AMX code so the inlined header compiles under any
# flag set (Inductor's AVX512 flags lack -mavx512bf16 and, without AMX on the build host, -mamx-*).
_AVX512_TARGET = "avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,avx512vnni,fma,f16c"
_AMX_TARGET = "amx-tile,amx-bf16,amx-int8"

#: (has AVX512, has AMX tiles) of a CPU or of a compiler target.
Caps = Tuple[bool, bool]


def check(isa: str) -> str:
    if isa not in ISAS:
        raise ValueError(f"isa: expected one of {ISAS}, got {isa!r}")
    return isa


def amx_emulated(amx_emulate: Optional[bool] = None) -> bool:
    """``amx_emulate`` if given, else ``config.amx_emulation``."""
    return bool(config.amx_emulation if amx_emulate is None else amx_emulate)


def _cpu_has(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)
    if fn is None:
        fn = getattr(torch._C._cpu, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except Exception:
        return False


def _from_caps(caps: Caps) -> str:
    # Our AVX512 and AMX micro-kernels use AVX512-BF16 (vdpbf16ps) and VNNI: without BF16 on this
    # CPU both fall back to the portable kernels.
    avx512, amx = caps
    if not (avx512 and _cpu_has("_is_avx512_bf16_supported")):
        return "portable"
    return "amx" if amx else "avx512"


@functools.lru_cache(maxsize=None)
def hardware() -> str:
    """The best ISA this CPU runs."""
    return _from_caps((_cpu_has("_is_avx512_supported"), _cpu_has("_is_amx_tile_supported")))


def select(caps: Optional[Callable[[], Caps]] = None) -> str:
    """``config.force_isa`` if set, else the ISA of ``caps()`` (default: this CPU)."""
    if config.force_isa is not None:
        return check(config.force_isa)
    return hardware() if caps is None else _from_caps(caps())


def request_amx() -> bool:
    """Ask the OS for AMX tile permission for this process (idempotent); False if refused."""
    return bool(_cpu_has("_is_amx_tile_supported") and torch.cpu._init_amx())


def gcc_target(isa: str, amx_emulate: Optional[bool] = None) -> str:
    """Target string of the ``#pragma GCC target`` wrapping the rendered code ("" for portable)."""
    check(isa)
    if isa == "portable":
        return ""
    if isa == "amx" and not amx_emulated(amx_emulate):
        return _AVX512_TARGET + "," + _AMX_TARGET
    return _AVX512_TARGET


def compile_flags(isa: str, amx_emulate: Optional[bool] = None) -> List[str]:
    """ISA flags (g++) the rendered code for ``isa`` needs (on top of -O3 -fopenmp etc.); no AMX
    flags when the tile instructions are emulated (``amx_emulate``, default ``config.amx_emulation``)."""
    check(isa)
    if isa == "portable":
        return []
    if isa == "avx512" or amx_emulated(amx_emulate):
        return list(_AVX512_FLAGS)
    return list(_AVX512_FLAGS) + list(_AMX_FLAGS)
