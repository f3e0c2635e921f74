"""The compiled 4-layer Llama-7B-shaped decode (AWQ gemm G = 128, bf16, regional compile) generating 64
tokens after a 32-token prompt in a loop for --secs seconds, for a sampling profiler to attach to:

    python benchmarks/results/decode_step_profile.py --head bf16 --secs 30 &   # prints READY <pid>
    perf record -F 1999 -p <pid> -o perf.data -- sleep 12
    perf report -i perf.data --no-children --sort pid,dso --stdio

(``py-spy record --native -r 200 -d 15 -p <pid> -f raw`` for the Python side). decode_step_budget_amx_1207.md."""
import sys, os, time, tempfile, argparse, torch, transformers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from awq_inductor import compile_for_generate, convert, patch_transformers
from awq_inductor.testing import build_float_model, save_quantized
from llama_shape import add_shape_args, llama_config
p = argparse.ArgumentParser(); add_shape_args(p, layers=4); p.add_argument("--head", default="int4"); p.add_argument("--secs", type=float, default=20)
a = p.parse_args(); torch.set_num_threads(2)
cfg = llama_config(a)
with tempfile.TemporaryDirectory() as d:
    ref = save_quantized(build_float_model(cfg), d, format="gemm", group_size=128)
    patch_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
del ref
if a.head != "bf16": model = convert(model, lm_head=a.head)
compile_for_generate(model)
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
