"""``python -m awq_inductor`` on its default model (the packaged tiny Llama), eager only (seconds)."""
import pytest

pytest.importorskip("transformers")


def test_demo_prompt_streams_text_from_the_tiny_llama(tmp_path, capsys):
    from awq_inductor.__main__ import main

    argv = ["--prompt", "def fibonacci(n):", "--no-compile", "--no-dense", "--no-int4pack", "--new-tokens", "6",
            "--threads", "1", "--cache-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tiny Llama" in out and "awq-gemm-g128" in out  # quantized the packaged model into the cache
    assert "[def fibonacci(n):]" in out                     # the prompt, decoded by the checkpoint's tokenizer
    assert "6 tokens in" in out and "awq int4 eager" in out
    assert main(argv) == 0                                  # second run reuses the cached checkpoint
    assert "Using cached default model" in capsys.readouterr().out


def test_demo_arch_qwen3_moe(tmp_path, capsys, monkeypatch):
    """``--arch qwen3_moe`` builds a random Qwen3-MoE checkpoint (shrunk here) and runs its experts on
    awq::int4_moe; the dense baseline (dense.safetensors) generates the same greedy tokens in fp32."""
    from awq_inductor import cli as demo

    monkeypatch.setattr(demo, "MOE_SHAPE", dict(demo.MOE_SHAPE, vocab_size=512, hidden_size=128, num_experts=8,
                                                num_experts_per_tok=2, moe_intermediate_size=64,
                                                num_attention_heads=4, num_key_value_heads=2, head_dim=32))
    argv = ["--arch", "qwen3_moe", "--no-compile", "--dtype", "fp32", "--new-tokens", "6", "--prompt-len", "8",
            "--threads", "1", "--group-size", "32", "--cache-dir", str(tmp_path)]
    assert demo.main(argv) == 0
    out = capsys.readouterr().out
    assert "qwen3moe-h128-e8-k2-i64" in out and "2 MoE experts modules (awq::int4_moe)" in out
    assert "int4pack baseline skipped" in out
    assert "eager vs dense: 100% identical" in out
