"""The registry of checkpoint formats: name -> :class:`~awq_inductor.formats.base.CheckpointFormat`."""
from __future__ import annotations

from typing import Dict, Tuple

from .base import CheckpointFormat

FORMATS: Dict[str, CheckpointFormat] = {}
_MISSING = object()


def register(fmt: CheckpointFormat) -> CheckpointFormat:
    if fmt.name in FORMATS:
        raise ValueError(f"checkpoint format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt
    return fmt


def get(name, missing=_MISSING) -> CheckpointFormat:
    """The format named ``name`` (any case; a format object is returned as is); ValueError naming
    the known formats otherwise (or ``missing`` when given)."""
    if isinstance(name, CheckpointFormat):
        return name
    fmt = FORMATS.get(str(name).lower())
    if fmt is None:
        if missing is not _MISSING:
            return missing
        raise ValueError(f"format: expected one of {tuple(FORMATS)}, got {name!r}")
    return fmt


def names(quant_method: str = None) -> Tuple[str, ...]:
    """Registered format names (of one ``quant_method``: "awq" or "gptq")."""
    return tuple(n for n, f in FORMATS.items() if quant_method is None or f.quant_method == quant_method)
