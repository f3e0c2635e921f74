"""Property-based fuzzing of awq::int4_mm against the dense fp32 reference (hypothesis).

Draws K, N, G (G = K included, N not a multiple of 32), M in 0..300, the activation dtype,
x's layout (contiguous, a column slice with a larger row stride, a transposed view), bias or not,
scales with zero and negative groups, NaN/Inf injected into x, and the ISA (this CPU's own,
emulated AMX, portable); compares the op, the module and (second test) the compiled module with
dynamic M.

Tolerance (the suite's documented one, tests/test_native.py): max |y - ref| <= tol * max |ref|
with tol = 2e-5 (fp32), 2e-3 (fp16), 2e-2 (bf16), on rows of x without NaN/Inf. Rows with NaN/Inf:
NaN exactly where the dense result (x.float() @ W.T + b, cast to x's dtype) has NaN, and +-Inf where
it has +-Inf.

Budget: about 60 s for both tests by default ($AWQ_FUZZ_SECONDS overrides; examples past the budget
are drawn but not run). ``pytest tests/test_fuzz.py --fuzz-examples 500`` (or $AWQ_FUZZ_EXAMPLES)
runs more, without the time limit unless $AWQ_FUZZ_SECONDS is set. Statistics (cases run, max
relative error per dtype and ISA) are printed in the terminal summary.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from awq_inductor import AWQLinear, config  # noqa: E402
from awq_inductor.kernels import isa as isa_mod  # noqa: E402

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NATIVE = isa_mod.select()
ISAS = sorted({NATIVE, "portable", "amx-emulated"})

STATS = defaultdict(lambda: {"cases": 0, "max_rel_err": 0.0, "nonfinite_cases": 0})


def summary_lines():
    out = []
    for (kind, isa, dt), s in sorted(STATS.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2]))):
        out.append(f"{kind:9s} isa={isa:13s} {str(dt).replace('torch.', ''):9s} cases={s['cases']:4d} "
                   f"(with NaN/Inf {s['nonfinite_cases']:3d})  max rel err={s['max_rel_err']:.3g} (tol {TOL[dt]:g})")
    return out


def _examples(config_obj, default):
    n = config_obj.getoption("--fuzz-examples") or os.environ.get("AWQ_FUZZ_EXAMPLES")
    return int(n) if n else default


def _budget(config_obj, default):
    if os.environ.get("AWQ_FUZZ_SECONDS"):
        return float(os.environ["AWQ_FUZZ_SECONDS"]) * default / 60.0
    if config_obj.getoption("--fuzz-examples") or os.environ.get("AWQ_FUZZ_EXAMPLES"):
        return float("inf")
    return default


@st.composite
def shapes(draw, max_m=300):
    G = draw(st.sampled_from([32, 64, 128, "K"]))
    if G == "K":
        K = draw(st.sampled_from([32, 64, 96, 160, 256, 512]))
        G = K
    else:
        K = G * draw(st.integers(1, max(1, 1024 // G)))
    N = draw(st.one_of(st.integers(1, 200), st.sampled_from([32, 64, 96, 128])))
    M = draw(st.one_of(st.integers(0, 8), st.integers(0, max_m)))
    return M, K, N, G


def _weights(draw, N, K, G, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = torch.randn(N, K // G, generator=g) * 0.02  # negative scales included
    if draw(st.booleans()):  # zero scales in some groups
        s[torch.rand(N, K // G, generator=g) < 0.2] = 0.0
    if draw(st.booleans()):  # all-negative columns
        s[: max(1, N // 3)] = -s[: max(1, N // 3)].abs()
    b = torch.randn(N, generator=g) if draw(st.booleans()) else None
    return AWQLinear.from_canonical(q, z, s, b, group_size=G)


def _x(draw, M, K, dtype, seed):
    g = torch.Generator().manual_seed(seed + 1)
    layout = draw(st.sampled_from(["contiguous", "column-slice", "transposed"]))
    if layout == "contiguous":
        x = torch.randn(M, K, generator=g).to(dtype)
    elif layout == "column-slice":
        x = torch.randn(M, K + 17, generator=g).to(dtype)[:, 5:K + 5]
    else:
        x = torch.randn(K, M, generator=g).to(dtype).t()
    bad_rows = set()
    if M and draw(st.booleans()):
        x = x.clone() if layout == "contiguous" else x
        for _ in range(draw(st.integers(1, 3))):
            r, c = draw(st.integers(0, M - 1)), draw(st.integers(0, K - 1))
            x[r, c] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
            bad_rows.add(r)
    return x, layout, sorted(bad_rows)


def _compare(y, x, lin, bad_rows, what):
    assert y.shape == (x.shape[0], lin.out_features) and y.dtype == x.dtype, (what, y.shape, y.dtype)
    ref = x.float() @ lin.dequantize().t()
    if lin.bias is not None:
        ref = ref + lin.bias
    ref_d = ref.to(x.dtype).float()
    yf = y.float()
    good = torch.ones(x.shape[0], dtype=torch.bool)
    good[bad_rows] = False
    if bad_rows:
        yb, rb = yf[~good], ref_d[~good]
        assert torch.equal(torch.isnan(yb), torch.isnan(rb)), f"{what}: NaN pattern differs from dense"
        assert torch.equal(torch.isposinf(yb), torch.isposinf(rb)) and torch.equal(torch.isneginf(yb), torch.isneginf(rb)), \
            f"{what}: Inf pattern differs from dense"
    rel = 0.0
    if good.any():
        r, yy = ref[good], yf[good]
        assert torch.isfinite(yy).all(), f"{what}: non-finite output for finite input"
        scale = r.abs().max().item() + 1e-6
        rel = (yy - r).abs().max().item() / scale
        assert rel <= TOL[x.dtype], f"{what}: max rel err {rel:.3g} > {TOL[x.dtype]}"
    return rel


def _isa_patch(isa):
    if isa == "amx-emulated":
        return config.patch(force_isa="amx", amx_emulation=True)
    return config.patch(force_isa=isa)


def _record(kind, isa, dt, rel, nonfinite):
    s = STATS[(kind, isa, dt)]
    s["cases"] += 1
    s["max_rel_err"] = max(s["max_rel_err"], rel)
    s["nonfinite_cases"] += bool(nonfinite)


def test_fuzz_op_and_module(request):
    deadline = time.monotonic() + _budget(request.config, 30)
    failing = []

    @settings(max_examples=_examples(request.config, 300), deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def run(data):
        draw = data.draw
        isa = draw(st.sampled_from(ISAS))
        M, K, N, G = draw(shapes(max_m=48 if isa == "amx-emulated" else 300))
        dtype = draw(st.sampled_from(DTYPES))
        seed = draw(st.integers(0, 2**31 - 1))
        lin = _weights(draw, N, K, G, seed)
        x, layout, bad = _x(draw, M, K, dtype, seed)
        if time.monotonic() > deadline and not failing:  # over budget: draw, don't run
            return
        what = f"isa={isa} M={M} K={K} N={N} G={G} {dtype} x={layout} bias={lin.bias is not None} nonfinite_rows={bad}"
        try:
            with _isa_patch(isa), torch.no_grad():
                y_op = torch.ops.awq.int4_mm(x, lin.qweight, lin.scales, lin.zeros, lin.bias, lin.group_size, N)
                y_mod = lin(x.unsqueeze(0)).squeeze(0)  # 3-D input through the module
            rel = _compare(y_op, x, lin, bad, "op " + what)
            rel = max(rel, _compare(y_mod, x, lin, bad, "module " + what))
        except Exception:
            failing.append(what)  # shrinking replays must not be cut by the budget
            raise
        _record("eager", isa, dtype, rel, bad)

    run()
    assert sum(s["cases"] for (k, *_), s in STATS.items() if k == "eager") > 0


def test_fuzz_compiled_dynamic_m(request, inductor_clean):
    """One compile per drawn layer (backend awq_inductor, dynamic M), several M through it."""
    import awq_inductor.inductor.backend  # noqa: F401
    from torch.fx.experimental import _config as fx_config

    deadline = time.monotonic() + _budget(request.config, 20)
    failing = []

    @settings(max_examples=_examples(request.config, 12), deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    @given(data=st.data())
    def run(data):
        draw = data.draw
        isa = draw(st.sampled_from(ISAS))
        _, K, N, G = draw(shapes())
        dtype = draw(st.sampled_from(DTYPES))
        seed = draw(st.integers(0, 2**31 - 1))
        lin = _weights(draw, N, K, G, seed)
        Ms = draw(st.lists(st.integers(0, 48 if isa == "amx-emulated" else 300), min_size=2, max_size=4))
        xs = [_x(draw, M, K, dtype, seed + i) for i, M in enumerate(Ms)]
        if time.monotonic() > deadline and not failing:  # over budget: draw, don't run
            return
        torch._dynamo.reset()
        try:
            with _isa_patch(isa), torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
                cl = torch.compile(lin, backend="awq_inductor", dynamic=True)
                for M, (x, layout, bad) in zip(Ms, xs):
                    what = (f"compiled isa={isa} M={M} (of {Ms}) K={K} N={N} G={G} {dtype} x={layout} "
                            f"bias={lin.bias is not None} nonfinite_rows={bad}")
                    rel = _compare(cl(x), x, lin, bad, what)
                    _record("compiled", isa, dtype, rel, bad)
        except Exception:
            failing.append(isa)
            raise

    run()
    assert sum(s["cases"] for (k, *_), s in STATS.items() if k == "compiled") > 0
