import atexit
import os
import shutil
import tempfile

# Keep every test run's compiled kernels (ours and Inductor's) away from the user's caches, and
# remove them at the end (a full run leaves about 250 MB: 170 graph libraries and the graph
# libraries' 155 MB precompiled header). AWQ_INDUCTOR_KEEP_TEST_CACHE=1 keeps them.
_tmp = tempfile.mkdtemp(prefix="awq_inductor_test_cache_")
if os.environ.get("AWQ_INDUCTOR_KEEP_TEST_CACHE") != "1":
    atexit.register(shutil.rmtree, _tmp, ignore_errors=True)
os.environ.setdefault("AWQ_INDUCTOR_CACHE_DIR", os.path.join(_tmp, "awq"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))
# Subprocesses too (tp workers, cache-key processes): the constant kernel thresholds, no timing.
os.environ.setdefault("AWQ_INDUCTOR_TUNE", "off")


import pytest  # noqa: E402

import awq_inductor.config  # noqa: E402

# Tests force kernel paths and compare generated code: the constants, never a timing of this run
# (tests/test_tuner.py turns tuning on where it tests it).
awq_inductor.config.tune = "off"


def pytest_configure(config):
    config.addinivalue_line("markers", "builds_behind: compile_for_generate's graphs run eager until "
                            "their C++ is built, as users get it (elsewhere tests compare the compiled code)")


@pytest.fixture(autouse=True)
def _compiled_code_from_the_first_call(request, monkeypatch):
    """compile_for_generate builds each graph's C++ behind its first calls, which run eager; a test
    comparing the compiled path with a reference would compare eager with eager there. So tests get
    the plain backend (built before the first call returns) unless marked ``builds_behind``."""
    if request.node.get_closest_marker("builds_behind") is None:
        from awq_inductor.integrations import generation

        monkeypatch.setattr(generation, "_behind_first_calls", lambda backend: backend)
    yield


def pytest_sessionstart(session):
    """The compiled graphs' precompiled header, built once for the session's cache in a background
    thread (nice 19): the ~170 graph libraries a full run builds take about 2.5 s less each."""
    try:
        from awq_inductor.inductor import lowering
    except ImportError:  # a torch whose Inductor moved: the libraries build without it
        return
    lowering.start_graph_library_header()


@pytest.fixture
def inductor_clean():
    """Our lowering registered, dynamo reset, Inductor counters cleared, caches off: each compile
    test sees fresh code (weights are graph inputs, but cached kernels would hide template edits)."""
    import torch._dynamo
    import torch._inductor.config as iconfig
    from torch._dynamo.utils import counters

    from awq_inductor import inductor

    assert inductor.register()
    torch._dynamo.reset()
    counters.clear()
    with iconfig.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    """A private cache directory, tuning on, no plans remembered from other tests."""
    from awq_inductor.kernels import tuning_cache

    monkeypatch.setenv("AWQ_INDUCTOR_CACHE_DIR", str(tmp_path))
    tuning_cache.forget()
    with awq_inductor.config.patch(tune="auto"):
        yield tmp_path
    tuning_cache.forget()


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=None,
                     help="hypothesis examples per fuzz test (tests/test_fuzz.py); also $AWQ_FUZZ_EXAMPLES. "
                          "Given, the default ~60 s time budget is lifted unless $AWQ_FUZZ_SECONDS is set.")
    parser.addoption("--moe-sweep", action="store_true", default=False,
                     help="every MoE family x checkpoint format x expert layout (x act-order where the format "
                          "stores g_idx) in tests/test_moe_families.py: 168 loads, about 30 s; without it 14, one "
                          "per format and act-order, family and layout rotating")


def pytest_terminal_summary(terminalreporter):
    import sys

    mod = sys.modules.get("test_fuzz")
    stats = getattr(mod, "STATS", None)
    if stats:
        terminalreporter.write_sep("-", "awq_inductor fuzzing")
        for line in mod.summary_lines():
            terminalreporter.write_line(line)
