"""python benchmarks/results/decode_step_w4a8_ab.py [prompt]: decode step of the 4-layer Llama-7B-shaped model, W4A16 vs W4A8 (regional compile), one process, interleaved; then a profile of each."""
import sys, time, copy, tempfile, statistics
sys.path.insert(0, __file__.rsplit("/results/", 1)[0])
import torch, transformers
from awq_inductor import compile_for_generate, convert, patch_transformers, wait_until_compiled
from awq_inductor.testing import build_float_model, save_quantized
from llama_shape import add_shape_args, llama_config
import argparse
p = argparse.ArgumentParser(); add_shape_args(p, layers=4); a = p.parse_args([])
torch.set_num_threads(2)
cfg = llama_config(a)
with tempfile.TemporaryDirectory() as d:
    ref = save_quantized(build_float_model(cfg), d, format="gemm", group_size=128)
    patch_transformers()
    m16 = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
del ref
m8 = convert(copy.deepcopy(m16), act_quant="int8")
ids = torch.randint(0, 32000, (1, int(sys.argv[1]) if len(sys.argv) > 1 else 32), generator=torch.Generator().manual_seed(0))
kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
models = {"w4a16": m16, "w4a8": m8}
with torch.no_grad():
    for name, m in models.items():
        compile_for_generate(m)
        m.generate(ids, max_new_tokens=8, **kw); wait_until_compiled(); m.generate(ids, max_new_tokens=8, **kw)
    res = {n: [] for n in models}
    for rep in range(6):
        for name, m in (models.items() if rep % 2 == 0 else reversed(list(models.items()))):
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=1, **kw); t1 = time.perf_counter()
            m.generate(ids, max_new_tokens=33, **kw); t2 = time.perf_counter()
            res[name].append(((t2 - t1) - (t1 - t0)) / 32 * 1e3)
    for n, v in res.items():
        print(n, "decode ms/step", [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
    from torch.profiler import profile, ProfilerActivity
    for name, m in models.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            m.generate(ids, max_new_tokens=17, **kw)
        print("=====", name)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
