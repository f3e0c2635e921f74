"""A compiled forward that stays compiled across the ``generate`` calls users make (transformers 5).

Measured on the shipped tiny Llama, 2 cores, ``model.forward = torch.compile(model.forward,
backend="awq_inductor")`` and ``generate`` on left-padded batches of 1, 2, 3, 4, 2, 1, 8, 1
prompts: Dynamo's recompile limit (8) was hit on the third call, and the frame ran eager from then
on (1.9 s for the next call instead of 0.05). The guards that failed (``torch._logging.set_logs(
recompiles=True)``):

* ``len(kwargs)``: generate passes ``attention_mask`` to some forwards and not to others;
* sizes of ``input_ids`` and of the cache's keys: automatic dynamic shapes make a dim dynamic only
  after it changed once, so prefill, decode and the first longer cache each cost a graph;
* the cache's key **strides** ("expected 64, actual 832"): the compiled prefill hands the keys to
  the cache in the projection's ``transpose(1, 2)`` stride order (Inductor keeps its input's order
  for the cat), every later cat leaves them contiguous.

:func:`compile_for_generate` compiles with dynamic shapes from the first call, makes every forward
generate issues look alike (``attention_mask`` always passed, ``None`` when it masks nothing: all
ones is the same attention as no mask) and stores the first keys / values of each cache layer
contiguous, then writes later ones in place (:mod:`awq_inductor.integrations.kv_cache`). The same
sequence of calls then ends with 5 graphs and no recompile after the third call (prefill and
decode, batch 1 and more, with a padding mask): ``tests/test_generation.py``.
By default the decoder layers are compiled regionally (:mod:`awq_inductor.integrations.regional`):
compile work no longer grows with depth, and the sequence ends with 4 graphs per layer kind.
"""
from __future__ import annotations

import functools
import logging
import threading
import types
from typing import Optional

import torch
from torch import nn

from ..kernels import background
from . import kv_cache

log = logging.getLogger(__name__)

#: Backends that generate no C++: nothing of Inductor's to warm up for them.
_NO_CPP_BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition")

