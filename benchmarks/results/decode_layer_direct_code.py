"""Decoder layer 0 of the compiled 4-layer model called 40 times with one captured decode input: through its
regional step (Dynamo's frame entry, guards, transformed code) against Dynamo's transformed code called directly
after the cache entry's own guard check (``guard_manager.check``, the same guards): the part of a layer call that is
Dynamo's machinery rather than its guards. Also the guard check alone, hot. An experiment on Dynamo internals
(``_debug_get_cache_entry_list``), not a shipped path.

    python benchmarks/results/decode_layer_direct_code.py --head bf16

(decode_layer_overhead_amx_1207.md)."""
import argparse, os, sys, time, types, torch
HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE); sys.path.insert(0, os.path.dirname(HERE))
from decode_harness import compiled_model, model_args
from awq_inductor.integrations import kv_cache, regional as R

a = model_args(argparse.ArgumentParser()).parse_args(); torch.set_num_threads(2)
model = compiled_model(a)
l0 = model.model.layers[0]
captured, f0 = [], l0.forward


def capture(*args, **kwargs):
    if args and args[0].shape[1] == 1 and not captured:
        captured.append((args, dict(kwargs)))
    return f0(*args, **kwargs)


l0.forward = capture
with torch.no_grad():
    model.generate(torch.randint(0, 32000, (1, 32)), max_new_tokens=4, do_sample=False, eos_token_id=None)
l0.forward = f0
args, kwargs = captured[0]
original = types.MethodType(type(l0).forward, l0)
entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(R._run_layer.__code__)


def viewed(kw):
    kw = dict(kw)
    layer = R._cache_layer(kw["cache"], 0)
    kv_cache.reserve(layer, 1)
    kw["cache"] = R.LayerCacheView(kw["cache"], layer)
    return kw


def direct():
    kw = viewed(kwargs)
    local = {"forward": original, "args": args, "kwargs": kw}
    for e in entries:
        if e.guard_manager.check(local):
            return types.FunctionType(e.code, R._run_layer.__globals__)(original, args, kw)
    raise RuntimeError("no cache entry's guards pass")


with torch.no_grad():
    local = {"forward": original, "args": args, "kwargs": viewed(kwargs)}
    e = next(e for e in entries if e.guard_manager.check(local))
    t0 = time.perf_counter()
    for _ in range(1000):
        e.guard_manager.check(local)
    print(f"guard check, hot: {(time.perf_counter() - t0) * 1e3:.1f} us", flush=True)
    for rep in range(3):
        for name, f in (("regional step", lambda: l0(*args, **dict(kwargs))), ("direct code + guards", direct)):
            t0 = time.perf_counter()
            for _ in range(40):
                f()
            print(f"{name}: {(time.perf_counter() - t0) / 40 * 1e6:.0f} us per layer call", flush=True)
