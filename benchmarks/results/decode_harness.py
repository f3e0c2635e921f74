"""The set-up the decode harnesses of 2026-12-07 share (decode_*.py, head_group_size_b2b.py, kernel_ref_ab.py):
a random int4 layer, cold copies of its tensors, and the compiled 4-layer Llama-7B-shaped model."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import transformers  # noqa: E402

from bench_linear import make_layer  # noqa: E402
from llama_shape import add_shape_args, llama_config  # noqa: E402
from awq_inductor import AWQLinear, compile_for_generate, convert, patch_transformers  # noqa: E402
from awq_inductor.kernels import hugepages  # noqa: E402
from awq_inductor.testing import build_float_model, save_quantized  # noqa: E402


def random_layer(K: int, N: int, G: int):
    """(a W4A16 AWQLinear of random int4 weights, its op's tensors in order, their bytes)."""
    layer = AWQLinear.from_canonical(*make_layer(K, N, G), group_size=G)
    weights = [getattr(layer, w.name) for w in layer.op.scheme.weights]
    return layer, weights, sum(w.numel() * w.element_size() for w in weights)


def cold_copies(weights, total: int = 1 << 30):
    """Copies of all of ``weights`` (on the pages a loaded model's streamed weights get), ``total`` bytes in all."""
    nb = sum(w.numel() * w.element_size() for w in weights)
    return [tuple(hugepages.copy_on_huge_pages(w) for w in weights) for _ in range(max(2, total // nb))]


def model_args(parser):
    """The 4-layer Llama-7B shape's arguments, and ``--head`` (bf16 | int8 | int4)."""
    add_shape_args(parser, layers=4)
    parser.add_argument("--head", default="int4")
    return parser


def compiled_model(a, regional: bool = True):
    """The AWQ gemm (G = 128) model of ``a``'s shape, saved, loaded through transformers with our patching,
    its head as ``a.head``, compiled for generate."""
    with tempfile.TemporaryDirectory() as d:
        save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=128)
        patch_transformers()
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    if a.head != "bf16":
        model = convert(model, lm_head=a.head)
    return compile_for_generate(model, regional=regional)
