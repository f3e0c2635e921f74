"""The kernel contract: one table of quantization schemes x op shapes that every layer reads.

A :class:`Scheme` says how the weights are stored and how activations enter the kernel (W4A16:
bf16/fp16/fp32 x; W4A8: x quantized per token to int8). An :class:`OpSpec` says what the op
computes on top of the GEMM (a plain linear, or the gated-MLP gate|up with SiLU(gate) * up). An
:class:`Op` is one pair of them: ``awq::<scheme.op_prefix><spec.suffix>``.

``ops`` defines the torch ops from :data:`OPS`, ``kernels.codegen`` renders the C++ of a scheme
(``scheme.header`` + ``scheme.driver``), ``kernels.native`` binds the eager entry points
(``op.c_entry``), ``inductor.lowering`` registers one lowering per op and ``nn`` packs and calls
through ``op.pack`` / ``op.unpack`` / ``op.call``. Adding an op shape or a scheme is one entry here
plus its C++ (a micro-kernel, or an epilogue under ``csrc_templates/epilogues/``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple

import torch

from . import packing


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A packed weight tensor: op argument name, dtype, C++ pointer type and kernel input name."""

    name: str
    dtype: torch.dtype
    ctype: str
    kernel_input: str


QWEIGHT = Tensor("qweight", torch.uint8, "const uint8_t*", "QW")
SCALES = Tensor("scales", torch.float32, "const float*", "S")
ZEROS = Tensor("zeros", torch.uint8, "const uint8_t*", "Z")
#: W4A8: comp[g, n] = sum_{k in g} (q - z), precomputed for the +128 offset of the u8 activations.
COMP = Tensor("comp", torch.int32, "const int32_t*", "C")


@dataclasses.dataclass(frozen=True, eq=False)
class Scheme:
    """How weights are stored and activations enter the kernel."""

    name: str                       # "w4a16" | "w4a8"
    act_quant: Optional[str]        # the user-facing choice: None | "int8"
    op_prefix: str                  # "int4_mm" | "int4_mm_a8"
    moe_name: str                   # the experts op: "int4_moe" | "int4_moe_a8"
    weights: Tuple[Tensor, ...]     # packed tensors, in op-argument order (after x, before bias)
    k_per_row: int                  # K values per qweight row (qweight is [Np, K / k_per_row, row_bytes])
    row_bytes: int
    group_multiple: int             # group_size must be a multiple of this
    pack: Callable                  # canonical (q, zeros, scales, G) -> weights
    unpack: Callable                # (qweight, scales, zeros, N) -> canonical (q, zeros, scales)
    header: str                     # csrc_templates/schemes/<...>: the scheme's plan for the driver
    driver: str                     # C++ entry name of the driver for this scheme (golden regions)
    note: str = ""                  # appended to the op name in the generated code's comment
    int16_x: bool = False           # its decode rows can run bf16 x as int16 fixed point (DecodeSetting.int16_x)
    two_k_streams: bool = False     # its one-row decode kernels can read a tile's K range as two segments side
                                    # by side (DecodeSetting.k_streams = 2)


W4A16 = Scheme(
    name="w4a16", act_quant=None, op_prefix="int4_mm", moe_name="int4_moe", weights=(QWEIGHT, SCALES, ZEROS),
    k_per_row=2, row_bytes=packing.BLOCK_N, group_multiple=2,
    pack=packing.pack_for_kernel, unpack=packing.unpack_from_kernel,
    header="schemes/w4a16.h.j2", driver="int4_mm_driver", int16_x=True, two_k_streams=True)
W4A8 = Scheme(
    name="w4a8", act_quant="int8", op_prefix="int4_mm_a8", moe_name="int4_moe_a8", weights=(QWEIGHT, SCALES, ZEROS, COMP),
    k_per_row=4, row_bytes=2 * packing.BLOCK_N, group_multiple=packing.A8_KSTEP,
    pack=packing.pack_for_int8_kernel, unpack=packing.unpack_from_int8_kernel,
    header="schemes/w4a8.h.j2", driver="int4_mm_a8_driver", note=" (W4A8, per-token int8 x)",
    two_k_streams=True)
SCHEMES: Dict[Optional[str], Scheme] = {s.act_quant: s for s in (W4A16, W4A8)}
#: The ``act_quant`` values modules, the model pass and the transformers patch accept.
ACT_QUANT_CHOICES = tuple(SCHEMES)


def scheme_for(act_quant: Optional[str]) -> Scheme:
    """The scheme of an ``act_quant`` choice; ValueError naming the choices otherwise."""
    if act_quant not in SCHEMES:
        raise ValueError(f"act_quant: expected one of {ACT_QUANT_CHOICES}, got {act_quant!r}")
    return SCHEMES[act_quant]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """What the op computes on top of the GEMM."""

    name: str                       # "linear" | "gate_up_silu"
    suffix: str                     # op-name suffix: "" | "_silu_mul"
    columns_per_output: int         # packed weight columns per output column (gate|up: 2)
    epilogue: Optional[str] = None  # csrc_templates/epilogues/<...> applied to each fp32 tile


