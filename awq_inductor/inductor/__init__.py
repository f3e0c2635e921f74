"""Inductor integration: the template lowering of every ``awq::int4_mm*`` op and MoE
``awq::int4_moe*`` op (``lowering``), one shared library per compiled graph (``graph_library``):
the only two modules that import ``torch._inductor``; and the ``awq_inductor`` torch.compile
backend (``backend``).

:func:`register` installs the lowerings; it is called when an op is first traced (``ops``) and by
the backend. Importing this package stays cheap: ``lowering`` is imported inside :func:`register`.
"""
from __future__ import annotations

import logging
import os
import threading
import warnings
from typing import Optional

import torch

log = logging.getLogger(__name__)

#: torch minor version the private Inductor APIs used here were checked against.
TESTED_TORCH = (2, 13)
#: Set to "1" to try registering on an untested torch version (feature detection still applies).
ALLOW_UNTESTED_ENV = "AWQ_INDUCTOR_ALLOW_UNTESTED_TORCH"

_lock = threading.Lock()
_registered: Optional[bool] = None
_warned = False


def torch_version_ok() -> bool:
    try:
        major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) == TESTED_TORCH


def _warn_once(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _try_register() -> bool:
    if not torch_version_ok() and os.environ.get(ALLOW_UNTESTED_ENV) != "1":
        _warn_once(
            f"awq_inductor: torch {torch.__version__} is not the tested "
            f"{TESTED_TORCH[0]}.{TESTED_TORCH[1]}; the Inductor lowering of awq::int4_mm is "
            f"not registered (extern-kernel fallback is used). Set {ALLOW_UNTESTED_ENV}=1 to try.")
        return False
    try:
        from . import lowering

        lowering.install()
    except Exception as e:  # noqa: BLE001 - a private-API drift must not break eager use
        _warn_once(f"awq_inductor: could not register the Inductor lowering of awq::int4_mm "
                   f"({type(e).__name__}: {e}); extern-kernel fallback is used.")
        log.debug("registration failure", exc_info=True)
        return False
    return True


def register() -> bool:
    """Register the Inductor lowerings of the ``awq::int4_mm*`` and ``awq::int4_moe*`` ops;
    idempotent, thread-safe.

    Returns True when our template lowering is installed, False when the ops will be compiled as
    extern calls (untested torch, missing private API, ...), after one warning.
    """
    global _registered
    if _registered is None:
        with _lock:
            if _registered is None:
                _registered = _try_register()
    return _registered


def is_registered() -> bool:
    return bool(_registered)


# The ops register our lowering when they are first traced (awq_inductor.ops.tracing): they never
# import this package, this package hooks into them.
from ..ops.tracing import add_first_trace_hook  # noqa: E402

add_first_trace_hook(register)
