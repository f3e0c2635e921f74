"""Concurrency: processes that first use the package at the same moment (torchrun) share one
empty kernel cache; Python threads call the same eager and compiled module at once (a server)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import torch

from awq_inductor import AWQLinear, config
from awq_inductor.kernels import native
from helpers import random_canonical

_WORKER = textwrap.dedent(r"""
    import os, sys, time
    go = sys.argv[1]
    import torch
    from awq_inductor import AWQLinear, config
    g = torch.Generator().manual_seed(int(sys.argv[2]))
    N, K, G = 96, 256, 64
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // G), dtype=torch.uint8, generator=g)
    s = torch.rand(N, K // G, generator=g) * 0.05
    lin = AWQLinear.from_canonical(q, z, s, group_size=G)
    x = torch.randn(9, K, generator=g)
    open(go + f".ready{sys.argv[2]}", "w").close()
    while not os.path.exists(go):  # all workers start building at the same moment
        time.sleep(0.001)
    with config.patch(force_isa="portable"):
        y = lin(x)
    torch.testing.assert_close(y, x @ lin.dequantize().t(), atol=1e-4, rtol=1e-4)
    print("OK")
""")


def test_processes_build_into_one_empty_cache_at_once(tmp_path):
    cache = tmp_path / "awq"
    env = dict(os.environ, AWQ_INDUCTOR_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
    n = 3
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(go), str(i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    deadline = time.time() + 300
    while len(list(tmp_path.glob("go.ready*"))) < n and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    go.touch()  # every worker has imported torch and built its layer: release them together
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "OK" in out, err[-3000:]
    files = sorted(os.listdir(cache))
    sos = [f for f in files if f.endswith(".so")]
    assert len(sos) == 1 and sos[0].startswith("awq_int4_mm_portable_"), files
    assert not [f for f in files if f.endswith((".tmp", ".cpp"))], files  # no temp file left behind


def _run_threads(fn, inputs, n_threads=4, rounds=3):
    """Call fn on every input from n_threads threads at once, ``rounds`` times; return the outputs
    per (thread, round, input) and any exception."""
    barrier = threading.Barrier(n_threads)
    results, errors = {}, []

    def work(t):
        try:
            barrier.wait()
            for r in range(rounds):
                for j in range(len(inputs)):  # threads start at different inputs
                    i = (t + j) % len(inputs)
                    results[(t, r, i)] = fn(inputs[i])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors, errors
    return results


def test_threads_share_eager_and_compiled_module(monkeypatch):
    q, z, s = random_canonical(160, 256, 64, seed=11)
    lin = AWQLinear.from_canonical(q, z, s, torch.randn(160), group_size=64)
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(m, 256, generator=g).to(dt) for m, dt in
              ((1, torch.bfloat16), (7, torch.float32), (33, torch.bfloat16), (2, torch.float16), (64, torch.float32))]

    # eager, starting with no kernel built in this process (first use races on the kernel build)
    native.forget_kernels()
    with torch.no_grad():
        res = _run_threads(lin, inputs)
        serial = [lin(x) for x in inputs]
    for (t, r, i), y in res.items():
        assert torch.equal(y, serial[i]), f"eager: thread {t} round {r} input {i} differs from the serial call"

    # compiled (awq_inductor backend, dynamic M), compiled serially first then shared; the portable
    # kernel compiles fastest (the ISA does not matter to thread safety)
    import awq_inductor.inductor.backend  # noqa: F401
    import torch._inductor.config as iconfig

    torch._dynamo.reset()
    with iconfig.patch(force_disable_caches=True), config.patch(force_isa="portable"), torch.no_grad():
        f32 = [x for x in inputs if x.dtype == torch.float32]
        cl = torch.compile(lin, backend="awq_inductor", dynamic=True)
        serial_c = [cl(x) for x in f32]
        res_c = _run_threads(cl, f32)
    torch._dynamo.reset()
    for (t, r, i), y in res_c.items():
        assert torch.equal(y, serial_c[i]), f"compiled: thread {t} round {r} input {i} differs from serial"
    for x, y in zip(f32, serial_c):
        torch.testing.assert_close(y, lin(x), atol=1e-4, rtol=1e-4)
