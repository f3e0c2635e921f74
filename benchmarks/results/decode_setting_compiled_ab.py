"""python benchmarks/results/decode_setting_compiled_ab.py [--w4a8] [ROUNDS] [SETTING ...]: the 4-layer
Llama-7B-shaped decode (regional compile, prompt 32; ``--w4a8``: converted to W4A8), compiled once per decode setting
of its scheme in one process, one model each; generates alternate model by model (order reversed every round):
decode ms per step (median of per-token time stamps).
The setting is baked into each model's generated C++ when it is compiled, so each model is loaded and compiled with
the machine's setting replaced by its own (``tuning_cache``'s memo, the plans' memo cleared); Inductor's caches are
off so that no model reuses code generated for another. SETTING: ``DISTANCE,NEXT_TILE,INT16,L2`` (default: the
constants' ``0,0,0,0`` and the machine's tuned setting)."""
import os
import sys

os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"

import step_timing as st  # noqa: E402
from awq_inductor import compile_for_generate, convert  # noqa: E402
from awq_inductor.kernels import isa as isa_mod, plan as kplan, tuning_cache  # noqa: E402
from awq_inductor.kernels.tuner import setting_name  # noqa: E402
from awq_inductor.schemes import W4A8, W4A16  # noqa: E402

argv = sys.argv[1:]
w4a8 = argv[:1] == ["--w4a8"]
argv = argv[1:] if w4a8 else argv
scheme = W4A8 if w4a8 else W4A16
count = int(argv[0]) if argv else 8
isa = isa_mod.select()
key = (tuning_cache.threads(), str(isa), scheme.name)
settings = [kplan.DecodeSetting(*map(int, a.split(","))) for a in argv[1:]] or \
    [kplan.DEFAULT_DECODE, tuning_cache.decode_setting(isa, scheme)]
ids = st.prompt(32)
models = {}
for s in settings:
    tuning_cache._decode_memo[key] = s
    tuning_cache._final.clear()
    m = st.llama7b_shaped()
    if w4a8:
        m = convert(m, act_quant="int8")
    compile_for_generate(m)
    st.warm(m, ids)
    models[setting_name(s)] = m
    print("compiled with", setting_name(s), flush=True)
res = st.rounds(list(models), count, lambda name: st.token_step_ms(models[name], ids, 32))
st.report(res)
first = list(models)[0]
for name in list(models)[1:]:
    print(f"{name} / {first} per round", [round(r, 3) for r in st.ratios(res, name, first)])
