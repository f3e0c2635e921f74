"""The whole-model compile with the decoder layer class marked torch.compiler.nested_compile_region (specialize_float on,
as the regional steps) against our regional default: 4 Llama-7B-shaped layers, bf16 head; the regional model and a deep
copy (streamed weights put back on huge pages), one generate of 64 tokens each in turn, 8 rounds in alternating order,
ms per step. python benchmarks/results/nested_region_step_ab.py (decode_whole_vs_regional_amx_1208.md)."""
import argparse, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_harness as dh  # noqa: E402
from awq_inductor import compile_for_generate  # noqa: E402

a = dh.model_args(argparse.ArgumentParser()).parse_args(["--head", "bf16", *sys.argv[1:]]); torch.set_num_threads(2)
mA = dh.loaded_model(a)
mB = dh.huge_page_copy(mA)
ids = torch.randint(0, a.vocab, (1, 32))
compile_for_generate(mA)
with torch.no_grad():  # the regional steps traced before the class's forward is marked
    mA.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
cls = type(mB.model.layers[0])
cls.forward = torch.compiler.nested_compile_region(cls.forward)
torch._dynamo.config.specialize_float = True  # as regional.trace_settings (symbolic floats broke the subgraph)
compile_for_generate(mB, regional=False)
with torch.no_grad():
    t0 = time.time(); mB.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
print(f"nested regions: first generate {time.time() - t0:.1f} s")
models = {"regional": mA, "nested": mB}
res = dh.interleaved_steps(models, a.vocab)
print("same tokens", dh.same_tokens(models, a.vocab))
print(dh.ratio_line("regional / nested", res["regional"], res["nested"]))
