"""The command line, ``python -m awq_inductor`` (and its ``tune`` subcommand): load an AWQ model through the transformers patch, compile it, and
compare prefill / decode speed of the compiled path, our eager path and the dense model.

With no ``--model`` the tiny real Llama that ships with the package (trained on the Python
standard library, awq_inductor/data/tiny_llama) is quantized to AWQ gemm once and cached in
``~/.cache/awq_inductor/models`` (nothing is downloaded); it continues a held-out piece of Python
code, or ``--prompt TEXT``, printing the text as it is generated. ``--random-model`` uses a larger
Llama-shaped model with random weights instead (speed only: its text is noise).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from . import tp as _tp

DEFAULT_SHAPE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                     num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
#: ``--arch qwen3_moe``: a Qwen3-MoE-shaped random model (64 experts, top-8, expert intermediate 256)
MOE_SHAPE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, moe_intermediate_size=256,
                 num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
                 num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                 max_position_embeddings=2048)
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "fp32": "float32", "float32": "float32"}


def _log(msg: str) -> None:
    print(msg, flush=True)


def default_model_dir(cache_dir: str, group_size: int, arch: str = "llama") -> str:
    import torch
    from . import testing

    shape = MOE_SHAPE if arch == "qwen3_moe" else DEFAULT_SHAPE
    name = "llama-h{hidden_size}-i{intermediate_size}-l{num_hidden_layers}-kv{num_key_value_heads}".format(**shape)
    if arch == "qwen3_moe":
        name = "qwen3moe-h{hidden_size}-e{num_experts}-k{num_experts_per_tok}-i{moe_intermediate_size}-l{num_hidden_layers}".format(**shape)
    path = os.path.join(cache_dir, f"{name}-awq-gemm-g{group_size}")
    if os.path.exists(os.path.join(path, "model.safetensors")) and os.path.exists(os.path.join(path, "dense.safetensors")):
        _log(f"Using cached default model: {path}")
        return path
    _log(f"Building the default model (random weights, real {arch} model, AWQ gemm g{group_size}) in {path}")
    cfg = testing.tiny_config(arch, **shape)
    model = testing.build_float_model(cfg, seed=0, dtype=torch.float32)
    tmp = path + ".tmp"
    return testing.publish_demo_checkpoint(testing.save_quantized(model, tmp, format="gemm", group_size=group_size),
                                           tmp, path)


def _dense_model(path: str, dtype):
    """The float baseline: ``dense.safetensors`` of the default model, or the dequantized AWQ model."""
    import transformers
    from safetensors.torch import load_file

    cfg = transformers.AutoConfig.from_pretrained(path)
    dense_file = os.path.join(path, "dense.safetensors")
    if os.path.exists(dense_file):
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        model.load_state_dict(load_file(dense_file), strict=True)
        return model.eval()
    return None


def _dequantized_copy(model, dtype):
    """Dense copy of a converted model: every int4 module -> nn.Linear on the dequantized weight, the
    rest cast to ``dtype`` except what transformers keeps fp32 at load (DeepSeek/GLM routers)."""
    import copy

    from .baselines import cast_like_loading, to_dense

    return cast_like_loading(to_dense(copy.deepcopy(model), dtype), dtype)


def bench(model, ids, new_tokens: int, label: str, repeats: int = 5, attention_mask=None):
    """(prefill tok/s, decode tok/s, generated ids); decode tok/s counts every row of ``ids``
    (aggregate over the batch), prefill the prompt tokens ``ids.numel()`` including any padding
    (``attention_mask``: passed to ``generate``, e.g. left-padded batches). A full warm-up ``generate`` first (for the
    compiled model it compiles the prefill and decode graphs, including dynamic-shape recompiles).
    Then ``repeats`` pairs of ``generate(max_new_tokens=1)`` and the full ``generate``, run back to
    back: prefill = median time of the first; decode = median over pairs of (full - first) over the
    remaining ``new_tokens - 1`` steps. Pairs, because the VM drifts by 5-15% between runs and
    decode is a difference of two timings: the medians of the two sides taken apart moved the MoE
    decode figure between 56 and 84 tok/s for one build."""
    import statistics

    import torch

    from .integrations.generation import wait_until_compiled

    # exactly n tokens with no end-of-sequence id rather than min_new_tokens=n: the latter adds a
    # logits processor (a clone of the logits, isin over an arange of the vocabulary, where) that a
    # user's generate does not run: 1.0-1.2 ms of every decode step at vocab 32000 (tiny Llama, 4
    # layers, 2 threads, AMX Xeon: 4.13 / 3.65 / 3.06 ms against 2.90 / 2.44 / 1.93, regional /
    # C++ shape guards / whole), about 3% of a 7B-shaped step, charged to every row but the peers'
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=attention_mask)

    def timed(n):
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, **kw)
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"bench: generate returned {out.shape[1] - ids.shape[1]} new tokens, expected {n}")
        return time.perf_counter() - t0, out

    with torch.no_grad():
        warm, _ = timed(new_tokens)
        wait_until_compiled()  # a graph compiled in the warm-up ran eager until its library was built
        pairs = [(timed(1)[0], timed(new_tokens)) for _ in range(repeats)]
    prefill = statistics.median(p for p, _ in pairs)
    out = pairs[-1][1][1]
    steps = max(new_tokens - 1, 1)
    decode = max(statistics.median(t - p for p, (t, _) in pairs), 1e-6)
    pf, dc = ids.numel() / prefill, steps * ids.shape[0] / decode
    _log(f"  {label:<34} warm-up {warm:6.1f}s   prefill {pf:8.1f} tok/s   decode {dc:7.1f} tok/s")
    return pf, dc, out


def _tokenizer(path: str):
    """The checkpoint's tokenizer, or None (e.g. the random model has none)."""
    import transformers

    # without tokenizer files, transformers 5 may build an empty tokenizer from the config's model
    # type (seen with qwen3_moe): a random model must get random ids instead
    names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    if os.path.isdir(path) and not any(os.path.exists(os.path.join(path, n)) for n in names):
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None


