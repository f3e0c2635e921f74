"""Regional compilation: Dynamo and Inductor compile a decoder layer once per layer kind, and every
layer of that kind runs the same compiled code (the model's outer forward, embedding to logits,
stays eager).

Why: compiling ``model.forward`` whole unrolls every layer into one graph, so Dynamo tracing,
Inductor lowering and the C++ build grow with depth (tiny AWQ Llama, 2 cores, fresh caches: first
``generate`` 47.8 s at 4 layers, 119.6 s at 32). Compiling each layer with ``layer.compile()`` is
not enough in transformers 5: the attention calls ``cache.update(k, v, self.layer_idx)``, and
``Cache.update`` indexes ``self.layers[layer_idx]`` inside the traced code, so Dynamo guards on
the index and compiles one graph per layer (measured: 8 graphs for 4 layers, prefill and decode),
hitting its recompile limit (8) at 4 layers. Here each layer gets a :class:`LayerCacheView`, made
outside the compiled code, that already holds its own cache layer and ignores the index: the int
is then passed through untouched and never guarded on (checked: 1 graph for 5 instances).

One compiled function per layer kind (the layer's module tree and its modules' attribute values:
DeepSeek-V3's dense first layers and its MoE layers are two kinds, so are Gemma's sliding and full
attention layers), each with an isolated recompile budget (``torch.compile``'s
``isolate_recompiles``), so two kinds never share Dynamo's limit, and without Dynamo's per-call
guards on those attribute values, which the kind already pins (:func:`keep_guard`).
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import kv_cache

log = logging.getLogger(__name__)

# keyword names under which transformers passes the cache to a decoder layer (5.24: "cache";
# earlier 5.x and models not yet migrated: "past_key_values")
CACHE_KWARGS = ("cache", "past_key_values")


class LayerCacheView:
    """One decoder layer's view of a transformers ``Cache``: ``update(keys, values, layer_idx, ...)``
    goes to that layer's cache layer, resolved before the compiled code runs, and the index is not
    read (see the module docstring). Everything else is the cache's own attribute or method."""

    def __init__(self, cache, layer):
        self._cache = cache
        self._layer = layer

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self._layer.update(key_states, value_states, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._cache, name)


def _cache_layer(cache, index: int):
    """``cache.layers[index]``, created as ``Cache.update`` would; None where a view would change
    what ``update`` does (offloading caches, caches without per-layer objects)."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or getattr(cache, "offloading", False):
        return None
    replicate = getattr(cache, "layer_class_to_replicate", None)
    while replicate is not None and len(layers) <= index:
        layers.append(replicate())
    return layers[index] if index < len(layers) else None


def decoder_layers(model: nn.Module) -> List[nn.ModuleList]:
    """The ``nn.ModuleList``s of repeated decoder layers: those whose every child is of a class
    transformers names in ``_no_split_modules`` (the unit it never splits across devices)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and \
                all(type(child).__name__ in names for child in module):
            found.append(module)
    return found


def layer_index(layer: nn.Module, position: int) -> int:
    """The ``layer_idx`` the layer's attention passes to the cache: its position in the list, as
    transformers builds them; refused where a submodule says otherwise (the view would route that
    layer's keys and values to another layer)."""
    seen = {getattr(m, "layer_idx") for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)}
    if seen and seen != {position}:
        raise ValueError(f"regional compile: layer {position} ({type(layer).__name__}) has layer_idx "
                         f"{sorted(seen)}, expected {position}")
    return position


# A module attribute the compiled step does not bake in: the layer's own index, which only reaches
# the cache view, and that ignores it (module docstring)
_NOT_BAKED = frozenset({"layer_idx"})
_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules"})
_CONSTANTS = (bool, int, float, str, type(None))


def _baked_value(value) -> object:
    """The part of one attribute value that compiled code depends on, hashable: constants and tuples
    of them as they are, a tensor attribute by its metadata, hook tables by their size, a config by
    its attention implementation, any other object by its class."""
    if isinstance(value, _CONSTANTS):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _CONSTANTS) for v in value):
        return tuple(value)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape))
    if isinstance(value, dict):
        return ("table", len(value))
    return (type(value).__module__, type(value).__qualname__, getattr(value, "_attn_implementation", None))


