"""Peak resident memory while loading + converting an AWQ checkpoint, against the packed model size.

    python benchmarks/bench_load_memory.py                 # 4-layer Llama-7B-shaped AWQ gemm checkpoint
    python benchmarks/bench_load_memory.py --layers 2 --hidden 1024 --intermediate 2752 --vocab 8000

The checkpoint (random weights, real AWQ ``gemm`` format, fp16 like real AWQ checkpoints) is
written by a first process (``--dir`` keeps it between runs). A second, fresh process imports
torch/transformers/awq_inductor, reads its resident set (``VmRSS``), loads the folder with
``AutoModelForCausalLM.from_pretrained(dir, dtype=float16)`` through ``patch_transformers`` (which
converts every int4 linear into the packed kernel layout) and reads the peak (``VmHWM``).
Reported: the load's peak increase over the RSS before it, and the packed model size (bytes of
every parameter and buffer of the loaded model: int4 kernel layouts, scales, zeros, fp16
embeddings/norms). Target (issue 10): peak increase <= 1.5x the packed size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from llama_shape import add_shape_args, llama_config  # noqa: E402  (benchmarks/ is sys.path[0])

_MEASURE = r"""
import json, sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
import torch, transformers
import awq_inductor
from awq_inductor.integrations import transformers as hf
hf.patch_transformers()
torch.set_num_threads(int(sys.argv[2]))
before = status("VmRSS")
t0 = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16)
secs = time.perf_counter() - t0
peak = status("VmHWM")
after = status("VmRSS")
packed = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
int4 = sum(m.qweight.numel() + m.scales.numel() * 4 + m.zeros.numel()
           + (m.bias.numel() * 4 if m.bias is not None else 0)
           for m in model.modules() if hasattr(m, "qweight"))
print("RESULT " + json.dumps(dict(rss_before=before, peak=peak, rss_after=after, packed_bytes=packed,
                                  int4_layer_bytes=int4, load_seconds=secs)))
"""


def _make(d: str, a) -> None:
    import torch

    from awq_inductor.testing import build_float_model, save_quantized

    cfg = llama_config(a)
    save_quantized(build_float_model(cfg, dtype=torch.float16), d, format="gemm", group_size=a.group_size)


def measure(d: str, threads: int = 2) -> dict:
    r = subprocess.run([sys.executable, "-c", _MEASURE, d, str(threads)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-4000:])
    return json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p, layers=4, kv_heads=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dir", default=None, help="checkpoint folder (made if missing, kept)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "load_memory.json"))
    a = p.parse_args(argv)
    tmp = None
    d = a.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory()
        d = tmp.name
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--_make", d] + (argv or sys.argv[1:]))
        if r.returncode:
            raise SystemExit(r.returncode)
        print(f"wrote the checkpoint in {time.perf_counter() - t0:.0f}s", flush=True)
    res = measure(d, a.threads)
    res["checkpoint_bytes"] = os.path.getsize(os.path.join(d, "model.safetensors"))
    res["peak_increase"] = res["peak"] - res["rss_before"]
    res["ratio"] = res["peak_increase"] / res["packed_bytes"]
    res["shape"] = dict(layers=a.layers, hidden=a.hidden, intermediate=a.intermediate, vocab=a.vocab,
                        group_size=a.group_size)
    mib = 1 << 20
    print(f"packed model {res['packed_bytes'] / mib:.0f} MiB (int4 layers {res['int4_layer_bytes'] / mib:.0f} MiB), "
          f"checkpoint file {res['checkpoint_bytes'] / mib:.0f} MiB")
    print(f"RSS before load {res['rss_before'] / mib:.0f} MiB, peak {res['peak'] / mib:.0f} MiB, "
          f"after {res['rss_after'] / mib:.0f} MiB; peak increase {res['peak_increase'] / mib:.0f} MiB = "
          f"{res['ratio']:.2f}x the packed model (target <= 1.5x); load {res['load_seconds']:.1f}s")
    if a.out:
        os.makedirs(os.path.dirname(a.out), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)
    if tmp is not None:
        tmp.cleanup()
    return res


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--_make":
        d = sys.argv[2]
        rest = sys.argv[3:]
        ap = argparse.ArgumentParser()
        for k, v in (("--layers", 4), ("--hidden", 4096), ("--intermediate", 11008), ("--heads", 32),
                     ("--kv-heads", 32), ("--vocab", 32000), ("--group-size", 128), ("--threads", 2)):
            ap.add_argument(k, type=int, default=v)
        ap.add_argument("--dir")
        ap.add_argument("--out")
        _make(d, ap.parse_args(rest))
    else:
        main()
