"""Inside the compiled decode (4 Llama-7B-shaped layers, --head int4 by default): the decode attention op's Python impl
(_native_decode_attention) and its ctypes call into the kernel, timed per call by wrappers:
python benchmarks/results/decode_attention_python_time.py (decode_step_budget_amx_1207.md)."""
import sys, os, time, tempfile, argparse, collections, torch, transformers
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_harness import compiled_model, model_args
from awq_inductor.ops import attention as A
a = model_args(argparse.ArgumentParser()).parse_args(); torch.set_num_threads(2)
model = compiled_model(a)
acc = collections.defaultdict(float); cnt = collections.Counter()
orig_native, orig_kernel = A._native_decode_attention, A._kernel()
def timed_fn(*args):
    t0 = time.perf_counter(); r = orig_kernel(*args); acc["ctypes call"] += time.perf_counter() - t0; cnt["ctypes call"] += 1; return r
A._kernel = lambda: timed_fn
def native(*args):
    t0 = time.perf_counter(); r = orig_native(*args); acc["_native_decode_attention"] += time.perf_counter() - t0; cnt["_native_decode_attention"] += 1; return r
A._native_decode_attention = native
ids = torch.randint(0, 32000, (1, 32))
with torch.no_grad():
    for rep in range(4):
        acc.clear(); cnt.clear()
        t0 = time.perf_counter(); model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=None); t = time.perf_counter() - t0
        print(f"step {t/64*1e3:.2f} ms;", {k: f"{v/cnt[k]*1e6:.0f} us x{cnt[k]}" for k, v in acc.items()}, flush=True)
