"""The lm_head at decode: bf16 ``F.linear`` vs the opt-in int8 head, speed and accuracy.

    python benchmarks/bench_head.py                 # 32000 x 4096 head, M = 1, 4, 8; accuracy tables

Speed: the machine's read bandwidth (bench_decode's probe), then per M the median time of
``F.linear`` on a bf16 [32000, 4096] weight (262 MB) and of ``awq::int8_linear`` on its int8
quantization (131 MB + 128 KB of fp32 scales); each call streams a weight far larger than the L3,
so every call is cold without rotating copies. Methods interleaved call by call, with the
bandwidth probe of bench_decode (256 MiB) as one more method: shares are relative to it.

Accuracy, int8 head against the bf16 head it was quantized from:
* the packaged tiny real Llama (trained, awq_inductor/data/tiny_llama) teacher-forced over its
  held-out text: relative logit error per position (max |dlogit| / max |logit|; max and mean over
  positions), greedy agreement (argmax equal), perplexity of both;
* a Llama-7B-shaped random head (N(0, 0.02)) on Gaussian hidden states of unit RMS: the same errors.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from awq_inductor import tiny_model
from awq_inductor.ops import head_bf16 as bf16_head, head_int8 as int8_head
from awq_inductor.nn.head import Int8HeadLinear
from bench_decode import probe_calls, read_bandwidth  # noqa: E402  (benchmarks/ is sys.path[0]; probe: bw_probe)


def time_heads(N, K, ms, reps, threads):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(N, K, generator=g) * 0.02).to(torch.bfloat16)
    q, s = int8_head.quantize_per_channel(w)
    (probe,), probe_bytes = probe_calls(threads, 256 << 20)
    rows = []
    for M in ms:
        x = torch.randn(M, K, generator=g).to(torch.bfloat16)
        fns = {"bf16_linear": lambda: F.linear(x, w), "bf16_op": lambda: bf16_head.bf16_linear(x, w),
               "int8_head": lambda: int8_head.int8_linear(x, q, s), "probe": lambda: probe(None)}
        nbytes = {"bf16_linear": w.numel() * 2, "bf16_op": w.numel() * 2, "int8_head": q.numel() + s.numel() * 4,
                  "probe": probe_bytes - (M * K + M * N) * 2}
        ts = {k: [] for k in fns}
        for f in fns.values():
            f()
        for _ in range(reps):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                ts[k].append(time.perf_counter() - t0)
        row = {"N": N, "K": K, "M": M}
        for k in fns:
            ms_ = statistics.median(ts[k]) * 1e3
            row.update({f"{k}_ms": ms_, f"{k}_gbs": (nbytes[k] + (M * K + M * N) * 2) / (ms_ * 1e-3) / 1e9})
        for k in fns:  # share of the probe's bandwidth measured in the same interleaved reps
            row[f"{k}_share"] = row[f"{k}_gbs"] / row["probe_gbs"]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def logit_errors(ref: torch.Tensor, y: torch.Tensor) -> dict:
    """ref, y [T, V]: relative error per position, greedy agreement."""
    ref, y = ref.float(), y.float()
    rel = (y - ref).abs().amax(-1) / ref.abs().amax(-1)
    return {"max_rel_err": float(rel.max()), "mean_rel_err": float(rel.mean()),
            "greedy_agreement": float((y.argmax(-1) == ref.argmax(-1)).float().mean()), "positions": ref.shape[0]}


@torch.no_grad()
def tiny_llama_accuracy(n_tokens=1024, seq_len=256):
    model = tiny_model.load_dense(torch.bfloat16)
    ids = tiny_model.heldout_ids(n_tokens)
    head = model.lm_head
    hs, ref = [], []
    for x in ids.view(-1, 1, seq_len):
        out = model(x, output_hidden_states=True)
        hs.append(out.hidden_states[-1][0])
        ref.append(out.logits[0])
    h, ref = torch.cat(hs), torch.cat(ref)
    int8 = Int8HeadLinear.from_linear(head)
    res = logit_errors(ref, int8(h))
    ppl_bf16 = tiny_model.perplexity(model, ids, seq_len)
    model.lm_head = int8
    res.update({"ppl_bf16_head": ppl_bf16, "ppl_int8_head": tiny_model.perplexity(model, ids, seq_len),
                "vocab": head.out_features, "hidden": head.in_features})
    return res


@torch.no_grad()
def random_head_accuracy(N, K, T=256):
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16)
    lin.weight.copy_(torch.randn(N, K, generator=g) * 0.02)
    h = torch.randn(T, K, generator=g).to(torch.bfloat16)
    return {**logit_errors(lin(h), Int8HeadLinear.from_linear(lin)(h)), "vocab": N, "hidden": K}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--m", default="1,4,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_head"))
    p.add_argument("--speed-only", action="store_true", help="skip the int8 accuracy tables")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    bw = read_bandwidth(a.threads)
    speed = time_heads(a.vocab, a.hidden, [int(m) for m in a.m.split(",")], a.reps, a.threads)
    acc = {} if a.speed_only else {"tiny_llama (real, held-out text)": tiny_llama_accuracy(),
                                   f"random {a.vocab}x{a.hidden} head": random_head_accuracy(a.vocab, a.hidden)}
    lines = [f"threads={a.threads} torch={torch.__version__} load_avg_before={load[0]:.2f}; read bandwidth "
             f"{bw['probe_gbs']:.1f} GB/s (probe), torch.sum {bw['torch_sum_gbs']:.1f} GB/s", "",
             "share = GB/s / the probe's (256 MiB stream) measured interleaved in the same reps", "",
             "bf16 op = awq::bf16_linear, the default head (our GEMV for M <= "
             f"{bf16_head.GEMV_MAX_M}, F.linear above)", "",
             "| N | K | M | bf16 F.linear ms | GB/s | share | bf16 op ms | GB/s | share | op / F.linear "
             "| int8 head ms | GB/s | share | int8 / bf16 | probe GB/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in speed:
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {r['bf16_linear_ms']:.3f} | {r['bf16_linear_gbs']:.1f} | "
                     f"{r['bf16_linear_share']:.0%} | {r['bf16_op_ms']:.3f} | {r['bf16_op_gbs']:.1f} | "
                     f"{r['bf16_op_share']:.0%} | {r['bf16_op_ms'] / r['bf16_linear_ms']:.2f} | {r['int8_head_ms']:.3f} | {r['int8_head_gbs']:.1f} | "
                     f"{r['int8_head_share']:.0%} | {r['int8_head_ms'] / r['bf16_linear_ms']:.2f} | {r['probe_gbs']:.1f} |")
    lines += ["", "| int8 head vs bf16 head | positions | max rel logit err | mean rel logit err | greedy agreement "
              "| ppl bf16 head | ppl int8 head |", "|---|---|---|---|---|---|---|"]
    for k, r in acc.items():
        ppl = (f"{r['ppl_bf16_head']:.3f} | {r['ppl_int8_head']:.3f}" if "ppl_bf16_head" in r else " | ")
        lines.append(f"| {k} | {r['positions']} | {r['max_rel_err']:.4f} | {r['mean_rel_err']:.4f} | "
                     f"{r['greedy_agreement']:.4f} | {ppl} |")
    table = "\n".join(lines)
    print(table)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"args": vars(a), "bandwidth": bw, "load_avg": load, "speed": speed, "accuracy": acc}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
