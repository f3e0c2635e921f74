"""The per-machine kernel choice (awq_inductor/kernels/tuner.py): cache key, threshold choice, the
on-disk cache, forced plans, and the generated code following the measured winner."""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time

import pytest
import torch

import awq_inductor
from awq_inductor import AWQLinear, config
from awq_inductor.kernels import cache_key, dense, plan as kplan, tuner, tuning_cache
from awq_inductor.schemes import OPS

from helpers import random_canonical

NEVER = kplan.NEVER
W4A16 = OPS["int4_mm"]
W4A8 = OPS["int4_mm_a8"]


def fake_timer(table):
    """A timer reading ``table[path](M)`` (seconds), recording what it was asked."""
    calls = []

    def timer(path, plan, M):
        calls.append((path, M))
        return table[path](M)

    timer.calls = calls
    return timer


def test_machine_key_changes_with_threads_cpu_and_versions(monkeypatch):
    cache_key.machine_key.cache_clear()
    base = cache_key.machine_key(2)
    assert cache_key.machine_key(2) == base
    assert cache_key.machine_key(4) != base
    monkeypatch.setattr(cache_key, "_cpuinfo", lambda: {"model name": "Some Other CPU", "flags": "avx2"})
    cache_key.machine_key.cache_clear()
    other_cpu = cache_key.machine_key(2)
    assert other_cpu != base
    monkeypatch.setattr(cache_key, "_cpuinfo", lambda: {"model name": "Some Other CPU", "flags": "avx2 amx_tile"})
    cache_key.machine_key.cache_clear()
    assert cache_key.machine_key(2) != other_cpu  # flags
    monkeypatch.setattr(awq_inductor, "__version__", "99.0")
    cache_key.machine_key.cache_clear()
    assert cache_key.machine_key(2) not in (base, other_cpu)
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    v = cache_key.machine_key(2)
    cache_key.machine_key.cache_clear()
    assert cache_key.machine_key(2) != v
    cache_key.machine_key.cache_clear()


def test_path_for_mirrors_the_driver_order():
    plan = kplan.Plan(amx_min_m=5, panel_min_m=8, bf16_f32_min_m=3, dense_min_m=1024)
    bf16 = torch.bfloat16
    assert [kplan.path_for(plan, W4A16, "avx512", bf16, m) for m in (1, 2, 3, 7, 8, 1023, 1024)] == \
        ["decode_bf16", "decode_bf16", "f32_rows", "f32_rows", "panel", "panel", "dense"]
    assert [kplan.path_for(plan, W4A16, "amx", bf16, m) for m in (1, 4, 5, 32, 33, 2048)] == \
        ["decode_bf16", "f32_rows", "amx_groups", "amx_groups", "amx", "dense"]
    assert kplan.candidate_of("amx_groups") == "amx" and kplan.candidate_of("panel") == "panel"
    assert kplan.path_for(plan, W4A16, "amx", torch.float32, 16) == "panel"  # AMX is bf16-only
    assert [kplan.path_for(plan, W4A8, "amx", bf16, m) for m in (4, 5)] == ["vnni", "amx"]
    assert kplan.path_for(plan, W4A8, "avx512", bf16, 512) == "vnni"


def test_weights_read_leave_out_comp_only_on_w4a8s_register_decode_kernel():
    """Bandwidth figures count what the path reads: W4A8's register decode kernel (up to kDecodeM
    rows of the vnni path) folds the zero point with the activations' group sums, never reading comp."""
    from awq_inductor.kernels import codegen

    text = (codegen.template_dir() / "schemes" / "w4a8.h.j2").read_text()
    assert f"constexpr int64_t kDecodeM = {kplan.A8_DECODE_MAX_M};" in text  # the mirror holds
    plan = kplan.Plan(amx_min_m=64, panel_min_m=8, bf16_f32_min_m=3, dense_min_m=1024)
    bf16 = torch.bfloat16
    names = lambda op, isa, m: [w.name for w in kplan.weights_read(plan, op, isa, bf16, m)]  # noqa: E731
    assert names(W4A8, "amx", 1) == names(W4A8, "avx512", 32) == ["qweight", "scales", "zeros"]
    assert names(W4A8, "avx512", 33) == names(W4A8, "amx", 64) == ["qweight", "scales", "zeros", "comp"]
    assert names(W4A16, "avx512", 1) == [w.name for w in W4A16.scheme.weights]


def test_choose_follows_the_timings():
    ms = tuner.M_BUCKETS
    times = {  # decode best below 4 rows, fp32 rows for 4..8, panel from 16, dense from 1024
        "decode_bf16": {m: (1.0 if m < 4 else 9.0) for m in ms},
        "f32_rows": {m: (2.0 if m < 4 else 1.0 if m <= 8 else 9.0) for m in ms},
        "panel": {m: (3.0 if m <= 8 else 1.0 if m < 1024 else 2.0) for m in ms},
        "dense": {m: (9.0 if m < 1024 else 1.0) for m in ms},
    }
    plan = tuner.choose(W4A16, "avx512", torch.bfloat16, times)
    assert (plan.bf16_f32_min_m, plan.panel_min_m, plan.dense_min_m) == (4, 16, 1024)
    assert plan.amx_min_m == config.amx_min_m  # not a choice on avx512
    only_panel = {"decode_bf16": {m: 2.0 for m in ms}, "f32_rows": {m: 3.0 for m in ms},
                  "panel": {m: 1.0 for m in ms}, "dense": {m: 5.0 for m in ms}}
    plan = tuner.choose(W4A16, "avx512", torch.bfloat16, only_panel)
    assert all(kplan.path_for(plan, W4A16, "avx512", torch.bfloat16, m) == "panel" for m in ms)
    assert plan.dense_min_m == NEVER


def _choose_by_every_plan(op, isa, x_dtype, times):
    """The exhaustive search tuner.choose replaced (every threshold combination through path_for):
    the oracle of test_choose_matches_the_exhaustive_search."""
    ms = sorted({m for t in times.values() for m in t})
    best = {m: min(t[m] for t in times.values() if m in t) for m in ms}

    def term(plan, m):
        return times.get(kplan.candidate_of(kplan.path_for(plan, op, isa, x_dtype, m)), {}).get(m, 10 * best[m]) / best[m]

    values = sorted(set(ms) | {0, NEVER})
    free = tuner._free_thresholds(op, isa, x_dtype)
    base = dataclasses.replace(kplan.default_plan(), source="tuned")

    def least(allowed):
        best_plan, best_cost, best_combo = base, float("inf"), ()
        for combo in itertools.product(values, repeat=len(free)):
            plan = dataclasses.replace(base, **dict(zip(free, combo)))
            if not allowed(plan):
                continue
            c = sum(term(plan, m) for m in ms)
            if c < best_cost - 1e-9 or (abs(c - best_cost) <= 1e-9 and combo > best_combo):
                best_plan, best_cost, best_combo = plan, c, combo
        return best_plan, best_cost

    best_plan, best_cost = least(lambda plan: True)
    if sum(term(base, m) for m in ms) > best_cost * tuner.MIN_GAIN:
        return best_plan
    small = [m for m in ms if m < tuner.DROP_MIN_M]
    pinned, _ = least(lambda plan: all(kplan.path_for(plan, op, isa, x_dtype, m) == kplan.path_for(base, op, isa, x_dtype, m)
                                       for m in small))
    loses = any(term(base, m) > tuner.BUCKET_LOSS * term(pinned, m) for m in ms if m >= tuner.DROP_MIN_M)
    return pinned if loses else base


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scheme,isa,x_dtype", [(W4A16, "amx", torch.bfloat16), (W4A16, "avx512", torch.bfloat16),
                                                (W4A16, "avx512", torch.float32), (W4A8, "amx", torch.bfloat16)])
