"""The closed-loop load driver and its tally, against trivial requests (no server)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bundle.errors import ClientError, ConfigError
from loadtest.engine.driver import Answer, Driver, Request
from loadtest.engine.latency import Tally, merged_tallies


class Recorder:
    """Requests that sleep ``delay_s`` and note who sent what; every ``fail_every``-th raises a
    ClientError, every ``wrong_every``-th answers wrong (label None)."""

    def __init__(
        self, delay_s: float = 0.0, fail_every: int = 0, wrong_every: int = 0, rows: int = 4
    ) -> None:
        self.delay_s, self.fail_every, self.wrong_every, self.rows = delay_s, fail_every, wrong_every, rows
        self.sent: list[tuple[int, int]] = []
        self.opened: list[int] = []
        self.closed: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    @contextmanager
    def connect(self, worker: int) -> Iterator[Request]:
        self.opened.append(worker)

        def request(sequence: int) -> Answer:
            with self._lock:
                self.sent.append((worker, sequence))
                count = len(self.sent)
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            time.sleep(self.delay_s)
            with self._lock:
                self.in_flight -= 1
            if self.fail_every and count % self.fail_every == 0:
                raise ClientError(f"request {count} refused\nsecond line")
            if self.wrong_every and count % self.wrong_every == 0:
                return Answer(self.rows, None)
            return Answer(self.rows, "v1")

        try:
            yield request
        finally:
            self.closed.append(worker)


def test_a_bounded_run_sends_exactly_that_many_requests_and_times_each() -> None:
    fake = Recorder(delay_s=0.001)
    tally = Driver(fake.connect, workers=3, max_requests=60).start().join(timeout_s=30)

    assert tally.requests == tally.answered == tally.ok == len(fake.sent) == 60
    assert tally.errors == tally.wrong == 0
    assert tally.rows == 60 * fake.rows and tally.labels == {"v1": 60}
    # One latency per answered request, each at least the request's own sleep.
    assert tally.histogram.count == 60 and tally.histogram.min_ms >= 1.0
    # Every worker opened its own connection, closed it, and numbered its requests from 0.
    assert sorted(fake.opened) == sorted(fake.closed) == [0, 1, 2]
    for worker in range(3):
        sequences = [s for w, s in fake.sent if w == worker]
        assert sequences == list(range(len(sequences)))
    assert 1 < fake.most_in_flight <= 3
    assert tally.seconds > 0 and tally.samples_per_s == pytest.approx(tally.rows / tally.seconds)


def test_errors_and_wrong_answers_are_counted_apart_from_accepted_answers() -> None:
    fake = Recorder(fail_every=5, wrong_every=3)
    driver = Driver(fake.connect, workers=1, max_requests=30)
    tally = driver.start().join(timeout_s=30)

    # Of requests 1..30: 6 failed (every 5th), 8 answered wrong (every 3rd, but not 15 or 30).
    assert tally.requests == 30 and tally.errors == 6 and tally.wrong == 8
    assert tally.answered == 24 and tally.ok == 16 and tally.rows == 16 * fake.rows
    assert tally.histogram.count == tally.answered
    # An error is counted by its first line.
    assert set(tally.error_kinds) == {f"request {n} refused" for n in range(5, 31, 5)}
    assert tally.first_error_s is not None and tally.last_error_s is not None
    assert 0 < tally.first_error_s <= tally.last_error_s
    # Timelines hold the accepted answers only, in time order.
    (timeline,) = driver.timelines.values()
    assert len(timeline) == 16 and [t for t, _ in timeline] == sorted(t for t, _ in timeline)
    assert tally.summary()["answers_by_label"] == {"v1": 16}


def test_a_window_counts_only_the_requests_that_complete_inside_it() -> None:
    fake = Recorder(delay_s=0.01)
    with Driver(fake.connect, workers=2) as driver:
        driver.wait(0.1)
        read = time.perf_counter()
        before = driver.total.requests
        window = driver.measure(0.3)
        after = driver.total.requests
        outside_s = time.perf_counter() - read - window.seconds
    total = driver.total

    # The window lasts what was asked, later only by a late wake-up (0.36 s on a loaded CI machine).
    assert before > 0 and 0.29 <= window.seconds <= 0.3 + 0.25
    # The window saw what the total gained while it was open, and nothing the total did not. The
    # totals are read outside it (before it opens; after it closes and the CPU is read, later on a
    # loaded machine): in that time each of the 2 workers finishes at most one request per 10 ms,
    # and one more on either side.
    gained = after - before
    assert window.requests <= gained
    assert gained - window.requests <= 2 * (outside_s / fake.delay_s + 2), (
        gained,
        window.requests,
        outside_s,
    )
    # Two workers, 10 ms each: about 200 requests/s, far from it only on a stalled machine.
    assert 20 <= window.requests <= 70
    assert window.samples_per_s == pytest.approx(window.rows / window.seconds)
    assert total.requests >= window.requests + before and total.histogram.count == total.answered
    with pytest.raises(ConfigError, match="seconds > 0"):
        driver.measure(0)


def test_one_worker_can_run_in_the_calling_thread() -> None:
    """For clients bound to the thread that made them (tritonclient's gevent-based HTTP client)."""
    threads: list[threading.Thread] = []

    @contextmanager
    def here(worker: int) -> Iterator[Request]:
        def request(sequence: int) -> Answer:
            threads.append(threading.current_thread())
            return Answer(2)

        yield request

    tally = Driver(here, workers=1, max_requests=7).run()
    assert tally.requests == 7 and tally.rows == 14 and set(threads) == {threading.current_thread()}
    with pytest.raises(ConfigError, match="one worker for max_requests"):
        Driver(here, workers=2, max_requests=7).run()
    with pytest.raises(ConfigError, match="one worker for max_requests"):
        Driver(here, workers=1).run()


def test_a_rate_paces_the_workers_instead_of_sending_back_to_back() -> None:
    fake = Recorder()
    with Driver(fake.connect, workers=2, rate=100.0) as driver:
        window = driver.measure(0.5)
    # 100 requests/s for 0.5 s, against thousands per second unpaced.
    assert 30 <= window.requests <= 70


def test_a_worker_that_fails_outside_a_request_is_raised_by_stop() -> None:
    reached = threading.Event()

    @contextmanager
    def broken(worker: int) -> Iterator[Request]:
        def request(sequence: int) -> Answer:
            reached.set()
            raise ValueError("a bug, not a failed request")

        yield request

    driver = Driver(broken, workers=2).start()
    # A stop before any worker sends would rightly find no failure: wait for one to send.
    assert reached.wait(10)
    with pytest.raises(RuntimeError, match="a load worker failed"):
        driver.stop()

    @contextmanager
    def unreachable(worker: int) -> Iterator[Request]:
        raise ClientError("cannot reach tritonserver")
        yield lambda sequence: Answer()  # pragma: no cover - never reached

    with pytest.raises(RuntimeError, match="cannot reach tritonserver"):
        Driver(unreachable, workers=1).start().stop()


def test_bad_settings_fail_where_they_are_set() -> None:
    fake = Recorder()
    with pytest.raises(ConfigError, match="at least one worker"):
        Driver(fake.connect, workers=0)
    with pytest.raises(ConfigError, match="rate"):
        Driver(fake.connect, workers=1, rate=-1.0)
    with pytest.raises(ConfigError, match="max_requests"):
        Driver(fake.connect, workers=1, max_requests=-1)
    driver = Driver(fake.connect, workers=1, max_requests=1).start()
    with pytest.raises(ConfigError, match="starts once"):
        driver.start()
    driver.join()


def test_tallies_merge_and_survive_json() -> None:
    first, second = Tally(seconds=1.0), Tally(seconds=2.0)
    for latency in (1.0, 2.0, 3.0):
        first.answer(latency, rows=8)
    second.answer(10.0, rows=8, label="v2")
    second.answer(20.0, rows=8, label=None)
    second.error(ClientError("down"), at_s=5.0)
    first.error("refused", at_s=7.0)

    total = merged_tallies([first, second])
    assert (total.answered, total.wrong, total.errors, total.rows) == (5, 1, 2, 32)
    assert total.labels == {"ok": 3, "v2": 1} and total.seconds == 3.0
    assert (total.first_error_s, total.last_error_s) == (5.0, 7.0)
    assert total.samples_per_s == pytest.approx(32 / 3.0)
    latency = total.summary()["latency_ms"]
    assert latency["max"] == 20.0 and latency["p50"] <= latency["p99"] <= latency["max"]
    assert set(latency) >= {"p50", "p90", "p95", "p99", "p99.9", "mean", "max"}

    again = Tally.from_json(total.to_json())
    assert again.summary() == total.summary()
    assert again.histogram.count == total.histogram.count == 5
