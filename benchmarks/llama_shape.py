"""The Llama-7B-shaped model that the end-to-end benchmarks build (bench_e2e, bench_tp,
bench_load_memory): one set of shape options and one config from them."""
from __future__ import annotations

import argparse
import json
import os

import transformers


def add_shape_args(p: argparse.ArgumentParser, *, layers: int, kv_heads: int = 8) -> None:
    """--layers/--hidden/--intermediate/--heads/--kv-heads/--vocab/--group-size (Llama-7B widths)."""
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=kv_heads)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--group-size", type=int, default=128)


def llama_config(a: argparse.Namespace) -> transformers.LlamaConfig:
    """The LlamaConfig of the parsed shape options (untied lm_head, as real 7B checkpoints)."""
    return transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                                    num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                    num_key_value_heads=a.kv_heads, max_position_embeddings=4096,
                                    tie_word_embeddings=False)


def write_results(out: str, payload: dict, table: str) -> None:
    """``payload`` as JSON at ``out`` and the markdown ``table`` beside it (same name, ``.md``)."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(table + "\n")
