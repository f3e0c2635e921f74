"""The int8 ``lm_head`` module (``convert(model, lm_head="int8")``)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .. import int8_head


class Int8HeadLinear(nn.Module):
    """``nn.Linear`` replacement with per-output-channel symmetric int8 weights and fp32 scales,
    quantized once from the bf16/fp16/fp32 head (:func:`awq_inductor.int8_head.quantize_per_channel`).
    Holds its own int8 copy: a tied input embedding keeps its float table untouched."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scales", torch.ones(out_features, dtype=torch.float32))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float32) if bias else None)

    @classmethod
    def from_linear(cls, lin: nn.Linear) -> "Int8HeadLinear":
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"lm_head: expected an nn.Linear to quantize to int8, got {type(lin).__name__}")
        q, s = int8_head.quantize_per_channel(lin.weight)
        mod = cls(lin.in_features, lin.out_features, bias=lin.bias is not None)
        mod.weight_int8.copy_(q)
        mod.weight_scales.copy_(s)
        if lin.bias is not None:
            mod.bias.copy_(lin.bias.detach().float())
        return mod

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K] weight the module multiplies by."""
        return self.weight_int8.float() * self.weight_scales[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = int8_head.int8_linear(x.reshape(-1, self.in_features), self.weight_int8, self.weight_scales, self.bias)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_lm_head(model: nn.Module, lm_head: Optional[str]) -> bool:
    """Replace the model's output projection (``get_output_embeddings()``, else ``lm_head``) by an
    :class:`Int8HeadLinear` when ``lm_head == "int8"``; True if replaced. Idempotent."""
    if lm_head is None:
        return False
    if lm_head != "int8":
        raise ValueError(f"lm_head: expected one of (None, 'int8'), got {lm_head!r}")
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(model, "lm_head", None)
    if isinstance(head, Int8HeadLinear):
        return False
    if head is None:
        raise ValueError("lm_head='int8': the model has no output embedding (get_output_embeddings() "
                         "returned None and there is no `lm_head` attribute)")
    name = next(n for n, m in model.named_modules() if m is head)
    model.set_submodule(name, Int8HeadLinear.from_linear(head))
    return True
