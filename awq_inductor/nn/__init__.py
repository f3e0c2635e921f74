"""The modules: int4 layers running on the ``awq::int4_mm*`` / ``awq::int4_moe*`` ops, and the loading placeholders."""
from .checkpoint import CheckpointInt4Linear, ScaledActivation
from .linear import AWQGateUpSiluMul, AWQLinear
from .moe import AWQMoEExperts, CheckpointMoEExperts

__all__ = ["AWQLinear", "AWQGateUpSiluMul", "AWQMoEExperts", "CheckpointInt4Linear", "CheckpointMoEExperts",
           "ScaledActivation"]
