"""Reference paths we compare against (benchmarks and the ``python -m awq_inductor`` report).

``Int4PackLinear`` is what transformers 5 + gptqmodel run for AWQ on CPU
(``TorchAtenAwqLinear``): ``aten._weight_int4pack_mm_for_cpu`` with the float zero
``(8 - z) * s``, since aten computes ``(q - 8) * s + zero``. It needs N % 16 == 0 and
G in {32, 64, 128, 256}.
"""
from __future__ import annotations

import torch
from torch import nn

from .nn import AWQGateUpSiluMul, AWQLinear, AWQMoEExperts

ATEN_GROUP_SIZES = (32, 64, 128, 256)


class Int4PackLinear(nn.Module):
    """The gptqmodel-style CPU path for one int4 linear layer (a baseline, not our kernel)."""

    def __init__(self, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, bias, group_size: int,
                 dtype: torch.dtype):
        super().__init__()
        N, K = q.shape
        if N % 16 or group_size not in ATEN_GROUP_SIZES:
            raise ValueError(f"Int4PackLinear: aten int4pack needs N % 16 == 0 and G in {ATEN_GROUP_SIZES}, "
                             f"got N={N}, G={group_size}")
        self.in_features, self.out_features, self.group_size = K, N, group_size
        self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
        s = scales.t().float()
        zf = (8 - zeros.t().float()) * s
        self.register_buffer("scales_and_zeros", torch.stack([s, zf], dim=-1).to(dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    @classmethod
    def from_awq_linear(cls, lin: AWQLinear, dtype: torch.dtype) -> "Int4PackLinear":
        q, z, s = lin.canonical()
        return cls(q, z, s, lin.bias, lin.group_size, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.scales_and_zeros.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.weight, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features).to(x.dtype)


class GateUpSiluMul(nn.Module):
    """``silu(y[..., :I]) * y[..., I:]`` over one [gate ; up] linear: what a baseline runs in place
    of our fused :class:`AWQGateUpSiluMul` kernel."""

    def __init__(self, gate_up: nn.Module, intermediate_size: int):
        super().__init__()
        self.gate_up = gate_up
        self.intermediate_size = intermediate_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gate_up(x)
        return nn.functional.silu(y[..., :self.intermediate_size]) * y[..., self.intermediate_size:]


def _replace(model: nn.Module, linear, gate_up) -> nn.Module:
    for name, mod in list(model.named_modules()):
        if isinstance(mod, AWQLinear):
            model.set_submodule(name, linear(mod))
        elif isinstance(mod, AWQGateUpSiluMul):
            model.set_submodule(name, GateUpSiluMul(gate_up(mod), mod.out_features))
    return model


def to_int4pack(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace (in place) every AWQLinear with :class:`Int4PackLinear` and every fused gate|up
    module with the aten int4pack gate|up linear followed by ``silu * mul``."""
    def gate_up(m: AWQGateUpSiluMul):
        q, z, s = m.canonical()
        return Int4PackLinear(q, z, s, m.canonical_bias(), m.group_size, dtype)

    return _replace(model, lambda m: Int4PackLinear.from_awq_linear(m, dtype), gate_up)


def _dense_linear(w: torch.Tensor, bias, dtype: torch.dtype) -> nn.Linear:
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w.to(dtype))
        if bias is not None:
            lin.bias.copy_(bias.to(dtype))
    return lin


class DenseMoEExperts(nn.Module):
    """Float experts with transformers' 3-D layout (``gate_up_proj`` [E, 2I, H], ``down_proj``
    [E, H, I]) and the loop of transformers' eager experts forward: the dense baseline of an
    :class:`AWQMoEExperts`."""

    def __init__(self, m: AWQMoEExperts, dtype: torch.dtype):
        super().__init__()
        parts = [m.dequantize(e) for e in range(m.num_experts)]
        self.gate_up_proj = nn.Parameter(torch.stack([p[0] for p in parts]).to(dtype), requires_grad=False)
        self.down_proj = nn.Parameter(torch.stack([p[1] for p in parts]).to(dtype), requires_grad=False)
        self.intermediate_size = m.intermediate_size

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in top_k_index.unique().tolist():
            tok, slot = torch.where(top_k_index == e)
            gu = nn.functional.linear(hidden_states[tok], self.gate_up_proj[e])
            h = nn.functional.silu(gu[:, :self.intermediate_size]) * gu[:, self.intermediate_size:]
            y = nn.functional.linear(h, self.down_proj[e]) * top_k_weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def to_dense(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace (in place) every int4 module with ``nn.Linear`` on its dequantized weight (in
    ``dtype``; MoE experts: :class:`DenseMoEExperts`): the dense model computing the same function,
    for speed and accuracy baselines."""
    for name, mod in list(model.named_modules()):
        if isinstance(mod, AWQMoEExperts):
            model.set_submodule(name, DenseMoEExperts(mod, dtype))
    return _replace(model, lambda m: _dense_linear(m.dequantize(), m.bias, dtype),
                    lambda m: _dense_linear(m.dequantize(), m.canonical_bias(), dtype))
