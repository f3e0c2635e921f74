"""Dynamo's guards on module globals dropped from the regional layer steps (every guard whose source starts at G[...]:
our schemes registry, transformers' attention table, torch builtins) against the shipped filter: the 4-layer
Llama-7B-shaped model and a deep copy (its streamed weights put back on huge pages: a deep copy is on 4 KiB pages, and
that alone made the copy's step 1.036x slower in a first pass), compiled with each filter, one generate of 64 tokens
each in turn, 10 rounds in alternating order.

    python benchmarks/results/regional_global_guards_ab.py [--head bf16|int4]

(decode_whole_vs_regional_amx_1208.md)."""
import argparse, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_harness as dh  # noqa: E402
from awq_inductor import compile_for_generate  # noqa: E402
from awq_inductor.integrations import regional  # noqa: E402

a = dh.model_args(argparse.ArgumentParser()).parse_args(["--head", "bf16", *sys.argv[1:]]); torch.set_num_threads(2)
mA = dh.loaded_model(a)
mB = dh.huge_page_copy(mA)
compile_for_generate(mA)
shipped = regional._guard_filter
regional._guard_filter = lambda entries: [k and not e.name.startswith("G[") for e, k in zip(entries, shipped(entries))]
compile_for_generate(mB)  # (its steps trace at their first call, under the filter set here)
models = {"all": mA, "noglobals": mB}
res = dh.interleaved_steps(models, a.vocab, rounds=10)
print("same tokens", dh.same_tokens(models, a.vocab))
print(dh.ratio_line("all guards / without global guards", res["all"], res["noglobals"]))
