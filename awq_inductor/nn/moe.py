"""Mixture-of-experts modules: :class:`AWQMoEExperts` (all experts of a layer on one
``awq::int4_moe`` / ``int4_moe_a8`` call) and the loading placeholder :class:`CheckpointMoEExperts`.

``AWQMoEExperts.forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`` has the
signature of transformers 5's experts modules (``Qwen3MoeExperts``, ``Qwen2MoeExperts``,
``MixtralExperts``), so it replaces them in place: the router (softmax / top-k / renormalisation
as each architecture does it) and Qwen2-MoE's shared expert stay the architecture's own PyTorch code.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import formats, packing
from ..ops import moe as _moe
from ..families import DEFAULT_EXPERT_NAMES, FUSED_EXPERT_NAMES
from ..schemes import moe_op_for
from .linear import AWQLinear

Canonical = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]
class AWQMoEExperts(nn.Module):
    """E experts (SiLU(gate) * up, then down, no biases) packed for ``awq::int4_moe`` (W4A16) or
    ``awq::int4_moe_a8`` (``act_quant="int8"``). Buffers ``w13_*`` (gate|up of every expert, panels
    interleaved) and ``w2_*`` (down), stacked on a leading expert dim. I % 32 == 0."""

    #: the selected experts' weights are read whole at every call: huge pages at load (kernels.hugepages)
    STREAMED_TENSORS = ("w13_qweight", "w2_qweight")

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, group_size: int,
                 act_quant: Optional[str] = None):
        super().__init__()
        if intermediate_size <= 0 or intermediate_size % packing.BLOCK_N:
            raise ValueError(f"intermediate_size: expected a positive multiple of {packing.BLOCK_N}, "
                             f"got {intermediate_size}")
        mop = moe_op_for(act_quant)
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.act_quant = act_quant
        G = formats.resolve_group_size(group_size, hidden_size)
        gm = mop.scheme.group_multiple
        if hidden_size % G or intermediate_size % G or G % gm:
            raise ValueError(f"group_size: expected a multiple of {gm} dividing hidden_size={hidden_size} and "
                             f"intermediate_size={intermediate_size}, got {group_size}")
        self.group_size = G
        s = mop.scheme
        for prefix, n, k in (("w13", 2 * intermediate_size, hidden_size), ("w2", hidden_size, intermediate_size)):
            np_ = -(-n // packing.BLOCK_N)
            self.register_buffer(f"{prefix}_qweight", torch.zeros(num_experts, np_, k // s.k_per_row, s.row_bytes,
                                                                  dtype=torch.uint8))
            for w in s.weights[1:]:
                self.register_buffer(f"{prefix}_{w.name}", torch.zeros(num_experts, k // G, np_ * packing.BLOCK_N,
                                                                       dtype=w.dtype))

    @property
    def op(self):
        return moe_op_for(self.act_quant)

    def weights(self) -> List[torch.Tensor]:
        return [getattr(self, n) for n in self.op.weight_names()]

    @classmethod
    def from_canonical(cls, gate_up: Sequence[Canonical], down: Sequence[Canonical], *, group_size: int,
                       act_quant: Optional[str] = None) -> "AWQMoEExperts":
        """``gate_up[e]``: canonical (q, z, s) with rows [gate (I) ; up (I)], K = H;
        ``down[e]``: canonical [H, I]."""
        if not gate_up or len(gate_up) != len(down):
            raise ValueError(f"down: expected as many experts as gate_up ({len(gate_up)}), got {len(down)}")
        two_i, H = gate_up[0][0].shape
        for e, (gu, dn) in enumerate(zip(gate_up, down)):
            if tuple(gu[0].shape) != (two_i, H):
                raise ValueError(f"gate_up[{e}]: expected q [{two_i}, {H}] like expert 0, got {list(gu[0].shape)}")
            if tuple(dn[0].shape) != (H, two_i // 2):
                raise ValueError(f"down[{e}]: expected q [{H}, {two_i // 2}], got {list(dn[0].shape)}")
        mod = cls(len(gate_up), H, two_i // 2, group_size, act_quant)
        for buf, t in zip(mod.weights(), _moe.pack_experts(mod.op, gate_up, down, mod.group_size, two_i // 2)):
            buf.copy_(t)
        return mod

    @classmethod
    def from_linears(cls, experts: Sequence[Tuple[AWQLinear, AWQLinear, AWQLinear]], *,
                     act_quant: Optional[str] = None) -> "AWQMoEExperts":
        """From per-expert (gate, up, down) :class:`AWQLinear` of one group size."""
        G = experts[0][0].group_size
        gate_up, down = [], []
        for e, (g, u, d) in enumerate(experts):
            for what, m in (("gate", g), ("up", u), ("down", d)):
                if m.group_size != G or m.bias is not None:
                    raise ValueError(f"experts.{e}.{what}: expected group size {G} and no bias (one op for all "
                                     f"experts), got group size {m.group_size}, bias={m.bias is not None}")
            (qg, zg, sg), (qu, zu, su) = g.canonical(), u.canonical()
            gate_up.append((torch.cat([qg, qu]), torch.cat([zg, zu]), torch.cat([sg, su])))
            down.append(d.canonical())
        return cls.from_canonical(gate_up, down, group_size=G, act_quant=act_quant)

    def expert_canonical(self, e: int) -> Tuple[Canonical, Canonical]:
        """Expert ``e``: (canonical [gate ; up] [2I, H], canonical down [H, I]), scales fp32."""
        return _moe.expert_canonical(self.op, self.weights(), e, self.hidden_size, self.intermediate_size)

    def dequantize(self, e: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """fp32 (gate_up [2I, H], down [H, I]) of expert ``e``."""
        gu, dn = self.expert_canonical(e)
        return (packing.dequantize_canonical(*gu, self.group_size), packing.dequantize_canonical(*dn, self.group_size))

    def with_act_quant(self, act_quant: Optional[str]) -> "AWQMoEExperts":
        if act_quant == self.act_quant:
            return self
        parts = [self.expert_canonical(e) for e in range(self.num_experts)]
        new = type(self).from_canonical([p[0] for p in parts], [p[1] for p in parts], group_size=self.group_size,
                                        act_quant=act_quant)
        if getattr(self, "awq_source", None) is not None:
            new.awq_source = self.awq_source
        return new

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states.reshape(-1, self.hidden_size)
        y = self.op.torch_op(x, top_k_index.reshape(x.shape[0], -1), top_k_weights.reshape(x.shape[0], -1),
                             *self.weights(), self.group_size, self.intermediate_size)
        return y.reshape(hidden_states.shape)

    def extra_repr(self) -> str:
        q = f", act_quant={self.act_quant!r}" if self.act_quant else ""
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, group_size={self.group_size}{q}")


class CheckpointMoEExpert(nn.Module):
    """One expert's three projections under their checkpoint names (loading only)."""

    def forward(self, x):  # pragma: no cover - replaced before use
        raise RuntimeError("CheckpointMoEExpert is a loading placeholder; run awq_inductor.convert(model)")