def test_choose_matches_the_exhaustive_search(scheme, isa, x_dtype, seed):
    """choose scores the threshold combinations per M and pattern: the same plan as scoring each
    one through path_for, on random timings with ties (integer times) and paths dropped early."""
    gen = torch.Generator().manual_seed(seed)
    ms = tuner.M_BUCKETS
    times = {}
    for path in kplan.candidates(scheme, isa, x_dtype):
        last = len(ms) - int(torch.randint(0, 4, (), generator=gen)) if path != "dense" else len(ms)
        times[path] = {m: float(torch.randint(1, 4, (), generator=gen)) * m ** 0.5 for m in ms[:last]}
    assert tuner.choose(scheme, isa, x_dtype, times) == _choose_by_every_plan(scheme, isa, x_dtype, times)


def test_measure_stops_timing_a_path_that_keeps_losing():
    timer = fake_timer({"fast": lambda m: 1.0, "slow": lambda m: 3.0})
    cands = {"fast": kplan.Plan(0, 0, 0), "slow": kplan.Plan(0, 0, 0)}
    times = tuner.measure(cands, timer)
    assert set(times["fast"]) == set(tuner.M_BUCKETS)
    assert max(times["slow"]) == 64  # slow at 32 and 64 (from DROP_MIN_M): not timed for M >= 128


def test_measure_keeps_timing_dense_where_it_catches_up():
    """dense pays a fixed dequantization per call: far behind at mid M, ahead at large M (the AMX
    Xeon: 2.4x the AMX path at M = 64, 0.60x at 2048). It is timed at every bucket and chosen there."""
    timer = fake_timer({"amx": lambda m: 0.05 * m, "dense": lambda m: 5.0 + 0.03 * m})
    cands = {"amx": kplan.Plan(0, NEVER, NEVER), "dense": kplan.Plan(NEVER, NEVER, NEVER, 0)}
    times = tuner.measure(cands, timer)
    assert set(times["dense"]) == set(tuner.M_BUCKETS)
    assert times["dense"][64] > tuner.DROP_RATIO * times["amx"][64] and times["dense"][2048] < times["amx"][2048]
    plan = tuner.choose(W4A16, "amx", torch.bfloat16, times)
    assert kplan.path_for(plan, W4A16, "amx", torch.bfloat16, 2048) == "dense"
    assert kplan.path_for(plan, W4A16, "amx", torch.bfloat16, 64) == "amx"
    assert kplan.path_for(plan, W4A16, "amx", torch.bfloat16, 16) == "amx_groups"  # timed as "amx"


# 11008 x 4096, bf16 x, as the tuner measured it on the AMX Xeon (2026-12-07), ms per path and M
XEON_11008x4096 = {
    "amx": {1: 1.6241, 2: 1.6325, 4: 1.6578, 8: 1.8395, 16: 1.9144, 32: 2.5157, 64: 5.6409, 128: 9.0808,
            256: 16.899, 512: 29.01, 1024: 61.9075, 2048: 127.0936},
    "decode_bf16": {1: 1.0209, 2: 1.0181, 4: 1.1038, 8: 1.8437, 16: 3.5466, 32: 6.6444, 64: 13.1704},
    "dense": {1: 9.0531, 2: 9.2691, 4: 9.2823, 8: 9.2463, 16: 9.3968, 32: 10.59, 64: 14.2693, 128: 15.2279,
              256: 22.7205, 512: 35.5951, 1024: 59.7783, 2048: 109.5326},
    "f32_rows": {1: 1.6678, 2: 1.82, 4: 4.1134, 8: 5.8327, 16: 9.8023, 32: 18.27, 64: 34.7648},
    "panel": {1: 3.3943, 2: 3.8156, 4: 4.5788, 8: 6.5266, 16: 10.5621, 32: 18.405, 64: 57.3602},
}


def test_one_lost_bucket_moves_the_constants():
    """The constants' plan (AMX above 4 rows, no dense) lost M = 2048 by 1.16x to dense and the sums
    differed by 1.6 % (under MIN_GAIN): the tuned plan takes dense there. With dense only 1.05x ahead at
    2048 and even at 1024 (within BUCKET_LOSS at each bucket), the constants stay."""
    def choose(times):
        return tuner.choose(W4A16, "amx", torch.bfloat16, {p: {m: t / 1e3 for m, t in v.items()} for p, v in times.items()})

    base = kplan.default_plan()
    assert kplan.path_for(base, W4A16, "amx", torch.bfloat16, 2048) == "amx"
    plan = choose(XEON_11008x4096)
    assert kplan.path_for(plan, W4A16, "amx", torch.bfloat16, 2048) == "dense"
    assert plan.dense_min_m in (1024, 2048) and plan.source == "tuned"
    assert all(kplan.path_for(plan, W4A16, "amx", torch.bfloat16, m) == kplan.path_for(base, W4A16, "amx", torch.bfloat16, m)
               for m in tuner.M_BUCKETS if m < tuner.DROP_MIN_M)  # the small buckets' paths stay the constants'
    close = {p: dict(v) for p, v in XEON_11008x4096.items()}
    close["dense"][2048] = close["amx"][2048] / 1.05
    close["dense"][1024] = close["amx"][1024]
    assert choose(close).dense_min_m == base.dense_min_m
    # one slow sample below DROP_MIN_M rows (decode at M = 2 as 1.9x its M = 1 time) moves nothing
    slow_small = {p: dict(v) for p, v in close.items()}
    slow_small["decode_bf16"][2] = 1.9 * slow_small["decode_bf16"][1]
    assert choose(slow_small) == choose(close)

def test_tuned_plan_round_trips_through_disk(tune_dir):
    ms = tuner.M_BUCKETS
    timer = fake_timer({"dense": lambda m: 9.0, "decode_bf16": lambda m: 1.0 if m <= 2 else 5.0,
                        "f32_rows": lambda m: 3.0, "panel": lambda m: 2.0 if m <= 2 else 1.0})
    plan, times = tuner.tune_shape(W4A16, "avx512", torch.bfloat16, 256, 128, 64, timer=timer)
    assert (plan.bf16_f32_min_m, plan.panel_min_m) == (4, 4)  # the first bucket where panel wins
    assert set(times["panel"]) == {str(m) for m in ms}
    key = tuning_cache.shape_key(W4A16, "avx512", torch.bfloat16, 256, 128, 64)
    tuning_cache.store(key, plan, times)
    data = json.load(open(tuning_cache.cache_path()))
    assert data["plans"][key]["panel_min_m"] == 4 and data["machine"]["threads"] == tuning_cache.threads()
    assert os.path.dirname(tuning_cache.cache_path()) == os.path.join(str(tune_dir), "tuning")
    tuning_cache.forget()
    with config.patch(tune="cached"):
        got = tuning_cache.plan_for(W4A16, "avx512", torch.bfloat16, 256, 128, 64)
    assert got.source == "cached" and got.thresholds() == plan.thresholds()
    # another thread count is another machine key: nothing cached there, the constants
    torch_threads = torch.get_num_threads()
    with config.patch(tune="cached", num_threads=torch_threads + 1):
        assert tuning_cache.plan_for(W4A16, "avx512", torch.bfloat16, 256, 128, 64).source == "default"


