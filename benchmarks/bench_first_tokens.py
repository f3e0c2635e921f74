"""Time to the first 32 tokens of a compiled model, one sample per process, one JSON line:

    python benchmarks/bench_first_tokens.py MODE LAYERS CKPT

MODE: ``regional`` (compile_for_generate's default), ``whole`` (regional=False), ``regional_cppw``
(with Inductor's cpp_wrapper). Cold = fresh HOME and TORCHINDUCTOR_CACHE_DIR, warm = the same again:
``benchmarks/results/compile_first_tokens.sh`` runs the table (checkpoints from testing.save_quantized
of a tiny Llama, hidden 256, G=64). Reports load (tuning included), the first and second generate,
Dynamo's compile-phase times, and our native builds and tuning."""
import json, sys, time
t_start = time.perf_counter()
import torch, transformers
from awq_inductor import compile_for_generate, patch_transformers
mode, L, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(2)
from awq_inductor.kernels import native
from awq_inductor.transform import model_pass
SPENT = {"native_build_s": 0.0, "tune_s": 0.0}
def timed(mod, name, key):
    inner = getattr(mod, name)
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            dt = time.perf_counter() - t
            SPENT[key] += dt
            if key == "native_build_s" and dt > 0.05:
                print(f"  build {k.get('name', a[2] if len(a) > 2 else '?')} {dt:.1f}s at {time.perf_counter() - t_start:.1f}s", file=sys.stderr)
    setattr(mod, name, run)
timed(native, "build", "native_build_s"); timed(model_pass, "tune_model", "tune_s")
t0 = time.perf_counter()
patch_transformers()
model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()
t1 = time.perf_counter()
import os
opts = {"options": {"cpp_wrapper": True}} if mode.endswith("cppw") else {}
compile_for_generate(model, regional=(mode != "whole"), **opts)
ids = torch.randint(1, 256, (1, 20), generator=torch.Generator().manual_seed(0))
GEN = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
with torch.no_grad():
    t2 = time.perf_counter(); model.generate(ids, **GEN); t3 = time.perf_counter()
    model.generate(ids, **GEN); t4 = time.perf_counter()
from torch._dynamo.utils import compilation_time_metrics, counters
phases = {k: round(sum(v), 2) for k, v in compilation_time_metrics.items() if sum(v) > 0.05}
phases.update({k: round(v, 2) for k, v in SPENT.items()})
print(json.dumps({"mode": mode, "layers": L, "import_s": round(t0 - t_start, 2), "load_s": round(t1 - t0, 2),
                  "first_generate_s": round(t3 - t2, 2), "second_generate_s": round(t4 - t3, 2),
                  "graphs": counters["stats"]["unique_graphs"], "phases": phases}))
