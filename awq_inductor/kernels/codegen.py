"""C++ source of the kernels, rendered from ``csrc_templates/`` (installed as
``awq_inductor.csrc_templates``) for one scheme, ISA and activation dtype.

    render_header(scheme, isa, x_dtype)  runtime/ (base, amx, driver) + the scheme's plan and driver
                                         + the micro-kernels the scheme lists for the ISA
    render_eager(scheme, isa, x_dtype)   entry/eager.cpp.j2 around the header: one extern "C"
                                         entry point per op of the scheme (kernels/native.py),
                                         plus the scheme's dense dequantization (runtime/dense.h.j2)

The Inductor lowering renders entry/inductor.cpp.j2 around the same header. A generated text
changes whenever a template does, so compile caches keyed by source stay correct. No
torch._inductor imports here.
"""
from __future__ import annotations

import functools
import hashlib
from importlib import resources
from pathlib import Path
from typing import Iterator, Optional, Union

import jinja2
import torch

from .. import config
from ..schemes import OP_SPECS, OPS, Scheme
from . import isa as isa_mod
from .plan import (AMX_GROUPS_MAX_M, BF16_F32_MIN_M, CXX_FIELDS, DEFAULT_DECODE_INT16, DEFAULT_DECODE_PREFETCH,
                   DEFAULT_DECODE_PREFETCH_L2, DEFAULT_NEXT_TILE_PREFETCH, DEFAULT_ROWS_PREFETCH,
                   DEFAULT_DECODE_K_STREAMS)

#: Rows / columns of the fp32 accumulator tile handed to ``store`` (``AWQ_TILE_M`` / ``AWQ_TILE_N``).
TILE_M = 32
TILE_N = 64

_CTYPES = {torch.bfloat16: "bfloat16", torch.float16: "half", torch.float32: "float"}
_RUNTIME = ("runtime/base.h.j2", "runtime/amx.h.j2", "runtime/driver.h.j2")


def dtype_name(x_dtype: Union[torch.dtype, str]) -> str:
    """``bfloat16`` | ``float16`` | ``float32`` (the suffix of the eager entry points)."""
    name = str(x_dtype).replace("torch.", "")
    if name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"x_dtype: expected bfloat16, float16 or float32, got {x_dtype!r}")
    return name


def dtype_ctype(dtype: torch.dtype) -> str:
    """C type name Inductor's generated code uses for ``dtype`` (``bfloat16``, ``half``, ``float``)."""
    return _CTYPES[getattr(torch, dtype_name(dtype))]


def template_dir():
    """The C++ templates: the installed package data ``awq_inductor.csrc_templates``, or, when the
    package runs from a source checkout (e.g. ``python -m awq_inductor`` in the repo root, where
    ``csrc_templates/`` sits beside ``awq_inductor/``), that top-level folder."""
    try:
        return resources.files("awq_inductor.csrc_templates")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "csrc_templates"


def _walk(d, prefix: str = "") -> Iterator:
    for p in sorted(d.iterdir(), key=lambda p: p.name):
        if p.is_dir():
            yield from _walk(p, f"{prefix}{p.name}/")
        elif p.name.endswith(".j2"):
            yield f"{prefix}{p.name}", p


def template_files():
    """(relative name, path) of every ``*.j2`` template, subfolders included, in name order."""
    return list(_walk(template_dir()))


def _load(name: str) -> str:
    return template_dir().joinpath(*name.split("/")).read_text()


@functools.lru_cache(maxsize=None)
def env() -> jinja2.Environment:
    """The Jinja environment of our templates (the Inductor lowering renders its entry with it too)."""
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_load), undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _render(name: str, **kw) -> str:
    return env().get_template(name).render(**kw)


