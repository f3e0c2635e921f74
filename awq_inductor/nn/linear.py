"""The int4 modules: :class:`AWQLinear` (``awq::int4_mm`` / ``int4_mm_a8``) and
:class:`AWQGateUpSiluMul` (``awq::int4_mm_silu_mul`` / ``int4_mm_a8_silu_mul``).

Weights are unpacked from the checkpoint format to the canonical form (formats.py) and packed
once, at construction, into the layout of the module's op (:data:`awq_inductor.schemes.OPS`).
``forward`` only calls the op, so eager mode, ``torch.compile`` and the Inductor lowering all see
the same graph. ``act_quant`` picks the scheme (None: W4A16, "int8": W4A8) and is fixed when the
module is built (the packed layout differs); ``with_act_quant`` repacks.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .. import formats, packing
from .. import ops as _ops  # noqa: F401  (defines torch.ops.awq.*)
from ..schemes import GATE_UP_SILU, LINEAR, Op, OpSpec, op_for


class _PackedInt4(nn.Module):
    """Buffers and forward shared by the int4 modules: the packed weights of ``op`` (qweight,
    scales, zeros, + comp for W4A8) with ``columns`` packed columns and an fp32 bias or None."""

    SPEC: OpSpec
    #: read whole by every call: placed on huge pages at load (kernels.hugepages)
    STREAMED_TENSORS = ("qweight",)

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool,
                 act_quant: Optional[str]):
        super().__init__()
        op = op_for(act_quant, self.SPEC)
        self.in_features = in_features
        self.out_features = out_features
        self.act_quant = act_quant
        group_size = formats.resolve_group_size(group_size, in_features)
        gm = op.scheme.group_multiple
        if group_size % gm or in_features % gm:
            what = "an even group size" if gm == 2 else f"a multiple of {gm} for act_quant={act_quant!r}"
            raise ValueError(f"group_size: expected {what}, got {group_size} (in_features={in_features})")
        self.group_size = group_size
        npad = -(-op.columns(out_features) // packing.BLOCK_N) * packing.BLOCK_N
        ng = in_features // group_size
        scheme = op.scheme
        self.register_buffer("qweight", torch.zeros(npad // packing.BLOCK_N, in_features // scheme.k_per_row,
                                                    scheme.row_bytes, dtype=torch.uint8))
        for w in scheme.weights[1:]:
            self.register_buffer(w.name, torch.zeros(ng, npad, dtype=w.dtype))
        if bias:
            self.register_buffer("bias", torch.zeros(op.columns(out_features), dtype=torch.float32))
        else:
            self.bias = None
        # GPTQ act-order: the weights are stored with K sorted by g_idx (contiguous groups), so x is
        # gathered by the same permutation before the op; non-persistent (save_pretrained writes
        # g_idx back through the checkpoint format)
        self.register_buffer("perm", None, persistent=False)

    def set_input_perm(self, perm: Optional[torch.Tensor]):
        """Use ``x[..., perm]`` as the op's input (act-order); None: x as is. Returns self."""
        if perm is not None:
            perm = perm.to(torch.int64)
            if tuple(perm.shape) != (self.in_features,):
                raise ValueError(f"perm: expected int64 [{self.in_features}], got {list(perm.shape)}")
        self.perm = None if perm is None else perm.contiguous()
        return self

    @property
    def op(self) -> Op:
        return op_for(self.act_quant, self.SPEC)

    def _load_canonical(self, q, zeros, scales, bias) -> None:
        op = self.op
        for w, t in zip(op.scheme.weights, op.pack(q, zeros, scales, self.group_size, self.out_features)):
            getattr(self, w.name).copy_(t)
        if bias is not None:
            self.bias.copy_(op.pack_bias(bias, self.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dim {self.in_features} (in_features), got {x.shape[-1]}")
        op = self.op
        weights = [getattr(self, w.name) for w in op.scheme.weights]
        x2 = x.reshape(-1, self.in_features)
        if self.perm is not None:
            x2 = _gather_input(x2, self.perm)
        y = op.torch_op(x2, *weights, self.bias, self.group_size, self.out_features)
        return y.reshape(*x.shape[:-1], self.out_features)

    def canonical(self):
        """(q uint8 [N, K], zeros uint8 [N, K/G], scales fp32 [N, K/G]); gate|up: rows [gate ; up]."""
        return self.op.unpack(self.qweight, self.scales, self.zeros, self.out_features)

    def canonical_bias(self) -> Optional[torch.Tensor]:
        """fp32 bias in canonical order ([gate ; up] for the gate|up module), or None."""
        return self.op.unpack_bias(self.bias, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight (q - z) * s in canonical order, in the model's input order (an act-order
        module's sorted columns put back)."""
        w = packing.dequantize_canonical(*self.canonical(), self.group_size)
        return w if self.perm is None else w.index_select(1, formats.base.invert_perm(self.perm))

    def with_act_quant(self, act_quant: Optional[str]):
        """This module repacked for ``act_quant`` (self if it already is); ``awq_source`` is kept."""
        if act_quant == self.act_quant:
            return self
        new = self._from_canonical_like(*self.canonical(), self.canonical_bias(), act_quant)
        new.set_input_perm(self.perm)
        if getattr(self, "awq_source", None) is not None:
            new.awq_source = self.awq_source
        return new

    def _repr_quant(self) -> str:
        return f", act_quant={self.act_quant!r}" if self.act_quant else ""


def _gather_input(x2: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``x2[:, perm]`` for the act-order modules. Eager decode (one row) gathers the 1-D view along
    dim 0: 2.7 us against 9.0 us for index_select along the last dim of [1, 4096] bf16 (11008:
    5.1 us against 22 us; 1 thread, torch 2.13), which is what keeps the gather near 1% of a
    K=4096 decode GEMV. Compiled: one index_select, which Inductor fuses into its own loop."""
    if x2.shape[0] == 1 and not torch.compiler.is_compiling():
        return x2.reshape(-1).index_select(0, perm).reshape(1, -1)
    return x2.index_select(-1, perm)


def same_perm(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    """Whether two act-order input permutations are the same (None: identity)."""
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)


def _check_bias(bias: Optional[torch.Tensor], n: int) -> None:
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n):
        raise ValueError(f"bias: expected shape [{n}], got {list(bias.shape)}")
    if bias is not None and not bias.is_floating_point():
        raise ValueError(f"bias: expected a floating dtype, got {bias.dtype}")


class AWQLinear(_PackedInt4):
    """y = x @ W.T + bias with W = (q - z) * s stored as int4 in the kernel layout.

    Build it with :meth:`from_awq`, :meth:`from_gptq` or :meth:`from_canonical`. ``act_quant``:
    ``None`` (W4A16: ``awq::int4_mm`` on bf16/fp16/fp32 activations) or ``"int8"`` (W4A8:
    ``awq::int4_mm_a8``, activations quantized per token to int8 inside the kernel).
    """

    SPEC = LINEAR

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = False,
                 act_quant: Optional[str] = None):
        super().__init__(in_features, out_features, group_size, bias, act_quant)

    @classmethod
    def from_canonical(cls, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                       bias: Optional[torch.Tensor] = None, *, group_size: int,
                       act_quant: Optional[str] = None) -> "AWQLinear":
        """From the canonical form: q uint8 [N, K], zeros uint8 [N, K/G], scales [N, K/G]."""
        if q.dim() != 2:
            raise ValueError(f"q: expected a 2-D [N, K] tensor, got {list(q.shape)}")
        N, K = q.shape
        _check_bias(bias, N)
        mod = cls(K, N, formats.resolve_group_size(group_size, K), bias=bias is not None, act_quant=act_quant)
        mod._load_canonical(q, zeros, scales, bias)
        return mod

    def _from_canonical_like(self, q, zeros, scales, bias, act_quant):
        return type(self).from_canonical(q, zeros, scales, bias, group_size=self.group_size, act_quant=act_quant)

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
                  format: str = "gptq", act_quant: Optional[str] = None) -> "AWQLinear":
        """From GPTQ (desc_act=False) tensors; ``format`` is ``gptq`` (v1) or ``gptq_v2``."""
        q, z, s = formats.unpack_gptq(qweight, qzeros, scales, group_size, format=format)
        return cls.from_canonical(q, z, s, bias, group_size=group_size, act_quant=act_quant)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}" + self._repr_quant()
                + (", act_order=True" if self.perm is not None else ""))


class AWQGateUpSiluMul(_PackedInt4):
    """The gate|up projections of a gated MLP with SiLU(gate) * up fused in: ``forward(x)`` returns
    ``silu(x @ Wg.T + bg) * (x @ Wu.T + bu)`` through one ``awq::int4_mm_silu_mul`` call
    (``awq::int4_mm_a8_silu_mul`` with ``act_quant="int8"``).

    The buffers hold 2I columns, gate and up 32-column panels interleaved (``bias`` too);
    ``out_features`` is I (the output width), ``gate_up_features`` 2I. :meth:`canonical` /
    :meth:`canonical_bias` / :meth:`dequantize` give the [gate ; up] order. Needs I % 32 == 0
    (every 64-column kernel tile is one gate + one up panel).
    """

    SPEC = GATE_UP_SILU

    def __init__(self, in_features: int, intermediate_size: int, group_size: int, bias: bool = False,
                 act_quant: Optional[str] = None):
        if intermediate_size <= 0 or intermediate_size % packing.BLOCK_N:
            raise ValueError(f"intermediate_size: expected a positive multiple of {packing.BLOCK_N}, "
                             f"got {intermediate_size}")
        super().__init__(in_features, intermediate_size, group_size, bias, act_quant)
        self.gate_up_features = 2 * intermediate_size

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
        mod = cls(K, intermediate_size, formats.resolve_group_size(group_size, K), bias=bias is not None,
                  act_quant=act_quant)
        mod._load_canonical(q, zeros, scales, bias)
        return mod

    def _from_canonical_like(self, q, zeros, scales, bias, act_quant):
        return type(self).from_canonical(q, zeros, scales, bias, group_size=self.group_size,
                                         intermediate_size=self.out_features, act_quant=act_quant)

    @classmethod
    def from_gate_up(cls, gate: AWQLinear, up: AWQLinear, *,
                     act_quant: Optional[str] = None) -> "AWQGateUpSiluMul":
        """From two AWQLinear (W4A16 or W4A8: repacked from canonical form either way) with the same
        in_features, out_features and group size; the result is packed for ``act_quant``."""
        for name, m in (("gate", gate), ("up", up)):
            if not isinstance(m, AWQLinear):
                raise ValueError(f"{name}: expected an AWQLinear, got {m!r}")
        shape = (gate.in_features, gate.out_features, gate.group_size)
        if shape != (up.in_features, up.out_features, up.group_size):
            raise ValueError(f"up: expected in/out features and group size {shape} like gate, "
                             f"got {(up.in_features, up.out_features, up.group_size)}")
        if not same_perm(gate.perm, up.perm):
            raise ValueError("up: expected the same act-order input permutation as gate")
        I = gate.out_features
        (qg, zg, sg), (qu, zu, su) = gate.canonical(), up.canonical()
        bias = None
        if gate.bias is not None or up.bias is not None:
            zero = torch.zeros(I, dtype=torch.float32)
            bias = torch.cat([gate.bias if gate.bias is not None else zero, up.bias if up.bias is not None else zero])
        return cls.from_canonical(torch.cat([qg, qu]), torch.cat([zg, zu]), torch.cat([sg, su]), bias,
                                  group_size=gate.group_size, intermediate_size=I,
                                  act_quant=act_quant).set_input_perm(gate.perm)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, intermediate_size={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}, act=silu(gate)*up"
                + self._repr_quant())
