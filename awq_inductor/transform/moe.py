"""The MoE part of the model pass and of the state-dict round trip.

* :func:`convert_experts`: every :class:`~awq_inductor.nn.CheckpointMoEExperts` whose per-expert
  projections the model pass has turned into :class:`AWQLinear` becomes one
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
from ..nn import AWQLinear, AWQMoEExperts, CheckpointMoEExperts


def _experts_from_placeholder(name: str, ph: CheckpointMoEExperts, act_quant: Optional[str]) -> AWQMoEExperts:
    linears = []
    for e in range(ph.num_experts):
        mods = ph.expert_modules(e)
        for n, m in zip(ph.names, mods):
            if not isinstance(m, AWQLinear):
                raise ValueError(f"{name}.{e}.{n}: expected an int4 linear like the other experts (one op for all "
                                 f"experts of a layer), got {type(m).__name__}; list the whole experts module in "
                                 f"modules_to_not_convert to keep it in floating point")
        linears.append(mods)
    try:
        new = AWQMoEExperts.from_linears(linears, act_quant=act_quant)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from err
    src = getattr(linears[0][0], "awq_source", None) or {}
    new.awq_source = {"format": src.get("format"), "scales_dtype": src.get("scales_dtype"), "names": ph.names}
    return new


def convert_experts(model: nn.Module, act_quant: Optional[str] = None) -> int:
    """Replace the experts placeholders of ``model`` (after their linears were converted) and repack
    existing :class:`AWQMoEExperts` for ``act_quant``; returns how many modules were replaced."""
    n = 0
    for name, mod in list(model.named_modules()):
        if isinstance(mod, CheckpointMoEExperts):
            model.set_submodule(name, _experts_from_placeholder(name, mod, act_quant))
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
