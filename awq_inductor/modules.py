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


class AWQLinear(nn.Module):
    """y = x @ W.T + bias with W = (q - z) * s stored as int4 in the kernel layout.

    Build it with :meth:`from_awq`, :meth:`from_gptq` or :meth:`from_canonical`.
    """

    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool = False):
        super().__init__()
        group_size = formats.resolve_group_size(group_size, in_features)
        if group_size % 2:
            raise ValueError(f"group_size: expected an even group size, got {group_size}")
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size
        np_ = -(-out_features // packing.BLOCK_N)
        npad = np_ * packing.BLOCK_N
        ng = in_features // group_size
        self.register_buffer("qweight", torch.zeros(np_, in_features // 2, packing.BLOCK_N, dtype=torch.uint8))
        self.register_buffer("scales", torch.zeros(ng, npad, dtype=torch.float32))
        self.register_buffer("zeros", torch.zeros(ng, npad, dtype=torch.uint8))
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float32))
        else:
            self.bias = None

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def from_canonical(cls, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                       bias: Optional[torch.Tensor] = None, *, group_size: int) -> "AWQLinear":
        """From the canonical form: q uint8 [N, K], zeros uint8 [N, K/G], scales [N, K/G]."""
        if q.dim() != 2:
            raise ValueError(f"q: expected a 2-D [N, K] tensor, got {list(q.shape)}")
        N, K = q.shape
        if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
            raise ValueError(f"bias: expected shape [{N}], got {list(bias.shape)}")
        if bias is not None and not bias.is_floating_point():
            raise ValueError(f"bias: expected a floating dtype, got {bias.dtype}")
        group_size = formats.resolve_group_size(group_size, K)
        mod = cls(K, N, group_size, bias=bias is not None)
        qw, s, z = packing.pack_for_kernel(q, zeros, scales, group_size)
        mod.qweight.copy_(qw)
        mod.scales.copy_(s)
        mod.zeros.copy_(z)
        if bias is not None:
            mod.bias.copy_(bias.detach().to(torch.float32))
        return mod

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor] = None, *, group_size: int, format: str = "gemm") -> "AWQLinear":
        """From AutoAWQ checkpoint tensors; ``format`` is ``gemm``, ``gemv`` or ``gemv_fast``."""
        q, z, s = formats.unpack_awq(qweight, qzeros, scales, group_size=group_size, format=format)
        return cls.from_canonical(q, z, s, bias, group_size=group_size)

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  bias: Optional[torch.Tensor] = None, *, group_size: int,
                  checkpoint_format: str = "gptq") -> "AWQLinear":
        """From GPTQ (desc_act=False) tensors; ``checkpoint_format`` is ``gptq`` (v1) or ``gptq_v2``."""
        q, z, s = formats.unpack_gptq(qweight, qzeros, scales, group_size, checkpoint_format=checkpoint_format)
        return cls.from_canonical(q, z, s, bias, group_size=group_size)

    # ---- use ----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dim {self.in_features} (in_features), got {x.shape[-1]}")
        lead = x.shape[:-1]
        y = torch.ops.awq.int4_mm(x.reshape(-1, self.in_features), self.qweight, self.scales, self.zeros,
                                  self.bias, self.group_size, self.out_features)
        return y.reshape(*lead, self.out_features)

    def canonical(self):
        """(q uint8 [N, K], zeros uint8 [N, K/G], scales fp32 [N, K/G])."""
        return packing.unpack_from_kernel(self.qweight, self.scales, self.zeros, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The fp32 [N, K] weight (q - z) * s."""
        return packing.dequantize_kernel_layout(self.qweight, self.scales, self.zeros, self.group_size,
                                                self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"group_size={self.group_size}, bias={self.bias is not None}")
