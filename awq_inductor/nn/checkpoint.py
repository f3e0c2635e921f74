"""Loading placeholders: modules that receive checkpoint tensors exactly as stored, before the
model pass (:func:`awq_inductor.transform.convert`) turns them into :class:`AWQLinear`; and
:func:`read_canonical`, the one reader of any int4 module's weights in canonical form. No
transformers import: the transformers integration creates the placeholders, the model pass consumes them.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional

import torch
from torch import nn

from .. import formats
from ..formats import Canonical, CheckpointSource
from .linear import AWQLinear, _PackedInt4


class CheckpointInt4Linear(nn.Module):
    """Receives one int4 linear's checkpoint tensors (the format's tensors, e.g. ``qweight``,
    ``qzeros``, ``scales``; optional ``bias`` and ``g_idx``) exactly as stored; it has no forward
    of its own.

    ``num_experts``: the tensors of E experts stacked on a leading dim (fused 3-D MoE checkpoints,
    ``mlp.experts.gate_up_proj.qweight`` [E, ...]): each ``t[e]`` is one expert's tensor in the
    format's 2-D layout."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, group_size: int, format,
                 dtypes: Optional[Dict[str, torch.dtype]] = None, g_idx: bool = False,
                 num_experts: Optional[int] = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = formats.resolve_group_size(group_size, in_features)
        self.checkpoint_format = formats.get(format)
        self.num_experts = num_experts
        dtypes = dtypes or {}
        for name, (shape, dt) in self.expected_shapes(bias, g_idx).items():
            self.register_buffer(name, torch.empty(shape, dtype=dtypes.get(name, dt)))
        if not bias:
            self.bias = None
        if not g_idx:
            self.g_idx = None

    @property
    def format(self) -> str:
        return self.checkpoint_format.name

    def expected_shapes(self, bias: bool, g_idx: bool) -> Dict[str, tuple]:
        """name -> (shape, default dtype) of the checkpoint tensors this module receives."""
        out = dict(self.checkpoint_format.shapes(self.in_features, self.out_features, self.group_size))
        if bias:
            out["bias"] = ((self.out_features,), torch.float16)
        if g_idx:
            out["g_idx"] = ((self.in_features,), torch.int32)
        if self.num_experts is not None:
            out = {k: ((self.num_experts, *shape), dt) for k, (shape, dt) in out.items()}
        return out

    def canonical(self, expert: Optional[int] = None) -> Canonical:
        """The stored tensors (of one ``expert`` of a stacked placeholder) in canonical form."""
        if (expert is None) != (self.num_experts is None):
            raise ValueError("CheckpointInt4Linear: pass expert=e exactly for a stacked (per-expert) placeholder")
        stored = {t: getattr(self, t) for t in self.checkpoint_format.tensors}
        if self.g_idx is not None:
            stored["g_idx"] = self.g_idx
        if expert is not None:
            stored = {k: v[expert] for k, v in stored.items()}
        if "g_idx" in stored and not self.checkpoint_format.has_g_idx:
            formats.check_g_idx(stored["g_idx"], self.in_features, self.group_size)
        return self.checkpoint_format.unpack_stored(stored, self.group_size)

    def canonical_and_perm(self):
        """(:class:`Canonical`, perm or None): an act-order g_idx (GPTQ desc_act) is sorted once here,
        the canonical form permuted to contiguous groups (``formats.base.act_order_perm``)."""
        fmt = self.checkpoint_format
        if self.g_idx is not None and self.num_experts is None and hasattr(fmt, "unpack_act_order"):
            args = [getattr(self, t) for t in fmt.tensors]
            return fmt.unpack_act_order(*args, self.group_size, self.g_idx)
        return self.canonical(), None

    def source(self) -> CheckpointSource:
        return CheckpointSource(format=self.format, scales_dtype=getattr(self, self.checkpoint_format.scales_tensor).dtype,
                                bias_dtype=None if self.bias is None else self.bias.dtype)

    def forward(self, x):  # pragma: no cover - replaced before use
        raise RuntimeError("CheckpointInt4Linear is a loading placeholder; run awq_inductor.convert(model)")

    def extra_repr(self) -> str:
        e = "" if self.num_experts is None else f"num_experts={self.num_experts}, "
        return (f"{e}in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, format={self.format}, bias={self.bias is not None}")


