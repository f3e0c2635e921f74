"""Batched decode: each row of a left-padded batch decodes as that prompt alone (the trained tiny
Llama as an AWQ checkpoint on our ops): greedy tokens identical in fp32, logits within bf16
rounding in bf16, eager and compiled."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from awq_inductor import compile_for_generate, patch_transformers, tiny_model  # noqa: E402

NEW = 8
LENGTHS = (19, 12, 7, 3)  # the first row is unpadded, the others left-padded by 7, 12, 16 tokens


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_awq"))
    tiny_model.save_quantized_checkpoint(path, group_size=64)
    return path


def _load(path, dtype, act_quant=None):
    try:
        patch_transformers(act_quant=act_quant)
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    finally:
        patch_transformers()


def _prompts():
    """Prompts of LENGTHS from different places of the held-out text, and their left-padded batch."""
    ids = tiny_model.heldout_ids(400)[0]
    prompts = [ids[40 * i:40 * i + n] for i, n in enumerate(LENGTHS)]
    T = max(LENGTHS)
    batch = torch.zeros(len(prompts), T, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        batch[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return prompts, batch, mask


def _generate(model, ids, mask=None):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1).float()  # [B, NEW], [B, NEW, V]


@pytest.mark.parametrize("act_quant", [None, "int8"])
def test_greedy_tokens_identical_fp32(ckpt, act_quant):
    model = _load(ckpt, torch.float32, act_quant)
    prompts, batch, mask = _prompts()
    with torch.no_grad():
        tokens, _ = _generate(model, batch, mask)
        for i, p in enumerate(prompts):
            alone, _ = _generate(model, p[None])
            assert torch.equal(tokens[i], alone[0]), (i, tokens[i].tolist(), alone[0].tolist())


def _check_rows_bf16(model):
    """Each row's logits at every step whose context matches the row alone (same earlier tokens)
    within 4 bf16 ulps of the largest logit: the batch and the row alone take different kernel
    paths (M = 4 against M = 1 rows, F.linear against our GEMV head), each rounding to bf16 after
    every op."""
    prompts, batch, mask = _prompts()
    tokens, logits = _generate(model, batch, mask)
    compared = 0
    for i, p in enumerate(prompts):
        alone_tokens, alone_logits = _generate(model, p[None])
        steps = NEW
        diff = (tokens[i] != alone_tokens[0]).nonzero()
        if len(diff):
            steps = int(diff[0]) + 1  # the first differing token's logits still share the context
        tol = 4 * 2.0 ** -8 * float(alone_logits[0, :steps].abs().max())
        err = float((logits[i, :steps] - alone_logits[0, :steps]).abs().max())
        assert err <= tol, (i, steps, err, tol)
        compared += steps
    assert compared >= len(prompts) * NEW // 2  # most steps compared: near-ties are rare in the trained model


def test_rows_match_alone_bf16_eager(ckpt):
    with torch.no_grad():
        _check_rows_bf16(_load(ckpt, torch.bfloat16))


def test_rows_match_alone_bf16_compiled(ckpt):
    model = compile_for_generate(_load(ckpt, torch.bfloat16))
    with torch.no_grad():
        _check_rows_bf16(model)
