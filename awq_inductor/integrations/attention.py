"""Attention for bf16 / fp16 models (transformers' attention interface ``awq_sdpa``): decode rows in
fp32 or our C++ kernel, bf16 prefill rows on our C++ prefill kernel (``awq::prefill_attention``,
below), the rest transformers' own ``sdpa``.

PyTorch's CPU flash-attention kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``, what
transformers' ``sdpa`` runs) is slow for one bf16 query row. On 2 Zen 4 cores, torch 2.13, 32
query / 4 KV heads of 128, 512 cached tokens: 2.0-2.5 ms per call in bf16, 0.2 ms in fp32 and
0.31 ms for bf16 inputs upcast to fp32 and the output cast back; under torch.compile transformers
also copies K and V per query head first (``repeat_kv``, 1.4 ms). Four Llama-7B- or
Qwen3-MoE-shaped layers spent 9-10 ms of a 24 ms decode step there. For 512 query rows (prefill)
both dtypes take 27.6 ms, so only calls with one query row per sequence (decode) take
:func:`decode_attention` (fp32, GQA by a view, 0.12 ms); everything else is transformers' own
``sdpa``.

Inside a model the decode rows run the op ``awq::decode_attention``: for bf16 a C++ kernel
(``csrc_templates/head/decode_attention.cpp.j2``: one pass over K and then V per sequence and KV
head, bf16 read directly, products exact, fp32 softmax and sums; 0.15-0.18 ms per call against
0.29-0.41 ms for :func:`decode_attention`'s aten ops, 32 / 8 and 32 / 4 heads of 128, 540 cached
tokens, 2 threads, interleaved), else :func:`decode_attention` itself.

:func:`use_fp32_decode_attention` registers the function under ``awq_sdpa`` (with ``sdpa``'s mask
function) and switches a model that uses ``sdpa`` to it; ``awq_inductor.convert`` calls it. The
results differ from bf16 ``sdpa`` by the rounding of the bf16 kernel: fp32 softmax and sums are
the more accurate of the two.
"""
from __future__ import annotations

import ctypes
import functools

import torch
from torch import nn

from .. import config

# Prefill (``awq::prefill_attention``, ``csrc_templates/head/prefill_attention.cpp.j2``): PyTorch's
# flash kernel ran 512 causal bf16 rows, 32 / 4 heads of 128, in 31.9 ms on 2 Zen 4 cores; the C++
# kernel in 7.3 ms (105 vs 325 ms at 2048 rows), interleaved. It takes what transformers' sdpa
# path would run causal without a mask, or with a bool mask the same for every head.

NAME = "awq_sdpa"
_HALF = (torch.bfloat16, torch.float16)


def awq_sdpa_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask, **kwargs):
    """transformers' ``sdpa_attention_forward``, or :func:`decode_attention` when the query has one
    row per sequence and a half dtype (``query`` [B, H, q_len, D]) and the attention is plain."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.dtype not in _HALF or not _plain(module, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    scaling = kwargs.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if query.shape[2] != 1:
        return _prefill(module, query, key, value, attention_mask, scaling, kwargs)
    if query.requires_grad or key.requires_grad or value.requires_grad:  # (the op has no autograd)
        return decode_attention(query, key, value, attention_mask, scaling), None
    return torch.ops.awq.decode_attention(query, key, value, attention_mask, scaling), None


def _prefill(module, query, key, value, attention_mask, scaling, kwargs):
    """Several query rows (prefill): ``awq::prefill_attention`` where it applies (bf16, causal as
    transformers' sdpa path defines it, or a bool mask the same for every head, no grad), else
    transformers' own ``sdpa``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    T, L = query.shape[2], key.shape[2]
    mask = attention_mask
    ok = (query.dtype == torch.bfloat16 and not (query.requires_grad or key.requires_grad or value.requires_grad)
          and (mask is None or (mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1)))
    if ok and mask is None:
        # transformers: is_causal without a mask, keys cropped to the first T (sdpa's top-left
        # alignment when the cache holds more); a non-causal module without a mask is not ours
        ok = bool(causal) and L >= T
        if ok:
            key, value = key[:, :, :T], value[:, :, :T]
    if not ok:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return torch.ops.awq.prefill_attention(query, key, value, mask, scaling), None


def _plain(module: nn.Module, kwargs: dict) -> bool:
    """No dropout, softcap, position bias, sinks or attention-weights output: plain softmax attention."""
    if module.training and kwargs.get("dropout", 0.0):
        return False
    return not any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "s_aux", "sinks")) \
        and not kwargs.get("output_attentions", False)


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


