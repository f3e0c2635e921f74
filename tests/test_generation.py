"""compile_for_generate: a compiled model stays compiled across varied generate calls (batch sizes,
prompt lengths, with and without padding), ends with few graphs and generates what eager does."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch
import torch._dynamo

transformers = pytest.importorskip("transformers")

from awq_inductor import compile_for_generate, patch_transformers, testing  # noqa: E402

GEN = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)


def _batch(b: int, longest: int, seed: int):
    """``b`` left-padded prompts of lengths longest, longest - 3, ... (pad id 0, mask 0 there)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (b, longest), generator=g)
    mask = torch.ones(b, longest, dtype=torch.long)
    for i in range(b):
        pad = min(3 * i, longest - 1)
        ids[i, :pad], mask[i, :pad] = 0, 0
    return ids, mask


def _tiny_model(tmp_path, layers: int = 2):
    cfg = testing.tiny_config("llama", num_hidden_layers=layers)
    path = str(tmp_path / f"ckpt{layers}")
    testing.save_quantized(testing.build_float_model(cfg), path, format="gemm", group_size=32)
    patch_transformers()
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _generate_alike(model, calls, compiled_call, eager_call):
    """Each call of ``calls`` (batch, longest prompt) through both callables: same tokens. The
    compiled call is made twice: a graph it compiles runs eager until its C++ is built, the second
    runs the compiled code (no call run eager)."""
    from awq_inductor import wait_until_compiled
    from awq_inductor.inductor import graph_library

    for i, (b, n) in enumerate(calls):
        ids, mask = _batch(b, n, seed=i)
        kw = {} if b == 1 and i % 2 else {"attention_mask": mask}  # batch-1 calls with and without a mask
        with compiled_call():
            model.generate(ids, **kw, **GEN)
            assert wait_until_compiled(timeout=120)
            eager_calls = graph_library.eager_calls[0]
            got = model.generate(ids, **kw, **GEN)
            assert graph_library.eager_calls[0] == eager_calls, (i, b, n)
        with eager_call():
            want = model.generate(ids, **kw, **GEN)
        assert torch.equal(got, want), (i, b, n)


class _Forward:
    """Context managers that put one of two ``model.forward`` in place (whole-model compile)."""

    def __init__(self, model, forward):
        self.model, self.forward = model, forward

    def __call__(self):
        model, forward = self.model, self.forward

        class Use:
            def __enter__(self):
                model.forward = forward

            def __exit__(self, *exc):
                return False

        return Use()


CALLS = [(1, 12), (2, 17), (3, 9), (1, 5), (4, 21), (2, 8), (1, 30), (8, 13)]


@pytest.mark.builds_behind
def test_varied_generate_calls_stay_compiled_whole_model(tmp_path, caplog):
    model = _tiny_model(tmp_path, layers=1)  # the guards are those of any depth; a whole-model compile grows with it
    eager_forward = model.forward
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compile_for_generate(model, regional=False)
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"), torch.no_grad():
        _generate_alike(model, CALLS, _Forward(model, model.forward), _Forward(model, eager_forward))
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]
    # prefill and decode x batch 1 and more x padding mask or none: at most 6 graphs for any sequence
    # (plain torch.compile(model.forward) hits the limit of 8 on this sequence: checked when written)
    assert 2 <= counters["stats"]["unique_graphs"] <= 6, counters["stats"]
    torch._dynamo.reset()


@pytest.mark.builds_behind
def test_varied_generate_calls_stay_compiled_regional(tmp_path, caplog):
    """The default, one compiled decoder layer for all: the same tokens as eager over calls of batch
    1-16, prompt lengths 1-200, with and without padding; 4 graphs for the main sequence (prefill and
    decode, batch 1 without a mask and more rows with one); no recompile limit over the rest."""
    model = _tiny_model(tmp_path)
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compile_for_generate(model)
    assert all(getattr(layer.forward, "_awq_regional", False) for layer in model.model.layers)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        _generate_alike(model, CALLS, contextlib.nullcontext, _dynamo_disabled)
        assert counters["stats"]["unique_graphs"] == 4, counters["stats"]
        _generate_alike(model, [(16, 40), (5, 200), (1, 1), (3, 1), (2, 2)], contextlib.nullcontext,
                        _dynamo_disabled)
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()], caplog.text
    assert counters["stats"]["unique_graphs"] <= 16, counters["stats"]
    torch._dynamo.reset()


def _dynamo_disabled():
    """Every compiled function runs its original Python code, cached graphs included."""
    return torch.compiler.set_stance("force_eager")


def _graphs_and_compiles(tmp_path, layers: int):
    """(Dynamo graphs, AOT-compiled graphs, int4 ops lowered by Inductor) over two generate calls,
    with Inductor's FX graph cache off (every graph is lowered, none is read back)."""
    from unittest import mock

    from torch._dynamo.utils import counters

    from awq_inductor.inductor import lowering

    model = _tiny_model(tmp_path, layers)
    torch._dynamo.reset()
    counters.clear()
    compile_for_generate(model)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False), \
            mock.patch.object(lowering, "lower", wraps=lowering.lower) as lowered:
        for i, (b, n) in enumerate([(1, 9), (3, 14)]):
            ids, mask = _batch(b, n, seed=i)
            model.generate(ids, attention_mask=mask, **GEN)
    work = (counters["stats"]["unique_graphs"], counters["aot_autograd"]["total"], lowered.call_count)
    torch._dynamo.reset()
    return work


def test_compile_work_does_not_grow_with_layers(tmp_path):
    """Regional compile: 2 and 8 layers trace, lower and compile the same number of graphs."""
    two, eight = _graphs_and_compiles(tmp_path, 2), _graphs_and_compiles(tmp_path, 8)
    assert two[0] >= 2 and two[2] > 0 and two == eight, (two, eight)


