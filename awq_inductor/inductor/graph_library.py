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

The header's parse, 2.5-3.1 s of every library's 3.9-4.3 s g++ run, can be paid once per machine
instead: :func:`build_prefix_header` precompiles it with the libraries' own flags (one g++ run of
about 7 s, 155 MB), and every library is built with ``-include`` of that header. Measured on the
tiny Llama's decode-graph library (2-core Zen 4 VM): 3.9 s without, 1.5 s with it. The
``-include`` is on every library's command line whether or not the ``.gch`` exists, so a library's
cache key does not depend on it; g++ takes the ``.gch`` only where it is there and valid for the
flags, and otherwise parses the header as before (never different code). It is built ahead of
time (``python -m awq_inductor tune``, the test session's start), not inside a first compile: on a
2-core machine a cold compile leaves no core idle, and a niced build beside the tiny Llama demo's
first ``generate`` still slowed its library builds (a 3.9 s one took 6.3 s; first 32 tokens
after / before 1.17, 1.02, 0.93 in three interleaved cold pairs, 12-03). Nor beside the first
graph's library where graphs build behind their first calls (:func:`libraries_behind`):
the main thread no longer waits there, and the cold demo's whole job took 15.6-18.4 s without it,
17.3-19.5 s with it (four interleaved runs each, first tokens alike; AMX Xeon, 12-06).

Inside :func:`libraries_behind` (the backend ``compile_for_generate`` uses) a graph's library is
built in a background thread and the graph runs eager until it is there (:class:`EagerUntilBuilt`).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import shlex
import subprocess
import threading
import weakref
from typing import Callable, List, Optional, Sequence

import torch
from torch._inductor import async_compile as inductor_async, config as iconfig
from torch._inductor import cpp_builder
from torch._inductor.codecache import CodeCacheFuture, CppPythonBindingsCodeCache
from torch._inductor.cpu_vec_isa import pick_vec_isa

from ..kernels import background, native

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
    behind = getattr(_state, "behind", None)
    if batch is not None and behind is not None:
        _state.batch = None  # the build runs in another thread; later kernels start a new batch
        behind.append(BehindBuild(batch, scope))
        rest = {key: value for key, value in scope.items() if not isinstance(value, PendingKernel)}
        _ORIGINAL["wait"](self, rest)
        scope.update(rest)
        return None
    if batch is not None:
        batch.build()
    for key, value in list(scope.items()):
        if isinstance(value, PendingKernel):
            scope[key] = value.result()
    return _ORIGINAL["wait"](self, scope)


@contextlib.contextmanager
def libraries_behind():
    """Inside, each generated module's library is built in a background thread instead of before
    the module returns; yields the list of their :class:`BehindBuild`. Why: the main thread waited
    on each graph's g++ run with nothing to do (the tiny Llama demo's first ``generate``, cold, AMX
    Xeon, 12-06: 3.8 s for the prefill graph's library, then 1.6-2.7 s for the decode graph's, of a
    14.3 s first 32 tokens); the graph runs eager meanwhile (:class:`EagerUntilBuilt`), as in
    Inductor's own ``fx_compile_async`` mode (a compile in a subprocess, eager until it is ready)."""
    outer = getattr(_state, "behind", None)
    _state.behind = []
    try:
        yield _state.behind
    finally:
        _state.behind = outer


class BehindBuild:
    """One generated module's library, built in a background thread: its kernels then replace
    the module's pending ones (the module's ``call`` reads them from its globals)."""

    def __init__(self, batch: KernelBatch, scope: dict):
        self.batch, self.scope = batch, scope
        self._done = threading.Event()
        self.thread = background.start("awq-graph-library", self._run)

    def _run(self) -> None:
        # a failure leaves the module's kernels pending: its first compiled call builds again and
        # raises there, with its context (background.start logs it at debug level only)
        try:
            with background.build_step():
                self.batch.build()
            for key, value in list(self.scope.items()):
                if isinstance(value, PendingKernel) and value.batch is self.batch:
                    self.scope[key] = value.result()
        finally:
            self._done.set()

    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)


