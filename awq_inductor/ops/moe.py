"""The mixture-of-experts ops ``awq::int4_moe`` (W4A16) and ``awq::int4_moe_a8`` (W4A8), one per
entry of :data:`awq_inductor.schemes.MOE_OPS`:

    awq::int4_moe(Tensor x, Tensor topk_ids, Tensor topk_weights,
                  Tensor w13_qweight, Tensor w13_scales, Tensor w13_zeros,
                  Tensor w2_qweight, Tensor w2_scales, Tensor w2_zeros,
                  int group_size, int intermediate_size) -> Tensor
    awq::int4_moe_a8(... w13_comp after w13_zeros, w2_comp after w2_zeros ...)

* ``x`` [T, H] (bf16, fp16 or fp32; T may be symbolic and 0); ``topk_ids`` int32/int64 [T, k] in
  [0, E); ``topk_weights`` [T, k] floating (fp32 or x's dtype; routing stays in PyTorch).
* ``w13_*``: every expert's gate|up weight in the layout of ``awq::<scheme>_silu_mul``
  (``schemes.OPS[...silu_mul].pack``: 2I interleaved columns, K = H), stacked on a leading dim E.
* ``w2_*``: every expert's down weight in the layout of ``awq::<scheme>`` (H columns, K = I), stacked.
* Returns [T, H] in x's dtype: ``sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))``.

The kernel (``csrc_templates/moe/experts.h.j2`` around the scheme's header) sorts the
(token, slot) pairs by expert, gathers each selected expert's rows and runs the scheme's one driver
for gate|up (SiLU * mul epilogue) and down, so only selected experts' weights are read. Each of
the two GEMMs takes the per-machine plan of its shape (:func:`expert_plans`: the thresholds that
pick the kernel path from an expert's row count). The eager entry (``entry/moe_eager.cpp.j2``)
takes the plans as arguments; under ``torch.compile`` the Inductor template
(``inductor/lowering.py``, ``entry/moe_inductor.cpp.j2``) renders them into the generated code.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Callable, Optional, Tuple

import torch

from .. import config, packing
from ..kernels import codegen, isa as isa_mod, native, tuning_cache
from ..kernels.native import I64, INT, VP
from ..kernels.plan import CXX_FIELDS, Plan, default_plan
from ..schemes import MOE_OPS, MoeOp
from .int4_mm import _check_group_size, _check_x
from .tracing import on_first_trace

_IDS_DTYPES = (torch.int32, torch.int64)


def _split(mop: MoeOp, weights):
    n = len(mop.scheme.weights)
    return list(weights[:n]), list(weights[n:])


def _check_routing(x, topk_ids, topk_weights) -> None:
    if topk_ids.dtype not in _IDS_DTYPES or topk_ids.dim() != 2:
        raise ValueError(f"topk_ids: expected int32/int64 [T, k], got {topk_ids.dtype} {list(topk_ids.shape)}")
    if topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected {x.shape[0]} rows (the tokens of x), got {topk_ids.shape[0]}")
    if not topk_weights.is_floating_point() or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights: expected a floating [T, k] = {list(topk_ids.shape)} tensor, "
                         f"got {topk_weights.dtype} {list(topk_weights.shape)}")


def _check_stack(mop: MoeOp, prefix: str, weights, E: int, N: int, K: int, G: int) -> None:
    """The packed tensors of one projection of all E experts: qweight uint8 [E, Np, K/kpr, rb],
    the rest [E, K/G, Npad]."""
    s, bn = mop.scheme, packing.BLOCK_N
    np_ = -(-N // bn)
    want = (E, np_, K // s.k_per_row, s.row_bytes)
    qw = weights[0]
    if qw.dtype != torch.uint8 or tuple(qw.shape) != want:
        raise ValueError(f"{prefix}_qweight: expected uint8 {list(want)} (E experts of "
                         f"packing.{s.pack.__name__}, N={N}, K={K}), got {qw.dtype} {list(qw.shape)}")
    for spec, t in zip(s.weights[1:], weights[1:]):
        want = (E, K // G, np_ * bn)
        if t.dtype != spec.dtype or tuple(t.shape) != want:
            dt = str(spec.dtype).replace("torch.", "")
            raise ValueError(f"{prefix}_{spec.name}: expected {dt} {list(want)}, got {t.dtype} {list(t.shape)}")


def check_args(mop: MoeOp, x, topk_ids, topk_weights, *args) -> None:
    """ValueError naming the tensor, the expected and the actual value; works on fake tensors."""
    *weights, group_size, intermediate_size = args
    _check_x(x)
    _check_routing(x, topk_ids, topk_weights)
    I, bn = intermediate_size, packing.BLOCK_N
    if I <= 0 or I % bn:
        raise ValueError(f"intermediate_size: expected a positive multiple of {bn}, got {I}")
    w13, w2 = _split(mop, weights)
    if w13[0].dim() != 4:
        raise ValueError(f"w13_qweight: expected a 4-D [E, Np, K/{mop.scheme.k_per_row}, "
                         f"{mop.scheme.row_bytes}] tensor, got {list(w13[0].shape)}")
    E, H = w13[0].shape[0], x.shape[1]
    _check_group_size(group_size, H, mop.scheme.group_multiple)
    if I % group_size:
        raise ValueError(f"group_size: expected a divisor of intermediate_size={I} too (one group "
                         f"size for gate|up and down), got {group_size}")
    _check_stack(mop, "w13", w13, E, 2 * I, H, group_size)
    _check_stack(mop, "w2", w2, E, H, I, group_size)


def check_ids(topk_ids: torch.Tensor, num_experts: int) -> None:
    """Eager only (reads the values): every id in [0, E)."""
    if topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"topk_ids: expected values in [0, {num_experts}) (the experts of w13_qweight), "
                             f"got min {lo}, max {hi}")


def expert_canonical(mop: MoeOp, weights, e: int, hidden_size: int, intermediate_size: int):
    """Expert ``e`` in canonical form: ((q, z, s) of [gate ; up] [2I, H], (q, z, s) of down [H, I])."""
    w13, w2 = _split(mop, weights)
    gu = mop.w13.unpack(*(t[e] for t in w13[:3]), intermediate_size)
    down = mop.w2.unpack(*(t[e] for t in w2[:3]), hidden_size)
    return gu, down


def pack_experts(mop: MoeOp, gate_up, down, group_size: int, intermediate_size: int):
    """Stack E experts into the op's weight arguments (w13_* then w2_*). ``gate_up``: per expert a
    canonical (q, z, s) with rows [gate (I) ; up (I)] x K = H; ``down``: per expert (q, z, s) [H, I]."""
    if len(gate_up) != len(down) or not gate_up:
        raise ValueError(f"down: expected as many experts as gate_up ({len(gate_up)}), got {len(down)}")
    w13 = [mop.w13.pack(*t, group_size, intermediate_size) for t in gate_up]
    w2 = [mop.w2.pack(*t, group_size, t[0].shape[0]) for t in down]
    return [torch.stack(ts) for ts in zip(*w13)] + [torch.stack(ts) for ts in zip(*w2)]


def expert_plans(mop: MoeOp, isa: str, x_dtype: torch.dtype, hidden_size: int, intermediate_size: int,
                 group_size: int) -> Tuple[Plan, Plan]:
    """(plan of gate|up, plan of down): ``tuning_cache.plan_for`` of the dense ops with the experts' shapes,
    ``awq::<scheme>_silu_mul`` K = H, N = 2I and ``awq::<scheme>`` K = I, N = H (tuned, cached or the
    constants, as ``config.tune`` says). ``dense_min_m`` is not used: the experts op has no dense
    fallback (it would dequantize every selected expert per call)."""
    H, I, G = hidden_size, intermediate_size, group_size
    return (tuning_cache.plan_for(mop.w13, isa, x_dtype, H, I, G), tuning_cache.plan_for(mop.w2, isa, x_dtype, I, H, G))


def moe_args(n_weights: int) -> list:
    """x, T, ids, tw, k, w13..., w2..., out, E, H, I, G, threads, Thresholds of w13, of w2 (plan.CXX_FIELDS each)."""
    return [VP, I64, VP, VP, I64] + [VP] * (2 * n_weights) + [VP, I64, I64, I64, I64, INT] + [I64] * (2 * len(CXX_FIELDS))


@functools.lru_cache(maxsize=None)
def _library_path(name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> str:
    """The built (not loaded) library of one MoE op: the scheme's header, the experts loop and the
    ``extern "C"`` entry that both the eager kernel and the Inductor template call."""
    mop = MOE_OPS[name]
    header = codegen.render_header(mop.scheme, isa, x_dtype, emulate)
    kw = dict(isa=isa_mod.get(isa), x_dtype=codegen.dtype_name(x_dtype), gcc_target=isa_mod.gcc_target(isa, emulate))
    moe_header = codegen.render_moe_header(mop, isa, x_dtype, emulate)
    src = codegen.env().get_template("entry/moe_eager.cpp.j2").render(moe=mop, scheme=mop.scheme, header=header,
                                                                       moe_header=moe_header, plan_fields=CXX_FIELDS, **kw)
    return native.build(src, isa_mod.compile_flags(isa, emulate), name=f"awq_{mop.name}",
                        isa=native.isa_tag(isa, emulate))


def entry_symbol(mop: MoeOp, x_dtype: torch.dtype) -> str:
    """The ``extern "C"`` entry of ``mop`` for ``x_dtype`` (entry/moe_eager.cpp.j2)."""
    return f"{mop.c_entry}_{codegen.dtype_name(x_dtype)}"


def entry_library(mop: MoeOp, isa: str, x_dtype: torch.dtype) -> str:
    """Path of the library (built here if missing, not loaded) whose :func:`entry_symbol` the
    Inductor template calls, for the emulation setting of ``config.amx_emulation``."""
    return _library_path(mop.name, isa, x_dtype, native.emulated(isa))


@functools.lru_cache(maxsize=None)
def _library(name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> ctypes.CDLL:
    """The library of one MoE op, loaded once and kept alive (the eager kernel's)."""
    native.require_amx_permission(isa, emulate, native.uses_amx_tiles(MOE_OPS[name].scheme, x_dtype))
    return ctypes.CDLL(_library_path(name, isa, x_dtype, emulate))


@functools.lru_cache(maxsize=None)
def _kernel(name: str, isa: str, x_dtype: torch.dtype, emulate: bool) -> Callable:
    mop = MOE_OPS[name]
    fn = native.bind(_library(name, isa, x_dtype, emulate), entry_symbol(mop, x_dtype), moe_args(len(mop.scheme.weights)))

    def kernel(x, topk_ids, topk_weights, *args, plans: Optional[Tuple[Plan, Plan]] = None):
        """``plans``: (gate|up, down) thresholds (default: the constants)."""
        *weights, group_size, I = args
        p13, p2 = plans or (default_plan(), default_plan())
        T, H = x.shape
        out = torch.empty((T, H), dtype=x.dtype)
        ids = topk_ids.to(torch.int64).contiguous()
        tw = topk_weights.to(torch.float32).contiguous()
        fn(x.data_ptr(), T, ids.data_ptr(), tw.data_ptr(), ids.shape[1], *(w.data_ptr() for w in weights),
           out.data_ptr(), weights[0].shape[0], H, I, group_size, config.threads(), *p13.cxx_args(), *p2.cxx_args())
        return out

    kernel.isa = isa  # type: ignore[attr-defined]
    return kernel


def get_kernel(name: str, x_dtype: torch.dtype, isa: Optional[str] = None) -> Callable:
    """The eager kernel of ``awq::<name>`` (an int4_moe op), built once per (op, ISA, dtype, AMX
    emulation); arguments already validated, x contiguous, weights contiguous."""
    isa = isa_mod.select() if isa is None else isa_mod.check(isa)
    return _kernel(name, isa, x_dtype, native.emulated(isa))


def forget_kernels() -> None:
    _kernel.cache_clear()
    _library.cache_clear()
    _library_path.cache_clear()


def _register(mop: MoeOp) -> None:
    """``awq::<name>``: fake impl (dynamic T) and the CPU eager impl."""
    torch.library.define(f"awq::{mop.name}", mop.schema)

    def fake(x, topk_ids, topk_weights, *args):
        on_first_trace()
        check_args(mop, x, topk_ids, topk_weights, *args)
        return x.new_empty(x.shape)

    def cpu(x, topk_ids, topk_weights, *args):
        check_args(mop, x, topk_ids, topk_weights, *args)
        check_ids(topk_ids, args[0].shape[0])
        if x.shape[0] == 0:
            return x.new_empty(x.shape)
        args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        kern = get_kernel(mop.name, x.dtype)
        # the per-machine plans of the two GEMM shapes (memoised: looked up or measured once)
        plans = expert_plans(mop, kern.isa, x.dtype, x.shape[1], args[-1], args[-2])
        return kern(x.contiguous(), topk_ids, topk_weights, *args, plans=plans)

    torch.library.register_fake(f"awq::{mop.name}", fake)
    torch.library.impl(f"awq::{mop.name}", "CPU", cpu)


for _mop in MOE_OPS.values():
    _register(_mop)
