"""The cycle collector held off a load's senders: frozen once, thawed once, nested loads too."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from loadtest.engine.collector import collector_held, hold_collector, release_collector
from loadtest.engine.driver import Answer, Driver, Request
from loadtest.engine.open_loop import OpenLoop


@contextlib.contextmanager
def _connect(index: int) -> Iterator[Request]:
    def request(sequence: int) -> Answer:
        return Answer()

    yield request


def test_objects_of_a_running_load_are_out_of_the_collectors_reach_until_the_last_load_ends() -> None:
    assert gc.get_freeze_count() == 0
    kept: list[list[int]] = [[] for _ in range(100)]  # tracked objects that exist before the load
    with collector_held():
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        hold_collector()  # a load inside the first: nothing frozen again
        made_inside: list[list[int]] = [[] for _ in range(100)]
        assert gc.get_freeze_count() == frozen
        release_collector()
        assert gc.get_freeze_count() == frozen  # the outer load still runs
        assert gc.collect() >= 0 and made_inside  # what the load makes is still collected
    assert gc.get_freeze_count() == 0
    release_collector()  # one release too many does nothing
    assert gc.get_freeze_count() == 0


def test_the_open_loop_and_the_closed_loop_hold_the_collector_while_they_run() -> None:
    with OpenLoop(_connect, rate=200.0, connections=2) as loop:
        assert gc.get_freeze_count() > 0
        window = loop.measure(0.1, drain_s=5.0)
    assert window.tally.answered > 0 and gc.get_freeze_count() == 0
    with Driver(_connect, 2) as driver:
        assert gc.get_freeze_count() > 0
        driver.measure(0.05)
    assert gc.get_freeze_count() == 0
