"""The on-disk cache of measured plans and the per-process plans: :func:`plan_for` returns, in this
order, ``config.kernel_plan`` (forced), the constants of :mod:`awq_inductor.config`
(``config.tune == "off"``, an ISA without AVX512, or AMX running on the tile emulator), a plan
from the on-disk cache, or a plan measured now (``config.tune == "auto"``, one log line) and
written to the cache. The eager op passes the plan's thresholds to the C++ entry point; the
Inductor template renders them into the generated code, and :func:`cache_digest` (the cache
file's content) is part of the FX cache key, so a retune never reuses code generated for the
previous plan. Plans are cached in ``<cache dir>/tuning/<machine key>.json`` (written atomically).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch

from .. import config
from .. import families
from ..schemes import GATE_UP_SILU, LINEAR, W4A16, Op, Scheme, op_for
from . import background, cache_key, hugepages, native, tuner
from .plan import NEVER, DEFAULT_DECODE, THRESHOLDS, DecodeSetting, Plan, default_plan, forced_plan  # noqa: F401

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# The on-disk cache and the per-process plans
def shape_key(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int) -> str:
    return f"{op.name}/{isa}/{str(x_dtype).replace('torch.', '')}/K{K}/N{op.columns(out_features)}/G{G}"


def threads() -> int:
    return config.threads()


def cache_path(n_threads: Optional[int] = None) -> str:
    """``<cache dir>/tuning/<machine key>.json`` (cache dir: ``$AWQ_INDUCTOR_CACHE_DIR`` or
    ``~/.cache/awq_inductor``)."""
    return os.path.join(native.cache_dir(), "tuning", cache_key.machine_key(n_threads or threads(), hugepages.in_use()) + ".json")


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {"plans": {}}
    except (OSError, ValueError) as e:
        log.warning("awq_inductor: ignoring the unreadable tuning cache %s (%s); it will be rewritten", path, e)
        return {"plans": {}}
    if not isinstance(data.get("plans"), dict):
        log.warning("awq_inductor: ignoring the tuning cache %s: no 'plans' object", path)
        return {"plans": {}}
    return data


def _write(path: str, data: dict) -> None:
    """Atomically (temp file + os.replace): concurrent readers see the old or the new file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_lock = threading.Lock()
# (threads, shape key, the decode setting its candidates ran with) -> plan: a plan measured under the
# constants' setting (a shape small enough to stay in cache, before any larger shape had the machine's
# measured) is no answer once the machine's is known. On the AMX Xeon such a 4096 x 4096 plan, timed
# on the bf16 dot products where the machine's setting runs int16 x, sent M = 2 to the fp32 rows: 1.00
# ms against 0.44 on the decode kernel (benchmarks/results/stale_decode_plan_amx_1207.md).
_memo: Dict[Tuple[int, str, Tuple[int, ...]], Plan] = {}
_decode_memo: Dict[Tuple[int, str, str], DecodeSetting] = {}  # (threads, isa, scheme) -> its decode setting
_final: Dict[Tuple[int, str], Plan] = {}  # (threads, shape key) -> plan_for's answer (with the machine's params)


def store(key: str, plan: Plan, times: dict, n_threads: Optional[int] = None,
          decode: DecodeSetting = DEFAULT_DECODE) -> None:
    """Add one shape's plan to the cache file (read, merge, atomic write) and to this process;
    ``decode``: the machine's decode setting its candidates ran with (the entry holds only under it)."""
    path = cache_path(n_threads)
    with _lock:
        data = _read(path)
        data["machine"] = cache_key.machine(n_threads or threads(), hugepages.in_use())
        data["plans"][key] = {**plan.thresholds(), "noisy": plan.source == "noisy", "decode": list(decode),
                              "times_ms": times}
        _write(path, data)
        _memo[(n_threads or threads(), key, tuple(decode))] = dataclasses.replace(plan, source="tuned")
        _final.pop((n_threads or threads(), key), None)


def _is_noisy(path: str, key: str) -> bool:
    return bool(_read(path)["plans"].get(key, {}).get("noisy"))


