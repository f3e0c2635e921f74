"""AutoRound int4 (``quant_method: auto-round``, auto-round 0.16 export side).

``packing_format`` decides the tensors (auto_round/export/export_to_autoround/export.py and
inference/backend.py); each value is one format object over an existing codec:

=========================  ==================  ==========================================
packing_format             format object       tensors (codec)
=========================  ==================  ==========================================
auto_round:auto_gptq       autoround_gptq      GPTQ v1: qzeros hold z - 1, no g_idx
  (also absent, ``auto``, ``auto_round:gptq``: transformers' AutoRoundConfig default)
auto_round                 autoround           GPTQ layout, raw zeros (v2), no g_idx
auto_round:gptqmodel       autoround_gptqmodel GPTQ layout, raw zeros, g_idx = k // G
auto_round:auto_awq        autoround_awq       AutoAWQ GEMM (also ``auto_round:awq``)
=========================  ==================  ==========================================

Sym checkpoints store z = 8 like any other zero (v1: nibble 7), so the codecs read them exactly;
AutoRound's symmetric scales are negative for about half the groups (``int_sym`` "full range"),
which the canonical form carries as is. Layers AutoRound keeps in 16 bits (``extra_config``
``bits: 16``: its own N/K % 32 rule, or the user's) and layers outside ``block_name_to_quantize``
load as float ``nn.Linear``; any other per-layer override is refused by name.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Mapping

from .awq_gemm import AwqGemm
from .base import CheckpointFormat
from .gptq import Gptq

#: packing_format spellings -> our format name (inference/convert_model.py normalisation)
PACKING_FORMATS = {"auto_round:auto_gptq": "autoround_gptq", "auto_round:gptq": "autoround_gptq",
                   "auto": "autoround_gptq", "auto_round": "autoround", "auto_round:gptqmodel": "autoround_gptqmodel",
                   "auto_round:auto_awq": "autoround_awq", "auto_round:awq": "autoround_awq"}
#: scheme keys an ``extra_config`` entry may carry; ones we can honour are checked below
_LAYER_KEYS = ("bits", "group_size", "sym", "data_type", "act_bits", "act_group_size", "act_sym",
               "act_data_type", "act_dynamic", "super_bits", "super_group_size", "rotation_config")


class AutoRoundConfigError(ValueError):
    """An AutoRound ``quantization_config`` that is not int4 weight-only."""


def packing_format(qc: Mapping) -> str:
    value = str(qc.get("packing_format") or "auto_round:gptq").lower()
    if value not in PACKING_FORMATS:
        raise AutoRoundConfigError(f"quantization_config.packing_format: expected one of "
                                   f"{tuple(sorted(PACKING_FORMATS))} (int4), got {value!r}")
    return PACKING_FORMATS[value]


def _kept_float(entry: Mapping) -> bool:
    return int(entry.get("bits", 4)) >= 16


def check_autoround_config(qc: Mapping) -> None:
    packing_format(qc)
    if str(qc.get("data_type", "int")).lower() != "int":
        raise AutoRoundConfigError(f"quantization_config.data_type: expected 'int', got {qc['data_type']!r}")
    act_bits = qc.get("act_bits", 16)
    if act_bits is not None and int(act_bits) < 16:
        raise AutoRoundConfigError(f"quantization_config.act_bits: expected 16 (weight-only; activation-"
                                   f"quantized schemes are not supported), got {act_bits!r}")
    for key in ("super_bits", "super_group_size"):
        if qc.get(key) is not None:
            raise AutoRoundConfigError(f"quantization_config.{key}: expected null, got {qc[key]!r}")
    for layer, entry in (qc.get("extra_config") or {}).items():
        where = f"quantization_config.extra_config.{layer}"
        if _kept_float(entry):
            continue  # kept 16-bit: loads as nn.Linear
        for key, value in entry.items():
            if key not in _LAYER_KEYS:
                continue
            if key == "bits" and int(value) != 4:
                raise AutoRoundConfigError(f"{where}.bits: expected 4 or 16, got {value!r}")
            if key == "group_size" and int(value) != int(qc.get("group_size", 128)):
                raise AutoRoundConfigError(f"{where}.group_size: expected {qc.get('group_size')!r} (one group "
                                           f"size per checkpoint), got {value!r}")
            if key == "data_type" and str(value).lower() != "int":
                raise AutoRoundConfigError(f"{where}.data_type: expected 'int', got {value!r}")
            if key == "act_bits" and value is not None and int(value) < 16:
                raise AutoRoundConfigError(f"{where}.act_bits: expected 16 (weight-only), got {value!r}")
            if key in ("super_bits", "super_group_size", "rotation_config") and value is not None:
                raise AutoRoundConfigError(f"{where}.{key}: expected null, got {value!r}")
            # sym may differ per layer: the zeros are stored either way, the codec reads them exactly


def _layer_match(name: str, pattern: str) -> bool:
    if pattern == name:
        return True
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:
        return False


def skipped_modules(qc: Mapping, modules: Iterable[tuple]) -> List[str]:
    """Linears left in float: outside ``block_name_to_quantize`` or ``extra_config`` bits >= 16."""
    blocks = qc.get("block_name_to_quantize")
    if isinstance(blocks, str):
        blocks = [b for b in blocks.split(",") if b]
    extra = qc.get("extra_config") or {}
    out = []
    for name, _ in modules:
        hits = [e for p, e in extra.items() if _layer_match(name, p)]
        if any(_kept_float(e) for e in hits):
            out.append(name)
        elif blocks and not hits and not any(name == b or name.startswith(b + ".") for b in blocks):
            out.append(name)
    return out


class _AutoRoundMixin:
    quant_method = "auto-round"
    packing_value = ""

    def recognizes(self, qc):
        try:
            return packing_format(qc) == self.name
        except AutoRoundConfigError:
            return self.name == "autoround_gptq"  # check_config names the value

    def check_config(self, qc):
        check_autoround_config(qc)

    def skipped_modules(self, qc, modules):
        return skipped_modules(qc, modules)

    def quantization_config(self, group_size, modules_to_not_convert=None):
        # what auto-round 0.16.1 writes for iters=0 (NOTES §2; the vectors' metadata holds the JSON)
        qc = {"autoround_version": "0.16.1", "bits": 4, "block_name_to_quantize": "model.layers",
              "data_type": "int", "enable_quanted_input": False, "group_size": group_size,
              "packing_format": self.packing_value, "quant_method": "auto-round", "sym": self.symmetric}
        if modules_to_not_convert:
            qc["extra_config"] = {m: {"bits": 16, "data_type": "fp"} for m in modules_to_not_convert}
        return qc


class AutoRoundGptq(_AutoRoundMixin, Gptq):
    """AutoRound's GPTQ-layout packings; ``codec``: gptq (v1, z - 1) or gptq_v2 (raw zeros)."""

    def __init__(self, name: str, codec: str, packing_value: str, g_idx: bool, sym: bool):
        Gptq.__init__(self, codec)
        self.codec, self.name, self.packing_value, self.has_g_idx, self.symmetric = codec, name, packing_value, g_idx, sym

    def pack(self, q, zeros, scales, group_size):
        out = Gptq.pack(self, q, zeros, scales, group_size)
        if not self.has_g_idx:
            out.pop("g_idx")
        return out

    def check_config(self, qc):
        check_autoround_config(qc)


class AutoRoundAwq(_AutoRoundMixin, AwqGemm):
    """``auto_round:auto_awq``: AutoAWQ GEMM tensors (export_to_awq/utils.py WQLinear_GEMM)."""

    name, packing_value, symmetric = "autoround_awq", "auto_round:auto_awq", False

    def check_config(self, qc):
        check_autoround_config(qc)


def autoround_formats() -> List[CheckpointFormat]:
    return [AutoRoundGptq("autoround_gptq", "gptq", "auto_round:auto_gptq", g_idx=False, sym=True),
            AutoRoundGptq("autoround", "gptq_v2", "auto_round", g_idx=False, sym=False),
            AutoRoundGptq("autoround_gptqmodel", "gptq_v2", "auto_round:gptqmodel", g_idx=True, sym=False),
            AutoRoundAwq()]
