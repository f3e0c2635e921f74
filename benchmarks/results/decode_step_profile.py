"""The compiled 4-layer Llama-7B-shaped decode (AWQ gemm G = 128, bf16, regional compile) generating 64
tokens after a 32-token prompt in a loop for --secs seconds, for a sampling profiler to attach to:

    python benchmarks/results/decode_step_profile.py --head bf16 --secs 30 &   # prints READY <pid>
    perf record -F 1999 -p <pid> -o perf.data -- sleep 12
    perf report -i perf.data --no-children --sort pid,dso --stdio

(``py-spy record --native -r 200 -d 15 -p <pid> -f raw`` for the Python side). decode_step_budget_amx_1207.md."""
import sys, os, time, tempfile, argparse, torch, transformers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_harness import compiled_model, model_args
p = model_args(argparse.ArgumentParser()); p.add_argument("--secs", type=float, default=20)
a = p.parse_args(); torch.set_num_threads(2)
model = compiled_model(a)
ids = torch.randint(0, 32000, (1, 32))
with torch.no_grad():
    model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=None)
    t0 = time.perf_counter(); model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=None)
    print("warm 64 tokens", (time.perf_counter()-t0), flush=True)
    print("READY", os.getpid(), flush=True)
    end = time.time() + a.secs; n = 0
    while time.time() < end:
        t0 = time.perf_counter(); model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=None); n += 1
        print("gen", round(time.perf_counter()-t0, 3), flush=True)
