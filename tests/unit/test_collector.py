"""The cycle collector held off a load's senders: frozen once, thawed once, nested loads too.

Counts of frozen objects are not compared exactly: a frozen object that loses its last
reference (in another test's leftover thread, say) is freed and leaves the count.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from loadtest.engine.collector import collector_held, hold_collector, holding, release_collector
from loadtest.engine.driver import Answer, Driver, Request
from loadtest.engine.open_loop import OpenLoop


@contextlib.contextmanager
def _connect(index: int) -> Iterator[Request]:
    def request(sequence: int) -> Answer:
        return Answer()

    yield request


def _collected(thing: object) -> bool:
    """Whether the collector walks ``thing`` (frozen objects are in none of its generations)."""
    return any(candidate is thing for candidate in gc.get_objects())


def test_objects_of_a_running_load_are_out_of_the_collectors_reach_until_the_last_load_ends() -> None:
    before = holding()
    kept: list[list[int]] = [[1]]  # a tracked object that exists before the load
    with collector_held():
        assert holding() == before + 1 and gc.get_freeze_count() > 0
        assert not _collected(kept)
        made_inside: list[list[int]] = [[2]]
        assert _collected(made_inside)  # what the load makes is still collected
        hold_collector()  # a load inside the first: it freezes nothing more
        try:
            assert holding() == before + 2 and _collected(made_inside)
        finally:
            release_collector()
        assert holding() == before + 1 and not _collected(kept)  # the outer load still runs
    assert holding() == before
    if before == 0:
        assert gc.get_freeze_count() == 0 and _collected(kept)
        release_collector()  # one release too many does nothing
        assert holding() == 0


def test_the_open_loop_and_the_closed_loop_hold_the_collector_while_they_run() -> None:
    before = holding()
    with OpenLoop(_connect, rate=200.0, connections=2) as loop:
        assert holding() == before + 1 and gc.get_freeze_count() > 0
        window = loop.measure(0.1, drain_s=5.0)
    assert window.tally.answered > 0 and holding() == before
    with Driver(_connect, 2) as driver:
        assert holding() == before + 1 and gc.get_freeze_count() > 0
        driver.measure(0.05)
    assert holding() == before
