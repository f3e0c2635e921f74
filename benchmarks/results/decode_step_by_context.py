"""python benchmarks/results/decode_step_by_context.py [prompts]: decode ms per step of the 4-layer Llama-7B-shaped
model (regional compile, bf16 head) after prompts of several lengths, in one process, interleaved (order
alternating), beside the cost of the KV cache's concatenation alone (transformers' DynamicLayer.update:
torch.cat of the whole cache per layer and step, K and V, cold) at each length."""
import statistics, sys, time
import torch
import step_timing as st
from awq_inductor import compile_for_generate

lengths = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "32,512,2048").split(",")]
m = st.llama7b_shaped()
compile_for_generate(m)
ids = {n: st.prompt(n) for n in lengths}
for n in lengths:
    st.warm(m, ids[n])
res = st.rounds(lengths, 6, lambda n: st.step_ms(m, ids[n]))
cfg, flush = m.config, torch.empty(64 << 20, dtype=torch.uint8)
for n in lengths:
    k = torch.randn(1, cfg.num_key_value_heads, n, cfg.hidden_size // cfg.num_attention_heads).bfloat16()
    new, ts = k[:, :, :1].clone(), []
    for i in range(20):
        flush.fill_(i)
        t0 = time.perf_counter(); torch.cat([k, new], dim=-2); ts.append(time.perf_counter() - t0)
    cat_ms = statistics.median(ts) * 2 * cfg.num_hidden_layers * 1e3
    step = [x[1] for x in res[n]]
    print(f"prompt {n}: decode ms/step median {statistics.median(step):.2f} {[round(x, 2) for x in step]}; "
          f"cache concatenation alone (K and V, {cfg.num_hidden_layers} layers, cold) {cat_ms:.2f} ms per step")
