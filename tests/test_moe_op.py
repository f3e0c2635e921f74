"""awq::int4_moe / int4_moe_a8: eager kernel vs the fp32 reference, errors, torch.compile."""
import pytest
import torch

from awq_inductor import config
from awq_inductor.kernels import codegen
from awq_inductor.ops import moe
from awq_inductor.ops import oracles
from awq_inductor.schemes import MOE_OPS

from helpers import random_canonical

NAMES = list(MOE_OPS)


def experts(E, H, I, G, seed=0):
    g = torch.Generator().manual_seed(seed)
    gu = [random_canonical(2 * I, H, G, torch.float16, generator=g) for _ in range(E)]
    dn = [random_canonical(H, I, G, torch.float16, generator=g) for _ in range(E)]
    return gu, dn


def routing(T, E, k, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    tw, ids = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k, -1)
    return ids, tw.to(dtype)


def check(name, x, ids, tw, W, G, I):
    y = MOE_OPS[name].torch_op(x, ids, tw, *W, G, I)
    r = oracles.moe(name, x, ids, tw, *W, G, I, quantize_x=MOE_OPS[name].scheme.act_quant is not None)
    assert y.shape == x.shape and y.dtype == x.dtype
    if x.shape[0]:
        tol = 1e-4 if x.dtype == torch.float32 else 2e-2
        err = (y.float() - r.float()).abs().max().item()
        assert err <= tol * r.float().abs().max().item() + 1e-6, (name, x.dtype, x.shape, err)
    return y


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("E,k", [(8, 2), (4, 1), (16, 4)])
def test_matches_reference(name, dtype, E, k):
    H, I, G = 128, 64, 32
    W = moe.pack_experts(MOE_OPS[name], *experts(E, H, I, G), G, I)
    for T in (0, 1, 3, 17, 64):
        ids, tw = routing(T, E, k, seed=T)
        x = torch.randn(T, H, generator=torch.Generator().manual_seed(T)).to(dtype)
        check(name, x, ids, tw, W, G, I)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("threads", [1, 2])
def test_threads_and_both_schedules(name, threads):
    # T=1, k=2: 2 experts, run one after another; T=64: 8 experts, one parallel region over experts
    H, I, G, E = 64, 96, 32, 8
    W = moe.pack_experts(MOE_OPS[name], *experts(E, H, I, G, seed=1), G, I)
    with config.patch(num_threads=threads):
        for T in (1, 64):
            ids, tw = routing(T, E, 2, seed=3)
            check(name, torch.randn(T, H), ids, tw, W, G, I)


@pytest.mark.parametrize("name", NAMES)
def test_portable_isa(name):
    H, I, G, E = 128, 64, 32, 6
    W = moe.pack_experts(MOE_OPS[name], *experts(E, H, I, G, seed=2), G, I)
    with config.patch(force_isa="portable"):
        assert moe.get_kernel(name, torch.float32).isa == "portable"
        for T in (1, 17):
            ids, tw = routing(T, E, 2, seed=T)
            check(name, torch.randn(T, H), ids, tw, W, G, I)
            check(name, torch.randn(T, H).bfloat16(), ids, tw, W, G, I)


@pytest.mark.parametrize("name", NAMES)
def test_amx_emulated(name):
    H, I, G, E = 128, 64, 32, 2
    W = moe.pack_experts(MOE_OPS[name], *experts(E, H, I, G, seed=4), G, I)
    with config.patch(force_isa="amx", amx_emulation=True, amx_min_m=16):
        ids, tw = routing(80, E, 1, seed=5)  # ~40 rows per expert: the AMX paths
        check(name, torch.randn(80, H).bfloat16(), ids, tw, W, G, I)


NEVER = 1 << 40
#: fp32 x: the exact-FMA row kernel for every M / the dequantize-once panel kernel for every M
PLANS = {"rows": {"panel_min_m": NEVER}, "panel": {"panel_min_m": 0}}


@pytest.mark.parametrize("name", NAMES)
def test_experts_run_the_plan_of_their_shapes(name):
    """One expert, weight 1: the op must equal the dense gate|up op then the down op bitwise under the
    same forced plan, for two plans that give different results (W4A16 fp32: row vs panel kernel),
    so the plan reaches the experts' GEMMs (the eager entry's Thresholds arguments)."""
    from awq_inductor.kernels import isa as isa_mod

    H, I, G = 128, 64, 32
    mop = MOE_OPS[name]
    W = moe.pack_experts(mop, *experts(1, H, I, G, seed=9), G, I)
    nw = len(mop.scheme.weights)
    w13, w2 = [t[0] for t in W[:nw]], [t[0] for t in W[nw:]]
    T = 24
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(10))
    ids, tw = torch.zeros(T, 1, dtype=torch.int64), torch.ones(T, 1)
    outs = {}
    for tag, plan in PLANS.items():
        with config.patch(kernel_plan=plan):
            y = mop.torch_op(x, ids, tw, *W, G, I)
            h = mop.w13.torch_op(x, *w13, None, G, I)
            torch.testing.assert_close(y, mop.w2.torch_op(h, *w2, None, G, H), rtol=0, atol=0)
        outs[tag] = y
    if mop.scheme.act_quant is None and isa_mod.select() != "portable":
        assert not torch.equal(outs["rows"], outs["panel"])  # the two plans did take different paths


