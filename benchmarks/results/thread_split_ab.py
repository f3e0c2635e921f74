"""The driver's work split, static halves against taking from the back of another thread's share
(runtime/driver.h.j2 UnitRange), on the four Llama-7B layer ops at M = 1, cold copies, one process,
the two interleaved (order alternating per rep), with the read probe per rep:

    python benchmarks/results/thread_split_ab.py THREADS REPS

Needs a scratch build whose driver reads an ``extern "C" int awq_steal_mode`` (0: the static split, 1:
the stealing one) before building the ranges; main has no switch. Results in thread_split_1205.md."""
import os, sys, time, statistics, ctypes, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bw_probe
from decode_layer_ops import layer_op_setups
from awq_inductor.kernels import isa as isa_mod, native

th = int(sys.argv[1]); torch.set_num_threads(th)
isa = isa_mod.select()
lib = native._library("w4a16", isa, torch.bfloat16, native.emulated(isa))
mode = ctypes.c_int.in_dll(lib, "awq_steal_mode")
(probe,), pbytes = bw_probe.stream_calls(th, 256 << 20)
setups = layer_op_setups(400 << 20)
for nm, kern, copies, x, G, N, plan, nb in setups:
    y0 = kern(x, *copies[0], None, G, N, plan=plan); mode.value = 1; y1 = kern(x, *copies[0], None, G, N, plan=plan); mode.value = 0
    assert torch.equal(y0, y1), nm
res = {(s[0], m): [] for s in setups for m in (0, 1)}; pr = []
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    t0 = time.perf_counter(); probe(); pr.append(pbytes / (time.perf_counter() - t0) / 1e9)
    for order in ((0, 1) if rep % 2 == 0 else (1, 0)):
        mode.value = order
        for nm, kern, copies, x, G, N, plan, nb in setups:
            c = copies[(2 * rep + order) % len(copies)]
            t0 = time.perf_counter(); kern(x, *c, None, G, N, plan=plan); res[(nm, order)].append(time.perf_counter() - t0)
mode.value = 0
p = statistics.median(pr); tot = [0, 0]
for nm, *_r, nb in setups:
    ms = [statistics.median(res[(nm, m)]) * 1e3 for m in (0, 1)]
    tot[0] += ms[0]; tot[1] += ms[1]
    print(f"{nm:8s} static {ms[0]:7.3f} ms ({nb/ms[0]/1e6/p:.0%})  stealing {ms[1]:7.3f} ms ({nb/ms[1]/1e6/p:.0%})  ratio {ms[1]/ms[0]:.3f}")
print(f"layer sum static {tot[0]:.3f} stealing {tot[1]:.3f} ratio {tot[1]/tot[0]:.3f}  probe {p:.1f} GB/s")