#: Calls run eager by :class:`EagerUntilBuilt` while their library built (tests, the demo's line).
eager_calls = [0]
_pending: "weakref.WeakSet[EagerUntilBuilt]" = weakref.WeakSet()  # graphs with builds not seen finished


class EagerUntilBuilt:
    """What the backend returns for a graph whose library builds behind (:func:`libraries_behind`):
    ``eager`` (the graph's own FX module) until every build has finished, then ``compiled`` for
    good; a failed build raises at the first compiled call, as a build inside the compile would
    have. Said where it is chosen (``compile_for_generate``), not here: no log line inside a
    ``generate``'s streamed text."""

    def __init__(self, compiled: Callable, eager: Callable, builds: List[BehindBuild]):
        self._compiled, self._eager, self._builds = compiled, eager, builds
        _pending.add(self)

    def __getattr__(self, name: str):
        return getattr(self._compiled, name)

    def __call__(self, *args):
        if self._builds is not None:
            if not all(b.finished() for b in self._builds):
                eager_calls[0] += 1
                return self._eager(*args)  # Dynamo calls a backend's function unboxed
            self._builds = None
            _pending.discard(self)
        return self._compiled(*args)

    def wait(self, timeout: Optional[float] = None) -> bool:
        return all(b.wait(timeout) for b in self._builds or ())


def wait_for_libraries(timeout: Optional[float] = None) -> bool:
    """Wait until every library building behind its graph's first calls is built (timings that
    must measure the compiled code call this first). True when none is left building."""
    return all(g.wait(timeout) for g in list(_pending))


def eager_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A module running ``gm``'s graph as it is now (Inductor's passes rewrite ``gm.graph`` in place
    during the compile)."""
    import copy

    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _build(batch: KernelBatch) -> list:
    """The batch's functions: its libraries (one per :data:`KERNELS_PER_LIBRARY` kernels, built in
    parallel where Inductor has compile threads), else each kernel built by Inductor."""
    n = len(batch.kernels)
    chunks = [range(s, min(n, s + KERNELS_PER_LIBRARY)) for s in range(0, n, KERNELS_PER_LIBRARY)]
    parallel = len(chunks) > 1 and inductor_async.get_compile_threads() > 1
    try:
        flags = prefix_header_flags()
        with iconfig.patch(cpp_cache_precompile_headers=False):
            loads = [CppPythonBindingsCodeCache.load_async(
                library_source([batch.kernels[i] for i in c]), "cpu", extra_flags=flags,
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


# ---------------------------------------------------------------------------------------------
# The precompiled prefix header (see the module docstring)
#: The header every Inductor CPU kernel includes first (ATen's vectorized math).
PREFIX_HEADER = "torch/csrc/inductor/cpp_prefix.h"
_prefix_thread: Optional[threading.Thread] = None
_prefix_lock = threading.Lock()
def _library_options(precompiling: bool, extra_flags: Sequence[str] = ()):
    """The build options ``CppPythonBindingsCodeCache.load_async`` gives a library in :func:`_build`
    (CPU, this machine's vector ISA, Inductor's own header precompiling off: it defines a macro),
    or those of its precompiled header."""
    with iconfig.patch(cpp_cache_precompile_headers=False):
        return cpp_builder.CppTorchDeviceOptions(
            **CppPythonBindingsCodeCache.cpp_compile_command_flags, device_type="cpu",
            extra_flags=tuple(extra_flags), use_relative_path=iconfig.is_fbcode(), vec_isa=pick_vec_isa(),
            precompiling=precompiling)


def prefix_header() -> str:
    """``<cache dir>/pch/<key>/awq_prefix.h`` (written here if missing): one line including
    :data:`PREFIX_HEADER`. The key covers what makes a ``.gch`` stale: the precompiling command
    line (flags, ISA), the compiler's version, this torch and its header file."""
    return _prefix_header(native.cache_dir())[0]


