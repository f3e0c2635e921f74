"""The ``awq::int4_mm`` custom op: schema, fake (meta) impl, CPU eager impl.

    awq::int4_mm(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, Tensor? bias,
                 int group_size, int out_features) -> Tensor

``x`` is [M, K] (bf16, fp16 or fp32); ``qweight``/``scales``/``zeros`` are the kernel layout of
:mod:`awq_inductor.packing`; ``bias`` is fp32 [N] or None. Returns ``x @ W.T (+ bias)`` as
[M, N] in x's dtype, with W = (q - z) * s. ``group_size`` and ``out_features`` are plain ``int``
(not SymInt): they are properties of the weights and fixed at trace time.
"""
from __future__ import annotations

import torch

from . import packing

SCHEMA = (
    "(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, Tensor? bias, "
    "int group_size, int out_features) -> Tensor"
)
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

torch.library.define("awq::int4_mm", SCHEMA)
int4_mm = torch.ops.awq.int4_mm


def check_int4_mm_args(x, qweight, scales, zeros, bias, group_size: int, out_features: int) -> None:
    """Raise ValueError naming the tensor, the expected and the actual value. Works on fake tensors
    (only static properties are compared; M may be symbolic)."""
    if x.dtype not in ACT_DTYPES:
        raise ValueError(f"x: expected dtype in (bfloat16, float16, float32), got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D [M, K] tensor, got {x.dim()}-D {list(x.shape)}")
    if qweight.dtype != torch.uint8 or qweight.dim() != 3 or qweight.shape[2] != packing.BLOCK_N:
        raise ValueError(
            f"qweight: expected uint8 [Np, K/2, {packing.BLOCK_N}] (packing.pack_for_kernel), "
            f"got {qweight.dtype} {list(qweight.shape)}")
    np_, kh = qweight.shape[0], qweight.shape[1]
    K, npad = 2 * kh, np_ * packing.BLOCK_N
    if x.shape[1] != K:
        raise ValueError(f"x: expected last dim K={K} (in_features), got {x.shape[1]}")
    if not (npad - packing.BLOCK_N < out_features <= npad):
        raise ValueError(f"out_features: expected a value in ({npad - packing.BLOCK_N}, {npad}] "
                         f"for qweight {list(qweight.shape)}, got {out_features}")
    if group_size <= 0 or K % group_size or group_size % 2:
        raise ValueError(f"group_size: expected an even divisor of K={K}, got {group_size}")
    ng = K // group_size
    if scales.dtype != torch.float32 or tuple(scales.shape) != (ng, npad):
        raise ValueError(f"scales: expected float32 [{ng}, {npad}], got {scales.dtype} {list(scales.shape)}")
    if zeros.dtype != torch.uint8 or tuple(zeros.shape) != (ng, npad):
        raise ValueError(f"zeros: expected uint8 [{ng}, {npad}], got {zeros.dtype} {list(zeros.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (out_features,)):
        raise ValueError(f"bias: expected float32 [{out_features}], got {bias.dtype} {list(bias.shape)}")


def int4_mm_reference(x, qweight, scales, zeros, bias, group_size: int, out_features: int) -> torch.Tensor:
    """Dequantize the whole weight and multiply in fp32: the test oracle, never the user path."""
    w = packing.dequantize_kernel_layout(qweight, scales, zeros, group_size, out_features)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


# ---------------------------------------------------------------------------------------------
# awq::int4_mm_silu_mul: gated-MLP gate|up projection with the SiLU(gate) * up epilogue fused
# ---------------------------------------------------------------------------------------------
#: awq::int4_mm_silu_mul(x, qweight, scales, zeros, bias, group_size, out_features) -> [M, I]
#: ``qweight``/``scales``/``zeros`` hold 2I columns, gate and up in interleaved 32-column panels
#: (:func:`packing.pack_gate_up_for_kernel`); ``bias`` is fp32 [2I] in the same interleaved order
#: (:func:`packing.interleave_gate_up`) or None; ``out_features`` is I (a multiple of 32).
#: Returns silu(x @ Wg.T + bg) * (x @ Wu.T + bu) in x's dtype, computed from the fp32 accumulators.
torch.library.define("awq::int4_mm_silu_mul", SCHEMA)
int4_mm_silu_mul = torch.ops.awq.int4_mm_silu_mul


def check_int4_mm_silu_mul_args(x, qweight, scales, zeros, bias, group_size: int, out_features: int) -> None:
    """Like :func:`check_int4_mm_args` for the fused gate|up weight of 2 * out_features columns."""
    if out_features <= 0 or out_features % packing.BLOCK_N:
        raise ValueError(f"out_features: expected a positive multiple of {packing.BLOCK_N} "
                         f"(the intermediate size I), got {out_features}")
    if qweight.dim() == 3 and qweight.shape[0] * packing.BLOCK_N != 2 * out_features:
        raise ValueError(f"qweight: expected {2 * out_features // packing.BLOCK_N} panels (2 * I = "
                         f"{2 * out_features} interleaved gate|up columns), got {list(qweight.shape)}")
    check_int4_mm_args(x, qweight, scales, zeros, bias, group_size, 2 * out_features)


def int4_mm_silu_mul_reference(x, qweight, scales, zeros, bias, group_size: int, out_features: int) -> torch.Tensor:
    """fp32 oracle: de-interleave the dequantized weight and bias, silu(gate) * up, cast once."""
    I = out_features
    w = packing.deinterleave_gate_up(
        packing.dequantize_kernel_layout(qweight, scales, zeros, group_size, 2 * I), I)
    y = x.to(torch.float32) @ w.t()
    if bias is not None:
        y = y + packing.deinterleave_gate_up(bias, I)
    return (torch.nn.functional.silu(y[:, :I]) * y[:, I:]).to(x.dtype)


# ---- W4A8: awq::int4_mm_a8 ---------------------------------------------------------------------
# Dynamic per-token int8 activations x int4 weights (opt-in, act_quant="int8"). The weights are in
# the W4A8 layout of packing.pack_for_int8_kernel: nibbles in VNNI-4 order plus integer zeros
# (subtracted in int8 in the kernel, so decode still reads 0.5 byte per weight) and the
# precomputed compensation comp = sum_{k in group} (q - z) for the +128 activation offset.
# ``zeros`` is a separate argument (not folded into ``comp``) because the kernels subtract it
# before the u8 x s8 dot product; ``comp`` is separate so the kernels never recompute it.
SCHEMA_A8 = (
    "(Tensor x, Tensor qweight, Tensor scales, Tensor zeros, Tensor comp, Tensor? bias, "
    "int group_size, int out_features) -> Tensor"
)
torch.library.define("awq::int4_mm_a8", SCHEMA_A8)
int4_mm_a8 = torch.ops.awq.int4_mm_a8


def check_int4_mm_a8_args(x, qweight, scales, zeros, comp, bias, group_size: int, out_features: int) -> None:
    """Raise ValueError naming the tensor, the expected and the actual value (fake tensors too)."""
    if x.dtype not in ACT_DTYPES:
        raise ValueError(f"x: expected dtype in (bfloat16, float16, float32), got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D [M, K] tensor, got {x.dim()}-D {list(x.shape)}")
    bn = packing.BLOCK_N
    if qweight.dtype != torch.uint8 or qweight.dim() != 3 or qweight.shape[2] != 2 * bn:
        raise ValueError(
            f"qweight: expected uint8 [Np, K/4, {2 * bn}] (packing.pack_for_int8_kernel), "
            f"got {qweight.dtype} {list(qweight.shape)}")
    np_, k4 = qweight.shape[0], qweight.shape[1]
    K, npad = 4 * k4, np_ * bn
    if x.shape[1] != K:
        raise ValueError(f"x: expected last dim K={K} (in_features), got {x.shape[1]}")
    if not (npad - bn < out_features <= npad):
        raise ValueError(f"out_features: expected a value in ({npad - bn}, {npad}] "
                         f"for qweight {list(qweight.shape)}, got {out_features}")
    if group_size <= 0 or K % group_size or group_size % packing.A8_KSTEP:
        raise ValueError(f"group_size: expected a divisor of K={K} that is a multiple of "
                         f"{packing.A8_KSTEP}, got {group_size}")
    ng = K // group_size
    if scales.dtype != torch.float32 or tuple(scales.shape) != (ng, npad):
        raise ValueError(f"scales: expected float32 [{ng}, {npad}], got {scales.dtype} {list(scales.shape)}")
    if zeros.dtype != torch.uint8 or tuple(zeros.shape) != (ng, npad):
        raise ValueError(f"zeros: expected uint8 [{ng}, {npad}], got {zeros.dtype} {list(zeros.shape)}")
    if comp.dtype != torch.int32 or tuple(comp.shape) != (ng, npad):
        raise ValueError(f"comp: expected int32 [{ng}, {npad}], got {comp.dtype} {list(comp.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (out_features,)):
        raise ValueError(f"bias: expected float32 [{out_features}], got {bias.dtype} {list(bias.shape)}")


def int4_mm_a8_reference(x, qweight, scales, zeros, comp, bias, group_size: int, out_features: int,
                         quantize_x: bool = False) -> torch.Tensor:
    """fp32 x @ ((q - z) * s).T (+ bias) from the W4A8 layout (test oracle). ``quantize_x``: apply
    the kernels' per-token int8 quantization to x first (the exact W4A8 math, up to fp32 sums)."""
    w = packing.dequantize_int8_kernel_layout(qweight, scales, zeros, group_size, out_features)
    xf = x.to(torch.float32)
    if quantize_x:
        sa = xf.abs().amax(dim=1, keepdim=True) / 127
        xf = torch.where(sa > 0, torch.round(xf / torch.where(sa > 0, sa, 1)).clamp(-127, 127) * sa, 0)
    y = xf @ w.t()
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


# ---- W4A8: awq::int4_mm_a8_silu_mul ------------------------------------------------------------
#: awq::int4_mm_a8_silu_mul(x, qweight, scales, zeros, comp, bias, group_size, out_features) -> [M, I]
#: The W4A8 twin of awq::int4_mm_silu_mul (schema of awq::int4_mm_a8): ``qweight``/``scales``/
#: ``zeros``/``comp`` hold 2I columns in the W4A8 layout, gate and up in interleaved 32-column panels
#: (:func:`packing.pack_gate_up_for_int8_kernel`); ``bias`` fp32 [2I] interleaved the same way, or
#: None; ``out_features`` is I (a multiple of 32). x is quantized per token to int8 as in int4_mm_a8;
#: returns silu(gate) * up computed from the fp32 accumulators, in x's dtype.
torch.library.define("awq::int4_mm_a8_silu_mul", SCHEMA_A8)
int4_mm_a8_silu_mul = torch.ops.awq.int4_mm_a8_silu_mul


def check_int4_mm_a8_silu_mul_args(x, qweight, scales, zeros, comp, bias, group_size: int,
                                   out_features: int) -> None:
    """Like :func:`check_int4_mm_a8_args` for the fused gate|up weight of 2 * out_features columns."""
    if out_features <= 0 or out_features % packing.BLOCK_N:
        raise ValueError(f"out_features: expected a positive multiple of {packing.BLOCK_N} "
                         f"(the intermediate size I), got {out_features}")
    if qweight.dim() == 3 and qweight.shape[0] * packing.BLOCK_N != 2 * out_features:
        raise ValueError(f"qweight: expected {2 * out_features // packing.BLOCK_N} panels (2 * I = "
                         f"{2 * out_features} interleaved gate|up columns), got {list(qweight.shape)}")
    check_int4_mm_a8_args(x, qweight, scales, zeros, comp, bias, group_size, 2 * out_features)


def int4_mm_a8_silu_mul_reference(x, qweight, scales, zeros, comp, bias, group_size: int, out_features: int,
                                  quantize_x: bool = False) -> torch.Tensor:
    """fp32 oracle: :func:`int4_mm_a8_reference` over the 2I interleaved columns (in fp32), then
    de-interleave, silu(gate) * up, cast once to x's dtype."""
    I = out_features
    y = int4_mm_a8_reference(x.to(torch.float32), qweight, scales, zeros, comp, bias, group_size, 2 * I,
                             quantize_x=quantize_x)
    y = packing.deinterleave_gate_up(y.t(), I).t()
    return (torch.nn.functional.silu(y[:, :I]) * y[:, I:]).to(x.dtype)


# ---- fake (meta) and CPU impls of the four ops -----------------------------------------------
def _register(op: str, check, kernel_getter: str) -> None:
    """Fake impl (shape [M, out_features], symbolic M welcome) and CPU eager impl (the native kernel
    built from the same templates as the lowering) of ``awq::<op>``; ``check`` validates the
    arguments with ValueErrors naming tensor, expected and actual value."""

    def fake(x, *args):
        # Tracing (torch.compile, export) is when a lowering can be needed next, and Inductor is
        # being imported anyway: register ours here so a plain torch.compile(model) uses our
        # template without the package import paying for torch._inductor. Idempotent.
        from . import lowering

        lowering.register()
        check(x, *args)
        return x.new_empty((x.shape[0], args[-1]))

    def cpu(x, *args):
        check(x, *args)
        if x.shape[0] == 0:
            return x.new_empty((0, args[-1]))
        from . import native  # compiled once per (op, ISA, dtype), cached on disk

        return getattr(native, kernel_getter)(x.dtype)(x.contiguous(), *args)

    torch.library.register_fake(f"awq::{op}", fake)
    torch.library.impl(f"awq::{op}", "CPU", cpu)


_register("int4_mm", check_int4_mm_args, "get_kernel")
_register("int4_mm_silu_mul", check_int4_mm_silu_mul_args, "get_silu_mul_kernel")
_register("int4_mm_a8", check_int4_mm_a8_args, "get_a8_kernel")
_register("int4_mm_a8_silu_mul", check_int4_mm_a8_silu_mul_args, "get_a8_silu_mul_kernel")
