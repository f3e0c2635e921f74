"""The opt-in int8 ``lm_head`` (``convert(model, lm_head="int8")``): the op and its quantizer.

    awq::int8_linear(Tensor x, Tensor weight, Tensor scales, Tensor? bias) -> Tensor

``weight`` int8 [N, K] (per output channel, symmetric: ``round(w / s)`` clamped to +-127),
``scales`` fp32 [N] (``max |w[n]| / 127``), ``bias`` fp32 [N] or None; ``x`` [M, K] bf16, fp16 or
fp32; returns ``quantize_x(x) @ (weight * scales[:, None]).T (+ bias)`` in x's dtype, where
:func:`quantize_x` rounds each group of :data:`X_GROUP` k of a row to int8 with its own scale
(``max |x_g| / 127``; llama.cpp's Q8 activations do the same in blocks of 32): W8A8, so the GEMV is
one VNNI dot product per 64 weights. Half the bytes of a bf16 head, and decode is memory-bound. Up
to :data:`GEMV_MAX_M` rows run our C++ GEMV (``csrc_templates/head/int8_linear.cpp.j2``: one pass
over the weights per 4 rows, :data:`KC_ONE_ROW` channels at a time for one row); more rows (a
full-sequence forward) quantize x the same way, dequantize the weight in chunks of channels and
use ``F.linear``, so prefill and decode compute the same logits.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .. import config
from ..kernels import isa as isa_mod, native
from ..kernels.native import I64, INT, VP

GEMV_MAX_M = 8
#: k per x quantization group. Why 128: the int32 sums of a group are scaled once per 128 weights
#: (a convert and an FMA per two vpdpbusd), and the error stays that of a per-group int8 x.
X_GROUP = 128
_CHUNK = 4096  # channels dequantized at a time for M > GEMV_MAX_M (32 MiB fp32 at K = 2048)
SCHEMA = "(Tensor x, Tensor weight, Tensor scales, Tensor? bias) -> Tensor"


def quantize_per_channel(w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (any float dtype) -> (int8 [N, K], fp32 scales [N]); all-zero channels get scale 1."""
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"weight: expected a floating [N, K] tensor, got {w.dtype} {list(w.shape)}")
    wf = w.detach().to(torch.float32)
    amax = wf.abs().amax(dim=1)
    if not torch.isfinite(amax).all():
        bad = int((~torch.isfinite(amax)).nonzero()[0])
        raise ValueError(f"weight: channel {bad} has NaN/Inf values; cannot quantize to int8")
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(wf / s[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, s


def check_args(x, weight, scales, bias) -> None:
    """ValueError naming the tensor, the expected and the actual value (works on fake tensors)."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32) or x.dim() != 2:
        raise ValueError(f"x: expected a bf16/fp16/fp32 [M, K] tensor, got {x.dtype} {list(x.shape)}")
    if weight.dtype != torch.int8 or weight.dim() != 2:
        raise ValueError(f"weight: expected int8 [N, K], got {weight.dtype} {list(weight.shape)}")
    N, K = weight.shape
    if x.shape[1] != K:
        raise ValueError(f"x: expected last dim K={K} (weight {list(weight.shape)}), got {x.shape[1]}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != (N,):
        raise ValueError(f"scales: expected float32 [{N}], got {scales.dtype} {list(scales.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (N,)):
        raise ValueError(f"bias: expected float32 [{N}], got {bias.dtype} {list(bias.shape)}")


def quantize_x(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> fp32 x as the op sees it: per row and group of :data:`X_GROUP` k,
    ``round(x * (127 / max|x_g|)) * (max|x_g| / 127)`` (the kernel's fp32 operations, in its order)."""
    M, K = x.shape
    groups = -(-K // X_GROUP)
    xg = F.pad(x.to(torch.float32), (0, groups * X_GROUP - K)).reshape(M, groups, X_GROUP)
    amax = xg.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127 / torch.where(amax > 0, amax, 1), 0)
    a = torch.round(xg * inv).clamp_(-127, 127)
    return (a * (amax / 127)).reshape(M, groups * X_GROUP)[:, :K]


#: x (fp32), M, weight, scales, y, N, K, threads
ARGS = (VP, I64, VP, VP, VP, I64, I64, INT)


#: Weight channels streamed together for one row (decode): 8 independent streams per step. Measured
#: for the fp32 kernel this one replaced (8 channels 0.67-1.05x the time of 4); kept for the VNNI one.
KC_ONE_ROW = 8
#: Whether each step also prefetches into L2 the same line of the next KC channels' rows, as the bf16
#: head (ops/head_bf16.py NEXT_GROUP_PREFETCH): M = 1, 32000 x 4096, cold, Zen 4, 0.90-0.95x the time
#: at 1 and 2 threads; M = 4 and 8 0.58x (benchmarks/results/head_prefetch_zen4_1207.md).
NEXT_GROUP_PREFETCH = 1


@functools.lru_cache(maxsize=None)
def _kernel(isa: str, kc_one_row: int = KC_ONE_ROW, next_group_prefetch: int = NEXT_GROUP_PREFETCH):
    return native.c_function("head/int8_linear.cpp.j2", "awq_int8_linear_f32", ARGS, flags=list(isa_mod.get(isa).flags),
                             isa=isa, kc1=kc_one_row, gx=X_GROUP, next_group_prefetch=next_group_prefetch)


def _gemv(x, weight, scales, kc_one_row: Optional[int] = None, isa: Optional[str] = None) -> torch.Tensor:
    isa = isa or ("avx512" if isa_mod.select().avx512_bf16 else "portable")
    M, K = x.shape
    N = weight.shape[0]
    xf = x.to(torch.float32).contiguous()
    y = torch.empty((M, N), dtype=torch.float32)
    _kernel(isa, kc_one_row or KC_ONE_ROW)(xf.data_ptr(), M, weight.data_ptr(), scales.data_ptr(), y.data_ptr(), N, K, config.threads())
    return y


def _chunked(x, weight, scales) -> torch.Tensor:
    x = quantize_x(x).to(x.dtype)  # bf16 / fp16 rows as before: a full-sequence forward's matmul
    out = []
    for n0 in range(0, weight.shape[0], _CHUNK):
        w = weight[n0:n0 + _CHUNK].to(torch.float32) * scales[n0:n0 + _CHUNK, None]
        out.append(F.linear(x, w.to(x.dtype)).to(torch.float32) if x.dtype != torch.float32 else F.linear(x, w))
    return torch.cat(out, dim=1)


def _cpu(x, weight, scales, bias):
    check_args(x, weight, scales, bias)
    if x.shape[0] == 0:
        return x.new_empty((0, weight.shape[0]))
    y = _gemv(x, weight.contiguous(), scales) if x.shape[0] <= GEMV_MAX_M else _chunked(x, weight, scales)
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


def _fake(x, weight, scales, bias):
    check_args(x, weight, scales, bias)
    return x.new_empty((x.shape[0], weight.shape[0]))


torch.library.define("awq::int8_linear", SCHEMA)
torch.library.register_fake("awq::int8_linear", _fake)
torch.library.impl("awq::int8_linear", "CPU", _cpu)


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.ops.awq.int8_linear(x, weight, scales, bias)