def test_shapes_are_timed_and_cached_under_the_machines_decode_setting(tune_dir):
    """Every candidate of a shape runs with the machine's decode setting (the one its plans carry),
    the cache entry records it, and an entry measured under another setting is not used."""
    seen = []

    def timer(path, plan, M):
        seen.append(tuple(getattr(plan, f) for f in kplan.DECODE_FIELDS))
        return 1.0

    dec = kplan.DecodeSetting(1024, 0, 1, 4096)
    plan, times = tuner.tune_shape(W4A16, "avx512", torch.bfloat16, 256, 128, 64, timer=timer, decode=dec)
    assert seen and set(seen) == {tuple(dec)}
    key = tuning_cache.shape_key(W4A16, "avx512", torch.bfloat16, 256, 128, 64)
    tuning_cache.store(key, plan, times, decode=dec)
    path = tuning_cache.cache_path()
    assert json.load(open(path))["plans"][key]["decode"] == [1024, 0, 1, 4096, 1, 1]
    assert tuning_cache._cached(path, key, dec) is not None
    assert tuning_cache._cached(path, key, kplan.DEFAULT_DECODE) is None  # measured under another setting


def test_plan_for_tunes_once_then_remembers(tune_dir, monkeypatch):
    made = []

    def fake_kernel_timer(op, isa, x_dtype, K, out_features, G):
        made.append((op.name, K, out_features, G))
        return fake_timer({p: (lambda m: 1.0) for p in kplan.candidates(op, isa, x_dtype)})

    monkeypatch.setattr(tuner, "kernel_timer", fake_kernel_timer)
    for _ in range(3):
        tuning_cache.plan_for(W4A16, "avx512", torch.float32, 256, 128, 64)
    assert made == [("int4_mm", 256, 128, 64)]
    tuning_cache.forget()
    tuning_cache.plan_for(W4A16, "avx512", torch.float32, 256, 128, 64)  # from disk, not measured again
    assert len(made) == 1
    with config.patch(tune="off"):
        assert tuning_cache.plan_for(W4A16, "avx512", torch.float32, 256, 64, 64).source == "default"
    with config.patch(kernel_plan={"panel_min_m": 2}):
        forced = tuning_cache.plan_for(W4A16, "avx512", torch.float32, 256, 128, 64)
    assert forced.source == "forced" and forced.panel_min_m == 2 and forced.amx_min_m == config.amx_min_m
    assert len(made) == 1


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="tune: expected one of"):
        with config.patch(tune="sometimes"):
            pass
    with pytest.raises(ValueError, match="kernel_plan: expected keys among"):
        kplan.forced_plan({"amx_rows": 3})
    with pytest.raises(ValueError, match="--shapes: expected KxN"):
        tuning_cache.parse_shapes("4096by4096", 128)


def test_forced_dense_plan_runs_the_dense_path(monkeypatch):
    q, z, s = random_canonical(96, 256, 64)
    lin = AWQLinear.from_canonical(q, z, s, torch.randn(96), group_size=64)
    x = torch.randn(5, 256)
    calls = []
    real = dense.dense_call
    monkeypatch.setattr(dense, "dense_call", lambda *a: calls.append(1) or real(*a))
    want = x @ lin.dequantize().t() + lin.bias
    torch.testing.assert_close(lin(x), want, rtol=1e-4, atol=1e-3)
    assert calls == []
    with config.patch(kernel_plan={"dense_min_m": 4}):
        torch.testing.assert_close(lin(x), want, rtol=1e-4, atol=1e-3)
        assert calls == [1]
        lin(x[:3])  # below dense_min_m: the C++ kernel
        assert calls == [1]


def test_model_shapes_of_llama7b():
    cfg = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
           "num_key_value_heads": 32, "quantization_config": {"group_size": 128}}
    shapes = tuning_cache.model_shapes(cfg)
    assert [(s.op.name, s.K, s.out_features, s.G) for s in shapes] == [
        ("int4_mm", 4096, 12288, 128), ("int4_mm", 4096, 4096, 128),
        ("int4_mm_silu_mul", 4096, 11008, 128), ("int4_mm", 11008, 4096, 128)]
    with pytest.raises(ValueError, match="missing 'intermediate_size'"):
        tuning_cache.model_shapes({"hidden_size": 64, "num_attention_heads": 4})


