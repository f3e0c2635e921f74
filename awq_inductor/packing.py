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
"""
from __future__ import annotations

import torch

BLOCK_N = 32


def _check_canonical(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> None:
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"q: expected a uint8 [N, K] tensor, got {q.dtype} {list(q.shape)}")
    N, K = q.shape
    if group_size <= 0 or K % group_size != 0:
        raise ValueError(f"group_size: expected a positive divisor of K={K}, got {group_size}")
    if group_size % 2 != 0:
        raise ValueError(f"group_size: expected an even group size, got {group_size}")
    G = K // group_size
    if zeros.dtype != torch.uint8 or tuple(zeros.shape) != (N, G):
        raise ValueError(f"zeros: expected uint8 [{N}, {G}], got {zeros.dtype} {list(zeros.shape)}")
    if not scales.is_floating_point() or tuple(scales.shape) != (N, G):
        raise ValueError(f"scales: expected a float [{N}, {G}] tensor, got {scales.dtype} {list(scales.shape)}")


def pack_for_kernel(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical (q, zeros, scales) -> kernel (qweight, scales_f32, zeros_u8). See module doc."""
    _check_canonical(q, zeros, scales, group_size)
    N, K = q.shape
    np_ = -(-N // BLOCK_N)
    npad = np_ * BLOCK_N
    pad = npad - N
    qp = torch.nn.functional.pad(q, (0, 0, 0, pad)) if pad else q
    # [Np, 32, K/2, 2] -> [Np, K/2, 32, 2] -> [Np, K/2, 64]: v[2j + t]
    v = qp.reshape(np_, BLOCK_N, K // 2, 2).permute(0, 2, 1, 3).reshape(np_, K // 2, 2 * BLOCK_N)
    qweight = (v[..., :BLOCK_N] | (v[..., BLOCK_N:] << 4)).contiguous()
    s = scales.to(torch.float32)
    z = zeros
    if pad:
        s = torch.nn.functional.pad(s, (0, 0, 0, pad))
        z = torch.nn.functional.pad(z, (0, 0, 0, pad))
    return qweight, s.t().contiguous(), z.t().contiguous()


def unpack_from_kernel(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, out_features: int):
    """Inverse of :func:`pack_for_kernel`: -> canonical (q [N,K], zeros [N,K/G], scales fp32 [N,K/G])."""
    np_, kh, bn = qweight.shape
    lo = qweight & 0xF
    hi = qweight >> 4
    v = torch.cat([lo, hi], dim=-1)  # [Np, K/2, 64]
    q = v.reshape(np_, kh, BLOCK_N, 2).permute(0, 2, 1, 3).reshape(np_ * BLOCK_N, kh * 2)
    n = out_features
    return q[:n].contiguous(), zeros.t()[:n].contiguous(), scales.t()[:n].contiguous()


def dequantize_kernel_layout(qweight, scales, zeros, group_size: int, out_features: int) -> torch.Tensor:
    """fp32 W [N, K] from the kernel layout (reference and tests only)."""
    q, z, s = unpack_from_kernel(qweight, scales, zeros, out_features)
    zk = z.repeat_interleave(group_size, dim=1).to(torch.float32)
    sk = s.repeat_interleave(group_size, dim=1).to(torch.float32)
    return (q.to(torch.float32) - zk) * sk