@functools.lru_cache(maxsize=None)
def _prefix_header(cache_dir: str) -> tuple:
    """(header path, the build options its key was made from)."""
    options = _library_options(precompiling=True)
    command = cpp_builder.CppBuilder(name="awq_prefix", sources="awq_prefix.h", BuildOption=options).get_command_line()
    source = os.path.join(os.path.dirname(torch.__file__), "include", PREFIX_HEADER)
    st = os.stat(source)
    text = "\n".join([command, cpp_builder.get_compiler_version_info(options.get_compiler()), torch.__version__,
                      str(torch.version.git_version), source, f"{st.st_size}/{st.st_mtime_ns}"])
    d = os.path.join(cache_dir, "pch", hashlib.sha256(text.encode()).hexdigest()[:20])
    header = os.path.join(d, "awq_prefix.h")
    if not os.path.exists(header):
        os.makedirs(d, exist_ok=True)
        tmp = f"{header}.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w") as f:
            f.write(f"#include <{PREFIX_HEADER}>\n")
        os.replace(tmp, header)
    return header, options


def prefix_header_builder(header: str, name: str):
    """The ``CppBuilder`` that precompiles ``header`` into ``name``: with the options its key was made
    from (a vector ISA or flag changed since, e.g. by a test's patch, would otherwise put a ``.gch`` of
    other flags under that key)."""
    made, options = _prefix_header(native.cache_dir())
    if made != header:
        options = _library_options(precompiling=True)
    return cpp_builder.CppBuilder(name=name, sources=header, BuildOption=options)


def build_prefix_header() -> str:
    """Build ``prefix_header() + ".gch"`` unless it exists (a process building it holds a file
    lock the others wait on); returns its path. Written to a temporary name and renamed, so a
    concurrent g++ sees the whole file or none. At the lowest CPU priority (``nice 19``: a test
    session's background build leaves the cores to the tests). Raises RuntimeError with g++'s
    output."""
    from torch.utils._filelock import FileLock

    header = prefix_header()
    gch = header + ".gch"
    if os.path.exists(gch):
        return gch
    with FileLock(header + ".lock", timeout=600):
        if not os.path.exists(gch):
            name = f"{header[:-2]}.{os.getpid()}.tmp"
            builder = prefix_header_builder(header, name)
            out = subprocess.run(shlex.split(builder.get_command_line()), cwd=os.path.dirname(header),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 preexec_fn=lambda: os.nice(19))
            if out.returncode != 0:
                raise RuntimeError(f"g++ failed to precompile {header}: {out.stdout.strip()[-2000:]}")
            os.replace(builder.get_target_file_path(), gch)
    return gch


def start_prefix_header(prepare: Callable[[], None] = lambda: None) -> None:
    """Build the precompiled header in a background thread (once per process; nothing where it
    exists), after ``prepare`` (the vector-ISA checks its flags depend on: ``lowering`` passes its
    warm-up). A failure is said once and the libraries parse the header as before."""
    global _prefix_thread
    with _prefix_lock:
        if _prefix_thread is not None:
            return
        _prefix_thread = background.start("awq-prefix-header",
                                          functools.partial(_build_prefix_header_quietly, prepare))


def _build_prefix_header_quietly(prepare: Callable[[], None] = lambda: None) -> None:
    try:
        prepare()
        if not os.path.exists(prefix_header() + ".gch"):
            with background.build_step():
                build_prefix_header()
    except Exception as e:  # noqa: BLE001  (an optimisation: the libraries build without it)
        _warn_once("awq_inductor: no precompiled header for the graph libraries (%s: %s); each library "
                   "parses it (about 2.5 s more per graph)", type(e).__name__, str(e).strip()[-300:])


def prefix_header_flags() -> tuple:
    """``extra_flags`` of a library build: ``-include`` of :func:`prefix_header`; () where the header
    cannot be written (the library then builds as before). A ``.gch`` still being built is not
    waited for: that library parses the header."""
    try:
        return (f"-include {shlex.quote(prefix_header())}",)
    except Exception as e:  # noqa: BLE001  (an optimisation: never a reason to lose the one-library build)
        _warn_once("awq_inductor: no precompiled header for the graph libraries (%s: %s); each library "
                   "parses it", type(e).__name__, e)
        return ()