def test_model_shapes_of_qwen3_moe_include_the_experts_plans():
    """The shapes moe.expert_plans looks up (gate|up K=H, N=2I; down K=I, N=H) are listed, so
    ``tune --model`` fills the experts' plans too; the dense MLP's only when a layer is dense."""
    from awq_inductor.ops import moe
    from awq_inductor.schemes import MOE_OPS

    cfg = {"hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "num_hidden_layers": 48, "quantization_config": {"group_size": 128}}
    got = {(s.op.name, s.K, s.out_features, s.G) for s in tuning_cache.model_shapes(cfg)}
    mop = MOE_OPS["int4_moe"]
    looked_up = []
    orig = tuning_cache.plan_for
    try:
        tuning_cache.plan_for = lambda op, isa, dt, K, n, G: looked_up.append((op.name, K, n, G)) or kplan.default_plan()
        moe.expert_plans(mop, "avx512", torch.bfloat16, 2048, 768, 128)
    finally:
        tuning_cache.plan_for = orig
    assert looked_up and set(looked_up) <= got, (looked_up, got)
    # Qwen3-30B-A3B: every layer sparse, intermediate_size 6144 runs nowhere
    assert ("int4_mm_silu_mul", 2048, 6144, 128) not in got
    dense0 = {(s.op.name, s.K, s.out_features) for s in tuning_cache.model_shapes({**cfg, "mlp_only_layers": [0]})}
    assert ("int4_mm_silu_mul", 2048, 6144) in dense0 and ("int4_mm", 6144, 2048) in dense0


#: tiny configs whose sizes all differ (so a shape derived from the wrong key cannot match by luck)
_SHAPE_CASES = {
    "deepseek_v3": dict(intermediate_size=192, q_lora_rank=96, kv_lora_rank=64, qk_rope_head_dim=16,
                        qk_nope_head_dim=32, v_head_dim=24, n_shared_experts=2, moe_intermediate_size=32),
    "deepseek_v3_no_q_lora": dict(intermediate_size=192, q_lora_rank=None, kv_lora_rank=64, qk_rope_head_dim=16,
                                  qk_nope_head_dim=32, v_head_dim=24, n_shared_experts=1, moe_intermediate_size=32),
    "glm4_moe": dict(intermediate_size=192, n_shared_experts=2, moe_intermediate_size=32, head_dim=24),
    "olmoe": dict(intermediate_size=96),
}


@pytest.mark.parametrize("case", sorted(_SHAPE_CASES))
def test_model_shapes_equal_the_loaded_models_int4_modules(tmp_path, case):
    """``model_shapes(config.json)`` (``tune --model``) lists exactly the shapes the loaded model's
    int4 modules run (``op_shapes``, what tune-at-load measures): MLA, dense layers, experts, shared experts."""
    import json

    import transformers

    from awq_inductor import testing
    from awq_inductor.integrations.transformers import patch_transformers
    from awq_inductor.transform.model_pass import op_shapes

    arch = case.replace("_no_q_lora", "")
    patch_transformers()
    model = testing.build_float_model(testing.tiny_config(arch, **_SHAPE_CASES[case]))
    testing.save_quantized(model, str(tmp_path), format="gemm", group_size=16)
    with open(tmp_path / "config.json") as f:
        cfg = json.load(f)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    have = {(s.op.name, s.K, s.out_features, s.G) for s in op_shapes(loaded)}
    want = {(s.op.name, s.K, s.out_features, s.G) for s in tuning_cache.model_shapes(cfg)}
    assert have and want == have, f"config.json lists extra {sorted(want - have)}, misses {sorted(have - want)}"


def test_tune_cli_measures_real_kernels(tune_dir, capsys):
    """The CLI on a small shape: real kernels timed, the plan cached for this machine."""
    from awq_inductor.__main__ import main

    assert main(["tune", "--shapes", "256x128", "--group-size", "64", "--dtype", "float32", "--no-header"]) == 0
    out = capsys.readouterr().out
    assert "tuned 1 shape(s)" in out and "int4_mm K=256 N=128 G=64" in out and "header" not in out
    data = json.load(open(tuning_cache.cache_path()))
    (key, entry), = data["plans"].items()
    assert key.startswith("int4_mm/") and key.endswith("/float32/K256/N128/G64")
    assert set(entry["times_ms"]) >= {"dense", "f32_rows"} and entry["times_ms"]["dense"]["1"] > 0


def test_tune_cli_precompiles_the_graph_header(tune_dir, capsys, monkeypatch):
    """Without --no-header the CLI also builds the compiled graphs' precompiled header (the build
    itself: tests/test_graph_library.py) and says where."""
    from awq_inductor.__main__ import main
    from awq_inductor.inductor import lowering

    built = []
    monkeypatch.setattr(lowering, "build_graph_library_header", lambda: built.append(1) or "/c/pch/k/awq_prefix.h.gch")
    assert main(["tune", "--shapes", "256x128", "--group-size", "64", "--dtype", "float32"]) == 0
    assert built == [1] and "precompiled header in " in capsys.readouterr().out


def _compiled_code(lin, x):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    fn = torch.compile(lin, backend="awq_inductor")
    _, codes = run_and_get_code(fn, x)
    return "\n".join(codes)


@pytest.mark.parametrize("winner,literal", [
    ("decode_bf16", f"        {config.amx_min_m}, {NEVER}, {NEVER}, 512, 1, 1, 4096, 1, 1,  // plan: tuned"),
    ("panel", f"        {config.amx_min_m}, 1, 1, 512, 1, 1, 4096, 1, 1,  // plan: tuned"),
])
def test_generated_code_dispatches_to_the_faster_candidate(tune_dir, monkeypatch, inductor_clean, winner, literal):
    """Two candidate timings forced: the compiled kernel's thresholds select the faster one (and
    carry the machine's decode setting, measured as 512 bytes, the next tile, int16 x and 4 KB into L2
    here)."""
    def fake_kernel_timer(op, isa, x_dtype, K, out_features, G):
        return fake_timer({p: (lambda m, p=p: 1.0 if p == winner else 2.0)
                           for p in kplan.candidates(op, isa, x_dtype)})

    monkeypatch.setattr(tuner, "kernel_timer", fake_kernel_timer)
    monkeypatch.setattr(tuner, "tune_decode_setting", lambda isa, scheme: (kplan.DecodeSetting(512, 1, 1, 4096), {}))
    monkeypatch.setattr(tuner, "RESIDENT_MAX_BYTES", 0)  # this small weight counts as streamed: its setting is measured
    q, z, s = random_canonical(128, 256, 64)
    lin = AWQLinear.from_canonical(q, z, s, group_size=64)
    x = torch.randn(3, 256).to(torch.bfloat16)
    with config.patch(force_isa="avx512"):
        code = _compiled_code(lin, x)
        plan = tuning_cache.plan_for(W4A16, "avx512", torch.bfloat16, 256, 128, 64)
    assert literal in code and "// plan: tuned" in code
    assert kplan.path_for(plan, W4A16, "avx512", torch.bfloat16, 3) == winner
    torch.testing.assert_close(lin(x).float(), x.float() @ lin.dequantize().t(), rtol=2e-2, atol=2e-2)


def test_fx_cache_key_follows_the_tuning_cache(tune_dir):
    """A retune changes the FX cache key: code generated for the old plan is never reused."""
    from awq_inductor import inductor
    from awq_inductor.inductor import lowering

    assert inductor.register()
    before = lowering.cache_uuid()
    assert lowering.cache_uuid() == before
    key = tuning_cache.shape_key(W4A16, "avx512", torch.bfloat16, 256, 128, 64)
    tuning_cache.store(key, kplan.Plan(5, 8, 3, source="tuned"), {})
    first = lowering.cache_uuid()
    assert first != before
    tuning_cache.store(key, kplan.Plan(5, 16, 3, source="tuned"), {})
    assert lowering.cache_uuid() not in (before, first)


def test_backend_tunes_before_inductor_computes_its_cache_key(tune_dir, monkeypatch, inductor_clean):
    """backend="awq_inductor" measures the graph's shapes first, so the FX key of the first compile
    already covers the plan (the next process hits that cache entry)."""
    from awq_inductor.inductor import lowering

    seen = {}
    real = lowering.compile_with_inductor

    def spy(gm, example_inputs, patches, *behind):
        seen["plans"] = json.load(open(tuning_cache.cache_path()))["plans"] if os.path.exists(tuning_cache.cache_path()) else {}
        return real(gm, example_inputs, patches, *behind)

    monkeypatch.setattr(lowering, "compile_with_inductor", spy)
    monkeypatch.setattr(tuner, "kernel_timer", lambda op, isa, dt, K, n, G: fake_timer(
        {p: (lambda m: 1.0) for p in kplan.candidates(op, isa, dt)}))
    q, z, s = random_canonical(64, 128, 64)
    lin = AWQLinear.from_canonical(q, z, s, group_size=64)
    with config.patch(force_isa="avx512"):
        _compiled_code(lin, torch.randn(2, 128))
    assert list(seen["plans"]) == [tuning_cache.shape_key(W4A16, "avx512", torch.float32, 128, 64, 64)]


def test_unrepeatable_timings_keep_the_constants(tune_dir, monkeypatch):
    """A busy machine (every second timing 3x off) must not write a measured plan that would stay
    for good: the constants are cached, marked noisy."""
    flip = iter(range(10 ** 6))
    noisy = fake_timer({p: (lambda m: 1.0 if next(flip) % 2 else 3.0) for p in ("dense", "f32_rows", "panel")})
    monkeypatch.setattr(tuner, "kernel_timer", lambda *a: noisy)
    plan = tuning_cache.plan_for(W4A16, "avx512", torch.float32, 256, 128, 64)
    assert plan.source == "noisy" and plan.thresholds() == kplan.default_plan().thresholds()
    (entry,) = json.load(open(tuning_cache.cache_path()))["plans"].values()
    assert entry["noisy"] is True and entry["panel_min_m"] == config.panel_min_m
    tuning_cache.forget()  # a later process: the constants from the cache, no measuring
    monkeypatch.setattr(tuner, "kernel_timer", lambda *a: pytest.fail("measured again"))
    assert tuning_cache.plan_for(W4A16, "avx512", torch.float32, 256, 128, 64).thresholds() == plan.thresholds()
    with pytest.raises(pytest.fail.Exception, match="measured again"):  # the tune command does
        tuning_cache.tune_shapes(tuning_cache.parse_shapes("256x128", 64), torch.float32, isa="avx512", show=False)


def test_kernel_timer_times_the_full_call_only(monkeypatch):
    """A fake kernel that sleeps 1 us per column: at decode, mid and large M the timer returns one
    full-size call; making x (slow here) is not in the timed region (torch.randn(2048, 4096) inside
    it once added ~30 ms per call)."""
    from awq_inductor.kernels import native

    def fake_kernel(x, qweight, scales, zeros, bias, G, n, plan=None):
        time.sleep(n * 1e-6)

    real_randn = torch.randn

    def slow_randn(*a, **k):
        time.sleep(0.05)
        return real_randn(*a, **k)

    monkeypatch.setattr(native, "get_kernel", lambda *a, **k: fake_kernel)
    monkeypatch.setattr(tuner, "cold_bytes", lambda: 8 << 20)
    monkeypatch.setattr(torch, "randn", slow_randn)
    op = OPS["int4_mm"]
    N = 8192
    timer = tuner.kernel_timer(op, "avx512", torch.bfloat16, 256, N, 128)
    plan = kplan.candidates(op, "avx512", torch.bfloat16)["panel"]
    for M in (1, 64, 1024):
        t = timer("panel", plan, M)
        assert N * 1e-6 <= t < N * 1e-6 + 0.02, (M, t)


@pytest.mark.skipif(not __import__("awq_inductor.kernels.isa", fromlist=["x"]).select().avx512_bf16,
                    reason="plans are the constants without AVX512-BF16 (nothing to tune)")
def test_plans_are_measured_at_load_never_inside_the_first_generate(tune_dir, monkeypatch, tmp_path):
    """from_pretrained (convert) measures each distinct op shape once, behind one progress bar; the
    lookups the first compiled call makes (backend.tune_graph, the lowering, the eager op: all
    ``tuning_cache.plan_for``) then measure nothing (no tuning, no log line inside streamed text)."""
    transformers = pytest.importorskip("transformers")
    from awq_inductor import patch_transformers, testing
    from awq_inductor.kernels import isa as isa_mod
    from awq_inductor.transform import op_shapes

    calls = []

    def fake_tune_shape(op, isa, x_dtype, K, N, G, *a, **k):
        calls.append((op.name, K, N, G))
        return dataclasses.replace(kplan.default_plan(), source="tuned"), {}

    monkeypatch.setattr(tuner, "tune_shape", fake_tune_shape)
    cfg = testing.tiny_config("llama", num_hidden_layers=2)
    testing.save_quantized(testing.build_float_model(cfg), str(tmp_path / "ckpt"), format="gemm", group_size=32)
    patch_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.bfloat16).eval()
    # qkv, o, gate|up (+ SiLU), down: 4 distinct shapes, each measured once for both layers
    assert len(calls) == len(set(calls)) == 4, calls
    assert len(json.loads(open(tuning_cache.cache_path()).read())["plans"]) == 4
    tuning_cache.forget()  # a later process: plans come from the cache file
    for s in op_shapes(model):
        plan = tuning_cache.plan_for(s.op, isa_mod.select(), torch.bfloat16, s.K, s.out_features, s.G)
        assert plan.source == "cached"
    assert len(calls) == 4  # nothing measured after load


