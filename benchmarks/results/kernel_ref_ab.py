"""The M-row decode op rendered from this checkout's templates against the same op rendered from a git
ref's templates: one K x N layer (random int4 weights, G given), the op over cold copies of all its tensors
(1 GiB in all) called back to back, the two kernels' passes alternating, order swapped every round; then
hot (one copy), best of 200 calls. Outputs checked bit-identical first.

    python benchmarks/results/kernel_ref_ab.py REF K N G M [ROUNDS] [FIELD=VALUE,...]

REF: a git ref (HEAD: the last commit, i.e. the working tree's uncommitted template change against it).
FIELD=VALUE: plan fields replaced (e.g. decode_int16=1). Prints per-round GB/s and checkout / ref time.
"""
import dataclasses
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import template_ab  # noqa: E402
from decode_harness import cold_copies, random_layer  # noqa: E402
from awq_inductor.kernels import codegen, tuning_cache  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def kernel_from(ref: str, op_name: str, tmp: str):
    """The op's eager kernel built from ``ref``'s csrc_templates (exported to ``tmp``)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "csrc_templates"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
    here = codegen.template_dir
    codegen.template_dir = lambda: pathlib.Path(tmp, "csrc_templates")
    codegen.env.cache_clear()
    try:
        return template_ab._kernel(op_name, [])
    finally:
        codegen.template_dir = here
        codegen.env.cache_clear()


def main(argv):
    ref, K, N, G, M = argv[0], *map(int, argv[1:5])
    rounds = int(argv[5]) if len(argv) > 5 else 8
    fields = dict(kv.split("=") for kv in argv[6].split(",")) if len(argv) > 6 else {}
    torch.set_num_threads(2)
    layer, W, nb = random_layer(K, N, G)
    with tempfile.TemporaryDirectory() as tmp:
        kerns = {ref: kernel_from(ref, layer.op.name, tmp), "checkout": template_ab._kernel(layer.op.name, [])}
    plan = tuning_cache.plan_for(layer.op, kerns["checkout"].isa, torch.bfloat16, K, N, G)
    plan = dataclasses.replace(plan, **{k: int(v) for k, v in fields.items()})
    print(f"{K}x{N} G{G} M={M}, 2 threads, plan {plan}", flush=True)
    copies = cold_copies(W)
    x = torch.randn(M, K).to(torch.bfloat16)
    outs = [k(x, *W, None, G, N, plan=plan) for k in kerns.values()]
    assert torch.equal(*outs), f"outputs differ by {(outs[0] - outs[1]).abs().max()}"
    res = {n: [] for n in kerns}
    for r in range(rounds):
        for n in (list(kerns) if r % 2 == 0 else list(kerns)[::-1]):
            t0 = time.perf_counter()
            for c in copies:
                kerns[n](x, *c, None, G, N, plan=plan)
            res[n].append((time.perf_counter() - t0) / len(copies))
        print(f"round {r + 1}: " + " | ".join(f"{n} {res[n][-1] * 1e3:.3f} ms {nb / res[n][-1] / 1e9:.1f} GB/s"
                                              for n in kerns), flush=True)
    hot = {n: float("inf") for n in kerns}
    for _ in range(4):
        for n in kerns:
            for _ in range(50):
                t0 = time.perf_counter()
                kerns[n](x, *W, None, G, N, plan=plan)
                hot[n] = min(hot[n], time.perf_counter() - t0)
    ratios = [b / a for a, b in zip(res[ref], res["checkout"])]
    print(f"cold: checkout / {ref} time per round {min(ratios):.3f}-{max(ratios):.3f}, median "
          f"{statistics.median(ratios):.3f}; hot best {hot[ref] * 1e3:.3f} / {hot['checkout'] * 1e3:.3f} ms "
          f"({hot['checkout'] / hot[ref]:.3f})")


if __name__ == "__main__":
    with torch.no_grad():
        main(sys.argv[1:])
