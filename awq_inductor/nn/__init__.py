"""The modules: int4 layers running on the ``awq::int4_mm*`` ops, and the loading placeholders."""
from .checkpoint import CheckpointInt4Linear, ScaledActivation
from .linear import AWQGateUpSiluMul, AWQLinear

__all__ = ["AWQLinear", "AWQGateUpSiluMul", "CheckpointInt4Linear", "ScaledActivation"]
