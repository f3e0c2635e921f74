"""The tensor-parallel modules: a row-parallel int4 linear, MoE experts split over their
intermediate dim, the vocabulary-parallel head; all reduce / gather with functional collectives
(graph ops: no graph break under torch.compile)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..nn import AWQLinear, AWQMoEExperts


class TPError(ValueError):
    """A model that cannot be sharded as asked (names the layer, expected and actual value)."""


# ---------------------------------------------------------------------------------------------
# The row-parallel module
# ---------------------------------------------------------------------------------------------
class RowParallelLinear(nn.Module):
    """``all_reduce(linear(x), "sum") + bias``: the local K-slice of a row-parallel int4 linear.

    ``linear`` is an :class:`AWQLinear` without bias over this rank's K-slice; ``bias`` (fp32 [N]
    or None) is added after the reduce, so it counts once. ``in_features`` is the local K,
    ``out_features`` the full N."""

    def __init__(self, linear: AWQLinear, bias: Optional[torch.Tensor], group, world_size: int):
        super().__init__()
        self.linear = linear
        self.group = group
        self.world_size = world_size
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        if bias is not None:
            self.register_buffer("bias", bias.detach().to(torch.float32).clone())
        else:
            self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _all_reduce(self.linear(x), self.group, self.world_size, "RowParallelLinear")
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"world_size={self.world_size}, bias={self.bias is not None} (after all_reduce)"


class ParallelRMSNorm(nn.Module):
    """An RMSNorm over a whole projection whose features are split over the ranks (OLMoE's
    ``q_norm`` / ``k_norm`` over all heads): the mean of squares from an all-reduce of each rank's
    sum over its own features, then the norm's own math on them (fp32, its eps, the rank's slice of
    its weight: ``weight * (x * rsqrt(mean + eps)).to(dtype)``, as transformers' RMSNorm). One small
    all-reduce ([tokens, 1]) per norm and call."""

    def __init__(self, weight: torch.Tensor, eps: float, features: int, group, world_size: int):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.variance_epsilon = float(eps)
        self.features = int(features)  # the whole projection's width (all ranks)
        self.group = group
        self.world_size = world_size

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        squares = _all_reduce(h.pow(2).sum(-1, keepdim=True), self.group, self.world_size, "ParallelRMSNorm")
        h = h * torch.rsqrt(squares / self.features + self.variance_epsilon)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)} of {self.features}, eps={self.variance_epsilon}, world_size={self.world_size}"


def _all_reduce(y: torch.Tensor, group, world_size: int, who: str) -> torch.Tensor:
    """``all_reduce(y, "sum")`` over ``group`` as a graph op (no graph break under torch.compile)."""
    if world_size == 1:
        return y
    from torch.distributed import _functional_collectives as funcol

    if group is None:
        raise RuntimeError(f"{who}: sharded with an explicit rank / world_size and no process group, so there "
                           "is nothing to all-reduce over")
    return funcol.all_reduce(y, "sum", group)


class ParallelMoEExperts(nn.Module):
    """The experts of one sparse-MoE layer split over the intermediate dim: ``local`` holds, for
    every expert, gate and up rows and down columns ``[r*I/W, (r+1)*I/W)``; ``forward`` (the
    signature of :class:`~awq_inductor.nn.AWQMoEExperts`) is ``all_reduce(local(...), "sum")``.
    Every rank reads 1/W of each selected expert's bytes per token and routes alike (the router
    is replicated), so no token is exchanged: one all-reduce per layer, as for a dense MLP."""

    def __init__(self, local: AWQMoEExperts, group, world_size: int):
        super().__init__()
        self.local = local
        self.group = group
        self.world_size = world_size

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return _all_reduce(self.local(hidden_states, top_k_index, top_k_weights), self.group, self.world_size,
                           "ParallelMoEExperts")

    def extra_repr(self) -> str:
        return f"world_size={self.world_size}"


class VocabParallelLMHead(nn.Module):
    """The output projection split over the vocabulary: ``all_gather(x @ W_r.T + b_r)`` along the last
    dim, W_r = rows ``[r*V/W, (r+1)*V/W)`` of the dense ``lm_head`` (V padded with zero rows to a
    multiple of W, the padding sliced off after the gather). Each rank reads 1/W of the head per token."""

    STREAMED_TENSORS = ("weight",)  # read whole per decoded token (kernels.hugepages)

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor], vocab_size: int, group, world_size: int):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().contiguous(), requires_grad=False)
        self.vocab_size = vocab_size
        self.group = group
        self.world_size = world_size
        self.in_features, self.out_features = weight.shape[1], vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(x, self.weight, self.bias)
        if self.world_size > 1:
            from torch.distributed import _functional_collectives as funcol

            if self.group is None:
                raise RuntimeError("VocabParallelLMHead: sharded with an explicit rank / world_size and no "
                                   "process group, so there is nothing to gather over")
            y = funcol.all_gather_single(y.contiguous(), y.dim() - 1, self.group)
        if y.shape[-1] != self.vocab_size:
            y = y[..., :self.vocab_size]
        return y

    def extra_repr(self) -> str:
        return f"local_rows={self.weight.shape[0]}, vocab_size={self.vocab_size}, world_size={self.world_size}"


