"""Decode tok/s of the compiled Llama-shaped AWQ model with each lm_head, interleaved.

    python benchmarks/bench_head_decode.py --layers 4          # bf16, int8 (one-row blockings 4 and 8), int4

One AWQ gemm checkpoint (random weights, bench_e2e's shape options), loaded once per head choice
with ``patch_transformers(lm_head=...)`` and compiled (``torch.compile(model.forward,
backend="awq_inductor")``, Dynamo's recompile limit raised: the models share ``forward``'s code
object). Each round runs every variant once, in alternating order: ``generate`` of 1 and of
``--new-tokens`` tokens after a ``--prompt-len`` prompt, decode ms/token = the difference over the
extra tokens; medians over ``--rounds``. ``int8 kc=<n>`` is the int8 head with
``head_int8.KC_ONE_ROW = n`` (channels streamed together at one row), switched between calls.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch._dynamo
import transformers

from awq_inductor import patch_transformers
from awq_inductor.ops import head_int8
from awq_inductor.testing import build_float_model, save_quantized
from llama_shape import add_shape_args, llama_config, write_results  # noqa: E402  (benchmarks/ is sys.path[0])

#: variant -> (lm_head choice, int8 one-row blocking or None)
VARIANTS = {"bf16": ("bf16", None), "int8 kc=4": ("int8", 4), "int8 kc=8": ("int8", 8), "int4": ("int4", None)}


def _timed(model, ids, n):
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p, layers=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=33)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--ckpt", default=None, help="an AWQ checkpoint folder to load instead of building one "
                                                "from the shape options (which then only label the table)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_head_decode.json"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch._dynamo.config.recompile_limit = 64
    names = a.variants.split(",")
    models = {}
    with tempfile.TemporaryDirectory() as d:
        if a.ckpt is None:
            save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=a.group_size)
        for head in dict.fromkeys(VARIANTS[n][0] for n in names):
            patch_transformers(lm_head=head)
            m = transformers.AutoModelForCausalLM.from_pretrained(a.ckpt or d, dtype=torch.bfloat16).eval()
            m.forward = torch.compile(m.forward, backend="awq_inductor")
            models[head] = m
    patch_transformers()
    ids = torch.randint(0, a.vocab, (1, a.prompt_len), generator=torch.Generator().manual_seed(0))
    default_kc = head_int8.KC_ONE_ROW
    ms = {n: [] for n in names}
    load = os.getloadavg()
    with torch.no_grad():
        for m in models.values():  # compile prefill and decode
            _timed(m, ids, a.new_tokens), _timed(m, ids, 1)
        for r in range(a.rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                head, kc = VARIANTS[n]
                head_int8.KC_ONE_ROW = kc or default_kc
                m = models[head]
                t1, tn = _timed(m, ids, 1), _timed(m, ids, a.new_tokens)
                ms[n].append((tn - t1) / (a.new_tokens - 1) * 1e3)
    head_int8.KC_ONE_ROW = default_kc
    load_after = os.getloadavg()
    med = {n: statistics.median(v) for n, v in ms.items()}
    base = med.get("bf16")
    lines = [f"threads={a.threads} layers={a.layers} hidden={a.hidden} vocab={a.vocab} prompt={a.prompt_len} "
             f"new={a.new_tokens} rounds={a.rounds}; load average before {load[0]:.2f}, after {load_after[0]:.2f}", "",
             "| head | decode ms/token (median) | tok/s | speed vs bf16 head | all rounds ms |", "|---|---|---|---|---|"]
    for n in names:
        rel = f"{base / med[n]:.3f}x" if base else ""
        lines.append(f"| {n} | {med[n]:.2f} | {1e3 / med[n]:.1f} | {rel} | {', '.join(f'{x:.1f}' for x in ms[n])} |")
    table = "\n".join(lines)
    print(table)
    write_results(a.out, {"args": vars(a), "load_avg": [load, load_after], "ms_per_token": ms}, table)
    return med


if __name__ == "__main__":
    main()
