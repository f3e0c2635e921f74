"""Tensor parallelism over ``torch.distributed``: one process per socket / NUMA node.

    torchrun --nproc-per-node 2 -m awq_inductor --tp 2            # the demo, sharded

    import torch.distributed as dist, awq_inductor
    from awq_inductor.transform import tp
    dist.init_process_group("gloo")
    model = AutoModelForCausalLM.from_pretrained(awq_dir)            # patch_transformers() + convert
    tp.shard(model)                                                   # group=None: the WORLD group
    model.forward = torch.compile(model.forward, backend="awq_inductor")

:func:`shard` rewrites a *converted* model (:func:`awq_inductor.convert`) in place, Megatron /
gpt-fast style, on every rank of ``group`` (all ranks must hold the same full model):

- **attention**: the fused ``qkv_proj`` (or separate q/k/v) is column-parallel by heads: rank r
  keeps query heads ``[r*Hq/W, (r+1)*Hq/W)`` and whole KV heads ``[r*Hkv/W, (r+1)*Hkv/W)`` (GQA
  groups stay on one rank, so ``num_key_value_groups`` is unchanged); the ``OutputSlice`` bounds
  are rewritten for the local widths. ``o_proj`` is row-parallel: its K (= Hq*d) is split on the
  same head boundaries, which must fall on group boundaries (``(Hq/W)*d % G == 0``).
  ``model.config.num_attention_heads`` / ``num_key_value_heads`` become the per-rank counts
  (``head_dim`` is written explicitly first), so caches built from the config are per rank; the
  attention forward itself views with ``-1`` heads.
- **gated MLP**: gate|up is column-parallel, both halves split alike (rank r keeps gate and up rows
  ``[r*I/W, (r+1)*I/W)``, split in the canonical [gate ; up] order and interleaved per rank for
  :class:`~awq_inductor.nn.AWQGateUpSiluMul`); ``down_proj`` is row-parallel over K = I.
- **row-parallel layers** become :class:`RowParallelLinear`: the local int4 GEMM (no bias), then
  ``torch.distributed._functional_collectives.all_reduce(y, "sum", group)`` (a graph op, so
  ``torch.compile`` keeps it in the graph, no graph break), then the bias, added once.
- **MoE experts** (:class:`~awq_inductor.nn.AWQMoEExperts`) are split like a gated MLP inside
  every expert: rank r keeps gate and up rows and down columns ``[r*I/W, (r+1)*I/W)`` of each
  expert (:class:`ParallelMoEExperts`: the experts op on the local slices, then one all-reduce).
  The router (and Qwen2-MoE's shared-expert gate) is replicated, so every rank routes alike and
  reads 1/W of each selected expert; a shared expert is a gated MLP, split as above.
- a dense ``lm_head`` is split over the vocabulary (:class:`VocabParallelLMHead`: local rows, then
  ``all_gather_tensor`` of the logits along the last dim), so each rank reads 1/W of it per token
  (``vocab_parallel=False`` replicates it); embedding and norms are replicated.

Weights are split in the canonical form (q uint8 [N, K], zeros / scales [N, K/G]) and packed again
per rank, so every checkpoint format and both schemes (W4A16, W4A8 ``act_quant="int8"``) shard
alike. Everything is checked before the model is modified: a layout that cannot be split raises
:class:`TPError` naming the layer, the expected and the actual value.

Loading: :func:`load` builds this rank's shard straight from the safetensors files (the same model
as ``shard(from_pretrained(...))``), reading only the slices of the int4 tensors the rank keeps
(``safe_open(...).get_slice``); layouts without a clean slice are read whole and sliced in canonical
form (see :func:`_read_int4`). ``shard`` remains for a model that is already loaded.

:func:`rank_cores` / :func:`pin_rank` give each local rank its own cores (from the NUMA layout in
``/sys/devices/system/node`` when it splits evenly, else an even split of the affinity mask).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .model_pass import OutputSlice
from ..nn import AWQGateUpSiluMul, AWQLinear, AWQMoEExperts
from ..nn.head import Bf16HeadLinear

#: dense heads (convert's default lm_head="bf16" switches a bf16 nn.Linear to Bf16HeadLinear in place)
_DENSE_HEADS = (nn.Linear, Bf16HeadLinear)


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
            y = funcol.all_gather_tensor(y.contiguous(), gather_dim=y.dim() - 1, group=self.group)
        if y.shape[-1] != self.vocab_size:
            y = y[..., :self.vocab_size]
        return y

    def extra_repr(self) -> str:
        return f"local_rows={self.weight.shape[0]}, vocab_size={self.vocab_size}, world_size={self.world_size}"


def _plan_lm_head(model: nn.Module, rank: int, world: int, group) -> Plan:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) not in _DENSE_HEADS or world == 1:
        return []  # not a dense head (or nothing to split): replicated
    name = next(n for n, m in model.named_modules() if m is head)
    parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    V = head.out_features
    v = -(-V // world)
    w = head.weight.detach()
    b = head.bias.detach() if head.bias is not None else None
    if v * world != V:
        w = torch.cat([w, w.new_zeros(v * world - V, w.shape[1])])
        b = None if b is None else torch.cat([b, b.new_zeros(v * world - V)])
    sl = slice(rank * v, (rank + 1) * v)
    new = VocabParallelLMHead(w[sl].clone(), None if b is None else b[sl].clone(), V, group, world)
    return [(parent, name.rpartition(".")[2], new)]


# ---------------------------------------------------------------------------------------------
# Slicing in canonical form
# ---------------------------------------------------------------------------------------------
def _rows(ranges: Sequence[Tuple[int, int]]) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in ranges])


def _source(mod, **extra):
    src = dict(getattr(mod, "awq_source", None) or {})
    src.update(extra)
    return src


def _column_linear(name: str, lin: AWQLinear, ranges: Sequence[Tuple[int, int]]) -> AWQLinear:
    """The output rows ``ranges`` of ``lin`` (canonical slice, packed again)."""
    q, z, s = lin.canonical()
    idx = _rows(ranges)
    bias = lin.bias.detach()[idx] if lin.bias is not None else None
    try:
        new = AWQLinear.from_canonical(q[idx].contiguous(), z[idx].contiguous(), s[idx].contiguous(), bias,
                                       group_size=lin.group_size, act_quant=lin.act_quant)
    except ValueError as e:
        raise TPError(f"{name}: {e}") from e
    new.awq_source = _source(lin, tp_rows=list(ranges))
    return new


def _check_k_split(name: str, k_local: int, group_size: int, what: str) -> None:
    if k_local % group_size:
        raise TPError(f"{name}: row-parallel split of K needs K / world_size ({what}) to be a multiple of "
                      f"group_size {group_size}, got {k_local}")


def _row_linear(name: str, lin: AWQLinear, k0: int, k1: int, group, world: int) -> RowParallelLinear:
    """Columns [k0, k1) of ``lin``'s K as a :class:`RowParallelLinear` (bias after the reduce)."""
    G = lin.group_size
    if k0 % G or k1 % G:
        raise TPError(f"{name}: row-parallel K slice [{k0}, {k1}) must start and end on group boundaries "
                      f"(group_size {G})")
    q, z, s = lin.canonical()
    try:
        inner = AWQLinear.from_canonical(q[:, k0:k1].contiguous(), z[:, k0 // G:k1 // G].contiguous(),
                                         s[:, k0 // G:k1 // G].contiguous(), None, group_size=G,
                                         act_quant=lin.act_quant)
    except ValueError as e:
        raise TPError(f"{name}: {e}") from e
    inner.awq_source = _source(lin, tp_cols=(k0, k1))
    return RowParallelLinear(inner, lin.bias, group, world)


def _need(name: str, mod, cls, what: str):
    if not isinstance(mod, cls):
        raise TPError(f"{name}: expected {what} to be {cls.__name__} (convert the model first, "
                      f"and only int4 projections are sharded), got {type(mod).__name__}")
    return mod


# ---------------------------------------------------------------------------------------------
# Planning: every new module is built (and every check made) before anything is replaced
# ---------------------------------------------------------------------------------------------
Plan = List[Tuple[nn.Module, str, nn.Module]]  # (parent, attribute, new module)


def _plan_attention(name: str, attn: nn.Module, hq_all: int, hkv_all: int, rank: int, world: int,
                    group) -> Plan:
    d = getattr(attn, "head_dim", None)
    if not isinstance(d, int):
        raise TPError(f"{name}: expected an attention module with an int head_dim, got {d!r}")
    if hq_all % world or hkv_all % world:
        raise TPError(f"{name}: attention heads must divide over the {world} ranks (whole KV heads per rank): "
                      f"num_attention_heads={hq_all}, num_key_value_heads={hkv_all}")
    hq, hkv = hq_all // world, hkv_all // world
    widths = {"q_proj": hq_all * d, "k_proj": hkv_all * d, "v_proj": hkv_all * d}
    local = {"q_proj": hq * d, "k_proj": hkv * d, "v_proj": hkv * d}
    plan: Plan = []
    mods = attn._modules
    if isinstance(mods.get("qkv_proj"), AWQLinear) and all(isinstance(mods.get(p), OutputSlice) for p in widths):
        fused = mods["qkv_proj"]
        ranges, off = [], 0
        for p, n in widths.items():
            sl = mods[p]
            if (sl.start, sl.stop) != (off, off + n):
                raise TPError(f"{name}.{p}: expected qkv_proj[..., {off}:{off + n}] ({n // d} heads x {d}), "
                              f"got [{sl.start}:{sl.stop}]")
            ranges.append((off + rank * local[p], off + (rank + 1) * local[p]))
            off += n
        if fused.out_features != off:
            raise TPError(f"{name}.qkv_proj: expected out_features {off}, got {fused.out_features}")
        plan.append((attn, "qkv_proj", _column_linear(f"{name}.qkv_proj", fused, ranges)))
        off = 0
        for p in widths:
            plan.append((attn, p, OutputSlice(off, off + local[p], "qkv_proj")))
            off += local[p]
    elif all(isinstance(mods.get(p), AWQLinear) for p in widths) and "qkv_proj" not in mods:
        for p, n in widths.items():
            lin = mods[p]
            if lin.out_features != n:
                raise TPError(f"{name}.{p}: expected out_features {n}, got {lin.out_features}")
            plan.append((attn, p, _column_linear(f"{name}.{p}", lin, [(rank * local[p], (rank + 1) * local[p])])))
    else:
        kinds = {p: type(mods.get(p)).__name__ for p in ("qkv_proj", *widths)}
        raise TPError(f"{name}: unsupported attention projections for tensor parallelism: expected a fused "
                      f"AWQLinear qkv_proj with OutputSlice q/k/v or three AWQLinear, got {kinds}")
    o = _need(f"{name}.o_proj", mods.get("o_proj"), AWQLinear, "o_proj")
    if o.in_features != hq_all * d:
        raise TPError(f"{name}.o_proj: expected in_features {hq_all * d}, got {o.in_features}")
    _check_k_split(f"{name}.o_proj", hq * d, o.group_size, f"{hq} heads x {d}")
    plan.append((attn, "o_proj", _row_linear(f"{name}.o_proj", o, rank * hq * d, (rank + 1) * hq * d, group, world)))
    return plan


def _plan_mlp(name: str, mlp: nn.Module, rank: int, world: int, group) -> Plan:
    mods = mlp._modules
    plan: Plan = []
    gu = mods.get("gate_up_proj")
    if isinstance(gu, AWQGateUpSiluMul):
        I = gu.out_features
        if I % world or (I // world) % 32:
            raise TPError(f"{name}.gate_up_proj: intermediate_size / world_size must be a multiple of 32 "
                          f"(the fused SiLU*mul panels), got {I} / {world}")
        i = I // world
        q, z, s = gu.canonical()
        idx = _rows([(rank * i, (rank + 1) * i), (I + rank * i, I + (rank + 1) * i)])
        bias = gu.canonical_bias()
        try:
            new = AWQGateUpSiluMul.from_canonical(q[idx].contiguous(), z[idx].contiguous(), s[idx].contiguous(),
                                                  None if bias is None else bias[idx], group_size=gu.group_size,
                                                  intermediate_size=i, act_quant=gu.act_quant)
        except ValueError as e:
            raise TPError(f"{name}.gate_up_proj: {e}") from e
        new.awq_source = _source(gu, tp_rows=(rank * i, (rank + 1) * i))
        plan.append((mlp, "gate_up_proj", new))
    elif isinstance(gu, AWQLinear) and isinstance(mods.get("gate_proj"), OutputSlice) \
            and isinstance(mods.get("up_proj"), OutputSlice):
        I = mods["gate_proj"].stop - mods["gate_proj"].start
        if (mods["gate_proj"].start, mods["up_proj"].start, mods["up_proj"].stop, gu.out_features) != (0, I, 2 * I, 2 * I):
            raise TPError(f"{name}: expected gate_up_proj = [gate ; up] with OutputSlice bounds [0:{I}], [{I}:{2 * I}]")
        if I % world:
            raise TPError(f"{name}.gate_up_proj: intermediate_size {I} must divide over {world} ranks")
        i = I // world
        plan.append((mlp, "gate_up_proj", _column_linear(f"{name}.gate_up_proj", gu,
                                                         [(rank * i, (rank + 1) * i), (I + rank * i, I + (rank + 1) * i)])))
        plan += [(mlp, "gate_proj", OutputSlice(0, i, "gate_up_proj")),
                 (mlp, "up_proj", OutputSlice(i, 2 * i, "gate_up_proj"))]
    elif gu is None and isinstance(mods.get("gate_proj"), AWQLinear) and isinstance(mods.get("up_proj"), AWQLinear):
        I = mods["gate_proj"].out_features
        if I % world or mods["up_proj"].out_features != I:
            raise TPError(f"{name}: gate/up out_features ({I}, {mods['up_proj'].out_features}) must be equal and "
                          f"divide over {world} ranks")
        i = I // world
        for p in ("gate_proj", "up_proj"):
            plan.append((mlp, p, _column_linear(f"{name}.{p}", mods[p], [(rank * i, (rank + 1) * i)])))
    else:
        kinds = {p: type(mods.get(p)).__name__ for p in ("gate_up_proj", "gate_proj", "up_proj")}
        raise TPError(f"{name}: unsupported MLP projections for tensor parallelism: expected AWQGateUpSiluMul "
                      f"gate_up_proj, a fused AWQLinear gate_up_proj with OutputSlice gate/up, or two AWQLinear, "
                      f"got {kinds}")
    down = _need(f"{name}.down_proj", mods.get("down_proj"), AWQLinear, "down_proj")
    if down.in_features != I:
        raise TPError(f"{name}.down_proj: expected in_features {I} (intermediate_size), got {down.in_features}")
    _check_k_split(f"{name}.down_proj", I // world, down.group_size, f"{I} / {world}")
    plan.append((mlp, "down_proj", _row_linear(f"{name}.down_proj", down, rank * (I // world),
                                               (rank + 1) * (I // world), group, world)))
    return plan


def _plan_moe(name: str, parent: nn.Module, attr: str, rank: int, world: int, group) -> Plan:
    """Split every expert of ``parent.<attr>`` (an AWQMoEExperts) over its intermediate dim."""
    ex = parent._modules[attr]
    I, G = ex.intermediate_size, ex.group_size
    if I % world or (I // world) % 32 or (I // world) % G:
        raise TPError(f"{name}: expert intermediate_size / world_size must be a multiple of 32 (the fused SiLU*mul "
                      f"panels) and of the group size {G} (down_proj's K split), got {I} / {world}")
    i = I // world
    lo, hi = rank * i, (rank + 1) * i
    rows = _rows([(lo, hi), (I + lo, I + hi)])
    gate_up, down = [], []
    for e in range(ex.num_experts):
        (q, z, s), (dq, dz, ds) = ex.expert_canonical(e)
        gate_up.append((q[rows].contiguous(), z[rows].contiguous(), s[rows].contiguous()))
        down.append((dq[:, lo:hi].contiguous(), dz[:, lo // G:hi // G].contiguous(), ds[:, lo // G:hi // G].contiguous()))
    try:
        local = AWQMoEExperts.from_canonical(gate_up, down, group_size=G, act_quant=ex.act_quant)
    except ValueError as e:
        raise TPError(f"{name}: {e}") from e
    local.awq_source = _source(ex, tp_rows=(lo, hi))
    return [(parent, attr, ParallelMoEExperts(local, group, world))]


def _group_rank_world(group, rank, world_size) -> Tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise TPError("shard: torch.distributed is not initialized (call dist.init_process_group('gloo') "
                      "first, e.g. under torchrun), and no explicit rank / world_size were given")
    return dist.get_rank(group), dist.get_world_size(group)


def shard(model: nn.Module, group=None, *, vocab_parallel: bool = True, rank: Optional[int] = None,
          world_size: Optional[int] = None) -> nn.Module:
    """Shard a converted model for tensor parallelism over ``group`` in place; returns ``model``.

    ``group``: a ``torch.distributed`` process group (None: the default WORLD group). ``rank`` and
    ``world_size`` default to this process's rank and the group's size. Passing both explicitly
    with ``group=None`` needs no process group: the checks run and rank ``rank``'s shard is built
    (to validate a model or inspect a shard), but its ``forward`` raises when ``world_size`` > 1.
    See the module doc for the layout. Raises :class:`TPError` (nothing modified) when a layer
    cannot be split. ``vocab_parallel``: split a dense ``lm_head`` over the vocabulary
    (:class:`VocabParallelLMHead`, logits all-gathered; default) instead of replicating it.
    """
    explicit = rank is not None and world_size is not None
    rank, world = _group_rank_world(group, rank, world_size)
    if world < 1 or not 0 <= rank < world:
        raise TPError(f"shard: expected 0 <= rank < world_size, got rank={rank}, world_size={world}")
    if getattr(model, "_awq_tp", None) is not None:
        raise TPError(f"shard: the model is already sharded ({model._awq_tp})")
    if group is None and not explicit:
        import torch.distributed as dist

        group = dist.group.WORLD
    cfg = getattr(model, "config", None)
    text_cfg = cfg.get_text_config(decoder=True) if cfg is not None and hasattr(cfg, "get_text_config") else cfg
    hq_all = getattr(text_cfg, "num_attention_heads", None)
    hkv_all = getattr(text_cfg, "num_key_value_heads", None) or hq_all
    plan: Plan = []
    n_mlp = n_moe = 0
    attns = []
    for name, mod in model.named_modules():
        if "o_proj" in mod._modules and any(p in mod._modules for p in ("qkv_proj", "q_proj")):
            if hq_all is None:
                raise TPError(f"{name}: the model config has no num_attention_heads")
            plan += _plan_attention(name, mod, hq_all, hkv_all, rank, world, group)
            attns.append(mod)
        elif "down_proj" in mod._modules:
            plan += _plan_mlp(name, mod, rank, world, group)
            n_mlp += 1
        for attr, child in mod._modules.items():
            if isinstance(child, AWQMoEExperts):
                plan += _plan_moe(f"{name}.{attr}" if name else attr, mod, attr, rank, world, group)
                n_moe += 1
    if not attns and n_mlp == 0 and n_moe == 0:
        raise TPError("shard: found no attention (o_proj + q/k/v) or MLP (down_proj) modules to shard")
    replaced = {id(parent._modules.get(attr)) for parent, attr, _ in plan}
    left = [n for n, m in model.named_modules() if isinstance(m, (AWQLinear, AWQGateUpSiluMul))
            and id(m) not in replaced]
    if left:
        raise TPError(f"shard: int4 modules outside the attention / MLP patterns would be left replicated: "
                      f"{left[:8]}{' ...' if len(left) > 8 else ''}")
    if vocab_parallel:
        plan += _plan_lm_head(model, rank, world, group)
    for parent, attr, new in plan:
        parent._modules[attr] = new
    if text_cfg is not None and hq_all is not None:
        if attns:
            text_cfg.head_dim = attns[0].head_dim
        text_cfg.num_attention_heads = hq_all // world
        text_cfg.num_key_value_heads = hkv_all // world
    for m in attns:  # attention modules that keep their own head counts (other transformers versions)
        for attr in ("num_heads", "num_key_value_heads"):
            if isinstance(getattr(m, attr, None), int):
                setattr(m, attr, getattr(m, attr) // world)
    model._awq_tp = {"rank": rank, "world_size": world, "num_attention_heads": hq_all,
                     "num_key_value_heads": hkv_all, "attention_layers": len(attns), "mlp_layers": n_mlp,
                     "moe_layers": n_moe,
                     "vocab_parallel": isinstance(model.get_output_embeddings(), VocabParallelLMHead)
                     if hasattr(model, "get_output_embeddings") else False}
    return model


# ---------------------------------------------------------------------------------------------
# Cores per rank
# ---------------------------------------------------------------------------------------------
def parse_cpulist(text: str) -> List[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11]."""
    out: List[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def numa_nodes(root: str = "/sys/devices/system/node") -> List[List[int]]:
    """CPU lists of the NUMA nodes that have CPUs ([] when the layout cannot be read)."""
    nodes = []
    try:
        names = sorted((n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()),
                       key=lambda n: int(n[4:]))
        for n in names:
            with open(os.path.join(root, n, "cpulist")) as f:
                cpus = parse_cpulist(f.read())
            if cpus:
                nodes.append(cpus)
    except OSError:
        return []
    return nodes


def rank_cores(local_rank: int, local_world: int, spec: Optional[str] = None,
               nodes: Optional[List[List[int]]] = None, allowed: Optional[Sequence[int]] = None) -> List[int]:
    """The cores of ``local_rank`` out of ``local_world`` ranks on this machine.

    ``spec``: explicit core lists, one per local rank, separated by ``;`` or ``/`` (``"0-27;28-55"``).
    Default: if the NUMA nodes (restricted to the affinity mask) divide evenly over the ranks, rank r
    gets nodes ``[r*k, (r+1)*k)``; otherwise the affinity mask is split into ``local_world`` even
    contiguous chunks."""
    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    allowed = sorted(allowed)
    if spec:
        lists = [parse_cpulist(s) for s in spec.replace("/", ";").split(";") if s.strip()]
        if len(lists) != local_world:
            raise ValueError(f"cores: expected {local_world} core lists (one per local rank), got {len(lists)}: {spec!r}")
        if not lists[local_rank]:
            raise ValueError(f"cores: empty core list for local rank {local_rank}: {spec!r}")
        return lists[local_rank]
    if nodes is None:
        nodes = numa_nodes()
    nodes = [c for c in ([x for x in n if x in set(allowed)] for n in nodes) if c]
    if len(nodes) >= local_world and len(nodes) % local_world == 0 and len(nodes) > 1:
        k = len(nodes) // local_world
        return sorted(c for n in nodes[local_rank * k:(local_rank + 1) * k] for c in n)
    if len(allowed) < local_world:
        raise ValueError(f"cores: {local_world} local ranks but only {len(allowed)} allowed cores {allowed}")
    per, extra = divmod(len(allowed), local_world)
    start = local_rank * per + min(local_rank, extra)
    return allowed[start:start + per + (1 if local_rank < extra else 0)]


def pin_rank(cores: Sequence[int], threads: Optional[int] = None) -> int:
    """Restrict this process (and the OpenMP threads it creates afterwards) to ``cores`` and use one
    torch thread per core (or ``threads``). Returns the thread count."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    n = threads or len(cores)
    torch.set_num_threads(n)
    return n


def env_rank() -> Dict[str, int]:
    """rank / world_size / local_rank / local_world_size from torchrun's environment variables."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return {"rank": int(os.environ.get("RANK", "0")), "world_size": world,
            "local_rank": int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))}


def init_from_env(tp_size: int, cores: Optional[str] = None, threads: Optional[int] = None,
                  backend: str = "gloo") -> Dict[str, object]:
    """Set up this process as one rank of a ``tp_size``-way run launched by torchrun: check
    ``WORLD_SIZE``, pin it to its cores (:func:`rank_cores`, ``cores`` as there), set the torch
    threads (one per core unless ``threads``) and initialize the default process group (``gloo``;
    a 1-rank group without torchrun when ``tp_size`` is 1). Returns rank, world_size, cores, threads."""
    import torch.distributed as dist

    env = env_rank()
    if env["world_size"] != tp_size:
        raise ValueError(f"--tp {tp_size}: expected WORLD_SIZE={tp_size} (launch with "
                         f"torchrun --nproc-per-node {tp_size} -m awq_inductor --tp {tp_size}), got {env['world_size']}")
    my = rank_cores(env["local_rank"], env["local_world_size"], cores)
    n = pin_rank(my, threads)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend)
        else:  # a single process without torchrun
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return {"rank": env["rank"], "world_size": env["world_size"], "cores": my, "threads": n}


# ---------------------------------------------------------------------------------------------
# Per-rank loading: each rank reads only its slices of the int4 tensors from the safetensors files
# ---------------------------------------------------------------------------------------------
_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # output rows split
_ROW = ("o_proj", "down_proj")  # input columns (K) split, all_reduce after


class _SliceReader:
    """The tensors of a safetensors checkpoint (one file or an index), read through
    ``safe_open(...).get_slice(key)[...]`` so only the requested elements are copied out of the file.
    Counts what was requested: ``read_bytes[key]`` (bytes), ``whole`` (keys read in full)."""

    def __init__(self, model_dir: str):
        import json

        from safetensors import safe_open

        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(os.path.join(model_dir, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            raise TPError(f"load: no model.safetensors or model.safetensors.index.json in {model_dir}")
        self.handles, self.file_of, self.shapes = {}, {}, {}
        for fn in files:
            h = safe_open(os.path.join(model_dir, fn), framework="pt")
            self.handles[fn] = h
            for k in h.keys():
                self.file_of[k] = fn
                self.shapes[k] = tuple(h.get_slice(k).get_shape())
        self.read_bytes: Dict[str, int] = {}
        self.whole: set = set()

    def __contains__(self, key: str) -> bool:
        return key in self.file_of

    def get(self, key: str, *index) -> torch.Tensor:
        """``tensor[index]`` (basic slices only); the whole tensor without ``index``."""
        sl = self.handles[self.file_of[key]].get_slice(key)
        t = sl[tuple(index)] if index else sl[:]
        if not index or tuple(t.shape) == self.shapes[key]:
            self.whole.add(key)
        self.read_bytes[key] = self.read_bytes.get(key, 0) + t.numel() * t.element_size()
        return t

    def total_bytes(self, keys=None) -> int:
        import math

        keys = self.file_of if keys is None else keys
        sizes = {}
        for fn, h in self.handles.items():
            for k in h.keys():
                if k in keys:
                    t = h.get_slice(k)
                    sizes[k] = math.prod(t.get_shape()) * _DTYPE_BYTES.get(t.get_dtype(), 4)
        return sum(sizes.values())


_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I16": 2, "I64": 8, "U8": 1, "I8": 1, "BOOL": 1, "F64": 8}


def _quant_info(cfg) -> Tuple[str, int]:
    """(checkpoint format, group_size) from the config's quantization_config."""
    qc = getattr(cfg, "quantization_config", None)
    if qc is None:
        raise TPError("load: the checkpoint config has no quantization_config (expected an AWQ or GPTQ int4 checkpoint)")
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = str(qc.get("quant_method", "")).lower()
    if int(qc.get("bits", qc.get("w_bit", 4))) != 4:
        raise TPError(f"load: only 4-bit checkpoints are supported, got bits={qc.get('bits', qc.get('w_bit'))}")
    gs = int(qc.get("group_size", qc.get("q_group_size", -1)))
    if method == "awq":
        fmt = str(qc.get("version", qc.get("format", "gemm"))).lower()
        fmt = "gemv_fast" if fmt == "llm-awq" else fmt
        if fmt not in ("gemm", "gemv", "gemv_fast"):
            raise TPError(f"load: AWQ version {fmt!r} is not supported")
        if not qc.get("zero_point", True):
            raise TPError("load: AWQ checkpoints without zero_point are not supported")
    elif method == "gptq":
        fmt = str(qc.get("checkpoint_format", qc.get("format", "gptq"))).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise TPError(f"load: GPTQ checkpoint_format {fmt!r} is not supported")
        if qc.get("desc_act", False):
            raise TPError("load: GPTQ act-order (desc_act=True) checkpoints are not supported")
    else:
        raise TPError(f"load: expected quant_method 'awq' or 'gptq', got {method!r}")
    return fmt, gs


def _read_int4(reader: _SliceReader, key: str, fmt: str, G: int, N: int, K: int, rows=None, cols=None,
               name: str = "") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canonical (q [n, k], zeros [n, k/G], scales [n, k/G]) of output rows ``rows`` = (n0, n1) or
    input columns ``cols`` = (k0, k1) of the int4 linear ``key`` (logical weight [N, K]).

    Reads only the slice of each stored tensor where the layout allows it:

    - gemm (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]; 8 columns per int32 along N):
      rows on multiples of 8 -> column slices of all three; cols -> row slices (qzeros / scales by group).
    - GPTQ (qweight [K/8, N], qzeros [K/G, N/8], scales [K/G, N]; 8 K-rows per int32):
      rows (multiples of 8) -> column slices; cols (multiples of 8 and G) -> row slices.
    - gemv (qweight [N, K/8], qzeros [N, zw], scales [N, zw*8]): rows -> row slices. A K split is
      not clean (qzeros packs 8 groups per int32 into a padded width that depends on K): read whole.
    - gemv_fast (qweight int16 [N/4, K] interleaved over 4 rows x 32-column blocks, zeros / scales
      [zw*8, N] padded): read whole, sliced in canonical form.
    The whole-read fallback also covers a split that does not fall on the packing boundaries."""
    from .. import formats

    qw, qz, sc = f"{key}.qweight", f"{key}.qzeros", f"{key}.scales"
    for k in (qw, qz, sc):
        if k not in reader:
            raise TPError(f"{name}: checkpoint tensor {k} is missing")
    gptq = fmt.startswith("gptq")

    def unpack(a, b, c):
        try:
            if gptq:
                return formats.unpack_gptq(a, b, c, G, format=fmt)
            return formats.unpack_awq(a, b, c, group_size=G, format=fmt)
        except ValueError as e:
            raise TPError(f"{name}: {e}") from e

    if rows is not None:
        n0, n1 = rows
        if fmt == "gemm" and n0 % 8 == 0 and n1 % 8 == 0:
            return unpack(reader.get(qw, slice(None), slice(n0 // 8, n1 // 8)),
                          reader.get(qz, slice(None), slice(n0 // 8, n1 // 8)), reader.get(sc, slice(None), slice(n0, n1)))
        if gptq and n0 % 8 == 0 and n1 % 8 == 0:
            return unpack(reader.get(qw, slice(None), slice(n0, n1)),
                          reader.get(qz, slice(None), slice(n0 // 8, n1 // 8)), reader.get(sc, slice(None), slice(n0, n1)))
        if fmt == "gemv":
            return unpack(reader.get(qw, slice(n0, n1)), reader.get(qz, slice(n0, n1)), reader.get(sc, slice(n0, n1)))
        q, z, s = unpack(reader.get(qw), reader.get(qz), reader.get(sc))  # whole, sliced in canonical form
        return q[n0:n1].contiguous(), z[n0:n1].contiguous(), s[n0:n1].contiguous()
    k0, k1 = cols
    g0, g1 = k0 // G, k1 // G
    if fmt == "gemm":
        return unpack(reader.get(qw, slice(k0, k1)), reader.get(qz, slice(g0, g1)), reader.get(sc, slice(g0, g1)))
    if gptq and k0 % 8 == 0 and k1 % 8 == 0:
        return unpack(reader.get(qw, slice(k0 // 8, k1 // 8)), reader.get(qz, slice(g0, g1)), reader.get(sc, slice(g0, g1)))
    q, z, s = unpack(reader.get(qw), reader.get(qz), reader.get(sc))  # whole, sliced in canonical form
    return q[:, k0:k1].contiguous(), z[:, g0:g1].contiguous(), s[:, g0:g1].contiguous()


def is_moe(cfg) -> bool:
    """Whether a transformers config describes a sparse mixture-of-experts model."""
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    return any(getattr(text, k, None) for k in ("num_experts", "num_local_experts"))


def load(model_dir: str, group=None, *, rank: Optional[int] = None, world_size: Optional[int] = None,
         dtype: Optional[torch.dtype] = None, act_quant: Optional[str] = None, vocab_parallel: bool = True,
         **from_config_kwargs) -> nn.Module:
    """Load an AWQ / GPTQ safetensors checkpoint directly as this rank's shard.

    Gives the same model as ``shard(AutoModelForCausalLM.from_pretrained(model_dir))`` (with
    :func:`awq_inductor.patch_transformers`), but each rank reads only the rows / columns /
    groups of the int4 projections it keeps (see :func:`_read_int4` for the slice of each stored
    layout): q/k/v and gate/up by output rows, o_proj and down_proj by K. Embeddings, norms and a
    tied lm_head are read whole; an untied dense lm_head is read by vocabulary rows when
    ``vocab_parallel`` (else whole). The model skeleton is built from the per-rank config on the meta
    device, so no full-size weight is ever materialised. ``group`` / ``rank`` / ``world_size`` as in
    :func:`shard`. ``model._awq_tp["read"]`` records the bytes read and the tensors read whole."""
    import copy

    import transformers

    from .model_pass import convert

    explicit = rank is not None and world_size is not None
    rank, world = _group_rank_world(group, rank, world_size)
    if world < 1 or not 0 <= rank < world:
        raise TPError(f"load: expected 0 <= rank < world_size, got rank={rank}, world_size={world}")
    if group is None and not explicit:
        import torch.distributed as dist

        group = dist.group.WORLD
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    fmt, gs = _quant_info(cfg)
    if is_moe(cfg):
        raise TPError(f"load: {getattr(cfg, 'model_type', '?')} is a mixture-of-experts model; the per-rank loader "
                      "reads dense models only: load it with from_pretrained (patch_transformers) and call tp.shard")
    if dtype is None:
        dtype = getattr(cfg, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    hq_all, H = text.num_attention_heads, text.hidden_size
    hkv_all = getattr(text, "num_key_value_heads", None) or hq_all
    d = getattr(text, "head_dim", None) or H // hq_all
    I_all = text.intermediate_size
    if hq_all % world or hkv_all % world:
        raise TPError(f"load: attention heads must divide over the {world} ranks (whole KV heads per rank): "
                      f"num_attention_heads={hq_all}, num_key_value_heads={hkv_all}")
    if I_all % world:
        raise TPError(f"load: intermediate_size {I_all} must divide over {world} ranks")
    local = copy.deepcopy(cfg)
    ltext = local.get_text_config(decoder=True) if hasattr(local, "get_text_config") else local
    ltext.head_dim = d
    ltext.num_attention_heads, ltext.num_key_value_heads = hq_all // world, hkv_all // world
    ltext.intermediate_size = I_all // world
    qcfg = local.quantization_config
    del local.quantization_config
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(local, dtype=dtype, **from_config_kwargs)
    local.quantization_config = qcfg
    reader = _SliceReader(model_dir)
    prefix = getattr(model, "base_model_prefix", "") or ""

    def ckey(name: str) -> str:  # model name -> checkpoint key (allowing a missing / extra base-model prefix)
        for k in (name, name[len(prefix) + 1:] if name.startswith(prefix + ".") else None, f"{prefix}.{name}"):
            if k is not None and (k in reader or f"{k}.qweight" in reader):
                return k
        return name

    used = set()
    row_bias: Dict[str, Optional[torch.Tensor]] = {}
    quantized = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and f"{ckey(n)}.qweight" in reader]
    if not quantized:
        raise TPError(f"load: no int4 (qweight) linear found in {model_dir}")
    for name, mod in quantized:
        key, leaf = ckey(name), name.rpartition(".")[2]
        n_loc, k_loc = mod.out_features, mod.in_features
        rows = cols = None
        if leaf in _COLUMN:
            N, K = n_loc * world, k_loc
            rows = (rank * n_loc, (rank + 1) * n_loc)
        elif leaf in _ROW:
            N, K = n_loc, k_loc * world
            cols = (rank * k_loc, (rank + 1) * k_loc)
        elif world > 1:
            raise TPError(f"load: int4 module {name} is outside the attention / MLP patterns and would be left "
                          f"replicated")
        else:
            N, K, rows = n_loc, k_loc, (0, n_loc)
        G = K if gs in (-1, 0) else gs
        if cols is not None:
            _check_k_split(name, k_loc, G, f"{K} / {world}")
        q, z, s = _read_int4(reader, key, fmt, G, N, K, rows=rows, cols=cols, name=name)
        if f"{key}.g_idx" in reader:
            g = reader.get(f"{key}.g_idx").to(torch.int64)
            if not torch.equal(g, torch.arange(K) // G):
                raise TPError(f"{name}: g_idx: act-order (desc_act=True) GPTQ checkpoints are not supported; "
                              f"expected g_idx[k] == k // group_size")
        bias = None
        if f"{key}.bias" in reader:
            bias = reader.get(f"{key}.bias", slice(*rows)) if rows is not None else reader.get(f"{key}.bias")
        if cols is not None:
            row_bias[name], bias = bias, None
        try:
            lin = AWQLinear.from_canonical(q, z, s, bias, group_size=G)
        except ValueError as e:
            raise TPError(f"{name}: {e}") from e
        lin.awq_source = {"format": fmt, "scales_dtype": s.dtype, "bias_dtype": None if bias is None else bias.dtype,
                          "parts": None}
        model.set_submodule(name, lin)
        used.update(f"{key}.{t}" for t in ("qweight", "qzeros", "scales", "bias", "g_idx"))
    # everything else (embeddings, norms, lm_head): read whole, or by vocabulary rows for a split head
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_name = next((n for n, m in model.named_modules() if m is head), None) if type(head) in _DENSE_HEADS else None
    split_head = vocab_parallel and world > 1 and head_name is not None \
        and f"{ckey(head_name)}.weight" in reader and not getattr(text, "tie_word_embeddings", False)
    qnames = {n for n, _ in quantized}
    sd = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if (name.startswith(f"{head_name}.") and split_head) or name.rpartition(".")[0] in qnames:
            continue
        key = ckey(name.rpartition(".")[0]) + "." + name.rpartition(".")[2] if "." in name else ckey(name)
        if key in reader:
            v = reader.get(key)
            sd[name] = v.to(dtype) if v.is_floating_point() else v
            used.add(key)
    model.load_state_dict(sd, strict=False, assign=True)
    if split_head:
        V = head.out_features
        v = -(-V // world)
        hk = f"{ckey(head_name)}.weight"
        lo, hi = min(rank * v, V), min((rank + 1) * v, V)
        w = reader.get(hk, slice(lo, hi)).to(dtype)
        b = reader.get(f"{ckey(head_name)}.bias", slice(lo, hi)).to(dtype) if head.bias is not None else None
        if hi - lo < v:  # zero rows padding V to a multiple of world_size
            w = torch.cat([w, w.new_zeros(v - (hi - lo), w.shape[1])])
            b = None if b is None else torch.cat([b, b.new_zeros(v - (hi - lo))])
        used.update({hk, f"{ckey(head_name)}.bias"})
        parent = model.get_submodule(head_name.rpartition(".")[0]) if "." in head_name else model
        parent._modules[head_name.rpartition(".")[2]] = VocabParallelLMHead(w, b, V, group, world)
    elif getattr(text, "tie_word_embeddings", False):
        model.tie_weights()
    unused = sorted(k for k in reader.file_of if k not in used)
    if unused:
        raise TPError(f"load: checkpoint tensors that the per-rank loader does not place: {unused[:8]}"
                      f"{' ...' if len(unused) > 8 else ''}")
    # non-persistent buffers (rotary inv_freq) were built on meta: build those modules again on the CPU
    for name, mod in list(model.named_modules()):
        if any(b.is_meta for b in mod.buffers(recurse=False)) and hasattr(mod, "config"):
            model.set_submodule(name, type(mod)(config=mod.config))
    meta = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if meta:
        raise TPError(f"load: model tensors not found in the checkpoint: {meta[:8]}{' ...' if len(meta) > 8 else ''}")
    if vocab_parallel and not split_head:  # a tied head: read whole with the embedding, split like shard()
        for parent, attr, new in _plan_lm_head(model, rank, world, group):
            parent._modules[attr] = new
    convert(model, act_quant=act_quant)
    n_attn = n_mlp = 0
    for name, mod in list(model.named_modules()):
        for leaf in _ROW:
            lin = mod._modules.get(leaf)
            if isinstance(lin, AWQLinear):
                mod._modules[leaf] = RowParallelLinear(lin, row_bias.get(f"{name}.{leaf}" if name else leaf),
                                                       group, world)
                n_attn += leaf == "o_proj"
                n_mlp += leaf == "down_proj"
    try:
        model.generation_config = transformers.GenerationConfig.from_pretrained(model_dir)
    except OSError:
        pass
    model.eval()
    model._awq_tp = {"rank": rank, "world_size": world, "num_attention_heads": hq_all,
                     "num_key_value_heads": hkv_all, "attention_layers": n_attn, "mlp_layers": n_mlp, "moe_layers": 0,
                     "vocab_parallel": isinstance(model.get_output_embeddings(), VocabParallelLMHead),
                     "read": {"format": fmt, "bytes": dict(reader.read_bytes), "whole": sorted(reader.whole),
                              "checkpoint_bytes": reader.total_bytes()}}
    return model
