"""Corrupt checkpoints raise CheckpointError naming the file and the tensor (never a crash or a
silently wrong layer); loading memory stays near the packed model size (small-scale check)."""
from __future__ import annotations

import json
import os
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from awq_inductor import testing  # noqa: E402
from awq_inductor.integrations import transformers as hf  # noqa: E402


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


def _rss_kib():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1])
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc")
def test_drop_file_pages_releases_only_mapped_checkpoint_pages(tmp_path):
    """Small-scale load-memory check: the pages of a converted tensor read from an mmapped
    safetensors file leave the resident set; anonymous tensors and neighbouring tensors are
    untouched (the full-size figure is benchmarks/bench_load_memory.py)."""
    from safetensors.torch import load_file, save_file

    from awq_inductor.transform import load_memory

    f = str(tmp_path / "m.safetensors")
    save_file({"a": torch.arange(8 << 20, dtype=torch.int32), "b": torch.arange(1000, dtype=torch.int32)}, f)
    sd = load_file(f)  # mmap-backed views
    maps = load_memory.file_mappings()
    assert maps, "safetensors.load_file did not mmap the file"
    anon = torch.arange(1 << 20, dtype=torch.int32)
    before = _rss_kib()
    assert int(sd["a"].sum()) == sum(range(8 << 20))  # touch every page
    touched = _rss_kib()
    assert touched - before > 20_000  # ~32 MiB of file pages now resident
    assert load_memory.drop_file_pages([anon], maps) == 0  # never advises anonymous memory
    done = load_memory.drop_file_pages([sd["a"]], maps)
    assert done >= (32 << 20) - 2 * 4096
    assert touched - _rss_kib() > 20_000
    # the data is still there (re-read from the file), and so is the neighbour
    assert int(sd["a"][-1]) == (8 << 20) - 1 and torch.equal(sd["b"], torch.arange(1000, dtype=torch.int32))
    assert torch.equal(anon, torch.arange(1 << 20, dtype=torch.int32))
