"""W4A8 against W4A16 decode steps in one process: the 4-layer Llama-7B-shaped model (bf16 head) and a W4A8 copy
(convert(act_quant="int8")), both compiled regionally, one generate of 64 tokens each in turn, 8 rounds in alternating
order; per step: the step, the decoder layers, the head, the decoder model (perf_counter wrappers).

    python benchmarks/results/decode_a8_step_ab.py

(decode_whole_vs_regional_amx_1208.md)."""
import sys, os, time, copy, argparse, collections, statistics, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decode_harness as dh
from awq_inductor import convert, compile_for_generate
from awq_inductor.integrations.generation import wait_until_compiled
a = dh.model_args(argparse.ArgumentParser()).parse_args(["--head", "bf16"]); torch.set_num_threads(2)
import tempfile, transformers
from llama_shape import llama_config
from awq_inductor import patch_transformers
from awq_inductor.testing import build_float_model, save_quantized
with tempfile.TemporaryDirectory() as d:
    save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=128)
    patch_transformers()
    m16 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
m8 = convert(copy.deepcopy(m16), act_quant="int8")
models = {"w4a16": compile_for_generate(m16), "w4a8": compile_for_generate(m8)}
acc = collections.defaultdict(float)
def wrap(tag, name, mod):
    f = mod.forward
    def g(*args, **kw):
        t0 = time.perf_counter(); r = f(*args, **kw); acc[(tag, name)] += time.perf_counter() - t0; return r
    mod.forward = g
for tag, m in models.items():
    for l in m.model.layers: wrap(tag, "layers", l)
    wrap(tag, "head", m.lm_head); wrap(tag, "model.model", m.model)
ids = torch.randint(0, 32000, (1, 32)); n = 64
with torch.no_grad():
    for m in models.values():
        m.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
    wait_until_compiled()
    res = collections.defaultdict(list)
    for rep in range(8):
        for tag in (["w4a16", "w4a8"] if rep % 2 == 0 else ["w4a8", "w4a16"]):
            m = models[tag]
            m.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None)
            acc.clear()
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None); t = time.perf_counter() - t0
            res[(tag, "step")].append(t / n * 1e3)
            for k in ("layers", "head", "model.model"):
                res[(tag, k)].append(acc[(tag, k)] / n * 1e3)
    for k in ("step", "layers", "head", "model.model"):
        a16, a8 = res[("w4a16", k)], res[("w4a8", k)]
        print(f"{k:12s} w4a16 {statistics.median(a16):.2f} w4a8 {statistics.median(a8):.2f} ms/step; a8/a16 per round", " ".join(f"{y/x:.3f}" for x, y in zip(a16, a8)))
