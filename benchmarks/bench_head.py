"""The lm_head at decode: bf16 ``F.linear`` vs the opt-in int8 and int4 heads, speed and accuracy.

    python benchmarks/bench_head.py                 # 32000 x 4096 head, M = 1, 4, 8; accuracy tables

Speed: the machine's read bandwidth (bench_decode's probe), then per M the median time of
``F.linear`` on a bf16 [32000, 4096] weight (262 MB), of ``awq::int8_linear`` on its int8
quantization (131 MB + 128 KB of fp32 scales) and of the int4 head (``awq::int4_mm``, 66 MB + its
group scales / zeros) at each group size of ``--int4-groups``; each call streams a weight far larger than the L3,
so every call is cold without rotating copies. Methods interleaved call by call, with the
bandwidth probe of bench_decode (256 MiB) as one more method: shares are relative to it.

Accuracy, each quantized head (int8, int4 at each group size) against the bf16 head it was
quantized from:
* the packaged tiny real Llama (trained, awq_inductor/data/tiny_llama) teacher-forced over its
  held-out text: relative logit error per position (max |dlogit| / max |logit|; max and mean over
  positions), the largest absolute logit error, greedy (top-1) agreement, perplexity of both;
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
from awq_inductor.nn.head import INT4_HEAD_GROUP_SIZE, Int4HeadLinear, Int8HeadLinear
from bench_decode import probe_calls, read_bandwidth  # noqa: E402  (benchmarks/ is sys.path[0]; probe: bw_probe)


def int4_heads(lin: torch.nn.Linear, groups) -> dict:
    """{"int4 G=<g>": Int4HeadLinear} for each group size."""
    return {f"int4 G={g}": Int4HeadLinear.from_linear(lin, g) for g in groups}


def _nbytes(mod) -> int:
    return sum(t.numel() * t.element_size() for t in mod.buffers())


def time_heads(N, K, ms, reps, threads, groups):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(N, K, generator=g) * 0.02).to(torch.bfloat16)
    q, s = int8_head.quantize_per_channel(w)
    lin = torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    int4 = int4_heads(lin, groups)
    (probe,), probe_bytes = probe_calls(threads, 256 << 20)
    rows = []
    for M in ms:
        x = torch.randn(M, K, generator=g).to(torch.bfloat16)
        fns = {"bf16_linear": lambda: F.linear(x, w), "bf16_op": lambda: bf16_head.bf16_linear(x, w),
               "int8_head": lambda: int8_head.int8_linear(x, q, s), "probe": lambda: probe(None)}
        nbytes = {"bf16_linear": w.numel() * 2, "bf16_op": w.numel() * 2, "int8_head": q.numel() + s.numel() * 4,
                  "probe": probe_bytes - (M * K + M * N) * 2}
        for name, mod in int4.items():
            fns[name] = (lambda mod=mod: mod(x))
            nbytes[name] = _nbytes(mod)
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
    err = (y - ref).abs().amax(-1)
    rel = err / ref.abs().amax(-1)
    return {"max_rel_err": float(rel.max()), "mean_rel_err": float(rel.mean()), "max_abs_err": float(err.max()),
            "greedy_agreement": float((y.argmax(-1) == ref.argmax(-1)).float().mean()), "positions": ref.shape[0]}


def quantized_heads(lin: torch.nn.Linear, groups) -> dict:
    """The opt-in heads quantized from ``lin``: int8, then int4 at each group size."""
    return {"int8": Int8HeadLinear.from_linear(lin), **int4_heads(lin, groups)}


@torch.no_grad()
def tiny_llama_accuracy(groups, n_tokens=1024, seq_len=256):
    """{head: errors + perplexities} on the packaged trained model's held-out text."""
    model = tiny_model.load_dense(torch.bfloat16)
    ids = tiny_model.heldout_ids(n_tokens)
    head = model.lm_head
    hs, ref = [], []
    for x in ids.view(-1, 1, seq_len):
        out = model(x, output_hidden_states=True)
        hs.append(out.hidden_states[-1][0])
        ref.append(out.logits[0])
    h, ref = torch.cat(hs), torch.cat(ref)
    ppl_bf16 = tiny_model.perplexity(model, ids, seq_len)
    res = {}
    for name, q in quantized_heads(head, groups).items():
        model.lm_head = q
        res[name] = {**logit_errors(ref, q(h)), "ppl_bf16_head": ppl_bf16,
                     "ppl_head": tiny_model.perplexity(model, ids, seq_len),
                     "vocab": head.out_features, "hidden": head.in_features}
    model.lm_head = head
    return res


