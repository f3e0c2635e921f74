"""python benchmarks/results/regional_vs_whole_ab.py [prompt] [pairs]: one 4-layer Llama-7B-shaped model, compiled
whole (model.forward) and regionally (compile_for_generate's default), the two swapped in turn, interleaved (order
alternating): prefill and decode ms per step of each, and the per-pair ratios regional / whole."""
import statistics, sys
import step_timing as st
from awq_inductor import compile_for_generate
from awq_inductor.integrations.generation import uncompile

m = st.llama7b_shaped()
ids = st.prompt(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
modules = [m, *m.model.layers]
states = {}
for name, regional in (("whole", False), ("regional", True)):
    compile_for_generate(m, regional=regional)
    st.warm(m, ids)
    states[name] = [module.__dict__.get("forward") for module in modules]
    uncompile(m)


def measure(name):
    for module, forward in zip(modules, states[name]):
        module.__dict__.pop("forward", None)
        if forward is not None:
            module.forward = forward
    return st.step_ms(m, ids)


res = st.rounds(states, pairs, measure)
st.report(res)
for name, v in res.items():
    print(f"{name}: prefill s median {statistics.median(x[0] for x in v):.3f}")
r = st.ratios(res, "regional", "whole")
print("regional / whole decode time per pair", [round(x, 3) for x in r], "median", round(statistics.median(r), 3))
print("regional / whole prefill time per pair median",
      round(statistics.median(b[0] / a[0] for a, b in zip(res["whole"], res["regional"])), 3))
