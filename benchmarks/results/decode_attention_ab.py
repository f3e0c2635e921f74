"""python benchmarks/results/decode_attention_ab.py [REV]: awq::decode_attention's C++ kernel at git revision REV
(default a15733f, before the blocked kernel) against the working tree's, one process, interleaved call by call
(order alternating), 2 threads, B = 1, 32 query heads of 128 over 8 or 4 KV heads, L cached tokens. hot: the
same call just before; cold: a 256 MB streaming read just before (the cache evicted, as by a decode step's
weights). Prints the median microseconds per call (the ctypes call included) and the largest difference of the
two outputs."""
import statistics
import subprocess
import sys
import time

import torch

from awq_inductor.kernels import codegen, isa as isa_mod, native
from awq_inductor.ops import attention as A



def kernel_at(rev: str):
    """The decode attention kernel as the template stood at git revision ``rev``, built and bound."""
    text = subprocess.run(["git", "show", f"{rev}:csrc_templates/attention/decode_attention.cpp.j2"], check=True,
                          capture_output=True, text=True).stdout
    avx512 = isa_mod.get("avx512")
    src = codegen.env().from_string(text).render(isa=avx512)
    lib = native.library(src, list(avx512.flags), name="awq_decode_attention_before", isa="avx512")
    return native.bind(lib, "awq_decode_attention", A._DECODE_ARGS, native.INT)


def call(fn, q, k, v, out):
    B, Hq, _, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    return fn(q.data_ptr(), B, Hq, D, q.stride(0), q.stride(1), k.data_ptr(), Hkv, L, k.stride(0), k.stride(1),
              k.stride(2), v.data_ptr(), v.stride(0), v.stride(1), v.stride(2), None, 0, D ** -0.5, out.data_ptr(),
              out.stride(0), out.stride(2), 2)


def main(rev: str) -> None:
    torch.set_num_threads(2)
    kernels = {"before": kernel_at(rev), "after": A._kernel()}
    flush = torch.ones(64 << 20, dtype=torch.float32)
    print(f"before = {rev}, after = working tree; us per call, median of 30 interleaved")
    for Hkv in (8, 4):
        for L in (64, 512, 2048, 4096):
            q = torch.randn(1, 32, 1, 128).bfloat16()
            k, v = torch.randn(1, Hkv, L, 128).bfloat16(), torch.randn(1, Hkv, L, 128).bfloat16()
            outs = {n: torch.empty(1, 1, 32, 128, dtype=torch.bfloat16) for n in kernels}
            line = f"Hkv={Hkv} L={L:5d} (K+V {2 * k.nbytes / 1e6:4.1f} MB):"
            for mode in ("hot", "cold"):
                ts = {n: [] for n in kernels}
                for r in range(30):
                    for n in (list(kernels) if r % 2 == 0 else list(kernels)[::-1]):
                        if mode == "cold":
                            flush.sum()
                        else:
                            call(kernels[n], q, k, v, outs[n])
                        t = time.perf_counter()
                        call(kernels[n], q, k, v, outs[n])
                        ts[n].append(time.perf_counter() - t)
                b, a = (statistics.median(ts[n]) * 1e6 for n in ("before", "after"))
                line += f"  {mode} {b:6.1f} -> {a:6.1f} ({b / a:.2f}x)"
            d = (outs["before"].float() - outs["after"].float()).abs().max().item()
            print(line + f"  max|diff| {d:.2g}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "a15733f")
