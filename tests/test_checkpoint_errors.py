"""Corrupt checkpoints raise CheckpointError naming the file and the tensor (never a crash or a
silently wrong layer); loading memory stays near the packed model size (small-scale check)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from awq_inductor import hf, testing  # noqa: E402


@pytest.fixture(autouse=True)
def _patched():
    hf.patch_transformers()
    yield


@pytest.fixture(scope="module")
def clean_ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("ckpt") / "llama-gemm")
    testing.save_quantized(testing.build_float_model(testing.tiny_config("llama")), path, format="gemm",
                           group_size=32)
    return path


def _copy(src, tmp_path, name):
    import shutil

    dst = str(tmp_path / name)
    shutil.copytree(src, dst)
    return dst, os.path.join(dst, "model.safetensors")


def _load(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_clean_checkpoint_loads(clean_ckpt):
    _load(clean_ckpt)


@pytest.mark.parametrize("cut", [10, 5000])
def test_truncated_file(clean_ckpt, tmp_path, cut):
    path, f = _copy(clean_ckpt, tmp_path, f"trunc{cut}")
    os.truncate(f, os.path.getsize(f) - cut)
    with pytest.raises(hf.CheckpointError, match=r"model\.safetensors: truncated safetensors file: tensor \S+ needs"):
        _load(path)


def test_truncated_header(clean_ckpt, tmp_path):
    path, f = _copy(clean_ckpt, tmp_path, "trunc_header")
    os.truncate(f, 100)
    with pytest.raises(hf.CheckpointError, match=r"model\.safetensors: truncated safetensors file: the header"):
        _load(path)


def test_wrong_dtype(clean_ckpt, tmp_path):
    path, _ = _copy(clean_ckpt, tmp_path, "dtype")
    key = "model.layers.1.self_attn.k_proj.qweight"
    testing.rewrite_checkpoint(path, lambda sd: sd.__setitem__(key, sd[key].float()))
    with pytest.raises(hf.CheckpointError,
                       match=r"model\.safetensors: " + re.escape(key) + r": expected dtype int32 .* got torch\.float32"):
        _load(path)


def test_wrong_shape_names_file(clean_ckpt, tmp_path):
    path, _ = _copy(clean_ckpt, tmp_path, "shape")
    key = "model.layers.0.mlp.down_proj.scales"
    testing.rewrite_checkpoint(path, lambda sd: sd.__setitem__(key, sd[key][:-1].contiguous()))
    with pytest.raises(hf.CheckpointError, match=r"model\.safetensors: " + re.escape(key) + r": expected shape"):
        _load(path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scales(clean_ckpt, tmp_path, bad):
    path, _ = _copy(clean_ckpt, tmp_path, f"scales{bad}")
    key = "model.layers.0.mlp.down_proj.scales"

    def edit(sd):
        sd[key][1, 3] = bad

    testing.rewrite_checkpoint(path, edit)
    with pytest.raises(hf.CheckpointError,
                       match=r"model\.safetensors: tensor " + re.escape(key) + r": expected finite values, got 1 NaN/Inf "
                             r"\(first at index \[1, 3\]"):
        _load(path)


@pytest.mark.parametrize("bits", [8, 3])
def test_bits_not_4(clean_ckpt, tmp_path, bits):
    path, _ = _copy(clean_ckpt, tmp_path, f"bits{bits}")
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["quantization_config"]["bits"] = bits
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    with pytest.raises(hf.CheckpointError, match=rf"config\.json: quantization_config\.bits: expected 4 .* got {bits}"):
        _load(path)
