"""``shard``: a converted model rewritten in place for tensor parallelism (see the package docstring
for the layout). Every new module is built, and every check made, before anything is replaced."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..families import MLA_PROJECTIONS
from ..formats import source_of
from ..kernels import hugepages
from ..nn import AWQGateUpSiluMul, AWQLinear, AWQMoEExperts
from ..nn.head import Bf16HeadLinear
from ..transform.model_pass import OutputSlice, tune_model
from .layers import ParallelMoEExperts, ParallelRMSNorm, RowParallelLinear, TPError, VocabParallelLMHead

#: dense heads (convert's default lm_head="bf16" switches a bf16 nn.Linear to Bf16HeadLinear in place)
DENSE_HEADS = (nn.Linear, Bf16HeadLinear)
Plan = List[Tuple[nn.Module, str, nn.Module]]  # (parent, attribute, new module)


def _plan_lm_head(model: nn.Module, rank: int, world: int, group) -> Plan:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) not in DENSE_HEADS or world == 1:
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


def _source(mod, tp_slice):
    return source_of(mod).replace(tp_slice=tp_slice)


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
    new.set_input_perm(lin.perm)  # column-parallel: every rank sees all of x, act-order or not
    new.awq_source = _source(lin, ("rows", tuple(ranges)))
    return new


def _check_k_split(name: str, k_local: int, group_size: int, what: str) -> None:
    if k_local % group_size:
        raise TPError(f"{name}: row-parallel split of K needs K / world_size ({what}) to be a multiple of "
                      f"group_size {group_size}, got {k_local}")


def row_slice_perm(name: str, perm: Optional[torch.Tensor], k0: int, k1: int) -> Optional[torch.Tensor]:
    """The rank's input permutation of a row-parallel act-order layer whose sorted columns
    [k0, k1) are the input columns [k0, k1) in some order (the rank holds exactly the activations
    it multiplies); TPError naming the layer otherwise (a GPTQ Hessian order mixes the ranks'
    inputs into every group: the layer would need the full activation on every rank)."""
    if perm is None:
        return None
    local = perm[k0:k1]
    if not torch.equal(torch.sort(local).values, torch.arange(k0, k1, dtype=local.dtype)):
        raise TPError(f"{name}: act-order (desc_act) row-parallel layer: its groups for K slice [{k0}, {k1}) "
                      "hold input columns of other ranks; tensor parallelism cannot split this layer's K")
    return local - k0


def _row_linear(name: str, lin: AWQLinear, k0: int, k1: int, group, world: int) -> RowParallelLinear:
    """Columns [k0, k1) of ``lin``'s K as a :class:`RowParallelLinear` (bias after the reduce)."""
    G = lin.group_size
    if k0 % G or k1 % G:
        raise TPError(f"{name}: row-parallel K slice [{k0}, {k1}) must start and end on group boundaries "
                      f"(group_size {G})")
    local_perm = row_slice_perm(name, lin.perm, k0, k1)
    q, z, s = lin.canonical()
    try:
        inner = AWQLinear.from_canonical(q[:, k0:k1].contiguous(), z[:, k0 // G:k1 // G].contiguous(),
                                         s[:, k0 // G:k1 // G].contiguous(), None, group_size=G,
                                         act_quant=lin.act_quant).set_input_perm(local_perm)
    except ValueError as e:
        raise TPError(f"{name}: {e}") from e
    inner.awq_source = _source(lin, ("cols", k0, k1))
    return RowParallelLinear(inner, lin.bias, group, world)


def _need(name: str, mod, cls, what: str):
    if not isinstance(mod, cls):
        raise TPError(f"{name}: expected {what} to be {cls.__name__} (convert the model first, "
                      f"and only int4 projections are sharded), got {type(mod).__name__}")
    return mod


# ---------------------------------------------------------------------------------------------
# Planning: every new module is built (and every check made) before anything is replaced
# ---------------------------------------------------------------------------------------------


#: MLA's low-rank input projections (alone or fused), whole on every rank
MLA_REPLICATED = ("q_a_proj", "kv_a_proj_with_mqa", "q_kv_a_proj")


def _is_mla(mod: nn.Module) -> bool:
    return any(p in mod._modules for p in MLA_PROJECTIONS)


def _plan_mla(name: str, attn: nn.Module, hq_all: int, hkv_all: int, rank: int, world: int,
              group) -> Tuple[Plan, List[nn.Module]]:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) split over heads: q_b_proj (or q_proj
    without a q LoRA) and kv_b_proj column-parallel (each rank's heads: qk_head_dim, and
    qk_nope_head_dim + v_head_dim rows per head), o_proj row-parallel; the low-rank input projections
    (q_a_proj, kv_a_proj_with_mqa, fused or not), their norms and the latent cache stay whole on every
    rank (transformers caches the compressed latents, one head, and expands them through kv_b_proj per
    call). Returns (plan, the replicated int4 modules)."""
    mods = attn._modules
    dims = {k: getattr(attn, k, None) for k in ("qk_head_dim", "qk_nope_head_dim", "v_head_dim")}
    if not all(isinstance(v, int) for v in dims.values()):
        raise TPError(f"{name}: expected multi-head latent attention with int {', '.join(dims)}, got {dims}")
    if hq_all % world or hkv_all % world:
        raise TPError(f"{name}: attention heads must divide over the {world} ranks: num_attention_heads={hq_all}, "
                      f"num_key_value_heads={hkv_all}")
    hq = hq_all // world
    q_name = "q_b_proj" if mods.get("q_b_proj") is not None else "q_proj"
    per_head = {q_name: dims["qk_head_dim"], "kv_b_proj": dims["qk_nope_head_dim"] + dims["v_head_dim"]}
    plan: Plan = []
    for p, d in per_head.items():
        lin = _need(f"{name}.{p}", mods.get(p), AWQLinear, p)
        if lin.out_features != hq_all * d:
            raise TPError(f"{name}.{p}: expected out_features {hq_all * d} ({hq_all} heads x {d}), "
                          f"got {lin.out_features}")
        plan.append((attn, p, _column_linear(f"{name}.{p}", lin, [(rank * hq * d, (rank + 1) * hq * d)])))
    o, v = _need(f"{name}.o_proj", mods.get("o_proj"), AWQLinear, "o_proj"), dims["v_head_dim"]
    if o.in_features != hq_all * v:
        raise TPError(f"{name}.o_proj: expected in_features {hq_all * v}, got {o.in_features}")
    _check_k_split(f"{name}.o_proj", hq * v, o.group_size, f"{hq} heads x {v}")
    plan.append((attn, "o_proj", _row_linear(f"{name}.o_proj", o, rank * hq * v, (rank + 1) * hq * v, group, world)))
    others = {p: m for p, m in mods.items() if p not in per_head and p != "o_proj" and isinstance(m, AWQLinear)}
    unknown = sorted(set(others) - set(MLA_REPLICATED))
    if unknown:
        raise TPError(f"{name}: int4 projections {unknown} of multi-head latent attention: expected only "
                      f"{list(MLA_REPLICATED)} besides the per-head {list(per_head)} and o_proj")
    return plan, list(others.values())


def _computes_rms_norm(norm: nn.Module, weight: torch.Tensor, eps: float) -> bool:
    """Whether ``norm`` computes what :class:`ParallelRMSNorm` does on one rank (checked on a random
    input, not by class name)."""
    # fp32 x: both keep fp32 through the weight's multiply (no rounding to the weight's dtype to differ in)
    x = torch.randn(3, weight.numel(), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ParallelRMSNorm(weight, eps, weight.numel(), None, 1)(x)
        got = norm(x)
    return got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def _plan_qk_norm(name: str, attn: nn.Module, d: int, local: dict, rank: int, world: int, group) -> Plan:
    """q_norm / k_norm over the whole projection (OLMoE: one RMSNorm over all heads, not per head) as a
    :class:`ParallelRMSNorm` on the rank's heads (per-head norms, Qwen3's, stay whole: every rank
    applies them alike)."""
    plan: Plan = []
    for n, proj in (("q_norm", "q_proj"), ("k_norm", "k_proj")):
        norm = attn._modules.get(n)
        if norm is None:
            continue
        w = getattr(norm, "weight", None)
        width = local[proj] * world
        if not isinstance(w, torch.Tensor):  # per head or over the whole projection cannot be told apart
            raise TPError(f"{name}.{n}: a q/k norm without a weight tensor ({type(norm).__name__}): expected a "
                          f"per-head norm of {d} features or an RMSNorm over the projection's {width}")
        if w.numel() == d:
            continue
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if w.dim() != 1 or w.numel() != width or not isinstance(eps, float) or not _computes_rms_norm(norm, w, eps):
            raise TPError(f"{name}.{n}: normalises {w.numel()} features (head_dim {d}, projection width {width}); "
                          f"expected a per-head norm or an RMSNorm (weight * x * rsqrt(mean(x^2) + eps)) over "
                          f"{width} features to split over heads, got {type(norm).__name__} (eps {eps!r})")
        sl = slice(rank * local[proj], (rank + 1) * local[proj])
        plan.append((attn, n, ParallelRMSNorm(w.detach()[sl], eps, width, group, world)))
    return plan


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
    if world > 1:
        plan += _plan_qk_norm(name, attn, d, local, rank, world, group)
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
                                                  intermediate_size=i, act_quant=gu.act_quant).set_input_perm(gu.perm)
        except ValueError as e:
            raise TPError(f"{name}.gate_up_proj: {e}") from e
        new.awq_source = _source(gu, ("rows", rank * i, (rank + 1) * i))
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
    local.awq_source = _source(ex, ("rows", lo, hi))
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
    replicated: List[nn.Module] = []  # int4 modules every rank keeps whole (MLA's low-rank input projections)
    for name, mod in model.named_modules():
        mla = _is_mla(mod)
        if mla or ("o_proj" in mod._modules and any(p in mod._modules for p in ("qkv_proj", "q_proj"))):
            if hq_all is None:
                raise TPError(f"{name}: the model config has no num_attention_heads")
            if mla:
                mla_plan, whole = _plan_mla(name, mod, hq_all, hkv_all, rank, world, group)
                plan += mla_plan
                replicated += whole
            else:
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
    replaced = {id(parent._modules.get(attr)) for parent, attr, _ in plan} | {id(m) for m in replicated}
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
        head_dims = [a.head_dim for a in attns if isinstance(getattr(a, "head_dim", None), int)]
        if head_dims:
            text_cfg.head_dim = head_dims[0]
        text_cfg.num_attention_heads = hq_all // world
        text_cfg.num_key_value_heads = hkv_all // world
    for m in attns:  # attention modules that keep their own head counts (other transformers versions)
        for attr in ("num_heads", "num_key_value_heads"):
            if isinstance(getattr(m, attr, None), int):
                setattr(m, attr, getattr(m, attr) // world)
    hugepages.place_streamed_weights(model)  # the rank's slices are new tensors
    tune_model(model)  # the rank's shapes (tuned at load, not inside the first generate)
    model._awq_tp = {"rank": rank, "world_size": world, "num_attention_heads": hq_all,
                     "num_key_value_heads": hkv_all, "attention_layers": len(attns), "mlp_layers": n_mlp,
                     "moe_layers": n_moe,
                     "vocab_parallel": isinstance(model.get_output_embeddings(), VocabParallelLMHead)
                     if hasattr(model, "get_output_embeddings") else False}
    return model

