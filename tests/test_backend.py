"""The "awq_inductor" torch.compile backend and the FX-cache pass."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as iconfig
from torch._inductor.utils import run_and_get_code

from helpers import op_args
from awq_inductor import inductor
from awq_inductor.ops import oracles
from awq_inductor.inductor import lowering

_seed = [99]


def weights(N=64, K=128, G=32):
    _seed[0] += 1
    return op_args("int4_mm", N, K, G, bias=False, seed=_seed[0], scale=0.05, signed=False)


def ref(x, w):
    from awq_inductor import ops

    return oracles.int4_mm("int4_mm", x, *w)


@pytest.fixture(autouse=True)
def _clean():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def test_backend_by_name_uses_template():
    import awq_inductor.inductor.backend  # noqa: F401

    w = weights()
    x = torch.randn(5, 128)
    with iconfig.patch(force_disable_caches=True):
        out, codes = run_and_get_code(torch.compile(lambda a: torch.ops.awq.int4_mm(a, *w) * 2,
                                                    backend="awq_inductor"), x)
    torch.testing.assert_close(out, ref(x, w) * 2, atol=1e-4, rtol=1e-4)
    code = "\n".join(codes)
    assert "awq_int4_mm_driver_" in code and "torch.ops.awq.int4_mm" not in code
    assert counters["inductor"]["cpp_epilogue_fusion_counter"] == 1


def test_backend_config_patches():
    from awq_inductor.inductor.backend import backend_config_patches

    p = backend_config_patches({"cpp.threads": 3})
    assert p["freezing"] is False and p["cpp.threads"] == 3 and p["cpp.min_chunk_size"] == 32768
    assert backend_config_patches({"cpp.min_chunk_size": 512})["cpp.min_chunk_size"] == 512  # options win
    assert type(p["post_grad_custom_post_pass"]).__name__ == "AwqCachePass"
    other = lowering.cache_pass()
    p2 = backend_config_patches({"post_grad_custom_post_pass": [object()]})
    assert len(p2["post_grad_custom_post_pass"]) == 2 and other.uuid() == lowering.cache_uuid()


def test_one_row_pointwise_kernels_stay_serial():
    """A decode step's RMSNorm + residual on one 7168-wide row compiles without an OpenMP region
    (on a shared 2-core machine each region waited for a descheduled thread: backend.MIN_CHUNK_ELEMENTS);
    the same kernel on 64 rows (prefill) keeps one."""
    from torch._inductor.utils import run_and_get_code

    def f(x, r, w):
        h = x.float() + r.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(torch.bfloat16)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w = torch.randn(7168).bfloat16()
        codes = {}
        for rows in (1, 64):
            torch._dynamo.reset()
            x, r = torch.randn(rows, 7168).bfloat16(), torch.randn(rows, 7168).bfloat16()
            cf = torch.compile(f, backend="awq_inductor", dynamic=False)
            out, code = run_and_get_code(cf, x, r, w)
            torch.testing.assert_close(out.float(), f(x, r, w).float(), atol=2e-2, rtol=2e-2)
            codes[rows] = "\n".join(code)
    finally:
        torch.set_num_threads(before)
        torch._dynamo.reset()
    assert "cpp_fused" in codes[1] and "#pragma omp parallel" not in codes[1]
    assert "#pragma omp parallel" in codes[64]


def test_cache_pass_uuid_tracks_templates(monkeypatch, tmp_path):
    """Editing a template changes the pass uuid, hence the FX graph cache key: a cached graph is
    hit without edits and missed (new kernel compiled) after one."""
    import awq_inductor.inductor.backend as backend

    before = lowering.cache_pass().uuid()
    assert before == lowering.cache_pass().uuid()

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    w = weights()
    x = torch.randn(4, 128)

    def fn(a):
        return torch.ops.awq.int4_mm(a, *w) + 1

    def compile_once():
        torch._dynamo.reset()
        with iconfig.patch({"fx_graph_cache": True, "fx_graph_remote_cache": False,
                            "force_disable_caches": False}):
            out, codes = run_and_get_code(torch.compile(fn, backend=backend.awq_inductor_backend), x)
        torch.testing.assert_close(out, ref(x, w) + 1, atol=1e-4, rtol=1e-4)
        return "\n".join(codes)

    from torch._inductor.codecache import FxGraphCache  # noqa: F401

    compile_once()
    assert counters["inductor"]["fxgraph_cache_miss"] == 1
    compile_once()
    assert counters["inductor"]["fxgraph_cache_hit"] == 1

    # "Edit a template": the rendered header changes and so does codegen.templates_hash().
    cg = lowering.codegen
    orig_render = cg.render_driver_link
    monkeypatch.setattr(cg, "render_driver_link", lambda *a: "// edited-template\n" + orig_render(*a))
    monkeypatch.setattr(cg, "templates_hash", lambda: "edited-template")
    after = lowering.cache_pass().uuid()
    assert after != before
    code = compile_once()
    assert counters["inductor"]["fxgraph_cache_miss"] == 2
    assert "// edited-template" in code  # the new kernel, not the stale cached one


def test_sources_hash_covers_j2_files(monkeypatch, tmp_path):
    tdir = tmp_path / "csrc_templates"
    tdir.mkdir()
    src = lowering.templates_dir()
    for f in src.rglob("*.j2"):
        (tdir / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (tdir / f.relative_to(src)).write_bytes(f.read_bytes())
    monkeypatch.setattr(lowering, "templates_dir", lambda: tdir)
    h0 = lowering.sources_hash()
    (tdir / lowering.TEMPLATE_NAME).write_text((tdir / lowering.TEMPLATE_NAME).read_text() + "\n// edit\n")
    h1 = lowering.sources_hash()
    assert h1 != h0
    for name in (lowering.MOE_TEMPLATE_NAME, "moe/experts.h.j2"):  # the MoE template and its library's experts loop
        (tdir / name).write_text((tdir / name).read_text() + "\n// edit\n")
        assert lowering.sources_hash() != h1
        h1 = lowering.sources_hash()


def test_sources_hash_reads_files_that_exist():
    files = lowering.hashed_sources()
    assert all(f.is_file() for f in files), [str(f) for f in files if not f.is_file()]
    assert {"plan.py", "moe.py", "lowering.py"} <= {f.name for f in files}


def test_entry_point_without_importing_package():
    """torch.compile(backend="awq_inductor") resolves through the pyproject entry point."""
    from importlib.metadata import entry_points

    if "awq_inductor" not in entry_points(group="torch_dynamo_backends").names:
        pytest.skip("package not installed (pip install -e . --no-deps)")
    code = textwrap.dedent("""
        import sys, torch
        assert "awq_inductor" not in sys.modules
        f = torch.compile(lambda a: a.sin() + 1, backend="awq_inductor")
        x = torch.randn(8)
        torch.testing.assert_close(f(x), x.sin() + 1)
        assert "awq_inductor.inductor.backend" in sys.modules
        import awq_inductor.inductor as I
        assert I.is_registered()
        print("OK")
    """)
    env = dict(os.environ, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def test_untested_torch_version_warns_and_skips(monkeypatch):
    monkeypatch.setattr(inductor, "_registered", None)
    monkeypatch.setattr(inductor, "_warned", False)
    monkeypatch.setattr(torch, "__version__", "9.1.0")
    monkeypatch.delenv(inductor.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="not the tested"):
        assert inductor.register() is False
    assert inductor.register() is False  # idempotent, warns once


@pytest.mark.skipif(not __import__("awq_inductor").ops.head_bf16.gemv_available(), reason="needs AVX512-BF16")
def test_bf16_linears_are_routed_to_the_gemv():
    """A router-like 2-D bf16 F.linear runs awq::bf16_linear in the compiled code (decode rows on
    our GEMV); 3-D x, fp32, and a non-contiguous weight keep F.linear. Results within one bf16
    rounding of an fp32 matmul, at 1 row and at 7 (F.linear inside the op)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(128, 256, generator=g).bfloat16()
    wt = torch.randn(256, 96, generator=g).bfloat16().t()  # [96, 256], not contiguous
    b = torch.randn(128, generator=g).bfloat16()

    def f(x2, x3, xf):
        return (torch.nn.functional.linear(x2, w), torch.nn.functional.linear(x2, w, b),
                torch.nn.functional.linear(x3, w), torch.nn.functional.linear(x2, wt),
                torch.nn.functional.linear(xf, w.float()))

    for M in (1, 7):
        x2 = torch.randn(M, 256, generator=g).bfloat16()
        xf = x2.float()
        with iconfig.patch(force_disable_caches=True), torch.no_grad():
            outs, codes = run_and_get_code(torch.compile(f, backend="awq_inductor", dynamic=False),
                                           x2, x2[None], xf)
        code = "\n".join(codes)
        assert code.count("= torch.ops.awq.bf16_linear.default(") == 2, code
        wf = w.float()
        for y, exp in zip(outs[:2], (xf @ wf.T, xf @ wf.T + b.float())):
            assert y.dtype == torch.bfloat16
            torch.testing.assert_close(y.float(), exp, atol=2e-2, rtol=8e-3)
        torch.testing.assert_close(outs[2][0].float(), xf @ wf.T, atol=2e-2, rtol=8e-3)
        torch._dynamo.reset()


