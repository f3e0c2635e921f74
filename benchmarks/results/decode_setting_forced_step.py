"""Median decode step (ms, per-token stamps) of the compiled 4-layer model under a forced decode setting, 5 generates
with the read probe beside each; run in alternating processes:

    FORCE=0,0,1,0 python benchmarks/results/decode_setting_forced_step.py --head bf16   # pf,next_tile,int16_x,l2[,k_streams]
    WHOLE=1 python benchmarks/results/decode_setting_forced_step.py --head bf16         # whole-model compile

(decode_layer_overhead_amx_1207.md, decode_k_streams_amx_1207.md)."""
import sys, os, time, argparse, statistics, torch
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
from decode_harness import compiled_model, model_args
from awq_inductor import config
from transformers import StoppingCriteriaList
import bw_probe
f = os.environ.get("FORCE")
if f:
    pf, nt, i16, l2, *ks = map(int, f.split(","))
    config.kernel_plan = dict(decode_prefetch=pf, prefetch_next_tile=nt, decode_int16=i16, decode_prefetch_l2=l2, rows_prefetch=0,
                              decode_k_streams=ks[0] if ks else 1)
p = model_args(argparse.ArgumentParser()); a = p.parse_args(); torch.set_num_threads(2)
model = compiled_model(a, regional=not os.environ.get("WHOLE"))
probe = bw_probe.stream_calls(2, 256 << 20, 1)[0][0]
ids = torch.randint(0, 32000, (1, 32)); n = 64
def run():
    stamps = []
    class S:
        def __call__(self, *x, **k): stamps.append(time.perf_counter()); return False
    with torch.no_grad():
        model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, stopping_criteria=StoppingCriteriaList([S()]))
    d = [b - c for b, c in zip(stamps[2:], stamps[1:-1])]
    return statistics.median(d) * 1e3
run()
out = []
for r in range(5):
    t0 = time.perf_counter(); probe(); pr = (256 << 20) / (time.perf_counter() - t0) / 1e9
    out.append((run(), pr))
print(f, "whole" if os.environ.get("WHOLE") else "regional", "step ms", [f"{s:.2f}" for s, _ in out], "probe", [f"{p:.1f}" for _, p in out], "median", round(statistics.median(s for s, _ in out), 2), flush=True)
