"""python benchmarks/results/decode_step_by_context.py [prompts]: decode ms per step of the 4-layer Llama-7B-shaped
model (regional compile, bf16 head) after prompts of several lengths, in one process, interleaved (order
alternating), beside the cost of the KV cache's concatenation alone (transformers' DynamicLayer.update:
torch.cat of the whole cache per layer and step, K and V, cold) at each length."""
import argparse, statistics, sys, tempfile, time
sys.path.insert(0, __file__.rsplit("/results/", 1)[0])
import torch, transformers
from awq_inductor import compile_for_generate, patch_transformers, wait_until_compiled
from awq_inductor.testing import build_float_model, save_quantized
from llama_shape import add_shape_args, llama_config

prompts = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "32,512,2048").split(",")]
p = argparse.ArgumentParser(); add_shape_args(p, layers=4); a = p.parse_args([])
torch.set_num_threads(2)
with tempfile.TemporaryDirectory() as d:
    save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=128)
    patch_transformers()
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, max_position_embeddings=4096).eval()
compile_for_generate(m)
kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
ids = {n: torch.randint(0, 32000, (1, n), generator=torch.Generator().manual_seed(n)) for n in prompts}
flush = torch.empty(64 << 20, dtype=torch.uint8)
with torch.no_grad():
    for n in prompts:
        m.generate(ids[n], max_new_tokens=8, **kw); wait_until_compiled(); m.generate(ids[n], max_new_tokens=8, **kw)
    res = {n: [] for n in prompts}
    for rep in range(6):
        for n in (prompts if rep % 2 == 0 else prompts[::-1]):
            t0 = time.perf_counter(); m.generate(ids[n], max_new_tokens=1, **kw); t1 = time.perf_counter()
            m.generate(ids[n], max_new_tokens=33, **kw); t2 = time.perf_counter()
            res[n].append(((t2 - t1) - (t1 - t0)) / 32 * 1e3)
    for n in prompts:
        k = torch.randn(1, a.kv_heads, n, a.hidden // a.heads).bfloat16(); new = k[:, :, :1].clone()
        ts = []
        for i in range(20):
            flush.fill_(i)
            t0 = time.perf_counter(); torch.cat([k, new], dim=-2); ts.append(time.perf_counter() - t0)
        cat_ms = statistics.median(ts) * 2 * a.layers * 1e3
        print(f"prompt {n}: decode ms/step median {statistics.median(res[n]):.2f} {[round(x, 2) for x in res[n]]}; "
              f"cache concatenation alone (K and V, {a.layers} layers, cold) {cat_ms:.2f} ms per step")
