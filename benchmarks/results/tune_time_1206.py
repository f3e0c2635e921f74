"""Where the demo's load-time tuning goes: the machine's decode setting, then each shape of the shipped
tiny Llama (copies made, then ``tune_shape``), seconds each (compile_first_tokens_xeon_1206.md):

    python benchmarks/results/tune_time_1206.py"""
import json, os, time
import torch
from awq_inductor import tiny_model
from awq_inductor.kernels import isa as isa_mod, native, tuner
from awq_inductor.kernels.tuning_cache import model_shapes
from awq_inductor.schemes import LINEAR, W4A16, Op

torch.set_num_threads(2)
isa = isa_mod.select()
native.get_kernel(Op(W4A16, LINEAR).name, torch.bfloat16, isa)  # built before any clock
print("cold_bytes MiB", tuner.cold_bytes() >> 20, "L3 bytes", tuner.last_level_cache_bytes())
t = time.perf_counter()
setting, _ = tuner.tune_decode_setting(isa, W4A16)
print("decode setting s", round(time.perf_counter() - t, 2), tuner.setting_name(setting))
cfg = json.load(open(os.path.join(tiny_model.checkpoint_dir(), "config.json")))
for s in model_shapes(cfg):
    t = time.perf_counter()
    cold = tuner._ColdWeights(lambda: tuner._random_weights(s.op, s.K, s.out_features, s.G))
    cold.make()
    made = time.perf_counter() - t
    t = time.perf_counter()
    tuner.tune_shape(s.op, isa, torch.bfloat16, s.K, s.out_features, s.G, decode=setting)
    print(f"{s.op.name} K={s.K} N={s.out_features}: {len(cold.copies)} copies in {made:.2f} s, "
          f"tune_shape {time.perf_counter() - t:.2f} s")
