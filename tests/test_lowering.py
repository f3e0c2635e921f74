"""Inductor lowering of awq::int4_mm: correctness vs int4_mm_reference, dynamic M, ISA variants,
epilogue fusion counters, extern fallback for symbolic K."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as iconfig
from torch._inductor.utils import run_and_get_code

from helpers import op_args
from awq_inductor import config as awq_config
from awq_inductor.ops import oracles
from awq_inductor import inductor, ops
from awq_inductor.inductor import lowering

AMX_OK = bool(torch.cpu._is_amx_tile_supported())
ISAS = [
    "portable",
    "avx512",
    pytest.param("amx", marks=pytest.mark.skipif(not AMX_OK, reason="CPU/OS without AMX tiles")),
]
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (5e-3, 5e-3)}
_seed = [1234]


def _eager_op_works() -> bool:
    try:
        w = make_weights(32, 32, 32)
        torch.ops.awq.int4_mm(torch.randn(1, 32), *w.args)
        return True
    except Exception:  # noqa: BLE001 - the native eager kernel may not be built yet
        return False


class W:
    def __init__(self, N, K, G, bias):
        _seed[0] += 1  # fresh weights per compile (the FX cache must never hand back stale ones)
        self.qw, self.sc, self.zr, self.bias, _, _ = op_args(
            "int4_mm", N, K, G, bias=bias, seed=_seed[0], scale=2.0 / K ** 0.5, signed=False)
        self.N, self.K, self.G = N, K, G

    @property
    def args(self):
        return (self.qw, self.sc, self.zr, self.bias, self.G, self.N)

    def ref(self, x):
        return oracles.int4_mm("int4_mm", x, *self.args)

    def op(self, x):
        return torch.ops.awq.int4_mm(x, *self.args)


def make_weights(N, K, G, bias=False):
    return W(N, K, G, bias)


def check(out, ref, dtype):
    assert out.dtype == ref.dtype == dtype
    atol, rtol = TOL[dtype]
    scale = ref.float().abs().max().item() + 1e-6
    torch.testing.assert_close(out.float() / scale, ref.float() / scale, atol=atol, rtol=rtol)


def kernel_code(codes):
    return "\n".join(codes)


@pytest.fixture(autouse=True)
def _clean(inductor_clean):
    yield


# ------------------------------------------------------------------------------------- shapes
CASES = [  # (M, K, N, G, bias, dtype)
    (1, 32, 32, 32, False, torch.float32),
    (2, 64, 40, 64, True, torch.bfloat16),
    (5, 128, 100, 32, True, torch.float16),
    (17, 256, 72, 128, False, torch.bfloat16),
    (64, 256, 96, 256, True, torch.float32),
    (300, 128, 48, 64, True, torch.bfloat16),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M{}_K{}_N{}_G{}_b{}_{}".format(*c[:5], str(c[5])[6:]))
def test_static_shapes(isa, case):
    M, K, N, G, bias, dtype = case
    w = make_weights(N, K, G, bias)
    x = torch.randn(M, K, dtype=dtype)
    with awq_config.patch(force_isa=isa):
        out, codes = run_and_get_code(torch.compile(w.op, fullgraph=True), x)
    check(out, w.ref(x), dtype)
    code = kernel_code(codes)
    assert "awq_int4_mm_driver_" in code and f"isa={isa}" in code
    assert "torch.ops.awq.int4_mm" not in code
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_dynamic_m_no_recompile(isa, dtype):
    w = make_weights(72, 256, 64, bias=True)  # N not a multiple of 32
    f = torch.compile(w.op, fullgraph=True)
    with awq_config.patch(force_isa=isa):
        for i, M in enumerate([2, 4, 5, 17, 64, 300]):
            x = torch.randn(M, 256, dtype=dtype)
            torch._dynamo.mark_dynamic(x, 0)
            if i == 0:
                out, codes = run_and_get_code(f, x)
                code = kernel_code(codes)
                assert "awq_int4_mm_driver_" in code and "torch.ops.awq.int4_mm" not in code
                assert "const int64_t M = static_cast<int64_t>(ks" in code
            else:
                out = f(x)
            check(out, w.ref(x), dtype)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1


def test_large_shape_one_point():
    w = make_weights(11008, 4096, 128, bias=False)
    x = torch.randn(4, 4096, dtype=torch.bfloat16)
    out, codes = run_and_get_code(torch.compile(w.op), x)
    check(out, w.ref(x), torch.bfloat16)
    assert "awq_int4_mm_driver_" in kernel_code(codes)


def test_group_size_k_and_noncontiguous_x():
    w = make_weights(33, 96, 96, bias=True)  # G == K, N = 33
    xt = torch.randn(96, 7, dtype=torch.bfloat16)
    out, codes = run_and_get_code(torch.compile(lambda a: w.op(a.t())), xt)
    check(out, w.ref(xt.t()), torch.bfloat16)
    assert "awq_int4_mm_driver_" in kernel_code(codes)


def test_default_isa_follows_pick_vec_isa():
    from torch._inductor.cpu_vec_isa import VecAMX, VecAVX512, pick_vec_isa

    isa = pick_vec_isa()
    want = "amx" if isinstance(isa, VecAMX) and isa else "avx512" if isinstance(isa, VecAVX512) else "portable"
    assert awq_config.force_isa is None and lowering.choose_isa() == want
    with iconfig.patch({"cpp.simdlen": 0}):
        assert lowering.choose_isa() == "portable"


# ------------------------------------------------------------------------------------- fusion
def _fusion(fn, *args):
    out, codes = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    c = counters["inductor"]
    return out, kernel_code(codes), c["cpp_templated_kernel_counter"], c["cpp_epilogue_fusion_counter"]


def test_fuse_bias_add():
    w = make_weights(96, 128, 32)
    b = torch.randn(96, dtype=torch.bfloat16)
    x = torch.randn(9, 128, dtype=torch.bfloat16)
    out, code, nk, nf = _fusion(lambda a: w.op(a) + b, x)
    check(out, w.ref(x) + b, torch.bfloat16)
    assert (nk, nf) == (1, 1), (nk, nf)
    assert code.count("async_compile.cpp_pybinding") == 1


def test_fuse_residual_add_dynamic_m():
    w = make_weights(96, 128, 32, bias=True)
    f = torch.compile(lambda a, r: w.op(a) + r, fullgraph=True)
    for M in (3, 11):
        x, r = torch.randn(M, 128), torch.randn(M, 96)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(r, 0)
        check(f(x, r), w.ref(x) + r, torch.float32)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1
    assert counters["inductor"]["cpp_epilogue_fusion_counter"] == 1


def test_fuse_silu_mul_two_ops():
    wg, wu = make_weights(64, 128, 64), make_weights(64, 128, 64)
    x = torch.randn(6, 128, dtype=torch.bfloat16)
    out, code, nk, nf = _fusion(lambda a: torch.nn.functional.silu(wg.op(a)) * wu.op(a), x)
    ref = torch.nn.functional.silu(wg.ref(x).float()) * wu.ref(x).float()
    check(out, ref.to(torch.bfloat16), torch.bfloat16)
    # gate stays a template (its output is stored), up absorbs silu(g) * u
    assert (nk, nf) == (2, 1), (nk, nf)


def test_gate_up_split_does_not_fuse():
    """One int4_mm with N = 2I followed by silu(out[:, :I]) * out[:, I:]: the epilogue reads the
    template output at two indices that differ from its write index, so Inductor cannot fuse it
    (cpp_utils.template_fusion_with_epilogues_supported); result is still correct."""
    I = 48
    w = make_weights(2 * I, 128, 32)
    x = torch.randn(5, 128, dtype=torch.bfloat16)

    def f(a):
        y = w.op(a)
        return torch.nn.functional.silu(y[:, :I]) * y[:, I:]

    out, code, nk, nf = _fusion(f, x)
    r = w.ref(x).float()
    check(out, (torch.nn.functional.silu(r[:, :I]) * r[:, I:]).to(torch.bfloat16), torch.bfloat16)
    assert (nk, nf) == (1, 0), (nk, nf)


def test_template_buffer_with_other_users():
    w = make_weights(40, 64, 32, bias=True)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    r = torch.randn(7, 40, dtype=torch.bfloat16)
    (y, z), code, nk, nf = _fusion(lambda a, b: (lambda t: (t, t * 2 + b))(w.op(a)), x, r)
    ref = w.ref(x)
    check(y, ref, torch.bfloat16)
    check(z, (ref.float() * 2 + r.float()).to(torch.bfloat16), torch.bfloat16)
    assert nk == 1 and nf == 1


# ------------------------------------------------------------------------------------- fallback
def test_symbolic_k_falls_back_to_extern_call():
    w = make_weights(64, 128, 32)
    args = (torch.randn(3, 128), w.qw, w.sc, w.zr)

    def f(x, qw, sc, zr):
        return torch.ops.awq.int4_mm(x, qw, sc, zr, None, 32, 64)

    if not _eager_op_works():
        pytest.skip("eager awq::int4_mm kernel (awq_inductor.kernels.native) not available")
    for t in args:  # weights as graph inputs with symbolic shapes: K = 2 * qweight.shape[1] is symbolic
        for d in range(t.dim()):
            torch._dynamo.maybe_mark_dynamic(t, d)
    out, codes = run_and_get_code(torch.compile(f, dynamic=True), *args)
    code = kernel_code(codes)
    assert "torch.ops.awq.int4_mm.default(" in code
    assert "awq_int4_mm_driver_" not in code
    check(out, w.ref(args[0]), torch.float32)


def test_use_template_reasons():
    """The lowering's applicability check names why it falls back (symbolic K) without running."""
    import sympy
    from torch._inductor import ir

    def buf(name, size, dtype):
        return ir.Buffer(name=name, layout=ir.FixedLayout(torch.device("cpu"), dtype, size))

    k = sympy.Symbol("s7", positive=True, integer=True)
    x = buf("x", [4, 2 * k], torch.float32)
    qw = buf("qw", [2, k, 32], torch.uint8)
    sc = buf("sc", [1, 64], torch.float32)
    assert "symbolic K" in lowering.use_template(x, [qw, sc, sc], None)
    x2 = buf("x2", [sympy.Symbol("s0", positive=True, integer=True), 64], torch.bfloat16)
    qw2 = buf("qw2", [2, 32, 32], torch.uint8)
    assert lowering.use_template(x2, [qw2, sc, sc], None) is None


