"""The MoE part of the model pass and of the state-dict round trip.

* :func:`convert_experts`: every :class:`~awq_inductor.nn.CheckpointMoEExperts` (per-expert
  projections: loading placeholders or :class:`AWQLinear`) becomes one
  :class:`~awq_inductor.nn.AWQMoEExperts` (``awq::int4_moe`` / ``int4_moe_a8``), which has the
  forward signature of transformers' experts modules; :class:`AWQMoEExperts` of another scheme
  are repacked for ``act_quant``.
* :func:`experts_state_dict`: an :class:`AWQMoEExperts` written back as per-expert checkpoint
  tensors (``<name>.<e>.<gate|up|down>.{qweight,qzeros,scales}``) in its checkpoint format.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from .. import formats
from . import load_memory
from ..nn import AWQLinear, AWQMoEExperts, CheckpointInt4Linear, CheckpointMoEExperts


def _canonical(where: str, m: nn.Module):
    """(q, z, s, group size, format, scales dtype) of one expert projection: straight from the
    checkpoint tensors of a loading placeholder (no pack / unpack round trip through AWQLinear:
    a 128-expert layer has 384 of them), or from an AWQLinear."""
    if isinstance(m, CheckpointInt4Linear):
        if m.bias is not None:
            raise ValueError(f"{where}: expected no bias (the experts op has none), got bias {list(m.bias.shape)}")
        if m.g_idx is not None:
            ref = torch.arange(m.in_features, dtype=torch.int64) // m.group_size
            if not torch.equal(m.g_idx.to(torch.int64), ref):
                raise NotImplementedError(f"{where}.g_idx: act-order (desc_act=True) GPTQ checkpoints are not "
                                          "supported; expected g_idx[k] == k // group_size")
        if m.format in formats.GPTQ_FORMATS:
            q, z, s = formats.unpack_gptq(m.qweight, m.qzeros, m.scales, m.group_size, format=m.format)
        else:
            q, z, s = formats.unpack_awq(m.qweight, m.qzeros, m.scales, group_size=m.group_size, format=m.format)
        return q, z, s, m.group_size, m.format, m.scales.dtype
    if isinstance(m, AWQLinear):
        if m.bias is not None:
            raise ValueError(f"{where}: expected no bias (the experts op has none)")
        src = getattr(m, "awq_source", None) or {}
        return (*m.canonical(), m.group_size, src.get("format"), src.get("scales_dtype"))
    raise ValueError(f"{where}: expected an int4 linear like the other experts (one op for all experts of a "
                     f"layer), got {type(m).__name__}; list the whole experts module in modules_to_not_convert "
                     f"to keep it in floating point")


def _experts_from_placeholder(name: str, ph: CheckpointMoEExperts, act_quant: Optional[str], maps) -> AWQMoEExperts:
    gate_up, down, first = [], [], None
    for e in range(ph.num_experts):
        parts = [_canonical(f"{name}.{e}.{n}", m) for n, m in zip(ph.names, ph.expert_modules(e))]
        first = first or parts[0]
        for n, p in zip(ph.names, parts):
            if p[3] != first[3]:
                raise ValueError(f"{name}.{e}.{n}: expected group size {first[3]} like {name}.0.{ph.names[0]} "
                                 f"(one op for all experts), got {p[3]}")
        (qg, zg, sg), (qu, zu, su) = parts[0][:3], parts[1][:3]
        gate_up.append((torch.cat([qg, qu]), torch.cat([zg, zu]), torch.cat([sg, su])))
        down.append(parts[2][:3])
        # this expert's checkpoint tensors are no longer needed: release their pages (load_memory)
        load_memory.drop_file_pages(list(getattr(ph, str(e)).buffers()), maps)
        delattr(ph, str(e))
    try:
        new = AWQMoEExperts.from_canonical(gate_up, down, group_size=first[3], act_quant=act_quant)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    new.awq_source = {"format": first[4], "scales_dtype": first[5], "names": ph.names}
    return new


def convert_experts(model: nn.Module, act_quant: Optional[str] = None) -> int:
    """Replace the experts placeholders of ``model`` and repack
    existing :class:`AWQMoEExperts` for ``act_quant``; returns how many modules were replaced."""
    n = 0
    mods = list(model.named_modules())
    maps = load_memory.file_mappings() if any(isinstance(m, CheckpointMoEExperts) for _, m in mods) else []
    for name, mod in mods:
        if isinstance(mod, CheckpointMoEExperts):
            model.set_submodule(name, _experts_from_placeholder(name, mod, act_quant, maps))
            load_memory.trim_heap()
            n += 1
        elif isinstance(mod, AWQMoEExperts) and mod.act_quant != act_quant:
            model.set_submodule(name, mod.with_act_quant(act_quant))
            n += 1
    return n


def experts_state_dict(name: str, mod: AWQMoEExperts, sd: Dict[str, torch.Tensor], default_format: str) -> None:
    """Replace ``mod``'s packed buffers in ``sd`` by per-expert checkpoint tensors."""
    prefix = f"{name}." if name else ""
    for t in mod.op.weight_names():
        sd.pop(prefix + t, None)
    src = getattr(mod, "awq_source", None) or {}
    fmt = src.get("format") or default_format
    sdt = src.get("scales_dtype") or torch.float16
    g, u, d = src.get("names") or ("gate_proj", "up_proj", "down_proj")
    I, G = mod.intermediate_size, mod.group_size
    for e in range(mod.num_experts):
        (q, z, s), down = mod.expert_canonical(e)
        parts = ((g, (q[:I], z[:I], s[:I])), (u, (q[I:], z[I:], s[I:])), (d, down))
        for part, (qi, zi, si) in parts:
            key = f"{prefix}{e}.{part}"
            qi, zi, si = qi.contiguous(), zi.contiguous(), si.to(sdt).contiguous()
            if fmt.startswith("gptq"):
                qw, qz, sc = formats.pack_gptq(qi, zi, si, G, format=fmt)
                sd[f"{key}.g_idx"] = torch.arange(qi.shape[1], dtype=torch.int32) // G
            else:
                qw, qz, sc = formats.pack_awq(qi, zi, si, group_size=G, format=fmt)
            sd[f"{key}.qweight"], sd[f"{key}.qzeros"], sd[f"{key}.scales"] = qw, qz, sc
