"""Time to the first 32 tokens of a compiled model, one sample per process, one JSON line:

    python benchmarks/bench_first_tokens.py MODE LAYERS CKPT

MODE: ``regional`` (compile_for_generate's default), ``whole`` (regional=False), ``regional_cppw``
(with Inductor's cpp_wrapper); ``checkpoint`` writes CKPT (testing.save_quantized of a tiny Llama:
hidden 256, intermediate 768, 4/2 heads, LAYERS layers, G=64). Cold = fresh HOME and
TORCHINDUCTOR_CACHE_DIR, warm = the same again: ``benchmarks/results/compile_first_tokens.sh`` runs
the table. Reports load (tuning included), the first generate (its graphs run eager until their C++
is built behind them), when the compiled code was ready (``compiled_after_s``, from the first
generate's start), the second generate, Dynamo's compile-phase
times, our native builds and tuning, and the CPU seconds other processes took meanwhile (a 2-thread
decode step went from 1.7 to 145 ms beside one niced compiler process: such a run is noise)."""
import json, os, resource, sys, time
t_start = time.perf_counter()


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (user + nice + system + irq + softirq)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


busy0 = busy_cpu_s()
mode, L, ckpt = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "checkpoint":
    from awq_inductor import testing
    cfg = testing.tiny_config("llama", hidden_size=256, intermediate_size=768, num_hidden_layers=L,
                              max_position_embeddings=2048)
    testing.save_quantized(testing.build_float_model(cfg), ckpt, format="gemm", group_size=64)
    sys.exit(0)
import torch, transformers
from awq_inductor import compile_for_generate, patch_transformers, wait_until_compiled
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
    wait_until_compiled(); t3c = time.perf_counter()  # the graphs' C++ built behind their first calls
    model.generate(ids, **GEN); t4 = time.perf_counter()
from torch._dynamo.utils import compilation_time_metrics, counters
phases = {k: round(sum(v), 2) for k, v in compilation_time_metrics.items() if sum(v) > 0.05}
phases.update({k: round(v, 2) for k, v in SPENT.items()})
others = busy_cpu_s() - busy0 - own_cpu_s()  # the prebuild thread and g++ children count as ours
print(json.dumps({"mode": mode, "layers": L, "import_s": round(t0 - t_start, 2), "load_s": round(t1 - t0, 2),
                  "first_generate_s": round(t3 - t2, 2), "compiled_after_s": round(t3c - t2, 2),
                  "second_generate_s": round(t4 - t3c, 2),
                  "graphs": counters["stats"]["unique_graphs"], "others_cpu_s": round(others, 2),
                  "load_avg": os.getloadavg()[0], "phases": phases}))
