"""Decode step time of the tiny AWQ Llama (hidden 256, G 64, bf16), regional compile, with one of
Dynamo's guard filters (``torch.compile(options={"guard_filter_fn": ...})``):

    python benchmarks/results/regional_guards.py FILTER LAYERS

FILTER: none | nnmod (``skip_guard_on_all_nn_modules_unsafe``) | globals (``skip_guard_on_globals_unsafe``)
| nnmod_globals | hooks (the empty-hooks-dict guards) | ours (globals under awq_inductor) | no_dup
(DUPLICATE_INPUT) | no_nn_tensor (TENSOR_MATCH of module tensors) | no_nn_nontensor (the other module
guards) | tensors_only (``keep_tensor_guards_unsafe``) | all (every guard dropped). One JSON line: the
median over 8 pairs of (generate 66 tokens - generate 2 tokens) / 64, and the last 4 tokens (a fixed
prompt: a filter that lets a wrong graph run changes them). A measurement, not a setting of the
package: see regional_depth_xeon_1203.md."""
import json, sys, time, statistics
import torch, transformers
import torch.compiler as tc
mode, L = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(2)
from awq_inductor import compile_for_generate
from regional_depth import load_tiny  # the same checkpoint (this directory is sys.path[0])


def _nn(e):
    return e.orig_guard.source is not None and e.orig_guard.source.is_unspecialized_nn_module()


FILTERS = {
    "none": None,
    "nnmod": tc.skip_guard_on_all_nn_modules_unsafe,
    "globals": tc.skip_guard_on_globals_unsafe,
    "nnmod_globals": lambda es: [not _nn(e) and not e.is_global for e in es],
    "hooks": lambda es: [e.guard_type != "EMPTY_NN_MODULE_HOOKS_DICT" for e in es],
    "ours": lambda es: [not (e.is_global and "awq_inductor" in e.name) for e in es],
    "no_dup": lambda es: [e.guard_type != "DUPLICATE_INPUT" for e in es],
    "no_nn_tensor": lambda es: [not (e.guard_type == "TENSOR_MATCH" and _nn(e)) for e in es],
    "no_nn_nontensor": lambda es: [e.guard_type == "TENSOR_MATCH" or not _nn(e) for e in es],
    "tensors_only": tc.keep_tensor_guards_unsafe,
    "all": lambda es: [False] * len(es),
}
model = load_tiny(L)
compile_for_generate(model, regional=True, **({} if FILTERS[mode] is None else {"options": {"guard_filter_fn": FILTERS[mode]}}))
ids = torch.randint(3, 200, (1, 16), generator=torch.Generator().manual_seed(0))


def gen(n):
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return time.perf_counter() - t, out


gen(4); gen(4)
steps = []
for _ in range(8):
    a, _ = gen(2); b, out = gen(66)
    steps.append((b - a) / 64 * 1e3)
print(json.dumps({"mode": mode, "layers": L, "step_ms": round(statistics.median(steps), 4), "tok": out[0, -4:].tolist()}), flush=True)
