import os
import tempfile

# Keep every test run's compiled kernels (ours and Inductor's) away from the user's caches.
_tmp = tempfile.mkdtemp(prefix="awq_inductor_test_cache_")
os.environ.setdefault("AWQ_INDUCTOR_CACHE_DIR", os.path.join(_tmp, "awq"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_tmp, "inductor"))