@torch.no_grad()
def random_head_accuracy(N, K, groups, T=256):
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(K, N, bias=False, dtype=torch.bfloat16)
    lin.weight.copy_(torch.randn(N, K, generator=g) * 0.02)
    h = torch.randn(T, K, generator=g).to(torch.bfloat16)
    ref = lin(h)
    return {name: {**logit_errors(ref, q(h)), "vocab": N, "hidden": K}
            for name, q in quantized_heads(lin, groups).items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--m", default="1,4,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_head"))
    p.add_argument("--int4-groups", default=f"{INT4_HEAD_GROUP_SIZE},128",
                   help=f"int4 head group sizes to time and measure (the default head uses {INT4_HEAD_GROUP_SIZE})")
    p.add_argument("--speed-only", action="store_true", help="skip the accuracy tables")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    load = os.getloadavg()
    bw = read_bandwidth(a.threads)
    groups = [int(g) for g in a.int4_groups.split(",")]
    speed = time_heads(a.vocab, a.hidden, [int(m) for m in a.m.split(",")], a.reps, a.threads, groups)
    acc = {} if a.speed_only else {"tiny_llama (real, held-out text)": tiny_llama_accuracy(groups),
                                   f"random {a.vocab}x{a.hidden} head": random_head_accuracy(a.vocab, a.hidden, groups)}
    int4_names = [f"int4 G={g}" for g in groups]
    lines = [f"threads={a.threads} torch={torch.__version__} load_avg_before={load[0]:.2f}; read bandwidth "
             f"{bw['probe_gbs']:.1f} GB/s (probe), torch.sum {bw['torch_sum_gbs']:.1f} GB/s", "",
             "share = GB/s / the probe's (256 MiB stream) measured interleaved in the same reps", "",
             "bf16 op = awq::bf16_linear, the default head (our GEMV for M <= "
             f"{bf16_head.GEMV_MAX_M}, F.linear above)", "",
             "| N | K | M | bf16 F.linear ms | GB/s | share | bf16 op ms | GB/s | share | op / F.linear "
             "| int8 head ms | GB/s | share | int8 / bf16 | probe GB/s |"
             + "".join(f" {n} ms | {n} / bf16 op |" for n in int4_names),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|---|" * len(int4_names)]
    for r in speed:
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {r['bf16_linear_ms']:.3f} | {r['bf16_linear_gbs']:.1f} | "
                     f"{r['bf16_linear_share']:.0%} | {r['bf16_op_ms']:.3f} | {r['bf16_op_gbs']:.1f} | "
                     f"{r['bf16_op_share']:.0%} | {r['bf16_op_ms'] / r['bf16_linear_ms']:.2f} | {r['int8_head_ms']:.3f} | {r['int8_head_gbs']:.1f} | "
                     f"{r['int8_head_share']:.0%} | {r['int8_head_ms'] / r['bf16_linear_ms']:.2f} | {r['probe_gbs']:.1f} |"
                     + "".join(f" {r[n + '_ms']:.3f} | {r[n + '_ms'] / r['bf16_op_ms']:.2f} |" for n in int4_names))
    lines += ["", "| quantized head vs bf16 head | head | positions | max rel logit err | mean rel logit err "
              "| max abs logit err | top-1 agreement | ppl bf16 head | ppl quantized head | ppl change |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for k, heads in acc.items():
        for name, r in heads.items():
            ppl = (f"{r['ppl_bf16_head']:.3f} | {r['ppl_head']:.3f} | {r['ppl_head'] / r['ppl_bf16_head'] - 1:+.2%}"
                   if "ppl_head" in r else " | | ")
            lines.append(f"| {k} | {name} | {r['positions']} | {r['max_rel_err']:.4f} | {r['mean_rel_err']:.4f} | "
                         f"{r['max_abs_err']:.3f} | {r['greedy_agreement']:.4f} | {ppl} |")
    table = "\n".join(lines)
    print(table)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump({"args": vars(a), "bandwidth": bw, "load_avg": load, "speed": speed, "accuracy": acc}, f, indent=1)
    with open(a.out + ".md", "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
