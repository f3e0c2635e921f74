"""A compiled forward that stays compiled across the ``generate`` calls users make (transformers 5).

Measured on the shipped tiny Llama, 2 cores, ``model.forward = torch.compile(model.forward,
backend="awq_inductor")`` and ``generate`` with batch sizes 1, 2, 3 (left-padded prompts): Dynamo's
recompile limit (8) was hit on the third call, and the frame ran eager from then on. The guards
that failed: ``len(kwargs)`` (generate passes ``attention_mask`` to some calls and not to others),
the sizes of ``input_ids`` and of the cache's keys (automatic dynamic shapes make a dim dynamic
only after it changed once, so prefill, decode and the first longer cache each cost a graph), and
batch size 1 against more.

:func:`compile_for_generate` compiles ``model.forward`` with dynamic shapes from the first call
and makes every forward ``generate`` issues look alike: ``attention_mask`` always passed, ``None``
when it masks nothing (all ones: the same attention as no mask), and the cache's tensors keep one
stride order (:func:`stable_cache_strides`). A model then ends with a graph per
(prefill, decode) x (batch 1, more) x (mask, none) it meets, at most 6 in practice (a batch of one
needs no padding mask), within the limit of 8.
"""
from __future__ import annotations

import functools
import types
from typing import Optional

import torch
from torch import nn


def _mask_or_none(mask):
    """A 2-D padding mask that masks nothing is no mask (one attention path, one graph)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask.all()):
        return None
    return mask


def normalize_generation_inputs(model: nn.Module) -> None:
    """``model.prepare_inputs_for_generation`` (run eagerly by ``generate`` before each forward)
    returns one layout of inputs: ``attention_mask`` always present, None where it masks nothing."""
    if getattr(model, "_awq_normalized_inputs", False) or not hasattr(model, "prepare_inputs_for_generation"):
        return
    inner = model.prepare_inputs_for_generation

    @functools.wraps(inner)
    def prepare(self, *args, **kwargs):
        inputs = inner(*args, **kwargs)
        inputs["attention_mask"] = _mask_or_none(inputs.get("attention_mask"))
        return inputs

    model.prepare_inputs_for_generation = types.MethodType(prepare, model)
    model._awq_normalized_inputs = True


_STABLE_STRIDES = False


def stable_cache_strides() -> None:
    """transformers' ``DynamicLayer.update`` keeps contiguous keys / values. Why: the prefill's keys
    enter the cache as the ``transpose(1, 2)`` view of the projection (stride 64 = head_dim on the
    head dim), every later ``torch.cat`` leaves them contiguous (stride L * head_dim), so the second
    decode graph's guard on ``cache.layers[i].keys`` strides failed ("expected 64, actual 832") and
    recompiled. One copy of K and V per layer at prefill; decode's cat output is contiguous already.
    Values are unchanged (idempotent, process-wide)."""
    global _STABLE_STRIDES
    if _STABLE_STRIDES:
        return
    from transformers.cache_utils import DynamicLayer

    update = DynamicLayer.update

    @functools.wraps(update)
    def contiguous_update(self, key_states, value_states, *args, **kwargs):
        keys, values = update(self, key_states, value_states, *args, **kwargs)
        if keys is self.keys and values is self.values and not (keys.is_contiguous() and values.is_contiguous()):
            self.keys, self.values = keys, values = keys.contiguous(), values.contiguous()
        return keys, values

    DynamicLayer.update = contiguous_update
    _STABLE_STRIDES = True


def compile_for_generate(model: nn.Module, backend: str = "awq_inductor", dynamic: Optional[bool] = True,
                         **compile_kwargs) -> nn.Module:
    """``model.forward = torch.compile(model.forward, backend=backend, dynamic=dynamic)`` with the
    inputs of ``generate`` normalized (:func:`normalize_generation_inputs`); returns ``model``."""
    stable_cache_strides()
    normalize_generation_inputs(model)
    model.forward = torch.compile(model.forward, backend=backend, dynamic=dynamic, **compile_kwargs)
    return model
