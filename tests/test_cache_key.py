"""The FX graph cache (and the AOTAutograd cache on top of it) must never hand out a kernel built
for other code-generation settings: fresh processes share one TORCHINDUCTOR_CACHE_DIR with the
caches ON (the rest of the suite turns them off)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(r"""
    import json, re, sys
    import torch
    import torch._inductor.config as iconfig
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    import awq_inductor
    from awq_inductor import AWQLinear, config
    from awq_inductor.inductor import lowering
    import awq_inductor.inductor.backend  # noqa: F401  (registers backend="awq_inductor")

    config.tune = "off"  # the ISA keys are under test here; tests/test_tuner.py covers the plan's part
    force = sys.argv[1] if sys.argv[1] != "default" else None
    g = torch.Generator().manual_seed(0)
    N, K, G = 128, 256, 64
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = torch.rand(N, K // G, generator=g) * 0.05
    lin = AWQLinear.from_canonical(q, z, s, group_size=G)
    x = torch.randn(3, K, generator=g)
    ref = x @ lin.dequantize().t()
    result = {}
    for backend in ("awq_inductor", "inductor"):
        torch._dynamo.reset()
        counters.clear()
        with iconfig.patch(fx_graph_cache=True, fx_graph_remote_cache=False,
                           force_disable_caches=False), config.patch(force_isa=force):
            out, codes = run_and_get_code(torch.compile(lin, backend=backend), x)
            expected_isa = lowering.choose_isa()
        torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)
        code = "\n".join(codes)
        result[backend] = dict(
            fx_hit=counters["inductor"]["fxgraph_cache_hit"], fx_miss=counters["inductor"]["fxgraph_cache_miss"],
            aot_hit=counters["aot_autograd"]["autograd_cache_hit"],
            isa=sorted(set(re.findall(r"awq::int4_mm\s+isa=(\w+)", code))), expected_isa=expected_isa)
    print("RESULT " + json.dumps(result))
""")


def _run(setting: str, cache_dir) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_FX_GRAPH_CACHE="1",
               TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    r = subprocess.run([sys.executable, "-c", _SCRIPT, setting], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_fx_cache_key_covers_forced_isa(tmp_path):
    """Process 1 compiles with force_isa="portable", process 2 with the default settings, process 3
    with the default settings again, all sharing one cache dir. Process 2 must miss both caches and
    run the CPU's own ISA; process 3 must hit. For backend="awq_inductor" and plain "inductor"."""
    cache = tmp_path / "inductor_cache"
    first = _run("portable", cache)
    second = _run("default", cache)
    third = _run("default", cache)
    errors = []
    for backend in ("awq_inductor", "inductor"):
        p, d, again = first[backend], second[backend], third[backend]
        assert p["isa"] == ["portable"] and p["fx_miss"] == 1, (backend, p)
        if d["expected_isa"] == "portable":
            pytest.skip("this CPU's own ISA is the portable one: nothing to tell apart")
        if d["fx_hit"] or d["aot_hit"] or d["isa"] != [d["expected_isa"]]:
            errors.append(f"{backend}: default settings after force_isa='portable': {d}")
        if not (again["fx_hit"] + again["aot_hit"] >= 1 and again["isa"] == d["isa"]):
            errors.append(f"{backend}: identical settings did not hit the cache: {again}")
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("name,value", [("force_isa", "portable"), ("force_isa", "avx512"), ("amx_min_m", 17),
                                        ("panel_min_m", 3), ("amx_emulation", True), ("num_threads", 1)])
def test_fx_key_changes_with_every_setting(name, value):
    from awq_inductor import config
    from awq_inductor.inductor import lowering

    base = lowering.cache_uuid()
    assert lowering.cache_uuid() == base  # stable
    with config.patch(**{name: value}):
        changed = lowering.cache_uuid()
    assert changed != base, f"config.{name}={value!r} is not in the FX cache key"
    assert lowering.cache_uuid() == base


def test_fx_key_covers_new_settings_and_the_cpu(monkeypatch):
    """A tuning choice added to config later is in the key without editing cache_key.py; so are
    the CPU's features and the ISA picked from them."""
    from awq_inductor import config
    from awq_inductor.inductor import lowering
    from awq_inductor.kernels import cache_key, isa

    base = lowering.cache_uuid()
    monkeypatch.setattr(config, "future_tile_choice", 7, raising=False)
    assert "future_tile_choice" in cache_key.settings()
    assert lowering.cache_uuid() != base
    monkeypatch.delattr(config, "future_tile_choice")
    assert lowering.cache_uuid() == base
    with isa.fake_cpu(isa.CpuFeatures(avx512=True, avx512_bf16=False, amx_tile=False)):
        assert lowering.choose_isa() == "portable"
        assert lowering.cache_uuid() != base
    real_amx = isa.cpu_features().amx_tile
    # the AMX bit flipped against this host (an AMX host faking AMX would change nothing): CPUID and
    # permission say AMX (or not); Inductor's pick_vec_isa() on this host decides the rest
    with isa.fake_cpu(isa.CpuFeatures(avx512=True, avx512_bf16=True, amx_tile=not real_amx),
                      amx_permission=not real_amx):
        assert lowering.cache_uuid() != base


def test_plain_inductor_gets_the_key_pass():
    """backend="inductor" installs no pass of ours: the key rides on Inductor's per-device custom
    pass for cpu, which the FX and AOTAutograd cache keys hash."""
    from torch._inductor.codegen import common

    from awq_inductor import inductor
    from awq_inductor.inductor import lowering

    assert inductor.register()
    p = common.custom_backend_passes["cpu"]
    assert type(p).__name__ == "AwqCpuKeyPass" and p.uuid() == lowering.cache_uuid()
    lowering.install_cpu_key_pass()  # idempotent: not wrapped twice
    assert common.custom_backend_passes["cpu"] is p


def test_native_disk_key_has_isa_and_flags(tmp_path, monkeypatch):
    from awq_inductor.kernels import native

    monkeypatch.setenv("AWQ_INDUCTOR_CACHE_DIR", str(tmp_path))
    src = 'extern "C" int awq_probe() { return 7; }\n'
    a = native.build(src, [], isa="portable")
    b = native.build(src, [], isa="avx512")
    c = native.build(src, ["-DAWQ_EXTRA_FLAG=1"], isa="portable")
    assert len({a, b, c}) == 3, (a, b, c)
    assert "_portable_" in os.path.basename(a) and "_avx512_" in os.path.basename(b)
    assert native.build(src, [], isa="portable") == a
