"""AWQLinear: an int4 linear layer that runs on ``awq::int4_mm``.

Weights are unpacked from the checkpoint format to the canonical form (formats.py) and packed
once, at construction, into the kernel layout (packing.py). ``forward`` only calls the op, so
eager mode, ``torch.compile`` and the Inductor lowering all see the same graph.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from . import formats, packing
from . import ops as _ops  # noqa: F401  (defines torch.ops.awq.int4_mm)


#: Activation quantization choices: None (W4A16) or "int8" (W4A8, dynamic per-token).
ACT_QUANT_CHOICES = (None, "int8")



def _init_int4_module(mod: nn.Module, in_features: int, group_size: int, act_quant: Optional[str],
                      npad: int, bias_len: Optional[int]) -> int:
    """Validate ``group_size``/``act_quant`` and register the packed buffers of a module holding
    ``npad`` (a multiple of 32) weight columns: qweight, scales, zeros (+ comp for W4A8) and an fp32
    bias of ``bias_len`` (None: no bias). Returns the resolved group size."""
    group_size = formats.resolve_group_size(group_size, in_features)
    if group_size % 2:
        raise ValueError(f"group_size: expected an even group size, got {group_size}")
    if act_quant not in ACT_QUANT_CHOICES:
        raise ValueError(f"act_quant: expected one of {ACT_QUANT_CHOICES}, got {act_quant!r}")
    if act_quant == "int8" and (group_size % packing.A8_KSTEP or in_features % packing.A8_KSTEP):
        raise ValueError(f"group_size: act_quant='int8' needs a multiple of {packing.A8_KSTEP}, "
                         f"got {group_size} (in_features={in_features})")
    np_, ng = npad // packing.BLOCK_N, in_features // group_size
    if act_quant == "int8":
        mod.register_buffer("qweight", torch.zeros(np_, in_features // 4, 2 * packing.BLOCK_N, dtype=torch.uint8))
        mod.register_buffer("comp", torch.zeros(ng, npad, dtype=torch.int32))
    else:
        mod.register_buffer("qweight", torch.zeros(np_, in_features // 2, packing.BLOCK_N, dtype=torch.uint8))
    mod.register_buffer("scales", torch.zeros(ng, npad, dtype=torch.float32))
    mod.register_buffer("zeros", torch.zeros(ng, npad, dtype=torch.uint8))
    if bias_len is not None:
        mod.register_buffer("bias", torch.zeros(bias_len, dtype=torch.float32))
    else:
        mod.bias = None
    return group_size


class AWQLinear(nn.Module):
    """y = x @ W.T + bias with W = (q - z) * s stored as int4 in the kernel layout.

    Build it with :meth:`from_awq`, :meth:`from_gptq` or :meth:`from_canonical`.

    ``act_quant``: ``None`` (W4A16: ``awq::int4_mm`` on bf16/fp16/fp32 activations) or ``"int8"``
    (W4A8: ``awq::int4_mm_a8``, activations quantized per token to int8 inside the kernel; weights
    in the layout of :func:`packing.pack_for_int8_kernel` plus a ``comp`` buffer). Fixed when the
    module is built (the packed layout differs); :meth:`with_act_quant` repacks.
    """

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = False,
                 act_quant: Optional[str] = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.act_quant = act_quant
        npad = -(-out_features // packing.BLOCK_N) * packing.BLOCK_N
        self.group_size = _init_int4_module(self, in_features, group_size, act_quant, npad,
                                            out_features if bias else None)

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def from_canonical(cls, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                       bias: Optional[torch.Tensor] = None, *, group_size: int,
                       act_quant: Optional[str] = None) -> "AWQLinear":
        """From the canonical form: q uint8 [N, K], zeros uint8 [N, K/G], scales [N, K/G]."""
        if q.dim() != 2:
            raise ValueError(f"q: expected a 2-D [N, K] tensor, got {list(q.shape)}")
        N, K = q.shape
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
            raise ValueError(f"bias: expected shape [{N}], got {list(bias.shape)}")
        if bias is not None and not bias.is_floating_point():
            raise ValueError(f"bias: expected a floating dtype, got {bias.dtype}")
        group_size = formats.resolve_group_size(group_size, K)
        mod = cls(K, N, group_size, bias=bias is not None, act_quant=act_quant)
        if act_quant == "int8":
            qw, s, z, comp = packing.pack_for_int8_kernel(q, zeros, scales, group_size)
            mod.comp.copy_(comp)
        else:
            qw, s, z = packing.pack_for_kernel(q, zeros, scales, group_size)
        mod.qweight.copy_(qw)
        mod.scales.copy_(s)
        mod.zeros.copy_(z)
        if bias is not None:
            mod.bias.copy_(bias.detach().to(torch.float32))
        return mod

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor] = None, *, group_size: int, format: str = "gemm",
                 act_quant: Optional[str] = None) -> "AWQLinear":
        """From AutoAWQ checkpoint tensors; ``format`` is ``gemm``, ``gemv`` or ``gemv_fast``."""
        q, z, s = formats.unpack_awq(qweight, qzeros, scales, group_size=group_size, format=format)
        return cls.from_canonical(q, z, s, bias, group_size=group_size, act_quant=act_quant)

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  bias: Optional[torch.Tensor] = None, *, group_size: int,
                  checkpoint_format: str = "gptq", act_quant: Optional[str] = None) -> "AWQLinear":
        """From GPTQ (desc_act=False) tensors; ``checkpoint_format`` is ``gptq`` (v1) or ``gptq_v2``."""
        q, z, s = formats.unpack_gptq(qweight, qzeros, scales, group_size, checkpoint_format=checkpoint_format)
        return cls.from_canonical(q, z, s, bias, group_size=group_size, act_quant=act_quant)

    def with_act_quant(self, act_quant: Optional[str]) -> "AWQLinear":
        """This layer repacked for ``act_quant`` (self if it already is); ``awq_source`` is kept."""
        if act_quant == self.act_quant:
            return self
        q, z, s = self.canonical()
        new = type(self).from_canonical(q, z, s, self.bias, group_size=self.group_size, act_quant=act_quant)
        if hasattr(self, "awq_source"):
            new.awq_source = self.awq_source
        return new

    # ---- use ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dim {self.in_features} (in_features), got {x.shape[-1]}")
        lead = x.shape[:-1]
        if self.act_quant == "int8":
            y = torch.ops.awq.int4_mm_a8(x.reshape(-1, self.in_features), self.qweight, self.scales, self.zeros,
                                         self.comp, self.bias, self.group_size, self.out_features)
            return y.reshape(*lead, self.out_features)
        y = torch.ops.awq.int4_mm(x.reshape(-1, self.in_features), self.qweight, self.scales, self.zeros,
                                  self.bias, self.group_size, self.out_features)
        return y.reshape(*lead, self.out_features)

    def canonical(self):
        """(q uint8 [N, K], zeros uint8 [N, K/G], scales fp32 [N, K/G])."""
        if self.act_quant == "int8":
            return packing.unpack_from_int8_kernel(self.qweight, self.scales, self.zeros, self.out_features)
        return packing.unpack_from_kernel(self.qweight, self.scales, self.zeros, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The fp32 [N, K] weight (q - z) * s."""
        if self.act_quant == "int8":
            return packing.dequantize_int8_kernel_layout(self.qweight, self.scales, self.zeros, self.group_size,
                                                         self.out_features)
        return packing.dequantize_kernel_layout(self.qweight, self.scales, self.zeros, self.group_size,
                                                self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}"
                + (f", act_quant={self.act_quant!r}" if self.act_quant else ""))


