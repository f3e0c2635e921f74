"""Kept for code written against the earlier path: tensor parallelism lives in :mod:`awq_inductor.tp`."""
from ..tp import *  # noqa: F401,F403
from ..tp import __all__  # noqa: F401
