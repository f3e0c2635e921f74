"""python benchmarks/results/regional_guards_ab.py tiny|7b [prompt]: one model, two sets of compiled layer steps
(Dynamo's full guards / module guards filtered: compile_for_generate's module_guards), swapped per measurement,
interleaved: decode ms per step."""
import statistics, sys, tempfile
import torch, transformers
import step_timing as st
from awq_inductor import compile_for_generate, patch_transformers, testing
from awq_inductor.integrations.generation import uncompile

if sys.argv[1] == "tiny":
    torch.set_num_threads(2)
    d = tempfile.mkdtemp()
    testing.save_quantized(testing.build_float_model(testing.tiny_config("llama", num_hidden_layers=4)), d,
                           format="gemm", group_size=32)
    patch_transformers()
    m, steps, count = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(), 64, 12
else:
    m, steps, count = st.llama7b_shaped(), 32, 10
ids = st.prompt(int(sys.argv[2]) if len(sys.argv) > 2 else 12, vocab=256)
sets = {}
for name, guards in (("full", True), ("filtered", False)):
    compile_for_generate(m, module_guards=guards)
    st.warm(m, ids)
    sets[name] = [layer.forward for layer in m.model.layers]
    uncompile(m)
compile_for_generate(m)  # the outer forward's trace settings in place


def measure(name):
    for layer, forward in zip(m.model.layers, sets[name]):
        layer.forward = forward
    return st.step_ms(m, ids, steps)


res = st.rounds(sets, count, measure)
st.report(res)
r = st.ratios(res, "filtered", "full")
print("filtered/full per pair", [round(x, 3) for x in r], "median", round(statistics.median(r), 3))
from torch._dynamo.utils import counters  # noqa: E402
print("graphs", counters["stats"]["unique_graphs"])