def _prompt_ids(args, tokenizer, vocab_size: int):
    """[batch, T]: --prompt tokenized; else the first --prompt-len tokens of the packaged held-out
    text (or random ids for a model without a tokenizer)."""
    import torch

    if args.prompt is not None:
        ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    elif tokenizer is not None:
        from . import tiny_model

        ids = tokenizer(tiny_model.heldout_text(), return_tensors="pt", verbose=False)["input_ids"][:, :args.prompt_len]
    else:
        g = torch.Generator().manual_seed(args.seed)
        return torch.randint(0, vocab_size, (args.batch, args.prompt_len), generator=g)
    return ids.expand(args.batch, -1).contiguous()


def _stream(model, tokenizer, ids, new_tokens: int, label: str) -> bool:
    """Greedy-generate from the first prompt, printing the text as it comes (TextStreamer); for a
    compiled model this is also the compile warm-up. A repetition penalty keeps small models (the
    tiny Llama) out of loops; the timed runs after it are plain greedy. Returns whether it streamed."""
    import torch
    import transformers

    if tokenizer is None:
        return False
    _log(f"Generating {new_tokens} tokens with the {label} model (greedy, repetition penalty 1.3; "
         f"the prompt in [brackets]):")
    sys.stdout.write("[" + tokenizer.decode(ids[0]) + "]")
    streamer = transformers.TextStreamer(tokenizer, skip_prompt=True)
    compiled = "compiled" in label
    eager_before = _eager_calls() if compiled else 0
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids[:1], max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       repetition_penalty=1.3, pad_token_id=tokenizer.pad_token_id or 0, streamer=streamer)
    dt = time.perf_counter() - t0
    how = ", including compilation" if compiled else ""
    eager = _eager_calls() - eager_before if compiled else 0
    if eager:
        how += f"; {eager} layer calls ran eager while the compiled code's C++ built"
    _log(f"\n  ({new_tokens} tokens in {dt:.1f}s{how}; timed runs follow)")
    return True


def _eager_calls() -> int:
    """Compiled graphs' calls run eager so far while their libraries built (0 without Inductor)."""
    try:
        from .inductor import graph_library
    except Exception:  # noqa: BLE001
        return 0
    return graph_library.eager_calls[0]


