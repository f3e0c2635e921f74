"""Checkpoint int4 layouts <-> the one canonical form the rest of the package consumes.

Every AWQ-family layout (AutoAWQ GEMM, GEMV, GEMVFast; GPTQ v1/v2) is unpacked to

    q       uint8  [N, K]      values 0..15
    zeros   uint8  [N, K/G]    values 0..15
    scales  [N, K/G]           the checkpoint's dtype (fp16 stays fp16, so no rounding is added)
    W[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G]

with N = out_features, K = in_features, G = group size (-1 means per-channel, G = K).
:mod:`awq_inductor.packing` takes it from there, so adding a format only touches this file.

Each ``pack_*`` is the exact inverse of its ``unpack_*`` and reproduces the bits AutoAWQ 0.2.9
writes (checked against vectors produced by its ``from_linear``; see tests/data/vectors).
That lets tests prove the unpack formulas against the real packer instead of against
themselves. Bit layouts and sources: shared/design/formats.md section 2.

Implementation notes (why the code looks the way it does):
* Words are split into nibbles through a ``uint8`` view: byte b of a little-endian word holds
  nibbles 2b (low) and 2b+1 (high). This sidesteps int32/int16 sign extension entirely
  (no arithmetic shift of negative words) and works on 1-byte elements, which keeps a 7B
  layer (K=4096, N=11008) well under a second on two cores.
* Every function is vectorised; no Python loop runs over elements.
* Bad input raises ``ValueError`` naming the tensor, the expected and the actual value, because
  loaders surface these messages to users with mis-labelled checkpoints.
"""
from __future__ import annotations

import sys
from typing import Dict, Optional, Tuple

import torch

if sys.byteorder != "little":  # pragma: no cover - x86 and ARM Linux are little-endian
    raise ImportError("awq_inductor.formats assumes a little-endian host (uint8 views of int words)")

__all__ = [
    "AWQ_FORMATS",
    "AWQ_ORDER",
    "AWQ_REVERSE_ORDER",
    "FORMATS",
    "GPTQ_FORMATS",
    "calculate_zeros_width",
    "check_canonical",
    "checkpoint_shapes",
    "infer_shape",
    "pack_awq",
    "pack_gemm",
    "pack_gemv",
    "pack_gemv_fast",
    "pack_gptq",
    "resolve_group_size",
    "unpack_awq",
    "unpack_gemm",
    "unpack_gemv",
    "unpack_gemv_fast",
    "unpack_gptq",
]

AWQ_FORMATS = ("gemm", "gemv", "gemv_fast")
GPTQ_FORMATS = ("gptq", "gptq_v2")

# AutoAWQ GEMM: nibble i of a word holds column 8c + AWQ_ORDER[i]; column j sits in nibble
# AWQ_REVERSE_ORDER[j]. The order exists for the CUDA kernel's fast int4->fp16 trick.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)

# GEMVFast constants (AutoAWQ awq/modules/linear/gemv_fast.py::pack_intweight).
GEMV_FAST_INTERLEAVE = 4
GEMV_FAST_KSTRIDE = 64


def _gemv_fast_perm32() -> torch.Tensor:
    """Stored position p of each 32-chunk holds k = perm[p].

    Derived by replaying pack_intweight's two reshapes/transposes on arange(32), so it is the
    packer's permutation by construction: [0, 8, 16, 24, 1, 9, 17, 25, ...] = 8*(p%4) + p//4.
    """
    a = torch.arange(32)
    a = a.reshape(4, 4, 2).permute(1, 0, 2).reshape(32)
    a = a.reshape(4, 4, 2).permute(0, 2, 1).reshape(32)
    return a


_PERM32 = _gemv_fast_perm32()
_INV_PERM32 = torch.argsort(_PERM32)


# --------------------------------------------------------------------------- validation

