import os
import tempfile

# Keep every test run's compiled kernels (ours and Inductor's) away from the user's caches.
_tmp = tempfile.mkdtemp(prefix="awq_inductor_test_cache_")
os.environ.setdefault("AWQ_INDUCTOR_CACHE_DIR", os.path.join(_tmp, "awq"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))


import pytest  # noqa: E402


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
