"""MoE: a Qwen3-30B-A3B-shaped slice (hidden 2048, 128 experts, top-8, expert intermediate 768,
G=128, random weights), ours vs transformers' own bf16 MoE on the dequantized weights.

    python benchmarks/bench_moe.py --part op        # the experts op alone, M=1: GB/s of selected experts
    python benchmarks/bench_moe.py --part e2e       # 2 layers: decode tok/s, 512-token prefill
    python benchmarks/bench_moe.py --smoke          # tiny shapes, seconds
    python benchmarks/bench_moe.py --model deepseek_v3 --prompt-len 256 --new-tokens 16
        # a DeepSeek-V3 / Kimi-K2-shaped slice: hidden 7168, expert intermediate 2048, top-8 of 32
        # experts, 1 layer (MLA attention, 128 heads, q_lora 1536, kv_lora 512, one shared expert):
        # the bytes per token per layer of the real model (top-8 experts of 7168 x 2048), ~3 GB of bf16
        # experts instead of 256 x 88 MB

op: ``awq::int4_moe`` / ``int4_moe_a8`` eager calls with fresh routing every call (the 128 experts,
~300 MB of int4, do not fit in cache; a call reads top-8 experts), methods and thread counts
(``--op-threads``) interleaved round-robin, medians; bandwidth = bytes of the selected experts' packed weights / time, and its
share of the read bandwidth: the best pass of benchmarks/bw_probe.py (256 MiB, the same thread count) run in the
same interleaved reps, and the paired share (``paired_share``: each call against the probe pass of its rep).
e2e: ``bench`` of ``python -m awq_inductor`` (warm-up generate, then medians of prefill and full
generate): ours compiled and eager, W4A16 and W4A8, and the dequantized bf16 model running
transformers' experts implementation (``config._experts_implementation``). Vocab 32000 (not 151936)
so lm_head does not dominate a 2-layer slice.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import unittest.mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bw_probe, when loaded by path (tests)
import bw_probe  # noqa: E402
from awq_inductor import compile_for_generate, config, testing  # noqa: E402
from awq_inductor.integrations.generation import uncompile  # noqa: E402
from awq_inductor.ops import moe  # noqa: E402
from awq_inductor.kernels import hugepages, isa as isa_mod, plan as kplan, tuning_cache  # noqa: E402
from awq_inductor.schemes import MOE_OPS  # noqa: E402

#: bytes of one probe pass in the op part's interleaved reps: 8x a 32 MiB L3, cold by itself
PROBE_BYTES = 256 << 20


def experts_bytes(mop, H, I, G, k):
    """Packed bytes of k experts (weights, scales, zeros, comp) for one call."""
    s = mop.scheme
    per = 0
    for n, kk in ((2 * I, H), (H, I)):
        npad = -(-n // 32) * 32
        per += npad * kk // 2 + sum((kk // G) * npad * w.dtype.itemsize for w in s.weights[1:])
    return k * per


def bench_op(a):
    E, H, I, G, k = a.experts, a.hidden, a.moe_inter, a.group_size, a.topk
    g = torch.Generator().manual_seed(0)
    gu = [testing.quantize_weight(torch.randn(2 * I, H, generator=g) * 0.05, G) for _ in range(E)]
    dn = [testing.quantize_weight(torch.randn(H, I, generator=g) * 0.05, G) for _ in range(E)]
    # on huge pages where available, as a loaded model's experts are (kernels.hugepages)
    W = {name: [hugepages.on_huge_pages(t) for t in moe.pack_experts(mop, gu, dn, G, I)]
         for name, mop in MOE_OPS.items()}
    del gu, dn
    for mop in MOE_OPS.values():  # all experts stream as a loaded model's do: the machine's decode setting
        tuning_cache.decode_setting(isa_mod.select(), mop.scheme)  # (measured where absent), as its load would
    res = {"read_GBps": {}}
    probes = {nt: bw_probe.stream_calls(nt, a.probe_bytes) for nt in a.op_threads}
    for M in a.m:
        x = torch.randn(M, H).bfloat16()
        routes = [torch.softmax(torch.randn(M, E, generator=g), -1).topk(k, -1) for _ in range(64)]
        runs = [(name, nt, pl) for name in MOE_OPS for nt in a.op_threads for pl in a.plans]
        times = {r: [] for r in runs}
        nsel = {r: [] for r in runs}
        ptimes = {nt: [] for nt in a.op_threads}
        i = 0
        for rep in range(a.reps):
            for nt, ((probe,), _) in probes.items():  # the probe in the same reps, same thread count
                t0 = time.perf_counter()
                probe()
                ptimes[nt].append(time.perf_counter() - t0)
            for name, nt, pl in runs:
                tw, ids = routes[i % len(routes)]
                i += 1
                with config.patch(num_threads=nt), _experts_plans(pl):
                    t0 = time.perf_counter()
                    MOE_OPS[name].torch_op(x, ids, tw.bfloat16(), *W[name], G, I)
                    times[(name, nt, pl)].append(time.perf_counter() - t0)
                nsel[(name, nt, pl)].append(len(set(ids.flatten().tolist())))
        # the probe's best pass is the machine's read limit at nt threads, what the share is of
        bw = {nt: probes[nt][1] / min(ptimes[nt]) / 1e9 for nt in a.op_threads}
        for nt in a.op_threads:
            res["read_GBps"][f"M={M} threads={nt}"] = bw[nt]
            print(f"  read bandwidth (bw_probe, {nt} threads, {probes[nt][1] >> 20} MiB, best of {a.reps}, "
                  f"interleaved): {bw[nt]:.1f} GB/s", flush=True)
        for name, nt, pl in runs:
            t = statistics.median(times[(name, nt, pl)][2:])
            ne = statistics.mean(nsel[(name, nt, pl)])
            gbps = experts_bytes(MOE_OPS[name], H, I, G, ne) / t / 1e9
            paired = paired_share(MOE_OPS[name], H, I, G, times[(name, nt, pl)], nsel[(name, nt, pl)],
                                  ptimes[nt], probes[nt][1])
            tag = "" if a.plans == ["tuned"] else f" plan={pl}"
            res[f"{name} M={M} threads={nt}{tag}"] = {"ms": t * 1e3, "GBps": gbps, "experts": ne,
                                                      "probe_GBps": bw[nt], "share": gbps / bw[nt],
                                                      "paired_share": paired}
            print(f"  {name:<12} M={M:<4} threads {nt} {pl:<9} {t * 1e3:8.3f} ms   {gbps:6.1f} GB/s of {ne:.1f} "
                  f"selected experts ({gbps / bw[nt] * 100:.0f}% of the {nt}-thread read bandwidth; "
                  f"paired with the probe's pass of the same rep: {paired * 100:.0f}%)", flush=True)
        if "constants" in a.plans and "tuned" in a.plans:
            for name in MOE_OPS:
                for nt in a.op_threads:
                    c, t = (res[f"{name} M={M} threads={nt} plan={pl}"]["ms"] for pl in ("constants", "tuned"))
                    print(f"  {name:<12} M={M:<4} threads {nt}  tuned plan / constants: {c / t:5.2f}x faster")
    return res


def paired_share(mop, H, I, G, op_times, experts, probe_times, probe_bytes) -> float:
    """Median over reps of (the op's GB/s in a rep) / (the probe's GB/s in the same rep), first 2 reps
    skipped as for the times. Why beside the share of the probe's best pass: this VM's read bandwidth
    moved between 28 and 60 GB/s within minutes (2026-12-02), so a median op time over the best probe
    pass of the run compares different moments; pairing each call with the probe pass just before it
    compares the same one."""
    ratios = [(experts_bytes(mop, H, I, G, ne) / t) / (probe_bytes / tp)
              for t, ne, tp in zip(op_times[2:], experts[2:], probe_times[2:])]
    return statistics.median(ratios)


#: --plans: "tuned" is the per-machine plan (config.tune; plan_for), "constants" forces the
#: thresholds the experts used before they took the tuned plans (awq::Thresholds{} defaults),
#: "no_next_tile" is the tuned plan without the next-tile prefetch (Thresholds::prefetch_next_tile),
#: "bf16_x" the tuned plan with the decode rows on bf16 x (Thresholds::decode_int16 off)
PLANS = {"tuned": None, "constants": {"amx_min_m": 5, "panel_min_m": 8, "bf16_f32_min_m": 9}, "no_next_tile": None,
         "bf16_x": None}
#: the tuned-plan variants: the fields they replace
TUNED_OVERRIDES = {"no_next_tile": {"prefetch_next_tile": 0}, "bf16_x": {"decode_int16": 0}}


#: --model presets: (hidden, experts, topk, moe_inter, layers)
MODELS = {"qwen3_moe": None, "deepseek_v3": (7168, 32, 8, 2048, 1)}


def deepseek_v3_config(a):
    """DeepSeek-V3's layer shapes (MLA, 1 shared expert) with a.experts routed experts, every layer
    sparse (first_k_dense_replace=0), one routing group (Kimi-K2's n_group=1)."""
    import transformers

    return transformers.DeepseekV3Config(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=18432, moe_intermediate_size=a.moe_inter,
        n_routed_experts=a.experts, num_experts_per_tok=a.topk, n_group=1, topk_group=1, n_shared_experts=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=0, num_hidden_layers=a.layers,
        num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=4096,
        hidden_act="silu", tie_word_embeddings=False)


def qwen3_moe_config(a):
    import transformers

    return transformers.Qwen3MoeConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=6144, moe_intermediate_size=a.moe_inter,
        num_experts=a.experts, num_experts_per_tok=a.topk, norm_topk_prob=True, decoder_sparse_step=1,
        num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=4096, tie_word_embeddings=False)


