"""GPTQ (``quant_method: gptq``, ``checkpoint_format`` gptq = v1 or gptq_v2).

qweight int32 [K/8, N] packed sequentially along K, qzeros int32 [K/G, N/8] packed along N,
scales [K/G, N], g_idx int32 [K] (``k // G`` unless desc_act). v1 stores z - 1 per nibble; we read
z = (stored + 1) & 0xF, the inverse of the wrapping (z - 1) & 0xF packers produce for z = 0 (GPTQ
v1 kernels would read that nibble as z = 16, which is why v1 "cannot represent z = 0"). v2 stores z.
``W[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]``.
"""
from __future__ import annotations

from typing import Optional

import torch

from .base import (Canonical, CheckpointFormat, act_order_perm, check_canonical, check_divisible, check_g_idx,
                   check_tensor, invert_perm, nibbles_to_words, resolve_group_size, words_to_nibbles)

GPTQ_VERSIONS = ("gptq", "gptq_v2")


def _check_version(format: str) -> str:
    fmt = str(format).lower()
    if fmt not in GPTQ_VERSIONS:
        raise ValueError(f"format: expected one of {GPTQ_VERSIONS}, got {format!r}")
    return fmt


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                format: str = "gptq", g_idx: Optional[torch.Tensor] = None) -> Canonical:
    """GPTQ (qweight int32 [K/8, N], qzeros int32 [K/G, N/8], scales [K/G, N]) -> canonical."""
    fmt = _check_version(format)
    check_tensor("qweight", qweight, torch.int32, None)
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    G = resolve_group_size(group_size, K)
    ng = K // G
    check_divisible("out_features", N, 8, "GPTQ qzeros pack 8 output columns per int32")
    check_tensor("qzeros", qzeros, torch.int32, (ng, N // 8))
    check_tensor("scales", scales, "float", (ng, N))
    check_g_idx(g_idx, K, G)
    nib = words_to_nibbles(qweight).reshape(K // 8, N, 8)  # nibble i of qweight[r, n] = q[8r + i, n]
    q = nib.permute(1, 0, 2).reshape(N, K).contiguous()
    z = words_to_nibbles(qzeros)  # [ng, N]
    if fmt == "gptq":
        z = (z + 1) & 0xF
    return Canonical(q, z.t().contiguous(), scales.t().contiguous())


def pack_gptq(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int, format: str = "gptq"):
    """Canonical -> GPTQ (qweight int32 [K/8, N], qzeros int32 [K/G, N/8], scales [K/G, N]).

    The matching g_idx for desc_act=False is ``torch.arange(K) // G``."""
    fmt = _check_version(format)
    N, K, G = check_canonical(q, zeros, scales, group_size)
    check_divisible("in_features", K, 8, "GPTQ packs 8 input channels per int32")
    check_divisible("out_features", N, 8, "GPTQ qzeros pack 8 output columns per int32")
    nib = q.reshape(N, K // 8, 8).permute(1, 0, 2).reshape(K // 8, N * 8)
    qweight = nibbles_to_words(nib, torch.int32)
    z = zeros.t()
    if fmt == "gptq":
        z = (z - 1) & 0xF  # uint8 wraps 0 -> 255, masked to 15
    return qweight, nibbles_to_words(z.contiguous(), torch.int32), scales.t().contiguous()


class Gptq(CheckpointFormat):
    quant_method = "gptq"
    has_g_idx = True

    def __init__(self, name: str):
        self.name = self.codec = _check_version(name)  # codec: the v1 / v2 zeros convention

    def recognizes(self, qc):
        return str(qc.get("checkpoint_format", qc.get("format")) or "gptq").lower() == self.name

    def unpack_act_order(self, qweight, qzeros, scales, group_size, g_idx):
        """(canonical of ``W[:, perm]``, perm int64 [K] or None): an act-order ``g_idx`` sorted once
        at load so that every group is contiguous (:func:`~awq_inductor.formats.base.act_order_perm`)."""
        K = qweight.shape[0] * 8
        perm = act_order_perm(g_idx, K, resolve_group_size(group_size, K))
        can = self.unpack(qweight, qzeros, scales, group_size, g_idx=None)
        if perm is None:
            return can, None
        return Canonical(can.q.index_select(1, perm).contiguous(), can.zeros, can.scales), perm

    def pack_act_order(self, q, zeros, scales, group_size, perm):
        """Inverse of :meth:`unpack_act_order`: q back in the checkpoint's column order and
        ``g_idx = (k // G)[invperm]`` (the stored g_idx, bit for bit, for a stable-argsort perm)."""
        out = self.pack(q, zeros, scales, group_size)
        if perm is None:
            return out
        inv = invert_perm(perm.to(torch.int64))
        out2 = self.pack(q.index_select(1, inv).contiguous(), zeros, scales, group_size)
        out2["g_idx"] = out["g_idx"].index_select(0, inv).contiguous()
        return out2

    def quantization_config(self, group_size, modules_to_not_convert=None):
        # desc_act False: g_idx[k] == k // G; sym False: asymmetric zeros (what we write)
        return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False, "sym": False,
                "damp_percent": 0.01, "checkpoint_format": self.name, "true_sequential": True}

    def shapes(self, K, N, G):
        ng = K // G
        return {"qweight": ((K // 8, N), torch.int32), "qzeros": ((ng, N // 8), torch.int32),
                "scales": ((ng, N), torch.float16)}

    def infer_shape(self, qweight):
        check_tensor("qweight", qweight, torch.int32, None)
        return qweight.shape[0] * 8, qweight.shape[1]

    def unpack(self, qweight, qzeros, scales, group_size, g_idx=None):
        return unpack_gptq(qweight, qzeros, scales, group_size, format=self.codec, g_idx=g_idx)

    def pack(self, q, zeros, scales, group_size):
        qw, qz, sc = pack_gptq(q, zeros, scales, group_size, format=self.codec)
        G = resolve_group_size(group_size, q.shape[1])
        return {"qweight": qw, "qzeros": qz, "scales": sc, "g_idx": torch.arange(q.shape[1], dtype=torch.int32) // G}

    def row_slices(self, n0, n1):
        if n0 % 8 or n1 % 8:
            return None
        return {"qweight": (slice(None), slice(n0, n1)), "qzeros": (slice(None), slice(n0 // 8, n1 // 8)),
                "scales": (slice(None), slice(n0, n1))}

    def col_slices(self, k0, k1, G):
        if k0 % 8 or k1 % 8:
            return None
        return {"qweight": (slice(k0 // 8, k1 // 8),), "qzeros": (slice(k0 // G, k1 // G),),
                "scales": (slice(k0 // G, k1 // G),)}