def baked_attributes(module: nn.Module) -> Tuple:
    """What compiled code takes from ``module``'s own attributes (its class, its non-tensor
    attributes, whether it has hooks), as a hashable key."""
    cls = type(module)
    return (cls.__module__, cls.__qualname__, tuple(
        (key, _baked_value(value)) for key, value in sorted(vars(module).items())
        if key not in _NOT_BAKED and key not in _MODULE_TABLES))


def layer_kind(layer: nn.Module) -> Tuple:
    """What makes two layers compile to different code: per module of the tree, its class and the
    attribute values its compiled code bakes in (:func:`baked_attributes`). Two layers of one kind
    differ only in their tensors (and ``layer_idx``), which the compiled step's guards check on
    every call (:func:`keep_guard`)."""
    return tuple((name, baked_attributes(m)) for name, m in layer.named_modules())


def keep_guard(entry) -> bool:
    """Dynamo's guard filter for a layer step: every guard but those on the layer's nn-module
    attributes and structure, whose values :func:`layer_kind` already pins for every layer of the
    kind; tensor guards are kept everywhere (weights, inputs, cache: dtype, shape, strides). Why:
    the guards run before each layer call, on Python objects the weight stream has just evicted
    from the caches: 200 us of each 2.3 ms layer of a Llama-7B-shaped decode step (Zen 4, 2
    threads, profiler's "TorchDynamo Cache Lookup"); 120-130 us without the module guards. A guard
    on an attribute the kind leaves out (``layer_idx``) is kept: where a layer's code branches on
    it, every layer still gets the code traced for its own value."""
    source = entry.orig_guard.source
    return (entry.guard_type == "TENSOR_MATCH" or source is None or not source.is_unspecialized_nn_module()
            or entry.name.rsplit(".", 1)[-1] in _NOT_BAKED)


def _guard_filter(entries) -> list:
    return [keep_guard(entry) for entry in entries]


def _run_layer(forward, args, kwargs):
    return forward(*args, **kwargs)


# Graphs one layer kind may need: prefill (empty cache) and decode x padding mask or none x batch 1
# or more (Dynamo specialises sizes 0 and 1), and the 1-token prompt's prefill and first decode
# (cache length 1) per batch class: 12; Dynamo's default limit (8) would be hit by a server that
# sees them all (measured: the 12-call sequence of tests/test_generation.py reached 8).
RECOMPILE_LIMIT = 16


def _compiled_step(compile_kwargs: dict, module_guards: bool) -> Callable:
    # isolate_recompiles: every call of torch.compile gets its own Dynamo cache on the shared code
    # object, so each layer kind has the whole recompile budget
    compile_kwargs = {"recompile_limit": RECOMPILE_LIMIT, **compile_kwargs}
    if not module_guards:
        compile_kwargs["options"] = {"guard_filter_fn": _guard_filter, **(compile_kwargs.get("options") or {})}
    return torch.compile(_run_layer, isolate_recompiles=True, **compile_kwargs)


def trace_settings(forward: Callable) -> Callable:
    """``forward`` with two Dynamo settings patched while it runs (both are read when a trace
    starts; the model's forward wraps every layer call):

    * duck shaping off. Why: it gives equal sizes one symbol, so a batch of 2 shared the symbol of
      the 2 key-value heads, the head count's reshape pinned it to 2 and batch 3 compiled another
      graph (measured on the 2-head tiny Llama: 5 graphs for the sequence that needs 4 without it);
    * ``specialize_float``: a layer's float attributes (RMSNorm's ``variance_epsilon``, the
      attention's ``scaling``) are constants, not symbolic graph inputs. Why: Dynamo traced them
      as symbols, our attention op takes ``scaling`` as a Python float, Inductor's tensorify pass
      could not turn it into a tensor and restarted Dynamo's analysis: every prefill graph was
      traced twice (tiny Llama, warm caches: 0.6 s of the first ``generate``; ``TORCH_LOGS=dynamo``
      "Restarting analysis due to _tensorify_python_scalars"). Every layer of a kind holds the
      same values (a per-layer value would be a guard failure, named by the recompile alarm)."""
    if getattr(forward, "_awq_trace_settings", False):
        return forward
    shapes, dynamo = torch.fx.experimental._config, torch._dynamo.config

    @functools.wraps(forward)
    def run(*args, **kwargs):
        # set and restored by hand: the two ``config.patch`` context managers cost 55 us a call (13 us
        # this way; every decode step passes here, 2 cores, Zen 4)
        duck, floats = shapes.use_duck_shape, dynamo.specialize_float
        shapes.use_duck_shape, dynamo.specialize_float = False, True
        try:
            return forward(*args, **kwargs)
        finally:
            shapes.use_duck_shape, dynamo.specialize_float = duck, floats

    run._awq_trace_settings = True
    return run


