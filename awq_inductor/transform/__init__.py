"""Model transformations: ``convert`` (int4 linears -> AWQLinear, q/k/v and gate|up fusion) and
the state-dict round trip back to the checkpoint format (``checkpoint_state_dict``)."""
from .model_pass import convert, count_int4_linears, op_shapes, tune_model
from .state_dict import checkpoint_state_dict

__all__ = ["convert", "count_int4_linears", "checkpoint_state_dict", "op_shapes", "tune_model"]
