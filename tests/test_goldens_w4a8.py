"""Golden tests of OUR generated W4A8 C++ (awq::int4_mm_a8): the ``// BEGIN awq`` .. ``// END awq``
region, normalised like tests/test_goldens.py (tests/golden_utils.py: size symbols -> s0,
store_output body elided).

Regenerate with ``EXPECTTEST_ACCEPT=1 pytest tests/test_goldens_w4a8.py``. The inlined header must be
exactly ``codegen.render_header(schemes.W4A8, isa, dtype)``. AMX runs in tile emulation where the CPU has no
usable AMX (the generated region does not depend on it).
"""
from __future__ import annotations

import torch

from awq_inductor import packing, schemes
from awq_inductor.ops import oracles
from awq_inductor.kernels import codegen, native
from awq_inductor import config as awq_config
from awq_inductor import ops
from golden_utils import AMX_RUNS, GoldenTestCase, awq_weights, compile_code

N, K, G = 72, 128, 64


class TestGoldensW4A8(GoldenTestCase):
    def setUp(self):
        super().setUp()
        self.w = awq_weights(N, K, G, packing.pack_for_int8_kernel, seed=7, signed_scales=True)

    def gen(self, isa: str, dynamic: bool, dtype=torch.bfloat16) -> str:
        x = torch.randn(8, K, dtype=dtype)
        if dynamic:
            torch._dynamo.mark_dynamic(x, 0)
        f = torch.compile(lambda a: torch.ops.awq.int4_mm_a8(a, *self.w), fullgraph=True)
        emulate = isa == "amx" and not AMX_RUNS
        with awq_config.patch(force_isa=isa, amx_emulation=emulate):
            out, code = compile_code(f, x)
            header = codegen.render_driver_link(isa, dtype)
            library = native.driver_library(schemes.W4A8, isa, dtype)
            driver = codegen.render_eager(schemes.W4A8, isa, dtype, emulate)
        ref = oracles.int4_mm("int4_mm_a8", x, *self.w).float()
        err = ((out.float() - ref).abs().mean() / ref.abs().mean()).item()
        self.assertLess(err, 0.03)
        region = self.golden_region(code, "int4_mm_a8", header=header)
        self.assertIn(f'#define AWQ_DRIVER_LIBRARY "{library}"', code)  # the driver built from `driver`
        if isa != "portable":
            self.assertIn("_mm512_dpbusd_epi32", driver)
        if isa == "amx":
            self.assertIn("AWQ_TILE_DPBUSD(0, 4, 6)", driver)
        return region

    def test_avx512_static(self):
        self.assertExpectedInline(self.gen("avx512", False), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const int32_t* C, const float* B, at::BFloat16* Y)
{
    // awq::int4_mm_a8 (W4A8, per-token int8 x)  isa=avx512  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    constexpr int64_t M = static_cast<int64_t>(8L);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const int32_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_a8_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, C, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_avx512_dynamic(self):
        self.assertExpectedInline(self.gen("avx512", True), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const int32_t* C, const float* B, at::BFloat16* Y, const int64_t s0)
{
    // awq::int4_mm_a8 (W4A8, per-token int8 x)  isa=avx512  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    const int64_t M = static_cast<int64_t>(s0);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const int32_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_a8_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, C, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_amx_static(self):
        self.assertExpectedInline(self.gen("amx", False), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const int32_t* C, const float* B, at::BFloat16* Y)
{
    // awq::int4_mm_a8 (W4A8, per-token int8 x)  isa=amx  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    constexpr int64_t M = static_cast<int64_t>(8L);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const int32_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_a8_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, C, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_portable_static_f32(self):
        self.assertExpectedInline(self.gen("portable", False, torch.float32), """\
// BEGIN awq
extern "C"
void kernel(const float* X, const uint8_t* QW, const float* S, const uint8_t* Z, const int32_t* C, const float* B, float* Y)
{
    // awq::int4_mm_a8 (W4A8, per-token int8 x)  isa=portable  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    constexpr int64_t M = static_cast<int64_t>(8L);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const int32_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_a8_driver_float32"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, C, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")
