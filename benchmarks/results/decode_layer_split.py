"""The compiled 4-layer decode step split per decoder-layer call by nested perf_counter wrappers: the layer call,
Dynamo's step (entry, guards, transformed code), the AOT runtime wrapper, the Inductor graph (CompiledFxGraph), each
generated C++ kernel of the graph (int4 GEMVs by index, elementwise, rope + KV write) and the decode attention op.

    python benchmarks/results/decode_layer_split.py --head bf16

(decode_layer_overhead_amx_1207.md)."""
import sys, os, time, argparse, statistics, collections, torch
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
from decode_harness import compiled_model, model_args
from awq_inductor.inductor import lowering
from awq_inductor.integrations import regional
from awq_inductor.ops import attention
import torch._inductor.output_code as oc
acc = collections.defaultdict(float); cnt = collections.Counter()
def timed(name, f):
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); acc[name] += time.perf_counter() - t0; cnt[name] += 1; return r
    return g
orig_cwi = lowering.compile_with_inductor
lowering.compile_with_inductor = lambda *a, **k: timed("aot", orig_cwi(*a, **k))
oc.CompiledFxGraph.__call__ = timed("fxgraph", oc.CompiledFxGraph.__call__)
orig_cs = regional._compiled_step
regional._compiled_step = lambda *a, **k: timed("dynamo_step", orig_cs(*a, **k))
attention._native_decode_attention = timed("attn_py", attention._native_decode_attention)
p = model_args(argparse.ArgumentParser()); a = p.parse_args(); torch.set_num_threads(2)
model = compiled_model(a)
for l in model.model.layers: l.forward = timed("layer", l.forward)
model.lm_head.forward = timed("head", model.lm_head.forward)
ids = torch.randint(0, 32000, (1, 32)); n = 64
with torch.no_grad():
    model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
from torch._inductor.codecache import PyCodeCache
import re
for key, mod in list(PyCodeCache.modules.items()) if isinstance(PyCodeCache.modules, dict) else [(None, m) for m in PyCodeCache.modules]:
    for name in list(vars(mod)):
        if name.startswith("cpp_fused"):
            short = re.sub(r"_\d+$", "", name)
            tag = ("k_mm" + name[-2:]) if "int4_mm" in name else ("k_attn_rope" if "decode_attention" in name else "k_elem")
            setattr(mod, name, timed(tag, getattr(mod, name)))
    for rep in range(3):
        model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None)
        acc.clear(); cnt.clear()
        t0 = time.perf_counter(); model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None); t = time.perf_counter() - t0
        print(f"step {t/n*1e3:.2f} ms", {k: f"{v/cnt[k]*1e6:.0f}us x{cnt[k]}" for k, v in acc.items()}, flush=True)
