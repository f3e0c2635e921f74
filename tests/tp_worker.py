"""The ranks of the tensor-parallel tests (run by tests/test_tp.py under torchrun: gloo, 1 thread).

For every case of ``<out>/cases.pt`` ({name: {"ckpt", "ids", "prompt"}}) each rank loads the AWQ
checkpoint through the transformers patch, shards it with ``awq_inductor.tp.shard`` and records
eager full-sequence logits, 16 greedy tokens and their per-step logits, eager and compiled
(backend awq_inductor: graph-break count, all_reduce / all_gather nodes per captured graph,
Inductor counters),
and the eager logits of the W4A8 shard, plus the eager logits of the same shard loaded per rank by
``tp.load`` (cases with ``loader_only``: only those, against load -> shard). Then one compiled ``all_reduce(int4_mm(x) * 2 + 1)``
shows the pointwise epilogue fused into our template before the collective. Results:
``<out>/rank<r>.pt``. ``AWQ_TP_TEST_TIMES=1`` prints timings to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.utils import counters


def _generate(model, prompt):
    out = model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0,
                         output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, prompt.shape[1]:], torch.cat(out.logits)


def loader_logits(case):
    """Eager logits of the shard loaded per rank (tp.load) and of load -> convert -> shard, and what
    tp.load read."""
    import transformers

    from awq_inductor.integrations import transformers as hf
    from awq_inductor import tp

    hf.patch_transformers()
    ref = transformers.AutoModelForCausalLM.from_pretrained(case["ckpt"], dtype=torch.float32).eval()
    tp.shard(ref)
    model = tp.load(case["ckpt"], dtype=torch.float32)
    with torch.no_grad():
        return {"shard_logits": ref(case["ids"]).logits, "loader_logits": model(case["ids"]).logits,
                "read": model._awq_tp["read"]}


def run_case(case, mark):
    import transformers

    from awq_inductor.integrations import transformers as hf
    from awq_inductor import tp
    from awq_inductor.inductor.backend import awq_inductor_backend
    from awq_inductor.integrations.generation import compile_for_generate, uncompile
    from awq_inductor.transform.model_pass import convert

    if case.get("loader_only"):
        res = loader_logits(case)
        mark("per-rank loader")
        return res
    hf.patch_transformers()
    model = transformers.AutoModelForCausalLM.from_pretrained(case["ckpt"], dtype=torch.float32).eval()
    tp.shard(model)
    mark("loaded and sharded")
    ids, prompt = case["ids"], case["prompt"]
    res = {"heads": (model.config.num_attention_heads, model.config.num_key_value_heads)}
    with torch.no_grad():
        res["eager_logits"] = model(ids).logits
        if not case.get("moe"):  # the per-rank loader reads dense models only
            loaded = tp.load(case["ckpt"], dtype=torch.float32)
            res["loader_logits"] = loaded(ids).logits
            del loaded
        res["eager_tokens"], res["eager_step_logits"] = _generate(model, prompt)
    mark("eager")
    torch._dynamo.reset()
    counters.clear()
    n_ar, n_ag = [], []

    def backend(gm, example_inputs):
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        n_ar.append(sum("all_reduce" in t for t in targets))
        n_ag.append(sum("all_gather" in t for t in targets))
        return awq_inductor_backend(gm, example_inputs)

    res["compile"] = case["compile"]
    if case["compile"] == "whole":  # plain torch.compile(model.forward): the lm_head's all_gather in the graph
        fwd = model.forward
        model.forward = torch.compile(fwd, backend=backend)
        with torch.no_grad():
            res["compiled_tokens"], res["compiled_step_logits"] = _generate(model, prompt)
        model.forward = fwd
    else:  # what `python -m awq_inductor --tp N` compiles: one decoder layer per kind
        compile_for_generate(model, backend=backend)
        with torch.no_grad():
            res["compiled_tokens"], res["compiled_step_logits"] = _generate(model, prompt)
        uncompile(model)
    mark("compiled generate")
    res["graph_breaks"] = sum(counters["graph_break"].values())
    res["all_reduce_per_graph"] = n_ar
    res["all_gather_per_graph"] = n_ag
    res["templated_kernels"] = counters["inductor"]["cpp_templated_kernel_counter"]
    convert(model, act_quant="int8")
    with torch.no_grad():
        res["w4a8_logits"] = model(ids).logits
    return res


def epilogue_before_all_reduce():
    """all_reduce(int4_mm(x) * 2 + 1) compiled: (max error vs eager, Inductor counters, code)."""
    import torch.distributed._functional_collectives as funcol
    from torch._inductor.utils import run_and_get_code

    from awq_inductor import packing
    from awq_inductor.inductor.backend import awq_inductor_backend

    g = torch.Generator().manual_seed(dist.get_rank())
    q = torch.randint(0, 16, (64, 128), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (64, 4), dtype=torch.uint8, generator=g)
    s = torch.randn(64, 4, generator=g) * 0.02
    w = packing.pack_for_kernel(q, z, s, 32)
    group = dist.group.WORLD

    def f(x):
        y = torch.ops.awq.int4_mm(x, *w, None, 32, 64) * 2 + 1
        return funcol.all_reduce(y, "sum", group)

    x = torch.randn(4, 128)
    torch._dynamo.reset()
    counters.clear()
    got, code = run_and_get_code(torch.compile(f, backend=awq_inductor_backend, fullgraph=True), x)
    return {"err": float((got - f(x)).abs().max()), "templated": counters["inductor"]["cpp_templated_kernel_counter"],
            "epilogue_fusions": counters["inductor"]["cpp_epilogue_fusion_counter"], "code": code[0]}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from awq_inductor import tp

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t0 = time.perf_counter()
    res = {}

    for name, case in torch.load(os.path.join(a.out, "cases.pt")).items():
        def mark(what, name=name):
            if os.environ.get("AWQ_TP_TEST_TIMES"):
                print(f"[rank {rank}] {name} {what}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)

        res[name] = run_case(case, mark)
    res["epilogue"] = epilogue_before_all_reduce()
    torch.save(res, os.path.join(a.out, f"rank{rank}.pt"))
    tp.exit_rank()
    return 0


if __name__ == "__main__":
    sys.exit(main())
