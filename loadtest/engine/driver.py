"""The closed-loop load driver: worker threads that each send a request, wait for its answer, send the next.

Every in-process load of the bundle runs on it: the served throughput of the
roofline and the CPU benchmarks (:mod:`loadtest.engine.served`), the soak and the
fault tests (:mod:`lab.soak`), and the client-cost bench
(:mod:`lab.client_cost`). locust remains the user-facing sweep
(:mod:`loadtest.sweeps.sweep`); both keep their counts in one
:class:`~loadtest.engine.latency.Tally` per window.

What a request is stays outside: ``connect(worker)`` opens one worker's
connection (a context manager, entered in the worker's thread) and yields a
callable that sends one request and returns an :class:`Answer`, or raises
:class:`~bundle.errors.BundleError` for a failed request. Each worker sends
back to back (closed loop), or at a steady pace when the driver has a
``rate``; a driver may also stop by itself after ``max_requests``.

The driver keeps a tally of every request since :meth:`Driver.start`
(:attr:`Driver.total`, safe to read while it runs), per worker the time and
label of each accepted answer (:attr:`Driver.timelines`), and, on demand,
windows: :meth:`Driver.measure` counts the requests that complete inside the
next ``seconds``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import NamedTuple

import numpy as np

from bundle.errors import BundleError, ConfigError
from loadtest.engine.client_cpu import ClientCpu, process_cpu_s, process_demand, thread_busy_s
from loadtest.engine.collector import hold_collector, release_collector
from loadtest.engine.latency import Tally

logger = logging.getLogger(__name__)


class Answer(NamedTuple):
    """What one request got back.

    Attributes:
        rows: rows answered (samples/s count these).
        label: which accepted answer it matched (e.g. a model version), None for a wrong answer.
        serial_s: the client's time from the sender's previous answer arriving to this request
            going out (:class:`~loadtest.engine.wire.Turnaround`); NaN where not measured (the
            first request of a connection, a sender that does not measure it).
    """

    rows: int = 1
    label: str | None = "ok"
    serial_s: float = math.nan


#: One worker's request: its sequence number (0, 1, ... per worker) in, the answer out.
Request = Callable[[int], Answer]
#: Opens one worker's connection (its index in) and yields the callable that sends its requests.
Connect = Callable[[int], AbstractContextManager[Request]]


@contextmanager
def plain(request: Callable[[int, int], Answer], worker: int) -> Iterator[Request]:
    """A connection with nothing to open: ``request(worker, sequence)`` as the worker's request."""
    yield lambda sequence: request(worker, sequence)