class CheckpointMoEExperts(nn.Module):
    """Stands in for a transformers experts module while an int4 MoE checkpoint loads. Two layouts:

    * per expert (``fused=False``): ``<e>.<gate|up|down name>`` are ``nn.Linear``, so
      ``mlp.experts.E.gate_proj.qweight`` keys land in modules of those names;
    * fused 3-D (``fused=True``): ``gate_up_proj`` (out 2I = [gate ; up], in H) and ``down_proj``
      (out H, in I), each marked with ``awq_num_experts = E``, receive
      ``mlp.experts.gate_up_proj.qweight`` [E, ...]: every expert's tensors in the format's 2-D
      layout stacked on a leading dim, gate|up packed as one linear of 2I outputs (gate first, as
      transformers' float ``gate_up_proj`` [E, 2I, H]).

    The transformers integration turns those ``nn.Linear`` into
    :class:`~awq_inductor.nn.CheckpointInt4Linear` (stacked for the fused layout), so every missing
    or misshapen tensor is reported by the same checks as any int4 linear. The model pass replaces
    this module with :class:`AWQMoEExperts`."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 names: Tuple[str, str, str] = DEFAULT_EXPERT_NAMES, fused: bool = False):
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.names = tuple(names)
        self.fused = fused
        if fused:
            for name, k, n in ((FUSED_EXPERT_NAMES[0], hidden_size, 2 * intermediate_size),
                               (FUSED_EXPERT_NAMES[1], intermediate_size, hidden_size)):
                lin = nn.Linear(k, n, bias=False)
                lin.awq_num_experts = num_experts
                self.add_module(name, lin)
            return
        for e in range(num_experts):
            ex = CheckpointMoEExpert()
            g, u, d = self.names
            ex.add_module(g, nn.Linear(hidden_size, intermediate_size, bias=False))
            ex.add_module(u, nn.Linear(hidden_size, intermediate_size, bias=False))
            ex.add_module(d, nn.Linear(intermediate_size, hidden_size, bias=False))
            self.add_module(str(e), ex)

    def expert_modules(self, e: int) -> Tuple[nn.Module, nn.Module, nn.Module]:
        ex = getattr(self, str(e))
        return tuple(getattr(ex, n) for n in self.names)  # type: ignore[return-value]

    def forward(self, *args):  # pragma: no cover - replaced before use
        raise RuntimeError("CheckpointMoEExperts is a loading placeholder; run awq_inductor.convert(model)")

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, names={self.names}, fused={self.fused}")