@contextlib.contextmanager
def _experts_plans(pl: str):
    """The experts' GEMMs with their tuned plans, or (``constants``) with the fixed thresholds they
    used before, or tuned with one field replaced (:data:`TUNED_OVERRIDES`; moe.expert_plans
    swapped; only the experts op, the dense linears keep theirs)."""
    if pl == "tuned":
        yield
        return
    if pl in TUNED_OVERRIDES:
        tuned, fields = moe.expert_plans, TUNED_OVERRIDES[pl]
        plans = lambda *args: tuple(dataclasses.replace(p, **fields) for p in tuned(*args))  # noqa: E731
    else:
        const = kplan.forced_plan(PLANS[pl])
        plans = lambda *args: (const, const)  # noqa: E731
    with unittest.mock.patch.object(moe, "expert_plans", plans):
        yield


def bench_e2e(a):
    import transformers

    from awq_inductor import patch_transformers
    from awq_inductor.cli import bench

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        d = a.ckpt or tmp
        if a.ckpt and os.path.exists(os.path.join(d, "dequantized_bf16", "config.json")):
            # built before (outside the timing lock): the AWQ checkpoint and its dequantized bf16 model
            ref = transformers.AutoModelForCausalLM.from_pretrained(
                os.path.join(d, "dequantized_bf16"), dtype=torch.bfloat16)
        else:
            cfg = deepseek_v3_config(a) if a.model == "deepseek_v3" else qwen3_moe_config(a)
            ref = testing.save_quantized(testing.build_float_model(cfg, dtype=torch.bfloat16), d,
                                         format="gemm", group_size=a.group_size)
            if a.model != "deepseek_v3":  # (DeepSeek's router weight and correction bias stay fp32, as loaded)
                ref = ref.to(torch.bfloat16)
            ref = ref.eval()
            if a.ckpt:
                ref.save_pretrained(os.path.join(d, "dequantized_bf16"))
        if a.build_only:
            return {}
        ref = ref.eval()
        models = {}
        for aq in a.act_quants:
            patch_transformers(act_quant=None if aq == "none" else aq, lm_head=a.lm_head)
            models[None if aq == "none" else aq] = transformers.AutoModelForCausalLM.from_pretrained(
                d, dtype=torch.bfloat16).eval()
        patch_transformers()
    print(f"built and loaded in {time.perf_counter() - t0:.1f}s; transformers experts implementation: "
          f"{getattr(ref.config, '_experts_implementation', None)!r}", flush=True)
    ids = torch.randint(0, a.vocab, (1, a.prompt_len), generator=torch.Generator().manual_seed(0))
    res = {}
    if a.plans != ["tuned"]:
        # the generated code differs by plan but the FX cache key does not see the swapped plans
        torch._inductor.config.force_disable_caches = True
    for aq, model in models.items():
        for pl in a.plans:
            tag = ("W4A8" if aq else "W4A16") + ("" if a.plans == ["tuned"] else f" experts plan={pl}")
            with _experts_plans(pl):
                if "compiled" in a.methods:
                    compile_for_generate(model)  # one compiled decoder layer per kind, as users get it
                    res[f"ours {tag} compiled"] = bench(model, ids, a.new_tokens, f"ours {tag} compiled")[:2]
                    uncompile(model)
                    torch._dynamo.reset()
                if "eager" in a.methods:
                    res[f"ours {tag} eager"] = bench(model, ids, a.new_tokens, f"ours {tag} eager")[:2]
    res["transformers bf16"] = bench(ref, ids, a.new_tokens, "transformers bf16 (dequantized)")[:2]
    base = res["transformers bf16"]
    for k, (pf, dc) in res.items():
        print(f"  {k:<24} prefill x{pf / base[0]:5.2f}   decode x{dc / base[1]:5.2f}  vs transformers bf16")
    return {k: {"prefill_tok_s": v[0], "decode_tok_s": v[1]} for k, v in res.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", default="op,e2e")
    p.add_argument("--model", default="qwen3_moe", choices=sorted(MODELS),
                   help="deepseek_v3: hidden 7168, 32 experts, top-8, expert intermediate 2048, 1 layer "
                        "(overrides those options)")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--moe-inter", type=int, default=768)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt-len", type=int, default=512)
    # decode = (generate(n) - generate(1)) / (n - 1): with a 0.8 s prefill and ~15 ms steps, 16
    # tokens left the prefill's noise in the decode figure (46.0 vs 56.9 tok/s, same model, 16 vs 64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--m", type=int, nargs="*", default=[1, 4])
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--op-threads", type=int, nargs="*", default=[1, 2],
                   help="op part: thread counts, interleaved (a loaded 2-core VM makes 2-thread regions wait)")
    p.add_argument("--plans", nargs="*", default=["tuned"], choices=sorted(PLANS),
                   help="kernel plans of the experts' GEMMs (constants: the old fixed thresholds); op part: "
                        "interleaved calls; e2e: one after the other in this process, Inductor caches off")
    p.add_argument("--methods", default="compiled,eager")
    p.add_argument("--ckpt", default=None, metavar="DIR",
                   help="e2e: keep the random checkpoint here and reuse it (build it once outside a timing lock)")
    p.add_argument("--build-only", action="store_true", help="e2e: only build --ckpt DIR")
    p.add_argument("--act-quants", nargs="*", default=["none", "int8"], choices=["none", "int8"],
                   help="e2e: our models, W4A16 (none) and/or W4A8 (int8)")
    # "bf16" must be passed on: patch_transformers(lm_head=None) means "leave the head as loaded"
    # (F.linear), which every e2e figure of this script measured before this default was fixed
    p.add_argument("--lm-head", default="bf16", choices=["bf16", "int8"], help="e2e: our models' lm_head")
    p.add_argument("--probe-bytes", type=int, default=PROBE_BYTES, help="op part: bytes of one bw_probe pass")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--small-pages", action="store_true", help="weights and probe buffers on 4 KiB pages "
                   "(config.huge_pages off): the code before huge pages")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_moe.json"))
    a = p.parse_args(argv)
    config.huge_pages = not a.small_pages
    if MODELS[a.model]:
        a.hidden, a.experts, a.topk, a.moe_inter, a.layers = MODELS[a.model]
    if a.smoke:
        a.hidden, a.experts, a.moe_inter, a.vocab, a.prompt_len, a.new_tokens, a.reps = 256, 16, 128, 512, 32, 4, 6
        a.probe_bytes = 4 << 20
        a.out = None
    torch.set_num_threads(a.threads)
    import subprocess

    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"machine: {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}; {load}", flush=True)
    out = {"args": vars(a), "uptime": load}
    if "op" in a.part:
        out["op"] = bench_op(a)
    if "e2e" in a.part:
        out["e2e"] = bench_e2e(a)
        # prefill: rows each expert's GEMMs see, here and in a model with the same top-k of 256 experts
        rows = a.prompt_len * a.topk
        out["prefill_rows_per_expert"] = {"this slice": rows / a.experts, "256 experts": rows / 256}
        print(f"prefill: {a.prompt_len} tokens x top-{a.topk} = {rows} expert rows: {rows / a.experts:.0f} per "
              f"expert over {a.experts} experts, {rows / 256:.0f} over 256", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
