"""Decode attention in fp32 for bf16 / fp16 models (transformers' attention interface ``awq_sdpa``).

PyTorch's CPU flash-attention kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``, what
transformers' ``sdpa`` runs) is slow for one bf16 query row. On 2 Zen 4 cores, torch 2.13, 32
query / 4 KV heads of 128, 512 cached tokens: 2.0-2.5 ms per call in bf16, 0.2 ms in fp32 and
0.31 ms for bf16 inputs upcast to fp32 and the output cast back. Four Llama-7B- or Qwen3-MoE-shaped layers spent 9-10 ms of a
24 ms decode step there. For 512 query rows (prefill) both dtypes take 27.6 ms, so only calls with
one query row per sequence (decode) are upcast; everything else is transformers' own ``sdpa``.

:func:`use_fp32_decode_attention` registers the function under ``awq_sdpa`` (with ``sdpa``'s mask
function) and switches a model that uses ``sdpa`` to it; ``awq_inductor.convert`` calls it. The
results differ from bf16 ``sdpa`` by the rounding of the bf16 kernel: fp32 softmax and sums are
the more accurate of the two.
"""
from __future__ import annotations

import torch
from torch import nn

NAME = "awq_sdpa"
_HALF = (torch.bfloat16, torch.float16)


def awq_sdpa_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask, **kwargs):
    """transformers' ``sdpa_attention_forward``, in fp32 when the query has one row per sequence
    and a half dtype (``query`` [B, H, q_len, D]); the output keeps the query's dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.dtype not in _HALF or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.float()
    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask, **kwargs)
    return out.to(query.dtype), weights


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
