"""python benchmarks/results/regional_vs_whole_ab.py [prompt] [pairs]: one 4-layer Llama-7B-shaped model, compiled
whole (model.forward) and regionally (compile_for_generate's default), the two swapped in turn, interleaved (order
alternating): prefill ms and decode ms per step of each, and the per-pair ratios regional / whole."""
import sys, time, tempfile, statistics, argparse
sys.path.insert(0, __file__.rsplit("/results/", 1)[0])
import torch, transformers
from awq_inductor import compile_for_generate, patch_transformers, wait_until_compiled, testing
from awq_inductor.integrations.generation import uncompile
from llama_shape import add_shape_args, llama_config

torch.set_num_threads(2)
p = argparse.ArgumentParser(); add_shape_args(p, layers=4); cfg = llama_config(p.parse_args([]))
d = tempfile.mkdtemp()
testing.save_quantized(testing.build_float_model(cfg), d, format="gemm", group_size=128)
patch_transformers()
m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
plen = int(sys.argv[1]) if len(sys.argv) > 1 else 32
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
ids = torch.randint(1, 32000, (1, plen), generator=torch.Generator().manual_seed(0))
kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
steps = 32
states = {}


def capture():
    return m.__dict__.get("forward"), [layer.__dict__.get("forward") for layer in m.model.layers]


def put(state):
    for module, forward in zip([m, *m.model.layers], [state[0], *state[1]]):
        module.__dict__.pop("forward", None)
        if forward is not None:
            module.forward = forward


with torch.no_grad():
    for name, regional in (("whole", False), ("regional", True)):
        compile_for_generate(m, regional=regional)
        m.generate(ids, max_new_tokens=8, **kw); wait_until_compiled(); m.generate(ids, max_new_tokens=8, **kw)
        states[name] = capture()
        uncompile(m)
    res = {n: [] for n in states}
    for rep in range(pairs):
        for n in (("whole", "regional") if rep % 2 == 0 else ("regional", "whole")):
            put(states[n])
            t0 = time.perf_counter(); m.generate(ids, max_new_tokens=1, **kw); t1 = time.perf_counter()
            m.generate(ids, max_new_tokens=steps + 1, **kw); t2 = time.perf_counter()
            res[n].append((t1 - t0, ((t2 - t1) - (t1 - t0)) / steps * 1e3))
    for n, v in res.items():
        print(f"{n}: decode ms/step median {statistics.median(x[1] for x in v):.2f} {[round(x[1], 2) for x in v]}; "
              f"prefill s median {statistics.median(x[0] for x in v):.3f}")
    r = [b[1] / a[1] for a, b in zip(res["whole"], res["regional"])]
    rp = [b[0] / a[0] for a, b in zip(res["whole"], res["regional"])]
    print("regional / whole decode time per pair", [round(x, 3) for x in r], "median", round(statistics.median(r), 3))
    print("regional / whole prefill time per pair median", round(statistics.median(rp), 3))