def _cached(path: str, key: str, decode: DecodeSetting = DEFAULT_DECODE) -> Optional[Plan]:
    """The cached plan of ``key``, or None: none cached, or measured under another decode setting
    than the machine's ``decode`` now (an entry without one: the constants')."""
    entry = _read(path)["plans"].get(key)
    if entry is None or list(entry.get("decode", DEFAULT_DECODE)) != list(decode):
        return None
    try:
        return Plan(**{k: int(entry[k]) for k in THRESHOLDS}, source="cached")
    except (KeyError, TypeError, ValueError):
        log.warning("awq_inductor: ignoring the malformed tuning entry %s in %s", key, path)
        return None


def plan_for(op: Op, isa: str, x_dtype: torch.dtype, K: int, out_features: int, G: int) -> Plan:
    """The plan the kernels of this shape use (see the module docstring); memoised per process."""
    if config.kernel_plan is not None:
        return forced_plan(config.kernel_plan)
    from . import isa as isa_mod

    if config.tune == "off" or isa == "portable" or (isa == "amx" and isa_mod.amx_emulated()):
        return default_plan()
    key = shape_key(op, isa, x_dtype, K, out_features, G)
    final = _final.get((threads(), key))
    if final is not None:  # the eager op asks on every call
        return final
    measure = tuner.streams_weights(Shape(op, K, out_features, G).weight_bytes)  # the decode setting, where absent
    decode = _machine_decode(op.scheme, isa, x_dtype, measure)
    plan = _memo.get((threads(), key, tuple(decode)))
    if plan is None:
        path = cache_path()
        plan = _cached(path, key, decode)
        if plan is None and config.tune == "auto":
            t0 = time.perf_counter()
            plan, times = tuner.tune_shape(op, isa, x_dtype, K, out_features, G, decode=decode)
            store(key, plan, times, decode=decode)
            if plan.source != "noisy":  # (tune_shape has said why it kept the constants)
                log.warning("awq_inductor: tuned the kernel choice for %s in %.1f s (%s); cached in %s",
                            key, time.perf_counter() - t0, plan.thresholds(), path)
        if plan is None:
            return _with_machine_params(default_plan(), op.scheme, isa, x_dtype, measure)
        _memo[(threads(), key, tuple(decode))] = plan
    final = _final[(threads(), key)] = _with_machine_params(plan, op.scheme, isa, x_dtype, measure)
    return final


def _machine_decode(scheme: Scheme, isa: str, x_dtype: torch.dtype, measure: bool = True) -> DecodeSetting:
    """The decode setting the plans of ``scheme`` and ``x_dtype`` carry on this machine (bf16 x: the
    kernels it steers); ``measure``: measured now where none is cached (:func:`decode_setting`)."""
    return decode_setting(isa, scheme, measure=measure) if x_dtype == torch.bfloat16 else DEFAULT_DECODE


def _with_machine_params(plan: Plan, scheme: Scheme, isa: str, x_dtype: torch.dtype, measure: bool = True) -> Plan:
    """``plan`` with the machine's decode setting of ``scheme`` (bf16 x: the kernels it steers)."""
    return plan if x_dtype != torch.bfloat16 else plan.with_decode(_machine_decode(scheme, isa, x_dtype, measure))