def _mask_or_none(mask):
    """A 2-D padding mask that masks nothing is no mask (one attention path, one graph)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask.all()):
        return None
    return mask


def normalize_generation_inputs(model: nn.Module) -> None:
    """``model.prepare_inputs_for_generation`` (run eagerly by ``generate`` before each forward)
    returns one layout of inputs: ``attention_mask`` always present, None where it masks nothing."""
    if getattr(model, "_awq_normalized_inputs", False) or not hasattr(model, "prepare_inputs_for_generation"):
        return
    inner = model.prepare_inputs_for_generation

    @functools.wraps(inner)
    def prepare(self, *args, **kwargs):
        inputs = inner(*args, **kwargs)
        inputs["attention_mask"] = _mask_or_none(inputs.get("attention_mask"))
        return inputs

    model.prepare_inputs_for_generation = types.MethodType(prepare, model)
    model._awq_normalized_inputs = True


def compile_for_generate(model: nn.Module, backend="awq_inductor", dynamic: Optional[bool] = True,
                         regional: bool = True, module_guards: bool = False, **compile_kwargs) -> nn.Module:
    """Compile ``model`` for ``generate`` with the KV cache written in place
    (:mod:`awq_inductor.integrations.kv_cache`) and :func:`normalize_generation_inputs`; returns
    ``model``.

    ``regional=True`` (default): each decoder layer kind is compiled once and its code reused for
    every layer (:mod:`awq_inductor.integrations.regional`), the outer forward stays eager; where a
    model has no repeated decoder layers, or with ``regional=False``, ``model.forward`` is compiled
    whole. With our backend each compiled graph runs eager (op by op) for its first calls, until
    its C++ library is built in the background, then compiled for good: the first tokens do not
    wait for g++; :func:`wait_until_compiled` waits for it (before timing).

    ``module_guards`` (regional only): False (default) skips Dynamo's per-call checks of the
    decoder layers' module attributes, which every layer kind pins when compiled
    (:func:`awq_inductor.integrations.regional.keep_guard`): change a layer's modules, attributes or
    hooks after this call and call :func:`uncompile` and this again. Tensors stay guarded."""
    kv_cache.install()
    normalize_generation_inputs(model)
    warn_once_on_recompile_limit()
    if backend not in _NO_CPP_BACKENDS:
        warm_inductor()
        backend = _behind_first_calls(backend)
    prebuild_native_kernels(model)
    if regional:
        from . import regional as regions

        try:
            regions.compile_regions(model, backend=backend, dynamic=dynamic, module_guards=module_guards,
                                    **compile_kwargs)
            return model
        except ValueError as e:
            log.warning("awq_inductor: compiling %s.forward whole, not per decoder layer: %s",
                        type(model).__name__, e)
    model.forward = torch.compile(model.forward, backend=backend, dynamic=dynamic, **compile_kwargs)
    return model


def _native_kernels_of(model: nn.Module) -> list:
    """The prebuild functions of the standalone C++ kernels ``model``'s compiled graphs call as ops
    (our attention where the model uses it, the bf16 head GEMV)."""
    from ..nn.head import Bf16HeadLinear
    from ..ops import attention, head_bf16
    from . import attention as attention_integration

    out = []
    if getattr(model, "dtype", None) != torch.bfloat16:  # both kernels are bf16-only
        return out
    cfg = getattr(model, "config", None)
    if getattr(cfg, "_attn_implementation", None) == attention_integration.NAME:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        out.append(functools.partial(attention.prebuild, head_dim))
    get_head = getattr(model, "get_output_embeddings", None)
    if get_head is not None and type(get_head()) is Bf16HeadLinear:
        out.append(head_bf16.prebuild)
    return out


def prebuild_native_kernels(model: nn.Module) -> Optional[threading.Thread]:
    """Build the C++ kernels the compiled graphs will call in a background thread, while Dynamo
    traces (one Python thread: the second core is idle then). Why: on a fresh machine they were
    built one after another inside the first ``generate`` (tiny Llama, 2 cores: prefill attention
    5.6 s, head GEMV 1.2 s, decode attention 1.2 s, at load average 8). A build that fails here is
    retried, and raises, at the first call, as before."""
    builds = _native_kernels_of(model)
    if not builds:
        return None

    def run():
        for build in builds:
            try:
                with background.build_step():
                    build()
            except Exception as e:  # noqa: BLE001  (the first call raises it with its context)
                log.debug("awq_inductor: prebuilding %s failed: %s", getattr(build, "func", build).__module__, e)

    return background.start("awq-prebuild", run)


def prebuild_scheme_library(scheme, x_dtype: torch.dtype) -> threading.Thread:
    """Build the library of ``scheme``'s kernels for ``x_dtype`` (our eager ops, the tuner's
    kernels, the driver the generated kernels call: ``native.driver_library``) in a background
    thread while the checkpoint loads. Why: the tuner at load asked for it first, then waited for
    its g++ run (2.8-3.4 s on the 2-core Zen 4 VM, cold: the tiny Llama demo's load went from the
    library's start to tuning); started when the CLI starts, it builds beside the quantization and
    the loading. A failure is retried, and raises, where the library is first needed."""
    from ..kernels import isa as isa_mod, native

    def run():
        with background.build_step():
            native.driver_library(scheme, isa_mod.select(), x_dtype)

    return background.start("awq-prebuild-library", run)


_warm_started: set = set()


def warm_inductor() -> None:
    """Start Inductor's vector-ISA checks (:func:`~awq_inductor.inductor.lowering.warm_compiler`)
    in a background thread, so that they overlap the loading, Dynamo's tracing and the lowering
    instead of following them: cold, they were 7.7 s of the tiny Llama demo's first token on the
    2-core Zen 4 VM, run inside the first ``generate``. Once per process; the CLI starts them
    before loading, :func:`compile_for_generate` where they have not run."""
    try:  # an optimisation only: where Inductor's internals moved, compiling goes on without it
        from ..inductor import lowering

        if "checks" not in _warm_started:
            _warm_started.add("checks")
            lowering.prepare_vec_isa_checks()  # before the thread: Inductor's own check waits for it
            background.start("awq-warm-inductor", lowering.warm_compiler)
    except Exception as e:  # noqa: BLE001
        log.debug("awq_inductor: no Inductor warm-up: %s", e)


def _behind_first_calls(backend):
    """Our backend in the form that builds each graph's C++ library behind its first calls (they
    run eager until it is built: ``awq_inductor_backend_behind``); any other backend as it is."""
    try:
        from ..inductor.backend import BACKEND_NAME, awq_inductor_backend, awq_inductor_backend_behind
    except Exception as e:  # noqa: BLE001  (Inductor's internals moved: the backend builds as it can)
        log.debug("awq_inductor: no build behind the first calls: %s", e)
        return backend
    if backend not in (BACKEND_NAME, awq_inductor_backend):
        return backend
    log.info("awq_inductor: each compiled graph runs eager for its first calls, until its C++ is built "
             "in the background (wait_until_compiled() waits for it)")
    return awq_inductor_backend_behind


def wait_until_compiled(timeout: Optional[float] = None) -> bool:
    """Wait until the graphs of models compiled by :func:`compile_for_generate` run compiled code:
    their C++ libraries build in the background while their first calls run eager. Call it before
    timing compiled code. True when nothing is left building."""
    try:
        from ..inductor import lowering
    except Exception:  # noqa: BLE001  (no lowering: nothing builds behind)
        return True
    return lowering.wait_for_libraries(timeout)


def uncompile(model: nn.Module) -> nn.Module:
    """Undo :func:`compile_for_generate` (regional or whole): ``model`` runs eager again."""
    from . import regional as regions

    if not regions.restore(model) and hasattr(model.forward, "_torchdynamo_orig_callable"):
        model.forward = model.forward._torchdynamo_orig_callable
    return model


class _RecompileLimitAlarm(logging.Filter):
    """Dynamo says in one WARNING line that it hit its recompile limit and then runs the frame
    eager for the rest of the process; this repeats it once per function as our own warning that
    names the cost and the guard that failed (the record's arguments: limit, value, function,
    last reason)."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith("torch._dynamo hit config.") and isinstance(record.args, tuple) and len(record.args) >= 4:
            limit, value, function, reason = record.args[:4]
            if function not in self.seen:
                self.seen.add(function)
                log.warning("awq_inductor: compiled code ABANDONED for %s: Dynamo hit %s=%s, so this "
                            "function now runs eager for the rest of the process (decode several times "
                            "slower). Cause, the guard that failed last: %s", function, limit, value, reason)
        return True


_ALARM = _RecompileLimitAlarm()


def warn_once_on_recompile_limit() -> None:
    """Install :class:`_RecompileLimitAlarm` on Dynamo's logger (idempotent)."""
    dynamo_log = logging.getLogger("torch._dynamo.convert_frame")
    if _ALARM not in dynamo_log.filters:
        dynamo_log.addFilter(_ALARM)
