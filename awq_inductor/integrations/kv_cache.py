"""transformers' dynamic KV cache (``DynamicLayer``) written in place.

``DynamicLayer.update`` concatenates the whole cache into a new buffer per layer and step
(``torch.cat([keys, new])``, K and V): on 4 Llama-7B-shaped layers, 2 Zen 4 cores, 0.29 / 0.84 /
2.33 ms of a 22.7 / 23.4 / 30.1 ms decode step at 32 / 512 / 2048 cached tokens, and for 32 layers
22.5 ms per token at 2048 (``benchmarks/results/decode_step_by_context_zen4_1206.txt``); llama.cpp
and ik_llama.cpp write into a preallocated cache. Here a layer's keys and values live in buffers
with room to grow (:func:`reserve`: capacity rounded up, a quarter and at least ``CHUNK`` tokens
ahead, so a 2048-token decode copies the cache a few times, not 2048 times), ``self.keys`` /
``self.values`` are views of their first ``L`` tokens, and an update writes the new tokens into the
buffers (under ``torch.compile`` Inductor writes the slice in place, one fused copy: checked in
``tests/test_kv_cache.py``) and returns the longer views. Our attention kernels take strided K / V.

Protocol: :func:`reserve` runs eagerly before a layer's update (the regional layer step calls it
before its compiled code; an eager ``update`` calls it itself) and *arms* the layer for one update
of that many tokens; the update consumes the arm. So compiled code never decides about buffers:
an unarmed update (the first one of a layer, a whole-model compiled forward that never passes
through :func:`reserve`) is transformers' own concatenation, with the first keys / values stored
contiguous (one stride order: under torch.compile the projection's ``transpose(1, 2)`` order
reached the cache and the next call recompiled on its strides). Anything that replaces a layer's
tensors (``crop`` keeps views and stays valid; ``batch_select_indices``, ``reorder_cache``,
``reset``, a ``deepcopy``) is seen by :func:`reserve` (the tensors are no longer views of the
buffers), which starts a new buffer from the current tensors. Values are unchanged: the same tokens
at the same positions. One difference: the cache is written in place, so after a ``crop`` the next
tokens overwrite positions that a reference to an older, longer view still covers (transformers
keeps none)."""
from __future__ import annotations

import functools

import torch

#: the least capacity added when a buffer grows (tokens); growth is a quarter of the length beyond
#: that, so the copies a long generation makes grow with log(length), and the room never exceeds
#: max(CHUNK, length / 4) tokens
CHUNK = 256
_ALIGN = 64


