"""The small *real* language model that ships with the package, and its quantized checkpoints.

``awq_inductor/data/tiny_llama`` holds a LlamaForCausalLM (hidden 256, intermediate 768, 4 layers,
GQA 4/2 heads, 2048-token byte-level BPE, 4.2 M parameters, bf16 safetensors) trained on the Python
standard library's sources by ``benchmarks/train_tiny_llama.py``, its tokenizer files and
``heldout.txt`` (text from held-out stdlib files). Unlike random weights, its logits are peaked
and its activations have the outliers of a trained model, so perplexity and greedy agreement
measure whether the int4 paths are right (``tests/test_fidelity.py``,
``benchmarks/fidelity_report.py``), and ``python -m awq_inductor`` prints sensible text.

:func:`save_quantized_checkpoint` writes a real AWQ (gemm, gemv, gemv_fast) or GPTQ checkpoint
folder of it (``config.json`` with ``quantization_config``, ``model.safetensors``, tokenizer files),
quantized with AutoAWQ's rounding (:func:`awq_inductor.testing.quantize_weight`), and returns the
dequantized fp32 reference model.
"""
from __future__ import annotations

import hashlib
import math
import os
import shutil
from typing import Optional

import torch

from . import testing

CHECKPOINT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny_llama")
# (quant_method, checkpoint format) of every format we load
FORMATS = (("awq", "gemm"), ("awq", "gemv"), ("awq", "gemv_fast"), ("gptq", "gptq"))
GROUP_SIZES = (32, 64, 128)
#: the formats of issue #24 (quant_method, format, act_order): compressed-tensors (bf16 scales, as
#: llm-compressor writes them), AutoRound's four packings, GPTQ act-order (a random column order per
#: linear stands in for GPTQ's Hessian order: the layout and the gather are what is exercised)
NEW_FORMATS = (("compressed-tensors", "compressed_tensors", None), ("compressed-tensors", "compressed_tensors_asym", None),
               ("auto-round", "autoround_gptq", None), ("auto-round", "autoround", None),
               ("auto-round", "autoround_gptqmodel", None), ("auto-round", "autoround_awq", None),
               ("gptq", "gptq", "per_layer"))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def checkpoint_dir() -> str:
    """The packaged dense checkpoint (raises FileNotFoundError naming the path when absent)."""
    if not os.path.exists(os.path.join(CHECKPOINT_DIR, "model.safetensors")):
        raise FileNotFoundError(f"the tiny Llama checkpoint is missing: {CHECKPOINT_DIR}/model.safetensors "
                                f"(train it with benchmarks/train_tiny_llama.py)")
    return CHECKPOINT_DIR


def load_tokenizer(path: Optional[str] = None):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path or checkpoint_dir())


def load_dense(dtype: torch.dtype = torch.float32):
    """The dense model (stored in bf16) in ``dtype``, eval mode."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(checkpoint_dir(), dtype=dtype).eval()


def heldout_text() -> str:
    with open(os.path.join(checkpoint_dir(), "heldout.txt"), encoding="utf-8") as f:
        return f.read()


def heldout_ids(n_tokens: Optional[int] = None, tokenizer=None) -> torch.Tensor:
    """[1, T] token ids of ``heldout.txt`` (its first ``n_tokens``)."""
    tok = tokenizer or load_tokenizer()
    ids = tok(heldout_text(), add_special_tokens=False, return_tensors="pt", verbose=False)["input_ids"]
    if n_tokens is not None:
        if ids.shape[1] < n_tokens:
            raise ValueError(f"n_tokens: heldout.txt has {ids.shape[1]} tokens, asked for {n_tokens}")
        ids = ids[:, :n_tokens]
    return ids


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, seq_len: int = 256) -> float:
    """exp(mean NLL) of ``ids`` [1, T] cut into non-overlapping windows of ``seq_len`` tokens; one
    forward per window with batch 1 (so a compiled model reuses the graph ``generate`` compiled for
    prefill), log-softmax in fp32 whatever the model's dtype."""
    n = ids.shape[-1] // seq_len
    if n == 0:
        raise ValueError(f"ids: expected at least seq_len={seq_len} tokens, got {ids.shape[-1]}")
    nll, count = 0.0, 0
    for x in ids.reshape(-1)[: n * seq_len].view(n, 1, seq_len):
        logits = model(x).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, x[:, 1:, None])
        nll -= lp.sum().item()
        count += lp.numel()
    return math.exp(nll / count)


