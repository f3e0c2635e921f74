"""Streamed weights on transparent huge pages (kernels.hugepages)."""
from __future__ import annotations

import pytest
import torch

from awq_inductor import config, testing
from awq_inductor.kernels import hugepages

needs_thp = pytest.mark.skipif(not hugepages.available(), reason="transparent huge pages are off here")


@needs_thp
def test_on_huge_pages_copies_values_onto_an_aligned_mapping():
    t = torch.randint(0, 255, (3 << 20,), dtype=torch.uint8).view(torch.int32).view(-1, 1024)
    h = hugepages.on_huge_pages(t)
    assert h is not t and h.data_ptr() % hugepages.HUGE_PAGE == 0
    assert h.dtype == t.dtype and h.shape == t.shape and torch.equal(h, t)
    assert hugepages.on_huge_pages(h) is h  # already there


def test_small_tensors_and_the_switch_leave_tensors_where_they_are(monkeypatch):
    small = torch.zeros(hugepages.MIN_BYTES // 4 - 1, dtype=torch.float32)
    assert hugepages.on_huge_pages(small) is small
    big = torch.zeros(hugepages.MIN_BYTES, dtype=torch.uint8)
    monkeypatch.setattr(config, "huge_pages", False)
    assert hugepages.on_huge_pages(big) is big
    copy = hugepages.copy_on_huge_pages(big)
    assert copy is not big and copy.data_ptr() != big.data_ptr() and torch.equal(copy, big)


@needs_thp
def test_a_converted_model_streams_its_weights_from_huge_pages_with_the_same_logits(tmp_path):
    import transformers

    from awq_inductor import patch_transformers

    cfg = testing.tiny_config("llama", hidden_size=512, intermediate_size=4096, num_hidden_layers=1,
                              vocab_size=2048, tie_word_embeddings=True)
    testing.save_quantized(testing.build_float_model(cfg), tmp_path, format="gemm", group_size=128)
    patch_transformers()
    with config.patch(huge_pages=False):
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    gate_up = model.model.layers[0].mlp.gate_up_proj.qweight  # 2 x 4096 x 512 int4: 2 MiB
    assert hugepages.is_huge(gate_up) and gate_up.data_ptr() % hugepages.HUGE_PAGE == 0
    assert not hugepages.is_huge(plain.model.layers[0].mlp.gate_up_proj.qweight)
    head = model.get_output_embeddings().weight  # 2048 x 512 bf16: 2 MiB, tied to the embedding
    assert hugepages.is_huge(head)
    assert head is model.get_input_embeddings().weight  # tied stays tied
    ids = torch.randint(0, 2048, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, plain(ids).logits)


def test_the_tuning_cache_key_says_whether_weights_sit_on_huge_pages():
    from awq_inductor.kernels import cache_key

    assert cache_key.machine_key(2, True) != cache_key.machine_key(2, False)


@needs_thp
def test_a_deep_copy_is_not_taken_for_huge_pages_and_convert_places_it_again(tmp_path):
    """copy.deepcopy copies a tensor's Python attributes: the mark must not vouch for the copy's
    new small-page memory (a deep copy converted with lm_head="int8" once ran its whole decoder on
    4 KiB pages)."""
    import copy

    import transformers

    from awq_inductor import convert, patch_transformers

    cfg = testing.tiny_config("llama", hidden_size=512, intermediate_size=4096, num_hidden_layers=1,
                              vocab_size=4096)
    testing.save_quantized(testing.build_float_model(cfg), tmp_path, format="gemm", group_size=128)
    patch_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    qw = model.model.layers[0].mlp.gate_up_proj.qweight
    assert hugepages.is_huge(qw)
    assert not hugepages.is_huge(qw.clone())
    twin = copy.deepcopy(model)
    tqw = twin.model.layers[0].mlp.gate_up_proj.qweight
    assert tqw.data_ptr() != qw.data_ptr() and not hugepages.is_huge(tqw)
    convert(twin, lm_head="int8")
    tqw = twin.model.layers[0].mlp.gate_up_proj.qweight
    assert hugepages.is_huge(tqw) and tqw.data_ptr() % hugepages.HUGE_PAGE == 0
    assert hugepages.is_huge(twin.get_output_embeddings().weight_int8)  # 4096 x 512 int8: 2 MiB
    ids = torch.randint(0, 4096, (1, 8))
    with torch.no_grad():
        assert torch.equal(twin.model(ids).last_hidden_state, model.model(ids).last_hidden_state)
