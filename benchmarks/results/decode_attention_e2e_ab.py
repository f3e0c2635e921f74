"""python benchmarks/results/decode_attention_e2e_ab.py PROMPT [ROUNDS] [REV]: the 4-layer Llama-7B-shaped decode
(regional compile, KV cache in place) with awq::decode_attention's kernel as at git revision REV (default a15733f)
or as in the working tree, swapped per generate, order alternating: decode ms per step (median of per-token time
stamps) and the kernel's microseconds per call inside the decode (ctypes call included)."""
import statistics
import sys
import time

import step_timing as st
from decode_attention_ab import kernel_at
from awq_inductor import compile_for_generate
from awq_inductor.ops import attention as A

prompt, rounds = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 6
rev = sys.argv[3] if len(sys.argv) > 3 else "a15733f"
m = st.llama7b_shaped()
ids = st.prompt(prompt)
compile_for_generate(m)
st.warm(m, ids)
kernels = {"before": kernel_at(rev), "after": A._kernel()}
chosen, calls = ["after"], []


def timed(*args):
    t = time.perf_counter()
    rc = kernels[chosen[0]](*args)
    calls.append(time.perf_counter() - t)
    return rc


A._kernel = lambda: timed  # _native_decode_attention asks for the kernel at every call


def measure(name):
    chosen[0] = name
    calls.clear()
    step = st.token_step_ms(m, ids)[1]
    return step, statistics.median(calls) * 1e6


res = st.rounds(list(kernels), rounds, measure)
print(f"prompt {prompt}, before = {rev}, after = working tree")
for name, runs in res.items():
    print(f"{name}: decode ms/step median {statistics.median(r[0] for r in runs):.2f} {[round(r[0], 2) for r in runs]}; "
          f"kernel us/call median {statistics.median(r[1] for r in runs):.0f} {[round(r[1]) for r in runs]}")
ratios = [a[0] / b[0] for a, b in zip(res["after"], res["before"])]
print("after / before decode step per round", [round(x, 3) for x in ratios], "median", round(statistics.median(ratios), 3))
