"""Shared machinery of the codegen goldens (tests/test_goldens.py, tests/test_goldens_w4a8.py).

A golden test builds inputs, compiles them with :func:`compile_code` inside a :class:`GoldenTestCase`
(``cpp.threads`` pinned to 4, Inductor caches disabled, a fresh TORCHINDUCTOR_CACHE_DIR), and passes
:meth:`GoldenTestCase.golden_region` of the code to ``assertExpectedInline``. The
``assertExpectedInline`` calls stay in the test files: ``EXPECTTEST_ACCEPT=1`` rewrites the literal
in the file that makes the call.

Normalisation (:func:`awq_region`): the ``// BEGIN awq`` .. ``// END awq`` region; size symbols
``\\bk?s\\d+\\b`` -> ``s0``; trailing spaces stripped; the body of the store lambda (Inductor's own
epilogue code from ``kernel.store_output``, which depends on Inductor's vector ISA and version)
replaced by ``<inductor store_output>`` and checked separately (``store`` pattern). The inlined awq
header is not goldened: it must appear in the code verbatim (``header``).
"""
from __future__ import annotations

import contextlib
import re
import tempfile
import unittest.mock

import expecttest
import torch
from torch._inductor import config as iconfig
from torch._inductor.utils import run_and_get_code

from awq_inductor import inductor

AMX_RUNS = bool(torch.cpu._is_amx_tile_supported())

BEGIN, END = "// BEGIN awq", "// END awq"
STORE_PLACEHOLDER = " " * 8 + "<inductor store_output>"
# a line after which the store lambda's body is Inductor's (elided up to the closing "};")
_STORE_STARTS = ("awq_acc_buf = const_cast<float*>(awq_acc);", "// store_output:")


class _Captured(Exception):
    pass


def capture_code_only(fn, *args):
    """Generate the module code without compiling it (for an ISA this CPU cannot build/run)."""
    from torch._inductor.graph import GraphLowering

    codes = []

    def fake_compile_to_module(self):
        wrapper_code, kernel_code = self.codegen()
        codes.append(wrapper_code.value)
        raise _Captured()

    torch._dynamo.reset()
    with unittest.mock.patch.object(GraphLowering, "compile_to_module", fake_compile_to_module):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - dynamo wraps our sentinel
            if not codes:
                raise
            del e
    return codes


def compile_code(fn, *args, run: bool = True):
    """``(out, code)`` of the compiled ``fn(*args)``: run it (``out`` its result) or, with
    ``run=False``, only generate the code (``out`` None)."""
    if run:
        out, codes = run_and_get_code(fn, *args)
    else:
        out, codes = None, capture_code_only(fn, *args)
    return out, "\n".join(codes)


def raw_region(code: str) -> str:
    """The un-normalised region from ``// BEGIN awq`` up to (not including) ``// END awq``."""
    return code[code.index(BEGIN): code.index(END)]


def awq_region(code: str) -> str:
    """The normalised ``// BEGIN awq`` .. ``// END awq`` region (see module doc)."""
    i, j = code.index(BEGIN), code.index(END)
    text = code[i: j + len(END)]
    text = re.sub(r"\bk?s\d+\b", "s0", text)
    lines = [ln.rstrip() for ln in text.splitlines()]
    out, skipping = [], False
    for ln in lines:
        if skipping:
            if ln.strip() == "};":
                out.append(STORE_PLACEHOLDER)
                out.append(ln)
                skipping = False
            continue
        out.append(ln)
        if any(marker in ln for marker in _STORE_STARTS):
            skipping = True
    return "\n".join(out)


def awq_weights(rows: int, K: int, G: int, pack, *, seed: int, signed_scales: bool = False,
                bias: bool = True, n_out: int | None = None):
    """Random canonical int4 weights ``rows x K`` packed by ``pack(q, z, s, G)``, as the trailing
    arguments of ``torch.ops.awq.int4_mm*``: ``(*packed, bias or None, G, n_out or rows)``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, K), dtype=torch.uint8, generator=g)
    z = torch.randint(0, 16, (rows, K // G), dtype=torch.uint8, generator=g)
    s = (torch.randn if signed_scales else torch.rand)(rows, K // G, generator=g) * 0.05
    b = torch.randn(rows, generator=g) if bias else None
    return (*pack(q, z, s, G), b, G, rows if n_out is None else n_out)


def assert_close_scaled(out: torch.Tensor, ref: torch.Tensor, tol: float = 2e-2):
    """``out`` ~ ``ref`` relative to ``max |ref|``."""
    ref = ref.float()
    scale = ref.abs().max()
    torch.testing.assert_close(out.float() / scale, ref / scale, atol=tol, rtol=tol)


@contextlib.contextmanager
def pinned_inductor(threads: int = 4):
    """Inductor with ``cpp.threads`` pinned, caches disabled and a fresh TORCHINDUCTOR_CACHE_DIR."""
    with tempfile.TemporaryDirectory() as tmp, \
            unittest.mock.patch.dict("os.environ", {"TORCHINDUCTOR_CACHE_DIR": tmp}), \
            iconfig.patch({"force_disable_caches": True, "cpp.threads": threads}):
        yield


class GoldenTestCase(expecttest.TestCase):
    """Each test runs under :func:`pinned_inductor` with our lowering registered and dynamo reset
    before and after."""

    def setUp(self):
        assert inductor.register()
        torch._dynamo.reset()
        self.addCleanup(torch._dynamo.reset)
        self.enterContext(pinned_inductor())

    def golden_region(self, code: str, op: str, *, header: str | None = None,
                      store: str | None = None) -> str:
        """Check ``code`` no longer calls ``torch.ops.awq.<op>``, inlines ``header`` verbatim and
        its raw region matches ``store`` (Inductor's store code); return :func:`awq_region`."""
        self.assertNotIn(f"torch.ops.awq.{op}", code)
        if header is not None:
            self.assertIn(header, code)  # inlined, verbatim (not goldened)
        if store is not None:
            self.assertRegex(raw_region(code), store)
        return awq_region(code)
