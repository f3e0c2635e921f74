"""AutoAWQ GEMV (``version: gemv``, awq/modules/linear/gemv.py).

qweight int32 [N, K/8] packed sequentially along K; qzeros int32 [N, zw] and scales [N, 8 zw],
padded to the zeros width ``zw`` of :func:`calculate_zeros_width` (the CUDA kernel reads whole
8/16/32-group vectors); groups >= K/G are zero padding. ``W = (q - z) * s``.
"""
from __future__ import annotations

import torch

from .base import (Canonical, AwqFormat, check_canonical, check_divisible,
                   check_tensor, nibbles_to_words, resolve_group_size, words_to_nibbles)


def calculate_zeros_width(in_features: int, group_size: int) -> int:
    """AutoAWQ gemv.py::calculate_zeros_width: int32 words per row of GEMV qzeros (padded).

    Only G in {32, 64} or G >= 128 are defined upstream (others raise NotImplementedError there,
    ValueError here)."""
    if group_size >= 128:
        mult = 1
    elif group_size == 64:
        mult = 2
    elif group_size == 32:
        mult = 4
    else:
        raise ValueError(f"group_size: expected 32, 64 or >= 128 for GEMV/GEMVFast layouts, got {group_size}")
    base = -(-(in_features // group_size) // 8)
    return -(-base // mult) * mult


def zeros_width_or_unsupported(K: int, G: int) -> int:
    """:func:`calculate_zeros_width`, as NotImplementedError for a group size the layout cannot store."""
    try:
        return calculate_zeros_width(K, G)
    except ValueError as e:
        raise NotImplementedError(str(e)) from e


def unpack_gemv(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> Canonical:
    """AutoAWQ GEMV (qweight int32 [N, K/8], qzeros int32 [N, zw], scales [N, 8zw]) -> canonical."""
    check_tensor("qweight", qweight, torch.int32, None)
    N, K = qweight.shape[0], qweight.shape[1] * 8
    G = resolve_group_size(group_size, K)
    ng = K // G
    zw = calculate_zeros_width(K, G)
    check_tensor("qzeros", qzeros, torch.int32, (N, zw))
    check_tensor("scales", scales, "float", (N, zw * 8))
    q = words_to_nibbles(qweight)
    zeros = words_to_nibbles(qzeros)[:, :ng].contiguous()
    return Canonical(q, zeros, scales[:, :ng].contiguous())


def pack_gemv(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical -> AutoAWQ GEMV, re-creating the zero padding of qzeros and scales."""
    N, K, G = check_canonical(q, zeros, scales, group_size)
    check_divisible("in_features", K, 8, "GEMV packs 8 input channels per int32")
    ng = K // G
    zw = calculate_zeros_width(K, G)
    zpad = torch.zeros((N, zw * 8), dtype=torch.uint8, device=q.device)
    zpad[:, :ng] = zeros
    spad = torch.zeros((N, zw * 8), dtype=scales.dtype, device=scales.device)
    spad[:, :ng] = scales
    return nibbles_to_words(q, torch.int32), nibbles_to_words(zpad, torch.int32), spad


class AwqGemv(AwqFormat):
    name, unpack_fn, pack_fn = "gemv", unpack_gemv, pack_gemv

    def shapes(self, K, N, G):
        zw = zeros_width_or_unsupported(K, G)
        return {"qweight": ((N, K // 8), torch.int32), "qzeros": ((N, zw), torch.int32),
                "scales": ((N, zw * 8), torch.float16)}

    def infer_shape(self, qweight):
        check_tensor("qweight", qweight, torch.int32, None)
        return qweight.shape[1] * 8, qweight.shape[0]


    def row_slices(self, n0, n1):
        return {t: (slice(n0, n1),) for t in self.tensors}

    # A K split is not clean (qzeros packs 8 groups per int32 into a padded width that depends on K).
