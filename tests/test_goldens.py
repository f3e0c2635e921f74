"""Golden tests of OUR generated C++ (the region between ``// BEGIN awq`` and ``// END awq``).

Regenerate with ``EXPECTTEST_ACCEPT=1 pytest tests/test_goldens.py``.

Normalisation and the pinned setup (4 threads, caches disabled, fresh TORCHINDUCTOR_CACHE_DIR) are
tests/golden_utils.py's: size symbols -> ``s0``, trailing spaces stripped, Inductor's store code
replaced by ``<inductor store_output>`` and checked separately; the inlined awq header is not goldened:
we check it is exactly ``codegen.render_driver_link(isa, dtype)`` and that the code names the driver
library built for the ISA and dtype (``native.driver_library``).
"""
from __future__ import annotations

import os

import torch

from awq_inductor import packing, schemes
from awq_inductor.ops import oracles
from awq_inductor.kernels import codegen, native
from awq_inductor import config as awq_config
from awq_inductor import ops
from golden_utils import AMX_RUNS, GoldenTestCase, assert_close_scaled, awq_weights, compile_code

N, K, G = 72, 128, 64


class TestGoldens(GoldenTestCase):
    def setUp(self):
        super().setUp()
        self.w = awq_weights(N, K, G, packing.pack_for_kernel, seed=7)

    def gen(self, isa: str, dynamic: bool, dtype=torch.bfloat16) -> str:
        x = torch.randn(8, K, dtype=dtype)
        if dynamic:
            torch._dynamo.mark_dynamic(x, 0)
        f = torch.compile(lambda a: torch.ops.awq.int4_mm(a, *self.w), fullgraph=True)
        runs = isa != "amx" or AMX_RUNS
        with awq_config.patch(force_isa=isa):
            out, code = compile_code(f, x, run=runs)
            if runs:
                assert_close_scaled(out, oracles.int4_mm("int4_mm", x, *self.w))
            library = native.driver_library(schemes.W4A16, isa, dtype)
        self.assertIn(f'#define AWQ_DRIVER_LIBRARY "{library}"', code)
        return self.golden_region(code, "int4_mm", header=codegen.render_driver_link(isa, dtype),
                                  store=r"\.store\(Y \+|Y\[")  # Inductor's store writes the output

    def test_amx_static(self):
        self.assertExpectedInline(self.gen("amx", False), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const float* B, at::BFloat16* Y)
{
    // awq::int4_mm  isa=amx  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    constexpr int64_t M = static_cast<int64_t>(8L);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_amx_dynamic(self):
        self.assertExpectedInline(self.gen("amx", True), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const float* B, at::BFloat16* Y, const int64_t s0)
{
    // awq::int4_mm  isa=amx  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    const int64_t M = static_cast<int64_t>(s0);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_avx512_static(self):
        self.assertExpectedInline(self.gen("avx512", False), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const float* B, at::BFloat16* Y)
{
    // awq::int4_mm  isa=avx512  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    constexpr int64_t M = static_cast<int64_t>(8L);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_avx512_dynamic(self):
        self.assertExpectedInline(self.gen("avx512", True), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const float* B, at::BFloat16* Y, const int64_t s0)
{
    // awq::int4_mm  isa=avx512  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    const int64_t M = static_cast<int64_t>(s0);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_portable_static(self):
        self.assertExpectedInline(self.gen("portable", False), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const float* B, at::BFloat16* Y)
{
    // awq::int4_mm  isa=portable  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    constexpr int64_t M = static_cast<int64_t>(8L);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_portable_dynamic(self):
        self.assertExpectedInline(self.gen("portable", True), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const float* B, at::BFloat16* Y, const int64_t s0)
{
    // awq::int4_mm  isa=portable  N=72  K=128  G=64  threads=4
    constexpr int64_t N = 72;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    const int64_t M = static_cast<int64_t>(s0);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        float* awq_acc_buf = const_cast<float*>(awq_acc);
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, B, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_silu_mul_avx512_dynamic(self):
        """awq::int4_mm_silu_mul: driver N = 2I interleaved gate|up columns, silu(g) * u into a local
        [TILE_M, 32] tile, then Inductor's store_output (here with a fused residual add)."""
        I = 64
        w = awq_weights(2 * I, K, G, lambda q, z, s, G: schemes.OPS["int4_mm_silu_mul"].pack(q, z, s, G, I),
                        seed=8, bias=False, n_out=I)
        x = torch.randn(8, K, dtype=torch.bfloat16)
        r = torch.randn(8, I, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(r, 0)
        f = torch.compile(lambda a, b: torch.ops.awq.int4_mm_silu_mul(a, *w) + b, fullgraph=True)
        with awq_config.patch(force_isa="avx512"):
            out, code = compile_code(f, x, r)
        assert_close_scaled(out, oracles.int4_mm("int4_mm_silu_mul", x.float(), *w) + r.float())
        # Inductor's epilogue reads the silu*mul tile
        region = self.golden_region(code, "int4_mm", store=r"awq_silu_mul_buf \+")
        self.assertExpectedInline(region, """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const uint8_t* QW, const float* S, const uint8_t* Z, const at::BFloat16* in_ptr4, at::BFloat16* Y, const int64_t s0)
{
    // awq::int4_mm_silu_mul  isa=avx512  N=128 (2 x I=64, gate|up panels interleaved)  K=128  G=64  threads=4
    constexpr int64_t N = 128;
    constexpr int64_t K = 128;
    constexpr int64_t G = 64;
    const int64_t M = static_cast<int64_t>(s0);
    if (M <= 0) return;
    using awq_driver_t = void (*)(const void*, int64_t, const uint8_t*, const float*, const uint8_t*, const float*, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, void (*)(void*, const float*, int64_t, int64_t, int64_t, int64_t), void*);
    static const auto awq_driver = reinterpret_cast<awq_driver_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_mm_driver_bfloat16"));
    auto awq_store = [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
        // tiles are 64 wide and 64-aligned (I % 32 == 0): columns [n_start, n_start + 32) are gate,
        // [n_start + 32, n_end) up, for the outputs [o_start, o_start + 32)
        const int64_t o_start = n_start / 2;
        alignas(64) float _awq_silu_mul_buf[static_cast<int64_t>(1024L)]; float* awq_silu_mul_buf = _awq_silu_mul_buf;
        awq::silu_mul_tile(awq_acc, m_end - m_start, awq_silu_mul_buf, 32);
        // store_output: Inductor's epilogues over the silu(gate) * up tile
        <inductor store_output>
    };
    awq_driver(X, M, QW, S, Z, nullptr, N, K, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // plan: default
        awq::store_tile<decltype(awq_store)>, &awq_store);
}
// END awq""")

    def test_isa_specific_driver_library(self):
        """The kernel calls the driver library built for its ISA: AMX code has the tile kernel, AVX512
        the dpbf16 decode kernel (M=1), portable neither."""
        for isa, want, dont in (("amx", "_tile_dpbf16ps", None), ("avx512", "_mm512_dpbf16_ps", "_tile_"),
                                ("portable", None, "_mm512_dpbf16_ps")):
            with awq_config.patch(force_isa=isa):
                x = torch.randn(1 if isa != "amx" else 64, K, dtype=torch.bfloat16)
                f = torch.compile(lambda a: torch.ops.awq.int4_mm(a, *self.w))
                _, code = compile_code(f, x, run=False)
                library = native.driver_library(schemes.W4A16, isa, torch.bfloat16)
                source = codegen.render_eager(schemes.W4A16, isa, torch.bfloat16)
            self.assertIn(f'#define AWQ_DRIVER_LIBRARY "{library}"', code)
            self.assertIn(f"_{isa}", os.path.basename(library))
            if want:
                self.assertIn(want, source, isa)
            if dont:
                self.assertNotIn(dont, source, isa)
                self.assertNotIn(dont, code, isa)


class TestMoeGolden(GoldenTestCase):
    """awq::int4_moe through AwqMoeTemplate (entry/moe_inductor.cpp.j2): the call of the op's entry
    in its built library, with both GEMM shapes' plans rendered in; the link header inlined
    verbatim."""

    def test_int4_moe_avx512_dynamic(self):
        from awq_inductor.ops import moe

        E, H, I, G, k, T = 4, 128, 64, 64, 2, 6
        g = torch.Generator().manual_seed(21)
        canon = lambda n, kk: (torch.randint(0, 16, (n, kk), dtype=torch.uint8, generator=g),  # noqa: E731
                               torch.randint(0, 16, (n, kk // G), dtype=torch.uint8, generator=g),
                               torch.rand(n, kk // G, generator=g) * 0.05)
        mop = schemes.MOE_OPS["int4_moe"]
        W = moe.pack_experts(mop, [canon(2 * I, H) for _ in range(E)], [canon(H, I) for _ in range(E)], G, I)
        x = torch.randn(T, H, generator=g).bfloat16()
        tw, ids = torch.softmax(torch.randn(T, E, generator=g), -1).topk(k, -1)
        for t in (x, ids, tw):
            torch._dynamo.mark_dynamic(t, 0)
        f = torch.compile(lambda a, b, c: mop.torch_op(a, b, c, *W, G, I), fullgraph=True)
        with awq_config.patch(force_isa="avx512"):
            out, code = compile_code(f, x, ids, tw)
            # (4 Inductor threads here, the eager op's thread count may differ: K-slicing may too)
            assert_close_scaled(out, mop.torch_op(x, ids, tw, *W, G, I))
            header = codegen.render_driver_link("avx512", torch.bfloat16)
            library = moe.entry_library(mop, "avx512", torch.bfloat16)
        self.assertIn(f'#define AWQ_DRIVER_LIBRARY "{library}"', code)
        self.assertExpectedInline(self.golden_region(code, "int4_moe", header=header), """\
// BEGIN awq
extern "C"
void kernel(const at::BFloat16* X, const int64_t* IDS, const float* TW, const uint8_t* W13_QW, const float* W13_S, const uint8_t* W13_Z, const uint8_t* W2_QW, const float* W2_S, const uint8_t* W2_Z, at::BFloat16* Y, const int64_t s0)
{
    // awq::int4_moe  isa=avx512  E=4  H=128  I=64  G=64  top-k=2  threads=4
    constexpr int64_t E = 4;
    constexpr int64_t H = 128;
    constexpr int64_t I = 64;
    constexpr int64_t G = 64;
    constexpr int64_t topk = 2;
    const int64_t T = static_cast<int64_t>(s0);
    if (T <= 0) return;
    using awq_moe_t = void (*)(const void*, int64_t, const int64_t*, const float*, int64_t,
        const uint8_t*, const float*, const uint8_t*, const uint8_t*, const float*, const uint8_t*, void*, int64_t, int64_t, int64_t, int64_t, int,
        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
    static const auto awq_moe = reinterpret_cast<awq_moe_t>(awq::driver_entry(AWQ_DRIVER_LIBRARY, "awq_int4_moe_bfloat16"));
    awq_moe(X, T, IDS, TW, topk, W13_QW, W13_S, W13_Z,
        W2_QW, W2_S, W2_Z, Y, E, H, I, G, 4,
        5, 8, 9, 0, 0, 0, 0, 1, 1,  // gate|up plan: default
        5, 8, 9, 0, 0, 0, 0, 1, 1);  // down plan: default
}
// END awq""")


if __name__ == "__main__":
    import unittest

    unittest.main()
