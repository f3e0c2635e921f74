"""The bf16 ``lm_head`` at decode (``convert(model)``'s default ``lm_head="bf16"``): our AVX512-BF16 GEMV.

    awq::bf16_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor

``weight`` bf16 [N, K] (the head's own parameter: nothing is copied, a tied embedding stays the same
tensor), ``x`` [M, K] bf16, ``bias`` [N] or None; returns ``x @ weight.T (+ bias)`` in bf16, products
exact and sums in fp32. Up to :data:`GEMV_MAX_M` rows run the C++ GEMV
(``csrc_templates/head/bf16_linear.cpp.j2``: one pass over the weight for all rows, threads on
contiguous channel ranges); more rows, or a CPU without AVX512-BF16, call ``F.linear`` (oneDNN).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F

from .. import config
from ..kernels import isa as isa_mod, native
from ..kernels.native import I64, INT, VP

#: Rows up to which the GEMV runs, measured against F.linear. Before the next-group prefetch (32000 x
#: 4096, 2 threads; benchmarks/results/bench_head_gemv_idle.md): 0.72x F.linear's time at M=1, 1.00x
#: at M=2, 1.31x at M=4, so one row. With it (same shape, cold, interleaved, two passes on Zen 4;
#: benchmarks/results/head_prefetch_zen4_1207.md): 0.58x at M=1, 0.43 / 0.70x at 2, 0.58 / 0.68x at 4,
#: 0.90 / 1.06x at 8, 1.54x at 16; the MoE routers it also serves (hot, 128 x 2048, 64 / 256 x 7168)
#: 0.31-0.92x at M = 2-4. So batched decode up to 4 rows, F.linear from 5.
GEMV_MAX_M = 4
#: Weight channels streamed together for one row: 8 gave 0.89x the time of 4 at M=1 (same run).
KC_ONE_ROW = 8
#: Whether each step also prefetches, into L2, the same line of the next KC channels' rows (the
#: thread's next step; its 8 streams of 8 KB otherwise start cold at every group). M = 1, 32000 x
#: 4096, cold, interleaved with the read probe on Zen 4 (benchmarks/results/head_prefetch_ab.py):
#: 0.78-0.92x the time without it at 2 threads (5.9-6.3 against 7.5-7.7 ms at 36-44 GB/s), 0.80x at
#: 1 thread; a prefetch 512 B or 1 KB ahead in each stream into L1 was 1.0-1.05x alone and slowed
#: the next-group one (benchmarks/results/head_prefetch_zen4_1207.md).
NEXT_GROUP_PREFETCH = 1
SCHEMA = "(Tensor x, Tensor weight, Tensor? bias) -> Tensor"


def check_args(x, weight, bias) -> None:
    """ValueError naming the tensor, the expected and the actual value (works on fake tensors)."""
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise ValueError(f"x: expected a bfloat16 [M, K] tensor, got {x.dtype} {list(x.shape)}")
    if weight.dtype != torch.bfloat16 or weight.dim() != 2:
        raise ValueError(f"weight: expected bfloat16 [N, K], got {weight.dtype} {list(weight.shape)}")
    N, K = weight.shape
    if x.shape[1] != K:
        raise ValueError(f"x: expected last dim K={K} (weight {list(weight.shape)}), got {x.shape[1]}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
        raise ValueError(f"bias: expected [{N}], got {bias.dtype} {list(bias.shape)}")


def gemv_available() -> bool:
    """The GEMV needs AVX512-BF16 (the avx512 or amx ISA); elsewhere the head stays on F.linear."""
    return isa_mod.select().avx512_bf16


#: x, M, weight, y, N, K, threads
ARGS = (VP, I64, VP, VP, I64, I64, INT)


def prebuild() -> None:
    """Build (or find in the cache) the GEMV now, not at the first decode step."""
    if gemv_available():
        _kernel()


@functools.lru_cache(maxsize=None)
def _kernel(kc_one_row: int = KC_ONE_ROW, next_group_prefetch: int = NEXT_GROUP_PREFETCH):
    avx512 = isa_mod.get("avx512")
    return native.c_function("head/bf16_linear.cpp.j2", "awq_bf16_linear", ARGS, flags=list(avx512.flags),
                             isa=avx512, kc1=kc_one_row, next_group_prefetch=next_group_prefetch)


def gemv(x: torch.Tensor, weight: torch.Tensor, kc_one_row: int = KC_ONE_ROW) -> torch.Tensor:
    """fp32 [M, N] = x @ weight.T by the C++ GEMV (x, weight contiguous bf16; M <= GEMV_MAX_M)."""
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=torch.float32)
    _kernel(kc_one_row)(x.data_ptr(), M, weight.data_ptr(), y.data_ptr(), N, K, config.threads())
    return y


def _cpu(x, weight, bias):
    check_args(x, weight, bias)
    if x.shape[0] == 0 or x.shape[0] > GEMV_MAX_M or not gemv_available():
        return F.linear(x, weight, None if bias is None else bias.to(x.dtype))
    y = gemv(x.contiguous(), weight.contiguous())
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def _fake(x, weight, bias):
    check_args(x, weight, bias)
    return x.new_empty((x.shape[0], weight.shape[0]))


torch.library.define("awq::bf16_linear", SCHEMA)
torch.library.register_fake("awq::bf16_linear", _fake)
torch.library.impl("awq::bf16_linear", "CPU", _cpu)


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.ops.awq.bf16_linear(x, weight, bias)