def _capacity(needed: int) -> int:
    room = max(CHUNK, needed // 4)
    return -(-(needed + room) // _ALIGN) * _ALIGN


def _holds(layer, keys: torch.Tensor, values: torch.Tensor, new_tokens: int) -> bool:
    """``keys`` / ``values`` are still the first tokens of the layer's buffers, with room for
    ``new_tokens`` more. A view's ``_base`` is its root tensor: ``crop`` keeps it, every method that
    replaces the tensors does not (reserve 3.6 us a call this way, 11.5 us comparing data pointers)."""
    bufs = layer.__dict__.get("_awq_kv")
    if bufs is None or keys is None or values is None:
        return False
    kbuf, vbuf = bufs
    L = keys.shape[2]
    return (keys._base is kbuf and values._base is vbuf and values.shape[2] == L and L + new_tokens <= kbuf.shape[2]
            and keys.storage_offset() == 0 and values.storage_offset() == 0
            and keys.stride() == kbuf.stride() and values.stride() == vbuf.stride()
            and _same_rows(keys, kbuf) and _same_rows(values, vbuf))


def _same_rows(t: torch.Tensor, buf: torch.Tensor) -> bool:
    """Batch, heads and head size of ``t`` are the buffer's (a slice in those would leave stale rows)."""
    return t.shape[:2] == buf.shape[:2] and t.shape[3:] == buf.shape[3:]


def _grow(layer, new_tokens: int) -> None:
    keys, values = layer.keys, layer.values
    B, H, L = keys.shape[:3]
    cap = _capacity(L + new_tokens)
    kbuf = keys.new_empty((B, H, cap) + tuple(keys.shape[3:]))
    vbuf = values.new_empty((B, values.shape[1], cap) + tuple(values.shape[3:]))
    kbuf[:, :, :L].copy_(keys)
    vbuf[:, :, :L].copy_(values)
    layer._awq_kv = (kbuf, vbuf)
    layer.keys, layer.values = kbuf[:, :, :L], vbuf[:, :, :L]


def reserve(layer, new_tokens: int) -> bool:
    """Arm ``layer`` (a transformers ``DynamicLayer``) for one update of ``new_tokens`` tokens written
    in place, growing or (re)creating its buffers as needed; eager only. False (and unarmed) where
    the layer is not a plain initialised ``DynamicLayer`` holding 4-D keys and values."""
    if type(layer).update is not _patched_update:  # (not installed, or a subclass with its own update)
        return False
    layer._awq_armed = False
    keys, values = layer.keys, layer.values
    if new_tokens <= 0:
        return False
    if not _holds(layer, keys, values, new_tokens):
        if not (layer.is_initialized and isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)
                and keys.dim() == 4 and values.dim() == 4 and keys.numel() > 0
                and keys.shape[0] == values.shape[0] and keys.shape[2] == values.shape[2]):
            layer._awq_kv = None
            return False
        _grow(layer, new_tokens)
    # the write position, as the size of an empty tensor: the compiled update reads it instead of
    # layer.keys, a view of the buffer it writes (a mutated graph input aliasing another input made
    # AOTAutograd build a synthetic base whose sizes Dynamo's guards could not name: "sources must
    # not be empty for symbol s5", batch 2 with a mask, torch 2.13)
    layer._awq_at = torch.empty((keys.shape[2], 0))
    layer._awq_armed = True
    return True


def disarm(layer) -> None:
    """Undo :func:`reserve`'s arm (a step that raised before its update left it)."""
    layer._awq_armed = False


def _write(layer, key_states: torch.Tensor, value_states: torch.Tensor):
    kbuf, vbuf = layer._awq_kv
    L, T = layer._awq_at.shape[0], key_states.shape[-2]
    kbuf[:, :, L:L + T].copy_(key_states)
    vbuf[:, :, L:L + T].copy_(value_states)
    layer.keys, layer.values = kbuf[:, :, :L + T], vbuf[:, :, :L + T]
    return layer.keys, layer.values


def _fits(layer, key_states, value_states) -> bool:
    """The new keys / values are what reserve armed for: batch, heads, head size, dtype and device of
    the buffers (copy_ would broadcast a head dimension of 1 without a word), and room for their
    tokens (the compiled code guards on these)."""
    kbuf, vbuf = layer._awq_kv
    T = key_states.shape[-2]
    return (key_states.dim() == 4 and value_states.dim() == 4 and value_states.shape[-2] == T
            and _same_rows(key_states, kbuf) and _same_rows(value_states, vbuf)
            # copy_ would cast or move where torch.cat promotes or refuses
            and key_states.dtype == kbuf.dtype and value_states.dtype == vbuf.dtype
            and key_states.device == kbuf.device and value_states.device == vbuf.device
            and layer._awq_at.shape[0] + T <= kbuf.shape[2])


_concatenate = None  # transformers' DynamicLayer.update, set by install()


def _patched_update(self, key_states, value_states, *args, **kwargs):
    if not torch.compiler.is_compiling():
        # an eager update arms itself (again: an arm left by a step that raised before its update
        # would write at a stale position)
        reserve(self, key_states.shape[-2])
    if getattr(self, "_awq_armed", False):
        self._awq_armed = False
        if _fits(self, key_states, value_states):
            return _write(self, key_states, value_states)
        self._awq_kv = None
    first = not self.is_initialized or self.keys.numel() == 0
    keys, values = _concatenate(self, key_states, value_states, *args, **kwargs)
    if first and keys is self.keys and values is self.values:
        # clone(memory_format=...): under torch.compile a plain .contiguous() is a no-op (the fake
        # tensor already claims contiguous strides)
        self.keys = keys = keys.clone(memory_format=torch.contiguous_format)
        self.values = values = values.clone(memory_format=torch.contiguous_format)
    return keys, values


def install() -> None:
    """Patch transformers' ``DynamicLayer.update`` (process-wide, idempotent) as the module
    docstring says."""
    global _concatenate
    if _concatenate is not None:
        return
    from transformers.cache_utils import DynamicLayer

    _concatenate = DynamicLayer.update
    DynamicLayer.update = functools.wraps(_concatenate)(_patched_update)
