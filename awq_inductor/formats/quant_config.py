"""Recognising a checkpoint's format: from its ``quantization_config`` (config.json) and from a
foreign int4 module (gptqmodel / AutoAWQ / llm-awq, duck typed, without importing them)."""
from __future__ import annotations

from typing import Mapping, NamedTuple, Tuple

import torch

from .autoround import AutoRoundConfigError
from .base import AWQ_VERSION_ALIASES, CheckpointFormat, awq_version, config_text as _text  # noqa: F401
from .compressed_tensors import CompressedTensorsConfigError
from .registry import FORMATS, get



class UnsupportedCheckpoint(ValueError):
    """A ``quantization_config`` this package cannot run: names the field, the expected and the actual value."""


class QuantSpec(NamedTuple):
    format: CheckpointFormat
    group_size: int


def awq_format(version) -> CheckpointFormat:
    """The format of an AWQ ``version`` / ``format`` value."""
    fmt = awq_version(version)
    if fmt == "marlin":
        raise NotImplementedError("awq_inductor: AWQ version 'marlin' checkpoints (symmetric, Marlin tile layout) are "
                                  "not supported; supported versions: gemm, gemv, gemv_fast (and exllama/ipex, "
                                  "stored as gemm)")
    f = get(fmt, missing=None)
    if f is None or f.quant_method != "awq":
        raise NotImplementedError(f"awq_inductor: AWQ version {fmt!r} is not supported; supported: "
                                  f"('gemm', 'gemv', 'gemv_fast')")
    return f


def gptq_format(checkpoint_format) -> CheckpointFormat:
    """The format of a GPTQ ``checkpoint_format`` / ``format`` value (gptq = v1, gptq_v2)."""
    fmt = _text(checkpoint_format or "gptq")
    f = get(fmt, missing=None)
    if f is None or f.quant_method != "gptq":
        raise NotImplementedError(f"awq_inductor: GPTQ checkpoint_format {fmt!r} is not supported; supported: "
                                  f"('gptq', 'gptq_v2')")
    return f


def quant_methods() -> Tuple[str, ...]:
    """The ``quant_method`` values of the registered formats ("awq", "gptq", ...)."""
    return tuple(dict.fromkeys(f.quant_method for f in FORMATS.values()))


def from_quantization_config(qc: Mapping) -> QuantSpec:
    """(format, group size) of a config.json ``quantization_config``: the registered format whose
    ``quant_method`` matches and that :meth:`~CheckpointFormat.recognizes` it, after its
    :meth:`~CheckpointFormat.check_config`. :class:`UnsupportedCheckpoint` (or NotImplementedError
    for a known but unsupported layout) naming the field otherwise."""
    method = _text(qc.get("quant_method", ""))
    if method not in quant_methods():
        raise UnsupportedCheckpoint(f"quantization_config.quant_method: expected one of {quant_methods()}, "
                                    f"got {method!r}")
    bits = qc.get("bits", qc.get("w_bit", 4))
    if int(bits) != 4:
        raise UnsupportedCheckpoint(f"quantization_config.bits: expected 4 (int4 checkpoints only), got {bits!r}")
    fmt = next((f for f in FORMATS.values() if f.quant_method == method and f.recognizes(qc)), None)
    if fmt is None:  # the method's own message for an unknown layout (marlin, exllama tags, ...)
        fmt = awq_format(qc.get("version", qc.get("format"))) if method == "awq" else \
            gptq_format(qc.get("checkpoint_format", qc.get("format")))
    try:
        fmt.check_config(qc)
    except (CompressedTensorsConfigError, AutoRoundConfigError) as e:
        raise UnsupportedCheckpoint(str(e)) from e
    return QuantSpec(fmt, fmt.group_size(qc))


def is_foreign_int4_linear(mod) -> bool:
    """A gptqmodel / AutoAWQ / llm-awq style int4 linear: ``qweight``, ``qzeros``, ``scales``
    tensors plus ``w_bit`` or ``bits`` and ``group_size``."""
    has_t = all(isinstance(getattr(mod, n, None), torch.Tensor) for n in ("qweight", "qzeros", "scales"))
    bits = getattr(mod, "w_bit", getattr(mod, "bits", None))
    return has_t and bits is not None and hasattr(mod, "group_size")


def module_format(mod) -> CheckpointFormat:
    """The checkpoint format of a foreign int4 linear, from its class name and tensors."""
    name = type(mod).__name__.lower().replace("_", "")
    if any(t in name for t in ("gemvfast", "llmawq")) or mod.qweight.dtype == torch.int16:
        return get("gemv_fast")
    if "gemv" in name:
        return get("gemv")
    if "awq" in name or "wqlinear" in name:
        return get("gemm")
    qzf = getattr(mod, "qzero_format", None)
    if callable(qzf):
        try:
            return get("gptq_v2" if qzf() == 2 else "gptq")
        except Exception:  # noqa: BLE001 - foreign API, best effort
            pass
    return get("gptq")
