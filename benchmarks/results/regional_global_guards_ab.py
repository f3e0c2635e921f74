"""Dynamo's guards on module globals dropped from the regional layer steps (every guard whose source starts at G[...]:
our schemes registry, transformers' attention table, torch builtins) against the shipped filter: the 4-layer
Llama-7B-shaped model and a deep copy (its streamed weights put back on huge pages: a deep copy is on 4 KiB pages, and
that alone made the copy's step 1.036x slower in a first pass), compiled with each filter, one generate of 64 tokens
each in turn, 10 rounds in alternating order.

    python benchmarks/results/regional_global_guards_ab.py [bf16|int4]

(decode_whole_vs_regional_amx_1208.md)."""
import sys, os, time, copy, argparse, collections, statistics, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decode_harness as dh
from awq_inductor import compile_for_generate
from awq_inductor.integrations import regional
from awq_inductor.integrations.generation import wait_until_compiled
import tempfile, transformers
from llama_shape import llama_config
from awq_inductor import patch_transformers
from awq_inductor.testing import build_float_model, save_quantized
head = sys.argv[1] if len(sys.argv) > 1 else "bf16"
a = dh.model_args(argparse.ArgumentParser()).parse_args(["--head", head]); torch.set_num_threads(2)
with tempfile.TemporaryDirectory() as d:
    save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=128)
    patch_transformers()
    mA = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
if head != "bf16":
    from awq_inductor import convert
    mA = convert(mA, lm_head=head)
mB = copy.deepcopy(mA)
from awq_inductor.kernels import hugepages
print("moved to huge pages (MB):", hugepages.place_streamed_weights(mB) >> 20)
compile_for_generate(mA)
orig = regional._guard_filter
regional._guard_filter = lambda entries: [k and not e.name.startswith("G[") for e, k in zip(entries, orig(entries))]
compile_for_generate(mB)
models = {"all": mA, "noglobals": mB}
ids = torch.randint(0, 32000, (1, 32)); n = 64
with torch.no_grad():
    for m in models.values():
        m.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    wait_until_compiled()
    for m in models.values():
        m.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    outs = {k: m.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None) for k, m in models.items()}
    print("same tokens", torch.equal(outs["all"], outs["noglobals"]))
    res = collections.defaultdict(list)
    for rep in range(10):
        for tag in (list(models) if rep % 2 == 0 else list(models)[::-1]):
            m = models[tag]
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None); t = time.perf_counter() - t0
            res[tag].append(t / n * 1e3)
    A, B = res["all"], res["noglobals"]
    print(f"step ms: all guards {statistics.median(A):.2f} without global guards {statistics.median(B):.2f}; B/A per round", " ".join(f"{y/x:.3f}" for x, y in zip(A, B)), f"median {statistics.median([y/x for x, y in zip(A, B)]):.3f}")
