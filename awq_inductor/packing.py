"""Canonical int4 form <-> the layout our C++ kernels read.

Canonical form (what :mod:`awq_inductor.formats` produces from any checkpoint format):
    q       uint8  [N, K]      values 0..15
    zeros   uint8  [N, K/G]    values 0..15
    scales  float  [N, K/G]    checkpoint dtype (fp16, bf16 or fp32)
    W[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G]

Kernel layout (``pack_for_kernel``), N padded to ``BLOCK_N`` = 32 columns per panel:
    qweight uint8   [Np, K/2, 32]   Np = ceil(N / 32)
        For panel p and k-pair kp, the 64 values v[2*j + t] = q[32p + j, 2*kp + t]
        (j < 32 columns, t < 2: the bf16 VNNI pair order) are stored two per byte:
        byte[b] = v[b] | v[b + 32] << 4, so the low nibbles hold columns 0..15 and the
        high nibbles columns 16..31, each already in VNNI-2 order. One 32-byte load,
        widened to 16 bits and split by nibble, gives two registers of (column, k-pair)
        values ready for ``vdpbf16ps`` or for an AMX B tile.
    scales  float32 [K/G, Npad]     group-major: one panel's 32 scales are contiguous
    zeros   uint8   [K/G, Npad]     integer zeros kept, so (q - z) is exact
Padded columns have q = 0, z = 0, s = 0 and so contribute exactly zero.

Fused gate|up layout (``schemes.GATE_UP_SILU``, for ``awq::int4_mm_silu_mul``): the canonical
[gate (I rows) ; up (I rows)] weight of a gated MLP, I % 32 == 0, with its rows reordered so that
the 32-column panels alternate: panel 2p = gate columns 32p..32p+31, panel 2p+1 = up columns
32p..32p+31 (``interleave_gate_up``; the same reorder applies to zeros, scales and the fp32 bias).
Then packed exactly as above with N = 2I. Every 64-column driver tile (n_start % 64 == 0) thus
holds gate and up for the same 32 outputs [n_start / 2, n_start / 2 + 32).
"""
from __future__ import annotations

import torch

from . import formats

BLOCK_N = 32


def _check_canonical(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> int:
    """formats.check_canonical plus the kernels' even group size; returns G."""
    _, _, G = formats.check_canonical(q, zeros, scales, group_size, values=False)
    if G % 2:
        raise ValueError(f"group_size: expected an even group size, got {G}")
    return G


def _pad_rows(t: torch.Tensor, npad: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, 0, 0, npad - t.shape[0])) if npad > t.shape[0] else t


