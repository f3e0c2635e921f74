"""``torch.compile`` backend ``"awq_inductor"``: Inductor with our int4 lowering and cache pass.

    torch.compile(model, backend="awq_inductor")              # via the pyproject entry point
    torch.compile(model, backend=awq_inductor_backend)         # or the function itself
    torch.compile(model, backend="awq_inductor", options={...})  # extra Inductor config patches

It is ``compile_fx`` with config patches suited to CPU inference of pre-packed int4 weights:
the weights stay graph inputs (``freezing`` off: they are packed at load time, never baked as
compile-time constants, see design/inductor.md §3), ``cpp.threads`` is left to Inductor
(= ``torch.get_num_threads()``), and :func:`awq_inductor.inductor.lowering.cache_pass` is appended to
``post_grad_custom_post_pass`` so the FX graph cache key covers our templates and lowering.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import lowering

BACKEND_NAME = "awq_inductor"


def backend_config_patches(extra: Optional[dict] = None) -> dict:
    """The Inductor config patches the backend applies (``extra`` wins, pass lists are merged)."""
    extra = dict(extra or {})
    ours = lowering.cache_pass()
    user_pass = extra.pop("post_grad_custom_post_pass", lowering.inductor_post_grad_custom_post_pass())
    if user_pass is None:
        post = ours
    else:
        post = [*(user_pass if isinstance(user_pass, (list, tuple)) else [user_pass])]
        if not any(type(p) is type(ours) for p in post):
            post.append(ours)
    patches: dict[str, Any] = {
        "freezing": False,
        "post_grad_custom_post_pass": post,
    }
    patches.update(extra)
    return patches


def awq_inductor_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """Dynamo backend: register the lowering, then ``compile_fx`` with :func:`backend_config_patches`.

    ``options=`` / ``config_patches=`` (a dict of Inductor config) is merged into the patches.
    """
    extra = {}
    mode = kwargs.pop("mode", None)
    if mode and mode != "default":
        extra.update(lowering.inductor_mode_options(mode))
    for key in ("options", "config_patches"):
        if kwargs.get(key):
            extra.update(kwargs.pop(key))
        else:
            kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"awq_inductor_backend: unexpected arguments {sorted(kwargs)}")
    return lowering.compile_with_inductor(gm, example_inputs, backend_config_patches(extra))


def _entry_point_installed() -> bool:
    try:
        from importlib.metadata import entry_points

        return BACKEND_NAME in entry_points(group="torch_dynamo_backends").names
    except Exception:  # noqa: BLE001
        return False


def _register_backend_name() -> None:
    # With the package installed, dynamo finds us through the entry point and registers the
    # function itself when it loads it (registering here too would make that a duplicate).
    if _entry_point_installed():
        return
    try:
        torch._dynamo.register_backend(awq_inductor_backend, name=BACKEND_NAME)
    except AssertionError:  # already registered (module re-imported)
        pass


_register_backend_name()