class AWQGateUpSiluMul(nn.Module):
    """The gate|up projections of a gated MLP with SiLU(gate) * up fused in: ``forward(x)`` returns
    ``silu(x @ Wg.T + bg) * (x @ Wu.T + bu)`` through one ``awq::int4_mm_silu_mul`` call.

    Buffers are the kernel layout of :func:`packing.pack_gate_up_for_kernel` (gate and up 32-column
    panels interleaved) with 2I columns; ``bias`` (fp32 [2I] or None) is interleaved the same way.
    ``out_features`` is I (the output width), ``gate_up_features`` 2I (the stored weight's rows);
    :meth:`canonical` / :meth:`canonical_bias` / :meth:`dequantize` give the [gate ; up] order.
    Needs I % 32 == 0 (every 64-column kernel tile is one gate + one up panel).

    ``act_quant``: ``None`` (W4A16, ``awq::int4_mm_silu_mul``) or ``"int8"`` (W4A8,
    ``awq::int4_mm_a8_silu_mul``: buffers in the layout of :func:`packing.pack_gate_up_for_int8_kernel`,
    same panel interleave, plus ``comp``), like :class:`AWQLinear`; :meth:`with_act_quant` repacks.
    """

    def __init__(self, in_features: int, intermediate_size: int, group_size: int, bias: bool = False,
                 act_quant: Optional[str] = None):
        super().__init__()
        if intermediate_size <= 0 or intermediate_size % packing.BLOCK_N:
            raise ValueError(f"intermediate_size: expected a positive multiple of {packing.BLOCK_N}, "
                             f"got {intermediate_size}")
        self.in_features = in_features
        self.out_features = intermediate_size
        self.gate_up_features = 2 * intermediate_size
        self.act_quant = act_quant
        # gate and up panels interleaved: 2I columns, bias interleaved the same way
        npad = 2 * intermediate_size
        self.group_size = _init_int4_module(self, in_features, group_size, act_quant, npad,
                                            npad if bias else None)

    @classmethod
    def from_canonical(cls, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                       bias: Optional[torch.Tensor] = None, *, group_size: int,
                       intermediate_size: int, act_quant: Optional[str] = None) -> "AWQGateUpSiluMul":
        """From the canonical [gate ; up] form: q uint8 [2I, K], zeros uint8 / scales [2I, K/G]."""
        if q.dim() != 2:
            raise ValueError(f"q: expected a 2-D [2I, K] tensor, got {list(q.shape)}")
        N, K = q.shape
        if N != 2 * intermediate_size:
            raise ValueError(f"q: expected 2 * intermediate_size = {2 * intermediate_size} rows, got {N}")
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != N or not bias.is_floating_point()):
            raise ValueError(f"bias: expected a float [{N}] tensor, got {bias.dtype} {list(bias.shape)}")
        group_size = formats.resolve_group_size(group_size, K)
        mod = cls(K, intermediate_size, group_size, bias=bias is not None, act_quant=act_quant)
        if act_quant == "int8":
            qw, s, z, comp = packing.pack_gate_up_for_int8_kernel(q, zeros, scales, group_size, intermediate_size)
            mod.comp.copy_(comp)
        else:
            qw, s, z = packing.pack_gate_up_for_kernel(q, zeros, scales, group_size, intermediate_size)
        mod.qweight.copy_(qw)
        mod.scales.copy_(s)
        mod.zeros.copy_(z)
        if bias is not None:
            mod.bias.copy_(packing.interleave_gate_up(bias.detach().to(torch.float32), intermediate_size))
        return mod

    @classmethod
    def from_gate_up(cls, gate: "AWQLinear", up: "AWQLinear", *,
                     act_quant: Optional[str] = None) -> "AWQGateUpSiluMul":
        """From two AWQLinear (W4A16 or W4A8: repacked from canonical form either way) with the same
        in_features, out_features and group size; the result is packed for ``act_quant``."""
        for name, m in (("gate", gate), ("up", up)):
            if not isinstance(m, AWQLinear):
                raise ValueError(f"{name}: expected an AWQLinear, got {m!r}")
        if (gate.in_features, gate.out_features, gate.group_size) != (up.in_features, up.out_features, up.group_size):
            raise ValueError(f"up: expected in/out features and group size {(gate.in_features, gate.out_features, gate.group_size)} "
                             f"like gate, got {(up.in_features, up.out_features, up.group_size)}")
        I = gate.out_features
        (qg, zg, sg), (qu, zu, su) = gate.canonical(), up.canonical()
        bias = None
        if gate.bias is not None or up.bias is not None:
            zero = torch.zeros(I, dtype=torch.float32)
            bias = torch.cat([gate.bias if gate.bias is not None else zero, up.bias if up.bias is not None else zero])
        return cls.from_canonical(torch.cat([qg, qu]), torch.cat([zg, zu]), torch.cat([sg, su]), bias,
                                  group_size=gate.group_size, intermediate_size=I, act_quant=act_quant)

    def with_act_quant(self, act_quant: Optional[str]) -> "AWQGateUpSiluMul":
        """This module repacked for ``act_quant`` (self if it already is); ``awq_source`` is kept."""
        if act_quant == self.act_quant:
            return self
        q, z, s = self.canonical()
        new = type(self).from_canonical(q, z, s, self.canonical_bias(), group_size=self.group_size,
                                        intermediate_size=self.out_features, act_quant=act_quant)
        if hasattr(self, "awq_source"):
            new.awq_source = self.awq_source
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dim {self.in_features} (in_features), got {x.shape[-1]}")
        lead = x.shape[:-1]
        if self.act_quant == "int8":
            y = torch.ops.awq.int4_mm_a8_silu_mul(x.reshape(-1, self.in_features), self.qweight, self.scales,
                                                  self.zeros, self.comp, self.bias, self.group_size,
                                                  self.out_features)
            return y.reshape(*lead, self.out_features)
        y = torch.ops.awq.int4_mm_silu_mul(x.reshape(-1, self.in_features), self.qweight, self.scales, self.zeros,
                                           self.bias, self.group_size, self.out_features)
        return y.reshape(*lead, self.out_features)

    def canonical(self):
        """[gate ; up] (q uint8 [2I, K], zeros uint8 [2I, K/G], scales fp32 [2I, K/G])."""
        if self.act_quant == "int8":
            return packing.unpack_gate_up_from_int8_kernel(self.qweight, self.scales, self.zeros, self.out_features)
        return packing.unpack_gate_up_from_kernel(self.qweight, self.scales, self.zeros, self.out_features)

    def canonical_bias(self) -> Optional[torch.Tensor]:
        """fp32 [2I] bias in [gate ; up] order, or None."""
        return None if self.bias is None else packing.deinterleave_gate_up(self.bias, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The fp32 [2I, K] weight [Wg ; Wu]."""
        return packing.dequantize_canonical(*self.canonical(), self.group_size)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, intermediate_size={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}, act=silu(gate)*up"
                + (f", act_quant={self.act_quant!r}" if self.act_quant else ""))
