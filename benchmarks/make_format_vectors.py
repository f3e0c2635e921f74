#!/usr/bin/env python
"""Make int4 test vectors with the formats' OWN reference code.

(awq-inductor: this is the generator of tests/data/vectors24, kept as it was run. It needs the
reference libraries below, which are not dependencies of awq-inductor, and is NOT run by the tests
or CI; the tests only read the committed vectors. Its output paths are the ones of the session that
made them: copy the files to tests/data/vectors24 after a rerun.)

Run with the reference venv (torch 2.13.0 cpu, transformers 5.24.0,
compressed-tensors 0.20.0, llmcompressor 0.14.0.1 (--no-deps), auto-round 0.16.1):

    HF_HUB_OFFLINE=1 /work/venv-ref/bin/python /work/scratch/vectors24/make_vectors.py

Nothing is downloaded: tiny random Llama models are built from a LlamaConfig,
saved to a local temp dir and quantized there.

Per case one safetensors file (< 100 KB) in /work/scratch/vectors24/vectors/ with
  * the packed tensors of ONE linear, under their checkpoint names
  * ref_weight  fp32 [N, K]  the library's own dequantized weight
  * ref_q       uint8 [N, K] 0..15   (canonical unsigned code)
  * ref_zero    uint8 [N, G'] 0..15  (zero the library's dequant actually uses)
  * ref_scale   fp32 [N, G']          (the stored scale, exactly)
  * (some cases) ref_zero_calib (AutoRound: zero point before the zp-1 clamp), ref_perm (GPTQ act-order)
  * metadata: quantization_config (JSON string exactly as in config.json) and notes
The canonical contract checked for every file:  ref_weight == (ref_q - ref_zero[:, g(k)]) * ref_scale[:, g(k)]
computed in the checkpoint's scale dtype (bf16 for CT, fp16 for AutoRound/GPTQ) and widened to fp32.
"""
import glob
import importlib.util
import json
import os
import shutil
import sys
import traceback
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

torch.set_num_threads(1)
from safetensors import safe_open
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
VEC = os.path.join(HERE, "vectors")
WORK = os.path.join(HERE, "tmp_work")
AUTOGPTQ_SRC = os.path.join(HERE, "dl", "agptq", "src", "auto_gptq")  # unzipped auto_gptq-0.7.1 wheel
os.makedirs(VEC, exist_ok=True)
os.makedirs(WORK, exist_ok=True)

REPORT = []  # lines for the run log


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    REPORT.append(s)


# ----------------------------------------------------------------------------------------------
# tiny models
# ----------------------------------------------------------------------------------------------
MODELS = {
    # name: hidden, intermediate, heads   (num_key_value_heads = 1)
    "A": (256, 128, 4),  # k_proj N=64  K=256 ; gate N=128 K=256 ; down K=128
    "B": (160, 96, 2),  # gate_proj N=96 K=160 (G=32)
    "B2": (128, 96, 2),  # gate_proj N=96 K=128 (G=64)
    "C": (100, 60, 2),  # gate_proj N=60 K=100 (channel, odd K)
    "D": (128, 60, 2),  # gate_proj N=60 K=128 (G=64, N not multiple of 8)
}


def get_module(model, name):
    m = model
    for p in name.split("."):
        m = getattr(m, p)
    return m