def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check(name: str, t: torch.Tensor, dtype, shape) -> None:
    """dtype: a torch.dtype, or "float" for any floating dtype. shape: tuple or None (any 2-D)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype == "float":
        dtype_ok = t.is_floating_point()
        want_dtype = "floating"
    else:
        dtype_ok = t.dtype == dtype
        want_dtype = _dtype_name(dtype)
    if shape is None:
        shape_ok = t.dim() == 2
        want_shape = "2-D"
    else:
        shape_ok = tuple(t.shape) == tuple(shape)
        want_shape = _fmt_shape(shape)
    if not (dtype_ok and shape_ok):
        raise ValueError(f"{name}: expected {want_dtype} {want_shape}, got {t.dtype} {_fmt_shape(t.shape)}")


def _check_divisible(what: str, value: int, divisor: int, why: str) -> None:
    if value % divisor != 0:
        raise ValueError(f"{what}: expected a multiple of {divisor} ({why}), got {value}")


def _check_int4_range(name: str, t: torch.Tensor) -> None:
    # Values >= 16 would silently bleed into the neighbouring nibble when packed.
    if t.numel() and int(t.max()) > 15:
        raise ValueError(f"{name}: expected values 0..15, got max {int(t.max())}")


def resolve_group_size(group_size: int, in_features: int) -> int:
    """-1 (per-channel) -> K; otherwise check 0 < G and K % G == 0. Returns G."""
    group_size = int(group_size)
    if group_size == -1:
        return int(in_features)
    if group_size <= 0:
        raise ValueError(f"group_size: expected -1 or a positive integer, got {group_size}")
    if in_features % group_size != 0:
        raise ValueError(
            f"group_size: expected a divisor of in_features={in_features}, got {group_size}"
        )
    return group_size


def check_canonical(q, zeros, scales, group_size, *, values: bool = True) -> Tuple[int, int, int]:
    """Validate canonical (q, zeros, scales); return (N, K, G). ``values``: also check that q and
    zeros fit in 4 bits (a full pass over q: the checkpoint packers need it, the kernel packers,
    fed by an unpacker, do not)."""
    _check("q", q, torch.uint8, None)
    N, K = q.shape
    G = resolve_group_size(group_size, K)
    ng = K // G
    _check("zeros", zeros, torch.uint8, (N, ng))
    _check("scales", scales, "float", (N, ng))
    if values:
        _check_int4_range("q", q)
        _check_int4_range("zeros", zeros)
    return N, K, G


# --------------------------------------------------------------------------- nibble helpers

def _words_to_nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., 8W] or int16 [..., W] -> uint8 [..., 4W]; nibble i of each
    word lands at position i (sequential, least-significant nibble first)."""
    # Flatten before .view(dtype): a contiguous tensor with a size-1 dim may carry a stride
    # that .view rejects; a 1-D contiguous tensor never does.
    b = words.contiguous().reshape(-1).view(torch.uint8)  # little-endian byte order
    b = b.reshape(*words.shape[:-1], -1)  # [..., W * bytes]
    nib = torch.stack((b & 0xF, b >> 4), dim=-1)  # uint8 >> is logical: no sign issue
    return nib.reshape(*b.shape[:-1], b.shape[-1] * 2)


