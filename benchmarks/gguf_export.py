"""A llama-architecture GGUF file written from a float transformers Llama, for the peers that
``bench_e2e.py`` times beside us (llama.cpp, ik_llama.cpp) on the same weights. Benchmarks only:
needs the ``gguf`` package (``pip install gguf``), never a runtime or test dependency of the package.

Linears and the token embedding are Q4_0 (``gguf.quants``: blocks of 32, one fp16 scale); the
output projection BF16 (``output="bf16"``, as our default head) or Q4_0 (``"q4_0"``); norms F32.
q_proj / k_proj rows are permuted from Hugging Face's rotate-half order to GGML's interleaved rope
(llama.cpp's converter does the same), so the file computes what the model does. The vocabulary is
a placeholder SentencePiece one (3 specials, the 256 byte tokens, then ``tok<i>``): the peers are
timed on token ids, never on text.
"""
from __future__ import annotations

import numpy as np
import torch

OUTPUTS = ("bf16", "q4_0")


def _permute_rope(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(n: int):
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    if n < len(specials) + len(byte_tokens):
        raise ValueError(f"gguf_export: vocab_size {n} is below the {3 + 256} placeholder tokens")
    tokens = specials + byte_tokens + [f"tok{i}" for i in range(n - 259)]
    types = [2, 3, 3] + [6] * 256 + [1] * (n - 259)  # unknown, control, control, byte, normal
    return tokens, [0.0] * n, types


def write_llama_gguf(model: torch.nn.Module, path: str, output: str = "bf16") -> str:
    """Write ``model`` (a transformers ``LlamaForCausalLM`` with float weights) to ``path``."""
    import gguf

    if output not in OUTPUTS:
        raise ValueError(f"output: expected one of {OUTPUTS}, got {output!r}")
    cfg = model.config
    Q = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, "llama")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(getattr(cfg, "rope_theta", None) or 10000.0))
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    tokens, scores, types = _vocab(cfg.vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def f32(t: torch.Tensor) -> np.ndarray:
        return t.detach().to(torch.float32).contiguous().numpy()

    def put(name: str, t: np.ndarray, qtype) -> None:
        if qtype == Q.F32:
            w.add_tensor(name, t.astype(np.float32))
        elif qtype == Q.BF16:
            w.add_tensor(name, gguf.quants.quantize(t, Q.BF16), raw_dtype=Q.BF16)
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)

    inner = model.model
    put("token_embd.weight", f32(inner.embed_tokens.weight), Q.Q4_0)
    for i, layer in enumerate(inner.layers):
        a, m = layer.self_attn, layer.mlp
        put(f"blk.{i}.attn_norm.weight", f32(layer.input_layernorm.weight), Q.F32)
        put(f"blk.{i}.attn_q.weight", _permute_rope(f32(a.q_proj.weight), cfg.num_attention_heads), Q.Q4_0)
        put(f"blk.{i}.attn_k.weight", _permute_rope(f32(a.k_proj.weight), cfg.num_key_value_heads), Q.Q4_0)
        put(f"blk.{i}.attn_v.weight", f32(a.v_proj.weight), Q.Q4_0)
        put(f"blk.{i}.attn_output.weight", f32(a.o_proj.weight), Q.Q4_0)
        put(f"blk.{i}.ffn_norm.weight", f32(layer.post_attention_layernorm.weight), Q.F32)
        put(f"blk.{i}.ffn_gate.weight", f32(m.gate_proj.weight), Q.Q4_0)
        put(f"blk.{i}.ffn_up.weight", f32(m.up_proj.weight), Q.Q4_0)
        put(f"blk.{i}.ffn_down.weight", f32(m.down_proj.weight), Q.Q4_0)
    put("output_norm.weight", f32(inner.norm.weight), Q.F32)
    put("output.weight", f32(model.lm_head.weight), Q.BF16 if output == "bf16" else Q.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
