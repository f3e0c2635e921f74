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