def test_decode_setting_is_measured_once_per_machine_and_reaches_the_plans(tune_dir):
    """The decode kernels' setting (prefetch distances, next tile, int16 x) is a machine measurement:
    chosen where it is clearly faster, cached beside the plans, carried by every bf16 plan (never by
    fp32 ones), part of the cache file (so of the FX key through cache_digest), the constants under
    tune="off", and measured again where the cache holds an entry from before the int16 x or the L2
    distance choice."""
    from awq_inductor.kernels import isa as isa_mod

    isa = isa_mod.select()
    DP = kplan.DecodeSetting
    fast = {pf: 3.0 - 0.5 * (pf.distance == 1024) - 1.0 * pf.next_tile - 0.3 * pf.int16_x for pf in tuner.DECODE_CANDIDATES}
    fast.update({pf._replace(k_streams=2): t for pf, t in list(fast.items())})  # two K streams: no gain here
    calls = []

    def timer(pf, threads):
        calls.append((pf, threads))
        return fast[pf] * 1e-3

    assert tuner.tune_decode_setting(isa, W4A16.scheme, timer)[0] == DP(1024, 1, 1)
    assert len(calls) == len(tuner.decode_candidates(W4A16.scheme)) * tuner.DECODE_ROUNDS * len(tuner.decode_regimes())
    assert {t for _, t in calls} == set(tuner.decode_regimes())
    assert DP(0, 1) in tuner.DECODE_CANDIDATES and DP(2048, 0) in tuner.DECODE_CANDIDATES
    assert {pf._replace(int16_x=1) for pf in tuner.DECODE_CANDIDATES} <= set(tuner.DECODE_CANDIDATES)
    # the L2 distance: picked where it is clearly faster, carried through the plan into Thresholds
    l2 = tuner.tune_decode_setting(isa, W4A16.scheme, lambda pf, t: (fast[pf] - 0.4 * bool(pf.l2_distance)) * 1e-3)[0]
    assert l2 == DP(1024, 1, 1, tuner.DECODE_L2_DISTANCE)
    assert kplan.Plan(5, 8, 9).with_decode(l2).cxx_args()[-6:-1] == (1024, 1, 1, tuner.DECODE_L2_DISTANCE, 1)
    # int16 x alone, without a prefetch: chosen where it is clearly faster
    assert tuner.tune_decode_setting(isa, W4A16.scheme, lambda pf, t: (1.0 - 0.2 * pf.int16_x) * 1e-3)[0] == DP(0, 0, 1)
    # ... and not where it is a hair faster than the same prefetch on bf16 x (whose products are exact)
    near = tuner.tune_decode_setting(isa, W4A16.scheme,
                                     lambda pf, t: (fast[pf] + 0.3 * pf.int16_x - 0.02 * pf.int16_x) * 1e-3)[0]
    assert near == DP(1024, 1, 0)
    flat = {pf: 1.0 for pf in fast}
    assert tuner.tune_decode_setting(isa, W4A16.scheme, lambda pf, t: flat[pf] * 1e-3)[0] == kplan.DEFAULT_DECODE  # no gain: none
    # by median a setting is 2x faster, but it beats none in 1 round of 5 (the rounds disagree): not trusted
    n, regimes = len(tuner.decode_candidates(W4A16.scheme)), len(tuner.decode_regimes())
    rounds = iter(([1.0] + [2.0] * (n - 1)) * 2 * regimes + ([1.0] + [0.5] * (n - 1)) * regimes
                  + ([0.1] + [0.5] * (n - 1)) * 2 * regimes)
    best, times = tuner.tune_decode_setting(isa, W4A16.scheme, lambda pf, t: next(rounds))
    assert best == kplan.DEFAULT_DECODE and times["noisy"] and times["512"] < times["0"]

    measured = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(tuner, "tune_decode_setting",
                   lambda isa, scheme: (measured.append(isa), (DP(512, 1, 1), {"0": 2.0}))[1])
    try:
        digest = tuning_cache.cache_digest()
        assert tuning_cache.decode_setting(isa) == DP(512, 1, 1) and tuning_cache.decode_setting(isa) == DP(512, 1, 1)
        assert len(measured) == 1 and tuning_cache.cache_digest() != digest
        tuning_cache.forget()
        assert tuning_cache.decode_setting(isa) == DP(512, 1, 1) and len(measured) == 1  # from the file
        plan = kplan.Plan(5, 8, 9, source="cached")
        tuned = tuning_cache._with_machine_params(plan, W4A16.scheme, isa, torch.bfloat16)
        assert (tuned.decode_prefetch, tuned.prefetch_next_tile, tuned.decode_int16) == (512, 1, 1)
        assert tuned.cxx_args()[-6:-1] == (512, 1, 1, 0, 1)
        fp32 = tuning_cache._with_machine_params(plan, W4A16.scheme, isa, torch.float32)
        assert (fp32.decode_prefetch, fp32.prefetch_next_tile, fp32.decode_int16) == (0, 0, 0)
        # an entry written before the int16 x choice: measured again
        path = tuning_cache.cache_path()
        data = json.loads(open(path).read())
        data["machine_params"][f"decode_setting/{isa}/w4a16"] = {"bytes": 1024, "next_tile": 0, "times_ms": {}}
        open(path, "w").write(json.dumps(data))
        tuning_cache.forget()
        assert tuning_cache.decode_setting(isa) == DP(512, 1, 1) and len(measured) == 2
        # and one written before the L2 distance choice: measured again too
        data["machine_params"][f"decode_setting/{isa}/w4a16"] = {"bytes": 1024, "next_tile": 0, "int16_x": 1,
                                                                 "times_ms": {}}
        open(path, "w").write(json.dumps(data))
        tuning_cache.forget()
        assert tuning_cache.decode_setting(isa) == DP(512, 1, 1) and len(measured) == 3
        # and one timed at the kernels' threads alone (before tuner.decode_regimes): measured again too
        data["machine_params"][f"decode_setting/{isa}/w4a16"] = {"bytes": 0, "next_tile": 0, "int16_x": 0,
                                                                 "l2_bytes": 0, "times_ms": {}}
        open(path, "w").write(json.dumps(data))
        tuning_cache.forget()
        assert tuning_cache.decode_setting(isa) == DP(512, 1, 1) and len(measured) == 4
        entry = json.loads(open(path).read())["machine_params"][f"decode_setting/{isa}/w4a16"]
        assert entry["regimes"] == list(tuner.decode_regimes())
        # and one from before the rows' prefetch choice: measured again too
        del entry["rows_prefetch"]
        data["machine_params"][f"decode_setting/{isa}/w4a16"] = entry
        open(path, "w").write(json.dumps(data))
        tuning_cache.forget()
        assert tuning_cache.decode_setting(isa) == DP(512, 1, 1) and len(measured) == 5
        assert json.loads(open(path).read())["machine_params"][f"decode_setting/{isa}/w4a16"]["rows_prefetch"] == 1
        with config.patch(tune="off"):
            tuning_cache.forget()
            plan = tuning_cache.plan_for(OPS["int4_mm"], isa, torch.bfloat16, 256, 64, 64)
            assert (plan.decode_prefetch, plan.prefetch_next_tile, plan.decode_int16) == (0, 0, 0)
    finally:
        monkey.undo()