def test_recompile_limit_is_reported_once_with_its_cause(caplog):
    """When Dynamo gives up on a function, our own warning names it and the failed guard, once."""
    from awq_inductor.integrations.generation import warn_once_on_recompile_limit

    warn_once_on_recompile_limit()
    warn_once_on_recompile_limit()  # idempotent: still one report

    def storm_victim(x):
        return x * 2

    torch._dynamo.reset()
    fn = torch.compile(storm_victim, backend="eager", dynamic=False, recompile_limit=2)
    with caplog.at_level(logging.WARNING, logger="awq_inductor"):
        for n in range(1, 7):
            assert torch.equal(fn(torch.ones(n)), torch.full((n,), 2.0))
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("awq_inductor")]
    assert len(ours) == 1, ours
    assert "storm_victim" in ours[0] and "ABANDONED" in ours[0] and "size mismatch" in ours[0], ours[0]
    torch._dynamo.reset()


def test_trace_settings_hold_during_the_call_and_are_restored():
    """The regional model's forward traces with duck shaping off and floats specialised, and gives
    both settings back afterwards, also when the forward raises."""
    from awq_inductor.integrations.regional import trace_settings

    shapes, dynamo = torch.fx.experimental._config, torch._dynamo.config
    before = (shapes.use_duck_shape, dynamo.specialize_float)
    seen = []

    def forward(fail=False):
        seen.append((shapes.use_duck_shape, dynamo.specialize_float))
        if fail:
            raise RuntimeError("boom")
        return 7

    run = trace_settings(forward)
    assert trace_settings(run) is run
    assert run() == 7
    with pytest.raises(RuntimeError, match="boom"):
        run(fail=True)
    assert seen == [(False, True), (False, True)]
    assert (shapes.use_duck_shape, dynamo.specialize_float) == before


def test_layer_kind_pins_what_the_compiled_step_bakes_in(tmp_path):
    """Layers of one kind differ only in tensors and layer_idx; an attribute value, a hook or a
    submodule class that differs makes another kind (the steps skip Dynamo's module guards)."""
    from awq_inductor.integrations.regional import layer_kind

    model = _tiny_model(tmp_path, layers=3)
    first, second, third = model.model.layers
    assert layer_kind(first) == layer_kind(second) == layer_kind(third)
    second.input_layernorm.variance_epsilon = 1e-3
    assert layer_kind(second) != layer_kind(first)
    third.mlp.register_forward_hook(lambda *args: None)
    assert layer_kind(third) != layer_kind(first)
    before = layer_kind(first)
    first.self_attn.layer_idx = 7  # only the cache view receives it, and ignores it
    assert layer_kind(first) == before


def _strided_like(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values with stride 2: compiled code that assumed a contiguous tensor would read the
    zeros in between."""
    return torch.stack([t, torch.zeros_like(t)], dim=-1).reshape(*t.shape[:-1], -1)[..., ::2]


def test_regional_steps_keep_tensor_guards_and_module_guards_on_request(tmp_path):
    """Default steps: a layer weight with new strides recompiles (the tensor guards stay), so
    compiled equals eager. ``module_guards=True``: an attribute changed after compiling is seen."""
    from awq_inductor.integrations.generation import uncompile

    model = _tiny_model(tmp_path)
    ids, mask = _batch(2, 9, seed=3)
    with torch.no_grad():
        torch._dynamo.reset()
        compile_for_generate(model)
        model.generate(ids, attention_mask=mask, **GEN)
        norm = model.model.layers[1].post_attention_layernorm
        norm.weight.data = _strided_like(norm.weight.data)
        got = model.generate(ids, attention_mask=mask, **GEN)
        with _dynamo_disabled():
            want = model.generate(ids, attention_mask=mask, **GEN)
        assert torch.equal(got, want)

        uncompile(model)
        torch._dynamo.reset()
        compile_for_generate(model, module_guards=True)
        logits = model(ids, attention_mask=mask).logits
        for layer in model.model.layers:
            layer.input_layernorm.variance_epsilon = 0.5
        changed = model(ids, attention_mask=mask).logits
        with _dynamo_disabled():
            want = model(ids, attention_mask=mask).logits
        assert not torch.allclose(changed, logits) and torch.allclose(changed, want, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


def test_the_layer_step_guard_filter_drops_module_attributes_only():
    """Module attribute guards go; tensor guards, guards outside the modules and a guard on
    ``layer_idx`` (not part of the kind) stay."""
    from types import SimpleNamespace

    from awq_inductor.integrations.regional import keep_guard

    def entry(guard_type, in_module, name):
        source = None if in_module is None else SimpleNamespace(is_unspecialized_nn_module=lambda: in_module)
        return SimpleNamespace(guard_type=guard_type, name=name, orig_guard=SimpleNamespace(source=source))

    layer = "L['forward'].__self__"
    assert not keep_guard(entry("EQUALS_MATCH", True, f"{layer}._modules['self_attn'].scaling"))
    assert not keep_guard(entry("ID_MATCH", True, f"{layer}._modules['mlp']"))
    assert keep_guard(entry("EQUALS_MATCH", True, f"{layer}._modules['self_attn'].layer_idx"))
    assert keep_guard(entry("TENSOR_MATCH", True, f"{layer}._modules['o_proj']._buffers['qweight']"))
    assert keep_guard(entry("TENSOR_MATCH", False, "L['args'][0]"))
    assert keep_guard(entry("EQUALS_MATCH", False, "L['kwargs']['use_cache']"))
    assert keep_guard(entry("GLOBAL_STATE", None, ""))