def decode_setting(isa: str, scheme: Scheme = W4A16, remeasure: bool = False, measure: bool = True) -> DecodeSetting:
    """The decode kernels' setting of ``scheme`` on this machine (prefetch, int16 x): the cached
    measurement (one per machine key, ISA and scheme), measured now where there is none (an entry
    written before the int16 x, L2 distance, rows' prefetch or K streams choice existed, or timed without the
    one-thread regime of ``tuner.decode_regimes``, counts as none), ``measure`` and
    ``config.tune == "auto"`` (or ``remeasure``), else the constants' (not remembered: a later call
    may measure). ``measure`` is False for weights that stay in cache (``tuner.streams_weights``).
    A machine property, not a shape's: every cached and tuned bf16 plan of the scheme carries it."""
    key = (threads(), str(isa), scheme.name)
    if key in _decode_memo and not remeasure:
        return _decode_memo[key]
    path, name = cache_path(), f"decode_setting/{isa}/{scheme.name}"
    entry = None if remeasure else _read(path).get("machine_params", {}).get(name)
    if isinstance(entry, dict) and not {"next_tile", "int16_x", "l2_bytes", "regimes", "rows_prefetch", "k_streams"} <= set(entry):
        entry = None
    if entry is None and not remeasure and (config.tune != "auto" or not measure):
        return DEFAULT_DECODE
    if entry is None:
        value, times = tuner.tune_decode_setting(isa, scheme)
        _final.clear()
        with _lock:
            data = _read(path)
            data["machine"] = cache_key.machine(threads(), hugepages.in_use())
            data.setdefault("machine_params", {})[name] = {"bytes": value.distance, "next_tile": value.next_tile,
                                                           "int16_x": value.int16_x, "l2_bytes": value.l2_distance,
                                                           "rows_prefetch": value.rows_prefetch,
                                                           "k_streams": value.k_streams,
                                                           "regimes": list(tuner.decode_regimes()), "times_ms": times}
            _write(path, data)
        log.info("awq_inductor: decode setting on this machine: %s (%s)", tuner.setting_name(value), times)
    else:
        try:
            value = DecodeSetting(int(entry["bytes"]), int(entry["next_tile"]), int(entry["int16_x"]),
                                  int(entry["l2_bytes"]), int(entry["rows_prefetch"]), int(entry["k_streams"]))
        except (KeyError, TypeError, ValueError):
            log.warning("awq_inductor: ignoring the malformed %s entry in %s", name, path)
            return DEFAULT_DECODE
    _decode_memo[key] = value
    return value