def test_two_k_streams_are_candidates_where_the_one_row_kernels_split():
    """Two K streams per tile (DecodeSetting.k_streams) are candidates of the M = 1 race beside every
    setting of a scheme whose one-row kernels split (Scheme.two_k_streams: W4A16 on bf16 and int16 x,
    W4A8); chosen where fastest in every regime, and carried into the Thresholds."""
    from awq_inductor.kernels import isa as isa_mod

    isa = isa_mod.select()
    DP = kplan.DecodeSetting
    for scheme in (W4A16.scheme, W4A8.scheme):
        cands = tuner.decode_candidates(scheme)
        one = [pf for pf in cands if pf.k_streams == 1]
        assert scheme.two_k_streams and [pf for pf in cands if pf.k_streams == 2] == [pf._replace(k_streams=2) for pf in one]
    base = {pf: 3.0 - 1.0 * (pf.distance == 2048) - 0.3 * pf.int16_x for pf in tuner.DECODE_CANDIDATES}

    def timer_with(k2_factor):  # k2_factor(threads): two streams' time over one stream's
        return lambda pf, t: base[pf._replace(k_streams=1)] * (k2_factor(t) if pf.k_streams == 2 else 1.0) * 1e-3

    best, times = tuner.tune_decode_setting(isa, W4A16.scheme, timer_with(lambda t: 0.9))
    assert best == DP(2048, 0, 1, k_streams=2) and times["2048+int16+k2"] == pytest.approx(1.53)
    assert kplan.Plan(5, 8, 9).with_decode(best).cxx_args()[-1] == 2
    regimes = tuner.decode_regimes()
    if len(regimes) > 1:  # slower at one thread: its worst ratio over the regimes loses
        best = tuner.tune_decode_setting(isa, W4A16.scheme, timer_with(lambda t: 0.9 if t == regimes[0] else 1.2))[0]
        assert best == DP(2048, 0, 1)
    assert tuner.tune_decode_setting(isa, W4A8.scheme, timer_with(lambda t: 0.9))[0] == DP(2048, 0, 0, k_streams=2)
    assert tuner.tune_decode_setting(isa, W4A8.scheme, timer_with(lambda t: 1.1))[0] == DP(2048, 0, 0)


def test_calls_of_many_rows_keep_their_prefetch_unless_off_is_clearly_faster():
    """Calls of 5 rows or more prefetch with the rows' setting (rows_prefetch) unless, timed at ROWS_TIMED
    rows and the kernels' threads, without it is MIN_GAIN faster by median and in most rounds; the
    M = 1 choice is made first and kept; the choice reaches Thresholds' last field."""
    from awq_inductor.kernels import isa as isa_mod

    isa, DP = isa_mod.select(), kplan.DecodeSetting
    one_row = lambda pf, t: (1.0 - 0.5 * (pf == DP(1024, 1))) * 1e-3  # noqa: E731
    rows_calls = []

    def rows(off_ms, on_ms):
        def timer(pf, threads):
            rows_calls.append(threads)
            return (on_ms if pf.rows_prefetch else off_ms) * 1e-3
        return timer

    best, times = tuner.tune_decode_setting(isa, W4A8.scheme, one_row, rows(2.0, 1.5))
    assert best == DP(1024, 1, 0, 0, 1) and times["rows8"] == 2.0 and times["rows8+prefetch"] == 1.5
    assert len(rows_calls) == 2 * tuner.DECODE_ROUNDS and set(rows_calls) == {config.threads()}
    best = tuner.tune_decode_setting(isa, W4A8.scheme, one_row, rows(1.5, 2.0))[0]
    assert best == DP(1024, 1, 0, 0, 0) and kplan.Plan(5, 8, 9).with_decode(best).cxx_args()[-2] == 0
    assert tuner.setting_name(best) == "1024+next_tile+no_rows_prefetch"
    assert tuner.tune_decode_setting(isa, W4A8.scheme, one_row, rows(1.0, 1.02))[0].rows_prefetch == 1  # within noise
    # off faster by median (2 against 3 ms) but in 2 rounds of 5 only: kept on (on, off timed in turn)
    seq = iter([3.0, 1.0, 3.0, 1.0, 3.0, 4.0, 1.0, 4.0, 1.0, 2.0])
    best, times = tuner.tune_decode_setting(isa, W4A8.scheme, one_row, lambda pf, t: next(seq) * 1e-3)
    assert best.rows_prefetch == 1 and times["rows8"] == 2.0 and times["rows8+prefetch"] == 3.0


