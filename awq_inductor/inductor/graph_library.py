"""One shared library per compiled graph: the C++ kernels Inductor generates for a graph compiled
by our backend are built by one g++ run, without Inductor's precompiled header.

Why: Inductor builds each CPU kernel as its own shared object (``AsyncCompile.cpp_pybinding``),
every one including ``cpp_prefix.h`` (ATen's vectorized math, 2.5 s of g++ to parse) through a
precompiled header built once per machine. Measured cold on the 2-core Zen 4 VM, the tiny Llama
demo (one decoder layer kind: a prefill and a decode graph of 7 kernels each): the header took
7.7-11.2 s of one g++ run, on the critical path (no kernel builds before it), then each kernel
0.6-1.1 s, of which 0.55 s is loading the 155 MB header (an empty kernel: 0.52-0.60 s). The same
7 kernels in one file without the header: 2.8 s (2.5 s of it the header's parse).

How: inside :func:`one_library_per_graph` (the backend's ``compile_fx``; a graph found in
Inductor's FX cache is loaded there too), ``cpp_pybinding`` queues each kernel and returns a
:class:`PendingKernel`. The generated module's ``async_compile.wait(globals())`` builds the
queue as one Python extension whose entries ``kernel_0 .. kernel_{n-1}`` are the kernels' own
``extern "C" ... kernel(`` renamed, with the argument parsing of Inductor's binding, through
Inductor's ``CppPythonBindingsCodeCache.load_async`` (its flags, disk cache and file lock; the
key covers the whole source), and puts the functions into the module's globals. The kernels
share file scope: Inductor's keep everything inside their function, ours
(``entry/inductor.cpp.j2``) keep shared helpers behind include guards and redefine
``AWQ_DRIVER_LIBRARY`` before each kernel. A kernel whose entry is not found this way is built by
Inductor as before; a library that fails to build is built again kernel by kernel, with one
warning naming the error. Outside our backend nothing changes.
"""
from __future__ import annotations

import contextlib
import logging
import re
import threading
from typing import Callable, List, Optional, Sequence

from torch._inductor import async_compile as inductor_async, config as iconfig
from torch._inductor.codecache import CodeCacheFuture, CppPythonBindingsCodeCache

log = logging.getLogger(__name__)

#: A kernel's C entry point as Inductor (``extern "C"  void  kernel(``) and our templates
#: (``extern "C" \nvoid kernel(``) write it.
ENTRY = re.compile(r'(extern\s+"C"[^;{}()]*?\bvoid\s+)kernel\(')
#: Kernels per library: a graph has up to this many in one g++ run; more are split into libraries
#: of at most this size built in parallel (Inductor's compile threads). Each library parses the
#: header once (2.5 s); a kernel adds about 0.05-0.15 s (7 kernels: 2.8 s), so 16 keep one run
#: under about 5 s while a whole-model graph of hundreds of kernels still uses every thread.
KERNELS_PER_LIBRARY = 16

_state = threading.local()
_ORIGINAL: dict = {}
_WARNED: set = set()
#: Kernel counts of the libraries this process built or found in the caches (tests, benchmarks).
libraries: List[int] = []


class KernelBatch:
    """The kernels one generated module asked for, built together on the first request."""

    def __init__(self, async_compile):
        self.async_compile = async_compile
        self.kernels: list = []  # (argtypes, source)
        self.functions: Optional[list] = None
        self._lock = threading.Lock()

    def add(self, argtypes: Sequence[str], source: str) -> "PendingKernel":
        self.kernels.append((list(argtypes), source))
        return PendingKernel(self, len(self.kernels) - 1)

    def build(self) -> list:
        with self._lock:
            if self.functions is None:
                if getattr(_state, "batch", None) is self:
                    _state.batch = None  # later kernels start a new batch
                self.functions = _build(self)
        return self.functions


class PendingKernel(CodeCacheFuture):
    """A queued kernel: ``result()`` (Inductor's futures protocol) builds its batch and returns
    the function; calling it does the same first (a module never waited on still works)."""

    def __init__(self, batch: KernelBatch, index: int):
        self.batch = batch
        self.index = index

    def result(self, timeout: Optional[float] = None) -> Callable:
        return self.batch.build()[self.index]

    def __call__(self, *args):
        return self.result()(*args)


@contextlib.contextmanager
def _set(flag: str):
    """This thread's ``flag`` on inside (re-entrant)."""
    outer = getattr(_state, flag, False)
    setattr(_state, flag, True)
    try:
        yield
    finally:
        setattr(_state, flag, outer)


def one_library_per_graph():
    """Build the kernels of the graphs compiled (or loaded from Inductor's cache) inside as one
    library per generated module (a context manager)."""
    install()
    return _set("active")


def kernels_built_apart():
    """Inside (a context manager), graphs compiled by our backend build each kernel apart, as
    Inductor does (``benchmarks/bench_e2e.py --methods compiledperkernel``: the same graphs both
    ways in one process)."""
    return _set("apart")


