"""The set-up the decode harnesses of 2026-12-07 share (decode_*.py, head_group_size_b2b.py, kernel_ref_ab.py):
a random int4 layer, cold copies of its tensors, and the compiled 4-layer Llama-7B-shaped model; and for the
step A/B harnesses of 2026-12-08 (decode_a8_step_ab.py, regional_global_guards_ab.py, nested_region_step_ab.py)
that model uncompiled, a deep copy of it on huge pages, and decode steps timed in turn."""
import collections
import copy
import os
import statistics
import sys
import tempfile
import time

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


def loaded_model(a):
    """The AWQ gemm (G = 128) model of ``a``'s shape, saved, loaded through transformers with our patching,
    its head as ``a.head`` (not compiled)."""
    with tempfile.TemporaryDirectory() as d:
        save_quantized(build_float_model(llama_config(a)), d, format="gemm", group_size=128)
        patch_transformers()
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
    if a.head != "bf16":
        model = convert(model, lm_head=a.head)
    return model


def compiled_model(a, regional: bool = True):
    """:func:`loaded_model`, compiled for generate."""
    return compile_for_generate(loaded_model(a), regional=regional)


def huge_page_copy(model):
    """A deep copy of ``model`` with its streamed weights back on huge pages (a deep copy holds them on 4 KiB
    pages: its decode step was 1.036x the original's, regional_global_guards_ab.py before this)."""
    twin = copy.deepcopy(model)
    hugepages.place_streamed_weights(twin)
    return twin


def interleaved_steps(models: dict, vocab: int, n: int = 64, rounds: int = 8, before=None, after=None) -> dict:
    """ms per decode step of each of ``models`` (name -> compiled model): after a warm-up (and
    ``wait_until_compiled``), one greedy generate of ``n`` tokens after a 32-token prompt each in turn, the order
    reversed every other round. ``before(name)`` / ``after(name, res)`` run around each timed generate (extra
    splits). Returns {name: [ms per step per round]}."""
    from awq_inductor.integrations.generation import wait_until_compiled

    ids = torch.randint(0, vocab, (1, 32))
    res = collections.defaultdict(list)
    with torch.no_grad():
        for m in models.values():
            m.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None)
        wait_until_compiled()
        for r in range(rounds):
            for name in (list(models) if r % 2 == 0 else list(models)[::-1]):
                m = models[name]
                m.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None)
                if before:
                    before(name)
                t0 = time.perf_counter()
                m.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None)
                res[name].append((time.perf_counter() - t0) / n * 1e3)
                if after:
                    after(name, res)
    return res


def same_tokens(models: dict, vocab: int, n: int = 8) -> bool:
    """Whether every model of ``models`` generates the same greedy tokens."""
    ids = torch.randint(0, vocab, (1, 32))
    with torch.no_grad():
        outs = [m.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None) for m in models.values()]
    return all(torch.equal(outs[0], o) for o in outs[1:])


def ratio_line(label: str, a: list, b: list) -> str:
    """Medians of two per-round series and b / a per round."""
    per = [y / x for x, y in zip(a, b)]
    return (f"{label}: {statistics.median(a):.2f} / {statistics.median(b):.2f} ms per step; per round "
            + " ".join(f"{r:.3f}" for r in per) + f"; median {statistics.median(per):.3f}")
