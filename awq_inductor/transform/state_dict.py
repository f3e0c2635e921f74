"""The state-dict round trip: a converted model written back in its checkpoint format.

Every :class:`AWQLinear` / :class:`AWQGateUpSiluMul` is unpacked to canonical form and packed into
the format recorded in its ``awq_source`` (its format object's ``pack``) under the
original module names; fused modules are split again. ``save_pretrained`` uses it, so a saved
folder loads like the original one (through our transformers patch or any other AWQ/GPTQ loader).
"""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from .. import formats
from ..formats import source_of
from ..nn import AWQGateUpSiluMul, AWQLinear, AWQMoEExperts
from ..nn.head import QUANTIZED_HEADS, Int8HeadLinear
from .moe import experts_state_dict


def _pack_act_order(fmt, name, q, z, s, G, perm):
    if not hasattr(fmt, "pack_act_order"):
        raise ValueError(f"{name}: an act-order (input-permuted) module cannot be written as format {fmt.name!r}, "
                         "which stores no g_idx")
    return fmt.pack_act_order(q, z, s, G, perm)  # q back in checkpoint column order + the original g_idx


def checkpoint_state_dict(model: nn.Module, default_format: str = "gemm") -> Dict[str, torch.Tensor]:
    """``model.state_dict()`` with every AWQLinear written back in its checkpoint format under the
    original module names (fused modules split again). Used by ``save_pretrained``."""
    sd = model.state_dict()
    for name, mod in model.named_modules():
        if isinstance(mod, QUANTIZED_HEADS):
            # its float weight is gone (quantized at load): writing the quantized copy back as
            # `<name>.weight` would silently change the model any other loader sees
            kind = "int8" if isinstance(mod, Int8HeadLinear) else "int4"
            raise ValueError(f"{name}: an {kind} lm_head (lm_head={kind!r}) cannot be saved as the checkpoint's "
                             f"float {name}.weight without loss; save a model loaded with lm_head=None")
        if isinstance(mod, AWQMoEExperts):
            experts_state_dict(name, mod, sd, default_format)
            continue
        if not isinstance(mod, (AWQLinear, AWQGateUpSiluMul)):
            continue
        prefix = f"{name}." if name else ""
        for t in [w.name for w in mod.op.scheme.weights] + ["bias"]:
            sd.pop(prefix + t, None)
        src = source_of(mod)
        fmt = formats.get(src.format or default_format)
        sdt = src.scales_dtype or torch.float16
        bdt = src.bias_dtype or sdt
        parent = name.rpartition(".")[0]
        parts = src.parts or [(name.rpartition(".")[2], getattr(mod, "gate_up_features", mod.out_features),
                                      mod.bias is not None)]
        q, z, s = mod.canonical()  # AWQGateUpSiluMul: [gate ; up] order, like the fused AWQLinear
        bias = mod.canonical_bias()
        off = 0
        for part, n, has_bias in parts:
            pname = f"{parent}.{part}" if parent else part
            sl = slice(off, off + n)
            qi, zi, si = q[sl].contiguous(), z[sl].contiguous(), s[sl].to(sdt).contiguous()
            packed = fmt.pack(qi, zi, si, mod.group_size) if mod.perm is None else \
                _pack_act_order(fmt, name, qi, zi, si, mod.group_size, mod.perm)
            for t, v in packed.items():
                sd[f"{pname}.{t}"] = v
            if has_bias:
                sd[f"{pname}.bias"] = bias[sl].to(bdt).contiguous()
            off += n
    return sd
