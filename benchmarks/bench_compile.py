"""Compile time of a model with the four Llama-7B linear shapes, cold and warm caches.

    python benchmarks/bench_compile.py

Runs two fresh Python processes over one cache folder (Inductor's and ours): the first compiles
from empty caches (cold), the second finds the FX-graph and kernel caches filled (warm). Each
reports the wall time from ``torch.compile`` to the first output, with M dynamic.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, sys, time
t_import = time.perf_counter()
import torch
import awq_inductor
from awq_inductor import AWQLinear
torch.set_num_threads(2)

def layer(K, N, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (N, K // 128), dtype=torch.uint8, generator=g)
    s = torch.rand(N, K // 128, generator=g).half() * 0.01
    return AWQLinear.from_canonical(q, z, s, group_size=128)

# chained so one graph holds all four shapes: 4096 -> 4096 -> 11008 -> 4096 -> 12288
model = torch.nn.Sequential(layer(4096, 4096, 0), layer(4096, 11008, 1), layer(11008, 4096, 2),
                            layer(4096, 12288, 3)).eval()
x = torch.randn(8, 4096, dtype=torch.bfloat16)
torch._dynamo.mark_dynamic(x, 0)
t0 = time.perf_counter()
with torch.no_grad():
    y = torch.compile(model, backend="awq_inductor")(x)
t1 = time.perf_counter()
print(json.dumps({"compile_s": t1 - t0, "import_s": t0 - t_import, "shape": list(y.shape)}))
'''


def main():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                   AWQ_INDUCTOR_CACHE_DIR=os.path.join(d, "awq"))
        res = {}
        for name in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
            res[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{name}: compile + first run {res[name]['compile_s']:.1f} s "
                  f"(import {res[name]['import_s']:.1f} s)", flush=True)
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "bench_compile.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
