"""One shared library per compiled graph (awq_inductor.inductor.graph_library): the C++ kernels of a
graph compiled by our backend are built by one g++ run, loaded again from the caches in the next
process, and built kernel by kernel where the library fails."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
import torch
from torch._inductor import config as iconfig

from awq_inductor.inductor import graph_library


def _kernels(x, w):
    # a softmax before an extern mm, a pointwise tail and a row sum after it: C++ kernels on both sides
    y = torch.softmax(x * 2, dim=-1)
    return (y @ w).sin() + x.sum(dim=-1, keepdim=True)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(32, 48, generator=g), torch.randn(48, 48, generator=g)


def test_library_source_renames_each_entry_and_binds_all():
    kernels = [(["const float*", "float*"], '#include <cstdint>\nextern "C"  void  kernel(const float* in_ptr0,\n float* out_ptr0)\n{ out_ptr0[0] = in_ptr0[0]; }'),
               (["float*", "const int64_t"], 'extern "C" \nvoid kernel(float* Y, const int64_t ks0)\n{ Y[0] = ks0; }')]
    src = graph_library.library_source(kernels)
    assert 'extern "C"  void  kernel_0(const float* in_ptr0' in src
    assert 'extern "C" \nvoid kernel_1(float* Y' in src
    assert not re.search(r"\bkernel\(", src)  # no entry left under Inductor's name
    assert "kernel_0(parse_arg<float*>(args, 0), parse_arg<float*>(args, 1));" in src
    assert "kernel_1(parse_arg<float*>(args, 0), parse_arg<int64_t>(args, 1));" in src
    assert src.count("PyInit_kernel(") == 1 and '{"kernel_1", kernel_1_py, METH_VARARGS, ""}' in src


_PROCESS = r"""
import torch
from torch._inductor.cpp_builder import CppBuilder
from awq_inductor.inductor import graph_library
import test_graph_library as t
builds = []
orig = CppBuilder.build
CppBuilder.build = lambda self: (builds.append(self.get_target_file_path()), orig(self))[1]
from torch._inductor.cpu_vec_isa import pick_vec_isa
pick_vec_isa()  # Inductor's ISA checks build their own probes: not counted
builds.clear()
x, w = t._inputs()
f = torch.compile(t._kernels, backend="awq_inductor")
torch.testing.assert_close(f(x, w), t._kernels(x, w), rtol=1e-4, atol=1e-4)
print("LIBRARIES", graph_library.libraries, "BUILDS", len(builds))
"""


def test_a_graphs_kernels_are_one_library_built_once_and_reused_by_the_next_process(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _PROCESS], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(next(l for l in out.stdout.splitlines() if l.startswith("LIBRARIES")))
    cold, warm = runs
    n = int(cold.split("[")[1].split("]")[0])
    assert n >= 2 and cold.endswith("BUILDS 1"), cold  # every kernel, one g++ run
    assert warm == cold[:-1] + "0", warm  # the next process: the same library from the caches, no build
    assert not list(tmp_path.glob("torchinductor_*/precompiled_headers/*.gch"))


def test_a_library_that_fails_is_built_kernel_by_kernel_with_one_warning(monkeypatch, caplog, inductor_clean):
    monkeypatch.setattr(graph_library, "library_source", lambda kernels: "this is not C++;")
    monkeypatch.setattr(graph_library, "_WARNED", set())
    built = list(graph_library.libraries)
    x, w = _inputs()
    with iconfig.patch(cpp_cache_precompile_headers=False), caplog.at_level(logging.WARNING, "awq_inductor"):
        f = torch.compile(_kernels, backend="awq_inductor")
        torch.testing.assert_close(f(x, w), _kernels(x, w), rtol=1e-4, atol=1e-4)
    warnings = [r.getMessage() for r in caplog.records if "one library failed" in r.getMessage()]
    assert len(warnings) == 1 and "building each kernel apart" in warnings[0], warnings
    assert graph_library.libraries == built


def test_libraries_include_the_precompiled_header_and_gcc_takes_it(monkeypatch, tmp_path, inductor_clean):
    """A graph's library is built with ``-include`` of our prefix header, whether or not its
    ``.gch`` exists yet (one cache key); once built, g++ takes the ``.gch`` for a library's flags
    (``-H`` marks a precompiled header it used with "!"; an invalid one with "x")."""
    import shlex

    from torch._inductor.codecache import CppPythonBindingsCodeCache
    from torch._inductor.cpp_builder import CppBuilder

    from awq_inductor.kernels import native

    seen = []
    load = CppPythonBindingsCodeCache.load_async
    monkeypatch.setattr(CppPythonBindingsCodeCache, "load_async",
                        lambda *a, **k: (seen.append(tuple(k.get("extra_flags", ()))), load(*a, **k))[1])
    x, w = _inputs()
    f = torch.compile(lambda a, b: _kernels(a, b) - 1, backend="awq_inductor")
    torch.testing.assert_close(f(x, w), _kernels(x, w) - 1, rtol=1e-4, atol=1e-4)
    header = graph_library.prefix_header()
    assert header.startswith(native.cache_dir()) and seen and set(seen) == {(f"-include {header}",)}, seen

    gch = graph_library.build_prefix_header()
    assert gch == header + ".gch" and os.path.getsize(gch) > 1 << 20
    src = tmp_path / "k.cpp"
    src.write_text('#include <torch/csrc/inductor/cpp_prefix.h>\n'
                   'extern "C" void kernel(float* y) { at::vec::Vectorized<float>(2.0f).store(y); }\n')
    options = graph_library._library_options(False, graph_library.prefix_header_flags() + ("-H",))
    command = CppBuilder(name=str(tmp_path / "k"), sources=str(src), BuildOption=options).get_command_line()
    out = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"! {gch}" in out.stderr, [l for l in out.stderr.splitlines() if "gch" in l or "awq_prefix" in l]


def test_the_header_is_precompiled_with_the_options_of_its_key(monkeypatch):
    """The .gch under a key is built with the flags that key was made from, even when the options of
    the moment differ (a test patching the vector ISA while a background thread builds the header)."""
    header = graph_library.prefix_header()
    before = graph_library.prefix_header_builder(header, "awq_prefix_check").get_command_line()
    real = graph_library._library_options
    monkeypatch.setattr(graph_library, "_library_options",
                        lambda precompiling, extra_flags=(): real(precompiling, ("-DAWQ_OTHER_FLAGS",)))
    after = graph_library.prefix_header_builder(header, "awq_prefix_check").get_command_line()
    assert after == before and "AWQ_OTHER_FLAGS" not in after
    # a header whose key this process did not make: the options of the moment
    assert "AWQ_OTHER_FLAGS" in graph_library.prefix_header_builder(header + ".other", "x").get_command_line()


def test_a_precompiled_header_that_fails_is_said_once_and_libraries_parse_it(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(graph_library, "_WARNED", set())
    monkeypatch.setattr(graph_library, "prefix_header", lambda: str(tmp_path / "awq_prefix.h"))

    def broken():
        raise RuntimeError("g++: internal compiler error: Killed")

    monkeypatch.setattr(graph_library, "build_prefix_header", broken)
    with caplog.at_level(logging.WARNING, "awq_inductor"):
        for _ in range(2):
            graph_library._build_prefix_header_quietly()
    said = [r.getMessage() for r in caplog.records if "no precompiled header" in r.getMessage()]
    assert len(said) == 1 and "internal compiler error" in said[0] and "2.5 s more per graph" in said[0], said
    assert graph_library.prefix_header_flags() == (f"-include {tmp_path / 'awq_prefix.h'}",)


def test_other_backends_and_kernels_built_apart_build_as_inductor_does(inductor_clean):
    built = list(graph_library.libraries)
    x, w = _inputs()
    with iconfig.patch(cpp_cache_precompile_headers=False):
        f = torch.compile(_kernels, backend="inductor")
        torch.testing.assert_close(f(x, w), _kernels(x, w), rtol=1e-4, atol=1e-4)
        with graph_library.kernels_built_apart():
            g = torch.compile(lambda a, b: _kernels(a, b) * 3, backend="awq_inductor")
            torch.testing.assert_close(g(x, w), _kernels(x, w) * 3, rtol=1e-4, atol=1e-4)
    assert graph_library.libraries == built


def test_a_graph_past_the_library_size_is_split_into_libraries(monkeypatch, inductor_clean):
    """More kernels than KERNELS_PER_LIBRARY: several libraries (built in parallel where Inductor has
    compile threads), each kernel still bound to its own entry."""
    monkeypatch.setattr(graph_library, "KERNELS_PER_LIBRARY", 1)
    before = len(graph_library.libraries)
    x, w = _inputs()
    f = torch.compile(_kernels, backend="awq_inductor")
    torch.testing.assert_close(f(x, w), _kernels(x, w), rtol=1e-4, atol=1e-4)
    added = graph_library.libraries[before:]
    assert len(added) >= 2 and set(added) == {1}, added


def test_a_torch_without_the_hooks_compiles_with_inductors_builds_said_once(monkeypatch, caplog):
    """Where this torch's AsyncCompile lacks what graph_library wraps, the backend's compile goes on
    with Inductor's per-kernel builds and says so once, naming the error."""
    import contextlib

    from awq_inductor.inductor import lowering

    def moved():
        raise AttributeError("type object 'AsyncCompile' has no attribute 'cpp_pybinding'")

    monkeypatch.setattr(graph_library, "one_library_per_graph", moved)
    monkeypatch.setattr(lowering, "_SAID", set())
    with caplog.at_level(logging.WARNING):
        contexts = [lowering.graph_library_context() for _ in range(2)]
    assert all(isinstance(c, contextlib.nullcontext) for c in contexts)
    said = [r.getMessage() for r in caplog.records if "one-library-per-graph" in r.getMessage()]
    assert len(said) == 1 and "cpp_pybinding" in said[0], said


