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
    optional ``bias`` and ``g_idx``) exactly as stored; it has no forward of its own.

    ``num_experts``: the tensors of E experts stacked on a leading dim (fused 3-D MoE checkpoints,
    ``mlp.experts.gate_up_proj.qweight`` [E, ...]): each ``t[e]`` is one expert's tensor in the
    format's 2-D layout."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, group_size: int, format: str,
                 dtypes: Optional[Dict[str, torch.dtype]] = None, g_idx: bool = False,
                 num_experts: Optional[int] = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = formats.resolve_group_size(group_size, in_features)
        self.format = format
        self.num_experts = num_experts
        dtypes = dtypes or {}
        for name, (shape, dt) in self.expected_shapes(bias, g_idx).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtypes.get(name, dt)))
        if not bias:
            self.bias = None
        if not g_idx:
            self.g_idx = None

    def expected_shapes(self, bias: bool, g_idx: bool) -> Dict[str, tuple]:
        """name -> (shape, default dtype) of the checkpoint tensors this module receives."""
        out = dict(formats.checkpoint_shapes(self.format, self.in_features, self.out_features, self.group_size))
        if bias:
            out["bias"] = ((self.out_features,), torch.float16)
        if g_idx:
            out["g_idx"] = ((self.in_features,), torch.int32)
        if self.num_experts is not None:
            out = {k: ((self.num_experts, *shape), dt) for k, (shape, dt) in out.items()}
        return out

    def to_awq_linear(self) -> AWQLinear:
        if self.num_experts is not None:
            raise ValueError("CheckpointInt4Linear: a stacked (per-expert) placeholder is converted by the MoE "
                             "pass (transform.moe), not into one AWQLinear")
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
        e = "" if self.num_experts is None else f"num_experts={self.num_experts}, "
        return (f"{e}in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, format={self.format}, bias={self.bias is not None}")


class ScaledActivation(nn.Module):
    """AWQ's scaled activation: ``act(x) / scales`` (checkpoint key ``<...>.act.scales``)."""

    def __init__(self, act: nn.Module, size: int, dtype: torch.dtype = torch.float16):
        super().__init__()
        self.act = act
        self.scales = nn.Parameter(torch.empty(size, dtype=dtype), requires_grad=False)

    def forward(self, x):
        return self.act(x) / self.scales.to(x.dtype)
