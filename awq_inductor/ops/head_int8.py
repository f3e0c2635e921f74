"""The opt-in int8 ``lm_head`` (``convert(model, lm_head="int8")``): the op and its quantizer.

    awq::int8_linear(Tensor x, Tensor weight, Tensor scales, Tensor? bias) -> Tensor

``weight`` int8 [N, K] (per output channel, symmetric: ``round(w / s)`` clamped to +-127),
``scales`` fp32 [N] (``max |w[n]| / 127``), ``bias`` fp32 [N] or None; ``x`` [M, K] bf16, fp16 or
fp32; returns ``x @ (weight * scales[:, None]).T (+ bias)`` in x's dtype. Half the bytes of a bf16
head, and decode is memory-bound. Up to :data:`GEMV_MAX_M` rows run our C++ GEMV
(``csrc_templates/head/int8_linear.cpp.j2``: one pass over the weights per 4 rows, :data:`KC_ONE_ROW`
channels at a time for one row); more rows (a
full-sequence forward) dequantize the weight in chunks of channels and use ``F.linear``.
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


#: x (fp32), M, weight, scales, y, N, K, threads
ARGS = (VP, I64, VP, VP, VP, I64, I64, INT)


#: Weight channels streamed together for one row (decode). The kernel is compute-bound per core on
#: Zen 4 (1 thread, 32000 x 4096: 13.3 ms for the int8 head's 131 MB against 14.3 ms for the bf16
#: GEMV's 262 MB: sign-extend + convert + FMA per 16 weights), so more independent streams per
#: step pay: 8 channels took 0.86x, 0.86x and 0.86x the time of 4 at 1 thread, 0.95x, 0.80x, 1.05x
#: and 0.67x at 2 threads (interleaved, 40-60 calls each, load average 2.7-6.4 from other jobs).
KC_ONE_ROW = 8


@functools.lru_cache(maxsize=None)
def _kernel(isa: str, kc_one_row: int = KC_ONE_ROW):
    return native.c_function("head/int8_linear.cpp.j2", "awq_int8_linear_f32", ARGS, flags=list(isa_mod.get(isa).flags),
                             isa=isa, kc1=kc_one_row)


def _gemv(x, weight, scales, kc_one_row: Optional[int] = None) -> torch.Tensor:
    isa = "avx512" if isa_mod.select().avx512_bf16 else "portable"
    M, K = x.shape
    N = weight.shape[0]
    xf = x.to(torch.float32).contiguous()
    y = torch.empty((M, N), dtype=torch.float32)
    _kernel(isa, kc_one_row or KC_ONE_ROW)(xf.data_ptr(), M, weight.data_ptr(), scales.data_ptr(), y.data_ptr(), N, K, config.threads())
    return y


def _chunked(x, weight, scales) -> torch.Tensor:
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
