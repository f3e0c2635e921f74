"""The four W4A16 ops of one Llama-7B decoder layer at M = 1 (fused q|k|v 4096 -> 6144, o 4096 -> 4096,
gate|up with SiLU 4096 -> 2 x 11008, down 11008 -> 4096; G = 128, bf16 x), each call on another cold
copy of all its tensors (qweight, scales, zeros; about 300 MiB per op in rotation), with this
machine's cached plan, interleaved with one 256 MiB pass of the read probe per rep; median of 30:

    python benchmarks/results/decode_layer_ops.py THREADS

A measurement harness (see peers_amx_1203.md), not a test."""
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bw_probe
from awq_inductor import testing
from awq_inductor.kernels import hugepages, isa as isa_mod, native, tuning_cache
from awq_inductor.schemes import OPS

G = 128
SHAPES = [("int4_mm", 4096, 6144, "qkv"), ("int4_mm", 4096, 4096, "o"), ("int4_mm_silu_mul", 4096, 11008, "gate_up"),
          ("int4_mm", 11008, 4096, "down")]


def layer_op_setups(copy_bytes=300 << 20):
    """[(name, kernel, cold copies of the packed tensors, x, G, N, tuned plan, bytes per call)] for SHAPES."""
    isa = isa_mod.select()
    setups = []
    for opn, K, N, nm in SHAPES:
        op = OPS[opn]; kern = native.get_kernel(op.name, torch.bfloat16, isa)
        q, z, s = testing.quantize_weight(torch.randn(op.columns(N), K) * 0.05, G)
        w = op.pack(q, z, s, G, N); nb = sum(t.nbytes for t in w)
        plan = tuning_cache.plan_for(op, isa, torch.bfloat16, K, N, G)
        copies = [tuple(hugepages.copy_on_huge_pages(t) for t in w) for _ in range(max(2, copy_bytes // nb))]
        setups.append((nm, kern, copies, torch.randn(1, K).bfloat16(), G, N, plan, nb))
    return setups


def main():
    th = int(sys.argv[1]); torch.set_num_threads(th)
    (probe,), pbytes = bw_probe.stream_calls(th, 256 << 20)
    setups = layer_op_setups()
    res = {s[0]: [] for s in setups}; pr = []
    for rep in range(30):
        t0 = time.perf_counter(); probe(); pr.append(pbytes / (time.perf_counter() - t0) / 1e9)
        for nm, kern, copies, x, G_, N, plan, nb in setups:
            c = copies[rep % len(copies)]
            t0 = time.perf_counter(); kern(x, *c, None, G_, N, plan=plan); dt = time.perf_counter() - t0
            res[nm].append((dt, nb / dt / 1e9))
    p = statistics.median(pr)
    tot = 0
    for nm, v in res.items():
        ms = statistics.median(a for a, _ in v) * 1e3; gb = statistics.median(b for _, b in v); tot += ms
        print(f"{nm:8s} {ms:7.3f} ms {gb:5.1f} GB/s {gb/p:.0%} of probe {p:.1f}")
    print(f"sum per layer {tot:.2f} ms")


if __name__ == "__main__":
    main()
