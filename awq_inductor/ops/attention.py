"""The attention ops: ``awq::decode_attention`` (one query row per sequence) and
``awq::prefill_attention`` (causal or a bool mask the same for every head), their C++ kernels
(``csrc_templates/attention/``) and the aten math they fall back to.

Decode: PyTorch's CPU flash-attention kernel is slow for one bf16 query row (2.0-2.5 ms per call
on 2 Zen 4 cores, 32 / 4 heads of 128, 512 cached tokens); :func:`decode_attention` (fp32, GQA by a
view) takes 0.12 ms and the first C++ kernel took 0.15-0.18 ms against 0.29-0.41 ms for the aten math at
540 cached tokens (interleaved). The blocked kernel since: 0.06-0.07 ms at 512 cached tokens (32 / 4 and
32 / 8 heads) with the cache in L2 / L3, 0.16-0.19 ms after a 256 MB read evicted it
(``benchmarks/results/decode_attention_ab_zen4_1207.txt``). As plain aten ops inside a compiled model,
Inductor's attention pattern pass rewrote an unmasked matmul -> softmax -> matmul into PyTorch's fp32
flash kernel with GQA (0.43-0.52 ms per call): hence opaque ops.

Prefill: PyTorch's flash kernel ran 512 causal bf16 rows, 32 / 4 heads of 128, in 31.9 ms on 2 Zen 4
cores; the C++ kernel in 7.3 ms (105 vs 325 ms at 2048 rows), interleaved.
"""
from __future__ import annotations

import functools

import torch

