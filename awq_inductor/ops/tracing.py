"""Hooks run when an op of ours is first traced (its fake impl runs: torch.compile, export).

Tracing is when a lowering can be needed next, and Inductor is being imported anyway, so the
Inductor integration (:mod:`awq_inductor.inductor`) adds its ``register`` here: a plain
``torch.compile(model)`` then uses our templates without the package import paying for
``torch._inductor``, and the ops never import the compiler integration."""
from __future__ import annotations

from typing import Callable, List

_hooks: List[Callable[[], object]] = []


def add_first_trace_hook(fn: Callable[[], object]) -> None:
    """Run ``fn`` (idempotent) whenever an op is traced; added once."""
    if fn not in _hooks:
        _hooks.append(fn)


def on_first_trace() -> None:
    for fn in _hooks:
        fn()