def _tp_is_moe(path: str) -> bool:
    """MoE checkpoints load whole and are sharded after (the per-rank loader reads dense models)."""
    import transformers

    return _tp.is_moe(transformers.AutoConfig.from_pretrained(path))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m awq_inductor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", help="a local AWQ (or GPTQ) checkpoint folder; default: the packaged "
                   "tiny Llama trained on the Python stdlib, quantized to AWQ gemm (cached)")
    p.add_argument("--random-model", action="store_true", help="instead of the tiny Llama, build/reuse a larger "
                   "random Llama-shaped AWQ model (hidden 1024, 4 layers, GQA 16/4 heads, vocab 32000)")
    p.add_argument("--arch", choices=("llama", "qwen3_moe"), default=None,
                   help="build/reuse a random model of this architecture instead of the tiny Llama: llama = "
                        "--random-model; qwen3_moe: a Qwen3-MoE-shaped model (hidden 1024, 64 experts, top-8, "
                        "expert intermediate 256, 2 layers), its experts on one awq::int4_moe call per layer")
    p.add_argument("--prompt", metavar="TEXT", help="generate from TEXT (tokenized with the checkpoint's tokenizer), "
                   "streaming the output; default: a held-out piece of Python code (--prompt-len tokens)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens for prefill (default 128)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens to decode (default 32)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="activation dtype (default bf16)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile path")
    p.add_argument("--no-dense", action="store_true", help="skip the dense baseline")
    p.add_argument("--no-int4pack", action="store_true",
                   help="skip the gptqmodel-style baseline (aten._weight_int4pack_mm_for_cpu, zeros (8 - z) * s)")
    p.add_argument("--no-eager", action="store_true", help="skip our eager path")
    p.add_argument("--lm-head", choices=["bf16", "int8", "int4"], default="bf16",
                   help="bf16 (default): a bf16 head runs our AVX512-BF16 GEMV at decode; int8 (opt-in): "
                        "quantize the lm_head per output channel to int8 at load time; int4 (opt-in): "
                        "quantize it per group to int4 at load time (our W4A16 op)")
    p.add_argument("--group-size", type=int, default=128, help="group size of the default model (default 128)")
    p.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "awq_inductor", "models"),
                   help="where the default model is cached (default ~/.cache/awq_inductor/models)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt (models without a tokenizer)")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor parallelism over N ranks: run as torchrun --nproc-per-node N -m awq_inductor --tp N; "
                        "each rank pins its threads to its own cores, rank 0 prints; the dense and int4pack "
                        "baselines are skipped")
    p.add_argument("--tp-cores", default=None, metavar="LISTS",
                   help="with --tp: the cores of each local rank, ';'-separated cpulists (e.g. '0-27;28-55'); "
                        "default: whole NUMA nodes per rank when they divide evenly, else an even split of the "
                        "affinity mask")
    return p


def _model_path(args, tp_info) -> str:
    """The checkpoint to run: --model, the random demo model, or the tiny Llama (rank 0 builds it first)."""
    if tp_info and tp_info["rank"] != 0 and not args.model:
        import torch.distributed as dist

        dist.barrier()  # rank 0 builds the default model first
    if args.model:
        path = args.model
    elif args.random_model or args.arch:
        path = default_model_dir(args.cache_dir, args.group_size, args.arch or "llama")
    else:
        from . import tiny_model

        path = tiny_model.demo_checkpoint(args.cache_dir, args.group_size, log=_log)
    if tp_info and tp_info["rank"] == 0 and not args.model:
        import torch.distributed as dist

        dist.barrier()
    return path


def _load(args, path: str, dtype, tp_info):
    """Load (and for --tp shard) the model through the transformers patch; log what was loaded."""
    import transformers

    from .nn import AWQMoEExperts
    from .transform import count_int4_linears

    _log("Loading and converting (int4 linears -> AWQLinear, q/k/v and gate/up fusion)...")
    t0 = time.perf_counter()
    if tp_info and args.model and not _tp_is_moe(path):  # each rank reads only its slices of the int4 tensors
        model = _tp.load(path, dtype=dtype)
        rd = model._awq_tp["read"]
        _log(f"  per-rank load: read {sum(rd['bytes'].values()) / 2**20:.2f} of "
             f"{rd['checkpoint_bytes'] / 2**20:.2f} MiB of the checkpoint")
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)  # tqdm bars on a terminal
    model.eval()
    if tp_info:
        if getattr(model, "_awq_tp", None) is None:
            _tp.shard(model)
        _log(f"  sharded over {args.tp} ranks: {model.config.num_attention_heads} query / "
             f"{model.config.num_key_value_heads} KV heads per rank, all_reduce after o_proj and "
             f"{'the MoE experts' if model._awq_tp.get('moe_layers') else 'down_proj'}")
    n_int4 = count_int4_linears(model)
    n_moe = sum(isinstance(m, AWQMoEExperts) for m in model.modules())
    moe_note = f", {n_moe} MoE experts modules (awq::int4_moe)" if n_moe else ""
    _log(f"  loaded {type(model).__name__} in {time.perf_counter() - t0:.1f}s: {n_int4} int4 linears "
         f"({n_int4 / max(model.config.num_hidden_layers, 1):.0f} per layer){moe_note}")
    if n_moe and not args.no_int4pack:
        _log("  gptqmodel-style int4pack baseline skipped: it has no MoE experts kernel")
        args.no_int4pack = True
    return model


