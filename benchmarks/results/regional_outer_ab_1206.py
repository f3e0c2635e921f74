"""Interleaved decode-step A/B on the tiny Llama (one process, 15 pairs of 100 decode forwards):
    python benchmarks/results/regional_outer_ab_1206.py LAYERS regional,whole,outer
regional (the default), whole (regional=False), outer (regional + the final norm and rotary embedding
compiled as two more regions; not kept). compile_first_tokens_xeon_1206.md."""
import sys, time, statistics
sys.path.insert(0, __import__("os").path.dirname(__file__))
import torch
from regional_depth import load_tiny
from awq_inductor import compile_for_generate
from transformers import DynamicCache
L = int(sys.argv[1]); modes = sys.argv[2].split(",")
torch.set_num_threads(2)
models = {}
for mode in modes:
    m = load_tiny(L)
    compile_for_generate(m, regional=(mode != "whole"))
    if mode == "outer":
        base = m.model
        for name in ("norm", "rotary_emb"):
            mod = getattr(base, name)
            mod.forward = torch.compile(mod.forward, backend="awq_inductor", dynamic=True)
    models[mode] = m
ids = torch.randint(3, 200, (1, 16))
def run_steps(model, n):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=ids, cache=cache, attention_mask=None, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1); pos = ids.shape[1]
        t = time.perf_counter()
        for i in range(n):
            out = model(input_ids=tok, cache=cache, attention_mask=None, use_cache=True, position_ids=torch.tensor([[pos + i]]))
            tok = out.logits[:, -1:].argmax(-1)
        return (time.perf_counter() - t) / n * 1e3
for m in models.values():
    for _ in range(3): run_steps(m, 20)
res = {k: [] for k in models}
for r in range(15):
    order = list(models) if r % 2 == 0 else list(models)[::-1]
    for k in order: res[k].append(run_steps(models[k], 100))
for k, v in res.items(): print(L, k, "median step ms", round(statistics.median(v), 4), "min", round(min(v), 4))
