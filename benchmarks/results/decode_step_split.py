"""The compiled 4-layer Llama-7B-shaped decode step split by perf_counter wrappers on the outer pieces (each
decoder layer call, the head, the final norm, the rotary embedding, the decoder model): ms per call, and the
step's time outside the decoder model and head. python benchmarks/results/decode_step_split.py --head bf16|int4
(decode_step_budget_amx_1207.md)."""
import sys, os, time, tempfile, argparse, collections, torch, transformers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_harness import compiled_model, model_args
p = model_args(argparse.ArgumentParser()); p.add_argument("--whole", action="store_true")
a = p.parse_args(); torch.set_num_threads(2)
model = compiled_model(a, regional=not a.whole)
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(name, mod):
    f = mod.forward
    def g(*args, **kw):
        t0 = time.perf_counter(); r = f(*args, **kw); acc[name] += time.perf_counter() - t0; cnt[name] += 1; return r
    mod.forward = g
if not a.whole:
    for i, l in enumerate(model.model.layers): wrap("layers", l)
    wrap("head", model.lm_head); wrap("norm", model.model.norm); wrap("rotary", model.model.rotary_emb)
    wrap("model.model", model.model)
ids = torch.randint(0, 32000, (1, 32))
n = 64
with torch.no_grad():
    for rep in range(4):
        acc.clear(); cnt.clear()
        model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None)
        pre = dict(acc); acc.clear(); cnt.clear()
        t0 = time.perf_counter(); model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None); t = time.perf_counter() - t0
        tot1 = t
        print(f"generate {n}: {t*1e3:.1f} ms; per step {(t)/(n)*1e3:.2f} ms;", {k: f"{v/cnt[k]*1e3:.3f}ms x{cnt[k]/n:.0f}" for k, v in acc.items()}, f"outside model.model+head per step {(t - acc['model.model'] - acc['head'])/n*1e3:.2f} ms", flush=True)