def _new_tokens(args, kwargs) -> int:
    """The tokens this layer call adds to the cache: the hidden states' rows ([batch, tokens, width]
    in every transformers decoder layer); 0 (reserve nothing) where the call does not say."""
    hidden = args[0] if args else kwargs.get("hidden_states")
    return hidden.shape[1] if isinstance(hidden, torch.Tensor) and hidden.dim() == 3 else 0


def _regional_forward(original: Callable, step: Callable, index: int) -> Callable:
    def forward(*args, **kwargs):
        armed = None
        for key in CACHE_KWARGS:
            cache = kwargs.get(key)
            if cache is not None and not isinstance(cache, LayerCacheView):
                layer = _cache_layer(cache, index)
                if layer is not None:
                    if kv_cache.reserve(layer, _new_tokens(args, kwargs)):
                        armed = layer
                    kwargs[key] = LayerCacheView(cache, layer)
        if armed is None:
            return step(original, args, kwargs)
        try:
            return step(original, args, kwargs)
        finally:
            kv_cache.disarm(armed)  # (the update consumed the arm, unless the step raised before it)

    forward._awq_regional = True
    forward._awq_original = original
    return forward


def compile_regions(model: nn.Module, backend="awq_inductor", dynamic: Optional[bool] = True,
                    module_guards: bool = False, **compile_kwargs) -> Dict[Tuple, List[int]]:
    """Compile every decoder layer of ``model`` regionally (in place: ``layer.forward`` becomes the
    compiled step of its kind). Returns {layer kind: layer positions}. Raises ``ValueError`` when
    the model has no repeated decoder layers (compile ``model.forward`` instead).

    ``module_guards=False`` (default): the steps do not re-check the layers' module attributes on
    each call (:func:`keep_guard`), so a module attribute, a submodule or a hook changed after this
    call is not seen until ``compile_regions`` runs again (``uncompile`` and compile again); tensors
    (weights, inputs, cache) stay guarded. ``True``: Dynamo's full guards."""
    lists = decoder_layers(model)
    if not lists:
        raise ValueError(f"regional compile: {type(model).__name__} has no nn.ModuleList of the layer "
                         f"classes in its _no_split_modules {getattr(model, '_no_split_modules', None)}")
    kwargs = dict(backend=backend, dynamic=dynamic, **compile_kwargs)
    steps: Dict[Tuple, Callable] = {}
    kinds: Dict[Tuple, List[int]] = {}
    for layers in lists:
        for position, layer in enumerate(layers):
            if getattr(layer.forward, "_awq_regional", False):
                continue
            kind = layer_kind(layer)
            if kind not in steps:
                steps[kind] = _compiled_step(kwargs, module_guards)
            step = steps[kind]
            layer.forward = _regional_forward(layer.forward, step, layer_index(layer, position))
            kinds.setdefault(kind, []).append(position)
    model.forward = trace_settings(model.forward)
    log.info("regional compile: %d layers, %d kinds", sum(map(len, kinds.values())), len(kinds))
    return kinds


def restore(model: nn.Module) -> int:
    """Undo :func:`compile_regions`: every layer and the model run their original Python forward
    again (the compiled code stays cached for a later ``compile_regions``). Returns the number of
    layers restored."""
    n = 0
    for layers in decoder_layers(model):
        for layer in layers:
            original = getattr(layer.forward, "_awq_original", None)
            if original is not None:
                _put_back(layer, original)
                n += 1
    if getattr(model.forward, "_awq_trace_settings", False):
        _put_back(model, model.forward.__wrapped__)
    return n


def _put_back(module: nn.Module, forward: Callable) -> None:
    """``module.forward = forward``, or no instance attribute at all where it is the class's method."""
    if getattr(forward, "__func__", None) is getattr(type(module), "forward", None):
        module.__dict__.pop("forward", None)
    else:
        module.forward = forward