def test_bf16_linear_keeps_autograd_with_grad_enabled():
    """With grad mode on (training), the op (no autograd formula) is not substituted: gradients
    still reach the weight."""
    w = torch.randn(16, 32).bfloat16().requires_grad_()
    x = torch.randn(1, 32).bfloat16()
    with iconfig.patch(force_disable_caches=True):
        out, codes = run_and_get_code(torch.compile(lambda a: torch.nn.functional.linear(a, w).sum(),
                                                    backend="awq_inductor"), x)
    assert "bf16_linear" not in "\n".join(codes)
    out.backward()
    torch.testing.assert_close(w.grad.float(), x.float().expand(16, 32), atol=1e-2, rtol=1e-2)


def test_bf16_linear_stays_aten_without_the_gemv(monkeypatch):
    from awq_inductor.ops import head_bf16 as bf16_head

    w = torch.randn(16, 32).bfloat16()
    monkeypatch.setattr(bf16_head, "gemv_available", lambda: False)
    x = torch.randn(1, 32).bfloat16()
    with iconfig.patch(force_disable_caches=True), torch.no_grad():
        out, codes = run_and_get_code(torch.compile(lambda a: torch.nn.functional.linear(a, w),
                                                    backend="awq_inductor"), x)
    assert "bf16_linear" not in "\n".join(codes)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w))


