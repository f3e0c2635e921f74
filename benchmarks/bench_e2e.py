"""End to end: a Llama-shaped AWQ model (random weights), prefill and decode tokens/s.

    python benchmarks/bench_e2e.py                       # hidden 4096, inter 11008, 32/8 heads, 2 layers
    python benchmarks/bench_e2e.py --layers 4 --prompt-len 512 --new-tokens 32

Methods, all on the same quantized weights, side by side in one process: ours compiled
(backend ``awq_inductor`` through ``compile_for_generate``: one compiled decoder layer per kind;
any such method + ``whole``, e.g. ``compiledwhole``, ``int4headwhole``: ``model.forward`` compiled whole, as the
issue's ``torch.compile(model.forward)`` and as before regional compilation), ours eager, the gptqmodel-style path (``aten._weight_int4pack_mm_for_cpu``,
zeros ``(8 - z) * s``) and the dense bf16 model (the dequantized weights). The embedding and
``lm_head`` stay dense bf16 in every method, as in real AWQ checkpoints: ours (compiled and eager)
reads it with our GEMV at decode (``convert``'s default ``lm_head="bf16"``), the baselines with
``F.linear``; ``flinearhead`` is ours compiled with the head on ``F.linear`` (``lm_head=None``);
``int8head`` / ``int4head`` are ours compiled with the opt-in ``convert(model, lm_head="int8" | "int4")``.

``--batch-sizes 1,2,4,8,16``: batched decode instead, aggregate decode tok/s (every row's tokens)
per batch size for ``--batch-methods`` (W4A16 and W4A8 ours compiled, int4pack, dense) on
left-padded prompts (row i padded by min(3 i, prompt_len / 2) tokens, attention mask passed);
ours compiled through ``compile_for_generate`` (dynamic shapes: one set of graphs for every batch
size) with Dynamo's caches reset between methods, since the models share ``forward``'s code
object and with it Dynamo's recompile limit of 8 graphs. ``--rounds R``: every batch size R times
per method, in rounds (order reversed every other round); the ratio to batch 1 is the median of the
rounds' own ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import statistics
import tempfile
import time

import torch
import torch._dynamo
import transformers

from awq_inductor import compile_for_generate, convert, patch_transformers
from awq_inductor.integrations.generation import uncompile
from awq_inductor.cli import bench
from awq_inductor.inductor import graph_library
from awq_inductor.baselines import to_int4pack
from awq_inductor.nn.head import Bf16HeadLinear
from awq_inductor.testing import build_float_model, save_quantized
from llama_shape import add_shape_args, llama_config, write_results  # noqa: E402  (benchmarks/ is sys.path[0])
import bw_probe  # noqa: E402


#: peer method -> (row label, GGUF output tensor type): llama.cpp via llama-cpp-python, ik_llama.cpp
#: via --llama-bench; Q4_0 linears with a BF16 output projection (as our default head) or Q4_0 everywhere
PEERS = {
    "llamacpp": ("llama.cpp Q4_0 + BF16 output", "bf16"),
    "llamacpp-q4head": ("llama.cpp Q4_0 everywhere", "q4_0"),
    "ikllama": ("ik_llama.cpp Q4_0 + BF16 output, -rtr", "bf16"),
    "ikllama-q4head": ("ik_llama.cpp Q4_0 everywhere, -rtr", "q4_0"),
}


def peer_files(ref, methods, directory: str) -> dict:
    """method -> GGUF path written from ``ref``'s float weights (one file per output type), or {}
    without the ``gguf`` package (one line; the peer rows are then skipped)."""
    if not methods:
        return {}
    try:
        import gguf_export
        import gguf  # noqa: F401
    except ImportError:
        print("  peer rows skipped: the gguf package is not installed (pip install gguf)", flush=True)
        return {}
    paths = {}
    for kind in sorted({PEERS[m][1] for m in methods}):
        t0 = time.perf_counter()
        paths[kind] = gguf_export.write_llama_gguf(ref, os.path.join(directory, f"model-{kind}.gguf"), kind)
        print(f"  wrote {paths[kind]} ({os.path.getsize(paths[kind]) / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
    return {m: paths[PEERS[m][1]] for m in methods}


def time_peer(method: str, path, ids, a):
    """(prefill, decode) tok/s of a peer on ``path`` with our prompt and lengths, or None (skipped)."""
    import peers

    if path is None:
        return None
    if method.startswith("llamacpp"):
        return peers.llamacpp(path, ids[0].tolist(), a.new_tokens, a.threads, repeats=a.repeats)
    return peers.llama_bench(a.llama_bench, path, ids.shape[1], a.new_tokens, a.threads)


#: method -> the opt-in ``convert(model, lm_head=...)`` it times (a converted deep copy, in the rounds)
HEAD_METHODS = {"int8head": "int8", "int4head": "int4"}

#: methods timed inside the interleaved rounds (with the peers): name -> label suffix
ROUND_METHODS = {"compiled": "", "compiled4k": " (weights on 4 KiB pages)",
                 "compiledw4a8": ", W4A8 (act_quant=int8)",
                 "compiledperkernel": " (each kernel built apart)",
                 **{m: f", {head} head" for m, head in HEAD_METHODS.items()}}
#: A round method's name + this suffix (``compiledwhole``, ``int4headwhole``, ...): the same model with
#: ``model.forward`` compiled whole (``compile_for_generate(regional=False)``: the issue's
#: ``torch.compile(model.forward)`` set-up, one Dynamo entry per step) instead of one decoder layer per
#: kind with the outer forward eager (the default: first tokens in seconds at any depth)
WHOLE = "whole"


#: methods timed once after the rounds
OTHER_METHODS = ("flinearhead", "eager", "int4pack", "dense")


def round_method(name: str):
    """(base round method, compiled whole) for a round method's name, or None."""
    if name in ROUND_METHODS:
        return name, False
    base = name[: -len(WHOLE)] if name.endswith(WHOLE) else None
    return (base, True) if base in ROUND_METHODS else None


