"""Checkpoint int4 formats <-> the one canonical form the rest of the package consumes.

Each format is one object (:class:`~awq_inductor.formats.base.CheckpointFormat`) in one file, in the
registry :data:`FORMATS`: its tensor names, shapes and dtypes, the exact unpack / pack pair (checked
against vectors made by AutoAWQ 0.2.9's own packer, tests/data/vectors), and the slices of each stored
tensor that hold a block of rows or columns (tensor-parallel loading). Every other module asks the
format object; :mod:`~awq_inductor.formats.quant_config` recognises a format from a checkpoint's
``quantization_config`` or a foreign module. Adding a format: one file here, registered below.
Bit layouts and sources: shared/design/formats.md section 2.
"""
from __future__ import annotations

from .awq_gemm import AWQ_ORDER, AWQ_REVERSE_ORDER, AwqGemm, pack_gemm, unpack_gemm
from .awq_gemv import AwqGemv, calculate_zeros_width, pack_gemv, unpack_gemv
from .awq_gemv_fast import GEMV_FAST_INTERLEAVE, GEMV_FAST_KSTRIDE, AwqGemvFast, pack_gemv_fast, unpack_gemv_fast
from .base import (ActOrderError, Canonical, CheckpointFormat, CheckpointSource, check_canonical, check_g_idx,
                   resolve_group_size, source_of)
from .autoround import AutoRoundAwq, AutoRoundGptq, autoround_formats
from .compressed_tensors import CompressedTensors, pack_compressed_tensors, unpack_compressed_tensors
from .gptq import Gptq, pack_gptq, unpack_gptq
from .registry import FORMATS, get, names, register

for _fmt in (AwqGemm(), AwqGemv(), AwqGemvFast(), Gptq("gptq"), Gptq("gptq_v2"), CompressedTensors(True),
             CompressedTensors(False), *autoround_formats()):
    register(_fmt)

from .quant_config import (AWQ_VERSION_ALIASES, QuantSpec, UnsupportedCheckpoint, awq_format,  # noqa: E402
                           from_quantization_config, gptq_format, is_foreign_int4_linear, module_format,
                           quant_methods)

AWQ_FORMATS = names("awq")
GPTQ_FORMATS = names("gptq")

__all__ = [
    "ActOrderError", "AutoRoundAwq", "AutoRoundGptq", "CompressedTensors", "pack_compressed_tensors",
    "unpack_compressed_tensors", "AWQ_FORMATS", "AWQ_ORDER", "AWQ_REVERSE_ORDER", "AWQ_VERSION_ALIASES", "Canonical",
    "CheckpointFormat", "CheckpointSource", "FORMATS", "GEMV_FAST_INTERLEAVE", "GEMV_FAST_KSTRIDE", "GPTQ_FORMATS",
    "QuantSpec", "UnsupportedCheckpoint", "awq_format", "calculate_zeros_width", "check_canonical", "check_g_idx",
    "checkpoint_shapes", "from_quantization_config", "get", "gptq_format", "infer_shape", "is_foreign_int4_linear",
    "module_format", "names", "quant_methods", "pack_awq", "pack_gemm", "pack_gemv", "pack_gemv_fast", "pack_gptq", "register",
    "resolve_group_size", "source_of", "unpack_awq", "unpack_gemm", "unpack_gemv", "unpack_gemv_fast", "unpack_gptq",
]


def _awq(format) -> CheckpointFormat:
    fmt = get(format, missing=None)
    if fmt is None or fmt.quant_method != "awq":
        raise ValueError(f"format: expected one of {AWQ_FORMATS}, got {format!r}")
    return fmt


def unpack_awq(qweight, qzeros, scales, *, group_size: int, format: str) -> Canonical:
    """An AWQ ``version`` (gemm | gemv | gemv_fast, any case) -> canonical."""
    return _awq(format).unpack(qweight, qzeros, scales, group_size)


def pack_awq(q, zeros, scales, *, group_size: int, format: str):
    """Inverse of :func:`unpack_awq`: (qweight, qzeros, scales)."""
    t = _awq(format).pack(q, zeros, scales, group_size)
    return t["qweight"], t["qzeros"], t["scales"]


def infer_shape(qweight, format: str):
    """(in_features, out_features) from a checkpoint qweight alone (any registered format)."""
    return get(format).infer_shape(qweight)


def checkpoint_shapes(format: str, in_features: int, out_features: int, group_size: int):
    """Expected (shape, dtype) of each tensor of one int4 linear in checkpoint ``format``.
    NotImplementedError for a group size the format cannot store (GEMV zeros width)."""
    fmt = get(format)
    return fmt.shapes(in_features, out_features, resolve_group_size(group_size, in_features))
