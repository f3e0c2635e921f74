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
(``csrc_templates/attention/decode_attention.cpp.j2``: one pass over K and then V per sequence and KV
head, bf16 read directly, products exact, fp32 softmax and sums; 0.15-0.18 ms per call against
0.29-0.41 ms for :func:`decode_attention`'s aten ops, 32 / 8 and 32 / 4 heads of 128, 540 cached
tokens, 2 threads, interleaved), else :func:`decode_attention` itself.

:func:`use_fp32_decode_attention` registers the function under ``awq_sdpa`` (with ``sdpa``'s mask
function) and switches a model that uses ``sdpa`` to it; ``awq_inductor.convert`` calls it. The
results differ from bf16 ``sdpa`` by the rounding of the bf16 kernel: fp32 softmax and sums are
the more accurate of the two.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops import attention as _ops  # noqa: F401  (defines awq::decode_attention / prefill_attention)
from ..ops.attention import decode_attention

# Prefill (``awq::prefill_attention``, ``csrc_templates/attention/prefill_attention.cpp.j2``): PyTorch's
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

    if query.dtype not in _HALF or not _plain(module, kwargs) or value.shape[-1] != query.shape[-1]:
        # (our kernels take one head dim for q, k and v; MLA's v head is narrower: DeepSeek-V3 192 / 128)
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
