"""Shared by decode_setting_regimes.py and head_prefetch_ab.py: variants of one kernel timed call by call in rotating
order (no variant is always the one after the probe), each rep ending with the streaming-read probe, so that every
variant's median and the probe's see the same machine; printed as ms per call and share of the probe's GB/s.
And by rows_prefetch_ab.py and template_ab.py: ``rotated_medians``, the same rotation of calls with no arguments
(the dot-product peak one of them)."""
import statistics
import time
from typing import Callable, Dict


def rotating_rounds(calls: Dict[str, Callable[[int], float]], probe: Callable[[], None], probe_bytes: int,
                    weight_bytes: int, rounds: int, reps: int, digits: int = 3) -> None:
    """``calls[name](i)``: one call of that variant on cold weights picked by ``i`` (the count of timed calls so far),
    returning its own seconds (so it may run an untimed warm-up first); ``probe()`` streams ``probe_bytes``."""
    i = 0
    for rnd in range(rounds):
        ts = {k: [] for k in list(calls) + ["probe"]}
        for rep in range(reps):
            items = list(calls.items())
            for name, call in items[rep % len(items):] + items[:rep % len(items)]:
                ts[name].append(call(i))
                i += 1
            t0 = time.perf_counter()
            probe()
            ts["probe"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in ts.items()}
        gbs = probe_bytes / med["probe"] / 1e9
        print(rnd, f"probe {gbs:.1f} GB/s", {k: f"{v * 1e3:.{digits}f} ms {weight_bytes / v / 1e9 / gbs:.0%}"
                                            for k, v in med.items() if k != "probe"}, flush=True)


def rotated_medians(fns: Dict[str, Callable[[], object]], reps: int) -> Dict[str, float]:
    """Median seconds per call of each of ``fns``, called one after the other ``reps`` times, the order rotated by one
    every rep."""
    names, ts = list(fns), {k: [] for k in fns}
    for rep in range(reps):
        for k in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}
