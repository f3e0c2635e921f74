"""The ``lm_head`` modules: bf16 on our GEMV (``convert(model)``'s default ``lm_head="bf16"``) and the
opt-in int8 and int4 heads (``convert(model, lm_head="int8" | "int4")``), quantized at load."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .. import packing
from ..ops import head_bf16 as bf16_head, head_int8 as int8_head
from .linear import AWQLinear

#: ``convert(model, lm_head=...)``: None keeps the loaded head as it is, "bf16" (the default) runs a
#: bf16 head through our GEMV at decode, "int8" quantizes it per channel, "int4" per group of
#: :data:`INT4_HEAD_GROUP_SIZE` along K (our W4A16 op).
LM_HEAD_CHOICES = ("bf16", None, "int8", "int4")


class Bf16HeadLinear(nn.Linear):
    """A bf16 ``nn.Linear`` head whose forward is ``awq::bf16_linear``: our AVX512-BF16 GEMV for up to
    :data:`awq_inductor.bf16_head.GEMV_MAX_M` rows (decode), ``F.linear`` above. Made by switching
    the class of the loaded ``nn.Linear`` in place (:func:`use_bf16_gemv`): same parameters, so a
    tied input embedding still shares the weight and state dicts keep their keys."""

    #: read whole for every decoded token: huge pages at load (kernels.hugepages; tied stays tied)
    STREAMED_TENSORS = ("weight",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or self.weight.dtype != torch.bfloat16:
            return super().forward(x)
        lead = x.shape[:-1]
        y = bf16_head.bf16_linear(x.reshape(-1, self.in_features), self.weight, self.bias)
        return y.reshape(*lead, self.out_features)


def use_bf16_gemv(head: nn.Module) -> bool:
    """Switch a plain bf16 ``nn.Linear`` head to :class:`Bf16HeadLinear` in place; True if switched.
    Anything else (fp16/fp32 heads, other module types, a CPU without AVX512-BF16) stays as it is."""
    if type(head) is not nn.Linear or head.weight.dtype != torch.bfloat16 or not bf16_head.gemv_available():
        return False
    head.__class__ = Bf16HeadLinear
    return True


class Int8HeadLinear(nn.Module):
    """``nn.Linear`` replacement with per-output-channel symmetric int8 weights and fp32 scales,
    quantized once from the bf16/fp16/fp32 head (:func:`awq_inductor.int8_head.quantize_per_channel`);
    its input is rounded to int8 per group of 128 (W8A8: ``awq::int8_linear``). Holds its own int8
    copy: a tied input embedding keeps its float table untouched."""

    STREAMED_TENSORS = ("weight_int8",)  # read whole per decoded token (kernels.hugepages)

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


#: Group size of the int4 head. Measured (benchmarks/results/bench_head_int4.md): on the trained
#: tiny Llama (vocab 2048, hidden 256, 1024 held-out tokens) G=32 / 64 / 128 gave top-1 agreement
#: with the bf16 head 0.958 / 0.945 / 0.934 and mean relative logit error 0.070 / 0.081 / 0.084
#: (a random 32000 x 4096 head: 0.081 / 0.092 / 0.101); perplexity +0.44% / +1.46% / +0.30%, too
#: noisy over 1024 tokens to rank them (G=64 misses the 1% target). The head op at 32000 x 4096,
#: M = 1, 2 threads: 2.83 / 2.32 / 2.18 ms against 6.48 ms for the bf16 GEMV. G=32 is the most
#: accurate by the steady measures for 0.65 ms per token over G=128.
INT4_HEAD_GROUP_SIZE = 32


class Int4HeadLinear(AWQLinear):
    """The opt-in int4 ``lm_head``: an :class:`AWQLinear` (W4A16, ``awq::int4_mm``, the same kernel
    and Inductor lowering as the decoder's linears) quantized once from the float head with the
    asymmetric per-group formula of AWQ checkpoints (:func:`awq_inductor.packing.quantize_canonical`,
    fp32 scales). Holds its own packed copy: a tied input embedding keeps its float table. Its own
    class so that the model pass keeps it W4A16 under ``act_quant="int8"`` and ``save_pretrained``
    refuses it (the float head it came from is gone)."""

    @classmethod
    def from_linear(cls, lin: nn.Linear, group_size: int = INT4_HEAD_GROUP_SIZE) -> "Int4HeadLinear":
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"lm_head: expected an nn.Linear to quantize to int4, got {type(lin).__name__}")
        if lin.in_features % group_size:
            raise ValueError(f"lm_head: int4 head group size {group_size} must divide in_features="
                             f"{lin.in_features}")
        q, z, s = packing.quantize_canonical(lin.weight, group_size, torch.float32)
        bias = None if lin.bias is None else lin.bias.detach().float()
        return cls.from_canonical(q, z, s, bias, group_size=group_size)

    def with_act_quant(self, act_quant: Optional[str]):
        return self  # the head stays W4A16: its accuracy is measured for bf16 activations

    def extra_repr(self) -> str:
        return super().extra_repr() + ", int4 lm_head"


#: the heads quantized at load from the float one: they cannot be written back as that float weight
QUANTIZED_HEADS = (Int8HeadLinear, Int4HeadLinear)
_QUANTIZE = {"int8": Int8HeadLinear, "int4": Int4HeadLinear}


def quantize_lm_head(model: nn.Module, lm_head: Optional[str]) -> bool:
    """Apply ``convert``'s ``lm_head`` choice to the model's output projection
    (``get_output_embeddings()``, else ``lm_head``): "bf16" switches a bf16 ``nn.Linear`` head to
    :class:`Bf16HeadLinear` (a model without a head is left alone), "int8" / "int4" replace it by an
    :class:`Int8HeadLinear` / :class:`Int4HeadLinear`; True if the head changed. Idempotent; an
    already quantized head is never re-quantized from its quantized weights."""
    if lm_head is None:
        return False
    if lm_head not in LM_HEAD_CHOICES:
        raise ValueError(f"lm_head: expected one of {LM_HEAD_CHOICES}, got {lm_head!r}")
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(model, "lm_head", None)
    if lm_head == "bf16":
        return head is not None and use_bf16_gemv(head)
    cls = _QUANTIZE[lm_head]
    if isinstance(head, cls):
        return False
    if head is None:
        raise ValueError(f"lm_head={lm_head!r}: the model has no output embedding (get_output_embeddings() "
                         "returned None and there is no `lm_head` attribute)")
    if isinstance(head, QUANTIZED_HEADS):
        raise ValueError(f"lm_head={lm_head!r}: the head is already a {type(head).__name__}; its float weight "
                         "is gone, load the model again to quantize it differently")
    name = next(n for n, m in model.named_modules() if m is head)
    model.set_submodule(name, cls.from_linear(head))
    return True
