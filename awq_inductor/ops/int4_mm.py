"""The ``awq::int4_mm*`` custom ops, one per entry of :data:`awq_inductor.schemes.OPS`.

    awq::<op>(Tensor x, <the scheme's weight tensors>, Tensor? bias, int group_size, int out_features)

``x`` is [M, K] (bf16, fp16 or fp32); the weights are the scheme's kernel layout
(:mod:`awq_inductor.packing`); ``bias`` is fp32 [N] (N = packed columns, in the packed order) or
None. The result is [M, out_features] in x's dtype. ``group_size`` and ``out_features`` are plain
``int`` (not SymInt): they are properties of the weights and fixed at trace time.

* ``int4_mm`` / ``int4_mm_a8``: ``x @ W.T (+ bias)``, W = (q - z) * s; the ``_a8`` (W4A8) scheme
  quantizes x per token to int8 inside the kernel and takes ``comp`` as well.
* ``int4_mm_silu_mul`` / ``int4_mm_a8_silu_mul``: the weight holds 2I interleaved gate|up columns
  and ``out_features`` is I (a multiple of 32): ``silu(x @ Wg.T + bg) * (x @ Wu.T + bu)``.
"""
from __future__ import annotations

import torch

from .. import packing
from ..kernels import dense, native, tuning_cache
from .tracing import on_first_trace
from ..schemes import OPS, Op

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_x(x) -> None:
    if x.dtype not in ACT_DTYPES:
        raise ValueError(f"x: expected dtype in (bfloat16, float16, float32), got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D [M, K] tensor, got {x.dim()}-D {list(x.shape)}")


def _check_gate_up(qweight, out_features: int) -> None:
    bn = packing.BLOCK_N
    if out_features <= 0 or out_features % bn:
        raise ValueError(f"out_features: expected a positive multiple of {bn} "
                         f"(the intermediate size I), got {out_features}")
    if qweight.dim() == 3 and qweight.shape[0] * bn != 2 * out_features:
        raise ValueError(f"qweight: expected {2 * out_features // bn} panels (2 * I = "
                         f"{2 * out_features} interleaved gate|up columns), got {list(qweight.shape)}")


def _check_group_size(group_size: int, K: int, multiple: int) -> None:
    if group_size <= 0 or K % group_size or group_size % multiple:
        what = "an even divisor" if multiple == 2 else "a divisor"
        tail = "" if multiple == 2 else f" that is a multiple of {multiple}"
        raise ValueError(f"group_size: expected {what} of K={K}{tail}, got {group_size}")


def check_args(op: Op, x, *args) -> None:
    """Raise ValueError naming the tensor, the expected and the actual value. Works on fake tensors
    (only static properties are compared; M may be symbolic)."""
    *weights, bias, group_size, out_features = args
    scheme, bn = op.scheme, packing.BLOCK_N
    qweight = weights[0]
    if op.spec.columns_per_output == 2:
        _check_gate_up(qweight, out_features)
    _check_x(x)
    if qweight.dtype != torch.uint8 or qweight.dim() != 3 or qweight.shape[2] != scheme.row_bytes:
        raise ValueError(
            f"qweight: expected uint8 [Np, K/{scheme.k_per_row}, {scheme.row_bytes}] "
            f"(packing.{scheme.pack.__name__}), got {qweight.dtype} {list(qweight.shape)}")
    K, npad = scheme.k_per_row * qweight.shape[1], qweight.shape[0] * bn
    if x.shape[1] != K:
        raise ValueError(f"x: expected last dim K={K} (in_features), got {x.shape[1]}")
    n = op.columns(out_features)
    if not (npad - bn < n <= npad):
        raise ValueError(f"out_features: expected a value in ({npad - bn}, {npad}] "
                         f"for qweight {list(qweight.shape)}, got {n}")
    _check_group_size(group_size, K, scheme.group_multiple)
    ng = K // group_size
    for spec, t in zip(scheme.weights[1:], weights[1:]):
        if t.dtype != spec.dtype or tuple(t.shape) != (ng, npad):
            dt = str(spec.dtype).replace("torch.", "")
            raise ValueError(f"{spec.name}: expected {dt} [{ng}, {npad}], got {t.dtype} {list(t.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (n,)):
        raise ValueError(f"bias: expected float32 [{n}], got {bias.dtype} {list(bias.shape)}")


def _register(op: Op) -> None:
    """Define ``awq::<op>`` with a fake impl (shape [M, out_features], symbolic M welcome) and a CPU
    eager impl (the native kernel built from the same templates as the lowering)."""
    torch.library.define(f"awq::{op.name}", op.schema)

    def fake(x, *args):
        on_first_trace()
        check_args(op, x, *args)
        return x.new_empty((x.shape[0], args[-1]))

    def cpu(x, *args):
        check_args(op, x, *args)
        if x.shape[0] == 0:
            return x.new_empty((0, args[-1]))
        kernel = native.get_kernel(op.name, x.dtype)  # compiled once per (scheme, ISA, dtype), cached on disk
        # the per-machine plan of this shape (memoised: looked up or measured on the first call)
        plan = tuning_cache.plan_for(op, kernel.isa, x.dtype, x.shape[1], args[-1], args[-2])
        if x.shape[0] >= plan.dense_min_m:
            return dense.dense_call(op, x, *args)
        return kernel(x.contiguous(), *args, plan=plan)

    torch.library.register_fake(f"awq::{op.name}", fake)
    torch.library.impl(f"awq::{op.name}", "CPU", cpu)


for _op in OPS.values():
    _register(_op)
