"""Golden tests of OUR generated C++ (the region between ``// BEGIN awq`` and ``// END awq``).

Regenerate with ``EXPECTTEST_ACCEPT=1 pytest tests/test_goldens.py``.

Normalisation: size symbols ``\\bk?s\\d+\\b`` -> ``s0``; trailing spaces stripped; the body of the
store lambda (Inductor's own epilogue code from ``kernel.store_output``, which depends on Inductor's
vector ISA and version) replaced by ``<inductor store_output>`` and checked separately. The inlined
awq header (micro-kernels + driver) is not goldened: we check it is exactly
``codegen.render_header(isa, dtype)``. ``cpp.threads`` is pinned to 4, caches are disabled and a
fresh TORCHINDUCTOR_CACHE_DIR is used.
"""
from __future__ import annotations

import re
import unittest.mock

import expecttest
import pytest
import torch
from torch._inductor import config as iconfig
from torch._inductor.utils import run_and_get_code

from awq_inductor import codegen, lowering, packing
from awq_inductor import config as awq_config

AMX_RUNS = bool(torch.cpu._is_amx_tile_supported())
N, K, G = 72, 128, 64


class _Captured(Exception):
    pass


def capture_code_only(fn, *args):
    """Generate the module code without compiling it (for an ISA this CPU cannot build/run)."""
    from torch._inductor.graph import GraphLowering

    codes = []

    def fake_compile_to_module(self):
        wrapper_code, kernel_code = self.codegen()
        codes.append(wrapper_code.value)
        raise _Captured()

    torch._dynamo.reset()
    with unittest.mock.patch.object(GraphLowering, "compile_to_module", fake_compile_to_module):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - dynamo wraps our sentinel
            if not codes:
                raise
            del e
    return codes


def awq_region(code: str) -> str:
    i, j = code.index("// BEGIN awq"), code.index("// END awq")
    text = code[i: j + len("// END awq")]
    text = re.sub(r"\bk?s\d+\b", "s0", text)
    lines = [ln.rstrip() for ln in text.splitlines()]
    out, skipping = [], False
    for ln in lines:
        if skipping:
            if ln.strip() == "});":
                out.append(" " * 12 + "<inductor store_output>")
                out.append(ln)
                skipping = False
            continue
        out.append(ln)
        if "awq_acc_buf = const_cast<float*>(awq_acc);" in ln or "// store_output:" in ln:
            skipping = True
    return "\n".join(out)