def unigram_perplexity(ids: torch.Tensor, vocab_size: int) -> float:
    """Perplexity of the unigram distribution fitted on ``ids`` itself (add-one smoothing): an
    optimistic (low) unigram baseline, since it has seen the text it is scored on."""
    counts = torch.bincount(ids.reshape(-1), minlength=vocab_size).double() + 1.0
    logp = torch.log(counts / counts.sum())
    return math.exp(-logp[ids.reshape(-1)].mean().item())


@torch.no_grad()
def greedy(model, ids: torch.Tensor, new_tokens: int, pad_token_id: int = 0) -> torch.Tensor:
    """The ``new_tokens`` greedy continuation tokens [B, new_tokens] (transformers ``generate``)."""
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=pad_token_id)
    return out[:, ids.shape[1]:]


@torch.no_grad()
def forced_agreement(model, prompt: torch.Tensor, ref_tokens: torch.Tensor) -> float:
    """Fraction of a reference's greedy tokens ``ref_tokens`` [1, n] that ``model`` picks too, each
    given the same context (``prompt`` + the reference's earlier tokens; one forward). Unlike comparing
    two free-running ``generate`` outputs, one flipped near-tie does not turn every later token into a
    mismatch."""
    x = torch.cat([prompt, ref_tokens[:, :-1]], 1)
    pred = model(x).logits[:, prompt.shape[1] - 1:].argmax(-1)
    return (pred == ref_tokens).float().mean().item()


def save_quantized_checkpoint(path: str, quant_method: str = "awq", format: str = "gemm", group_size: int = 128,
                              dense=None, act_order=None):
    """Quantize the tiny model (every decoder linear; ``lm_head`` stays dense) into a real checkpoint
    folder at ``path`` (with the tokenizer files); return the dequantized fp32 reference model.
    ``dense``: the fp32 dense model, if already loaded. compressed-tensors gets bf16 scales (what
    llm-compressor writes), the rest fp16. ``act_order``: see :func:`testing.quantize_to_state_dict`."""
    if dense is None:
        dense = load_dense(torch.float32)
    sdt = torch.bfloat16 if quant_method == "compressed-tensors" else torch.float16
    ref = testing.save_quantized(dense, path, quant_method=quant_method, format=format, group_size=group_size,
                                 scales_dtype=sdt, act_order=act_order)
    for name in TOKENIZER_FILES:
        src = os.path.join(checkpoint_dir(), name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(path, name))
    return ref


def checkpoint_digest() -> str:
    """A short hash of the packaged weights (names the demo's cached quantized copies)."""
    h = hashlib.sha256()
    with open(os.path.join(checkpoint_dir(), "model.safetensors"), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:12]


def demo_checkpoint(cache_dir: str, group_size: int = 128, log=print) -> str:
    """The demo's model: the tiny Llama quantized to AWQ gemm, cached under ``cache_dir`` with
    ``dense.safetensors`` (the dequantized weights in bf16: the dense baseline computes the same model)."""
    path = os.path.join(cache_dir, f"tiny-llama-{checkpoint_digest()}-awq-gemm-g{group_size}")
    if os.path.exists(os.path.join(path, "model.safetensors")) and os.path.exists(os.path.join(path, "dense.safetensors")):
        log(f"Using cached default model: {path}")
        return path
    log(f"Quantizing the packaged tiny Llama (trained on the Python stdlib) to AWQ gemm g{group_size} in {path}")
    tmp = path + ".tmp"
    return testing.publish_demo_checkpoint(save_quantized_checkpoint(tmp, "awq", "gemm", group_size), tmp, path)