def _pack_panels(q: torch.Tensor, kstep: int) -> torch.Tensor:
    """q [N, K] -> uint8 [Np, K/kstep, 16 * kstep]: per panel and k-step, the values
    v[kstep * j + t] = q[32p + j, kstep * kk + t], two per byte: byte[b] = v[b] | v[b + half] << 4."""
    N, K = q.shape
    np_ = -(-N // BLOCK_N)
    v = _pad_rows(q, np_ * BLOCK_N).reshape(np_, BLOCK_N, K // kstep, kstep).permute(0, 2, 1, 3)
    v = v.reshape(np_, K // kstep, kstep * BLOCK_N)
    half = kstep * BLOCK_N // 2
    return (v[..., :half] | (v[..., half:] << 4)).contiguous()


def _unpack_panels(qweight: torch.Tensor, kstep: int, out_features: int) -> torch.Tensor:
    """Inverse of :func:`_pack_panels`: -> q [out_features, K]."""
    np_, kk, _ = qweight.shape
    v = torch.cat([qweight & 0xF, qweight >> 4], dim=-1)
    q = v.reshape(np_, kk, BLOCK_N, kstep).permute(0, 2, 1, 3).reshape(np_ * BLOCK_N, kk * kstep)
    return q[:out_features].contiguous()


def _group_major(t: torch.Tensor, npad: int) -> torch.Tensor:
    """[N, K/G] -> [K/G, Npad] (one panel's 32 values contiguous), padded columns zero."""
    return _pad_rows(t, npad).t().contiguous()


def pack_for_kernel(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical (q, zeros, scales) -> kernel (qweight, scales_f32, zeros_u8). See module doc."""
    _check_canonical(q, zeros, scales, group_size)
    qweight = _pack_panels(q, 2)
    npad = qweight.shape[0] * BLOCK_N
    return qweight, _group_major(scales.to(torch.float32), npad), _group_major(zeros, npad)


def unpack_from_kernel(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, out_features: int):
    """Inverse of :func:`pack_for_kernel`: -> canonical (q [N,K], zeros [N,K/G], scales fp32 [N,K/G])."""
    n = out_features
    return _unpack_panels(qweight, 2, n), zeros.t()[:n].contiguous(), scales.t()[:n].contiguous()


def quantize_canonical(w: torch.Tensor, group_size: int, scales_dtype: torch.dtype = torch.float16):
    """Float W [N, K] -> canonical (q uint8 [N, K], zeros uint8 [N, K/G], scales [N, K/G] in
    ``scales_dtype``) by AutoAWQ's ``pseudo_quantize_tensor`` formula: asymmetric per group along K,
    s = (max - min) / 15 (at least 1e-5), z = round(-min / s) in [0, 15]. The checkpoints
    :mod:`awq_inductor.testing` writes and the opt-in int4 ``lm_head`` both use it."""
    N, K = w.shape
    if K % group_size:
        raise ValueError(f"group_size: expected a divisor of K={K}, got {group_size}")
    G = group_size
    wg = w.detach().to(torch.float32).reshape(N, K // G, G)
    mx, mn = wg.amax(-1), wg.amin(-1)
    s = ((mx - mn).clamp(min=1e-5) / 15).to(scales_dtype).to(torch.float32)
    z = torch.clamp(-torch.round(mn / s), 0, 15)
    q = torch.clamp(torch.round(wg / s[..., None]) + z[..., None], 0, 15)
    return q.reshape(N, K).to(torch.uint8), z.to(torch.uint8), s.to(scales_dtype)


def dequantize_canonical(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """fp32 W [N, K] = (q - z) * s of a canonical triple (references, baselines and tests)."""
    zk = zeros.to(torch.float32).repeat_interleave(group_size, dim=1)
    sk = scales.to(torch.float32).repeat_interleave(group_size, dim=1)
    return (q.to(torch.float32) - zk) * sk


# ---------------------------------------------------------------------------------------------
# W4A8 layout (``awq::int4_mm_a8``, opt-in ``act_quant="int8"``)
# ---------------------------------------------------------------------------------------------
#: K values per VNNI-4 step of the int8 kernels (u8 x s8 -> i32 dot products of 4).
A8_KSTEP = 4


def pack_for_int8_kernel(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical (q, zeros, scales) -> W4A8 kernel (qweight, scales_f32, zeros_u8, comp_i32).

    Layout (N padded to ``BLOCK_N`` = 32 columns per panel, Np = ceil(N / 32), ng = K / G):

    ``qweight`` uint8 [Np, K/4, 64]
        For panel p and k-quad k4, the 128 values v[4*j + t] = q[32p + j, 4*k4 + t] (j < 32
        columns, t < 4: the int8 VNNI-4 order of ``vpdpbusd`` / ``tdpbusd``) are stored two per
        byte: byte[b] = v[b] | v[b + 64] << 4. The low nibbles of one 64-byte row are columns
        0..15 x 4 k, the high nibbles columns 16..31 x 4 k: after ``& 0xF`` / ``>> 4`` and the
        int8 subtraction of the zeros each half is one ``vpdpbusd`` operand, or one 64-byte row
        of an AMX int8 B tile. Weights stay 4-bit (decode reads 0.5 byte per weight).
    ``scales`` float32 [ng, Npad]   one scale per (K-block, column); K-block = group (block_k = G)
    ``zeros``  uint8   [ng, Npad]   integer zeros, subtracted in int8 in the kernel: q - z in [-15, 15]
    ``comp``   int32   [ng, Npad]   comp[g, n] = sum_{k in group g} (q[n, k] - z[n, g]), for the
        +128 offset of the u8 activations: sum_k a_u8 (q - z) - 128 * comp = sum_k a_s8 (q - z).

    block_k = G: the scale only changes at group boundaries, and the i32 partial sums cannot
    overflow (|a_u8 (q - z)| <= 255 * 15 per k, so K-blocks up to 2^31 / 3825 > 500k would fit).
    Needs G % 4 == 0. Padded columns have q = z = 0, s = 0, comp = 0.
    """
    group_size = _check_canonical(q, zeros, scales, group_size)
    if group_size % A8_KSTEP:
        raise ValueError(f"group_size: expected a multiple of {A8_KSTEP} for the W4A8 kernel, got {group_size}")
    N, K = q.shape
    qweight = _pack_panels(q, A8_KSTEP)
    npad = qweight.shape[0] * BLOCK_N
    ng = K // group_size
    d = q.to(torch.int32).reshape(N, ng, group_size) - zeros.to(torch.int32).unsqueeze(-1)
    comp = d.sum(-1, dtype=torch.int32)
    return (qweight, _group_major(scales.to(torch.float32), npad), _group_major(zeros, npad),
            _group_major(comp, npad))


def unpack_from_int8_kernel(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                            out_features: int):
    """Inverse of :func:`pack_for_int8_kernel` (``comp`` is derived, not needed):
    -> canonical (q [N, K], zeros [N, K/G], scales fp32 [N, K/G])."""
    n = out_features
    return _unpack_panels(qweight, A8_KSTEP, n), zeros.t()[:n].contiguous(), scales.t()[:n].contiguous()


# ---------------------------------------------------------------------------------------------
# Fused gate|up layout (``awq::int4_mm_silu_mul``)
# ---------------------------------------------------------------------------------------------
def check_gate_up_rows(n: int, intermediate_size: int, what: str) -> None:
    if intermediate_size <= 0 or intermediate_size % BLOCK_N:
        raise ValueError(f"intermediate_size: expected a positive multiple of {BLOCK_N}, got {intermediate_size}")
    if n != 2 * intermediate_size:
        raise ValueError(f"{what}: expected 2 * intermediate_size = {2 * intermediate_size} rows, got {n}")


def interleave_gate_up(t: torch.Tensor, intermediate_size: int) -> torch.Tensor:
    """Rows [gate (I) ; up (I)] -> 32-row panels interleaved: gate 0..31, up 0..31, gate 32..63, ...

    Works on any tensor whose first dim is 2I (q [2I, K], zeros/scales [2I, K/G], bias [2I])."""
    check_gate_up_rows(t.shape[0], intermediate_size, "t")
    rest = tuple(t.shape[1:])
    v = t.reshape(2, intermediate_size // BLOCK_N, BLOCK_N, *rest).transpose(0, 1)
    return v.reshape(2 * intermediate_size, *rest).contiguous()


def deinterleave_gate_up(t: torch.Tensor, intermediate_size: int) -> torch.Tensor:
    """Inverse of :func:`interleave_gate_up`: interleaved panels -> rows [gate ; up]."""
    check_gate_up_rows(t.shape[0], intermediate_size, "t")
    rest = tuple(t.shape[1:])
    v = t.reshape(intermediate_size // BLOCK_N, 2, BLOCK_N, *rest).transpose(0, 1)
    return v.reshape(2 * intermediate_size, *rest).contiguous()
