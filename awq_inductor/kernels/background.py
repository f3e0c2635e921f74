"""C++ builds that run in background threads while the main thread loads or traces, kept apart from
the tuner's clock: a g++ on the other core of a 2-core machine halves one OpenMP thread's speed and
skews the plan being measured, which then stays cached. The tuner's timing loops run inside
:func:`quiet_for_timing`; each background build step runs inside :func:`build_step`, which waits
while the tuner measures, and the tuner waits for the steps already running to finish.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)

_cond = threading.Condition()
_measuring = 0
_building = 0
_background = threading.local()


def start(name: str, work: Callable[[], object]) -> threading.Thread:
    """Run ``work`` in a thread named ``name``. A failure is logged at debug level only: each
    build raises again, with its context, where its result is first needed. Not a daemon:
    interpreter shutdown waits for it instead of tearing down a thread inside a g++ run or a
    dlopen (a daemon one ended a 2-rank TP run with "terminate called without an active
    exception" once in a CI rehearsal)."""
    def run():
        _background.active = True
        try:
            work()
        except Exception as e:  # noqa: BLE001
            log.debug("awq_inductor: background %s failed: %s", name, e)

    thread = threading.Thread(target=run, name=name, daemon=False)
    thread.start()
    return thread


@contextlib.contextmanager
def build_step():
    """One compiler run of a background thread: starts once the tuner is not measuring. A no-op
    outside the threads :func:`start` runs (the main thread never builds while it measures)."""
    global _building
    if not getattr(_background, "active", False):
        yield
        return
    with _cond:
        _cond.wait_for(lambda: _measuring == 0)
        _building += 1
    try:
        yield
    finally:
        with _cond:
            _building -= 1
            _cond.notify_all()


@contextlib.contextmanager
def quiet_for_timing():
    """The tuner's timing: no background build step starts meanwhile, and those running finish
    before the clock starts."""
    global _measuring
    with _cond:
        _measuring += 1
        _cond.wait_for(lambda: _building == 0)
    try:
        yield
    finally:
        with _cond:
            _measuring -= 1
            _cond.notify_all()