def build_model(tag, target, seed=1234):
    """Random tiny Llama saved locally (bf16). Edge rows in the target linear:
    row 0 all >= 0 (asym zero point at the bottom of the range), row 1 all <= 0 (top of range),
    row 2 all zeros (scale 0 -> eps clamp)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = os.path.join(WORK, f"tiny_{tag}_{target.replace('.', '_')}")
    if os.path.exists(path):
        return path
    hidden, inter, heads = MODELS[tag]
    cfg = LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=1,
        num_attention_heads=heads, num_key_value_heads=1, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for _, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.normal_(0, 0.05)
        w = get_module(model, target).weight
        w[0] = w[0].abs()
        w[1] = -w[1].abs()
        w[2] = 0
    model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(1, 64)}
    vocab["<unk>"] = 0
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<unk>", eos_token="<unk>")


# ----------------------------------------------------------------------------------------------
# independent (documented) unpack / pack helpers -- checked against the libraries below
# ----------------------------------------------------------------------------------------------
def u32(t):
    return t.numpy().view(np.uint32) if isinstance(t, torch.Tensor) else t.view(np.uint32)


def nibbles_last(words, n):
    """words uint32 [..., W] -> uint8 [..., n]; element 8*w+i = (word[w] >> 4*i) & 15."""
    w = u32(words)
    sh = (np.arange(8, dtype=np.uint32) * 4)
    out = ((w[..., :, None] >> sh) & 0xF).astype(np.uint8)
    return out.reshape(*w.shape[:-1], -1)[..., :n]


def pack_last(vals):
    """uint8 [..., n] (0..15) -> int32 [..., ceil(n/8)], zero padded, low nibble first."""
    v = np.asarray(vals, dtype=np.uint32)
    n = v.shape[-1]
    pad = (-n) % 8
    if pad:
        v = np.concatenate([v, np.zeros((*v.shape[:-1], pad), np.uint32)], axis=-1)
    v = v.reshape(*v.shape[:-1], -1, 8)
    w = np.zeros(v.shape[:-1], np.uint32)
    for i in range(8):
        w |= v[..., i] << np.uint32(4 * i)
    return torch.from_numpy(w.view(np.int32).copy())


AWQ_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]  # value j of 8 consecutive columns goes to nibble AWQ_ORDER[j]
AWQ_REVERSE = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble s holds value AWQ_REVERSE[s]


def unpack_awq_last(words, n):
    nib = nibbles_last(words, words.shape[-1] * 8).reshape(*words.shape[:-1], -1, 8)
    out = np.empty_like(nib)
    for s in range(8):
        out[..., AWQ_REVERSE[s]] = nib[..., s]
    return out.reshape(*words.shape[:-1], -1)[..., :n]


def pack_awq_last(vals):
    v = np.asarray(vals, dtype=np.uint32)
    v = v.reshape(*v.shape[:-1], -1, 8)
    w = np.zeros(v.shape[:-1], np.uint32)
    for j in range(8):
        w |= v[..., j] << np.uint32(4 * AWQ_ORDER[j])
    return torch.from_numpy(w.view(np.int32).copy())


def canonical_dequant(q, z, s, group_size, compute_dtype):
    """q uint8 [N,K], z uint8 [N,ng], s float [N,ng] -> fp32 [N,K]; (q - z) * s in compute_dtype."""
    q = torch.as_tensor(q).to(torch.int32)
    z = torch.as_tensor(z).to(torch.int32)
    K = q.shape[1]
    g = torch.arange(K) // group_size
    d = (q - z[:, g]).to(compute_dtype) * s[:, g].to(compute_dtype)
    return d.float()


def check(name, cond, detail=""):
    log(f"   [{'OK' if cond else 'FAIL'}] {name} {detail}")
    if not cond:
        FAILS.append(name)


FAILS = []


def save_vector(fname, tensors, meta):
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    meta = {k: (v if isinstance(v, str) else json.dumps(v, sort_keys=True)) for k, v in meta.items()}
    path = os.path.join(VEC, fname)
    save_file(tensors, path, metadata=meta)
    size = os.path.getsize(path)
    log(f"   -> {fname}  {size} bytes  tensors: " + ", ".join(f"{k}{tuple(v.shape)}:{str(v.dtype)[6:]}" for k, v in tensors.items()))
    assert size < 100 * 1024, f"{fname} too big"


# ----------------------------------------------------------------------------------------------
# 1. compressed-tensors 0.20.0 via llm-compressor 0.14.0.1 oneshot (real save path)
# ----------------------------------------------------------------------------------------------
def ct_case(fname, tag, target, recipe_kwargs, note):
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig, LlamaForCausalLM
    from compressed_tensors.compressors import BaseCompressor, PackedQuantizationCompressor
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize, quantize

    log(f"== CT case {fname}: model {tag} target {target} recipe {recipe_kwargs}")
    src = build_model(tag, target)
    model = LlamaForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    oneshot(model=model, recipe=QuantizationModifier(**recipe_kwargs))
    mod = get_module(model, target)
    scheme = mod.quantization_scheme
    W = mod.weight.detach().clone()
    scale = mod.weight_scale.detach().clone()
    zp = getattr(mod, "weight_zero_point", None)
    zp = zp.detach().clone() if zp is not None else None
    # exactly the call PackedQuantizationCompressor.compress makes (pack_quantized/base.py)
    q_signed = quantize(x=W, scale=scale, zero_point=zp, args=scheme.weights, dtype=torch.int8)
    fq = fake_quantize(x=W, scale=scale, zero_point=zp, args=scheme.weights)

    out = os.path.join(WORK, "ct_" + fname.replace(".safetensors", ""))
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, save_compressed=True)
    qcfg = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
    sd = load_file(os.path.join(out, "model.safetensors"))
    pre = target + "."
    ckpt = {k: v for k, v in sd.items() if k.startswith(pre)}
    local = {k[len(pre):]: v for k, v in ckpt.items()}
    log("   checkpoint tensors:", {k: (str(v.dtype), tuple(v.shape)) for k, v in ckpt.items()})
    N, K = W.shape
    sym = scheme.weights.symmetric
    strategy = scheme.weights.strategy
    G = scheme.weights.group_size if strategy == "group" else K

    # library decompression (same call transformers' CompressedTensorsDequantize makes)
    comp = BaseCompressor.get_value_from_registry(scheme.format)
    check("format registry -> PackedQuantizationCompressor", comp is PackedQuantizationCompressor, scheme.format)
    dec = comp.decompress(dict(local), scheme)
    ref_weight = dec["weight"]
    check("decompress == fake_quantize(original)", torch.equal(ref_weight, fq.to(ref_weight.dtype)))

    # canonical form
    ref_q = (q_signed.to(torch.int16) + 8).to(torch.uint8)
    if sym:
        ref_zero = torch.full(scale.shape, 8, dtype=torch.uint8)
    else:
        ref_zero = (zp.to(torch.int16) + 8).to(torch.uint8)
    # independent unpack == library intermediates
    q_unp = nibbles_last(local["weight_packed"], K)
    check("unpack(weight_packed) == quantize()+8", np.array_equal(q_unp, ref_q.numpy()))
    check("pack(ref_q) byte-identical", torch.equal(pack_last(ref_q.numpy()), local["weight_packed"]))
    if not sym:
        zpk = local["weight_zero_point"]
        z_unp = nibbles_last(zpk.t().contiguous(), N).T  # packed along N (dim 0)
        check("unpack(weight_zero_point) == zp+8", np.array_equal(z_unp, ref_zero.numpy()))
        check("pack(ref_zero) byte-identical",
              torch.equal(pack_last(ref_zero.numpy().T).t().contiguous(), zpk))
    check("weight_shape == (N,K)", local["weight_shape"].tolist() == [N, K], str(local["weight_shape"].dtype))
    canon = canonical_dequant(ref_q, ref_zero, scale, G, scale.dtype)
    check("(q-z)*s in scale dtype == library", torch.equal(canon, ref_weight.float()))
    canon32 = canonical_dequant(ref_q, ref_zero, scale, G, torch.float32).to(scale.dtype).float()
    check("(q-z)*s in fp32 then ->bf16 == library", torch.equal(canon32, ref_weight.float()))

    # transformers' own load path with compressed-tensors installed (dequantize=True)
    try:
        hf = AutoModelForCausalLM.from_pretrained(out, quantization_config=CompressedTensorsConfig(dequantize=True))
        hw = get_module(hf, target).weight.detach()
        check("transformers from_pretrained(dequantize=True) weight == ref", torch.equal(hw.float(), ref_weight.float()), str(hw.dtype))
    except Exception as e:  # noqa
        log("   transformers dequantize load failed:", repr(e)[:300])

    t = dict(ckpt)
    t.update(ref_weight=ref_weight.float(), ref_q=ref_q, ref_zero=ref_zero, ref_scale=scale.float())
    meta = dict(quantization_config=qcfg, case=fname, library="compressed-tensors 0.20.0 + llmcompressor 0.14.0.1 oneshot",
                target=target, N=str(N), K=str(K), group_size=str(G), strategy=strategy, symmetric=str(sym),
                scale_dtype=str(scale.dtype), compute="W = (ref_q - ref_zero[:,k//G]) * ref_scale[:,k//G] in scale dtype (bf16)",
                notes=note)
    save_vector(fname, t, meta)
    return qcfg


# ----------------------------------------------------------------------------------------------
# 2. AutoRound 0.16.1
# ----------------------------------------------------------------------------------------------
RECS = []


def install_autoround_capture():
    import auto_round_extension.torch.qlinear_torch as v2mod
    import auto_round_extension.torch.qlinear_torch_zp as zpmod
    from auto_round.export.export_to_awq import utils as awqu

    def wrap(cls, kind):
        orig = cls.pack
        if getattr(orig, "_wrapped", False):
            return

        def pack(self, linear, scales, zeros, g_idx=None, device=None):
            rec = dict(kind=kind, W=linear.weight.detach().clone(), scales=scales.detach().clone(),
                       zeros=zeros.detach().clone() if isinstance(zeros, torch.Tensor) else zeros,
                       group_size=self.group_size)
            r = orig(self, linear, scales, zeros, g_idx, device)
            rec["qweight"] = self.qweight.clone()
            RECS.append(rec)
            return r

        pack._wrapped = True
        cls.pack = pack

    wrap(zpmod.QuantLinear, "gptq_v1_zp_minus_1")
    wrap(v2mod.QuantLinear, "gptq_v2_raw_zp")
    orig_fl = awqu.WQLinear_GEMM.from_linear.__func__
    if not getattr(orig_fl, "_wrapped", False):
        def from_linear(cls, linear, w_bit, group_size, init_only=False, scales=None, zeros=None, device=None):
            rec = dict(kind="awq", W=linear.weight.detach().clone(), scales=scales.detach().clone(),
                       zeros=zeros.detach().clone() if isinstance(zeros, torch.Tensor) else zeros,
                       group_size=group_size if group_size != -1 else linear.in_features)
            ql = orig_fl(cls, linear, w_bit, group_size, init_only=init_only, scales=scales, zeros=zeros, device=device)
            rec["qweight"] = ql.qweight.clone()
            RECS.append(rec)
            return ql

        from_linear._wrapped = True
        awqu.WQLinear_GEMM.from_linear = classmethod(from_linear)


def ar_case(fname, tag, target, sym, gs, fmt, note, layer_config=None):
    from auto_round import AutoRound
    from transformers import LlamaForCausalLM
    import auto_round_extension.torch.qlinear_torch as v2mod
    import auto_round_extension.torch.qlinear_torch_zp as zpmod
    from auto_round.export.export_to_awq import utils as awqu

    log(f"== AutoRound case {fname}: model {tag} target {target} sym={sym} group_size={gs} format={fmt} layer_config={layer_config}")
    install_autoround_capture()
    RECS.clear()
    src = build_model(tag, target)
    model = LlamaForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    out = os.path.join(WORK, "ar_" + fname.replace(".safetensors", ""))
    shutil.rmtree(out, ignore_errors=True)
    kw = dict(tokenizer=tiny_tokenizer(), scheme="W4A16", bits=4, group_size=gs, sym=sym, iters=0,
              disable_opt_rtn=True, device_map="cpu")
    if layer_config:
        kw["layer_config"] = layer_config
    ar = AutoRound(model, **kw)
    ar.quantize_and_save(out, format=fmt)
    d = [p for p in glob.glob(out + "/**/config.json", recursive=True)][0]
    d = os.path.dirname(d)
    qcfg = json.load(open(os.path.join(d, "config.json")))["quantization_config"]
    qcfg_file = json.load(open(os.path.join(d, "quantization_config.json"))) if os.path.exists(os.path.join(d, "quantization_config.json")) else None
    sd = {}
    for f in glob.glob(d + "/*.safetensors"):
        sd.update(load_file(f))
    pre = target + "."
    ckpt = {k: v for k, v in sd.items() if k.startswith(pre)}
    log("   config.quantization_config:", json.dumps(qcfg, sort_keys=True))
    log("   checkpoint tensors:", {k: (str(v.dtype), tuple(v.shape)) for k, v in ckpt.items()})
    other = sorted({k.rsplit(".", 1)[-1] for k in sd})
    log("   all tensor suffixes in checkpoint:", other)
    pf = qcfg["packing_format"]
    qweight, qzeros, scales = ckpt[pre + "qweight"], ckpt[pre + "qzeros"], ckpt[pre + "scales"]
    rec = [r for r in RECS if r["qweight"].shape == qweight.shape and torch.equal(r["qweight"], qweight)]
    check("captured pack call for target", len(rec) == 1, f"{len(rec)} matches of {len(RECS)} packs")
    rec = rec[0]
    W = rec["W"]
    N, K = W.shape
    G = rec["group_size"]
    ng = (K + G - 1) // G
    s_in = rec["scales"]  # GPTQ-like: [N, ng]; AWQ: passed transposed [ng, N]
    z_in = rec["zeros"]
    log(f"   pack kind={rec['kind']} W {W.dtype} scales {s_in.dtype}{tuple(s_in.shape)} zeros "
        f"{(z_in.dtype, tuple(z_in.shape)) if isinstance(z_in, torch.Tensor) else repr(z_in)}")
    if rec["kind"] == "awq":
        s_nk = s_in.t()
        z_nk = z_in.t() if isinstance(z_in, torch.Tensor) else z_in
    else:
        s_nk = s_in
        z_nk = z_in
    # library's integer code, same expression as pack_248_bits / from_linear
    rs = s_nk.repeat_interleave(G, 1)[:, :K]
    rz = z_nk.repeat_interleave(G, 1)[:, :K] if isinstance(z_nk, torch.Tensor) else z_nk
    ref_q = torch.round(W / rs + rz).clamp_(0, 15).to(torch.uint8)
    if isinstance(z_nk, torch.Tensor):
        z_calib = z_nk.to(torch.int32)
    else:
        z_calib = torch.full((N, ng), int(z_nk), dtype=torch.int32)
    if rec["kind"] == "gptq_v1_zp_minus_1":
        ref_zero = ((z_calib - 1).clamp(0, 15) + 1).to(torch.uint8)
    else:
        ref_zero = z_calib.clamp(0, 15).to(torch.uint8)
    ref_scale = scales.t().contiguous()  # stored fp16 [ng, N] -> [N, ng]
    check("stored scales == fp16(pack input scales)", torch.equal(ref_scale, s_nk.half()))

    # library dequantization
    eye = torch.eye(K, dtype=torch.float32)
    if rec["kind"] == "awq":
        ref_weight = awqu.dequantize_gemm(qweight, qzeros, scales, 4, G).t().float()
        q_unp = unpack_awq_last(qweight, N).T
        z_unp = unpack_awq_last(qzeros, N).T
        repack_q = pack_awq_last(ref_q.numpy().T)
        repack_z = pack_awq_last(ref_zero.numpy().T)
        zoff = 0
    else:
        cls = zpmod.QuantLinear if rec["kind"] == "gptq_v1_zp_minus_1" else v2mod.QuantLinear
        has_gidx = (pre + "g_idx") in ckpt
        ql = cls(4, G if G != K else -1, K, N, bias=False, g_idx=has_gidx)
        ql.qweight, ql.qzeros, ql.scales = qweight, qzeros, scales
        if has_gidx:
            ql.g_idx = ckpt[pre + "g_idx"]
            check("g_idx == arange(K)//G", torch.equal(ql.g_idx.long(), torch.arange(K) // G))
        with torch.no_grad():
            ref_weight = ql(eye).t().float()
        q_unp = nibbles_last(qweight.t().contiguous(), K)  # qweight [K/8, N] packed along K
        zst = nibbles_last(qzeros, N).T  # qzeros [ng, N/8] packed along N -> [N, ng]
        zoff = 1 if rec["kind"] == "gptq_v1_zp_minus_1" else 0
        z_unp = zst + zoff
        repack_q = pack_last(ref_q.numpy()).t().contiguous()
        repack_z = pack_last((ref_zero.numpy().astype(np.int16) - zoff).T.astype(np.uint8))
    check("unpack(qweight) == library integer code", np.array_equal(q_unp, ref_q.numpy()))
    check("unpack(qzeros)(+offset) == effective zero", np.array_equal(z_unp, ref_zero.numpy()), f"offset={zoff}")
    check("pack(ref_q) byte-identical to qweight", torch.equal(repack_q, qweight))
    check("pack(ref_zero) byte-identical to qzeros", torch.equal(repack_z, qzeros))
    canon = canonical_dequant(ref_q, ref_zero, ref_scale, G, torch.float16)
    check("(q-z)*s in fp16 == library dequant", torch.equal(canon, ref_weight))
    zp0 = (z_calib == 0).sum().item()
    if zp0:
        log(f"   note: {zp0} calibration zero points == 0" + (" -> stored as 0 and decoded as 1 (zp-1 clamp)" if zoff else ""))
    neg = (ref_scale < 0).sum().item()
    log(f"   negative scales: {neg} of {ref_scale.numel()}")

    # transformers load with auto-round installed (CPU)
    try:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16)
        lay = get_module(hf, target)
        with torch.no_grad():
            hw = lay(torch.eye(K, dtype=torch.float16)).t().float()
        log(f"   transformers+auto_round loaded layer type {type(lay).__module__}.{type(lay).__name__}")
        check("transformers from_pretrained layer(eye) == ref_weight", torch.allclose(hw, ref_weight, atol=0, rtol=0)
              or torch.equal(hw.half(), ref_weight.half()), f"maxdiff={(hw - ref_weight).abs().max().item():.3g}")
    except Exception as e:  # noqa
        log("   transformers auto-round load failed:", repr(e)[:300])

    t = dict(ckpt)
    t.update(ref_weight=ref_weight.float(), ref_q=ref_q, ref_zero=ref_zero, ref_scale=ref_scale.float())
    if rec["kind"] == "gptq_v1_zp_minus_1" or rec["kind"] == "awq" or rec["kind"] == "gptq_v2_raw_zp":
        t["ref_zero_calib"] = z_calib.clamp(0, 255).to(torch.uint8)
    meta = dict(quantization_config=qcfg, quantization_config_json_file=qcfg_file or {}, case=fname,
                library="auto-round 0.16.1 (AutoRound iters=0 disable_opt_rtn=True, quantize_and_save)",
                target=target, N=str(N), K=str(K), group_size=str(gs), packing_format=pf, pack_kind=rec["kind"],
                zero_offset_in_qzeros=str(zoff),
                compute="W = (ref_q - ref_zero[:,k//G]) * ref_scale[:,k//G] in fp16; ref_zero already includes the +1 of auto_gptq",
                notes=note)
    save_vector(fname, t, meta)
    return qcfg


# ----------------------------------------------------------------------------------------------
# 3. GPTQ act-order with AutoGPTQ 0.7.1's own GPTQ + QuantLinear(cuda, torch fallback)
# ----------------------------------------------------------------------------------------------
def load_autogptq():
    if "agq" in sys.modules:
        return sys.modules["agq.quantization.gptq"], sys.modules["agq.nn_modules.qlinear.qlinear_cuda"]
    for pkg in ["agq", "agq.quantization", "agq.nn_modules", "agq.nn_modules.qlinear"]:
        m = types.ModuleType(pkg)
        m.__path__ = [os.path.join(AUTOGPTQ_SRC, *pkg.split(".")[1:])]
        sys.modules[pkg] = m

    def load(modname, rel):
        spec = importlib.util.spec_from_file_location(modname, os.path.join(AUTOGPTQ_SRC, rel))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
        return mod

    load("agq.quantization.quantizer", "quantization/quantizer.py")
    g = load("agq.quantization.gptq", "quantization/gptq.py")
    ql = load("agq.nn_modules.qlinear.qlinear_cuda", "nn_modules/qlinear/qlinear_cuda.py")
    return g, ql


def gptq_actorder_case(fname, N, K, G, sym, seed=7):
    log(f"== GPTQ act-order case {fname}: N={N} K={K} G={G} sym={sym} (AutoGPTQ 0.7.1 GPTQ.fasterquant + qlinear_cuda.QuantLinear.pack)")
    gmod, qlmod = load_autogptq()
    torch.cuda.synchronize = lambda *a, **k: None  # fasterquant calls it unconditionally; CPU-only torch
    torch.manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
    lin = lin.half().float()  # weights representable in fp16
    gq = gmod.GPTQ(lin)
    gq.quantizer.configure(4, perchannel=True, sym=sym, mse=False)
    colscale = torch.rand(K) * 3 + 0.05
    for _ in range(4):
        x = torch.randn(1, 128, K) * colscale
        gq.add_batch(x, lin(x))
    scale, zero, g_idx = gq.fasterquant(blocksize=128, percdamp=0.01, group_size=G, actorder=True, static_groups=False)
    # like auto_gptq.modeling._utils.pack_model: layer (now holding Q) in fp16, scale/zero/g_idx on cpu
    lin16 = lin.half()
    ql = qlmod.QuantLinear(4, G, K, N, bias=False, weight_dtype=torch.float16)
    ql.pack(lin16, scale, zero, g_idx)
    qweight, qzeros, scales, gidx = ql.qweight, ql.qzeros, ql.scales, ql.g_idx
    with torch.no_grad():
        ref_weight = ql(torch.eye(K, dtype=torch.float16)).t().float()  # torch fallback path (no CUDA ext)
    # library integer code, same expression as qlinear_cuda.pack (NO clamp there)
    W = lin16.weight.data
    s_t = scale.t().contiguous()
    z_t = zero.t().contiguous()
    sz = z_t * s_t
    s16 = s_t.to(torch.float16)
    iw = torch.stack([torch.round((W[:, k] + sz[gidx[k]]) / s16[gidx[k]]).to(torch.int) for k in range(K)], 1)
    check("integer code within 0..15 (qlinear_cuda.pack has no clamp)", bool(((iw >= 0) & (iw <= 15)).all()))
    ref_q = iw.to(torch.uint8)
    ref_zero = zero.to(torch.uint8)  # [N, ng], calibration zero; qzeros stores zero-1
    ref_scale = scales.t().contiguous().float()  # [N, ng]
    q_unp = nibbles_last(qweight.t().contiguous(), K)
    z_unp = nibbles_last(qzeros, N).T + 1
    check("unpack(qweight) == code (stored in ORIGINAL column order)", np.array_equal(q_unp, ref_q.numpy()))
    check("unpack(qzeros)+1 == zero", np.array_equal(z_unp, ref_zero.numpy()))
    check("pack(ref_q) byte-identical", torch.equal(pack_last(ref_q.numpy()).t().contiguous(), qweight))
    check("pack(ref_zero-1) byte-identical", torch.equal(pack_last((ref_zero.numpy() - 1).T), qzeros))
    gi = gidx.long()
    deq = ((ref_q.to(torch.int32) - ref_zero.to(torch.int32)[:, gi]).to(torch.float16) * scales.t()[:, gi]).float()
    check("W[:,k] = (q[:,k]-z[:,g_idx[k]])*s[:,g_idx[k]] == library forward", torch.equal(deq, ref_weight))
    check("g_idx non-trivial (act-order really permuted)", not torch.equal(gi, torch.arange(K) // G))
    perm = torch.argsort(gi, stable=True)
    check("g_idx[stable argsort] == arange(K)//G (contiguous groups of exactly G)", torch.equal(gi[perm], torch.arange(K) // G))
    counts = torch.bincount(gi, minlength=K // G)
    check("every group has exactly G columns", bool((counts == G).all()), str(counts.tolist()))
    # reordered weight is an ordinary contiguous-group weight
    qp = ref_q[:, perm]
    deq_p = canonical_dequant(qp, ref_zero, ref_scale, G, torch.float16)
    check("dequant(q[:,perm]) with contiguous groups == ref_weight[:,perm]", torch.equal(deq_p, ref_weight[:, perm]))
    x = torch.randn(3, K)
    y1 = x @ ref_weight.t()
    y2 = x[:, perm] @ ref_weight[:, perm].t()
    check("x @ W.T == x[:,perm] @ W[:,perm].T", torch.allclose(y1, y2, atol=1e-5))
    check("scale dtype fp16 (weight_dtype)", scales.dtype == torch.float16)
    qcfg = {"bits": 4, "group_size": G, "damp_percent": 0.01, "desc_act": True, "static_groups": False, "sym": sym,
            "true_sequential": True, "model_name_or_path": None, "model_file_base_name": None,
            "is_marlin_format": False, "quant_method": "gptq"}
    pre = "model.layers.0.mlp.down_proj."
    t = {pre + "qweight": qweight, pre + "qzeros": qzeros, pre + "scales": scales, pre + "g_idx": gidx,
         "ref_weight": ref_weight, "ref_q": ref_q, "ref_zero": ref_zero, "ref_scale": ref_scale,
         "ref_perm": perm.to(torch.int64)}
    meta = dict(quantization_config=qcfg, case=fname,
                library="auto-gptq 0.7.1 wheel sources: quantization/gptq.py GPTQ.fasterquant(actorder=True) + nn_modules/qlinear/qlinear_cuda.py QuantLinear.pack/forward(torch path)",
                N=str(N), K=str(K), group_size=str(G), symmetric=str(sym),
                compute="W[:,k] = (ref_q[:,k] - ref_zero[:,g_idx[k]]) * ref_scale[:,g_idx[k]] in fp16; qzeros stores zero-1 (GPTQ v1)",
                notes="quantization_config is BaseQuantizeConfig.to_dict() (auto_gptq/modeling/_base.py) with desc_act=True; ref_perm = torch.argsort(g_idx, stable=True)")
    save_vector(fname, t, meta)


# ----------------------------------------------------------------------------------------------
def main():
    only = sys.argv[1:]

    def want(n):
        return not only or any(n.startswith(o) for o in only)

    ct_cases = [
        ("ct_w4a16_sym_g128.safetensors", "A", "model.layers.0.self_attn.k_proj",
         dict(targets="Linear", scheme="W4A16", ignore=["lm_head"]),
         "llm-compressor preset W4A16 (symmetric, group 128); no weight_zero_point saved"),
        ("ct_w4a16_sym_g32_n96.safetensors", "B", "model.layers.0.mlp.gate_proj",
         dict(targets="Linear", ignore=["lm_head"], config_groups={"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}}),
         "symmetric group 32, N=96"),
        ("ct_w4a16_asym_g128.safetensors", "A", "model.layers.0.self_attn.k_proj",
         dict(targets="Linear", scheme="W4A16_ASYM", ignore=["lm_head"]),
         "llm-compressor preset W4A16_ASYM (asymmetric, group 128): weight_zero_point int32 packed along N"),
        ("ct_w4a16_asym_g64_n60.safetensors", "D", "model.layers.0.mlp.gate_proj",
         dict(targets="Linear", ignore=["lm_head", "re:.*down_proj$"], config_groups={"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64}}}),
         "asymmetric group 64, N=60 (zero-point packing along N pads 60->64 nibbles); down_proj ignored by regex (K=60 % 64 != 0)"),
        ("ct_w4a16_sym_channel.safetensors", "A", "model.layers.0.self_attn.k_proj",
         dict(targets="Linear", ignore=["lm_head"], config_groups={"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "int", "symmetric": True, "strategy": "channel"}}}),
         "symmetric per-channel: weight_scale [N,1]"),
        ("ct_w4a16_asym_channel_k100.safetensors", "C", "model.layers.0.mlp.gate_proj",
         dict(targets="Linear", ignore=["lm_head"], config_groups={"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "int", "symmetric": False, "strategy": "channel"}}}),
         "asymmetric per-channel, N=60 K=100: weight_packed [60,13] (K padded 100->104 with nibble 0), zero point [8,1]"),
    ]
    for c in ct_cases:
        if want(c[0]):
            try:
                ct_case(*c)
            except Exception:
                log(traceback.format_exc())
                FAILS.append(c[0])

    L = "model.layers.0."
    ar_cases = [
        ("ar_sym_g128_autogptq.safetensors", "A", L + "self_attn.k_proj", True, 128, "auto_round",
         "default: format auto_round + sym -> packing_format auto_round:auto_gptq (GPTQ v1, qzeros = zp-1)"),
        ("ar_sym_g32_autogptq_n96.safetensors", "B", L + "mlp.gate_proj", True, 32, "auto_round",
         "sym group 32, N=96 K=160"),
        ("ar_sym_channel_autogptq.safetensors", "A", L + "self_attn.k_proj", True, -1, "auto_round",
         "sym per-channel (group_size -1): scales [1,N]"),
        ("ar_asym_g128_autoawq.safetensors", "A", L + "self_attn.k_proj", False, 128, "auto_round",
         "default for asym 4-bit: format auto_round -> packing_format auto_round:auto_awq (AutoAWQ GEMM layout, raw zero points)"),
        ("ar_asym_g64_autoawq_n96.safetensors", "B2", L + "mlp.gate_proj", False, 64, "auto_round",
         "asym group 64 N=96 K=128 -> auto_round:auto_awq; down_proj kept 16-bit via layer_config (K=96 % 64)",
         {L + "mlp.down_proj": {"bits": 16}}),
        ("ar_asym_channel_autoawq.safetensors", "A", L + "self_attn.k_proj", False, -1, "auto_round",
         "asym per-channel -> auto_round:auto_awq"),
        ("ar_asym_g128_native.safetensors", "A", L + "self_attn.k_proj", False, 128, "auto_round",
         "asym with a mixed-bits layer_config (down_proj 8 bit) -> AWQ not eligible -> native packing_format 'auto_round' (GPTQ layout, RAW zero points, no g_idx)",
         {L + "mlp.down_proj": {"bits": 8}}),
        ("ar_asym_g128_autogptq.safetensors", "A", L + "self_attn.k_proj", False, 128, "auto_round:auto_gptq",
         "explicit auto_round:auto_gptq with asym: qzeros = clamp(zp-1,0,15); zp==0 decodes as 1"),
        ("ar_asym_g64_gptqmodel_n96.safetensors", "B2", L + "mlp.gate_proj", False, 64, "auto_round:gptqmodel",
         "auto_round:gptqmodel: GPTQ layout, RAW zero points (v2), plus g_idx = arange(K)//G"),
    ]
    for c in ar_cases:
        if want(c[0]):
            try:
                ar_case(*c)
            except Exception:
                log(traceback.format_exc())
                FAILS.append(c[0])

    for fname, N, K, G, sym in [("gptq_actorder_sym_g64.safetensors", 64, 256, 64, True),
                                ("gptq_actorder_asym_g32.safetensors", 32, 256, 32, False)]:
        if want(fname):
            try:
                gptq_actorder_case(fname, N, K, G, sym)
            except Exception:
                log(traceback.format_exc())
                FAILS.append(fname)

    log("FAILS:", FAILS)
    with open(os.path.join(HERE, "make_vectors.log"), "w") as f:
        f.write("\n".join(REPORT) + "\n")


if __name__ == "__main__":
    main()