class TestGoldens(expecttest.TestCase):
    def setUp(self):
        assert lowering.register()
        torch._dynamo.reset()
        self._tmp = __import__("tempfile").TemporaryDirectory()
        self._env = unittest.mock.patch.dict("os.environ", {"TORCHINDUCTOR_CACHE_DIR": self._tmp.name})
        self._env.start()
        self._cfg = iconfig.patch({"force_disable_caches": True, "cpp.threads": 4})
        self._cfg.__enter__()
        g = torch.Generator().manual_seed(7)
        q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
        z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
        s = torch.rand(N, K // G, generator=g) * 0.05
        self.w = (*packing.pack_for_kernel(q, z, s, G), torch.randn(N, generator=g), G, N)

    def tearDown(self):
        self._cfg.__exit__(None, None, None)
        self._env.stop()
        self._tmp.cleanup()
        torch._dynamo.reset()

    def gen(self, isa: str, dynamic: bool, dtype=torch.bfloat16) -> str:
        x = torch.randn(8, K, dtype=dtype)
        if dynamic:
            torch._dynamo.mark_dynamic(x, 0)
        f = torch.compile(lambda a: torch.ops.awq.int4_mm(a, *self.w), fullgraph=True)
        with awq_config.patch(force_isa=isa):
            if isa != "amx" or AMX_RUNS:
                out, codes = run_and_get_code(f, x)
                from awq_inductor.ops import int4_mm_reference

                ref = int4_mm_reference(x, *self.w).float()
                torch.testing.assert_close(out.float() / ref.abs().max(), ref / ref.abs().max(),
                                           atol=2e-2, rtol=2e-2)
            else:
                codes = capture_code_only(f, x)
        code = "\n".join(codes)
        self.assertNotIn("torch.ops.awq.int4_mm", code)
        self.assertIn(codegen.render_header(isa, dtype), code)  # inlined, verbatim (not goldened)
        region = code[code.index("// BEGIN awq"): code.index("// END awq")]
        self.assertRegex(region, r"\.store\(Y \+|Y\[")  # Inductor's store writes the output
        return awq_region(code)

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
    awq::int4_mm_driver(
        X, M, QW, S, Z, B, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            float* awq_acc_buf = const_cast<float*>(awq_acc);
            <inductor store_output>
        });
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
    awq::int4_mm_driver(
        X, M, QW, S, Z, B, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            float* awq_acc_buf = const_cast<float*>(awq_acc);
            <inductor store_output>
        });
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
    awq::int4_mm_driver(
        X, M, QW, S, Z, B, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            float* awq_acc_buf = const_cast<float*>(awq_acc);
            <inductor store_output>
        });
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
    awq::int4_mm_driver(
        X, M, QW, S, Z, B, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            float* awq_acc_buf = const_cast<float*>(awq_acc);
            <inductor store_output>
        });
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
    awq::int4_mm_driver(
        X, M, QW, S, Z, B, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            float* awq_acc_buf = const_cast<float*>(awq_acc);
            <inductor store_output>
        });
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
    awq::int4_mm_driver(
        X, M, QW, S, Z, B, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            float* awq_acc_buf = const_cast<float*>(awq_acc);
            <inductor store_output>
        });
}
// END awq""")

    def test_silu_mul_avx512_dynamic(self):
        """awq::int4_mm_silu_mul: driver N = 2I interleaved gate|up columns, silu(g) * u into a local
        [TILE_M, 32] tile, then Inductor's store_output (here with a fused residual add)."""
        I = 64
        g = torch.Generator().manual_seed(8)
        q = torch.randint(0, 16, (2 * I, K), dtype=torch.uint8, generator=g)
        z = torch.randint(0, 16, (2 * I, K // G), dtype=torch.uint8, generator=g)
        s = torch.rand(2 * I, K // G, generator=g) * 0.05
        w = (*packing.pack_gate_up_for_kernel(q, z, s, G, I), None, G, I)
        x = torch.randn(8, K, dtype=torch.bfloat16)
        r = torch.randn(8, I, dtype=torch.bfloat16)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(r, 0)
        f = torch.compile(lambda a, b: torch.ops.awq.int4_mm_silu_mul(a, *w) + b, fullgraph=True)
        with awq_config.patch(force_isa="avx512"):
            out, codes = run_and_get_code(f, x, r)
        from awq_inductor.ops import int4_mm_silu_mul_reference

        ref = int4_mm_silu_mul_reference(x.float(), *w) + r.float()
        torch.testing.assert_close(out.float() / ref.abs().max(), ref / ref.abs().max(), atol=2e-2, rtol=2e-2)
        code = "\n".join(codes)
        self.assertNotIn("torch.ops.awq.int4_mm", code)
        region = code[code.index("// BEGIN awq"): code.index("// END awq")]
        self.assertRegex(region, r"awq_silu_mul_buf \+")  # Inductor's epilogue reads the silu*mul tile
        self.assertExpectedInline(awq_region(code), """\
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
    awq::int4_mm_driver(
        X, M, QW, S, Z, nullptr, N, K, G, 4,
        [&](const float* awq_acc, int64_t m_start, int64_t m_end, int64_t n_start, int64_t n_end) {
            // tiles are 64 wide and 64-aligned (I % 32 == 0): columns [n_start, n_start + 32) are gate,
            // [n_start + 32, n_end) up, for the outputs [o_start, o_start + 32)
            const int64_t o_start = n_start / 2;
            alignas(64) float _awq_silu_mul_buf[static_cast<int64_t>(1024L)]; float* awq_silu_mul_buf = _awq_silu_mul_buf;
            awq::silu_mul_tile(awq_acc, m_end - m_start, awq_silu_mul_buf, 32);
            // store_output: Inductor's epilogues over the silu(gate) * up tile
            <inductor store_output>
        });
}
// END awq""")

    def test_isa_specific_kernels_inlined(self):
        """AMX code has the tile kernel, AVX512 the dpbf16 decode kernel (M=1), portable neither."""
        for isa, want, dont in (("amx", "_tile_dpbf16ps", None), ("avx512", "_mm512_dpbf16_ps", "_tile_"),
                                ("portable", None, "_mm512_dpbf16_ps")):
            with awq_config.patch(force_isa=isa):
                x = torch.randn(1 if isa != "amx" else 64, K, dtype=torch.bfloat16)
                f = torch.compile(lambda a: torch.ops.awq.int4_mm(a, *self.w))
                code = "\n".join(capture_code_only(f, x))
            if want:
                self.assertIn(want, code, isa)
            if dont:
                self.assertNotIn(dont, code, isa)


if __name__ == "__main__":
    import unittest

    unittest.main()
