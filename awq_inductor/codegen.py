"""C++ source generation for the int4 GEMM (shared by the eager kernel and the Inductor lowering).

Templates live in ``csrc_templates/`` (installed as ``awq_inductor.csrc_templates``):

* ``common.h.j2``        helpers (dtype conversions, AMX tile config) and the driver
  ``awq::int4_mm_driver(x, M, qweight, scales, zeros, bias, N, K, G, num_threads, store)``
* ``micro_*.h.j2``       one micro-kernel family per ISA
* ``eager_int4_mm.cpp.j2`` the standalone ``extern "C"`` entry point used by :mod:`native`

``render_header`` inlines everything the chosen ISA and activation dtype need, so a generated
source text changes whenever a template does (compile caches keyed by source stay correct).
No torch._inductor imports here.
"""
from __future__ import annotations

import functools
import hashlib
from importlib import resources
from typing import List, Optional, Union

import jinja2
import torch

from . import config

#: Rows / columns of the fp32 accumulator tile handed to ``store`` (``AWQ_TILE_M`` / ``AWQ_TILE_N``).
TILE_M = 32
TILE_N = 64

_DTYPE_NAMES = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
}
_CTYPES = {"bfloat16": "bfloat16", "float16": "half", "float32": "float"}

_AVX512_FLAGS = [
    "-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx512bf16", "-mavx512vnni",
    "-mfma", "-mf16c",
]
_AMX_FLAGS = ["-mamx-tile", "-mamx-bf16", "-mamx-int8"]
# ``#pragma GCC target`` around our AVX512 / AMX code so the inlined header compiles under any
# flag set (Inductor's AVX512 flags lack -mavx512bf16 and, without AMX on the build host, -mamx-*).
_AVX512_TARGET = "avx512f,avx512dq,avx512vl,avx512bw,avx512bf16,avx512vnni,fma,f16c"
_AMX_TARGET = "amx-tile,amx-bf16,amx-int8"


def amx_emulated(amx_emulate: Optional[bool] = None) -> bool:
    """``amx_emulate`` if given, else ``config.amx_emulation``."""
    return bool(config.amx_emulation if amx_emulate is None else amx_emulate)


def gcc_target(isa: str, amx_emulate: Optional[bool] = None) -> str:
    """Target string of the ``#pragma GCC target`` wrapping the rendered code ("" for portable)."""
    isa = _check_isa(isa)
    if isa == "portable":
        return ""
    if isa == "amx" and not amx_emulated(amx_emulate):
        return _AVX512_TARGET + "," + _AMX_TARGET
    return _AVX512_TARGET


def _dtype_name(x_dtype: Union[torch.dtype, str]) -> str:
    if isinstance(x_dtype, torch.dtype):
        if x_dtype not in _DTYPE_NAMES:
            raise ValueError(f"x_dtype: expected bfloat16, float16 or float32, got {x_dtype}")
        return _DTYPE_NAMES[x_dtype]
    name = str(x_dtype).replace("torch.", "")
    if name not in _CTYPES:
        raise ValueError(f"x_dtype: expected bfloat16, float16 or float32, got {x_dtype!r}")
    return name


def _check_isa(isa: str) -> str:
    if isa not in config.ISAS:
        raise ValueError(f"isa: expected one of {config.ISAS}, got {isa!r}")
    return isa


def dtype_ctype(dtype: torch.dtype) -> str:
    """C type name Inductor's generated code uses for ``dtype`` (``bfloat16``, ``half``, ``float``)."""
    return _CTYPES[_dtype_name(dtype)]


def template_dir():
    """The C++ templates: the installed package data ``awq_inductor.csrc_templates``, or, when the
    package runs from a source checkout (e.g. ``python -m awq_inductor`` in the repo root, where
    ``csrc_templates/`` sits beside ``awq_inductor/``), that top-level folder."""
    try:
        return resources.files("awq_inductor.csrc_templates")
    except ModuleNotFoundError:
        from pathlib import Path

        return Path(__file__).resolve().parent.parent / "csrc_templates"


_template_dir = template_dir


@functools.lru_cache(maxsize=None)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: _template_dir().joinpath(name).read_text()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _render(name: str, **kw) -> str:
    return _env().get_template(name).render(**kw)


