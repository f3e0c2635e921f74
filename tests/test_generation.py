"""compile_for_generate: a compiled model stays compiled across varied generate calls (batch sizes,
prompt lengths, with and without padding), ends with few graphs and generates what eager does."""
from __future__ import annotations

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


def test_varied_generate_calls_stay_compiled(tmp_path, caplog):
    cfg = testing.tiny_config("llama", num_hidden_layers=2)
    testing.save_quantized(testing.build_float_model(cfg), str(tmp_path / "ckpt"), format="gemm", group_size=32)
    patch_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32).eval()
    eager_forward = model.forward
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compile_for_generate(model)
    compiled_forward = model.forward
    calls = [(1, 12), (2, 17), (3, 9), (1, 5), (4, 21), (2, 8), (1, 30), (8, 13)]
    with caplog.at_level(logging.WARNING, logger="torch._dynamo"), torch.no_grad():
        for i, (b, n) in enumerate(calls):
            ids, mask = _batch(b, n, seed=i)
            kw = {} if b == 1 and i % 2 else {"attention_mask": mask}  # batch-1 calls with and without a mask
            model.forward = compiled_forward
            got = model.generate(ids, **kw, **GEN)
            model.forward = eager_forward
            want = model.generate(ids, **kw, **GEN)
            assert torch.equal(got, want), (i, b, n)
    assert not [r for r in caplog.records if "recompile_limit" in r.getMessage()]
    # prefill and decode x batch 1 and more x padding mask or none: at most 6 graphs for any sequence
    # (plain torch.compile(model.forward) hits the limit of 8 on this sequence: checked when written)
    assert 2 <= counters["stats"]["unique_graphs"] <= 6, counters["stats"]
    torch._dynamo.reset()
