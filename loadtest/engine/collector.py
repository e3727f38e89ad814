"""Python's cycle collector kept off a load generator's timeline.

A load generator in Python sends from threads that share one interpreter. When the cycle
collector runs a full collection, it walks every object the process tracks with the GIL
held, and every sender waits: the requests due meanwhile go out late, the open loop counts
the wait in their latency (it is measured from the schedule) and flags the step for late
sends, and LoadGen's tail takes it in as the server's. Measured against the local server,
such pauses, not the server, made most of the open loop's p99 at rates the server kept up
with.

:func:`hold_collector` (and its context manager :func:`collector_held`) moves every object
the process tracks when a load starts out of the collector's reach (:func:`gc.freeze`),
after one full collection, outside any measurement, has freed what was garbage. What the
load itself allocates is still collected, and young collections stay short; full ones walk
only what was made since. :func:`release_collector` gives the objects back to the collector
when the last load ends. Loads may nest (a LoadGen run's senders inside a sweep): the
objects are frozen once and thawed once.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0


def holding() -> int:
    """How many loads hold the collector off now."""
    with _lock:
        return _holders


def hold_collector() -> None:
    """One load starts: the first one collects once, then freezes what the process tracks."""
    global _holders
    with _lock:
        if _holders == 0:
            gc.collect()
            gc.freeze()
        _holders += 1


def release_collector() -> None:
    """One load ended: the last one gives the frozen objects back to the collector."""
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            gc.unfreeze()


@contextmanager
def collector_held() -> Iterator[None]:
    """:func:`hold_collector` on entry, :func:`release_collector` on exit."""
    hold_collector()
    try:
        yield
    finally:
        release_collector()
