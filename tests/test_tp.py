"""awq_inductor.tp: tensor-parallel sharding on 2 gloo ranks (loopback, 1 thread each) and its errors.

One torchrun job (tests/tp_worker.py) runs both architectures, so the two ranks import torch and
compile the shared kernels once; the per-architecture tests check its results."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as hf  # noqa: E402
from awq_inductor import tp  # noqa: E402
from awq_inductor.transform.model_pass import convert  # noqa: E402
from awq_inductor.nn import AWQGateUpSiluMul, AWQLinear  # noqa: E402
from awq_inductor.nn.head import Bf16HeadLinear  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "tp_worker.py")
# Llama: GQA 4/2 heads; Qwen2: q/k/v bias; Qwen3-MoE: 8 experts; GLM-4-MoE: q/k/v bias, a dense first layer,
# 16 experts and a shared expert per MoE layer (recognised by structure); DeepSeek-V3: multi-head latent
# attention split over heads (q_b_proj, kv_b_proj, o_proj; the fused low-rank q_kv_a_proj whole on every rank),
# grouped routing, a dense first layer and a shared expert; OLMoE: q/k norms over the whole projection
# (ParallelRMSNorm: the mean of squares all-reduced), every layer sparse
ARCHS = ("llama", "qwen2", "qwen3_moe", "glm4_moe", "deepseek_v3", "olmoe")
#: all_reduce beyond 2 per decoder layer, per MoE layer: the shared expert (its own row-parallel down_proj),
#: OLMoE's q_norm and k_norm (one small all_reduce each)
EXTRA_ALL_REDUCE_PER_MOE_LAYER = {"glm4_moe": 1, "deepseek_v3": 1, "olmoe": 2}
#: how each architecture is compiled on the ranks: Llama whole (plain torch.compile(model.forward), the
#: vocab-parallel lm_head's all_gather inside the graph), the others as the CLI compiles them (one decoder
#: layer per kind; also 2-3x less compile work than whole models of these depths)
COMPILE_MODE = {"llama": "whole"}
#: W4A8 shard vs unsharded W4A8 (relative norm): row-parallel inputs are quantized per token per rank;
#: GLM-4-MoE's 3 layers, each with 2-3 row-parallel projections, measured 0.034
W4A8_TOL = {"glm4_moe": 0.05, "deepseek_v3": 0.05, "olmoe": 0.05}
DENSE_ARCHS = ARCHS[:2]  # tp.load (the per-rank loader) reads dense models only
LOADER_CASES = (("llama", "gptq", "gptq"), ("qwen2", "awq", "gemv"),  # tp.load only, besides the gemm cases
                ("llama", "compressed-tensors", "compressed_tensors_asym"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc, args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={_free_port()}", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        errs = "\n".join(line for line in r.stderr.splitlines() if line.startswith("[rank"))
        raise AssertionError(f"torchrun failed ({r.returncode}):\n{errs[-6000:] or r.stderr[-6000:]}")
    return r


def _checkpoint(path, arch, group_size=32, quant_method="awq", format="gemm", **cfg_kw):
    cfg = testing.tiny_config(arch, **cfg_kw)
    testing.save_quantized(testing.build_float_model(cfg, seed=0), str(path), quant_method=quant_method,
                           format=format, group_size=group_size)
    return str(path), cfg


def _load(path):
    hf.patch_transformers()
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _generate(model, prompt):
    out = model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0,
                         output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, prompt.shape[1]:], torch.cat(out.logits)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """(per-arch unsharded references, [rank 0 results, rank 1 results]) of one 2-rank torchrun job."""
    out = tmp_path_factory.mktemp("tp2")
    cases, refs = {}, {}
    for arch in ARCHS:
        path, cfg = _checkpoint(out / arch, arch)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=g)
        prompt = torch.randint(0, cfg.vocab_size, (1, 6), generator=g)
        cases[arch] = {"ckpt": path, "ids": ids, "prompt": prompt, "moe": arch not in DENSE_ARCHS,
                       "compile": COMPILE_MODE.get(arch, "regional")}
        model = _load(path)
        with torch.no_grad():
            ref = {"cfg": cfg, "logits": model(ids).logits}
            ref["tokens"], ref["step_logits"] = _generate(model, prompt)
            ref["w4a8_logits"] = convert(model, act_quant="int8")(ids).logits
        ref["ckpt"] = path
        refs[arch] = ref
    for arch, qm, fmt in LOADER_CASES:  # the per-rank loader on K-packed layouts
        path, cfg = _checkpoint(out / f"{arch}_{fmt}", arch, quant_method=qm, format=fmt)
        ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(2))
        cases[f"{arch}_{fmt}"] = {"ckpt": path, "ids": ids, "loader_only": True}
    torch.save(cases, out / "cases.pt")
    _torchrun(2, [WORKER, "--out", str(out)])
    return refs, [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_matches_unsharded(tp2, arch):
    """2 ranks vs the unsharded model: full-sequence logits within the dense tolerance, 16 identical
    greedy fp32 tokens with their per-step logits, eager and compiled; the compiled graphs hold 2
    all_reduce per decoder layer (o_proj and down_proj, or o_proj and the MoE experts) with no graph
    break, a whole-model graph also the lm_head's all_gather; the W4A8 shard matches unsharded W4A8."""
    refs, ranks = tp2
    ref, cfg = refs[arch], refs[arch]["cfg"]
    for r, res in enumerate(ranks):
        got = res[arch]
        assert got["heads"] == (cfg.num_attention_heads // 2, cfg.num_key_value_heads // 2), (r, got["heads"])
        torch.testing.assert_close(got["eager_logits"], ref["logits"], atol=2e-3, rtol=2e-3)
        for mode in ("eager", "compiled"):
            assert got[f"{mode}_tokens"].tolist() == ref["tokens"].tolist(), (r, mode)
            torch.testing.assert_close(got[f"{mode}_step_logits"], ref["step_logits"], atol=2e-3, rtol=2e-3)
        assert got["graph_breaks"] == 0
        ars, extra = got["all_reduce_per_graph"], EXTRA_ALL_REDUCE_PER_MOE_LAYER.get(arch, 0)
        assert got["compile"] == COMPILE_MODE.get(arch, "regional")
        dense_layers = cfg.num_hidden_layers if arch in DENSE_ARCHS else getattr(cfg, "first_k_dense_replace", 0) or 0
        if got["compile"] == "whole":
            want = 2 * cfg.num_hidden_layers + extra * (cfg.num_hidden_layers - dense_layers)
            assert ars and all(n == want for n in ars), ars
            assert got["all_gather_per_graph"] == [1] * len(ars), got["all_gather_per_graph"]  # vocab-parallel lm_head
        else:  # a graph per layer kind (prefill and decode): a dense layer's 2 all_reduce, an MoE layer's 2 + extra
            kinds = ({2} if dense_layers else set()) | ({2 + extra} if dense_layers < cfg.num_hidden_layers else set())
            assert ars and set(ars) == kinds, ars
            assert got["all_gather_per_graph"] == [0] * len(ars), got["all_gather_per_graph"]
        assert got["templated_kernels"] > 0
        w8, want8 = got["w4a8_logits"], ref["w4a8_logits"]
        assert float((w8 - want8).norm() / want8.norm()) < W4A8_TOL.get(arch, 0.03)
    # every rank holds the same (all-reduced) result
    torch.testing.assert_close(ranks[0][arch]["eager_logits"], ranks[1][arch]["eager_logits"], atol=0, rtol=0)


@pytest.mark.parametrize("case", [*DENSE_ARCHS, *(f"{a}_{f}" for a, _, f in LOADER_CASES)])
def test_tp2_loader_logits_equal_shard(tp2, case):
    """2 ranks: the shard loaded per rank from the safetensors files (tp.load) gives the logits of
    load -> convert -> shard exactly (gemm for both architectures, GPTQ for Llama, gemv for Qwen2)."""
    for r, res in enumerate(tp2[1]):
        got = res[case]
        want = got["eager_logits"] if case in ARCHS else got["shard_logits"]
        assert torch.isfinite(want).all() and want.abs().max() > 0
        torch.testing.assert_close(got["loader_logits"], want, atol=0, rtol=0, msg=lambda m: f"rank {r}: {m}")
        if case not in ARCHS:
            rd = got["read"]
            assert sum(rd["bytes"].values()) < rd["checkpoint_bytes"], rd


def test_tp2_epilogue_fused_before_all_reduce(tp2):
    """all_reduce(int4_mm(x) * 2 + 1) under torch.compile: one template kernel with the pointwise
    epilogue fused in, the collective in place on its output buffer, the eager result."""
    for res in tp2[1]:
        e = res["epilogue"]
        assert e["err"] == 0.0 and e["templated"] == 1 and e["epilogue_fusions"] == 1, {k: v for k, v in e.items() if k != "code"}
        assert "_c10d_functional.all_reduce_" in e["code"]


def test_launch_demo_tp2(tp2):
    """torchrun --nproc-per-node 2 -m awq_inductor --tp 2: each rank pinned to its own core, the model
    sharded, only rank 0 prints."""
    r = _torchrun(2, ["-m", "awq_inductor", "--tp", "2", "--model", tp2[0]["llama"]["ckpt"], "--no-compile",
                      "--prompt-len", "8", "--new-tokens", "4", "--dtype", "fp32"])
    out = r.stdout
    assert out.count("sharded over 2 ranks: 2 query / 1 KV heads per rank") == 1, out
    assert out.count("per-rank load: read ") == 1, out  # --model DIR goes through tp.load
    assert out.count("awq int4 eager") == 1 and "tensor parallel: 2 ranks (gloo)" in out, out
    if len(os.sched_getaffinity(0)) >= 2:
        assert "1 threads per rank" in out, out


def test_launch_demo_tp2_moe(tp2):
    """The demo on a MoE checkpoint under --tp 2: loaded whole (the per-rank loader reads dense models),
    then sharded with the experts split."""
    r = _torchrun(2, ["-m", "awq_inductor", "--tp", "2", "--model", tp2[0]["qwen3_moe"]["ckpt"], "--no-compile",
                      "--prompt-len", "8", "--new-tokens", "4", "--dtype", "fp32"])
    out = r.stdout
    assert out.count("all_reduce after o_proj and the MoE experts") == 1, out
    assert "per-rank load" not in out and out.count("awq int4 eager") == 1, out


# ------------------------------------------------------------------------------ in one process
def _converted(tmp_path, arch="llama", group_size=32, **cfg_kw):
    path, cfg = _checkpoint(tmp_path / arch, arch, group_size, **cfg_kw)
    return _load(path), cfg


def test_shard_layout_rank1_of_2(tmp_path):
    """rank 1 of 2 (explicit rank / world_size, no process group): q heads 2..3, KV head 1, the
    second halves of gate and up, K halves of o_proj / down_proj; config heads per rank."""
    model, cfg = _converted(tmp_path, "qwen2")
    attn0, mlp0 = model.model.layers[0].self_attn, model.model.layers[0].mlp
    full_qkv = attn0.qkv_proj.dequantize()
    full_bias = attn0.qkv_proj.bias.clone()
    full_o = attn0.o_proj.dequantize()
    full_gu = mlp0.gate_up_proj.dequantize()
    full_down = mlp0.down_proj.dequantize()
    tp.shard(model, rank=1, world_size=2)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    d, I = 32, cfg.intermediate_size
    rows = list(range(2 * d, 4 * d)) + list(range(4 * d + d, 4 * d + 2 * d)) + list(range(6 * d + d, 6 * d + 2 * d))
    torch.testing.assert_close(attn.qkv_proj.dequantize(), full_qkv[rows], atol=0, rtol=0)
    torch.testing.assert_close(attn.qkv_proj.bias, full_bias[rows], atol=0, rtol=0)
    assert [(attn._modules[p].start, attn._modules[p].stop) for p in ("q_proj", "k_proj", "v_proj")] == \
        [(0, 2 * d), (2 * d, 3 * d), (3 * d, 4 * d)]
    assert isinstance(attn.o_proj, tp.RowParallelLinear)
    torch.testing.assert_close(attn.o_proj.linear.dequantize(), full_o[:, 2 * d:], atol=0, rtol=0)
    assert isinstance(mlp.gate_up_proj, AWQGateUpSiluMul) and mlp.gate_up_proj.out_features == I // 2
    torch.testing.assert_close(mlp.gate_up_proj.dequantize(),
                               torch.cat([full_gu[I // 2:I], full_gu[I + I // 2:]]), atol=0, rtol=0)
    torch.testing.assert_close(mlp.down_proj.linear.dequantize(), full_down[:, I // 2:], atol=0, rtol=0)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads, model.config.head_dim) == (2, 1, d)
    with pytest.raises(tp.TPError, match="already sharded"):
        tp.shard(model, rank=1, world_size=2)


def test_vocab_parallel_lm_head_rows(tmp_path):
    """vocab 255 over 2 ranks: 128 rows each, the last one a zero pad; the ranks' rows are the head."""
    model, cfg = _converted(tmp_path, vocab_size=255)
    full = model.lm_head.weight.detach().clone()
    heads = []
    for r in range(2):
        m, _ = _converted(tmp_path / f"r{r}", vocab_size=255)
        tp.shard(m, rank=r, world_size=2)
        assert isinstance(m.lm_head, tp.VocabParallelLMHead) and m.lm_head.weight.shape == (128, cfg.hidden_size)
        heads.append(m.lm_head.weight.detach())
    rows = torch.cat(heads)
    assert torch.equal(rows[:255], full) and not rows[255].any()
    m, _ = _converted(tmp_path / "rep", vocab_size=255)
    tp.shard(m, rank=0, world_size=2, vocab_parallel=False)
    assert type(m.lm_head) in (torch.nn.Linear, Bf16HeadLinear) and m._awq_tp["vocab_parallel"] is False


def test_row_parallel_bias_added_once(tmp_path):
    """A row-parallel layer with a bias: summing the two ranks' partial products plus one bias is
    the unsharded output (bias added after the reduce, not on every rank)."""
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    q, z, s = testing.quantize_weight(w, 32)
    b = torch.randn(64)
    full = AWQLinear.from_canonical(q, z, s, b, group_size=32)
    x = torch.randn(3, 128)
    parts = [tp.sharding._row_linear("layer.o_proj", full, r * 64, (r + 1) * 64, None, 2) for r in range(2)]
    assert all(p.linear.bias is None and torch.equal(p.bias, b) for p in parts)
    y = sum(p.linear(x[:, r * 64:(r + 1) * 64]) for r, p in enumerate(parts)) + parts[0].bias
    torch.testing.assert_close(y, full(x), atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="no process group"):
        parts[0](x[:, :64])


def test_heads_that_do_not_divide_raise(tmp_path):
    model, cfg = _converted(tmp_path)  # 4 query heads, 2 KV heads
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.self_attn: attention heads must divide over the 4 ranks.*"
                                         r"num_attention_heads=4, num_key_value_heads=2"):
        tp.shard(model, rank=0, world_size=4)
    with pytest.raises(tp.TPError, match="3 ranks"):
        tp.shard(model, rank=0, world_size=3)
    assert {n: type(m) for n, m in model.named_modules()} == before  # nothing modified
    assert model.config.num_attention_heads == 4 and getattr(model, "_awq_tp", None) is None


def test_k_split_off_group_boundary_names_layer(tmp_path):
    # hidden 128, 4 heads of 32, G = 64: o_proj K / 2 = 64 splits, down_proj K = I = 320 -> 160 does not
    model, _ = _converted(tmp_path, group_size=64, intermediate_size=320)
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.mlp\.down_proj: .*multiple of group_size 64, got 160"):
        tp.shard(model, rank=0, world_size=2)
    # o_proj: G = 128 = K, each rank's 64 columns are half a group
    model, _ = _converted(tmp_path / "g128", group_size=128)
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.self_attn\.o_proj: .*multiple of group_size 128, got 64"):
        tp.shard(model, rank=0, world_size=2)


def test_shard_needs_converted_model_and_process_group():
    cfg = testing.tiny_config("llama")
    model = testing.build_float_model(cfg)
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.self_attn: unsupported attention projections.*Linear"):
        tp.shard(model, rank=0, world_size=2)
    import torch.distributed as dist

    if not dist.is_initialized():
        with pytest.raises(tp.TPError, match="not initialized"):
            tp.shard(model)


def test_exit_rank_returns_unless_torchrun_launched_the_process():
    """Without torchrun's environment exit_rank() only shuts the group down and returns; in a rank
    torchrun launched it ends the process at once with the code given, after flushing output."""
    code = ("import sys, torch.distributed as dist\n"
            "from awq_inductor import tp\n"
            "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
            "tp.exit_rank(3)\n"
            "print('returned', dist.is_initialized())\n"
            "sys.exit(0)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "returned False" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
    r = subprocess.run([sys.executable, "-c", code.replace("tp.exit_rank(3)", "print('before'); tp.exit_rank(3)")],
                       env=dict(env, LOCAL_WORLD_SIZE="1"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "before" in r.stdout and "returned" not in r.stdout, (r.returncode, r.stdout)


def test_rank_cores():
    # NUMA layout that divides: whole nodes per rank
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert tp.rank_cores(0, 2, nodes=nodes, allowed=range(8)) == [0, 1, 2, 3]
    assert tp.rank_cores(1, 2, nodes=nodes, allowed=range(8)) == [4, 5, 6, 7]
    assert tp.rank_cores(1, 2, nodes=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11]], allowed=range(12)) == [8, 9, 10, 11]
    # one node (or an uneven layout): even split of the affinity mask
    assert tp.rank_cores(0, 2, nodes=[[0, 1]], allowed=[0, 1]) == [0]
    assert tp.rank_cores(1, 2, nodes=[[0, 1]], allowed=[0, 1]) == [1]
    assert tp.rank_cores(2, 3, nodes=[], allowed=[2, 3, 4, 5, 6, 7, 8]) == [7, 8]
    # explicit lists
    assert tp.rank_cores(1, 2, spec="0-3,8;4-7") == [4, 5, 6, 7]
    assert tp.parse_cpulist("0-2,5, 7-8\n") == [0, 1, 2, 5, 7, 8]
    with pytest.raises(ValueError, match="expected 2 core lists"):
        tp.rank_cores(0, 2, spec="0-3")
    with pytest.raises(ValueError, match="only 1 allowed cores"):
        tp.rank_cores(0, 2, nodes=[], allowed=[0])


# ------------------------------------------------------------------------------ per-rank loader
INT4_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _tensor_bytes(path):
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as f:
        return {k: f.get_slice(k)[:].numel() * f.get_slice(k)[:].element_size() for k in f.keys()}


@pytest.mark.parametrize("arch,qm,fmt", [("llama", "awq", "gemm"), ("qwen2", "gptq", "gptq"),
                                         ("llama", "awq", "gemv"), ("qwen2", "awq", "gemv_fast")])
def test_load_equals_load_convert_shard(tmp_path, arch, qm, fmt):
    """tp.load(dir, rank=r, world_size=2) builds exactly the module tree and packed buffers of
    shard(from_pretrained(dir)) for both ranks, in every checkpoint layout."""
    path, cfg = _checkpoint(tmp_path / arch, arch, quant_method=qm, format=fmt)
    for r in range(2):
        want = tp.shard(_load(path), rank=r, world_size=2)
        got = tp.load(path, rank=r, world_size=2, dtype=torch.float32)
        assert [(n, type(m).__name__) for n, m in got.named_modules()] == \
            [(n, type(m).__name__) for n, m in want.named_modules()]
        a, b = want.state_dict(), got.state_dict()
        assert a.keys() == b.keys()
        bad = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
        assert not bad, (r, bad[:8])
        assert (got.config.num_attention_heads, got.config.num_key_value_heads) == (2, 1)
        assert {k: v for k, v in got._awq_tp.items() if k != "read"} == want._awq_tp
        if fmt == "gemm" and r == 1:  # W4A8: loaded with act_quant="int8" == sharded, then converted to int8
            a = convert(want, act_quant="int8").state_dict()
            b = tp.load(path, rank=r, world_size=2, dtype=torch.float32, act_quant="int8").state_dict()
            assert a.keys() == b.keys() and any(k.endswith(".comp") for k in a)
            assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("arch,qm,fmt", [("llama", "compressed-tensors", "compressed_tensors"),
                                         ("qwen2", "auto-round", "autoround_awq"),
                                         ("llama", "auto-round", "autoround_gptq")])
def test_load_equals_shard_new_formats(tmp_path, arch, qm, fmt):
    """compressed-tensors and AutoRound checkpoints: tp.load per rank == shard(from_pretrained)."""
    test_load_equals_load_convert_shard(tmp_path, arch, qm, fmt)


def test_act_order_row_parallel_split_names_the_layer(tmp_path):
    """GPTQ act-order: column-parallel layers keep their permutation; a row-parallel layer whose
    sorted K slice holds other ranks' input columns is refused by name (tp.shard and tp.load)."""
    cfg = testing.tiny_config("llama")
    path = str(tmp_path / "ao")
    testing.save_quantized(testing.build_float_model(cfg, seed=0), path, quant_method="gptq", format="gptq",
                           group_size=32, act_order="per_layer")
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.self_attn\.o_proj: act-order .*row-parallel"):
        tp.shard(_load(path), rank=0, world_size=2)
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.self_attn\.o_proj: act-order .*row-parallel"):
        tp.load(path, rank=0, world_size=2, dtype=torch.float32)
    # world size 1: nothing to split, the permutations are kept
    m = tp.load(path, rank=0, world_size=1, dtype=torch.float32)
    assert all(x.perm is not None for x in m.modules() if isinstance(x, AWQLinear))


@pytest.mark.parametrize("qm,fmt", [("awq", "gemm"), ("gptq", "gptq"), ("awq", "gemv")])
def test_load_reads_only_its_shard(tmp_path, qm, fmt):
    """Bytes requested through the slicing reader: each rank reads exactly half of every int4 tensor
    (qweight, qzeros, scales) of q/k/v, o, gate/up, down and of the untied lm_head, none of them whole;
    the embedding and norms are read whole. gemv's K split (o_proj, down_proj) has no clean slice and
    is read whole (documented fallback)."""
    path, cfg = _checkpoint(tmp_path / fmt, "llama", quant_method=qm, format=fmt)
    full = _tensor_bytes(path)
    int4 = {k for k in full if k.rpartition(".")[0].rpartition(".")[2] in INT4_LAYERS
            and k.rpartition(".")[2] in ("qweight", "qzeros", "scales")}
    assert len(int4) == 3 * len(INT4_LAYERS) * cfg.num_hidden_layers
    whole_ok = {k for k in int4 if fmt == "gemv" and k.split(".")[-2] in ("o_proj", "down_proj")}
    per_rank = []
    for r in range(2):
        rd = tp.load(path, rank=r, world_size=2, dtype=torch.float32)._awq_tp["read"]
        per_rank.append(rd)
        assert rd["checkpoint_bytes"] == sum(full.values())
        for k in int4 - whole_ok:
            assert k not in rd["whole"] and 2 * rd["bytes"][k] == full[k], (r, k, rd["bytes"].get(k), full[k])
        for k in whole_ok:
            assert k in rd["whole"] and rd["bytes"][k] == full[k]
        assert 2 * rd["bytes"]["lm_head.weight"] == full["lm_head.weight"]
        assert "model.embed_tokens.weight" in rd["whole"] and "model.norm.weight" in rd["whole"]
        # nothing is read twice, nothing left out
        assert set(rd["bytes"]) == set(full) and all(rd["bytes"][k] <= full[k] for k in full)
    big = sum(full[k] for k in int4 - whole_ok) + full["lm_head.weight"]
    read = [sum(rd["bytes"].values()) for rd in per_rank]
    assert read[0] == read[1] == sum(full.values()) - big // 2, (read, sum(full.values()), big)


def test_load_errors_name_the_layer(tmp_path):
    path, _ = _checkpoint(tmp_path / "g64", "llama", group_size=64, intermediate_size=320)
    with pytest.raises(tp.TPError, match=r"model\.layers\.0\.mlp\.down_proj: .*multiple of group_size 64, got 160"):
        tp.load(path, rank=0, world_size=2)
    with pytest.raises(tp.TPError, match=r"attention heads must divide over the 4 ranks.*num_key_value_heads=2"):
        tp.load(path, rank=0, world_size=4)
