"""python benchmarks/results/decode_step_ab.py w4a8|heads [prompt] [--profile]: the decode step of the 4-layer
Llama-7B-shaped model (AWQ gemm G = 128, regional compile) for variants of one loaded model, in one process,
interleaved (order alternating): w4a8 = W4A16 vs W4A8 (6 rounds), heads = the bf16, int4 and int8 heads (8 rounds).
Prints decode ms per step over 32 steps; --profile adds a profile of 16 steps of each."""
import argparse, copy, statistics, sys, tempfile, time
sys.path.insert(0, __file__.rsplit("/results/", 1)[0])
import torch, transformers
from awq_inductor import compile_for_generate, convert, patch_transformers, wait_until_compiled
from awq_inductor.testing import build_float_model, save_quantized
from llama_shape import add_shape_args, llama_config

VARIANTS = {"w4a8": {"w4a16": None, "w4a8": dict(act_quant="int8")},
            "heads": {"bf16 head": None, "int4 head": dict(lm_head="int4"), "int8 head": dict(lm_head="int8")}}
mode, prompt = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 32
p = argparse.ArgumentParser(); add_shape_args(p, layers=4)
torch.set_num_threads(2)
with tempfile.TemporaryDirectory() as d:
    save_quantized(build_float_model(llama_config(p.parse_args([]))), d, format="gemm", group_size=128)
    patch_transformers()
    base = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
models = {n: base if o is None else convert(copy.deepcopy(base), **o) for n, o in VARIANTS[mode].items()}
ids = torch.randint(0, 32000, (1, prompt), generator=torch.Generator().manual_seed(0))
kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
with torch.no_grad():
    for m in models.values():
        compile_for_generate(m)
        m.generate(ids, max_new_tokens=8, **kw); wait_until_compiled(); m.generate(ids, max_new_tokens=8, **kw)
    res = {n: [] for n in models}
    for rep in range(6 if mode == "w4a8" else 8):
        for name, m in (list(models.items()) if rep % 2 == 0 else list(models.items())[::-1]):
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=1, **kw); t1 = time.perf_counter()
            m.generate(ids, max_new_tokens=33, **kw); t2 = time.perf_counter()
            res[name].append(((t2 - t1) - (t1 - t0)) / 32 * 1e3)
    for n, v in res.items():
        print(n, "decode ms/step", [round(x, 2) for x in v], "median", round(statistics.median(v), 2))
    if "--profile" in sys.argv:
        from torch.profiler import profile, ProfilerActivity
        for name, m in models.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                m.generate(ids, max_new_tokens=17, **kw)
            print("=====", name)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
