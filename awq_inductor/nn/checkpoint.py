"""Loading placeholders: modules that receive checkpoint tensors exactly as stored, before the
model pass (:func:`awq_inductor.transform.convert`) turns them into :class:`AWQLinear`. No
transformers import: the transformers integration creates them, the model pass consumes them.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from .. import formats
from .linear import AWQLinear


class CheckpointInt4Linear(nn.Module):
    """Receives one int4 linear's checkpoint tensors (``qweight``, ``qzeros``, ``scales``,
    optional ``bias`` and ``g_idx``) exactly as stored; it has no forward of its own."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, group_size: int, format: str,
                 dtypes: Optional[Dict[str, torch.dtype]] = None, g_idx: bool = False):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = formats.resolve_group_size(group_size, in_features)
        self.format = format
        dtypes = dtypes or {}
        for name, (shape, dt) in formats.checkpoint_shapes(format, in_features, out_features, group_size).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtypes.get(name, dt)))
        if bias:
            self.register_buffer("bias", torch.empty(out_features, dtype=dtypes.get("bias", torch.float16)))
        else:
            self.bias = None
        if g_idx:
            self.register_buffer("g_idx", torch.empty(in_features, dtype=dtypes.get("g_idx", torch.int32)))
        else:
            self.g_idx = None

    def to_awq_linear(self) -> AWQLinear:
        if self.g_idx is not None:
            g = self.g_idx.to(torch.int64)
            ref = torch.arange(self.in_features, dtype=torch.int64) // self.group_size
            if not torch.equal(g, ref):
                raise NotImplementedError(
                    "g_idx: act-order (desc_act=True) GPTQ checkpoints are not supported; "
                    "expected g_idx[k] == k // group_size")
        build = AWQLinear.from_gptq if self.format in formats.GPTQ_FORMATS else AWQLinear.from_awq
        return build(self.qweight, self.qzeros, self.scales, self.bias, group_size=self.group_size, format=self.format)

    def forward(self, x):  # pragma: no cover - replaced before use
        raise RuntimeError("CheckpointInt4Linear is a loading placeholder; run awq_inductor.convert(model)")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, format={self.format}, bias={self.bias is not None}")


class ScaledActivation(nn.Module):
    """AWQ's scaled activation: ``act(x) / scales`` (checkpoint key ``<...>.act.scales``)."""

    def __init__(self, act: nn.Module, size: int, dtype: torch.dtype = torch.float16):
        super().__init__()
        self.act = act
        self.scales = nn.Parameter(torch.empty(size, dtype=dtype), requires_grad=False)

    def forward(self, x):
        return self.act(x) / self.scales.to(x.dtype)