def _run_compiled(args, model, tokenizer, ids) -> tuple:
    """(result, streamed) of the compiled path: :func:`compile_for_generate` (one compiled decoder
    layer per layer kind), stream, time."""
    from .integrations.generation import compile_for_generate, uncompile

    try:
        from .inductor.backend import awq_inductor_backend as backend
        bname = "awq_inductor"
    except ImportError:
        backend, bname = "inductor", "inductor"
    _log(f"Compiling with backend {bname!r}, once per decoder layer kind (the first calls compile "
         f"the prefill and decode graphs)...")
    compile_for_generate(model, backend=backend)
    try:
        streamed = _stream(model, tokenizer, ids, args.new_tokens, f"compiled ({bname})")
        return bench(model, ids, args.new_tokens, f"awq int4 compiled ({bname})"), streamed
    finally:
        uncompile(model)


def _run_methods(args, model, path: str, tokenizer, ids, dtype) -> dict:
    """method -> (prefill tok/s, decode tok/s, generated ids) for each method not skipped."""
    results, streamed = {}, False
    if not args.no_compile:
        results["compiled"], streamed = _run_compiled(args, model, tokenizer, ids)
    if not args.no_eager:
        streamed = streamed or _stream(model, tokenizer, ids, args.new_tokens, "eager")
        results["eager"] = bench(model, ids, args.new_tokens, "awq int4 eager")
    if not args.no_dense:
        dense = _dense_model(path, dtype) if not args.model else None
        if dense is None:
            dense = _dequantized_copy(model, dtype)
        results["dense"] = bench(dense, ids, args.new_tokens, f"dense {args.dtype} (eager)")
    if not args.no_int4pack:
        import copy

        from .baselines import to_int4pack

        try:
            int4pack = to_int4pack(copy.deepcopy(model), dtype)
        except ValueError as e:  # aten's shape limits (N % 16, G in 32..256)
            _log(f"  gptqmodel-style int4pack baseline skipped: {e}")
        else:
            results["int4pack"] = bench(int4pack, ids, args.new_tokens, "gptqmodel-style aten int4pack")
    return results


def _report_agreement(results: dict, n: int, dtype_name: str, real_model: bool) -> None:
    """Position-wise agreement of the generated tokens; once one path picks another token the
    continuations diverge, so the first divergence matters more than the percentage."""
    outs = {k: v[2] for k, v in results.items()}

    def agree(a, b):
        a, b = outs[a][:, -n:], outs[b][:, -n:]
        diff = (a != b).nonzero()
        first = int(diff[0, 1]) if len(diff) else None
        return (a == b).float().mean().item() * 100, first

    pairs = [(k, "eager") for k in ("compiled",) if k in outs and "eager" in outs]
    pairs += [(k, "dense") for k in ("compiled", "eager", "int4pack") if k in outs and "dense" in outs]
    if pairs:
        why = ("a real model: greedy choices are mostly clear-cut" if real_model else
               "random weights give near-flat logits, so rounding differences flip near-ties")
        _log(f"greedy tokens ({dtype_name} activations; {why}):")
    for a, b in pairs:
        pct, first = agree(a, b)
        where = "all identical" if first is None else f"first difference at new token {first}"
        _log(f"  {a} vs {b}: {pct:.0f}% identical ({where})")