class Int4Weights(NamedTuple):
    """An int4 linear's weights in canonical form, read once from whatever module holds them."""

    canonical: Canonical
    bias: Optional[torch.Tensor]
    group_size: int
    source: CheckpointSource
    #: act-order input permutation (int64 [K]) or None
    perm: Optional[torch.Tensor] = None


def _foreign_weights(mod: nn.Module) -> Int4Weights:
    bits = getattr(mod, "w_bit", getattr(mod, "bits", None))
    if bits != 4:
        raise NotImplementedError(f"{type(mod).__name__}: only 4-bit int4 linears are supported, got {bits} bits")
    fmt = formats.module_format(mod)
    in_f = getattr(mod, "in_features", None)
    if in_f is None:
        in_f = fmt.infer_shape(mod.qweight)[0]
    gs = int(mod.group_size)
    gs = in_f if gs in (-1, 0) else gs
    bias = getattr(mod, "bias", None)
    bias = bias if isinstance(bias, torch.Tensor) else None
    g_idx = getattr(mod, "g_idx", None) if fmt.has_g_idx else None
    can = fmt.unpack(mod.qweight, mod.qzeros, mod.scales, gs, g_idx=g_idx if isinstance(g_idx, torch.Tensor) else None)
    src = CheckpointSource(format=fmt.name, scales_dtype=mod.scales.dtype, bias_dtype=None if bias is None else bias.dtype)
    return Int4Weights(can, bias, gs, src)


def read_canonical(mod: nn.Module) -> Int4Weights:
    """The canonical weights, bias, group size and :class:`CheckpointSource` of any int4 linear: a
    loading placeholder, one of our packed modules, or a gptqmodel / AutoAWQ / llm-awq module
    (:func:`awq_inductor.formats.is_foreign_int4_linear`). The model pass packs from this once, for
    the scheme asked for."""
    if isinstance(mod, CheckpointInt4Linear):
        can, perm = mod.canonical_and_perm()
        return Int4Weights(can, mod.bias, mod.group_size, mod.source(), perm)
    if isinstance(mod, _PackedInt4):
        return Int4Weights(Canonical(*mod.canonical()), mod.canonical_bias(), mod.group_size,
                           formats.source_of(mod), mod.perm)
    if formats.is_foreign_int4_linear(mod):
        return _foreign_weights(mod)
    raise ValueError(f"read_canonical: expected an int4 linear module, got {type(mod).__name__}")


def to_awq_linear(mod: nn.Module, act_quant: Optional[str] = None) -> AWQLinear:
    """An :class:`AWQLinear` packed for ``act_quant`` from any int4 linear (:func:`read_canonical`)."""
    if getattr(mod, "num_experts", None) is not None:
        raise ValueError("CheckpointInt4Linear: a stacked (per-expert) placeholder is converted by the MoE "
                         "pass (transform.moe), not into one AWQLinear")
    w = read_canonical(mod)
    new = AWQLinear.from_canonical(*w.canonical, w.bias, group_size=w.group_size, act_quant=act_quant)
    new.set_input_perm(w.perm)
    new.awq_source = w.source
    return new


class ScaledActivation(nn.Module):
    """AWQ's scaled activation: ``act(x) / scales`` (checkpoint key ``<...>.act.scales``)."""

    def __init__(self, act: nn.Module, size: int, dtype: torch.dtype = torch.float16):
        super().__init__()
        self.act = act
        self.scales = nn.Parameter(torch.empty(size, dtype=dtype), requires_grad=False)

    def forward(self, x):
        return self.act(x) / self.scales.to(x.dtype)
