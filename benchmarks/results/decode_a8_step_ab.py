"""W4A8 against W4A16 decode steps in one process: the 4-layer Llama-7B-shaped model (bf16 head) and a W4A8 copy
(convert(act_quant="int8")), both compiled regionally, one generate of 64 tokens each in turn, 8 rounds in alternating
order; per step: the step, the decoder layers, the head, the decoder model (perf_counter wrappers).

    python benchmarks/results/decode_a8_step_ab.py

(decode_whole_vs_regional_amx_1208.md)."""
import argparse, collections, copy, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_harness as dh  # noqa: E402
from awq_inductor import compile_for_generate, convert  # noqa: E402

a = dh.model_args(argparse.ArgumentParser()).parse_args(["--head", "bf16", *sys.argv[1:]]); torch.set_num_threads(2)
m16 = dh.loaded_model(a)
m8 = convert(copy.deepcopy(m16), act_quant="int8")  # (convert puts the repacked weights on huge pages)
models = {"w4a16": compile_for_generate(m16), "w4a8": compile_for_generate(m8)}
acc = collections.defaultdict(float)


def wrap(tag, name, mod):
    f = mod.forward

    def timed(*args, **kw):
        t0 = time.perf_counter(); r = f(*args, **kw); acc[(tag, name)] += time.perf_counter() - t0; return r
    mod.forward = timed


for tag, m in models.items():
    for layer in m.model.layers:
        wrap(tag, "layers", layer)
    wrap(tag, "head", m.lm_head); wrap(tag, "model.model", m.model)
n = 64
parts = collections.defaultdict(list)


def split(name, res):
    for k in ("layers", "head", "model.model"):
        parts[(name, k)].append(acc[(name, k)] / n * 1e3)


res = dh.interleaved_steps(models, a.vocab, n, before=lambda name: acc.clear(), after=split)
print(dh.ratio_line("step, w4a16 / w4a8", res["w4a16"], res["w4a8"]))
for k in ("layers", "head", "model.model"):
    print(dh.ratio_line(f"{k}, w4a16 / w4a8", parts[("w4a16", k)], parts[("w4a8", k)]))
