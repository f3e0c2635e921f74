"""compressed-tensors ``pack-quantized`` int4 weight-only (``quant_method: compressed-tensors``,
llm-compressor's W4A16 / W4A16_ASYM presets; compressed-tensors 0.20
``compressors/pack_quantized``).

Per linear (prefix ``<module>.``)::

    weight_packed      int32 [N, ceil(K/8)]  packed along K: k = 8w + i is nibble i of word w,
                                             value q_signed + 8; padding nibbles are 0, not 8
    weight_scale       model dtype [N, K/G]  (channel: [N, 1])
    weight_zero_point  int32 [ceil(N/8), K/G]  asymmetric only; packed along N (dim 0): row
                                             8r + i is nibble i of [r, g], value zp_signed + 8
    weight_shape       int64 [2]             (N, K): the only record of K for channel strategy

The library's dequant is ``(x_q - zp) * scale`` with signed ``x_q``, ``zp`` (0 when symmetric), so
canonical q = the stored nibble and z = the zero-point nibble, or exactly 8 when symmetric (no
approximation: ``(u - 8) * s == x_q * s``). Two format objects, because whether
``weight_zero_point`` exists is a property of the scheme: ``compressed_tensors`` (symmetric) and
``compressed_tensors_asym``. Facts checked against vectors made by compressed-tensors 0.20 /
llm-compressor 0.14 (tests/data/vectors24, benchmarks/make_format_vectors.py).
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Mapping, Optional

import torch

from .base import (FLOATS, Canonical, CheckpointFormat, check_canonical, check_tensor, fmt_shape,
                   nibbles_to_words, words_to_nibbles)

SYM_ZERO = 8
_SUPPORTED_STRATEGIES = ("group", "channel")


class CompressedTensorsConfigError(ValueError):
    """A compressed-tensors ``quantization_config`` that is not int4 weight-only pack-quantized."""


def _pad_last(t: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = -t.shape[-1] % multiple
    return torch.nn.functional.pad(t, (0, pad)) if pad else t  # pad nibbles are 0, as the library writes


def _pack_last(nib: torch.Tensor) -> torch.Tensor:
    """uint8 [R, C] (values < 16) -> int32 [R, ceil(C/8)], padding nibbles 0."""
    return nibbles_to_words(_pad_last(nib.to(torch.uint8), 8).contiguous(), torch.int32)


def _shape_of(weight_shape: torch.Tensor):
    if not isinstance(weight_shape, torch.Tensor) or tuple(weight_shape.shape) != (2,) or weight_shape.is_floating_point():
        got = f"{weight_shape.dtype} {fmt_shape(weight_shape.shape)}" if isinstance(weight_shape, torch.Tensor) \
            else type(weight_shape).__name__
        raise ValueError(f"weight_shape: expected int [2], got {got}")
    return int(weight_shape[0]), int(weight_shape[1])


def unpack_compressed_tensors(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                              weight_shape: torch.Tensor, group_size: int,
                              weight_zero_point: Optional[torch.Tensor] = None) -> Canonical:
    """pack-quantized tensors -> canonical (z = 8 without ``weight_zero_point``: symmetric)."""
    N, K = _shape_of(weight_shape)
    G = K if group_size in (-1, None) else int(group_size)
    if K % G:
        raise ValueError(f"group_size: expected a divisor of in_features={K} (compressed-tensors group strategy), "
                         f"got {G}")
    ng = K // G
    check_tensor("weight_packed", weight_packed, torch.int32, (N, -(-K // 8)))
    check_tensor("weight_scale", weight_scale, "float", (N, ng))
    q = words_to_nibbles(weight_packed)[:, :K].contiguous()
    if weight_zero_point is None:
        z = torch.full((N, ng), SYM_ZERO, dtype=torch.uint8, device=q.device)
    else:
        check_tensor("weight_zero_point", weight_zero_point, torch.int32, (-(-N // 8), ng))
        z = words_to_nibbles(weight_zero_point.t().contiguous())[:, :N].t().contiguous()
    return Canonical(q, z, weight_scale.contiguous())


def pack_compressed_tensors(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                            symmetric: bool) -> Dict[str, torch.Tensor]:
    """Canonical -> the pack-quantized tensors (byte-identical to compressed-tensors' compressor)."""
    N, K, G = check_canonical(q, zeros, scales, group_size)
    out = {"weight_packed": _pack_last(q), "weight_scale": scales.contiguous()}
    if symmetric:
        if zeros.numel() and not bool((zeros == SYM_ZERO).all()):
            raise ValueError(f"zeros: expected all {SYM_ZERO} for a symmetric compressed-tensors checkpoint, "
                             f"got values {sorted(set(zeros.unique().tolist()))[:8]}")
    else:
        out["weight_zero_point"] = _pack_last(zeros.t()).t().contiguous()
    out["weight_shape"] = torch.tensor([N, K], dtype=torch.int64)
    return out


# --------------------------------------------------------------------------- config
def _weights_groups(qc: Mapping) -> List[tuple]:
    groups = qc.get("config_groups") or {}
    if not groups:
        raise CompressedTensorsConfigError("quantization_config.config_groups: expected at least one group, got none")
    return [(name, g or {}) for name, g in groups.items()]


def check_compressed_tensors_config(qc: Mapping) -> None:
    """Refuse, naming the field and its value, whatever is not int4 weight-only pack-quantized."""
    top = qc.get("format")
    for gname, g in _weights_groups(qc):
        where = f"quantization_config.config_groups.{gname}"
        fmt = g.get("format", top)
        if fmt not in (None, "pack-quantized"):
            raise CompressedTensorsConfigError(f"{where}.format: expected 'pack-quantized' (int4 weight-only), "
                                               f"got {fmt!r}")
        for act in ("input_activations", "output_activations"):
            if g.get(act) is not None:
                raise CompressedTensorsConfigError(
                    f"{where}.{act}: expected null (weight-only schemes; activation-quantized schemes such as "
                    f"W4A8/W8A8 are not supported), got {g[act]!r}")
        w = g.get("weights")
        if not w:
            raise CompressedTensorsConfigError(f"{where}.weights: expected int4 weight arguments, got {w!r}")
        checks = (("type", "int", w.get("type", "int")), ("num_bits", 4, w.get("num_bits")),
                  ("strategy", "one of ('group', 'channel')", w.get("strategy")),
                  ("dynamic", False, w.get("dynamic", False)))
        for field, want, got in checks:
            ok = got in _SUPPORTED_STRATEGIES if field == "strategy" else got == want
            if not ok:
                raise CompressedTensorsConfigError(f"{where}.weights.{field}: expected {want!r}, got {got!r}")
        if w.get("actorder") not in (None, "weight", "static", False):
            raise CompressedTensorsConfigError(f"{where}.weights.actorder: expected null/'weight'/'static' "
                                               f"(compressed-tensors 0.20 stores no g_idx), got {w['actorder']!r}")
        if w.get("block_structure") is not None:
            raise CompressedTensorsConfigError(f"{where}.weights.block_structure: expected null, "
                                               f"got {w['block_structure']!r}")
    _scheme_fields(qc)  # one group size and one symmetry for the whole checkpoint
    if qc.get("kv_cache_scheme") is not None:
        raise CompressedTensorsConfigError(f"quantization_config.kv_cache_scheme: expected null, "
                                           f"got {qc['kv_cache_scheme']!r}")
    if qc.get("sparsity_config"):
        raise CompressedTensorsConfigError(f"quantization_config.sparsity_config: expected empty, "
                                           f"got {qc['sparsity_config']!r}")


def _scheme_fields(qc: Mapping):
    """(group size, symmetric) shared by every config group (-1: channel)."""
    seen = set()
    for _, g in _weights_groups(qc):
        w = g.get("weights") or {}
        gs = -1 if w.get("strategy") == "channel" else int(w.get("group_size") or -1)
        seen.add((gs, bool(w.get("symmetric", True))))
    if len(seen) != 1:
        raise CompressedTensorsConfigError("quantization_config.config_groups: expected one group_size and one "
                                           f"symmetric setting for all groups, got {sorted(seen)}")
    return seen.pop()


def match_name(name: str, module_cls: Optional[type], pattern: str) -> bool:
    """compressed-tensors utils/match.py: exact name, ``re:<regex>`` (re.match), or a class name in the MRO."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if pattern == name:
        return True
    return module_cls is not None and any(c.__name__ == pattern for c in module_cls.__mro__)


def skipped_modules(qc: Mapping, modules: Iterable[tuple]) -> List[str]:
    """Names of the linears (``modules``: (name, class)) that the config leaves in float: matched by
    no group's ``targets`` or by an ``ignore`` entry."""
    targets = [t for _, g in _weights_groups(qc) for t in (g.get("targets") or [])]
    ignore = list(qc.get("ignore") or [])
    out = []
    for name, cls in modules:
        hit = any(match_name(name, cls, t) for t in targets)
        if not hit or any(match_name(name, cls, p) for p in ignore):
            out.append(name)
    return out


class CompressedTensors(CheckpointFormat):
    """compressed-tensors pack-quantized int4 W4A16, symmetric (no zero point) or asymmetric."""

    quant_method = "compressed-tensors"
    scales_tensor = "weight_scale"

    def __init__(self, symmetric: bool):
        self.symmetric = symmetric
        self.name = "compressed_tensors" if symmetric else "compressed_tensors_asym"
        self.tensors = ("weight_packed", "weight_scale", "weight_shape") if symmetric else \
            ("weight_packed", "weight_zero_point", "weight_scale", "weight_shape")

    def recognizes(self, qc):
        try:
            return _scheme_fields(qc)[1] == self.symmetric
        except CompressedTensorsConfigError:
            return self.symmetric  # check_config names the problem

    def check_config(self, qc):
        check_compressed_tensors_config(qc)

    def group_size(self, qc) -> int:
        return _scheme_fields(qc)[0]

    def skipped_modules(self, qc, modules):
        return skipped_modules(qc, modules)

    def quantization_config(self, group_size, modules_to_not_convert=None):
        # exactly what llm-compressor 0.14 + compressed-tensors 0.20 write for W4A16(_ASYM)
        # (NOTES §1; the vectors' metadata holds the JSON); channel: group_size null
        weights = {"dynamic": False, "group_size": None if group_size == -1 else group_size, "num_bits": 4,
                   "observer": "memoryless_minmax", "strategy": "channel" if group_size == -1 else "group",
                   "symmetric": self.symmetric, "type": "int"}
        return {"config_groups": {"group_0": {"format": "pack-quantized", "input_activations": None,
                                              "output_activations": None, "targets": ["Linear"],
                                              "weights": weights}},
                "format": "pack-quantized", "global_compression_ratio": None,
                "ignore": list(modules_to_not_convert or []) + ["lm_head"], "kv_cache_scheme": None,
                "moe_sparsity_config": None, "quant_method": "compressed-tensors",
                "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
                "version": "0.20.0"}

    def dtypes(self):
        return {"weight_packed": ("int32", (torch.int32,)), "weight_zero_point": ("int32", (torch.int32,)),
                "weight_scale": ("float16/bfloat16/float32", FLOATS),
                "weight_shape": ("int64/int32", (torch.int64, torch.int32)),
                "bias": ("float16/bfloat16/float32", FLOATS)}

    def shapes(self, K, N, G):
        ng = K // G
        out = {"weight_packed": ((N, -(-K // 8)), torch.int32), "weight_scale": ((N, ng), torch.bfloat16)}
        if not self.symmetric:
            out["weight_zero_point"] = ((-(-N // 8), ng), torch.int32)
        out["weight_shape"] = ((2,), torch.int64)
        return out

    def infer_shape(self, weight_packed):
        raise ValueError("compressed-tensors: in_features is recorded in weight_shape, not weight_packed")

    def unpack(self, *tensors, g_idx=None):
        *t, group_size = tensors
        d = dict(zip(self.tensors, t))
        return unpack_compressed_tensors(d["weight_packed"], d["weight_scale"], d["weight_shape"], group_size,
                                         d.get("weight_zero_point"))

    def pack(self, q, zeros, scales, group_size):
        return pack_compressed_tensors(q, zeros, scales, group_size, self.symmetric)