def test_register_idempotent():
    assert inductor.register() is True and inductor.register() is True
    from torch._inductor.lowering import lowerings

    assert torch.ops.awq.int4_mm.default in lowerings


def _random_index(rng, symbols) -> "sympy.Expr":
    """An index of the form Inductor's vectorized loops pass to ``simplify_index_in_vec_range``
    (the tiny Llama demo's: ``64*d0*s26 + 64*d1 + d2``, ``768*d0 + d1 + 768*m_start + o_start``)."""
    import sympy

    coefficients = (1, 1, 1, 2, 3, 4, 7, 32, 64, 96, 128, 512, 768, 4096, 11008)
    terms = [rng.choice(coefficients) * sympy.Mul(*rng.sample(symbols, rng.choice((1, 1, 2, 3))))
             for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.5:
        terms.append(rng.choice(coefficients))
    return sympy.Add(*terms)


def test_the_vec_range_index_fast_path_returns_what_sympy_simplify_returns():
    """Where :func:`lowering.is_simplify_fixed_point` says so, ``sympy.simplify`` hands the index
    back unchanged (so the fast path generates the same code); it says no for indexes with a common
    factor, which simplify rewrites."""
    import random

    import sympy

    rng = random.Random(7)
    symbols = list(sympy.symbols("x0 x1 x2 d0 d1 d2 s26 ks0 m_start o_start", integer=True, nonnegative=True))
    claimed = 0
    for _ in range(120):
        index = _random_index(rng, symbols)
        if lowering.is_simplify_fixed_point(index):
            claimed += 1
            assert sympy.simplify(index) == index, index
    assert claimed >= 40
    x0, x1, x2, s26 = symbols[0], symbols[1], symbols[2], symbols[6]
    for rewritten in (96 * x2 * x1 + 128 * x1, 256 * x0 * x2 + x2):
        assert sympy.simplify(rewritten) != rewritten
        assert not lowering.is_simplify_fixed_point(rewritten)
    assert not lowering.is_simplify_fixed_point(64 * x0 + 64 * x1)  # conservative: a common factor
    assert lowering.is_simplify_fixed_point(64 * x0 * s26 + 64 * x1 + x2)
    assert not lowering.is_simplify_fixed_point(x0 ** 2 + x1)


def test_the_vec_range_index_fast_path_skips_simplify_only_where_nothing_changes(monkeypatch):
    import sympy
    from torch._inductor import sizevars
    from torch.utils._sympy.functions import FloorDiv

    assert lowering.fast_vec_range_index_simplify()
    assert lowering.fast_vec_range_index_simplify()  # idempotent: one wrapper
    fast = sizevars.simplify_index_in_vec_range
    assert fast._awq_fast
    x0, x1, x2 = sympy.symbols("x0 x1 x2", integer=True, nonnegative=True)
    simplified = []
    real_simplify = sympy.simplify
    monkeypatch.setattr(sympy, "simplify", lambda e, *a, **k: simplified.append(e) or real_simplify(e, *a, **k))
    plain = 64 * x0 + 512 * x1 + x2 + 31
    assert fast(plain, x2, 16) is plain and simplified == []
    with_div = 64 * x0 + FloorDiv(x2, 32) + 5  # Inductor's own function: the FloorDiv becomes a free symbol
    out = fast(with_div, x2, 16)
    assert simplified and not out.has(FloorDiv) and out.free_symbols - {x0} == {sympy.Symbol("x2_div_c0")}