class Driver:
    """``workers`` threads in a closed loop over ``connect``'s requests, until :meth:`stop`.

    Args:
        connect: opens worker ``i``'s connection; yields its request callable.
        workers: threads, so requests in flight at most.
        rate: requests per second over all workers, each worker paced to its
            share with a random phase; 0: each sends as soon as its answer is back.
        max_requests: stop after this many requests in all (0: until :meth:`stop`).
        seed: of the pacing phases.

    Use as a context manager (:meth:`start` on entry, :meth:`stop` on exit).
    A request that raises :class:`BundleError` is an error of the tally; any
    other exception ends its worker and :meth:`stop` raises it.
    """

    def __init__(
        self, connect: Connect, workers: int, rate: float = 0.0, max_requests: int = 0, seed: int = 0
    ) -> None:
        if workers < 1:
            raise ConfigError(f"the driver needs at least one worker, got {workers}")
        if rate < 0:
            raise ConfigError(f"rate must be >= 0, got {rate!r}")
        if max_requests < 0:
            raise ConfigError(f"max_requests must be >= 0 (0: no limit), got {max_requests}")
        self._connect = connect
        self._workers = workers
        self._interval_s = workers / rate if rate > 0 else 0.0
        self._max_requests = max_requests
        self._seed = seed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []
        self._claimed = 0
        self._begun = False
        #: Whether this driver holds the cycle collector off (:mod:`loadtest.engine.collector`).
        self._holding = False
        self._started = 0.0
        self._window: Tally | None = None
        #: Every request since :meth:`start`; its ``seconds`` is set by :meth:`stop`.
        self.total = Tally()
        #: Per worker, ``(seconds since start, label)`` of each accepted answer.
        self.timelines: dict[int, list[tuple[float, str]]] = {}

    def __enter__(self) -> Driver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def elapsed_s(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self._started

    @property
    def running(self) -> bool:
        """Whether any worker is still sending."""
        return any(thread.is_alive() for thread in self._threads)

    def _begin(self) -> None:
        if self._begun:
            raise ConfigError("a driver starts once")
        self._begun = True
        hold_collector()
        self._holding = True
        self._started = time.perf_counter()
        self.timelines.update({index: [] for index in range(self._workers)})

    def start(self) -> Driver:
        """Start every worker; returns at once."""
        self._begin()
        for index in range(self._workers):
            thread = threading.Thread(target=self._run, args=(index,), name=f"driver-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def wait(self, seconds: float) -> None:
        """Let the load run for ``seconds`` (less when every worker has finished)."""
        deadline = time.perf_counter() + seconds
        while self.running and (left := deadline - time.perf_counter()) > 0:
            self._stop.wait(min(left, 0.05))

    def measure(self, seconds: float) -> Tally:
        """The requests that complete in the next ``seconds`` (the window ends early when the
        workers do); its ``seconds`` is the window's length, its ``client`` this process's CPU
        over the window (the driver's threads are the load generator), judged with the window's
        serial client time and mean latency as well."""
        if not seconds > 0:
            raise ConfigError(f"a window needs seconds > 0, got {seconds}")
        window = Tally()
        with self._lock:
            if self._window is not None:
                raise ConfigError("one window at a time")
            self._window = window
            opened = time.perf_counter()
        cpu, busy = process_cpu_s(), thread_busy_s()
        self.wait(seconds)
        with self._lock:
            self._window = None
            window.seconds = time.perf_counter() - opened
        demand = process_demand(busy, thread_busy_s(), window.seconds)
        window.client = ClientCpu.of_processes(
            [(process_cpu_s() - cpu, window.seconds, demand)],
            window.requests,
            users=self._workers,
            serial_us=window.serial_us,
            mean_ms=window.histogram.mean_ms,
        )
        return window

    def run(self) -> Tally:
        """A bounded run of one worker in the calling thread; the total tally.

        For clients bound to the thread that made them (tritonclient's HTTP
        client runs on that thread's gevent hub), made and warmed up before.

        Raises:
            ConfigError: more than one worker, or no ``max_requests``.
            RuntimeError: the worker failed outside a request (see :meth:`stop`).
        """
        if self._workers != 1 or not self._max_requests:
            raise ConfigError("run() drives one worker for max_requests in this thread; use start()")
        self._begin()
        self._run(0)
        return self.stop()

    def join(self, timeout_s: float = 600.0) -> Tally:
        """Wait for the workers to finish by themselves (``max_requests``), then :meth:`stop`."""
        deadline = time.perf_counter() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.perf_counter()))
        return self.stop()

    def stop(self, timeout_s: float = 60.0) -> Tally:
        """Let each worker finish the request it has in flight, wait for them; the total tally.

        Raises:
            RuntimeError: a worker died of something other than a failed request
                (a bug), or did not finish within ``timeout_s``.
        """
        self._stop.set()
        deadline = time.perf_counter() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.perf_counter()))
        if self._holding:
            self._holding = False
            release_collector()
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        if alive:
            raise RuntimeError(f"load workers {alive} did not stop within {timeout_s} s")
        if not self.total.seconds:
            self.total.seconds = self.elapsed_s()
        if self._failures:
            raise RuntimeError(f"a load worker failed: {self._failures[0]!r}") from self._failures[0]
        return self.total

    # ------------------------------------------------------------ workers
    def _claim(self) -> bool:
        """Whether this worker may send one more request."""
        if self._stop.is_set():
            return False
        if not self._max_requests:
            return True
        with self._lock:
            if self._claimed >= self._max_requests:
                return False
            self._claimed += 1
            return True

    def _run(self, index: int) -> None:
        rng = np.random.default_rng(self._seed + index)
        next_send = time.perf_counter() + rng.uniform(0, self._interval_s)
        try:
            with self._connect(index) as request:
                sequence = 0
                while self._claim():
                    if self._interval_s:
                        delay = next_send - time.perf_counter()
                        if delay > 0 and self._stop.wait(delay):
                            break
                        next_send = max(next_send + self._interval_s, time.perf_counter() - self._interval_s)
                    self._one(index, request, sequence)
                    sequence += 1
        except BaseException as exc:  # reported by stop(), never lost with the thread
            self._failures.append(exc)

    def _one(self, index: int, request: Request, sequence: int) -> None:
        sent = time.perf_counter()
        try:
            answer = request(sequence)
        except BundleError as exc:
            now = time.perf_counter() - self._started
            with self._lock:
                self.total.error(exc, now)
                if self._window is not None:
                    self._window.error(exc, now)
            logger.debug("worker %d: %s", index, exc)
            return
        done = time.perf_counter()
        latency_ms = (done - sent) * 1000.0
        with self._lock:
            self.total.answer(latency_ms, answer.rows, answer.label)
            self.total.serial(answer.serial_s)
            if self._window is not None:
                self._window.answer(latency_ms, answer.rows, answer.label)
                self._window.serial(answer.serial_s)
            if answer.label is not None:
                self.timelines[index].append((done - self._started, answer.label))
