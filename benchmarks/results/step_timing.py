"""Shared by the decode-step harnesses here (decode_step_ab, decode_step_by_context, regional_guards_ab,
regional_vs_whole_ab): the AWQ Llama-7B-shaped model they load, a model warmed up compiled, one paired timing of
its decode step (or its per-token time stamps), and rounds of variants in alternating order (one process, interleaved)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, for llama_shape

import torch  # noqa: E402
import transformers  # noqa: E402

from awq_inductor import patch_transformers, testing, wait_until_compiled  # noqa: E402
from llama_shape import add_shape_args, llama_config  # noqa: E402

GEN = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
STEPS = 32


def llama7b_shaped(layers: int = 4, threads: int = 2) -> transformers.PreTrainedModel:
    """``layers`` Llama-7B-shaped layers (AWQ gemm G = 128, random weights, vocab 32000), loaded in bf16 through
    ``patch_transformers`` (so converted and tuned as a user's model)."""
    torch.set_num_threads(threads)
    p = argparse.ArgumentParser()
    add_shape_args(p, layers=layers)
    with tempfile.TemporaryDirectory() as d:
        testing.save_quantized(testing.build_float_model(llama_config(p.parse_args([]))), d, format="gemm",
                               group_size=128)
        patch_transformers()
        return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()


def prompt(n: int, vocab: int = 32000) -> torch.Tensor:
    return torch.randint(1, vocab, (1, n), generator=torch.Generator().manual_seed(n))


def warm(model, ids) -> None:
    """Both graphs compiled and their C++ built (a graph runs eager until then)."""
    with torch.no_grad():
        model.generate(ids, max_new_tokens=8, **GEN)
        wait_until_compiled()
        model.generate(ids, max_new_tokens=8, **GEN)


def step_ms(model, ids, steps: int = STEPS):
    """(prefill s, decode ms per step): a 1-token generate and a ``steps + 1``-token one back to back; decode is
    their difference over ``steps``."""
    with torch.no_grad():
        t0 = time.perf_counter(); model.generate(ids, max_new_tokens=1, **GEN); t1 = time.perf_counter()
        model.generate(ids, max_new_tokens=steps + 1, **GEN); t2 = time.perf_counter()
    return t1 - t0, ((t2 - t1) - (t1 - t0)) / steps * 1e3


class _Stamps(transformers.LogitsProcessor):
    """A time stamp per generated token."""

    def __init__(self):
        self.t = []

    def __call__(self, input_ids, scores):
        self.t.append(time.perf_counter())
        return scores


def token_step_ms(model, ids, steps: int = STEPS):
    """(None, decode ms per step): the median of the per-token time stamps of one ``steps + 1``-token generate
    (no prefill in it, where :func:`step_ms` subtracts a prefill and carries its noise)."""
    stamps = _Stamps()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=steps + 1, logits_processor=[stamps], **GEN)
    return None, statistics.median(b - a for a, b in zip(stamps.t, stamps.t[1:])) * 1e3


def rounds(names, count: int, measure) -> dict:
    """{name: [measure(name) per round]}, the names in alternating order round by round."""
    res = {n: [] for n in names}
    for r in range(count):
        for n in (list(names) if r % 2 == 0 else list(names)[::-1]):
            res[n].append(measure(n))
    return res


def report(res: dict, label: str = "decode ms/step") -> None:
    for n, v in res.items():
        ms = [x[1] if isinstance(x, tuple) else x for x in v]
        print(f"{n}: {label} median {statistics.median(ms):.2f} {[round(x, 2) for x in ms]}")


def ratios(res: dict, over: str, under: str) -> list:
    """Per-round ratios of decode time ``over / under``."""
    return [a[1] / b[1] for a, b in zip(res[over], res[under])]