def _start_background_builds(args, tp_info, dtype) -> None:
    """Start the g++ work every run needs before importing transformers (1.5-2.3 s of imports on the
    2-core Zen 4 VM: transformers, its quantizers, our integration), so that the compiler runs on the
    other core meanwhile: the int4 kernels' library (the tuner at load needs it) and, for a compiled
    run, Inductor's ISA checks (warm_inductor)."""
    if not tp_info:
        from .integrations.generation import prebuild_scheme_library
        from .schemes import scheme_for

        prebuild_scheme_library(scheme_for(None), dtype)
    if not args.no_compile:
        from .integrations.generation import warm_inductor

        warm_inductor()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["tune"]:  # python -m awq_inductor tune --model DIR | --shapes KxN,...
        return tune_main(argv[1:])
    p = _parser()
    args = p.parse_args(argv)
    tp_info = None
    if args.tp:
        tp_info = _tp.init_from_env(args.tp, args.tp_cores, args.threads)
        args.no_dense = args.no_int4pack = True
        if tp_info["rank"] != 0:
            sys.stdout = open(os.devnull, "w")

    import torch

    if args.threads and not tp_info:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, DTYPES[args.dtype])
    _start_background_builds(args, tp_info, dtype)

    import transformers

    from .integrations.transformers import patch_transformers

    _log(f"awq_inductor: torch {torch.__version__}, transformers {transformers.__version__}, "
         f"{torch.get_num_threads()} threads, activations {dtype}")
    if tp_info:
        _log(f"tensor parallel: {args.tp} ranks (gloo), rank 0 on cores {tp_info['cores']}, "
             f"{tp_info['threads']} threads per rank")
    path = _model_path(args, tp_info)
    if tp_info and args.lm_head in ("int8", "int4"):
        raise SystemExit(f"--lm-head {args.lm_head} is not supported with --tp (the tensor-parallel head stays bf16)")
    patch_transformers(lm_head=args.lm_head)
    model = _load(args, path, dtype, tp_info)
    tokenizer = _tokenizer(path)
    if args.prompt is not None and tokenizer is None:
        p.error(f"--prompt: {path} has no tokenizer files")
    ids = _prompt_ids(args, tokenizer, model.config.vocab_size)
    _log(f"Benchmark: batch {args.batch}, prompt {ids.shape[1]} tokens, {args.new_tokens} new tokens")
    results = _run_methods(args, model, path, tokenizer, ids, dtype)
    _report_agreement(results, args.new_tokens, args.dtype, tokenizer is not None)
    if tp_info:
        _tp.exit_rank()
    return 0


# ---------------------------------------------------------------------------------------------
# python -m awq_inductor tune
def tune_main(argv=None) -> int:
    """``python -m awq_inductor tune --model DIR | --shapes KxN,...``: fill the tuning cache."""
    import torch

    from .kernels import tuning_cache
    from .kernels.codegen import dtype_name
    from .kernels.plan import NEVER

    p = argparse.ArgumentParser(prog="python -m awq_inductor tune", description=tune_main.__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", help="a checkpoint folder (its config.json: every int4 shape the loaded model runs, MLA and MoE included)")
    src.add_argument("--shapes", metavar="KxN,...", help="linear shapes, e.g. 4096x4096,4096x11008")
    p.add_argument("--group-size", type=int, default=128, help="G for --shapes (default 128)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--act-quant", default=None, choices=["int8"], help="tune the W4A8 ops instead")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--retune", action="store_true", help="measure again shapes that are already cached")
    p.add_argument("--no-header", action="store_true",
                   help="skip precompiling the compiled graphs' C++ header (done once per machine: about 7 s, "
                        "then each new compiled graph builds about 2.5 s faster)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.model:
        with open(os.path.join(a.model, "config.json")) as f:
            shapes = tuning_cache.model_shapes(json.load(f), a.act_quant)
    else:
        shapes = tuning_cache.parse_shapes(a.shapes, a.group_size, a.act_quant)
    dtype = getattr(torch, dtype_name(a.dtype))
    t0 = time.perf_counter()
    done = tuning_cache.tune_shapes(shapes, dtype, retune=a.retune)
    print(f"tuned {len(done)} shape(s) in {time.perf_counter() - t0:.1f} s, {tuning_cache.threads()} threads -> {tuning_cache.cache_path()}")
    for s, plan in done:
        th = ", ".join(f"{k}={'never' if v >= NEVER else v}" for k, v in plan.thresholds().items())
        print(f"  {s.op.name} K={s.K} N={s.out_features} G={s.G}: {th} ({plan.source})")
    if not a.no_header:
        _precompile_graph_header()
    return 0


def _precompile_graph_header() -> None:
    """The compiled graphs' precompiled header (:mod:`awq_inductor.inductor.graph_library`), built
    here, ahead of time, rather than beside a first compile (where it slowed the build)."""
    from .inductor import lowering

    t0 = time.perf_counter()
    path = lowering.build_graph_library_header()
    if path:
        print(f"graph libraries' precompiled header in {time.perf_counter() - t0:.1f} s -> {path}")
