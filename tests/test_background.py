"""Background C++ builds and the tuner's clock (kernels.background), and the Inductor warm-up
(inductor.lowering.warm_compiler) that runs in one."""
from __future__ import annotations

import threading
import time

import pytest

from awq_inductor.kernels import background


def test_a_background_build_step_waits_while_the_tuner_measures():
    events = []
    measuring = threading.Event()
    released = threading.Event()

    def timing():
        with background.quiet_for_timing():
            measuring.set()
            released.wait(5)
            events.append("timing done")

    tuner = threading.Thread(target=timing)
    tuner.start()
    measuring.wait(5)

    def build():
        with background.build_step():
            events.append("build")

    t = background.start("test-build", build)
    time.sleep(0.2)
    assert events == []  # held back while the clock runs
    released.set()
    t.join(5)
    tuner.join(5)
    assert events == ["timing done", "build"]


def test_the_tuner_waits_for_a_running_build_step():
    events = []
    building = threading.Event()

    def build():
        with background.build_step():
            building.set()
            time.sleep(0.3)
            events.append("build done")

    t = background.start("test-build", build)
    building.wait(5)
    with background.quiet_for_timing():
        events.append("timing")
    t.join(5)
    assert events == ["build done", "timing"]


def test_build_steps_of_the_main_thread_do_not_wait():
    with background.quiet_for_timing():
        with background.build_step():  # would deadlock if it counted here
            pass


def test_a_failing_background_build_is_not_raised_in_the_thread(caplog):
    t = background.start("test-fail", lambda: 1 / 0)
    t.join(5)
    assert not t.is_alive()


def test_tune_missing_times_inside_one_quiet_block(monkeypatch):
    """The tuner at load holds background builds off for all its shapes, not shape by shape (and for
    the machine's decode setting, measured first: the shapes' plans hold under it)."""
    import torch

    from awq_inductor import config
    from awq_inductor.kernels import isa as isa_mod, native, plan as kplan, tuning_cache
    from awq_inductor.schemes import GATE_UP_SILU, LINEAR, op_for

    if not isa_mod.select().avx512_bf16 or native.emulated(isa_mod.select()):
        pytest.skip("the tuner measures only where the AVX512-BF16 kernels run natively")
    depth = []
    monkeypatch.setattr(config, "tune", "auto")
    monkeypatch.setattr(tuning_cache, "_cached", lambda path, key, decode=None: None)
    monkeypatch.setattr(tuning_cache, "_memo", {})
    monkeypatch.setattr(tuning_cache, "decode_setting",
                        lambda isa, scheme: (depth.append(background._measuring), kplan.DEFAULT_DECODE)[1])
    monkeypatch.setattr(tuning_cache, "_measure", lambda s, isa, dt, decode=None: depth.append(background._measuring))
    monkeypatch.setattr(native, "get_kernel", lambda *a: depth.append(("built", background._measuring)))
    shapes = [tuning_cache.Shape(op_for(None, LINEAR), 256, 256, 64),
              tuning_cache.Shape(op_for(None, GATE_UP_SILU), 256, 512, 64)]
    assert tuning_cache.tune_missing(shapes, torch.bfloat16, show=False, weight_bytes=1 << 40) == 2  # streamed
    assert depth[:2] == [("built", 0), 1]  # the decode kernel built, then its setting measured
    assert depth[2:4] == [("built", 0), ("built", 0)]  # the shapes' kernels, before their block
    assert depth[4:] == [1, 1]  # 2 shapes, one block


def test_warm_compiler_picks_inductors_isa_and_builds_no_header(tmp_path):
    """In a fresh process with fresh Inductor caches: the warm-up's ISA is Inductor's pick, it
    builds no precompiled header, and neither does a graph compiled by our backend afterwards
    (its kernels are one library: inductor.graph_library, whose header is precompiled ahead of
    time only)."""
    import os
    import subprocess
    import sys

    code = r"""
import threading
import torch
from torch._inductor.cpp_builder import CppBuilder
from awq_inductor.inductor import lowering
from awq_inductor.integrations.generation import warm_inductor
built = []
orig = CppBuilder.build
CppBuilder.build = lambda self: (built.append(self.get_target_file_path()), orig(self))[1]
warm_inductor()
for th in threading.enumerate():
    if th.name.startswith("awq-warm"):
        th.join()
print("WARM PCH", [b for b in built if b.endswith(".gch")])
from torch._inductor.cpu_vec_isa import pick_vec_isa
f = torch.compile(lambda x: (x * 2).relu() + 1, backend="awq_inductor")
x = torch.randn(64, 64)
torch.testing.assert_close(f(x), (x * 2).relu() + 1, rtol=0, atol=0)
print("ISA", lowering.warm_compiler(), "|", pick_vec_isa())
print("PCH", [b for b in built if b.endswith(".gch")])
"""
    # our cache fresh too, not the session's, whose header a background thread may be building. The
    # graph is exact arithmetic (relu): with sin, the compiled graph (Sleef sinf u35) differed from
    # eager (MKL vsSin, high accuracy) by up to 1.5e-4 in 2 of 4 full runs on an AMX Xeon and in
    # one CI run, never alone (0 of 27 here, also under load): cause not found; this test is about
    # the ISA pick and the headers, not transcendental accuracy
    env = dict(os.environ, TMPDIR=str(tmp_path), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"),
               AWQ_INDUCTOR_CACHE_DIR=str(tmp_path / "awq"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    isa_line = next(l for l in out.stdout.splitlines() if l.startswith("ISA"))
    warm, picked = isa_line[4:].split(" | ")
    assert warm == picked
    assert "WARM PCH []" in out.stdout and "\nPCH []" in out.stdout, out.stdout
    assert not list(tmp_path.glob("torchinductor_*/precompiled_headers/*.gch"))
