"""The whole-model compile with the decoder layer class marked torch.compiler.nested_compile_region (specialize_float on,
as the regional steps) against our regional default: 4 Llama-7B-shaped layers, bf16 head; the regional model and a deep
copy (streamed weights put back on huge pages), one generate of 64 tokens each in turn, 8 rounds in alternating order,
ms per step. python benchmarks/results/nested_region_step_ab.py (decode_whole_vs_regional_amx_1208.md)."""
import sys, os, time, copy, argparse, collections, statistics, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decode_harness as dh
from awq_inductor import compile_for_generate
from awq_inductor.integrations.generation import wait_until_compiled
from awq_inductor.kernels import hugepages
import tempfile, transformers
from llama_shape import llama_config
from awq_inductor import patch_transformers
from awq_inductor.testing import build_float_model, save_quantized
a = dh.model_args(argparse.ArgumentParser()).parse_args(["--head", "bf16"]); torch.set_num_threads(2)
with tempfile.TemporaryDirectory() as d:
    save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=128)
    patch_transformers()
    mA = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
mB = copy.deepcopy(mA); hugepages.place_streamed_weights(mB)
ids = torch.randint(0, 32000, (1, 32)); n = 64
compile_for_generate(mA)
with torch.no_grad():
    mA.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
cls = type(mB.model.layers[0]); cls.forward = torch.compiler.nested_compile_region(cls.forward)
torch._dynamo.config.specialize_float = True
compile_for_generate(mB, regional=False)
models = {"regional": mA, "nested": mB}
with torch.no_grad():
    t0 = time.time(); mB.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None); print("nested first generate", time.time() - t0)
    wait_until_compiled()
    for m in models.values(): m.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    outs = {k: m.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None) for k, m in models.items()}
    print("same tokens", torch.equal(outs["regional"], outs["nested"]))
    res = collections.defaultdict(list)
    for rep in range(8):
        for tag in (list(models) if rep % 2 == 0 else list(models)[::-1]):
            m = models[tag]
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None); t = time.perf_counter() - t0
            res[tag].append(t / n * 1e3)
    A, B = res["regional"], res["nested"]
    print(f"step ms: regional {statistics.median(A):.2f} nested {statistics.median(B):.2f}; B/A per round", " ".join(f"{y/x:.3f}" for x, y in zip(A, B)), f"median {statistics.median([y/x for x, y in zip(A, B)]):.3f}")