def templates_hash() -> str:
    """sha256 over every ``*.j2`` template (relative name and content), in name order."""
    h = hashlib.sha256()
    for name, p in template_files():
        h.update(name.encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def render_header(scheme: Scheme, isa: str, x_dtype: Union[torch.dtype, str],
                  amx_emulate: Optional[bool] = None) -> str:
    """Runtime + the scheme's plan and driver + the micro-kernels it lists for ``isa``.

    ``config.amx_min_m``, ``config.panel_min_m``, ``plan.BF16_F32_MIN_M`` and ``plan.DEFAULT_DECODE_PREFETCH`` are baked in as the
    defaults of ``awq::Thresholds`` (they pick the kernels inside the plan). ``amx_emulate`` (default ``config.amx_emulation``): the ``AWQ_TILE_*`` macros expand to
    the scalar tile emulator instead of the ``_tile_*`` intrinsics."""
    isa = isa_mod.check(isa)
    names = _RUNTIME + (scheme.header,) + isa.micro[scheme.name]
    return "\n".join(_render(n, **_header_kwargs(isa, x_dtype, amx_emulate)) for n in names)


def render_driver_link(isa: str, x_dtype: Union[torch.dtype, str], amx_emulate: Optional[bool] = None) -> str:
    """What a generated kernel that calls a scheme's built driver (``entry/inductor.cpp.j2``) needs:
    ``runtime/base.h`` (tile sizes, conversions) and ``runtime/driver_link.h`` (the lookup)."""
    isa = isa_mod.check(isa)
    kw = _header_kwargs(isa, x_dtype, amx_emulate)
    return "\n".join(_render(n, **kw) for n in ("runtime/base.h.j2", "runtime/driver_link.h.j2"))


def _header_kwargs(isa, x_dtype, amx_emulate: Optional[bool]) -> dict:
    emu = isa_mod.amx_emulated(amx_emulate)
    return dict(isa=isa, x_dtype=dtype_name(x_dtype), tile_m=TILE_M, tile_n=TILE_N,
                amx_min_m=int(config.amx_min_m), panel_min_m=int(config.panel_min_m),
                bf16_f32_min_m=BF16_F32_MIN_M, decode_prefetch=DEFAULT_DECODE_PREFETCH,
                prefetch_next_tile=DEFAULT_NEXT_TILE_PREFETCH, decode_int16=DEFAULT_DECODE_INT16,
                decode_prefetch_l2=DEFAULT_DECODE_PREFETCH_L2, rows_prefetch=DEFAULT_ROWS_PREFETCH,
                decode_k_streams=DEFAULT_DECODE_K_STREAMS,
                amx_groups_max_m=AMX_GROUPS_MAX_M, amx_emulate=emu,
                gcc_target=isa_mod.gcc_target(isa, emu))


def render_moe_header(mop, isa: str, x_dtype: Union[torch.dtype, str], amx_emulate: Optional[bool] = None) -> str:
    """The experts loop of a :class:`~awq_inductor.schemes.MoeOp` over its scheme's header: the SiLU *
    mul epilogue and ``moe/experts.h.j2`` (to follow :func:`render_header` in one translation unit)."""
    isa = isa_mod.check(isa)
    kw = dict(isa=isa, moe=mop, scheme=mop.scheme,
              gcc_target=isa_mod.gcc_target(isa, isa_mod.amx_emulated(amx_emulate)))
    return "\n".join(_render(n, **kw) for n in ("epilogues/silu_mul.h.j2", "moe/experts.h.j2"))


def render_eager(scheme: Scheme, isa: str, x_dtype: Union[torch.dtype, str],
                 amx_emulate: Optional[bool] = None) -> str:
    """Full translation unit: ``extern "C" <op.c_entry>_<dtype>(...)`` for every op of ``scheme``."""
    ops = [OPS[scheme.op_prefix + spec.suffix] for spec in OP_SPECS]
    if scheme.row_bytes != 16 * scheme.k_per_row:  # runtime/dense.h.j2 reads panels of that shape
        raise ValueError(f"scheme {scheme.name}: runtime/dense.h needs row_bytes = 16 * k_per_row, "
                         f"got {scheme.row_bytes} and {scheme.k_per_row}")
    isa = isa_mod.check(isa)
    return _render("entry/eager.cpp.j2", scheme=scheme, ops=ops, isa=isa, x_dtype=dtype_name(x_dtype), plan_fields=CXX_FIELDS,
                   header=render_header(scheme, isa, x_dtype, amx_emulate),
                   gcc_target=isa_mod.gcc_target(isa, isa_mod.amx_emulated(amx_emulate)))
