"""Held-out perplexity of the tiny real Llama (``awq_inductor/data/tiny_llama``) through every path.

For each checkpoint format we load (AutoAWQ gemm, gemv, gemv_fast; GPTQ) and G in {32, 64, 128}:
the dequantized fp32 reference ``(q - z) * s``, our eager path with fp32, bf16 and fp16 activations,
W4A8 (``act_quant="int8"``) with bf16 and fp32 activations, and the compiled path
(``backend="awq_inductor"``); plus the dense model in fp32 and bf16 and a unigram baseline. Also the
greedy agreement (64 tokens from a held-out prompt) of our fp32 and bf16 eager paths with the
reference: free-running (``generate``) and forced (each of the reference's choices given the same
context). Prints a markdown table (the one in the README).

    python benchmarks/fidelity_report.py                 # compiled columns for AWQ gemm G=128
    python benchmarks/fidelity_report.py --compiled all  # compiled columns for every checkpoint
    python benchmarks/fidelity_report.py --only new      # only the issue #24 formats (G=128)

The issue #24 formats (``tiny_model.NEW_FORMATS``: compressed-tensors sym / asym, AutoRound's four
packings, GPTQ act-order) are scored at G=128, compiled columns with ``--compiled all``.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

NEW = 64
PROMPT = 32


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024, help="held-out tokens scored (default 1024 = 4 windows)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--compiled", choices=["all", "gemm128", "none"], default="gemm128",
                   help="compiled columns for every checkpoint, only AWQ gemm G=128 (the demo's; default), "
                   "or none")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", choices=["all", "new", "old"], default="all",
                   help="all rows, only the issue #24 formats (G=128), or only the AWQ / GPTQ rows")
    args = p.parse_args(argv)

    import transformers

    from awq_inductor import patch_transformers, tiny_model
    from awq_inductor.transform import convert

    if args.threads:
        torch.set_num_threads(args.threads)
    patch_transformers()
    tok = tiny_model.load_tokenizer()
    ids = tiny_model.heldout_ids(args.tokens, tok)
    dense = tiny_model.load_dense(torch.float32)
    L = args.seq_len
    t0 = time.time()
    dense_ppl = tiny_model.perplexity(dense, ids, L)
    dense_bf16 = tiny_model.perplexity(tiny_model.load_dense(torch.bfloat16), ids, L)
    unigram = tiny_model.unigram_perplexity(ids, dense.config.vocab_size)
    print(f"held-out: {ids.shape[1]} tokens of heldout.txt in windows of {L}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads", file=sys.stderr, flush=True)

    cols = ["ref fp32", "eager fp32", "eager bf16", "eager fp16", "W4A8 bf16", "W4A8 fp32",
            "compiled fp32", "compiled bf16", "compiled W4A8 bf16", "greedy fp32", "greedy bf16", "forced bf16"]
    rows = []

    def load(path, dtype, act_quant=None):
        m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        if act_quant:
            convert(m, act_quant=act_quant)
        return m

    def compiled_ppl(path, dtype, act_quant=None):
        m = load(path, dtype, act_quant)
        torch._dynamo.reset()
        m.forward = torch.compile(m.forward, backend="awq_inductor", dynamic=True)
        try:
            return tiny_model.perplexity(m, ids, L)
        finally:
            torch._dynamo.reset()

    cases = [] if args.only == "new" else [(qm, fmt, g, None) for qm, fmt in tiny_model.FORMATS
                                           for g in tiny_model.GROUP_SIZES]
    if args.only != "old":
        cases += [(qm, fmt, 128, ao) for qm, fmt, ao in tiny_model.NEW_FORMATS]
    with tempfile.TemporaryDirectory() as tmp:
        for qm, fmt, g, act_order in cases:
            label = f"{fmt}{' act-order' if act_order else ''}"
            path = os.path.join(tmp, f"{fmt}-g{g}-{act_order}")
            ref = tiny_model.save_quantized_checkpoint(path, qm, fmt, g, dense=dense, act_order=act_order)
            r = {"ref fp32": tiny_model.perplexity(ref, ids, L)}
            ref_tokens = tiny_model.greedy(ref, ids[:, :PROMPT], NEW)
            for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
                m = load(path, dtype)
                r[f"eager {name}"] = tiny_model.perplexity(m, ids, L)
                if name != "fp16":
                    same = int((tiny_model.greedy(m, ids[:, :PROMPT], NEW) == ref_tokens).sum())
                    r[f"greedy {name}"] = f"{same}/{NEW}"
                if name == "bf16":
                    forced = tiny_model.forced_agreement(m, ids[:, :PROMPT], ref_tokens)
                    r["forced bf16"] = f"{round(forced * NEW)}/{NEW}"
            for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
                r[f"W4A8 {name}"] = tiny_model.perplexity(load(path, dtype, "int8"), ids, L)
            if args.compiled == "all" or (args.compiled == "gemm128" and (fmt, g) == ("gemm", 128)):
                r["compiled fp32"] = compiled_ppl(path, torch.float32)
                r["compiled bf16"] = compiled_ppl(path, torch.bfloat16)
                r["compiled W4A8 bf16"] = compiled_ppl(path, torch.bfloat16, "int8")
            rows.append((f"{label} G={g}", r))
            print(f"  {label} G={g} done ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)

    def cell(v, ref):
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        return f"{v:.3f}" if ref is None else f"{v:.3f} ({100 * (v - ref) / ref:+.2f}%)"

    print(f"\nHeld-out perplexity ({ids.shape[1]} tokens of `heldout.txt`): dense fp32 **{dense_ppl:.3f}**, "
          f"dense bf16 {dense_bf16:.3f}, unigram (fitted on the scored text) {unigram:.1f}. "
          f"Our columns: perplexity (relative difference to the dequantized fp32 reference); "
          f"greedy: of {NEW} free-running greedy tokens, "
          f"those identical to the reference's; forced: of the reference's {NEW} greedy choices, those our path "
          f"makes too given the same context.\n")
    print("| checkpoint | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, r in rows:
        ref = r["ref fp32"]
        print(f"| {name} | " + " | ".join(cell(r.get(c), None if c == "ref fp32" else ref) for c in cols) + " |")
    print(f"\n({time.time() - t0:.0f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