def install() -> None:
    """Route ``AsyncCompile.cpp_pybinding`` / ``wait`` through this module (idempotent; outside
    :func:`one_library_per_graph` they behave as Inductor's own)."""
    cls = inductor_async.AsyncCompile
    if _ORIGINAL:
        return
    _ORIGINAL.update(cpp_pybinding=cls.cpp_pybinding, wait=cls.wait)
    cls.cpp_pybinding = _cpp_pybinding
    cls.wait = _wait


def _cpp_pybinding(self, argtypes, source_code):
    if (not getattr(_state, "active", False) or getattr(_state, "apart", False)
            or len(ENTRY.findall(source_code)) != 1):
        return _ORIGINAL["cpp_pybinding"](self, argtypes, source_code)
    inductor_async.kernel_code_log.info("CPP+Bindings Kernel:\n%s", source_code)
    batch = getattr(_state, "batch", None)
    if batch is None:
        batch = _state.batch = KernelBatch(self)
    return batch.add(argtypes, source_code)


def _wait(self, scope: dict) -> None:
    batch = getattr(_state, "batch", None)
    if batch is not None:
        batch.build()
    for key, value in list(scope.items()):
        if isinstance(value, PendingKernel):
            scope[key] = value.result()
    return _ORIGINAL["wait"](self, scope)


def _build(batch: KernelBatch) -> list:
    """The batch's functions: its libraries (one per :data:`KERNELS_PER_LIBRARY` kernels, built in
    parallel where Inductor has compile threads), else each kernel built by Inductor."""
    n = len(batch.kernels)
    chunks = [range(s, min(n, s + KERNELS_PER_LIBRARY)) for s in range(0, n, KERNELS_PER_LIBRARY)]
    parallel = len(chunks) > 1 and inductor_async.get_compile_threads() > 1
    try:
        with iconfig.patch(cpp_cache_precompile_headers=False):
            loads = [CppPythonBindingsCodeCache.load_async(
                library_source([batch.kernels[i] for i in c]), "cpu",
                submit_fn=inductor_async.AsyncCompile.submit if parallel else None) for c in chunks]
        modules = [load() for load in loads]
    except Exception as e:  # noqa: BLE001  (Inductor's own build of each kernel still raises)
        _warn_once("awq_inductor: building a graph's %d kernels as one library failed (%s: %s); "
                   "building each kernel apart, as Inductor does", n, type(e).__name__,
                   str(e).strip().splitlines()[-1][:300] if str(e).strip() else "")
        return [_resolve(_ORIGINAL["cpp_pybinding"](batch.async_compile, a, s)) for a, s in batch.kernels]
    libraries.extend(len(c) for c in chunks)
    return [getattr(modules[ci], f"kernel_{j}") for ci, c in enumerate(chunks) for j in range(len(c))]


def _resolve(kernel):
    return kernel.result() if isinstance(kernel, CodeCacheFuture) else kernel


def _warn_once(msg: str, *args) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        log.warning(msg, *args)


def library_source(kernels: Sequence[tuple]) -> str:
    """One extension module's source: each ``(argtypes, source)`` with its entry renamed
    ``kernel_<i>``, then the Python bindings of all of them, cut from Inductor's own binding
    (``CppPythonBindingsCodeCache.suffix_template``: argument parsing, one wrapper per kernel,
    the module and its init) rather than written again here; a template that no longer cuts so
    raises, and the graph is built kernel by kernel."""
    cache = CppPythonBindingsCodeCache
    bodies, wrappers, methods, prelude = [], [], [], ""
    for i, (argtypes, source) in enumerate(kernels):
        entry = f"kernel_{i}"
        bodies.append(ENTRY.sub(lambda m: f"{m.group(1)}{entry}(", source, count=1))
        prelude, wrapper, _ = _binding(entry, argtypes)
        wrappers.append(wrapper)
        methods.append(f'    {{"{entry}", {entry}_py, METH_VARARGS, ""}},')
    _, _, init = _binding(cache.entry_function, [])  # the module Inductor's loader imports
    return "\n".join(bodies + [prelude] + wrappers + [
        "static PyMethodDef py_methods[] = {", *methods, "    {NULL, NULL, 0, NULL}};", init])


def _binding(entry: str, argtypes: Sequence[str]) -> tuple:
    """Inductor's binding of one ``entry`` cut in three: (argument parsing, the entry's wrapper,
    the module definition and init after its method table)."""
    cache = CppPythonBindingsCodeCache
    parsed = ", ".join(f"parse_arg<{t.replace('const ', '')}>(args, {n})" for n, t in enumerate(argtypes))
    call = cache.call_entry_function.replace(f"{cache.entry_function}(", f"{entry}(", 1).format(parsed)
    text = cache.suffix_template.format(arg_len=len(argtypes), call_entry_func=call, entry_func=entry,
                                        extra_parse_arg="")
    prelude, wrapper = _cut(text, f"static PyObject* {entry}_py(")
    wrapper, table = _cut(wrapper, "static PyMethodDef py_methods[]")
    _, init = _cut(table, "static struct PyModuleDef py_module")
    return prelude, wrapper, init


def _cut(text: str, marker: str) -> tuple:
    """(text before ``marker``, ``marker`` and the rest); ValueError naming it if missing."""
    at = text.find(marker)
    if at < 0:
        raise ValueError(f"Inductor's Python binding template has no {marker!r}")
    return text[:at], text[at:]