def test_int16_x_is_taken_for_the_rows_where_one_row_ties():
    """Where int16 x ties bf16 x at M = 1 (within MIN_GAIN) the rows decide: int16 x when ROWS_TIMED rows
    run ROWS_INT16_GAIN faster with it (the AMX Xeon: 0.37 against 0.82 ms); bf16 x when they tie, or
    when int16 x loses at M = 1 (the rows are then not timed for it); never for a scheme without int16 x."""
    from awq_inductor.kernels import isa as isa_mod

    isa = isa_mod.select()
    # 2048 B prefetch best on bf16 x; its int16 x variant 2 % faster (a tie), every other setting slower
    one_row = lambda pf, t: {(2048, 0, 0): 1.0, (2048, 0, 1): 0.98}.get(tuple(pf[:3]), 2.0) * 1e-3  # noqa: E731
    asked = []

    def rows(bf16_ms, int16_ms):
        def timer(pf, threads):
            asked.append(pf.int16_x)
            return (int16_ms if pf.int16_x else bf16_ms) * 1e-3
        return timer

    best, times = tuner.tune_decode_setting(isa, W4A16.scheme, one_row, rows(0.82, 0.37))
    assert best[:4] == (2048, 0, 1, 0) and times["rows8/bf16_x"] == 0.82 and times["rows8/int16_x"] == 0.37
    assert tuner.tune_decode_setting(isa, W4A16.scheme, one_row, rows(0.82, 0.80))[0].int16_x == 0  # rows tie
    slower = lambda pf, t: {(2048, 0, 0): 1.0, (2048, 0, 1): 1.05}.get(tuple(pf[:3]), 2.0) * 1e-3  # noqa: E731
    asked.clear()
    best, times = tuner.tune_decode_setting(isa, W4A16.scheme, slower, rows(0.82, 0.37))
    assert best.int16_x == 0 and "rows8/int16_x" not in times and 1 not in asked
    assert tuner.tune_decode_setting(isa, W4A8.scheme, one_row, rows(0.82, 0.37))[0].int16_x == 0


def test_decode_setting_is_chosen_over_the_thread_regimes():
    """The decode setting is timed at the kernels' threads and at one (a core streaming alone, as on a
    machine whose memory outruns its cores): the choice has the least worst ratio to the fastest over
    both. So a setting that ties with no prefetch at the kernels' threads and is 1.2x faster alone is
    taken; one 1.1x faster at the kernels' threads but 1.5x slower alone is not."""
    from awq_inductor.kernels import isa as isa_mod

    isa, DP = isa_mod.select(), kplan.DecodeSetting
    alone, together = DP(512, 1, 0, tuner.DECODE_L2_DISTANCE), DP(2048, 0)

    def timer(pf, threads):
        return ({together: 0.9}.get(pf, 1.0) if threads == 2 else {alone: 1.0, together: 1.5}.get(pf, 1.2)) * 1e-3

    with config.patch(num_threads=2):
        assert tuner.decode_regimes() == (2, 1)
        best, times = tuner.tune_decode_setting(isa, W4A16.scheme, timer)
    assert best == alone and not times["noisy"]
    assert times["2048"] == 0.9 and times["2048@1t"] == 1.5 and times["512+next_tile+l2_4096@1t"] == 1.0
    # int16 x 1.25x faster alone but 1.02x slower at the kernels' threads: the same prefetch on bf16 x
    with config.patch(num_threads=2):
        best = tuner.tune_decode_setting(isa, W4A16.scheme,
                                         lambda pf, t: timer(pf._replace(int16_x=0), t) * (1.02 if t == 2 else 0.8)
                                         ** pf.int16_x)[0]
    assert best == alone
    with config.patch(num_threads=1):  # one thread: one regime
        assert tuner.decode_regimes() == (1,)
        assert tuner.tune_decode_setting(isa, W4A16.scheme, lambda pf, t: (0.5 if pf == together else 1.0) * 1e-3
                                         )[0] == together


def test_each_scheme_has_its_own_decode_setting(tune_dir, monkeypatch):
    """W4A16 and W4A8 decode kernels are tuned apart (their loops want other prefetch streams): each
    scheme's setting is measured once, cached under its own name, and carried by that scheme's plans
    only; W4A8, which has no int16 x choice, is never timed with one."""
    from awq_inductor.kernels import isa as isa_mod

    isa, DP = isa_mod.select(), kplan.DecodeSetting
    assert all(not pf.int16_x for pf in tuner.decode_candidates(W4A8.scheme))
    a16 = set(tuner.decode_candidates(W4A16.scheme))
    assert a16 == set(tuner.DECODE_CANDIDATES) | {pf._replace(k_streams=2) for pf in tuner.DECODE_CANDIDATES}
    timed = {}

    def timer_for(scheme):
        best = DP(2048, 0, 1) if scheme is W4A16.scheme else DP(1024, 1, 0)
        return lambda pf, t: (timed.setdefault(scheme.name, set()).add(pf), 0.5e-3 if pf == best else 1e-3)[1]

    real = tuner.tune_decode_setting
    monkeypatch.setattr(tuner, "tune_decode_setting", lambda isa, scheme: real(isa, scheme, timer_for(scheme)))
    assert tuning_cache.decode_setting(isa, W4A8.scheme) == DP(1024, 1, 0)
    assert tuning_cache.decode_setting(isa, W4A16.scheme) == DP(2048, 0, 1)
    assert timed["w4a8"] == set(tuner.decode_candidates(W4A8.scheme))
    params = json.loads(open(tuning_cache.cache_path()).read())["machine_params"]
    assert {f"decode_setting/{isa}/w4a16", f"decode_setting/{isa}/w4a8"} <= set(params)
    tuning_cache.forget()
    monkeypatch.setattr(tuner, "tune_decode_setting", lambda isa, scheme: pytest.fail("measured again"))
    plan = kplan.Plan(5, 8, 9, source="cached")
    a8 = tuning_cache._with_machine_params(plan, W4A8.scheme, isa, torch.bfloat16)
    a16 = tuning_cache._with_machine_params(plan, W4A16.scheme, isa, torch.bfloat16)
    assert a8.cxx_args()[-6:-1] == (1024, 1, 0, 0, 1) and a16.cxx_args()[-6:-1] == (2048, 0, 1, 0, 1)


@pytest.mark.parametrize("l3,want", [(32 << 20, 96 << 20), (8 << 20, 64 << 20), (480 << 20, 256 << 20),
                                     (None, 256 << 20)])
def test_cold_rotation_is_three_last_level_caches_within_bounds(monkeypatch, l3, want):
    """Cold measurements rotate through 3x the L3s (evicted between uses), 64-256 MiB; 256 MiB where
    sysfs does not say."""
    monkeypatch.setattr(tuner, "last_level_cache_bytes", lambda: l3)
    assert tuner.cold_bytes() == want


def test_last_level_cache_bytes_reads_this_machine():
    got = tuner.last_level_cache_bytes()
    if got is None:
        pytest.skip("sysfs lists no level-3 cache here")
    assert (1 << 20) <= got <= (4 << 30), got


