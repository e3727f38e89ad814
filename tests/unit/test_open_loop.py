"""The open-loop driver against a stand-in server in process: one lock that every request holds
while it is served (as one model instance serves one request at a time), so that a request
that stalls holds up every request behind it, as on a real server.

Latency counts from each request's scheduled time: a 200 ms stall shows in the open loop's p99,
where a closed loop over the same server sees one slow request among many; a server slower than
the rate fills every connection and the window is flagged, saying so; the accounting adds up.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from bundle.errors import BundleError, ConfigError
from loadtest.engine.driver import Answer, Driver, Request
from loadtest.engine.open_loop import LATE_MS, TIMER_SLACK_NS, OpenLoop, schedule, timer_slack_ns, wake_ups


class Server:
    """Serves one request at a time for ``service_s``; request number ``stall_at`` takes
    ``stall_s`` instead, and every request numbered in ``fail`` fails."""

    def __init__(
        self, service_s: float, stall_at: int = -1, stall_s: float = 0.0, fail: tuple[int, ...] = ()
    ):
        self.service_s, self.stall_at, self.stall_s, self.fail = service_s, stall_at, stall_s, fail
        self.lock = threading.Lock()
        self.served = 0

    def serve(self) -> Answer:
        with self.lock:
            number = self.served
            self.served += 1
            time.sleep(self.stall_s if number == self.stall_at else self.service_s)
        if number in self.fail:
            raise BundleError(f"request {number} failed")
        return Answer(rows=2)

    def connect(self) -> Callable[[int], Iterator[Request]]:
        @contextmanager
        def connection(worker: int) -> Iterator[Request]:
            yield lambda sequence: self.serve()

        return connection


def test_a_schedule_has_the_rate_asked() -> None:
    rng = np.random.default_rng(0)
    assert np.all(schedule(250.0, "constant", rng, 100) == 1 / 250.0)
    gaps = schedule(250.0, "poisson", rng, 200_000)
    assert gaps.mean() == pytest.approx(1 / 250.0, rel=0.01)
    assert gaps.std() == pytest.approx(1 / 250.0, rel=0.02)  # exponential: std equals mean
    for rate, arrival in ((0.0, "poisson"), (-5.0, "constant"), (math.inf, "poisson"), (10.0, "uniform")):
        with pytest.raises(ConfigError):
            schedule(rate, arrival, rng)
    with pytest.raises(ConfigError, match="at least one connection"):
        OpenLoop(Server(0.001).connect(), 10.0, connections=0)


def test_every_scheduled_request_is_followed_to_its_answer() -> None:
    server = Server(0.001, fail=(5, 6))
    with OpenLoop(server.connect(), 200.0, "constant", connections=8, seed=1) as load:
        window = load.measure(1.0)
    summary = window.summary()
    assert window.scheduled == pytest.approx(200, abs=3) and window.unfinished == 0
    assert window.tally.requests == window.scheduled
    assert window.sent <= window.scheduled and window.sent >= window.scheduled - 2
    assert window.tally.rows == 2 * window.tally.ok
    assert window.lag.count == window.scheduled
    # From the schedule, never shorter than from the send.
    assert window.tally.histogram.percentile(50) >= window.service.percentile(50)
    assert summary["request_rate"] == 200.0 and summary["connections"] == 8
    assert 0 <= summary["in_flight_mean"] <= summary["in_flight_max"] <= 8
    assert summary["late"] == window.late and window.late <= window.scheduled


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl's timer slack is Linux's")
def test_each_sender_sleeps_with_a_fine_timer_slack() -> None:
    """A sender asks the kernel for a slack of TIMER_SLACK_NS, in its own thread: the thread that
    started the load keeps its own (Linux's default, 50 us)."""
    seen: list[int] = []

    @contextmanager
    def connection(worker: int) -> Iterator[Request]:
        seen.append(timer_slack_ns())
        yield lambda sequence: Answer(rows=1)

    before = timer_slack_ns()
    with OpenLoop(connection, 100.0, connections=3) as load:
        load.measure(0.2)
    assert seen == [TIMER_SLACK_NS] * 3
    assert timer_slack_ns() == before != TIMER_SLACK_NS


def test_a_stall_shows_in_the_open_loop_and_hides_in_the_closed_loop() -> None:
    """Rate 100/s, 1 ms per request, one 200 ms stall: about 20 requests arrive during it and
    each waits for it to end, so the open loop's p99 holds the stall. A closed loop of one user
    over the same server waits too, but sends nothing meanwhile: one slow request of many."""
    open_server = Server(0.001, stall_at=100, stall_s=0.2)
    with OpenLoop(open_server.connect(), 100.0, "constant", connections=32, seed=2) as load:
        window = load.measure(3.0)
    assert open_server.served > 100  # the stall came inside the window
    opened = window.tally.histogram.percentile(99)
    assert opened >= 100.0, window.summary()
    assert window.service.percentile(99) <= opened  # never more from the send than from the schedule

    closed_server = Server(0.001, stall_at=100, stall_s=0.2)
    with Driver(closed_server.connect(), workers=1) as driver:
        closed = driver.measure(3.0)
    assert closed_server.served > 100 and closed.histogram.max_ms >= 190.0
    assert closed.histogram.percentile(99) < 50.0, closed.summary()


def test_a_server_slower_than_the_rate_is_flagged() -> None:
    """20 ms a request, one at a time (50/s at most), asked for 200/s over 4 connections: every
    connection busy, requests wait, the window says so. Two seconds, not one: on a loaded CI
    machine the senders once got no core for the whole of a 1 s window, and sent nothing in it."""
    server = Server(0.02)
    with OpenLoop(server.connect(), 200.0, "poisson", connections=4, seed=3) as load:
        window = load.measure(2.0, drain_s=0.5)
    flag = window.flag()
    assert "all 4 connections were busy" in flag, flag
    assert window.in_flight_max == 4 and window.waited > 0 and window.late >= window.waited
    assert window.unfinished > 0
    assert window.lag.percentile(99) > LATE_MS


def test_a_window_without_length_and_a_failed_sender_are_refused() -> None:
    with OpenLoop(Server(0.001).connect(), 50.0) as load, pytest.raises(ConfigError):
        load.measure(0.0)

    @contextmanager
    def broken(worker: int) -> Iterator[Request]:
        raise OSError("no route")
        yield  # pragma: no cover

    load = OpenLoop(broken, 50.0, connections=2).start()
    with pytest.raises(RuntimeError, match="no route"):
        load.stop()


def test_the_machines_wake_up_lateness_is_timed_where_the_generator_runs() -> None:
    before, slack = os.sched_getaffinity(0), timer_slack_ns()
    core = min(before)
    woke = wake_ups(frozenset({core}), sleeps=20, sleep_s=0.002)
    assert os.sched_getaffinity(0) == before  # the thread's cores are given back
    assert timer_slack_ns() == slack  # and its timer slack
    assert woke.sleeps == 20 and woke.sleep_ms == 2.0
    assert 0.0 <= woke.p50_ms <= woke.p99_ms <= woke.max_ms
    assert "a 2 ms sleep on the load generator's cores woke p50 " in woke.line()
    for bad in ((0, 0.001), (5, 0.0)):
        with pytest.raises(ConfigError):
            wake_ups(None, *bad)
