"""The MoE part of the model pass and of the state-dict round trip.

* :func:`convert_experts`: every :class:`~awq_inductor.nn.CheckpointMoEExperts` (per-expert
  projections: loading placeholders or :class:`AWQLinear`) becomes one
  :class:`~awq_inductor.nn.AWQMoEExperts` (``awq::int4_moe`` / ``int4_moe_a8``), which has the
  forward signature of transformers' experts modules; :class:`AWQMoEExperts` of another scheme
  are repacked for ``act_quant``.
* :func:`experts_state_dict`: an :class:`AWQMoEExperts` written back as checkpoint tensors in its
  checkpoint format and layout: per expert (``<name>.<e>.<gate|up|down>.{qweight,qzeros,scales}``)
  or fused 3-D (``<name>.gate_up_proj.qweight`` [E, ...], ``<name>.down_proj.*``).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from .. import formats
from ..families import FUSED_EXPERT_NAMES as FUSED_NAMES
from ..formats import CheckpointSource, source_of
from . import load_memory
from ..nn import AWQLinear, AWQMoEExperts, CheckpointInt4Linear, CheckpointMoEExperts
from ..nn.checkpoint import read_canonical


def _canonical(where: str, m: nn.Module, e: Optional[int] = None):
    """(q, z, s, group size, format, scales dtype) of one expert projection: straight from the
    checkpoint tensors of a loading placeholder (no pack / unpack round trip through AWQLinear:
    a 128-expert layer has 384 of them; ``e``: the expert of a stacked placeholder), or from an
    AWQLinear."""
    if not isinstance(m, (CheckpointInt4Linear, AWQLinear)):
        raise ValueError(f"{where}: expected an int4 linear like the other experts (one op for all experts of a "
                         f"layer), got {type(m).__name__}; list the whole experts module in modules_to_not_convert "
                         f"to keep it in floating point")
    if m.bias is not None:
        raise ValueError(f"{where}: expected no bias (the experts op has none), got bias {list(m.bias.shape)}")
    try:
        if isinstance(m, CheckpointInt4Linear) and e is not None:
            can, src, G = m.canonical(e), m.source(), m.group_size
        else:
            w = read_canonical(m)
            can, src, G = w.canonical, w.source, w.group_size
    except formats.ActOrderError as err:
        raise formats.ActOrderError(f"{where}.{err}") from err
    return (*can, G, src.format, src.scales_dtype)


def _fused_experts(name: str, ph: CheckpointMoEExperts):
    """(gate_up, down, (G, format, scales dtype)) of a fused 3-D placeholder, expert by expert."""
    gu_mod, dn_mod = (getattr(ph, n) for n in FUSED_NAMES)
    gate_up, down = [], []
    for e in range(ph.num_experts):
        gu = _canonical(f"{name}.{FUSED_NAMES[0]}[{e}]", gu_mod, e)
        dn = _canonical(f"{name}.{FUSED_NAMES[1]}[{e}]", dn_mod, e)
        gate_up.append(gu[:3])
        down.append(dn[:3])
    if dn[3] != gu[3]:
        raise ValueError(f"{name}.{FUSED_NAMES[1]}: expected group size {gu[3]} like {name}.{FUSED_NAMES[0]} "
                         f"(one op for all experts), got {dn[3]}")
    return gate_up, down, gu[3:]


def _per_expert(name: str, ph: CheckpointMoEExperts, maps):
    """(gate_up, down, (G, format, scales dtype)) of a per-expert placeholder; releases each
    expert's checkpoint pages once converted."""
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
    return gate_up, down, first[3:]


def _experts_from_placeholder(name: str, ph: CheckpointMoEExperts, act_quant: Optional[str], maps) -> AWQMoEExperts:
    gate_up, down, (G, fmt, sdt) = _fused_experts(name, ph) if ph.fused else _per_expert(name, ph, maps)
    if ph.fused:
        load_memory.drop_file_pages(list(ph.buffers()), maps)
    try:
        new = AWQMoEExperts.from_canonical(gate_up, down, group_size=G, act_quant=act_quant)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    new.awq_source = CheckpointSource(format=fmt, scales_dtype=sdt, expert_names=ph.names, fused_experts=ph.fused)
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
    """Replace ``mod``'s packed buffers in ``sd`` by checkpoint tensors in the layout it was loaded
    from: per expert (``<name>.<e>.<gate|up|down>.*``) or fused 3-D (``<name>.gate_up_proj.*``
    [E, ...], ``<name>.down_proj.*``)."""
    prefix = f"{name}." if name else ""
    for t in mod.op.weight_names():
        sd.pop(prefix + t, None)
    src = source_of(mod)
    fmt = formats.get(src.format or default_format)
    sdt = src.scales_dtype or torch.float16
    g, u, d = src.expert_names or ("gate_proj", "up_proj", "down_proj")
    I, G = mod.intermediate_size, mod.group_size
    stacked: Dict[str, list] = {}
    for e in range(mod.num_experts):
        (q, z, s), (dq, dz, ds) = mod.expert_canonical(e)
        if src.fused_experts:
            parts = ((FUSED_NAMES[0], (q, z, s)), (FUSED_NAMES[1], (dq, dz, ds)))
        else:
            parts = ((f"{e}.{g}", (q[:I], z[:I], s[:I])), (f"{e}.{u}", (q[I:], z[I:], s[I:])),
                     (f"{e}.{d}", (dq, dz, ds)))
        for part, (qi, zi, si) in parts:
            for t, v in fmt.pack(qi.contiguous(), zi.contiguous(), si.to(sdt), G).items():
                stacked.setdefault(f"{prefix}{part}.{t}", []).append(v)
    for key, vs in stacked.items():
        sd[key] = torch.stack(vs) if src.fused_experts else vs[0]