def test_kernel_timer_reads_cold_full_weights_at_every_m(monkeypatch):
    """Every timed call is a full-size call on another copy of the packed weight (cold_bytes() in
    rotation: read from DRAM, as decode and prefill read each layer), at decode, mid and large M;
    the dense candidate too (its one untimed first call included)."""
    from awq_inductor.kernels import dense, native

    seen = {}

    def fake_kernel(x, qweight, scales, zeros, bias, G, n, plan=None):
        seen.setdefault(x.shape[0], []).append((qweight.data_ptr(), n))

    monkeypatch.setattr(native, "get_kernel", lambda *a, **k: fake_kernel)
    monkeypatch.setattr(dense, "dense_call", lambda op, x, qweight, *a: fake_kernel(x, qweight, *a))
    monkeypatch.setattr(tuner, "cold_bytes", lambda: 64 << 20)
    op = OPS["int4_mm"]
    timer = tuner.kernel_timer(op, "avx512", torch.bfloat16, 1024, 4096, 128)
    cands = kplan.candidates(op, "avx512", torch.bfloat16)
    for M in (1, 32, 64, 512):
        timer("decode_bf16", cands["decode_bf16"], M)
    timer("dense", cands["dense"], 2048)
    for M in (1, 32, 64, 512, 2048):
        ptrs = [p for p, _ in seen[M]]
        assert len(set(ptrs)) == len(ptrs) >= 2 and {n for _, n in seen[M]} == {4096}, M  # a new copy every call


def _measuring_setup(monkeypatch, setting):
    """Where the tuner measures natively: every candidate timed equal, the decode setting measured
    as ``setting``; returns (isa, the schemes whose setting was measured, in order)."""
    from awq_inductor.kernels import isa as isa_mod, native

    isa = isa_mod.select()
    if not isa.avx512_bf16 or native.emulated(isa):
        pytest.skip("the tuner measures only where the AVX512-BF16 kernels run natively")
    measured = []
    monkeypatch.setattr(tuner, "tune_decode_setting",
                        lambda isa, scheme: (measured.append(scheme.name), (setting, {}))[1])
    monkeypatch.setattr(tuner, "kernel_timer", lambda *a: fake_timer(dict.fromkeys(
        kplan.candidates(W4A16, isa, torch.bfloat16), lambda m: 1.0)))
    return isa, measured


def test_the_decode_setting_is_measured_only_for_streamed_weights(tune_dir, monkeypatch):
    """Weights that stay in cache (a tiny model, a small shape alone) keep the constants' decode
    setting and never wait for its measurement, at load or at code generation; a model whose int4
    weights stream from DRAM measures it once, at load, and its plans (and later lookups of small
    shapes) carry it."""
    isa, measured = _measuring_setup(monkeypatch, kplan.DecodeSetting(1024, 0, 1, 0))
    small = tuning_cache.Shape(W4A16, 256, 128, 64)
    assert small.weight_bytes == 256 * 128 // 2 and not tuner.streams_weights(small.weight_bytes)
    assert tuner.streams_weights(tuner.RESIDENT_MAX_BYTES + 1)
    assert tuning_cache.tune_missing([small], torch.bfloat16, show=False) == 1 and measured == []
    plan = tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64)
    assert plan.cxx_args()[-6:] == tuple(kplan.DEFAULT_DECODE) and measured == []
    entry = json.load(open(tuning_cache.cache_path()))["plans"][small.key(isa, torch.bfloat16)]
    assert entry["decode"] == list(kplan.DEFAULT_DECODE)
    assert tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 64, 64).cxx_args()[-6:] == tuple(kplan.DEFAULT_DECODE)
    assert measured == []  # code generation for another small shape did not measure it either

    tuning_cache.forget()  # a later process loads a model of 64 MiB of int4 weights with the same shape
    assert tuning_cache.tune_missing([small], torch.bfloat16, show=False, weight_bytes=64 << 20) == 1
    assert measured == ["w4a16"]  # measured once, and the shape measured again under it
    assert tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64).cxx_args()[-6:-1] == (1024, 0, 1, 0, 1)
    tuning_cache.forget()  # from now on every plan carries the cached setting, small or not, never measured again
    assert tuning_cache.tune_missing([small], torch.bfloat16, show=False) == 0
    assert tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 64, 64).cxx_args()[-6:-1] == (1024, 0, 1, 0, 1)
    assert measured == ["w4a16"]


def test_a_large_shape_measures_the_decode_setting_where_it_is_generated(tune_dir, monkeypatch):
    """A shape whose weight alone streams (code generated without a load-time tuning, e.g. a module
    built by hand) measures the machine's decode setting when its plan is first asked for."""
    isa, measured = _measuring_setup(monkeypatch, kplan.DecodeSetting(512, 1, 0, 0))
    monkeypatch.setattr(tuner, "RESIDENT_MAX_BYTES", 256 * 128 // 2 - 1)
    assert tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64).cxx_args()[-6:-1] == (512, 1, 0, 0, 1)
    assert measured == ["w4a16"]


def test_a_plan_timed_under_the_constants_setting_is_timed_again_once_the_machines_is_measured(tune_dir, monkeypatch):
    """A small shape asked first (its weight stays in cache: timed under the constants' decode
    setting), then a large one (measures the machine's setting): asked again, the small shape is
    timed again under the machine's setting, never its remembered thresholds with the new setting
    (on the AMX Xeon such a plan sent M = 2 of 4096 x 4096 to the fp32 rows at 2.3x the time)."""
    isa, measured = _measuring_setup(monkeypatch, kplan.DecodeSetting(2048, 0, 1, 0))
    ran_with = []

    def timer_for(*_):
        def timer(path, plan, M):
            ran_with.append(tuple(getattr(plan, f) for f in kplan.DECODE_FIELDS))
            return 1.0
        return timer

    monkeypatch.setattr(tuner, "kernel_timer", timer_for)
    monkeypatch.setattr(tuner, "RESIDENT_MAX_BYTES", 256 * 256 // 2 - 1)  # 256 x 128 resident, 256 x 256 streams
    first = tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64)
    assert measured == [] and set(ran_with) == {tuple(kplan.DEFAULT_DECODE)}
    assert first.cxx_args()[-6:] == tuple(kplan.DEFAULT_DECODE)
    tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 256, 64)
    assert measured == ["w4a16"]
    ran_with.clear()
    again = tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64)
    assert ran_with and set(ran_with) == {(2048, 0, 1, 0, 1, 1)}  # timed again, under the measured setting
    assert again.cxx_args()[-6:-1] == (2048, 0, 1, 0, 1)
    key = tuning_cache.shape_key(W4A16, isa, torch.bfloat16, 256, 128, 64)
    assert json.load(open(tuning_cache.cache_path()))["plans"][key]["decode"] == [2048, 0, 1, 0, 1, 1]


def test_a_remembered_plan_is_returned_without_asking_the_caches_again(tune_dir, monkeypatch):
    """The eager op asks ``plan_for`` on every call: once a shape's plan is final, neither the
    cache-residency question (sysfs reads: 268 us a call when it ran first) nor anything else is redone."""
    isa, measured = _measuring_setup(monkeypatch, kplan.DecodeSetting(512, 1, 0, 0))
    first = tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64)
    monkeypatch.setattr(tuner, "streams_weights", lambda b: pytest.fail("asked again on a remembered plan"))
    monkeypatch.setattr(tuner, "last_level_cache_bytes", lambda: pytest.fail("sysfs read again"))
    assert tuning_cache.plan_for(W4A16, isa, torch.bfloat16, 256, 128, 64) is first