def test_vec_isa_probe_is_remembered_beside_its_library(monkeypatch, tmp_path):
    """A dlopen probe of Inductor's vector-ISA check that passed once is not spawned again (its marker
    sits beside the probe library); one that failed leaves no marker and runs again."""
    import subprocess

    from torch._inductor.cpu_vec_isa import VecAVX2, VecISA

    from awq_inductor.inductor import lowering

    assert lowering.remember_vec_isa_probes() and lowering.remember_vec_isa_probes()  # idempotent
    children = []

    def child(cmd, **kw):
        children.append(cmd)
        if "bad" in cmd[-1]:
            raise subprocess.CalledProcessError(1, cmd)

    monkeypatch.setattr(subprocess, "run", child)
    good, bad = str(tmp_path / "good.so"), str(tmp_path / "bad.so")
    assert VecISA._probe_load(VecAVX2(), good) and VecISA._probe_load(VecAVX2(), good)
    assert len(children) == 1 and (tmp_path / ("good.so" + lowering.PROBE_OK_SUFFIX)).exists()
    assert not VecISA._probe_load(VecAVX2(), bad) and not VecISA._probe_load(VecAVX2(), bad)
    assert len(children) == 3 and not (tmp_path / ("bad.so" + lowering.PROBE_OK_SUFFIX)).exists()


@pytest.mark.parametrize("passing", [("VecAVX512VNNI", "VecAVX512", "VecAVX2"), ("VecAVX512", "VecAVX2"), ("VecAVX2",)])
def test_heavy_isa_check_is_inferred_for_a_flag_subset(monkeypatch, passing):
    """Inductor's heavy vector-ISA check is built for AVX512-VNNI; AVX512 (a subset of its flags) and
    AVX2 (flags -mavx512f implies) are answered from the first AVX512 result that passed, and built
    where none did."""
    from torch._inductor.cpu_vec_isa import VecAVX2, VecAVX512, VecAVX512VNNI, VecISA

    from awq_inductor.inductor import lowering

    built = []

    def fake_check(self, code):
        built.append((type(self).__name__, code == VecISA._avx_code))
        return type(self).__name__ in passing

    monkeypatch.setattr(VecISA, "check_build", fake_check)
    assert lowering.infer_subset_isa_checks() and lowering.infer_subset_isa_checks()  # idempotent
    for isa in (VecAVX512VNNI(), VecAVX512(), VecAVX2()):
        assert VecISA.check_build(isa, VecISA._avx_code) is (type(isa).__name__ in passing)
    VecISA.check_build(VecAVX512(), "int main() {}")  # other probes are always built
    first = ["VecAVX512VNNI", "VecAVX512", "VecAVX2"].index(passing[0])
    expected = [(name, True) for name in ["VecAVX512VNNI", "VecAVX512", "VecAVX2"][:first + 1]]
    assert built == expected + [("VecAVX512", False)]


