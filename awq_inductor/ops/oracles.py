"""fp32 oracles of the ops: what each op computes, written plainly (tests and benchmarks; never
the user path)."""
from __future__ import annotations

import torch

from .. import packing
from ..schemes import MOE_OPS, OPS


def quantize_rows(xf: torch.Tensor) -> torch.Tensor:
    """The W4A8 kernels' per-token int8 quantization of x, dequantized again (fp32)."""
    sa = xf.abs().amax(dim=1, keepdim=True) / 127
    return torch.where(sa > 0, torch.round(xf / torch.where(sa > 0, sa, 1)).clamp(-127, 127) * sa, 0)


def int4_mm(name: str, x, *args, quantize_x: bool = False) -> torch.Tensor:
    """``awq::<name>`` (an int4_mm op): dequantize the whole weight, multiply in fp32, apply the
    op's epilogue, cast once to x's dtype. ``quantize_x`` (W4A8): apply the kernels' per-token int8
    quantization to x first (the exact W4A8 math, up to fp32 sums)."""
    op = OPS[name]
    *weights, bias, group_size, out_features = args
    q, z, s = op.unpack(*weights[:3], out_features)
    w = packing.dequantize_canonical(q, z, s, group_size)
    xf = x.to(torch.float32)
    if quantize_x:
        xf = quantize_rows(xf)
    y = xf @ w.t()
    if bias is not None:
        y = y + op.unpack_bias(bias, out_features)
    if op.spec.columns_per_output == 2:
        y = torch.nn.functional.silu(y[:, :out_features]) * y[:, out_features:]
    return y.to(x.dtype)


def moe(name: str, x, topk_ids, topk_weights, *args, quantize_x: bool = False) -> torch.Tensor:
    """``awq::<name>`` (an int4_moe op): dequantize each selected expert, run it in fp32 on its
    tokens, round the SiLU * up intermediate to x's dtype (as the kernel and the dense MLP do),
    weight, sum over top-k in fp32, cast once. ``quantize_x`` (W4A8): the kernels' per-token int8
    quantization of both GEMMs' inputs."""
    from .moe import expert_canonical

    mop = MOE_OPS[name]
    *weights, group_size, I = args
    T, H = x.shape
    out = torch.zeros(T, H, dtype=torch.float32)
    xf = x.to(torch.float32)
    for e in sorted(set(topk_ids.flatten().tolist())):
        (gq, gz, gs), (dq, dz, ds) = expert_canonical(mop, weights, e, H, I)
        w13 = packing.dequantize_canonical(gq, gz, gs, group_size)
        w2 = packing.dequantize_canonical(dq, dz, ds, group_size)
        tok, slot = torch.where(topk_ids == e)
        xe = quantize_rows(xf[tok]) if quantize_x else xf[tok]
        gu = xe @ w13.t()
        h = (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]).to(x.dtype).to(torch.float32)
        if quantize_x:
            h = quantize_rows(h)
        y = (h @ w2.t()) * topk_weights[tok, slot].to(torch.float32)[:, None]
        out.index_add_(0, tok, y)
    return out.to(x.dtype)


def int8_linear(x, weight, scales, bias) -> torch.Tensor:
    """``awq::int8_linear``: x rounded to int8 per row and group (``head_int8.quantize_x``, whose
    bounds tests/test_int8_head.py checks), times the dequantized weight, in fp32."""
    from .head_int8 import quantize_x

    y = quantize_x(x) @ (weight.float() * scales[:, None]).t()
    return (y if bias is None else y + bias).to(x.dtype)
