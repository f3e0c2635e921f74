"""AutoAWQ GEMVFast / llm-awq TinyChat (``version: gemv_fast``; ``llm-awq``).

qweight int16 [N/4, K] (4 rows interleaved, kstride 64, a permutation inside each 32-chunk),
scales [8 zw, N] and qzeros [8 zw, N] = -s * z as floats (AutoAWQ awq/modules/linear/gemv_fast.py
``pack_intweight``, ``WQLinear_GEMVFast``). ``W = q * s + qzeros``; the integer zero is recovered
exactly (see :func:`unpack_gemv_fast`).
"""
from __future__ import annotations

import torch

from .awq_gemv import calculate_zeros_width, zeros_width_or_unsupported
from .base import (Canonical, AwqFormat, FLOATS, check_canonical, check_divisible,
                   check_tensor, nibbles_to_words, resolve_group_size, words_to_nibbles)

GEMV_FAST_INTERLEAVE = 4
GEMV_FAST_KSTRIDE = 64


def _gemv_fast_perm32() -> torch.Tensor:
    """Stored position p of each 32-chunk holds k = perm[p].

    Derived by replaying pack_intweight's two reshapes/transposes on arange(32), so it is the
    packer's permutation by construction: [0, 8, 16, 24, 1, 9, 17, 25, ...] = 8*(p%4) + p//4."""
    a = torch.arange(32)
    a = a.reshape(4, 4, 2).permute(1, 0, 2).reshape(32)
    a = a.reshape(4, 4, 2).permute(0, 2, 1).reshape(32)
    return a


_PERM32 = _gemv_fast_perm32()
_INV_PERM32 = torch.argsort(_PERM32)


def _check_dims(N: int, K: int) -> None:
    check_divisible("out_features", N, GEMV_FAST_INTERLEAVE, "GEMVFast interleaves 4 rows")
    check_divisible("in_features", K, GEMV_FAST_KSTRIDE, "GEMVFast kstride is 64")


def _exact_zeros(s: torch.Tensor, qz: torch.Tensor) -> torch.Tensor:
    """The z in 0..15 whose fp16(-(s*z)) has the stored bits (the rounded estimate round(-qz/s)
    almost always is it; an exhaustive 16-way match covers subnormal scales). If no z reproduces
    the bits (a producer that rounds differently), the clamped estimate; s == 0 gives z = 0."""
    sf = s.float()
    est = torch.where(sf != 0, torch.round(-qz.float() / torch.where(sf != 0, sf, torch.ones_like(sf))),
                      torch.zeros_like(sf)).clamp_(0, 15).to(torch.int64)
    cand = torch.arange(16, dtype=torch.float32, device=s.device)
    bits_dtype = torch.int16 if s.element_size() == 2 else torch.int32
    cand_bits = (-(sf.unsqueeze(-1) * cand)).to(s.dtype).view(bits_dtype)  # [ng, N, 16]
    match = cand_bits == qz.contiguous().view(bits_dtype).unsqueeze(-1)
    est_ok = match.gather(-1, est.unsqueeze(-1)).squeeze(-1)
    first = match.to(torch.uint8).argmax(-1)
    return torch.where(est_ok | ~match.any(-1), est, first).to(torch.uint8)


def unpack_gemv_fast(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> Canonical:
    """AutoAWQ GEMVFast / llm-awq (qweight int16 [N/4, K], scales [8zw, N], qzeros [8zw, N] = -s*z)
    -> canonical."""
    check_tensor("qweight", qweight, torch.int16, None)
    N, K = qweight.shape[0] * GEMV_FAST_INTERLEAVE, qweight.shape[1]
    _check_dims(N, K)
    G = resolve_group_size(group_size, K)
    ng = K // G
    zw = calculate_zeros_width(K, G)
    check_tensor("scales", scales, "float", (zw * 8, N))
    check_tensor("qzeros", qzeros, scales.dtype, (zw * 8, N))
    # (1) nibble i of word (row4, k) -> [N/4, K, 4]; the flat 256 values of each (row4, k-block)
    # are [r(4), kk(64)] because pack_intweight reshaped (4, 64) -> (64, 4) without transposing.
    nib = words_to_nibbles(qweight)  # [N/4, 4K]
    nib = nib.reshape(N // 4, K // 64, 4, 64).permute(0, 2, 1, 3).reshape(N, K)
    # (2) undo the within-32 permutation: stored position p holds k = PERM32[p].
    q = nib.reshape(N, K // 32, 32).index_select(-1, _INV_PERM32.to(qweight.device)).reshape(N, K)
    s = scales[:ng]
    z = _exact_zeros(s, qzeros[:ng])
    return Canonical(q.contiguous(), z.t().contiguous(), s.t().contiguous())


def pack_gemv_fast(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical -> AutoAWQ GEMVFast (qweight int16 [N/4, K], qzeros [8zw, N], scales [8zw, N]).

    As in WQLinear_GEMVFast.from_linear: qzeros = -(s.float() * z).to(s.dtype) on the real groups
    and +0.0 in the padding groups; scales padded with zeros."""
    N, K, G = check_canonical(q, zeros, scales, group_size)
    _check_dims(N, K)
    ng = K // G
    zw = calculate_zeros_width(K, G)
    t = q.reshape(N, K // 32, 32).index_select(-1, _PERM32.to(q.device))
    t = t.reshape(N // 4, 4, K // 64, 64).permute(0, 2, 1, 3).reshape(N // 4, K * 4)
    qweight = nibbles_to_words(t, torch.int16)
    spad = torch.zeros((zw * 8, N), dtype=scales.dtype, device=scales.device)
    spad[:ng] = scales.t()
    zpad = torch.zeros_like(spad)
    zpad[:ng] = -(scales.t().float() * zeros.t().float()).to(scales.dtype)
    return qweight, zpad, spad


class AwqGemvFast(AwqFormat):
    name, unpack_fn, pack_fn = "gemv_fast", unpack_gemv_fast, pack_gemv_fast

    def shapes(self, K, N, G):
        zw = zeros_width_or_unsupported(K, G)
        return {"qweight": ((N // 4, K), torch.int16), "qzeros": ((zw * 8, N), torch.float16),
                "scales": ((zw * 8, N), torch.float16)}

    def dtypes(self):
        out = super().dtypes()
        out["qweight"] = ("int16", (torch.int16,))
        out["qzeros"] = ("float16/bfloat16/float32", FLOATS)
        return out

    def infer_shape(self, qweight):
        check_tensor("qweight", qweight, torch.int16, None)
        return qweight.shape[1], qweight.shape[0] * GEMV_FAST_INTERLEAVE

    # No clean row or column slice: rows interleave by 4 and zeros/scales are padded per K.