def test_intrinsic_isa_checks_are_answered_from_our_own_builds(monkeypatch):
    """Inductor's short AVX512-BF16 / VNNI intrinsic checks: answered where a library of ours was
    built with a superset of the check's flags, built otherwise."""
    from torch._inductor.cpu_vec_isa import VecAVX512, VecAVX512VNNI, VecISA

    from awq_inductor.inductor import lowering
    from awq_inductor.kernels import native

    built = []
    monkeypatch.setattr(VecISA, "check_build", lambda self, code: built.append(code) is None and False)
    monkeypatch.setattr(native, "_BUILT_FLAGS", set())
    assert lowering.infer_subset_isa_checks()
    vnni_code, bf16_code = VecAVX512VNNI._avx512_vnni_code, VecAVX512._avx512_bf16_code
    vnni = VecAVX512VNNI()
    assert VecISA.check_build(vnni, vnni_code) is False and built == [vnni_code]  # no build of ours yet
    native._BUILT_FLAGS.add(frozenset(["-O3", "-fopenmp", *vnni.build_arch_flags().split(), "-mavx512bf16"]))
    assert VecISA.check_build(vnni, vnni_code) is True and built == [vnni_code]
    avx512 = VecAVX512()
    avx512._arch_flags += " -mavx512bf16"  # as VecAVX512.__bool__ does around its check
    assert VecISA.check_build(avx512, bf16_code) is True and built == [vnni_code]
    native._BUILT_FLAGS.clear()
    native._BUILT_FLAGS.add(frozenset(["-O3", "-mavx512f"]))  # flags not covered: built
    assert VecISA.check_build(vnni, vnni_code) is False and built == [vnni_code, vnni_code]


def test_intrinsic_isa_checks_wait_for_a_build_of_ours_in_flight(monkeypatch):
    """A short check (AMX's tile intrinsics here) asked while a library of ours with a superset of
    its flags is being built waits for that build instead of running a g++ of its own beside it; where
    that build fails, the check is built as before."""
    import threading

    from torch._inductor.cpu_vec_isa import VecAMX, VecISA

    from awq_inductor.inductor import lowering
    from awq_inductor.kernels import native

    built = []
    monkeypatch.setattr(VecISA, "check_build", lambda self, code: built.append(code) is None and False)
    monkeypatch.setattr(native, "_BUILT_FLAGS", set())
    monkeypatch.setattr(native, "_FLIGHT", [])
    assert lowering.infer_subset_isa_checks()
    amx = VecAMX()
    flags = frozenset(["-O3", *amx.build_arch_flags().split(), "-mavx512bf16"])

    def one_check(build_succeeds: bool):
        release, answers = threading.Event(), []

        def fake_build():
            with native._in_flight(flags):
                release.wait(30)
                if build_succeeds:
                    native._BUILT_FLAGS.add(flags)

        builder = threading.Thread(target=fake_build)
        builder.start()
        while not native._FLIGHT:
            time.sleep(0.001)
        checker = threading.Thread(target=lambda: answers.append(VecISA.check_build(amx, VecAMX._amx_code)))
        checker.start()
        time.sleep(0.2)
        waited = answers == []  # still waiting for the build
        release.set()
        checker.join(30)
        builder.join(30)
        return waited, answers

    assert one_check(True) == (True, [True]) and built == []
    with native._in_flight(flags):  # another build of ours running: a check already proven does not wait for it
        answers = []
        checker = threading.Thread(target=lambda: answers.append(VecISA.check_build(amx, VecAMX._amx_code)))
        checker.start()
        checker.join(5)
        assert answers == [True] and built == []
    native._BUILT_FLAGS.clear()
    assert one_check(False) == (True, [False]) and built == [VecAMX._amx_code]


_REBUILD_SCRIPT = textwrap.dedent("""
    import glob, os, sys, torch
    sys.path.insert(0, {tests!r})
    from helpers import op_args
    from torch._dynamo.utils import counters
    from torch._inductor import config as iconfig
    from awq_inductor.inductor import backend
    from awq_inductor.kernels import native
    from awq_inductor.ops import oracles

    w = op_args("int4_mm", 64, 128, 32, bias=False, seed=5, scale=0.05, signed=False)
    x = torch.randn(5, 128)
    with iconfig.patch({{"fx_graph_cache": True, "fx_graph_remote_cache": False, "force_disable_caches": False}}):
        f = torch.compile(lambda a: torch.ops.awq.int4_mm(a, *w) + 1, backend=backend.awq_inductor_backend)
        torch.testing.assert_close(f(x), oracles.int4_mm("int4_mm", x, *w) + 1, atol=1e-4, rtol=1e-4)
    print("hits", counters["inductor"]["fxgraph_cache_hit"], "libraries",
          len(glob.glob(os.path.join(native.cache_dir(), "awq_int4_mm_*.so"))))
""")


def test_cached_graph_finds_its_driver_library_rebuilt(tmp_path):
    """A graph found in Inductor's cache by a new process after our kernel cache was cleared: the
    backend rebuilds the library its kernel calls (else the kernel's lookup aborts the process)."""
    awq_cache = tmp_path / "awq"
    env = dict(os.environ, AWQ_INDUCTOR_CACHE_DIR=str(awq_cache), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    script = _REBUILD_SCRIPT.format(tests=os.path.dirname(__file__))

    def child():
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]

    assert child() == "hits 0 libraries 1"
    for lib in awq_cache.glob("awq_int4_mm_*.so"):
        lib.unlink()
    assert child() == "hits 1 libraries 1"
