"""python benchmarks/results/decode_step_ab.py w4a8|heads [prompt] [--profile]: the decode step of the 4-layer
Llama-7B-shaped model (AWQ gemm G = 128, regional compile) for variants of one loaded model, in one process,
interleaved (order alternating): w4a8 = W4A16 vs W4A8 (6 rounds), heads = the bf16, int4 and int8 heads (8 rounds).
Prints decode ms per step over 32 steps; --profile adds a profile of 16 steps of each."""
import copy, sys
import torch
import step_timing as st
from awq_inductor import compile_for_generate, convert

VARIANTS = {"w4a8": {"w4a16": None, "w4a8": dict(act_quant="int8")},
            "heads": {"bf16 head": None, "int4 head": dict(lm_head="int4"), "int8 head": dict(lm_head="int8")}}
mode, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 32
base = st.llama7b_shaped()
models = {k: base if o is None else convert(copy.deepcopy(base), **o) for k, o in VARIANTS[mode].items()}
ids = st.prompt(n)
for m in models.values():
    compile_for_generate(m)
    st.warm(m, ids)
st.report(st.rounds(models, 6 if mode == "w4a8" else 8, lambda k: st.step_ms(models[k], ids)))
if "--profile" in sys.argv:
    from torch.profiler import profile, ProfilerActivity
    for name, m in models.items():
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
            m.generate(ids, max_new_tokens=17, **st.GEN)
        print("=====", name)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