def _nibbles_to_words(nib: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`_words_to_nibbles`: uint8 [..., M] (values < 16) -> dtype words."""
    nib = nib.to(torch.uint8)
    b = (nib[..., 0::2] | (nib[..., 1::2] << 4)).contiguous()
    return b.reshape(-1).view(dtype).reshape(*b.shape[:-1], -1)


# --------------------------------------------------------------------------- GEMM

def unpack_gemm(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """AutoAWQ GEMM (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N]) -> canonical."""
    _check("qweight", qweight, torch.int32, None)
    K, N = qweight.shape[0], qweight.shape[1] * 8
    G = resolve_group_size(group_size, K)
    ng = K // G
    _check("qzeros", qzeros, torch.int32, (ng, N // 8))
    _check("scales", scales, "float", (ng, N))
    rev = torch.tensor(AWQ_REVERSE_ORDER, device=qweight.device)

    def _unorder(words: torch.Tensor) -> torch.Tensor:  # [R, N/8] -> [R, N] in column order
        nib = _words_to_nibbles(words).reshape(words.shape[0], N // 8, 8)
        return nib.index_select(-1, rev).reshape(words.shape[0], N)

    q = _unorder(qweight).t().contiguous()
    zeros = _unorder(qzeros).t().contiguous()
    return q, zeros, scales.t().contiguous()


def pack_gemm(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical -> AutoAWQ GEMM (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N])."""
    N, K, G = check_canonical(q, zeros, scales, group_size)
    _check_divisible("out_features", N, 8, "GEMM packs 8 output columns per int32")
    order = torch.tensor(AWQ_ORDER, device=q.device)

    def _order(t: torch.Tensor) -> torch.Tensor:  # [R, N] -> int32 [R, N/8]
        nib = t.reshape(t.shape[0], N // 8, 8).index_select(-1, order)
        return _nibbles_to_words(nib.reshape(t.shape[0], N), torch.int32)

    return _order(q.t()), _order(zeros.t()), scales.t().contiguous()


# --------------------------------------------------------------------------- GEMV

def calculate_zeros_width(in_features: int, group_size: int) -> int:
    """AutoAWQ gemv.py::calculate_zeros_width: int32 words per row of GEMV qzeros (padded).

    The padding lets the CUDA kernel read whole 8/16/32-group vectors; only G in {32, 64} or
    G >= 128 are defined upstream (others raise NotImplementedError there, ValueError here).
    """
    if group_size >= 128:
        mult = 1
    elif group_size == 64:
        mult = 2
    elif group_size == 32:
        mult = 4
    else:
        raise ValueError(
            f"group_size: expected 32, 64 or >= 128 for GEMV/GEMVFast layouts, got {group_size}"
        )
    base = -(-(in_features // group_size) // 8)
    return -(-base // mult) * mult


def unpack_gemv(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """AutoAWQ GEMV (qweight int32 [N, K/8], qzeros int32 [N, zw], scales [N, 8zw]) -> canonical.

    Groups >= K/G are zero padding and are dropped.
    """
    _check("qweight", qweight, torch.int32, None)
    N, K = qweight.shape[0], qweight.shape[1] * 8
    G = resolve_group_size(group_size, K)
    ng = K // G
    zw = calculate_zeros_width(K, G)
    _check("qzeros", qzeros, torch.int32, (N, zw))
    _check("scales", scales, "float", (N, zw * 8))
    q = _words_to_nibbles(qweight)
    zeros = _words_to_nibbles(qzeros)[:, :ng].contiguous()
    return q, zeros, scales[:, :ng].contiguous()


def pack_gemv(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical -> AutoAWQ GEMV, re-creating the zero padding of qzeros and scales."""
    N, K, G = check_canonical(q, zeros, scales, group_size)
    _check_divisible("in_features", K, 8, "GEMV packs 8 input channels per int32")
    ng = K // G
    zw = calculate_zeros_width(K, G)
    zpad = torch.zeros((N, zw * 8), dtype=torch.uint8, device=q.device)
    zpad[:, :ng] = zeros
    spad = torch.zeros((N, zw * 8), dtype=scales.dtype, device=scales.device)
    spad[:, :ng] = scales
    return _nibbles_to_words(q, torch.int32), _nibbles_to_words(zpad, torch.int32), spad


# --------------------------------------------------------------------------- GEMVFast

def _check_gemv_fast_dims(N: int, K: int) -> None:
    _check_divisible("out_features", N, GEMV_FAST_INTERLEAVE, "GEMVFast interleaves 4 rows")
    _check_divisible("in_features", K, GEMV_FAST_KSTRIDE, "GEMVFast kstride is 64")


def unpack_gemv_fast(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """AutoAWQ GEMVFast / llm-awq (qweight int16 [N/4, K], scales [8zw, N], qzeros [8zw, N] = -s*z)
    -> canonical.

    The integer zero is recovered exactly: the z in 0..15 whose fp16(-(s*z)) has the stored bits
    (the rounded estimate round(-qzeros/s) almost always is it; an exhaustive 16-way match covers
    subnormal scales). If no z reproduces the bits (a producer that rounds differently), the
    clamped estimate is used; s == 0 gives z = 0 (any z yields the same weights).
    """
    _check("qweight", qweight, torch.int16, None)
    N, K = qweight.shape[0] * GEMV_FAST_INTERLEAVE, qweight.shape[1]
    _check_gemv_fast_dims(N, K)
    G = resolve_group_size(group_size, K)
    ng = K // G
    zw = calculate_zeros_width(K, G)
    _check("scales", scales, "float", (zw * 8, N))
    _check("qzeros", qzeros, scales.dtype, (zw * 8, N))

    # (1) nibble i of word (row4, k) -> [N/4, K, 4]; the flat 256 values of each (row4, k-block)
    # are [r(4), kk(64)] because pack_intweight reshaped (4, 64) -> (64, 4) without transposing.
    nib = _words_to_nibbles(qweight)  # [N/4, 4K]
    nib = nib.reshape(N // 4, K // 64, 4, 64).permute(0, 2, 1, 3).reshape(N, K)
    # (2) undo the within-32 permutation: stored position p holds k = PERM32[p].
    q = nib.reshape(N, K // 32, 32).index_select(-1, _INV_PERM32.to(qweight.device)).reshape(N, K)

    s = scales[:ng]  # [ng, N]
    qz = qzeros[:ng]
    sf = s.float()
    est = torch.where(sf != 0, torch.round(-qz.float() / torch.where(sf != 0, sf, torch.ones_like(sf))),
                      torch.zeros_like(sf)).clamp_(0, 15).to(torch.int64)
    cand = torch.arange(16, dtype=torch.float32, device=s.device)
    bits_dtype = torch.int16 if s.element_size() == 2 else torch.int32
    cand_bits = (-(sf.unsqueeze(-1) * cand)).to(s.dtype).view(bits_dtype)  # [ng, N, 16]
    match = cand_bits == qz.contiguous().view(bits_dtype).unsqueeze(-1)
    est_ok = match.gather(-1, est.unsqueeze(-1)).squeeze(-1)
    first = match.to(torch.uint8).argmax(-1)
    z = torch.where(est_ok | ~match.any(-1), est, first)
    return q.contiguous(), z.to(torch.uint8).t().contiguous(), s.t().contiguous()


def pack_gemv_fast(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int):
    """Canonical -> AutoAWQ GEMVFast (qweight int16 [N/4, K], qzeros [8zw, N], scales [8zw, N]).

    As in WQLinear_GEMVFast.from_linear: qzeros = -(s.float() * z).to(s.dtype) on the real
    groups and +0.0 in the padding groups; scales padded with zeros.
    """
    N, K, G = check_canonical(q, zeros, scales, group_size)
    _check_gemv_fast_dims(N, K)
    ng = K // G
    zw = calculate_zeros_width(K, G)

    t = q.reshape(N, K // 32, 32).index_select(-1, _PERM32.to(q.device))
    t = t.reshape(N // 4, 4, K // 64, 64).permute(0, 2, 1, 3).reshape(N // 4, K * 4)
    qweight = _nibbles_to_words(t, torch.int16)

    spad = torch.zeros((zw * 8, N), dtype=scales.dtype, device=scales.device)
    spad[:ng] = scales.t()
    zpad = torch.zeros_like(spad)
    zpad[:ng] = -(scales.t().float() * zeros.t().float()).to(scales.dtype)
    return qweight, zpad, spad


# --------------------------------------------------------------------------- GPTQ

def _check_gptq_format(format: str) -> str:
    fmt = str(format).lower()
    if fmt not in GPTQ_FORMATS:
        raise ValueError(f"format: expected one of {GPTQ_FORMATS}, got {format!r}")
    return fmt


def _check_g_idx(g_idx: Optional[torch.Tensor], K: int, G: int) -> None:
    """Only desc_act=False (g_idx[k] == k // G) is supported: act-order would need a K permutation."""
    if g_idx is None:
        return
    if not isinstance(g_idx, torch.Tensor) or tuple(g_idx.shape) != (K,) or g_idx.is_floating_point():
        got = f"{g_idx.dtype} {_fmt_shape(g_idx.shape)}" if isinstance(g_idx, torch.Tensor) else type(g_idx).__name__
        raise ValueError(f"g_idx: expected int [{K}], got {got}")
    expected = torch.arange(K, device=g_idx.device) // G
    if not torch.equal(g_idx.to(torch.int64), expected):
        raise ValueError(
            "g_idx: expected k // group_size (desc_act=False); act-order (desc_act=True) checkpoints "
            "are not supported"
        )


def unpack_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                format: str = "gptq", g_idx: Optional[torch.Tensor] = None):
    """GPTQ (qweight int32 [K/8, N], qzeros int32 [K/G, N/8], scales [K/G, N]) -> canonical.

    "gptq" (v1) stores z - 1 per nibble; we read z = (stored + 1) & 0xF, the inverse of the
    wrapping (z - 1) & 0xF that packers produce for z = 0 (GPTQ v1 kernels would read that
    nibble as z = 16, which is why v1 "cannot represent z = 0"). "gptq_v2" stores z.
    """
    fmt = _check_gptq_format(format)
    _check("qweight", qweight, torch.int32, None)
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    G = resolve_group_size(group_size, K)
    ng = K // G
    _check_divisible("out_features", N, 8, "GPTQ qzeros pack 8 output columns per int32")
    _check("qzeros", qzeros, torch.int32, (ng, N // 8))
    _check("scales", scales, "float", (ng, N))
    _check_g_idx(g_idx, K, G)
    # nibble i of qweight[r, n] = q[8r + i, n]
    nib = _words_to_nibbles(qweight).reshape(K // 8, N, 8)
    q = nib.permute(1, 0, 2).reshape(N, K).contiguous()
    z = _words_to_nibbles(qzeros)  # [ng, N]
    if fmt == "gptq":
        z = (z + 1) & 0xF
    return q, z.t().contiguous(), scales.t().contiguous()


def pack_gptq(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int,
              format: str = "gptq"):
    """Canonical -> GPTQ (qweight int32 [K/8, N], qzeros int32 [K/G, N/8], scales [K/G, N]).

    The matching g_idx for desc_act=False is ``torch.arange(K) // G``.
    """
    fmt = _check_gptq_format(format)
    N, K, G = check_canonical(q, zeros, scales, group_size)
    _check_divisible("in_features", K, 8, "GPTQ packs 8 input channels per int32")
    _check_divisible("out_features", N, 8, "GPTQ qzeros pack 8 output columns per int32")
    nib = q.reshape(N, K // 8, 8).permute(1, 0, 2).reshape(K // 8, N * 8)
    qweight = _nibbles_to_words(nib, torch.int32)
    z = zeros.t()
    if fmt == "gptq":
        z = (z - 1) & 0xF  # uint8 wraps 0 -> 255, masked to 15
    return qweight, _nibbles_to_words(z.contiguous(), torch.int32), scales.t().contiguous()


# --------------------------------------------------------------------------- dispatch

def _check_awq_format(format: str) -> str:
    fmt = str(format).lower()
    if fmt not in AWQ_FORMATS:
        raise ValueError(f"format: expected one of {AWQ_FORMATS}, got {format!r}")
    return fmt


_UNPACK = {"gemm": unpack_gemm, "gemv": unpack_gemv, "gemv_fast": unpack_gemv_fast}
_PACK = {"gemm": pack_gemm, "gemv": pack_gemv, "gemv_fast": pack_gemv_fast}


def unpack_awq(qweight, qzeros, scales, *, group_size: int, format: str):
    """Dispatch on the checkpoint's ``version``/``format`` (gemm | gemv | gemv_fast, any case)."""
    return _UNPACK[_check_awq_format(format)](qweight, qzeros, scales, group_size)


def pack_awq(q, zeros, scales, *, group_size: int, format: str):
    """Inverse of :func:`unpack_awq`."""
    return _PACK[_check_awq_format(format)](q, zeros, scales, group_size)


def infer_shape(qweight: torch.Tensor, format: str) -> Tuple[int, int]:
    """(in_features, out_features) from a checkpoint qweight alone, so loaders can build modules.

    Formats: gemm, gemv, gemv_fast, gptq, gptq_v2 (case-insensitive).
    """
    fmt = str(format).lower()
    known = AWQ_FORMATS + GPTQ_FORMATS
    if fmt not in known:
        raise ValueError(f"format: expected one of {known}, got {format!r}")
    want = torch.int16 if fmt == "gemv_fast" else torch.int32
    _check("qweight", qweight, want, None)
    r, c = qweight.shape
    if fmt == "gemm":
        return r, c * 8
    if fmt == "gemv":
        return c * 8, r
    if fmt == "gemv_fast":
        return c, r * GEMV_FAST_INTERLEAVE
    return r * 8, c  # gptq


# --------------------------------------------------------------------------- checkpoint shapes

FORMATS = AWQ_FORMATS + GPTQ_FORMATS


def checkpoint_shapes(format: str, in_features: int, out_features: int,
                      group_size: int) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """Expected (shape, dtype) of each tensor of one int4 linear in checkpoint ``format``.
    NotImplementedError for a group size the format cannot store (GEMV zeros width)."""
    K, N = in_features, out_features
    G = resolve_group_size(group_size, K)
    ng = K // G
    if format in ("gemm",) + GPTQ_FORMATS:
        qweight = ((K, N // 8), torch.int32) if format == "gemm" else ((K // 8, N), torch.int32)
        return {"qweight": qweight, "qzeros": ((ng, N // 8), torch.int32), "scales": ((ng, N), torch.float16)}
    if format not in AWQ_FORMATS:
        raise ValueError(f"format: expected one of {FORMATS}, got {format!r}")
    try:
        zw = calculate_zeros_width(K, G)
    except ValueError as e:
        raise NotImplementedError(str(e)) from e
    if format == "gemv":
        return {"qweight": ((N, K // 8), torch.int32), "qzeros": ((N, zw), torch.int32),
                "scales": ((N, zw * 8), torch.float16)}
    return {"qweight": ((N // 4, K), torch.int16), "qzeros": ((zw * 8, N), torch.float16),
            "scales": ((zw * 8, N), torch.float16)}
