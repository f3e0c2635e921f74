"""Integrations with other libraries (``transformers``: loading AWQ / GPTQ checkpoints)."""
