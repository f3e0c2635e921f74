"""python benchmarks/results/weight_guards_ab.py: the regional layer steps with Dynamo's tensor guards on the layers' weights
dropped too (a filter wrapped around regional.keep_guard) against the shipped filter, swapped per measurement,
interleaved, decode ms per step from per-token time stamps. Not shipped: no measurable gain (see decode_levers_tried_zen4_1206.md)."""
import statistics, sys
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import step_timing as st
from awq_inductor import compile_for_generate
from awq_inductor.integrations import regional
from awq_inductor.integrations.generation import uncompile
orig_keep = regional.keep_guard
DROP = {"on": False}
def keep(entry):
    if DROP["on"] and entry.guard_type in ("TENSOR_MATCH", "DIMENSION_DYNAMIC_MARKING_GUARD", "NO_TENSOR_ALIASING"):
        src = entry.orig_guard.source
        if src is not None and src.is_unspecialized_nn_module():
            return False
    return orig_keep(entry)
regional.keep_guard = keep
m = st.llama7b_shaped()
ids = st.prompt(12, vocab=256)
sets = {}
for name, drop in (("filtered", False), ("no_weight_guards", True)):
    DROP["on"] = drop
    compile_for_generate(m)
    st.warm(m, ids)
    sets[name] = [layer.forward for layer in m.model.layers]
    uncompile(m)
compile_for_generate(m)
def measure(name):
    for layer, forward in zip(m.model.layers, sets[name]):
        layer.forward = forward
    return st.token_step_ms(m, ids)


res = st.rounds(sets, 12, measure)
st.report(res)
r = st.ratios(res, "no_weight_guards", "filtered")
print("no_weight_guards/filtered per pair", sorted(round(x, 3) for x in r), "median", round(statistics.median(r), 3))
from torch._dynamo.utils import counters
print("graphs", counters["stats"]["unique_graphs"])
