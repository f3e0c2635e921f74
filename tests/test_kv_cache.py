"""The KV cache written in place (awq_inductor.integrations.kv_cache): the same keys and values as
transformers' concatenation, after every method that reshapes a cache, and compiled generate
writing into one buffer per layer instead of a new tensor per step."""
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache, DynamicLayer  # noqa: E402

from awq_inductor import compile_for_generate, patch_transformers, testing, wait_until_compiled  # noqa: E402
from awq_inductor.integrations import kv_cache  # noqa: E402

kv_cache.install()


def _kv(b, t, seed, h=2, d=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)


def _reference(chunks):
    return torch.cat([c[0] for c in chunks], dim=2), torch.cat([c[1] for c in chunks], dim=2)


def test_updates_write_one_buffer_and_return_what_concatenation_returns():
    layer, chunks = DynamicLayer(), []
    for i, t in enumerate([5, 1, 1, 3] + [1] * 390):
        chunks.append(_kv(2, t, i))
        keys, values = layer.update(*chunks[-1])
        want_k, want_v = _reference(chunks)
        assert torch.equal(keys, want_k) and torch.equal(values, want_v), i
        assert keys is layer.keys and layer.get_seq_length() == want_k.shape[2]
        if i == 1:
            first = layer._awq_kv[0]
    # 400 tokens: the first update is transformers' own, the buffer made at the second holds
    # 6 + CHUNK tokens rounded up (320), so one growth later
    assert layer._awq_kv[0] is not first and layer.keys._base is layer._awq_kv[0]
    assert layer._awq_kv[0].shape[2] <= 400 + max(kv_cache.CHUNK, 400 // 4) + 64


def test_growth_copies_the_cache_a_few_times_not_per_token(monkeypatch):
    grows = []
    real = kv_cache._grow
    monkeypatch.setattr(kv_cache, "_grow", lambda layer, n: (grows.append(layer.keys.shape[2]), real(layer, n)))
    layer = DynamicLayer()
    layer.update(*_kv(1, 16, 0))
    for i in range(2000):
        layer.update(*_kv(1, 1, i + 1))
    assert layer.get_seq_length() == 2016
    assert 1 <= len(grows) <= 8, grows


@pytest.mark.parametrize("change", ["crop", "select", "repeat", "reorder", "reset", "deepcopy"])
def test_a_cache_reshaped_between_updates_stays_right(change):
    import copy

    layer, chunks = DynamicLayer(), []
    for i, t in enumerate([4, 1, 1, 1]):
        chunks.append(_kv(3, t, i))
        layer.update(*chunks[-1])
    k, v = _reference(chunks)
    if change == "crop":  # a view of the same buffer: the next token overwrites the cropped ones
        layer.crop(-2)
        k, v = k[:, :, :-2], v[:, :, :-2]
    elif change == "select":
        layer.batch_select_indices(torch.tensor([2, 0]))
        k, v = k[[2, 0]], v[[2, 0]]
    elif change == "repeat":
        layer.batch_repeat_interleave(2)
        k, v = k.repeat_interleave(2, dim=0), v.repeat_interleave(2, dim=0)
    elif change == "reorder":
        layer.reorder_cache(torch.tensor([1, 1, 0]))
        k, v = k[[1, 1, 0]], v[[1, 1, 0]]
    elif change == "reset":
        layer.reset()
        k, v = k[:, :, :0], v[:, :, :0]
    else:  # a prompt cache reused by copy: the copy gets its own buffer, the original is not written
        original, layer = layer, copy.deepcopy(layer)
        keep = original.keys.clone()
    b = k.shape[0]
    new = _kv(b, 1, 99) if k.shape[2] else _kv(3, 2, 99)
    keys, values = layer.update(*new)
    assert torch.equal(keys, torch.cat([k, new[0]], dim=2)) and torch.equal(values, torch.cat([v, new[1]], dim=2))
    if change == "deepcopy":
        assert torch.equal(original.keys, keep)


def test_new_states_of_another_shape_are_refused_as_concatenation_refuses_them():
    """A head dimension of 1 would broadcast into the buffer (copy_): the update concatenates
    instead, and torch.cat names the mismatch."""
    layer = DynamicLayer()
    layer.update(*_kv(1, 3, 0))
    layer.update(*_kv(1, 1, 1))
    k, v = _kv(1, 1, 2, h=1)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        layer.update(k, v)


def test_an_arm_left_by_a_step_that_raised_is_not_replayed():
    """reserve armed the layer, the step raised before its update, the cache was cropped: the next
    (eager) update writes after the cropped length, not at the armed one."""
    layer, chunks = DynamicLayer(), []
    for i, t in enumerate([3, 1, 1]):
        chunks.append(_kv(1, t, i))
        layer.update(*chunks[-1])
    assert kv_cache.reserve(layer, 1)
    layer.crop(-2)
    new = _kv(1, 1, 9)
    keys, _ = layer.update(*new)
    assert torch.equal(keys, torch.cat([_reference(chunks)[0][:, :, :3], new[0]], dim=2))


@pytest.mark.parametrize("what", ["dtype", "heads_sliced"])
def test_what_concatenation_would_promote_or_refuse_is_not_written_in_place(what):
    layer = DynamicLayer()
    layer.update(*_kv(1, 3, 0))
    layer.update(*_kv(1, 1, 1))
    k, v = _kv(1, 1, 2)
    if what == "dtype":  # torch.cat promotes to float64; copy_ into the float32 buffer would not
        keys, _ = layer.update(k.double(), v.double())
        assert keys.dtype == torch.float64 and keys.shape[2] == 5
    else:  # keys sliced to one head: torch.cat refuses 2 new heads; the buffer has 2 rows of heads
        layer.keys, layer.values = layer.keys[:, :1], layer.values[:, :1]
        with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
            layer.update(k, v)


def test_other_cache_layers_are_not_armed():
    from transformers.cache_utils import DynamicSlidingWindowLayer

    layer = DynamicSlidingWindowLayer(sliding_window=4)
    layer.update(*_kv(1, 3, 0))
    assert kv_cache.reserve(layer, 1) is False and "_awq_kv" not in layer.__dict__


def _concatenating(layer, new_tokens):
    layer._awq_armed = False
    return False


@pytest.mark.builds_behind
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_generate_writes_each_layer_in_place(tmp_path, monkeypatch, dtype):
    """Regional compile, buffers grown in steps of 8 tokens (several growths in 40 tokens): decode
    writes into each layer's buffer (the views the compiled code returns keep it as their base),
    and the tokens and the final cache equal those of the same compiled model concatenating its
    cache (transformers' update), and in fp32 those of eager generate concatenating too."""
    monkeypatch.setattr(kv_cache, "CHUNK", 8)
    monkeypatch.setattr(kv_cache, "_ALIGN", 8)
    cfg = testing.tiny_config("llama", num_hidden_layers=2)
    testing.save_quantized(testing.build_float_model(cfg), str(tmp_path), format="gemm", group_size=32)
    patch_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=dtype).eval()
    ids = torch.randint(3, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    gen = dict(attention_mask=mask, max_new_tokens=40, do_sample=False, pad_token_id=0, eos_token_id=None,
               return_dict_in_generate=True)
    torch._dynamo.reset()
    with torch.no_grad():
        with monkeypatch.context() as patch:
            patch.setattr(kv_cache, "reserve", _concatenating)
            eager = model.generate(ids, **gen)
            compile_for_generate(model)
            model.generate(ids, **gen)
            assert wait_until_compiled(timeout=120)
            want = model.generate(ids, **gen)
        model.generate(ids, **gen)
        assert wait_until_compiled(timeout=120)
        grows = []
        real = kv_cache._grow
        monkeypatch.setattr(kv_cache, "_grow", lambda layer, n: (grows.append(n), real(layer, n)))
        out = model.generate(ids, **gen)
    torch._dynamo.reset()
    assert torch.equal(out.sequences, want.sequences)
    if dtype == torch.float32:
        assert torch.equal(out.sequences, eager.sequences)
    for layer, ref in zip(out.past_key_values.layers, want.past_key_values.layers):
        kbuf, vbuf = layer._awq_kv
        assert layer.keys._base is kbuf and layer.values._base is vbuf and layer.get_seq_length() == 9 + 39
        assert "_awq_kv" not in ref.__dict__ or ref._awq_kv is None
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)
    # 10 -> 48 tokens, per layer: the first decode step's buffer (24 tokens: 10 + 8 rounded to 8),
    # grown at 25 (to 40) and at 41
    assert len(grows) >= 3 * len(out.past_key_values.layers), grows
