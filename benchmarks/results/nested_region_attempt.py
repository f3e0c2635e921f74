"""torch.compiler.nested_compile_region on the decoder layer class inside a whole-model compile (one traced layer
stamped out per layer: what would give the whole-model step with regional compile times), small Llama shape:

    python benchmarks/results/nested_region_attempt.py LAYERS ncr|whole|regional [BACKEND]

With torch 2.13 and the layers' floats symbolic, Inductor (ours and plain, BACKEND inductor) failed on the
invoke_subgraph (aten._local_scalar_dense.default) and Dynamo fell back with a graph break; with specialize_float (set
below, as the regional steps do) it compiles, tokens equal, but the first generate grows with depth (decode_whole_vs_regional_amx_1208.md)."""
import argparse, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_harness as dh  # noqa: E402
from awq_inductor import compile_for_generate  # noqa: E402

L = int(sys.argv[1]); mode = sys.argv[2]
a = dh.model_args(argparse.ArgumentParser()).parse_args(["--layers", str(L), "--hidden", "512", "--intermediate", "1024",
                                                         "--heads", "8", "--kv-heads", "8", "--vocab", "1000", "--head", "bf16"])
torch.set_num_threads(2)
model = dh.loaded_model(a)
ids = torch.randint(0, 1000, (1, 32))
ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, min_new_tokens=8)
if mode == "ncr":
    cls = type(model.model.layers[0])
    cls.forward = torch.compiler.nested_compile_region(cls.forward)
torch._dynamo.config.specialize_float = True  # as regional.trace_settings (symbolic floats broke the subgraph)
compile_for_generate(model, regional=(mode == "regional"), backend=(sys.argv[3] if len(sys.argv) > 3 else "awq_inductor"))
t0 = time.time()
out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, min_new_tokens=8)
print("first generate", time.time() - t0, "equal", torch.equal(out, ref))
