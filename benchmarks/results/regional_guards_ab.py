"""python benchmarks/results/regional_guards_ab.py tiny|7b [prompt]: one model, two sets of compiled layer steps (Dynamo's full guards / module guards filtered), swapped per
measurement, interleaved: decode ms per step. argv: tiny|7b [prompt]"""
import sys, time, tempfile, statistics, argparse
sys.path.insert(0, "/work/main/benchmarks")
import torch, transformers
from awq_inductor import compile_for_generate, patch_transformers, wait_until_compiled, testing
from awq_inductor.integrations.generation import uncompile
torch.set_num_threads(2)
d = tempfile.mkdtemp()
if sys.argv[1] == "tiny":
    cfg = testing.tiny_config("llama", num_hidden_layers=4); dtype = torch.float32; steps = 64; reps = 12
else:
    from llama_shape import add_shape_args, llama_config
    p = argparse.ArgumentParser(); add_shape_args(p, layers=4); cfg = llama_config(p.parse_args([])); dtype = torch.bfloat16; steps = 32; reps = 10
testing.save_quantized(testing.build_float_model(cfg), d, format="gemm", group_size=32 if sys.argv[1] == "tiny" else 128)
patch_transformers()
m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
plen = int(sys.argv[2]) if len(sys.argv) > 2 else 12
ids = torch.randint(1, 256, (1, plen))
kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
sets = {}
with torch.no_grad():
    for name, guards in (("full", True), ("filtered", False)):
        compile_for_generate(m, module_guards=guards)
        m.generate(ids, max_new_tokens=8, **kw); wait_until_compiled(); m.generate(ids, max_new_tokens=8, **kw)
        sets[name] = [l.forward for l in m.model.layers]
        uncompile(m)
    compile_for_generate(m)  # outer settings in place
    res = {n: [] for n in sets}
    for rep in range(reps):
        for n in (("full", "filtered") if rep % 2 == 0 else ("filtered", "full")):
            for l, f in zip(m.model.layers, sets[n]): l.forward = f
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=1, **kw); t1 = time.perf_counter()
            m.generate(ids, max_new_tokens=steps + 1, **kw); t2 = time.perf_counter()
            res[n].append(((t2 - t1) - (t1 - t0)) / steps * 1e3)
    for n, v in res.items(): print(sys.argv[1], n, "step ms median", round(statistics.median(v), 3), [round(x, 2) for x in v])
    r = [b / a for a, b in zip(res["full"], res["filtered"])]
    print(sys.argv[1], "filtered/full per pair", [round(x, 3) for x in r], "median", round(statistics.median(r), 3))
    from torch._dynamo.utils import counters
    print("graphs", counters["stats"]["unique_graphs"])
