"""AutoAWQ GEMM (``version: gemm``; also the on-disk form of ``exllama`` / ``ipex``).

qweight int32 [K, N/8], qzeros int32 [K/G, N/8] (both packed along N in AWQ order), scales [K/G, N].
Nibble i of a word holds column 8c + AWQ_ORDER[i]; column j sits in nibble AWQ_REVERSE_ORDER[j]
(the order exists for the CUDA kernel's fast int4 -> fp16 trick). ``W = (q - z) * s``, never GPTQ's
``+ 1`` (AutoAWQ awq/modules/linear/gemm.py, awq/utils/packing_utils.py).
"""
from __future__ import annotations



import torch

from .base import (Canonical, AwqFormat, check_canonical, check_divisible,
                   check_tensor, nibbles_to_words, resolve_group_size, words_to_nibbles)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_gemm(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> Canonical:
    """AutoAWQ GEMM (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N]) -> canonical."""
    check_tensor("qweight", qweight, torch.int32, None)
    K, N = qweight.shape[0], qweight.shape[1] * 8
    G = resolve_group_size(group_size, K)
    ng = K // G
    check_tensor("qzeros", qzeros, torch.int32, (ng, N // 8))
    check_tensor("scales", scales, "float", (ng, N))
    rev = torch.tensor(AWQ_REVERSE_ORDER, device=qweight.device)

    def _unorder(words: torch.Tensor) -> torch.Tensor:  # [R, N/8] -> [R, N] in column order
        nib = words_to_nibbles(words).reshape(words.shape[0], N // 8, 8)
        return nib.index_select(-1, rev).reshape(words.shape[0], N)

    q = _unorder(qweight).t().contiguous()
    zeros = _unorder(qzeros).t().contiguous()
    return Canonical(q, zeros, scales.t().contiguous())


def pack_gemm(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical -> AutoAWQ GEMM (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N])."""
    N, K, G = check_canonical(q, zeros, scales, group_size)
    check_divisible("out_features", N, 8, "GEMM packs 8 output columns per int32")
    order = torch.tensor(AWQ_ORDER, device=q.device)

    def _order(t: torch.Tensor) -> torch.Tensor:  # [R, N] -> int32 [R, N/8]
        nib = t.reshape(t.shape[0], N // 8, 8).index_select(-1, order)
        return nibbles_to_words(nib.reshape(t.shape[0], N), torch.int32)

    return _order(q.t()), _order(zeros.t()), scales.t().contiguous()


class AwqGemm(AwqFormat):
    name, unpack_fn, pack_fn = "gemm", unpack_gemm, pack_gemm

    def shapes(self, K, N, G):
        ng = K // G
        return {"qweight": ((K, N // 8), torch.int32), "qzeros": ((ng, N // 8), torch.int32),
                "scales": ((ng, N), torch.float16)}

    def infer_shape(self, qweight):
        check_tensor("qweight", qweight, torch.int32, None)
        return qweight.shape[0], qweight.shape[1] * 8


    def row_slices(self, n0, n1):
        # 8 columns per int32 along N
        if n0 % 8 or n1 % 8:
            return None
        return {"qweight": (slice(None), slice(n0 // 8, n1 // 8)), "qzeros": (slice(None), slice(n0 // 8, n1 // 8)),
                "scales": (slice(None), slice(n0, n1))}

    def col_slices(self, k0, k1, G):
        return {"qweight": (slice(k0, k1),), "qzeros": (slice(k0 // G, k1 // G),), "scales": (slice(k0 // G, k1 // G),)}
