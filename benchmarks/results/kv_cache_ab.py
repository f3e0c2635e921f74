"""python benchmarks/results/kv_cache_ab.py [prompts]: decode ms per step of the 4-layer Llama-7B-shaped model
(regional compile, bf16 head) with the KV cache written in place (awq_inductor.integrations.kv_cache, the
default) and with transformers' concatenation (the layer steps not armed: kv_cache.reserve replaced by one that
arms nothing), after prompts of several lengths, one process, interleaved (order alternating per round)."""
import statistics, sys
import step_timing as st
from awq_inductor import compile_for_generate
from awq_inductor.integrations import kv_cache

lengths = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "32,512,2048").split(",")]
in_place = kv_cache.reserve


def concatenate(layer, new_tokens):
    layer._awq_armed = False
    return False


m = st.llama7b_shaped()
compile_for_generate(m)
ids = {n: st.prompt(n) for n in lengths}
variants = {"in place": in_place, "concatenate": concatenate}
for n in lengths:
    for f in variants.values():
        kv_cache.reserve = f
        st.warm(m, ids[n])


def measure(name):
    kv_cache.reserve = variants[name[0]]
    return st.token_step_ms(m, ids[name[1]])


names = [(v, n) for n in lengths for v in variants]
res = st.rounds(names, int(sys.argv[2]) if len(sys.argv) > 2 else 6, measure)
for n in lengths:
    a, b = res[("in place", n)], res[("concatenate", n)]
    r = [x[1] / y[1] for x, y in zip(a, b)]
    print(f"prompt {n}: decode ms/step in place {statistics.median(x[1] for x in a):.2f}, concatenate "
          f"{statistics.median(x[1] for x in b):.2f}; in place / concatenate per round "
          f"{[round(x, 3) for x in r]} median {statistics.median(r):.3f}")