def round_label(name: str) -> str:
    base, whole = round_method(name)
    return "ours compiled" + ROUND_METHODS[base] + (" (whole model)" if whole else "")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p, layers=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--methods", default="compiled,int8head,eager,int4pack,dense",
                   help="any of compiled, compiled4k, compiledw4a8, compiledperkernel, int8head, int4head (each also with "
                        f"the suffix {WHOLE!r}: model.forward compiled whole), flinearhead, eager, int4pack, dense and the peers " + ", ".join(PEERS) + " (GGUF files of the same weights)")
    p.add_argument("--llama-bench", metavar="PATH", default=None,
                   help="a llama-bench binary of ik_llama.cpp you built: times the ikllama rows")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "bench_e2e.json"))
    p.add_argument("--batch-sizes", default=None, help="e.g. 1,2,4,8,16: the batched-decode table instead")
    p.add_argument("--batch-methods", default=",".join(BATCH_METHODS))
    p.add_argument("--repeats", type=int, default=5, help="timed generate pairs per measurement")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the compiled methods, interleaved "
                   "(compiled, compiledwhole, compiled, ...); the table has each one's median-decode round. "
                   "With --batch-sizes: rounds of every batch size per method, order reversed every other round")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    methods = a.methods.split(",")
    unknown = [m for m in methods if not (round_method(m) or m in PEERS or m in OTHER_METHODS)]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}, expected round methods {list(ROUND_METHODS)} (each also "
                         f"+ {WHOLE!r}), peers {list(PEERS)} or {list(OTHER_METHODS)}")
    cfg = llama_config(a)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        ref = save_quantized(build_float_model(cfg), d, format="gemm", group_size=a.group_size)
        patch_transformers()
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    print(f"built and loaded the AWQ model in {time.perf_counter() - t0:.1f}s", flush=True)
    if a.batch_sizes:
        return batched_main(a, model, ref)
    ids = torch.randint(0, a.vocab, (1, a.prompt_len), generator=torch.Generator().manual_seed(0))
    res = {}
    compiled = [m for m in methods if round_method(m) or m in PEERS]
    # compiled4k: the same weights copied onto 4 KiB pages (a deep copy; the loaded model's streamed
    # weights sit on huge pages where available: kernels.hugepages), compiled regionally;
    # compiledw4a8: a copy converted to W4A8 (act_quant="int8"), compiled regionally; int8head /
    # int4head: a copy with the opt-in quantized lm_head. Timed in the rounds beside the others: run
    # after them, on a VM whose bandwidth moves 30-60 GB/s within minutes, the int8 head's row once
    # read as a loss (0.87-0.98x the bf16 head) that one moment explained
    def converted_copy(**options):
        return convert(copy.deepcopy(model), **options)

    variants = {"compiled4k": lambda: copy.deepcopy(model),
                "compiledw4a8": functools.partial(converted_copy, act_quant="int8"),
                **{m: functools.partial(converted_copy, lm_head=head) for m, head in HEAD_METHODS.items()}}
    bases = {round_method(m)[0] for m in compiled if round_method(m)}
    copies = {m: variants[m]() for m in bases if m in variants}  # a method and its whole form share one
    gguf_dir = tempfile.TemporaryDirectory()
    ggufs = peer_files(ref, [m for m in compiled if m in PEERS], gguf_dir.name)
    rounds, probe = {}, []
    for r in range(a.rounds):  # rounds of the compiled methods and peers, in the order given (interleaved)
        probe.append(bw_probe.read_gbps(a.threads, 256 << 20, repeats=3))
        print(f"  round {r + 1}: streaming-read probe {probe[-1]:.1f} GB/s ({a.threads} threads)", flush=True)
        for method in compiled:
            if method in PEERS:
                speeds = time_peer(method, ggufs.get(method), ids, a)
                if speeds is not None:
                    print(f"  {PEERS[method][0]:<34} prefill {speeds[0]:8.1f} tok/s   decode {speeds[1]:7.1f} tok/s",
                          flush=True)
                    rounds.setdefault(PEERS[method][0], []).append((*speeds, None))
                continue
            base, whole = round_method(method)  # one decoder layer per kind (the default), or model.forward
            m = copies.get(base, model)
            t0 = time.perf_counter()
            # compiledperkernel: the same graphs with each generated kernel built as Inductor does
            # (its own g++ run over the precompiled header), not one library per graph
            apart = graph_library.kernels_built_apart() if base == "compiledperkernel" else contextlib.nullcontext()
            with apart:
                compile_for_generate(m, regional=not whole)
                label = round_label(method)
                rounds.setdefault(label, []).append(bench(m, ids, a.new_tokens, label))
            uncompile(m)
            print(f"  (compile + warm-up {time.perf_counter() - t0:.1f}s)")
    gguf_dir.cleanup()
    for label, runs in rounds.items():  # the round of median decode speed
        res[label] = sorted(runs, key=lambda run: run[1])[len(runs) // 2]
    if a.rounds > 1:
        for label, runs in rounds.items():
            print(f"  {label}: decode tok/s per round " + ", ".join(f"{run[1]:.2f}" for run in runs) +
                  "; prefill " + ", ".join(f"{run[0]:.1f}" for run in runs))
    if "flinearhead" in methods:  # ours compiled with the head on F.linear (lm_head=None): the GEMV's share
        mf = copy.deepcopy(model)
        head = mf.get_output_embeddings()
        if type(head) is Bf16HeadLinear:
            head.__class__ = torch.nn.Linear
        compile_for_generate(mf)
        res["ours compiled, F.linear head"] = bench(mf, ids, a.new_tokens, "ours compiled, F.linear lm_head")
        del mf
    if "eager" in methods:
        res["ours eager"] = bench(model, ids, a.new_tokens, "ours eager")
    if "int4pack" in methods:
        res["gptqmodel-style int4pack"] = bench(to_int4pack(copy.deepcopy(model), torch.bfloat16), ids,
                                               a.new_tokens, "gptqmodel-style aten int4pack")
    if "dense" in methods:
        res["dense bf16"] = bench(ref.to(torch.bfloat16).eval(), ids, a.new_tokens, "dense bf16")
    base = res.get("gptqmodel-style int4pack")
    dense = res.get("dense bf16")
    print(f"\nthreads={a.threads} layers={a.layers} hidden={a.hidden} inter={a.intermediate} "
          f"heads={a.heads}/{a.kv_heads} vocab={a.vocab} prompt={a.prompt_len} new={a.new_tokens}\n")
    print("| method | prefill tok/s | decode tok/s | decode vs int4pack | decode vs dense | prefill vs dense |")
    print("|---|---|---|---|---|---|")
    for k, (pf, dc, _) in res.items():
        r1 = f"{dc / base[1]:.2f}x" if base else ""
        r3 = f"{dc / dense[1]:.2f}x" if dense else ""
        r2 = f"{pf / dense[0]:.2f}x" if dense else ""
        print(f"| {k} | {pf:.1f} | {dc:.2f} | {r1} | {r3} | {r2} |")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "load_avg": os.getloadavg(), "results": {k: v[:2] for k, v in res.items()},
                   "probe_GBps_per_round": probe,
                   "rounds": {k: [run[:2] for run in runs] for k, runs in rounds.items()}}, f, indent=1)