@pytest.mark.parametrize("name", NAMES)
def test_reads_only_selected_experts(name):
    """Unselected experts' scales are NaN: the result must not see them."""
    H, I, G, E = 64, 64, 32, 8
    W = moe.pack_experts(MOE_OPS[name], *experts(E, H, I, G, seed=6), G, I)
    ids = torch.tensor([[1, 5]])
    tw = torch.tensor([[0.7, 0.3]])
    x = torch.randn(1, H)
    ref = check(name, x, ids, tw, W, G, I)
    nw = len(MOE_OPS[name].scheme.weights)
    poisoned = [t.clone() for t in W]
    for i in (1, nw + 1):  # w13_scales, w2_scales
        for e in set(range(E)) - {1, 5}:
            poisoned[i][e] = float("nan")
    y = MOE_OPS[name].torch_op(x, ids, tw, *poisoned, G, I)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref, rtol=0, atol=0)


def test_weights_in_x_dtype_and_int32_ids():
    H, I, G, E = 64, 64, 32, 4
    W = moe.pack_experts(MOE_OPS["int4_moe"], *experts(E, H, I, G), G, I)
    ids, tw = routing(5, E, 2)
    x = torch.randn(5, H).bfloat16()
    a = MOE_OPS["int4_moe"].torch_op(x, ids, tw, *W, G, I)
    b = MOE_OPS["int4_moe"].torch_op(x, ids.int(), tw.bfloat16().float(), *W, G, I)
    c = MOE_OPS["int4_moe"].torch_op(x, ids.int(), tw.bfloat16(), *W, G, I)
    torch.testing.assert_close(b, c, rtol=0, atol=0)
    torch.testing.assert_close(a, b, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_errors_name_the_tensor(name):
    H, I, G, E = 64, 64, 32, 4
    mop = MOE_OPS[name]
    W = moe.pack_experts(mop, *experts(E, H, I, G), G, I)
    ids, tw = routing(3, E, 2)
    x = torch.randn(3, H)
    op = mop.torch_op
    with pytest.raises(ValueError, match=r"topk_ids: expected values in \[0, 4\).*max 4"):
        op(x, torch.tensor([[0, 4]] * 3), tw, *W, G, I)
    with pytest.raises(ValueError, match="topk_ids: expected int32/int64"):
        op(x, ids.float(), tw, *W, G, I)
    with pytest.raises(ValueError, match="topk_ids: expected 3 rows"):
        op(x, ids[:2], tw[:2], *W, G, I)
    with pytest.raises(ValueError, match="topk_weights: expected a floating"):
        op(x, ids, tw[:, :1], *W, G, I)
    nw = len(mop.scheme.weights)
    bad = list(W)
    bad[nw] = W[nw][:3]  # w2_qweight with 3 experts
    with pytest.raises(ValueError, match=r"w2_qweight: expected uint8 \[4, 2, "):
        op(x, ids, tw, *bad, G, I)
    bad = list(W)
    bad[2] = W[2][:, :1]
    with pytest.raises(ValueError, match=r"w13_zeros: expected uint8 \[4, 2, 128\]"):
        op(x, ids, tw, *bad, G, I)
    with pytest.raises(ValueError, match="intermediate_size: expected a positive multiple of 32, got 48"):
        op(x, ids, tw, *W, G, 48)
    with pytest.raises(ValueError, match="x: expected last dim|w13_qweight"):
        op(torch.randn(3, 32), ids, tw, *W, G, I)


@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph_dynamic_t(name, inductor_clean):
    from torch._dynamo.utils import counters

    H, I, G, E, k = 64, 64, 32, 8, 2
    mop = MOE_OPS[name]
    W = moe.pack_experts(mop, *experts(E, H, I, G, seed=7), G, I)
    router = torch.randn(E, H, generator=torch.Generator().manual_seed(8))

    def f(x):
        probs = torch.softmax(x @ router.t(), -1, dtype=torch.float)
        tw, ids = probs.topk(k, -1)
        tw = tw / tw.sum(-1, keepdim=True)
        return mop.torch_op(x, ids, tw.to(x.dtype), *W, G, I) * 2 + x

    cf = torch.compile(f, fullgraph=True, dynamic=True)
    for T in (3, 17, 40):
        x = torch.randn(T, H)
        torch.testing.assert_close(cf(x), f(x), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    # dynamic=True makes the closure weights' shapes (H) symbolic: the extern call, not the template
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 0


def test_module_from_linears_act_quant_and_errors():
    from awq_inductor import AWQLinear
    from awq_inductor.nn import AWQMoEExperts

    H, I, G, E = 64, 64, 32, 3
    gu, dn = experts(E, H, I, G, seed=9)
    mod = AWQMoEExperts.from_canonical(gu, dn, group_size=G)
    lin = [(AWQLinear.from_canonical(q[:I], z[:I], s[:I], group_size=G),
            AWQLinear.from_canonical(q[I:], z[I:], s[I:], group_size=G),
            AWQLinear.from_canonical(*d, group_size=G)) for (q, z, s), d in zip(gu, dn)]
    same = AWQMoEExperts.from_linears(lin)
    for a, b in zip(mod.weights(), same.weights()):
        assert torch.equal(a, b)
    x = torch.randn(2, 3, H)  # leading dims are flattened like transformers' experts modules do
    ids, tw = routing(6, E, 2)
    y = mod(x, ids, tw)
    assert y.shape == x.shape
    torch.testing.assert_close(y.reshape(6, H), mod(x.reshape(6, H), ids, tw), rtol=0, atol=0)
    w8 = mod.with_act_quant("int8")
    assert w8.op is MOE_OPS["int4_moe_a8"] and w8.with_act_quant(None).act_quant is None
    for a, b in zip(mod.weights(), w8.with_act_quant(None).weights()):
        assert torch.equal(a, b)
    gw, dw = mod.dequantize(1)
    torch.testing.assert_close(gw, torch.cat([(q.float() - z.float().repeat_interleave(G, 1)) *
                                              s.float().repeat_interleave(G, 1) for q, z, s in [gu[1]]]))
    with pytest.raises(ValueError, match="intermediate_size: expected a positive multiple of 32, got 48"):
        AWQMoEExperts(E, H, 48, G)
    with pytest.raises(ValueError, match=r"down\[1\]: expected q \[64, 64\]"):
        AWQMoEExperts.from_canonical(gu, [dn[0], (dn[1][0][:, :32], dn[1][1][:, :1], dn[1][2][:, :1]), dn[2]],
                                     group_size=G)


# ------------------------------------------------------------------ Inductor template (lowering.py)
class _Experts(torch.nn.Module):
    """The op's packed weights as module buffers (static shapes, as in AWQMoEExperts)."""

    def __init__(self, mop, W, G, I):
        super().__init__()
        self.mop, self.G, self.I, self.n = mop, G, I, len(W)
        for i, w in enumerate(W):
            self.register_buffer(f"w{i}", w)

    def forward(self, x, ids, tw):
        return self.mop.torch_op(x, ids, tw, *(getattr(self, f"w{i}") for i in range(self.n)), self.G, self.I)


def _compiled_code(codes):
    return "\n".join(codes)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_template_dynamic_t_matches_eager_bitwise(name, dtype, inductor_clean):
    """The template (not the extern call) runs, one graph for two T (T symbolic), fullgraph (no
    graph break), int32 ids and x-dtype routing weights converted in Inductor, equal to eager bitwise."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    H, I, G, E, k = 128, 64, 32, 8, 2
    mop = MOE_OPS[name]
    m = _Experts(mop, moe.pack_experts(mop, *experts(E, H, I, G, seed=11), G, I), G, I)
    cf = torch.compile(m, fullgraph=True)
    for i, T in enumerate((5, 33)):
        x = torch.randn(T, H, generator=torch.Generator().manual_seed(T)).to(dtype)
        ids, tw = routing(T, E, k, seed=T, dtype=dtype)
        ids = ids.int()
        for t in (x, ids, tw):
            torch._dynamo.mark_dynamic(t, 0)
        if i == 0:
            y, codes = run_and_get_code(cf, x, ids, tw)
            code = _compiled_code(codes)
            assert f'"awq_{name}_{codegen.dtype_name(dtype)}"' in code and f"torch.ops.awq.{name}" not in code
            assert "const int64_t T = static_cast<int64_t>(ks" in code  # T is a kernel argument
        else:
            y = cf(x, ids, tw)
        torch.testing.assert_close(y, m(x, ids, tw), rtol=0, atol=0)
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1


def test_template_renders_the_tuned_plans(inductor_clean):
    """The plans of the two GEMM shapes are rendered into the kernel (here forced: config.kernel_plan)."""
    from torch._inductor.utils import run_and_get_code

    H, I, G, E = 64, 64, 32, 4
    mop = MOE_OPS["int4_moe"]
    m = _Experts(mop, moe.pack_experts(mop, *experts(E, H, I, G, seed=12), G, I), G, I)
    x = torch.randn(6, H).bfloat16()
    ids, tw = routing(6, E, 2)
    with config.patch(kernel_plan={"bf16_f32_min_m": 1 << 40, "panel_min_m": 3, "decode_prefetch": 512,
                                   "prefetch_next_tile": 1, "decode_int16": 1, "decode_prefetch_l2": 4096,
                                   "rows_prefetch": 0}):
        y, codes = run_and_get_code(torch.compile(m, fullgraph=True), x, ids, tw)
        torch.testing.assert_close(y, m(x, ids, tw), rtol=0, atol=0)
    code = _compiled_code(codes)
    assert code.count("5, 3, 1099511627776, 512, 1, 1, 4096, 0, 1,  // gate|up plan: forced") == 1
    assert code.count("5, 3, 1099511627776, 512, 1, 1, 4096, 0, 1);  // down plan: forced") == 1


def test_template_never_fuses_an_epilogue(inductor_clean):
    """A pointwise op on the output (residual add) stays its own kernel: the MoE template buffer
    refuses epilogue fusion (its output is the driver's sum over top-k)."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    H, I, G, E = 64, 64, 32, 4
    mop = MOE_OPS["int4_moe"]
    m = _Experts(mop, moe.pack_experts(mop, *experts(E, H, I, G, seed=13), G, I), G, I)
    x = torch.randn(7, H)
    ids, tw = routing(7, E, 2)
    y, codes = run_and_get_code(torch.compile(lambda a, b, c: m(a, b, c) * 2 + a, fullgraph=True), x, ids, tw)
    torch.testing.assert_close(y, m(x, ids, tw) * 2 + x, rtol=1e-6, atol=1e-6)
    assert '"awq_int4_moe_float32"' in _compiled_code(codes)  # the entry of the op's library
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1
    assert counters["inductor"]["cpp_epilogue_fusion_counter"] == 0


def test_template_falls_back_to_the_extern_call():
    """Symbolic H (weights as dynamic graph inputs) and static T == 0 take the extern call; the
    reasons are named."""
    import sympy
    from torch._inductor import ir

    from awq_inductor.inductor import lowering

    def buf(size, dtype=torch.float32):
        return ir.Buffer(name="b", layout=ir.FixedLayout(torch.device("cpu"), dtype, size))

    mop = MOE_OPS["int4_moe"]
    s = sympy.Symbol("s0", positive=True, integer=True)
    W = [buf([4, 2, 32, 32], torch.uint8), buf([4, 2, 128]), buf([4, 2, 128], torch.uint8)] * 2
    ids, tw = buf([3, 2], torch.int64), buf([3, 2])
    assert lowering.use_moe_template(mop, buf([3, 64]), ids, tw, W) is None
    assert lowering.use_moe_template(mop, buf([s, 64]), ids, tw, W) is None
    assert lowering.use_moe_template(mop, buf([3, s]), ids, tw, W) == "symbolic H=s0"
    assert lowering.use_moe_template(mop, buf([0, 64]), ids, tw, W) == "T == 0"
    assert lowering.use_moe_template(mop, buf([3, 64]), buf([3, s], torch.int64), tw, W) == "symbolic top-k=s0"
    assert lowering.use_moe_template(mop, buf([3, 64]), ids, tw, [buf([s, 2, 32, 32], torch.uint8)] + W[1:]) \
        == "symbolic w13_qweight shape [s0, 2, 32, 32]"
    assert lowering.use_moe_template(mop, buf([3, 64]), ids, tw, W[:3] + [buf([s, 2, 32, 32], torch.uint8)] + W[4:]) \
        == "symbolic w2_qweight shape [s0, 2, 32, 32]"


def test_template_bad_ids_give_nan_rows_not_partial_sums(inductor_clean):
    """The compiled kernel cannot raise on an id outside [0, E) (the eager op does): that token's row
    is NaN, the other rows are right."""
    H, I, G, E = 64, 64, 32, 4
    mop = MOE_OPS["int4_moe"]
    m = _Experts(mop, moe.pack_experts(mop, *experts(E, H, I, G, seed=14), G, I), G, I)
    x = torch.randn(3, H)
    ids, tw = routing(3, E, 2)
    y = torch.compile(m, fullgraph=True)(x, torch.cat([ids[:2], torch.tensor([[0, E]])]), tw)
    assert torch.isnan(y[2]).all()
    torch.testing.assert_close(y[:2], m(x[:2], ids[:2], tw[:2]), rtol=1e-5, atol=1e-5)