def templates_hash() -> str:
    """sha256 over every ``*.j2`` template (name and content), in name order."""
    h = hashlib.sha256()
    files = sorted((p for p in _template_dir().iterdir() if p.name.endswith(".j2")), key=lambda p: p.name)
    for p in files:
        h.update(p.name.encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def render_header(isa: str, x_dtype: Union[torch.dtype, str], amx_emulate: Optional[bool] = None) -> str:
    """Common helpers + driver + the micro-kernels ``isa`` needs for activations of ``x_dtype``.

    ``config.amx_min_m`` and ``config.panel_min_m`` are baked in (they pick the kernels inside the driver).
    ``amx_emulate`` (default ``config.amx_emulation``): the ``AWQ_TILE_*`` macros expand to the
    scalar tile emulator instead of the ``_tile_*`` intrinsics."""
    isa = _check_isa(isa)
    dt = _dtype_name(x_dtype)
    emu = amx_emulated(amx_emulate)
    kw = dict(isa=isa, x_dtype=dt, tile_m=TILE_M, tile_n=TILE_N, amx_min_m=int(config.amx_min_m),
              panel_min_m=int(config.panel_min_m), amx_emulate=emu, gcc_target=gcc_target(isa, emu))
    parts = [_render("common.h.j2", **kw)]
    if isa == "portable":
        parts.append(_render("micro_portable.h.j2", **kw))
    else:
        parts.append(_render("micro_avx512.h.j2", **kw))
        if isa == "amx" and dt == "bfloat16":
            parts.append(_render("micro_amx_bf16.h.j2", **kw))
    return "\n".join(parts)


def render_eager(isa: str, x_dtype: Union[torch.dtype, str], amx_emulate: Optional[bool] = None) -> str:
    """Full translation unit with ``extern "C" awq_int4_mm_<dtype>(...)`` (see native.py)."""
    dt = _dtype_name(x_dtype)
    return _render("eager_int4_mm.cpp.j2", isa=_check_isa(isa), x_dtype=dt,
                   header=render_header(isa, dt, amx_emulate))


def _cpu_has(name: str) -> bool:
    fn = getattr(torch.cpu, name, None)
    if fn is None:
        fn = getattr(torch._C._cpu, name, None)
    try:
        return bool(fn()) if fn is not None else False
    except Exception:
        return False


def detect_isa() -> str:
    """``config.force_isa`` if set, else the best micro-kernel family this CPU runs."""
    if config.force_isa is not None:
        return _check_isa(config.force_isa)
    return _hardware_isa()


def _hardware_isa() -> str:
    """What this CPU and OS run (:func:`awq_inductor.isa.hardware_isa`, decided once per process)."""
    from . import isa

    return isa.hardware_isa()


def compile_flags(isa: str, amx_emulate: Optional[bool] = None) -> List[str]:
    """ISA flags (g++) the rendered code for ``isa`` needs (on top of -O3 -fopenmp etc.); no AMX
    flags when the tile instructions are emulated (``amx_emulate``, default ``config.amx_emulation``)."""
    isa = _check_isa(isa)
    if isa == "portable":
        return []
    if isa == "avx512" or amx_emulated(amx_emulate):
        return list(_AVX512_FLAGS)
    return list(_AVX512_FLAGS) + list(_AMX_FLAGS)


# ---------------------------------------------------------------------------------------------
# W4A8 (awq::int4_mm_a8): w4a8.h.j2 (driver ``awq::int4_mm_a8_driver``, activation quantization,
# portable kernel) which includes micro_vnni_int8.h.j2 / micro_amx_int8.h.j2 as the ISA needs.
# ---------------------------------------------------------------------------------------------
def render_header_a8(isa: str, x_dtype: Union[torch.dtype, str], amx_emulate: Optional[bool] = None) -> str:
    """common.h (helpers, AMX macros) + the W4A8 driver and micro-kernels for ``isa``.

    The W4A16 micro-kernels are not rendered (common.h only declares them)."""
    isa = _check_isa(isa)
    dt = _dtype_name(x_dtype)
    emu = amx_emulated(amx_emulate)
    kw = dict(isa=isa, x_dtype=dt, tile_m=TILE_M, tile_n=TILE_N, amx_min_m=int(config.amx_min_m),
              a8_amx_min_m=int(config.amx_min_m), amx_emulate=emu, gcc_target=gcc_target(isa, emu))
    return "\n".join([_render("common.h.j2", **kw), _render("w4a8.h.j2", **kw)])


def render_eager_a8(isa: str, x_dtype: Union[torch.dtype, str], amx_emulate: Optional[bool] = None) -> str:
    """Full translation unit with ``extern "C" awq_int4_mm_a8_<dtype>(...)`` (see native.py)."""
    dt = _dtype_name(x_dtype)
    return _render("eager_int4_mm_a8.cpp.j2", isa=_check_isa(isa), x_dtype=dt,
                   header=render_header_a8(isa, dt, amx_emulate))
