"""Tensor-parallel overhead: TP=2 x 1 thread against TP=1 x 2 threads, same machine, same weights.

    python -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port 29650 \\
        benchmarks/bench_tp.py                      # 4-layer Llama-7B-shaped AWQ model (gemm, g128)

One torchrun job with 2 ranks. Rank 0 holds the unsharded model (TP=1: pinned to both ranks'
cores, 2 threads; rank 1 waits in a barrier meanwhile), both ranks hold the 2-way shard (TP=2:
each rank pinned to its own core, 1 thread). Both are compiled with backend ``awq_inductor``
(bf16 activations); then ``--rounds`` interleaved rounds time prefill (``generate`` of one token)
and decode (``(generate(n) - prefill) / (n - 1)``) for each in turn; medians and the TP=2 / TP=1
ratios are printed as a markdown table and written to ``results/bench_tp.json``.

The collectives are measured alone on the same gloo group: the median time of one ``all_reduce``
of a bf16 [tokens, hidden] tensor, times 2 per decoder layer (after o_proj and down_proj), per
decode token and per prefill, plus one ``all_gather`` of the [1, vocab / 2] bf16 logits of the
vocab-parallel ``lm_head`` per decode token (``--replicated-head``: none).

The checkpoint (random weights, real AWQ ``gemm`` format) is built once by rank 0 and cached in
``--ckpt-dir``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from llama_shape import add_shape_args, llama_config  # noqa: E402  (benchmarks/ is sys.path[0])


def log(*a):
    if dist.get_rank() == 0:
        print(*a, flush=True)


def build_checkpoint(path, a):
    from awq_inductor.testing import build_float_model, save_quantized

    if os.path.exists(os.path.join(path, "model.safetensors")):
        return
    cfg = llama_config(a)
    t0 = time.perf_counter()
    tmp = path + ".tmp"
    save_quantized(build_float_model(cfg, dtype=torch.bfloat16), tmp, format="gemm", group_size=a.group_size)
    os.replace(tmp, path)
    print(f"built the checkpoint in {time.perf_counter() - t0:.0f}s: {path}", flush=True)


def load(path):
    import transformers

    from awq_inductor.integrations import transformers as hf

    hf.patch_transformers()
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()


def timed_generate(model, ids, n, sync):
    if sync:
        dist.barrier()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
    return time.perf_counter() - t0


def allreduce_ms(tokens, hidden, iters):
    t = torch.randn(tokens, hidden).to(torch.bfloat16)
    for _ in range(5):
        dist.all_reduce(t)
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def allgather_ms(cols, iters):
    t = torch.randn(1, cols).to(torch.bfloat16)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    for _ in range(5):
        dist.all_gather(out, t)
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather(out, t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p, layers=4)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--replicated-head", action="store_true",
                   help="replicate lm_head on both ranks (tp.shard(vocab_parallel=False)); default: vocab-parallel")
    p.add_argument("--ckpt-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "awq_inductor", "models"))
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_tp.json"))
    a = p.parse_args(argv)

    from awq_inductor import tp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit(f"bench_tp: expected 2 ranks (torchrun --nproc-per-node 2), got {world}")
    env = tp.env_rank()
    both = sorted(set(tp.rank_cores(0, 2)) | set(tp.rank_cores(1, 2)))
    mine = tp.rank_cores(env["local_rank"], env["local_world_size"])
    name = (f"llama-h{a.hidden}-i{a.intermediate}-l{a.layers}-kv{a.kv_heads}-v{a.vocab}"
            f"-awq-gemm-g{a.group_size}")
    path = os.path.join(a.ckpt_dir, name)
    if rank == 0:
        os.makedirs(a.ckpt_dir, exist_ok=True)
        build_checkpoint(path, a)
    dist.barrier()

    ids = torch.randint(0, a.vocab, (1, a.prompt_len), generator=torch.Generator().manual_seed(0))
    n = a.new_tokens
    t0 = time.perf_counter()
    # TP=1 x 2 threads on rank 0 (compiled while pinned to both cores, 2 threads)
    full = None
    if rank == 0:
        tp.pin_rank(both)
        full = load(path)
        full.forward = torch.compile(full.forward, backend="awq_inductor")
        timed_generate(full, ids, n, sync=False)
        timed_generate(full, ids, 1, sync=False)
    dist.barrier()
    log(f"TP=1 x {len(both)} threads (cores {both}): loaded and compiled in {time.perf_counter() - t0:.0f}s")
    # TP=2 x 1 thread
    t0 = time.perf_counter()
    tp.pin_rank(mine)
    sharded = tp.shard(load(path), vocab_parallel=not a.replicated_head)
    sharded.forward = torch.compile(sharded.forward, backend="awq_inductor")
    timed_generate(sharded, ids, n, sync=True)
    timed_generate(sharded, ids, 1, sync=True)
    log(f"TP=2 x 1 thread (rank 0 cores {mine}): loaded, sharded and compiled in {time.perf_counter() - t0:.0f}s")

    res = {"tp1x2": {"prefill_s": [], "total_s": []}, "tp2x1": {"prefill_s": [], "total_s": []}}
    for r in range(a.rounds):
        if rank == 0:
            tp.pin_rank(both)
            res["tp1x2"]["prefill_s"].append(timed_generate(full, ids, 1, sync=False))
            res["tp1x2"]["total_s"].append(timed_generate(full, ids, n, sync=False))
        dist.barrier()
        tp.pin_rank(mine)
        res["tp2x1"]["prefill_s"].append(timed_generate(sharded, ids, 1, sync=True))
        res["tp2x1"]["total_s"].append(timed_generate(sharded, ids, n, sync=True))
        if rank == 0:
            log(f"  round {r + 1}/{a.rounds}: " + ", ".join(
                f"{k} prefill {v['prefill_s'][-1]:.2f}s total {v['total_s'][-1]:.2f}s" for k, v in res.items()))
    ar_decode = allreduce_ms(1, a.hidden, 200)
    ar_prefill = allreduce_ms(a.prompt_len, a.hidden, 30)
    ag_decode = 0.0 if a.replicated_head else allgather_ms(-(-a.vocab // world), 200)
    if rank != 0:
        tp.exit_rank()
        return 0

    table = {}
    for k, v in res.items():
        pf = statistics.median(v["prefill_s"])
        per_round_decode = [(t - q) / (n - 1) for t, q in zip(v["total_s"], v["prefill_s"])]
        dc = statistics.median(per_round_decode)
        table[k] = {"prefill_tok_s": a.prompt_len / pf, "decode_tok_s": 1 / dc, "decode_ms_per_token": dc * 1e3,
                    "prefill_s": pf, "decode_spread_ms": [min(per_round_decode) * 1e3, max(per_round_decode) * 1e3]}
    n_ar = 2 * a.layers
    ar = {"one_decode_all_reduce_ms": ar_decode, "decode_ms_per_token": n_ar * ar_decode,
          "one_prefill_all_reduce_ms": ar_prefill, "prefill_ms": n_ar * ar_prefill,
          "bytes_per_decode_token": n_ar * a.hidden * 2, "lm_head_all_gather_ms": ag_decode,
          "collectives_ms_per_decode_token": n_ar * ar_decode + ag_decode}
    t1, t2 = table["tp1x2"], table["tp2x1"]
    print(f"\n{a.layers} layers, hidden {a.hidden}, intermediate {a.intermediate}, heads {a.heads}/{a.kv_heads}, "
          f"vocab {a.vocab}, g{a.group_size}, bf16 activations, prompt {a.prompt_len}, {n} new tokens, "
          f"{a.rounds} interleaved rounds (medians), lm_head "
          f"{'replicated' if a.replicated_head else 'vocab-parallel'}\n")
    print("| config | prefill tok/s | decode tok/s | decode ms/token (min-max) | collectives ms/token |")
    print("|---|---|---|---|---|")
    print(f"| TP=1 x 2 threads | {t1['prefill_tok_s']:.1f} | {t1['decode_tok_s']:.2f} | {t1['decode_ms_per_token']:.1f} "
          f"({t1['decode_spread_ms'][0]:.1f}-{t1['decode_spread_ms'][1]:.1f}) | - |")
    print(f"| TP=2 x 1 thread | {t2['prefill_tok_s']:.1f} | {t2['decode_tok_s']:.2f} | {t2['decode_ms_per_token']:.1f} "
          f"({t2['decode_spread_ms'][0]:.1f}-{t2['decode_spread_ms'][1]:.1f}) | "
          f"{ar['collectives_ms_per_decode_token']:.2f} ({n_ar} all-reduce x {ar_decode:.3f}"
          f"{f' + all-gather {ag_decode:.3f}' if ag_decode else ''}) |")
    print(f"| TP=2 / TP=1 | {t2['prefill_tok_s'] / t1['prefill_tok_s']:.2f}x | "
          f"{t2['decode_tok_s'] / t1['decode_tok_s']:.2f}x | | "
          f"{100 * ar['collectives_ms_per_decode_token'] / t2['decode_ms_per_token']:.1f}% "
          f"of a TP=2 decode step |")
    print(f"\nall-reduce in prefill: {n_ar} x {ar_prefill:.2f} ms = {ar['prefill_ms']:.1f} ms per {a.prompt_len}-token "
          f"prompt ({100 * ar['prefill_ms'] / 1e3 / t2['prefill_s']:.1f}% of TP=2 prefill)")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "cores": {"tp1": both, "tp2_rank0": mine}, "table": table, "all_reduce": ar,
                   "raw": res}, f, indent=1)
    tp.exit_rank()
    return 0


if __name__ == "__main__":
    sys.exit(main())
