"""Per-rank loading: each rank reads only its slices of the int4 tensors from the safetensors files
(the same model as ``shard(from_pretrained(...))``)."""
from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from .. import formats
from ..families import TP_COLUMN, TP_ROW
from ..nn import AWQLinear
from .layers import RowParallelLinear, TPError, VocabParallelLMHead
from .sharding import DENSE_HEADS, _check_k_split, _group_rank_world, _plan_lm_head, row_slice_perm


# ---------------------------------------------------------------------------------------------
# Per-rank loading: each rank reads only its slices of the int4 tensors from the safetensors files
# ---------------------------------------------------------------------------------------------


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


def _quant_spec(cfg) -> formats.QuantSpec:
    """(checkpoint format, group size) from the config's quantization_config (:mod:`awq_inductor.formats`)."""
    qc = getattr(cfg, "quantization_config", None)
    if qc is None:
        raise TPError("load: the checkpoint config has no quantization_config (expected an AWQ or GPTQ int4 checkpoint)")
    try:
        return formats.from_quantization_config(qc if isinstance(qc, dict) else qc.to_dict())
    except (ValueError, NotImplementedError) as e:
        raise TPError(f"load: {e}") from e


def _read_int4(reader: _SliceReader, key: str, fmt: formats.CheckpointFormat, G: int, N: int, K: int, rows=None,
               cols=None, name: str = ""):
    """(canonical (q [n, k], zeros [n, k/G], scales [n, k/G]), input perm or None) of output rows
    ``rows`` = (n0, n1) or input columns ``cols`` = (k0, k1) of the int4 linear ``key`` (logical
    weight [N, K]).

    Reads only the slice of each stored tensor that the format says holds them
    (``fmt.row_slices`` / ``fmt.col_slices``: e.g. gemm and GPTQ by 8-column words, gemv by rows);
    where the layout has no clean slice (gemv's K split, gemv_fast, a split off the packing
    boundaries, compressed-tensors' whole-tensor weight_shape) or the checkpoint is act-order
    (g_idx), the tensors are read whole and sliced in canonical form."""
    keys = {t: f"{key}.{t}" for t in fmt.tensors}
    for k in keys.values():
        if k not in reader:
            raise TPError(f"{name}: checkpoint tensor {k} is missing")
    g_idx = reader.get(f"{key}.g_idx") if f"{key}.g_idx" in reader else None
    index = fmt.row_slices(*rows) if rows is not None else fmt.col_slices(*cols, G)
    perm = None
    try:
        if g_idx is not None and hasattr(fmt, "unpack_act_order"):  # GPTQ: k // G, or act-order
            perm = formats.base.act_order_perm(g_idx, K, G, where=f"{key}.g_idx")
        elif g_idx is not None:  # read whole (K values) and checked before any slice is unpacked
            formats.check_g_idx(g_idx, K, G)
        if index is not None and perm is None:
            return fmt.unpack(*(reader.get(keys[t], *index[t]) for t in fmt.tensors), G), None
        stored = [reader.get(keys[t]) for t in fmt.tensors]
        if perm is not None:
            (q, z, s), perm = fmt.unpack_act_order(*stored, G, g_idx)
        else:
            q, z, s = fmt.unpack(*stored, G)
    except ValueError as e:
        raise TPError(f"{name}: {e}") from e
    if rows is not None:  # whole, sliced in canonical form
        n0, n1 = rows
        return formats.Canonical(q[n0:n1].contiguous(), z[n0:n1].contiguous(), s[n0:n1].contiguous()), perm
    (k0, k1), (g0, g1) = cols, (cols[0] // G, cols[1] // G)
    perm = row_slice_perm(name, perm, k0, k1)
    return formats.Canonical(q[:, k0:k1].contiguous(), z[:, g0:g1].contiguous(), s[:, g0:g1].contiguous()), perm


def is_moe(cfg) -> bool:
    """Whether a transformers config describes a sparse mixture-of-experts model."""
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    return any(getattr(text, k, None) for k in ("num_experts", "num_local_experts"))


def _text_config(cfg):
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def _local_model(cfg, world: int, dtype, from_config_kwargs) -> nn.Module:
    """The rank's model skeleton on the meta device, built from the per-rank config (heads and
    intermediate size divided by ``world``)."""
    import copy

    import transformers

    text = _text_config(cfg)
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
    ltext = _text_config(local)
    ltext.head_dim = d
    ltext.num_attention_heads, ltext.num_key_value_heads = hq_all // world, hkv_all // world
    ltext.intermediate_size = I_all // world
    qcfg = local.quantization_config
    del local.quantization_config
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(local, dtype=dtype, **from_config_kwargs)
    local.quantization_config = qcfg
    return model


class _RankRead:
    """What one rank reads: the checkpoint, its keys for the model's names, the keys placed so far."""

    def __init__(self, model_dir: str, model: nn.Module, rank: int, world: int):
        self.reader = _SliceReader(model_dir)
        self.prefix = getattr(model, "base_model_prefix", "") or ""
        self.rank, self.world = rank, world
        self.used: set = set()
        self.row_bias: Dict[str, Optional[torch.Tensor]] = {}

    def ckey(self, name: str) -> str:
        """Model name -> checkpoint key (allowing a missing / extra base-model prefix)."""
        p = self.prefix
        for k in (name, name[len(p) + 1:] if name.startswith(p + ".") else None, f"{p}.{name}"):
            if k is not None and (k in self.reader or f"{k}.qweight" in self.reader or f"{k}.weight_packed" in self.reader):
                return k
        return name


def _split_of(name: str, mod: nn.Module, rr: _RankRead):
    """(N, K, rows, cols) of an int4 linear of the rank's skeleton: column-parallel names by output
    rows, row-parallel names by K (families.TP_COLUMN / TP_ROW)."""
    leaf, n_loc, k_loc, rank, world = name.rpartition(".")[2], mod.out_features, mod.in_features, rr.rank, rr.world
    if leaf in TP_COLUMN:
        return n_loc * world, k_loc, (rank * n_loc, (rank + 1) * n_loc), None
    if leaf in TP_ROW:
        return n_loc, k_loc * world, None, (rank * k_loc, (rank + 1) * k_loc)
    if world > 1:
        raise TPError(f"load: int4 module {name} is outside the attention / MLP patterns and would be left replicated")
    return n_loc, k_loc, (0, n_loc), None


def _load_int4(model: nn.Module, rr: _RankRead, spec: formats.QuantSpec) -> set:
    """Every int4 linear of the skeleton as this rank's AWQLinear, read by slices; returns their names."""
    reader, fmt = rr.reader, spec.format
    first = fmt.tensors[0]  # qweight, or compressed-tensors' weight_packed
    quantized = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and f"{rr.ckey(n)}.{first}" in reader]
    if not quantized:
        raise TPError(f"load: no int4 ({first}) linear found in the checkpoint")
    for name, mod in quantized:
        key = rr.ckey(name)
        N, K, rows, cols = _split_of(name, mod, rr)
        G = K if spec.group_size in (-1, 0) else spec.group_size
        if cols is not None:
            _check_k_split(name, mod.in_features, G, f"{K} / {rr.world}")
        (q, z, s), perm = _read_int4(reader, key, fmt, G, N, K, rows=rows, cols=cols, name=name)
        bias = None
        if f"{key}.bias" in reader:
            bias = reader.get(f"{key}.bias", slice(*rows)) if rows is not None else reader.get(f"{key}.bias")
        if cols is not None:
            rr.row_bias[name], bias = bias, None
        try:
            lin = AWQLinear.from_canonical(q, z, s, bias, group_size=G).set_input_perm(perm)
        except ValueError as e:
            raise TPError(f"{name}: {e}") from e
        lin.awq_source = formats.CheckpointSource(format=fmt.name, scales_dtype=s.dtype,
                                                  bias_dtype=None if bias is None else bias.dtype)
        model.set_submodule(name, lin)
        rr.used.update(f"{key}.{t}" for t in fmt.tensors + ("bias", "g_idx"))
    return {n for n, _ in quantized}