LINEAR = OpSpec("linear", "", 1)
#: Gate and up in interleaved 32-column panels (packing.interleave_gate_up): every 64-column driver
#: tile is one gate + one up panel, and the epilogue writes silu(gate) * up, 32 outputs.
GATE_UP_SILU = OpSpec("gate_up_silu", "_silu_mul", 2, epilogue="epilogues/silu_mul.h.j2")
OP_SPECS = (LINEAR, GATE_UP_SILU)


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    """``awq::<name>(x, *weights, bias, group_size, out_features) -> [M, out_features]``."""

    scheme: Scheme
    spec: OpSpec

    @property
    def name(self) -> str:
        return self.scheme.op_prefix + self.spec.suffix

    @property
    def c_entry(self) -> str:
        """Prefix of the eager ``extern "C"`` entry point (``_<dtype>`` follows)."""
        return "awq_" + self.name

    @property
    def schema(self) -> str:
        weights = ", ".join(f"Tensor {w.name}" for w in self.scheme.weights)
        return f"(Tensor x, {weights}, Tensor? bias, int group_size, int out_features) -> Tensor"

    @property
    def torch_op(self):
        """``torch.ops.awq.<name>`` (defined by :mod:`awq_inductor.ops`)."""
        return getattr(torch.ops.awq, self.name)

    def columns(self, out_features: int) -> int:
        """Packed weight columns (the driver's N) for ``out_features`` outputs."""
        return self.spec.columns_per_output * out_features

    def pack(self, q, zeros, scales, group_size: int, out_features: int):
        """Canonical (rows in [gate ; up] order for the gate|up op) -> the packed weights."""
        if self.spec.columns_per_output == 2:
            packing.check_gate_up_rows(q.shape[0], out_features, "q")
            q, zeros, scales = (packing.interleave_gate_up(t, out_features) for t in (q, zeros, scales))
        return self.scheme.pack(q, zeros, scales, group_size)

    def unpack(self, qweight, scales, zeros, out_features: int):
        """Inverse of :meth:`pack` (W4A8's ``comp`` is derived, not needed)."""
        q, z, s = self.scheme.unpack(qweight, scales, zeros, self.columns(out_features))
        if self.spec.columns_per_output == 2:
            q, z, s = (packing.deinterleave_gate_up(t, out_features) for t in (q, z, s))
        return q, z, s

    def pack_bias(self, bias: torch.Tensor, out_features: int) -> torch.Tensor:
        bias = bias.detach().to(torch.float32)
        return packing.interleave_gate_up(bias, out_features) if self.spec.columns_per_output == 2 else bias

    def unpack_bias(self, bias: Optional[torch.Tensor], out_features: int) -> Optional[torch.Tensor]:
        if bias is None or self.spec.columns_per_output == 1:
            return bias
        return packing.deinterleave_gate_up(bias, out_features)


OPS: Dict[str, Op] = {op.name: op for op in (Op(s, spec) for s in (W4A16, W4A8) for spec in OP_SPECS)}


def op_for(act_quant: Optional[str], spec: OpSpec) -> Op:
    return OPS[scheme_for(act_quant).op_prefix + spec.suffix]


# ---------------------------------------------------------------------------------------------
# Mixture of experts: one op per scheme over all experts of a layer (awq_inductor.moe)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class MoeOp:
    """``awq::int4_moe`` (W4A16) / ``awq::int4_moe_a8`` (W4A8): all experts of a sparse-MoE layer.

    ``w13`` holds every expert's gate|up weight packed like :data:`GATE_UP_SILU` (2I interleaved
    columns, K = H), stacked on a leading expert dim; ``w2`` every expert's down weight packed like
    :data:`LINEAR` (H columns, K = I). The kernel runs the scheme's driver on both (no other
    driver): ``out[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t]))``, e = ids[t, j]."""

    scheme: Scheme

    @property
    def name(self) -> str:
        return self.scheme.moe_name

    @property
    def c_entry(self) -> str:
        return "awq_" + self.name

    @property
    def w13(self) -> Op:
        return Op(self.scheme, GATE_UP_SILU)

    @property
    def w2(self) -> Op:
        return Op(self.scheme, LINEAR)

    def weight_names(self):
        """Op argument names of the packed tensors, in order: w13_* then w2_*."""
        return [f"{p}_{w.name}" for p in ("w13", "w2") for w in self.scheme.weights]

    @property
    def schema(self) -> str:
        weights = ", ".join(f"Tensor {n}" for n in self.weight_names())
        return (f"(Tensor x, Tensor topk_ids, Tensor topk_weights, {weights}, int group_size, "
                f"int intermediate_size) -> Tensor")

    @property
    def torch_op(self):
        return getattr(torch.ops.awq, self.name)


MOE_OPS: Dict[str, MoeOp] = {m.name: m for m in (MoeOp(W4A16), MoeOp(W4A8))}


def moe_op_for(act_quant: Optional[str]) -> MoeOp:
    return MOE_OPS[scheme_for(act_quant).moe_name]