def _behind_build_gate(monkeypatch, fail: bool = False):
    """``_build`` held until the returned event is set (then built as usual, or raising)."""
    import threading

    gate = threading.Event()
    build = graph_library._build

    def held(batch):
        assert gate.wait(60)
        if fail:
            raise RuntimeError("g++ said no")
        return build(batch)

    monkeypatch.setattr(graph_library, "_build", held)
    return gate


def test_a_graph_runs_eager_until_its_library_is_built_behind_it(monkeypatch, inductor_clean):
    """compile_for_generate's backend: the first calls run the graph's own FX code while the
    library builds in the background, later calls the library's kernels, for good; the plain
    backend builds before its first call returns."""
    from awq_inductor.inductor.backend import awq_inductor_backend_behind
    from awq_inductor.integrations.generation import wait_until_compiled

    gate = _behind_build_gate(monkeypatch)
    x, w = _inputs()
    built, eager = list(graph_library.libraries), graph_library.eager_calls[0]
    f = torch.compile(_kernels, backend=awq_inductor_backend_behind)
    for _ in range(2):
        torch.testing.assert_close(f(x, w), _kernels(x, w), rtol=1e-4, atol=1e-4)
    assert graph_library.eager_calls[0] == eager + 2 and graph_library.libraries == built
    assert not wait_until_compiled(timeout=0.05)
    gate.set()
    assert wait_until_compiled(timeout=60)
    assert len(graph_library.libraries) == len(built) + 1  # built by the background thread
    for _ in range(2):
        torch.testing.assert_close(f(x, w), _kernels(x, w), rtol=1e-4, atol=1e-4)
    assert graph_library.eager_calls[0] == eager + 2  # compiled from now on
    torch._dynamo.reset()
    g = torch.compile(_kernels, backend="awq_inductor")
    torch.testing.assert_close(g(x * 3, w), _kernels(x * 3, w), rtol=1e-4, atol=1e-4)
    assert graph_library.eager_calls[0] == eager + 2


def test_a_library_that_fails_behind_its_graph_raises_at_the_first_compiled_call(monkeypatch, inductor_clean):
    """Never eager for good in silence: the build's error comes back where the compiled code is
    first called."""
    from awq_inductor.inductor.backend import awq_inductor_backend_behind
    from awq_inductor.integrations.generation import wait_until_compiled

    gate = _behind_build_gate(monkeypatch, fail=True)
    x, w = _inputs()
    f = torch.compile(_kernels, backend=awq_inductor_backend_behind)
    torch.testing.assert_close(f(x, w), _kernels(x, w), rtol=1e-4, atol=1e-4)
    gate.set()
    assert wait_until_compiled(timeout=60)
    with pytest.raises(RuntimeError, match="g\\+\\+ said no"):
        f(x, w)