def cache_digest() -> str:
    """sha256 of this machine's tuning cache file ("" without one): part of the FX cache key."""
    import hashlib

    try:
        with open(cache_path(), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def forget() -> None:
    """Drop the per-process plans (tests: the next lookup reads the cache again)."""
    with _lock:
        _memo.clear()
        _decode_memo.clear()
        _final.clear()
    cache_key.machine_key.cache_clear()


# ---------------------------------------------------------------------------------------------
# Shapes of a model, for ``python -m awq_inductor tune``
@dataclasses.dataclass(frozen=True)
class Shape:
    op: Op
    K: int
    out_features: int
    G: int

    def key(self, isa: str, x_dtype: torch.dtype) -> str:
        return shape_key(self.op, isa, x_dtype, self.K, self.out_features, self.G)

    @property
    def weight_bytes(self) -> int:
        """Bytes of its packed int4 weight (4 bits per weight of every packed column)."""
        return self.K * self.op.columns(self.out_features) // 2


def _measure(s: Shape, isa: str, x_dtype: torch.dtype, decode: Optional[DecodeSetting] = None) -> Plan:
    """Time the candidate paths of ``s`` now, under ``decode`` (default: the machine's decode
    setting, measured where absent), and cache the plan (file and process)."""
    decode = _machine_decode(s.op.scheme, isa, x_dtype) if decode is None else decode
    plan, times = tuner.tune_shape(s.op, isa, x_dtype, s.K, s.out_features, s.G, decode=decode)
    store(s.key(isa, x_dtype), plan, times, decode=decode)
    return plan


def _config_group_size(qc: Optional[dict]) -> int:
    """G of a ``quantization_config`` through its checkpoint format (compressed-tensors keeps it in
    ``config_groups``); 128 when there is none or it is not one we recognise."""
    if not qc:
        return 128
    from .. import formats

    try:
        return formats.from_quantization_config(qc).group_size
    except (ValueError, NotImplementedError):
        return int(qc.get("group_size", 128))


def model_shapes(config_json: dict, act_quant: Optional[str] = None) -> List[Shape]:
    """The distinct int4 op shapes a decoder described by ``config.json`` runs once loaded
    (:func:`awq_inductor.families.int4_gemms`: attention, dense MLP, routed and shared experts);
    G from its ``quantization_config`` (-1: K)."""
    g = _config_group_size(config_json.get("quantization_config"))
    lin, gu = op_for(act_quant, LINEAR), op_for(act_quant, GATE_UP_SILU)
    dims = []
    for kind, K, n in families.int4_gemms(config_json):
        dims += [(lin, K, n)] if kind == "linear" else [(gu, K, n), (lin, n, K)]
    return list(dict.fromkeys(Shape(op, K, n, K if g == -1 else g) for op, K, n in dims))


def parse_shapes(text: str, G: int, act_quant: Optional[str] = None) -> List[Shape]:
    """``"4096x4096,4096x11008"`` -> linear-op shapes (K x N)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            K, N = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes: expected KxN items like 4096x11008, got {item!r}") from None
        out.append(Shape(op_for(act_quant, LINEAR), K, N, G))
    return out


def tune_missing(shapes: List[Shape], x_dtype: torch.dtype, show: Optional[bool] = None,
                 weight_bytes: Optional[int] = None) -> int:
    """Measure now every shape of ``shapes`` that has no plan yet (``config.tune == "auto"`` only;
    one progress bar, no log line per shape): the model pass calls it when a model is converted, so
    the first ``generate`` (and the text it streams) never waits for the tuner. ``weight_bytes``:
    the model's int4 weight bytes (default: one of each shape); the machine's decode setting is
    measured first where it is not cached and they stream from DRAM (``tuner.streams_weights``).
    Returns the number of shapes measured."""
    from ..progress import track
    from . import isa as isa_mod

    isa = isa_mod.select()
    if config.tune != "auto" or config.kernel_plan is not None or not isa.avx512_bf16 or native.emulated(isa):
        return 0  # plan_for uses the constants (or the forced plan) here: nothing to measure
    path, n = cache_path(), threads()
    streamed = tuner.streams_weights(sum(s.weight_bytes for s in dict.fromkeys(shapes))
                                     if weight_bytes is None else weight_bytes)
    decode = {}  # scheme -> its decode setting: once per machine, here at load where not cached (plans hold under it)
    for scheme in dict.fromkeys(s.op.scheme for s in shapes):
        decode[scheme] = _load_decode_setting(scheme, isa, x_dtype, streamed)
    todo = [s for s in dict.fromkeys(shapes) if (n, s.key(isa, x_dtype), tuple(decode[s.op.scheme])) not in _memo
            and _cached(path, s.key(isa, x_dtype), decode[s.op.scheme]) is None]
    # the kernels are built first, beside any background build (a g++ each); then one quiet block
    # for all the timing, so a background build cannot start between two shapes and hold up the next
    for name in dict.fromkeys(s.op.name for s in todo):
        native.get_kernel(name, x_dtype, isa)
    with background.quiet_for_timing():
        for s in track(todo, "awq_inductor: tuning kernels", show=show, unit="shape"):
            _measure(s, isa, x_dtype, decode[s.op.scheme])
    return len(todo)


def _load_decode_setting(scheme: Scheme, isa: str, x_dtype: torch.dtype, streamed: bool) -> DecodeSetting:
    """The decode setting a model's plans are measured under (:func:`tune_missing`): for bf16 x the
    machine's, measured now (kernel built, then a quiet block) where it is absent and the weights
    stream, else cached or the constants'."""
    if x_dtype != torch.bfloat16:
        return DEFAULT_DECODE
    if not streamed:
        return decode_setting(isa, scheme, measure=False)
    native.get_kernel(Op(scheme, LINEAR).name, x_dtype, isa)
    with background.quiet_for_timing():
        return decode_setting(isa, scheme)


def tune_shapes(shapes: List[Shape], x_dtype: torch.dtype, isa: Optional[str] = None, show: Optional[bool] = None,
                retune: bool = False) -> List[Tuple[Shape, Plan]]:
    """Fill the cache for ``shapes`` (a progress bar on a terminal); shapes already cached are
    kept unless ``retune``."""
    from ..progress import track
    from . import isa as isa_mod

    isa = isa or isa_mod.select()
    if x_dtype == torch.bfloat16:
        for scheme in dict.fromkeys(s.op.scheme for s in shapes):
            decode_setting(isa, scheme, remeasure=retune)
    out = []
    for s in track(shapes, "tuning kernels", show=show, unit="shape"):
        key = s.key(isa, x_dtype)
        plan = None if retune or _is_noisy(cache_path(), key) else _cached(
            cache_path(), key, _machine_decode(s.op.scheme, isa, x_dtype))
        out.append((s, plan or _measure(s, isa, x_dtype)))
    return out