# Prefill: an opaque op over the C++ kernel (csrc_templates/head/prefill_attention.cpp.j2); where it
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
def _native_kernel(template: str, symbol: str, argtypes: tuple):
    """One of our C++ attention kernels (``csrc_templates/head/<template>``, returning an int code),
    or None without AVX512-BF16."""
    from ..kernels import isa as isa_mod
    from ..kernels import native

    if isa_mod.select() == "portable":
        return None
    return native.c_function(template, symbol, list(argtypes), ctypes.c_int, flags=native.AVX512_BF16_FLAGS,
                             isa="avx512")


_VP, _I64 = ctypes.c_void_p, ctypes.c_int64
_PREFILL_ARGS = (_VP, *[_I64] * 7, _VP, *[_I64] * 5, _VP, *[_I64] * 3, _VP, *[_I64] * 3, ctypes.c_float, _VP,
                 *[_I64] * 3, ctypes.c_int)
_DECODE_ARGS = (_VP, *[_I64] * 5, _VP, *[_I64] * 5, _VP, *[_I64] * 3, _VP, _I64, ctypes.c_float, _VP, _I64, _I64,
                ctypes.c_int)


def _prefill_kernel():
    return _native_kernel("head/prefill_attention.cpp.j2", "awq_prefill_attention", _PREFILL_ARGS)


def _native_prefill_attention(query, key, value, mask, scaling):
    """The C++ kernel's [B, T, Hq, D] bf16, or None where it does not apply (not bf16, D not 64 / 128 /
    256, a mask that is not bool [B or 1, 1, T, L], no mask and T != L, a row that attends no key,
    no AVX512-BF16)."""
    B, Hq, T, D = query.shape
    Hkv, L = key.shape[1], key.shape[2]
    if (query.dtype != torch.bfloat16 or key.dtype != torch.bfloat16 or value.dtype != torch.bfloat16
            or D not in (64, 128, 256) or Hq % Hkv or Hq // Hkv > 64 or T == 0 or L == 0
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
    fn = _prefill_kernel()
    if fn is None:
        return None
    out = torch.empty(B, T, Hq, D, dtype=torch.bfloat16)
    rc = fn(query.data_ptr(), B, Hq, T, D, query.stride(0), query.stride(1), query.stride(2),
            key.data_ptr(), Hkv, L, key.stride(0), key.stride(1), key.stride(2),
            value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
            None if m is None else m.data_ptr(), *ms, float(scaling),
            out.data_ptr(), out.stride(0), out.stride(1), out.stride(2),
            int(config.num_threads or torch.get_num_threads()))
    return out if rc == 0 else None


def _kernel():
    """The C++ decode kernel (``csrc_templates/head/decode_attention.cpp.j2``), or None without AVX512-BF16."""
    return _native_kernel("head/decode_attention.cpp.j2", "awq_decode_attention", _DECODE_ARGS)


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
            float(scaling), out.data_ptr(), out.stride(0), out.stride(2), int(config.num_threads or torch.get_num_threads()))
    if rc != 0:
        raise RuntimeError(f"awq_inductor: decode attention kernel rejected query {list(query.shape)}, "
                           f"key {list(key.shape)} (code {rc})")
    return out


def register() -> None:
    """Add ``awq_sdpa`` to transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, awq_sdpa_attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def use_fp32_decode_attention(model: nn.Module) -> bool:
    """Switch a transformers model whose attention is ``sdpa`` to ``awq_sdpa``; True if switched.
    Models with another attention (eager, flex, ...) or no transformers config are left as they are."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    register()
    model.set_attn_implementation(NAME)
    return getattr(model.config, "_attn_implementation", None) == NAME


def restore_sdpa(model: nn.Module) -> bool:
    """Undo :func:`use_fp32_decode_attention` (baselines run transformers' own ``sdpa``)."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) != NAME:
        return False
    model.set_attn_implementation("sdpa")
    return True