from .. import config
from ..kernels import isa as isa_mod, native
from ..kernels.native import FLOAT, I64, INT, VP


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask, scaling) -> torch.Tensor:
    """softmax(q k^T * scaling + mask) v for one query row per sequence, in fp32, GQA by a view of
    the query heads (no copy of the cache per query head): query [B, Hq, 1, D], key / value
    [B, Hkv, L, D], mask None, bool (True attends) or additive, broadcastable to [B, Hq, 1, L].
    Returns [B, 1, Hq, D] in the query's dtype (transformers' attention output layout).

    transformers' own sdpa path copies K and V per query head (``repeat_kv``) under torch.compile:
    1.4 ms per call on 2 cores at 32 / 4 heads x 128, 530 tokens, fp32; this takes 0.12 ms."""
    B, Hq, _, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    q = query.float().reshape(B, Hkv, Hq // Hkv, D)
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * (D ** -0.5 if scaling is None else scaling)
    if mask is not None:
        m = mask[..., -1:, :L].expand(B, Hq, 1, L).reshape(B, Hkv, Hq // Hkv, L)
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
    out = torch.matmul(torch.softmax(scores, dim=-1), value.float())  # [B, Hkv, G, D]
    return out.reshape(B, 1, Hq, D).to(query.dtype)


# An opaque op: the C++ kernel for bf16 (0.15-0.18 ms per call, see the module docstring), the
# aten math above otherwise. As plain aten ops inside a compiled model, Inductor's attention
# pattern pass (fx_passes/fuse_attention) rewrote an unmasked matmul -> softmax -> matmul into
# PyTorch's fp32 flash kernel with GQA (0.43-0.52 ms per call, same measurement).
torch.library.define("awq::decode_attention",
                     "(Tensor query, Tensor key, Tensor value, Tensor? mask, float scaling) -> Tensor")


@torch.library.register_fake("awq::decode_attention")
def _decode_attention_fake(query, key, value, mask, scaling):
    B, Hq, _, D = query.shape
    return query.new_empty((B, 1, Hq, D))


@torch.library.impl("awq::decode_attention", "CPU")
def _decode_attention_cpu(query, key, value, mask, scaling):
    out = _native_decode_attention(query, key, value, mask, scaling)
    return decode_attention(query, key, value, mask, scaling) if out is None else out


# Prefill: an opaque op over the C++ kernel (csrc_templates/attention/prefill_attention.cpp.j2); where it
# does not apply, PyTorch's sdpa as transformers calls it.
torch.library.define("awq::prefill_attention",
                     "(Tensor query, Tensor key, Tensor value, Tensor? mask, float scaling) -> Tensor")


@torch.library.register_fake("awq::prefill_attention")
def _prefill_attention_fake(query, key, value, mask, scaling):
    B, Hq, T, D = query.shape
    return query.new_empty((B, T, Hq, D))


@torch.library.impl("awq::prefill_attention", "CPU")
def _prefill_attention_cpu(query, key, value, mask, scaling):
    """query [B, Hq, T, D]; key / value [B, Hkv, L, D]; mask None (causal, T == L) or bool
    [B or 1, 1, T, L] (True attends). Returns [B, T, Hq, D]."""
    out = _native_prefill_attention(query, key, value, mask, scaling)
    if out is not None:
        return out
    gqa = query.shape[1] != key.shape[1]
    y = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=mask is None,
                                                         scale=scaling, enable_gqa=gqa)
    return y.transpose(1, 2).contiguous()


@functools.lru_cache(maxsize=None)
def _native_kernel(template: str, symbol: str, argtypes: tuple, **render):
    """One of our C++ attention kernels (``csrc_templates/attention/<template>`` rendered with
    ``render``, returning an int code), or None without AVX512-BF16."""
    if not isa_mod.select().avx512_bf16:
        return None
    avx512 = isa_mod.get("avx512")
    return native.c_function(template, symbol, argtypes, INT, flags=list(avx512.flags), isa=avx512, **render)


#: q, B, Hq, T, D, q strides (3); k, Hkv, L, k strides (3); v, v strides (3); mask, mask strides (3);
#: scaling; out, out strides (3); threads
_PREFILL_ARGS = (VP, *[I64] * 7, VP, *[I64] * 5, VP, *[I64] * 3, VP, *[I64] * 3, FLOAT, VP, *[I64] * 3, INT)
#: q, B, Hq, D, q strides (2); k, Hkv, L, k strides (3); v, v strides (3); mask rows, stride; scaling;
#: out, out strides (2); threads
_DECODE_ARGS = (VP, *[I64] * 5, VP, *[I64] * 5, VP, *[I64] * 3, VP, I64, FLOAT, VP, I64, I64, INT)


#: head sizes the prefill kernel has register blockings for (one library per size)
PREFILL_HEAD_DIMS = (64, 128, 256)


def prebuild(head_dim: int) -> None:
    """Build (or find in the cache) the prefill kernel of ``head_dim`` and the decode kernel now,
    not at the first call."""
    if head_dim in PREFILL_HEAD_DIMS:
        _prefill_kernel(head_dim)
    _kernel()


def _prefill_kernel(head_dim: int):
    return _native_kernel("attention/prefill_attention.cpp.j2", "awq_prefill_attention", _PREFILL_ARGS,
                          head_dim=head_dim)


def _native_prefill_attention(query, key, value, mask, scaling):
    """The C++ kernel's [B, T, Hq, D] bf16, or None where it does not apply (not bf16, D not 64 / 128 /
    256, a mask that is not bool [B or 1, 1, T, L], no mask and T != L, a row that attends no key,
    no AVX512-BF16)."""
    B, Hq, T, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    if (query.dtype != torch.bfloat16 or key.dtype != torch.bfloat16 or value.dtype != torch.bfloat16
            or D not in PREFILL_HEAD_DIMS or Hq % Hkv or Hq // Hkv > 64 or T == 0 or L == 0
            or query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1 or value.shape[2] != L):
        return None
    if mask is None:
        if T != L:
            return None
        m, ms = None, (0, 0, 0)
    else:
        if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[0] not in (1, B) \
                or mask.shape[2] != T or mask.shape[3] != L:
            return None
        m = mask[:, 0].expand(B, T, L)
        ms = m.stride()
    fn = _prefill_kernel(D)
    if fn is None:
        return None
    out = torch.empty(B, T, Hq, D, dtype=torch.bfloat16)
    rc = fn(query.data_ptr(), B, Hq, T, D, query.stride(0), query.stride(1), query.stride(2),
            key.data_ptr(), Hkv, L, key.stride(0), key.stride(1), key.stride(2),
            value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
            None if m is None else m.data_ptr(), *ms, float(scaling),
            out.data_ptr(), out.stride(0), out.stride(1), out.stride(2),
            config.threads())
    return out if rc == 0 else None


def _kernel():
    """The C++ decode kernel (``csrc_templates/attention/decode_attention.cpp.j2``), or None without AVX512-BF16."""
    return _native_kernel("attention/decode_attention.cpp.j2", "awq_decode_attention", _DECODE_ARGS)


def _mask_rows(mask, B: int, L: int):
    """An additive fp32 [B, L] mask from one that is the same for every head (None: no mask; False if
    it differs per head: the caller falls back)."""
    if mask is None:
        return None
    m = mask[..., -1:, :L]
    if m.dim() != 4 or m.shape[1] != 1:
        return False
    m = m.expand(B, 1, 1, L).reshape(B, L)
    if m.dtype == torch.bool:
        return torch.zeros(B, L).masked_fill_(~m, float("-inf"))
    return m.float().contiguous()


def _native_decode_attention(query, key, value, mask, scaling):
    """The C++ kernel's result [B, 1, Hq, D] bf16, or None where it does not apply (not bf16, D not a
    multiple of 32 or over 256, more than 16 query heads per KV head, a per-head mask, no
    AVX512-BF16): the aten math then runs."""
    B, Hq, _, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    if (query.dtype != torch.bfloat16 or key.dtype != torch.bfloat16 or value.dtype != torch.bfloat16
            or D % 32 or D > 256 or Hq % Hkv or Hq // Hkv > 16 or L == 0
            or key.stride(-1) != 1 or value.stride(-1) != 1 or value.shape[2] != L):
        return None
    rows = _mask_rows(mask, B, L)
    fn = _kernel() if rows is not False else None
    if fn is None:
        return None
    q = query.reshape(B, Hq, D).contiguous()
    out = torch.empty(B, 1, Hq, D, dtype=torch.bfloat16)
    rc = fn(q.data_ptr(), B, Hq, D, q.stride(0), q.stride(1),
            key.data_ptr(), Hkv, L, key.stride(0), key.stride(1), key.stride(2),
            value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
            None if rows is None else rows.data_ptr(), 0 if rows is None else rows.stride(0),
            float(scaling), out.data_ptr(), out.stride(0), out.stride(2), config.threads())
    if rc != 0:
        raise RuntimeError(f"awq_inductor: decode attention kernel rejected query {list(query.shape)}, "
                           f"key {list(key.shape)} (code {rc})")
    return out