def _head_to_split(model: nn.Module, rr: _RankRead, vocab_parallel: bool) -> Optional[str]:
    """The name of an untied dense lm_head this rank reads by vocabulary rows (None: read it whole)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    name = next((n for n, m in model.named_modules() if m is head), None) if type(head) in DENSE_HEADS else None
    tied = getattr(_text_config(model.config), "tie_word_embeddings", False)
    if vocab_parallel and rr.world > 1 and name is not None and f"{rr.ckey(name)}.weight" in rr.reader and not tied:
        return name
    return None


def _load_dense(model: nn.Module, rr: _RankRead, skip: set, dtype) -> None:
    """Embeddings, norms and everything else that is not int4 (nor the split head ``skip``): read whole."""
    sd = {}
    for name in model.state_dict(keep_vars=True):
        mod_name, _, leaf = name.rpartition(".")
        if mod_name in skip or any(name.startswith(f"{s}.") for s in skip):
            continue
        key = f"{rr.ckey(mod_name)}.{leaf}" if mod_name else rr.ckey(name)
        if key in rr.reader:
            v = rr.reader.get(key)
            sd[name] = v.to(dtype) if v.is_floating_point() else v
            rr.used.add(key)
    model.load_state_dict(sd, strict=False, assign=True)


def _load_split_head(model: nn.Module, rr: _RankRead, head_name: str, group, dtype) -> None:
    head = model.get_submodule(head_name)
    V, world = head.out_features, rr.world
    v = -(-V // world)
    hk, bk = f"{rr.ckey(head_name)}.weight", f"{rr.ckey(head_name)}.bias"
    lo, hi = min(rr.rank * v, V), min((rr.rank + 1) * v, V)
    w = rr.reader.get(hk, slice(lo, hi)).to(dtype)
    b = rr.reader.get(bk, slice(lo, hi)).to(dtype) if head.bias is not None else None
    if hi - lo < v:  # zero rows padding V to a multiple of world_size
        w = torch.cat([w, w.new_zeros(v - (hi - lo), w.shape[1])])
        b = None if b is None else torch.cat([b, b.new_zeros(v - (hi - lo))])
    rr.used.update({hk, bk})
    parent = model.get_submodule(head_name.rpartition(".")[0]) if "." in head_name else model
    parent._modules[head_name.rpartition(".")[2]] = VocabParallelLMHead(w, b, V, group, world)


def _check_complete(model: nn.Module, rr: _RankRead) -> None:
    """Every checkpoint tensor placed, and no model tensor left on the meta device."""
    unused = sorted(k for k in rr.reader.file_of if k not in rr.used)
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


def _row_parallel(model: nn.Module, rr: _RankRead, group) -> Tuple[int, int]:
    """Wrap the row-parallel int4 linears (bias after the reduce); returns (attention, MLP) counts."""
    n_attn = n_mlp = 0
    for name, mod in list(model.named_modules()):
        for leaf in TP_ROW:
            lin = mod._modules.get(leaf)
            if isinstance(lin, AWQLinear):
                mod._modules[leaf] = RowParallelLinear(lin, rr.row_bias.get(f"{name}.{leaf}" if name else leaf),
                                                       group, rr.world)
                n_attn += leaf == "o_proj"
                n_mlp += leaf == "down_proj"
    return n_attn, n_mlp


def load(model_dir: str, group=None, *, rank: Optional[int] = None, world_size: Optional[int] = None,
         dtype: Optional[torch.dtype] = None, act_quant: Optional[str] = None, vocab_parallel: bool = True,
         **from_config_kwargs) -> nn.Module:
    """Load an AWQ / GPTQ safetensors checkpoint directly as this rank's shard.

    Gives the same model as ``shard(AutoModelForCausalLM.from_pretrained(model_dir))`` (with
    :func:`awq_inductor.patch_transformers`), but each rank reads only the rows / columns /
    groups of the int4 projections it keeps (see :func:`_read_int4`): q/k/v and gate/up by output
    rows, o_proj and down_proj by K. Embeddings, norms and a tied lm_head are read whole; an
    untied dense lm_head is read by vocabulary rows when ``vocab_parallel`` (else whole). The
    model skeleton is built from the per-rank config on the meta device, so no full-size weight is
    ever materialised. ``group`` / ``rank`` / ``world_size`` as in :func:`shard`.
    ``model._awq_tp["read"]`` records the bytes read and the tensors read whole."""
    import transformers

    from ..transform.model_pass import convert

    explicit = rank is not None and world_size is not None
    rank, world = _group_rank_world(group, rank, world_size)
    if world < 1 or not 0 <= rank < world:
        raise TPError(f"load: expected 0 <= rank < world_size, got rank={rank}, world_size={world}")
    if group is None and not explicit:
        import torch.distributed as dist

        group = dist.group.WORLD
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    spec = _quant_spec(cfg)
    if is_moe(cfg):
        raise TPError(f"load: {getattr(cfg, 'model_type', '?')} is a mixture-of-experts model; the per-rank loader "
                      "reads dense models only: load it with from_pretrained (patch_transformers) and call tp.shard")
    if dtype is None:
        dtype = getattr(cfg, "dtype", None) or torch.float32
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = _local_model(cfg, world, dtype, from_config_kwargs)
    rr = _RankRead(model_dir, model, rank, world)
    qnames = _load_int4(model, rr, spec)
    head_name = _head_to_split(model, rr, vocab_parallel)
    _load_dense(model, rr, qnames | ({head_name} if head_name else set()), dtype)
    if head_name is not None:
        _load_split_head(model, rr, head_name, group, dtype)
    elif getattr(_text_config(cfg), "tie_word_embeddings", False):
        model.tie_weights()
    _check_complete(model, rr)
    if vocab_parallel and head_name is None:  # a tied head: read whole with the embedding, split like shard()
        for parent, attr, new in _plan_lm_head(model, rank, world, group):
            parent._modules[attr] = new
    convert(model, act_quant=act_quant)
    n_attn, n_mlp = _row_parallel(model, rr, group)
    try:
        model.generation_config = transformers.GenerationConfig.from_pretrained(model_dir)
    except OSError:
        pass
    model.eval()
    text = _text_config(cfg)
    hq_all = text.num_attention_heads
    model._awq_tp = {"rank": rank, "world_size": world, "num_attention_heads": hq_all,
                     "num_key_value_heads": getattr(text, "num_key_value_heads", None) or hq_all,
                     "attention_layers": n_attn, "mlp_layers": n_mlp, "moe_layers": 0,
                     "vocab_parallel": isinstance(model.get_output_embeddings(), VocabParallelLMHead),
                     "read": {"format": spec.format.name, "bytes": dict(rr.reader.read_bytes),
                              "whole": sorted(rr.reader.whole), "checkpoint_bytes": rr.reader.total_bytes()}}
    return model