# ---------------------------------------------------------------------------------------------
# Batched decode (--batch-sizes)
# ---------------------------------------------------------------------------------------------
def left_padded(batch: int, length: int, vocab: int, seed: int = 0):
    """([B, T] ids, [B, T] mask): row i left-padded (id 0, mask 0) by min(3 i, T / 2) tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for i in range(batch):
        pad = min(3 * i, length // 2)
        ids[i, :pad], mask[i, :pad] = 0, 0
    return ids, mask


def _ours_compiled(model, act_quant):
    m = convert(copy.deepcopy(model), act_quant=act_quant)
    torch._dynamo.reset()  # a fresh recompile budget for this model (see the module doc)
    return compile_for_generate(m)


#: --batch-methods: name -> (model, ref) -> the model to time
BATCH_METHODS = {
    "W4A16": lambda model, ref: _ours_compiled(model, None),
    "W4A8": lambda model, ref: _ours_compiled(model, "int8"),
    "int4pack": lambda model, ref: to_int4pack(copy.deepcopy(model), torch.bfloat16),
    "dense": lambda model, ref: ref.to(torch.bfloat16).eval(),
}


def batched_main(a, model, ref):
    sizes = [int(b) for b in a.batch_sizes.split(",")]
    names = a.batch_methods.split(",")
    unknown = [n for n in names if n not in BATCH_METHODS]
    if unknown:
        raise SystemExit(f"--batch-methods: unknown {unknown}, expected some of {list(BATCH_METHODS)}")
    load = os.getloadavg()
    rounds = {}  # method -> batch size -> decode tok/s per round
    for name in names:
        m = BATCH_METHODS[name](model, ref)
        for r in range(a.rounds):
            # every batch size once per round, the order reversed every other round: the host's bandwidth
            # moves from minute to minute, and a ratio to batch 1 compares figures of one round
            for b in (sizes if r % 2 == 0 else sizes[::-1]):
                ids, mask = left_padded(b, a.prompt_len, a.vocab, seed=b)
                _, dc, _ = bench(m, ids, a.new_tokens, f"{name} batch {b} round {r + 1}", repeats=a.repeats,
                                 attention_mask=mask)
                rounds.setdefault(name, {}).setdefault(b, []).append(dc)
        del m
        torch._dynamo.reset()
    load_after = os.getloadavg()
    res = {name: {b: statistics.median(v) for b, v in row.items()} for name, row in rounds.items()}
    table = _batched_table(a, sizes, rounds, load, load_after)
    print("\n" + table)
    write_results(a.out, {"args": vars(a), "load_avg": [load, load_after], "aggregate_decode_tok_s": res,
                          "per_round": rounds}, table)
    return res


def _batched_table(a, sizes, rounds, load, load_after) -> str:
    """The median over rounds per batch size, and its ratio to batch 1: the median of the rounds' own
    ratios, with their range where there are several rounds."""
    lines = [f"threads={a.threads} layers={a.layers} hidden={a.hidden} inter={a.intermediate} heads={a.heads}/"
             f"{a.kv_heads} vocab={a.vocab} group={a.group_size} prompt={a.prompt_len} (left-padded) new={a.new_tokens} "
             f"repeats={a.repeats} rounds={a.rounds}; load average before {load[0]:.2f}, after {load_after[0]:.2f}", "",
             "aggregate decode tok/s (all rows, median over rounds), and its ratio to batch 1 of the same method "
             "(median of each round's ratio, [range])", "",
             "| method | " + " | ".join(f"batch {b}" for b in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for name, row in rounds.items():
        cells = []
        for b in sizes:
            cell = f"{statistics.median(row[b]):.1f}"
            if 1 in row:
                ratios = [x / one for x, one in zip(row[b], row[1])]
                cell += f" ({statistics.median(ratios):.2f}x" + (
                    f" [{min(ratios):.2f}-{max(ratios):.2f}])" if len(ratios) > 1 else ")")
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
