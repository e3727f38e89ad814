"""The open-loop load driver: requests sent at a rate set in advance, whatever the answers do.

A closed loop (:mod:`loadtest.engine.driver`) sends a user's next request when its last one
is answered, so a server that stalls stops the load, and the stall counts as one slow request
instead of every request it held up (coordinated omission). Here the arrival times are drawn
first, as a schedule (:func:`schedule`): Poisson arrivals (exponential gaps, MLPerf's Server
scenario and perf_analyzer's ``--request-distribution poisson``) or constant ones, at ``rate``
requests per second. A pool of ``connections`` sender threads serves the schedule: each free
sender takes the next request, sleeps until its time (asking the kernel for a timer slack of
:data:`TIMER_SLACK_NS`), sends it through its ``connect(sender)`` (over gRPC the sweep's senders
share connections, six to one) and waits for the answer. A request's latency is measured from its
*scheduled* time, so the time it waited (for a free connection while the server was behind,
or for a thread that did not get a core in time) counts, as wrk2
counts it; perf_analyzer's request-rate mode starts its clock at the send, which the window
also records. While it runs, the objects that existed when it started are out of the
cycle collector's reach (:mod:`loadtest.engine.collector`), so no full collection holds every
sender at once.

What a window records (:class:`OpenLoopWindow`), for the requests *scheduled* inside it,
each followed to its answer: the latency from the schedule and from the send, the send lag
(sent minus scheduled), late requests (sent more than :data:`LATE_MS` after their time),
requests in flight as each one arrived (mean and maximum), and whether the generator kept
its schedule (:meth:`OpenLoopWindow.flag`).

What a request is stays outside, as for the closed loop: ``connect(sender)`` (a
:data:`~loadtest.engine.driver.Connect`) opens one sender's connection and yields the callable
that sends one request.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bundle.errors import BundleError, ConfigError
from loadtest.engine.client_cpu import ClientCpu, process_cpu_s, process_demand, thread_busy_s
from loadtest.engine.collector import hold_collector, release_collector
from loadtest.engine.driver import Connect, Request
from loadtest.engine.latency import LatencyHistogram, Tally

logger = logging.getLogger(__name__)

#: How arrivals are spaced: exponential gaps (a Poisson process) or equal ones.
ARRIVALS = ("poisson", "constant")
#: A request sent later than this after its scheduled time is late (ms).
LATE_MS = 1.0
#: A window whose sends fell below this share of its schedule is flagged.
MIN_SENT_SHARE = 0.98
#: A window with more than this share of late requests is flagged.
MAX_LATE_SHARE = 0.01
#: Connections (sender threads) by default: requests in flight at most.
CONNECTIONS = 64
#: Arrivals drawn at a time.
_CHUNK = 4096
#: A sender waits on the stop event until this long before a request's time, then sleeps.
_COARSE_S = 0.002
#: The interpreter's thread switch interval while an open loop runs (Python's default is 5 ms):
#: a sender due to send waits at most this long for the GIL (with the default, the send lag's
#: tail was several times longer in process).
SWITCH_INTERVAL_S = 0.0005
#: The timer slack a sender asks of the kernel (ns). A sleeping thread wakes up to its slack after
#: its time (Linux gives a thread 50 us by default), and every send lags by as much: with the
#: default, the open loop's median send lag was more than twice as long.
TIMER_SLACK_NS = 1_000
#: ``prctl`` options (linux/prctl.h).
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30


def schedule(rate: float, arrival: str, rng: np.random.Generator, count: int = _CHUNK) -> np.ndarray:
    """``count`` gaps (seconds) between successive arrivals at ``rate`` per second.

    Raises:
        ConfigError: a rate that is not > 0, or an unknown arrival.
    """
    if not rate > 0 or not math.isfinite(rate):
        raise ConfigError(f"a request rate must be > 0 per second, got {rate!r}")
    if arrival not in ARRIVALS:
        raise ConfigError(f"arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")
    if arrival == "constant":
        return np.full(count, 1.0 / rate)
    return rng.exponential(1.0 / rate, count)


@dataclass
class OpenLoopWindow:
    """The requests scheduled inside one window, each followed to its answer (or failure).

    Attributes:
        tally: answers and errors; its latency from each request's scheduled time, its
            ``seconds`` the window's length.
        service: the same answers' latency from their actual send (what a closed loop measures).
        lag: send lag (ms): sent minus scheduled, of every request sent.
        rate: the rate asked (per second).
        scheduled: requests scheduled inside the window.
        sent: those of them sent before the window closed.
        late: those sent more than :data:`LATE_MS` after their scheduled time.
        waited: those of them that found every connection busy at their time.
        unfinished: those without an answer or an error when the window was closed (still
            queued or in flight after the drain).
        in_flight_sum, in_flight_max: requests in flight (sent, not answered) as each of them
            arrived, added up and at most (``connections`` for one that found them all busy).
        connections: the pool's size: requests in flight at most.
    """

    rate: float
    connections: int
    tally: Tally = field(default_factory=Tally)
    service: LatencyHistogram = field(default_factory=LatencyHistogram)
    lag: LatencyHistogram = field(default_factory=LatencyHistogram)
    scheduled: int = 0
    sent: int = 0
    late: int = 0
    waited: int = 0
    unfinished: int = 0
    in_flight_sum: int = 0
    in_flight_max: int = 0
    opened_at: float = 0.0
    closed_at: float = math.inf
    #: Requests of the window not finished yet (-1 once the window is closed).
    pending: int = 0

    @property
    def seconds(self) -> float:
        return self.tally.seconds

    @property
    def achieved_rate(self) -> float:
        """Requests sent per second of the window (of those scheduled in it)."""
        return self.sent / self.seconds if self.seconds > 0 else math.nan

    @property
    def scheduled_rate(self) -> float:
        """What the schedule asked inside the window, per second (a Poisson schedule's own count
        varies around ``rate``)."""
        return self.scheduled / self.seconds if self.seconds > 0 else math.nan

    @property
    def in_flight_mean(self) -> float:
        """Requests in flight as an arrival saw them, on average."""
        return self.in_flight_sum / self.scheduled if self.scheduled else math.nan

    def flag(self) -> str:
        """Why the generator did not keep its schedule ("" when it did): sends below
        :data:`MIN_SENT_SHARE` of the schedule, or more than :data:`MAX_LATE_SHARE` of the
        requests late; with every connection busy, the server was behind the rate."""
        if not self.scheduled:
            return "no request was scheduled in the window"
        reasons = []
        if self.sent < MIN_SENT_SHARE * self.scheduled:
            reasons.append(f"sent {self.sent} of the {self.scheduled} requests scheduled")
        if self.late > MAX_LATE_SHARE * self.scheduled:
            reasons.append(
                f"{self.late / self.scheduled:.1%} of the requests sent more than {LATE_MS:g} ms late "
                f"(p99 send lag {self.lag.percentile(99):.2f} ms)"
            )
        if not reasons:
            return ""
        if self.waited and 2 * self.waited >= self.late:
            reasons.append(
                f"all {self.connections} connections were busy: the server answered slower than "
                "requests arrived"
            )
        else:
            reasons.append(
                "the load generator fell behind its schedule (its threads did not get a core in "
                "time: a server on the same cores, or the machine busy)"
            )
        return "; ".join(reasons)

    def summary(self) -> dict[str, Any]:
        """Counts, rates, latency and send lag, JSON-ready."""
        return {
            **self.tally.summary(),
            "request_rate": self.rate,
            "scheduled_rate": self.scheduled_rate,
            "achieved_rate": self.achieved_rate,
            "scheduled": self.scheduled,
            "sent": self.sent,
            "late": self.late,
            "waited": self.waited,
            "unfinished": self.unfinished,
            "in_flight_mean": self.in_flight_mean,
            "in_flight_max": self.in_flight_max,
            "connections": self.connections,
            "send_lag_ms": {
                "p50": self.lag.percentile(50),
                "p99": self.lag.percentile(99),
                "max": self.lag.max_ms if self.lag.count else math.nan,
            },
            "service_latency_ms": {f"p{q:g}": v for q, v in self.service.percentiles().items()},
            "flag": self.flag(),
        }


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library this process runs on, opened once (each sender asks it on starting)."""
    return ctypes.CDLL(None)


def _prctl(option: int, value: int = 0) -> int:
    """``prctl(option, value)`` on Linux; -1 where there is none."""
    if not sys.platform.startswith("linux"):
        return -1
    return int(_libc().prctl(option, ctypes.c_ulong(value), 0, 0, 0))


def fine_timer_slack(slack_ns: int = TIMER_SLACK_NS) -> bool:
    """Ask the kernel to wake the calling thread within ``slack_ns`` of the end of each of its
    sleeps (:data:`TIMER_SLACK_NS`); whether it took (False off Linux)."""
    return _prctl(_PR_SET_TIMERSLACK, slack_ns) == 0


def timer_slack_ns() -> int:
    """The calling thread's timer slack (ns); -1 off Linux."""
    return _prctl(_PR_GET_TIMERSLACK)


@dataclass(frozen=True)
class WakeUps:
    """How late this machine wakes a sleeping thread: the floor under any generator's send lag.

    Attributes:
        sleep_ms: the sleep asked.
        sleeps: how many were timed.
        p50_ms, p99_ms, max_ms: how much later than asked the thread ran again.
    """

    sleep_ms: float
    sleeps: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def line(self) -> str:
        """The measurement in one line, for a report's set-up."""
        return (
            f"a {self.sleep_ms:g} ms sleep on the load generator's cores woke p50 {self.p50_ms:.2f} ms, "
            f"p99 {self.p99_ms:.2f} ms, max {self.max_ms:.2f} ms late ({self.sleeps} sleeps before the run; "
            f"a send later than {LATE_MS:g} ms is late)"
        )


def wake_ups(cpus: frozenset[int] | None = None, sleeps: int = 400, sleep_s: float = 0.005) -> WakeUps:
    """Time ``sleeps`` sleeps of ``sleep_s`` on ``cpus`` (None: where this thread runs), with the
    senders' timer slack: a machine that wakes its threads late (a busy or virtual one) lags
    every sender by as much."""
    if sleeps < 1 or not sleep_s > 0:
        raise ConfigError(f"need sleeps >= 1 and a sleep > 0, got {sleeps} and {sleep_s:g}")
    affinity, slack = os.sched_getaffinity(0), timer_slack_ns()
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    fine_timer_slack()
    try:
        late = np.empty(sleeps)
        for index in range(sleeps):
            before = time.perf_counter()
            time.sleep(sleep_s)
            late[index] = (time.perf_counter() - before - sleep_s) * 1000.0
    finally:
        os.sched_setaffinity(0, affinity)
        if slack > 0:
            fine_timer_slack(slack)
    p50, p99 = np.percentile(late, [50, 99])
    return WakeUps(sleep_s * 1000.0, sleeps, float(p50), float(p99), float(late.max()))


@dataclass(eq=False)
class _Job:
    sequence: int
    scheduled: float
    window: OpenLoopWindow | None = None
    #: When a sender took it: after its time, every connection was busy at its time.
    taken: float = 0.0


class OpenLoop:
    """Requests at ``rate`` per second on a schedule drawn in advance (see the module).

    Args:
        connect: opens sender ``i``'s connection; yields its request callable.
        rate: requests per second.
        arrival: ``poisson`` or ``constant`` (:data:`ARRIVALS`).
        connections: sender threads, each with its own ``connect(sender)``: requests in flight at most.
            A request that finds all of them busy waits for one, its wait counted in its latency.
        seed: of the Poisson gaps and the first arrival's phase.

    Each free sender takes the next request of the schedule and sleeps until its time (one
    wake-up per request, no hand-over between threads). Use as a context manager
    (:meth:`start` on entry, :meth:`stop` on exit); :meth:`measure` opens one window at a time.
    A request that raises :class:`BundleError` is an error of the window; any other exception
    ends its sender and :meth:`stop` raises it.
    """

    def __init__(
        self,
        connect: Connect,
        rate: float,
        arrival: str = "poisson",
        connections: int = CONNECTIONS,
        seed: int = 0,
    ) -> None:
        if connections < 1:
            raise ConfigError(f"the open loop needs at least one connection, got {connections}")
        self._rng = np.random.default_rng(seed)
        schedule(rate, arrival, self._rng, 1)  # checks both
        self._connect = connect
        self._rate = rate
        self._arrival = arrival
        self._connections = connections
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []
        #: The schedule drawn but not taken yet, and the next arrival after it.
        self._upcoming: collections.deque[_Job] = collections.deque()
        self._next_due = 0.0
        self._sequence = 0
        #: Requests taken by a sender and not yet sent (it sleeps until their time).
        self._held: set[_Job] = set()
        self._window: OpenLoopWindow | None = None
        self._in_flight = 0
        self._switch_interval = sys.getswitchinterval()
        #: Whether this loop holds the cycle collector off (:mod:`loadtest.engine.collector`).
        self._holding = False

    def __enter__(self) -> OpenLoop:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> OpenLoop:
        """Open every connection and start the schedule; returns at once."""
        if self._threads:
            raise ConfigError("an open loop starts once")
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL_S))
        hold_collector()
        self._holding = True
        self._next_due = time.perf_counter() + float(self._rng.uniform(0, 1.0 / self._rate))
        for index in range(self._connections):
            thread = threading.Thread(
                target=self._send, args=(index,), name=f"open-loop-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return self

    def measure(self, seconds: float, drain_s: float = 60.0) -> OpenLoopWindow:
        """The requests scheduled in the next ``seconds``, each followed to its answer: returns
        once all of them have finished, or ``drain_s`` after the window closed (those still
        unfinished then are counted as such). ``client`` of its tally is this process's CPU
        over the window."""
        if not seconds > 0:
            raise ConfigError(f"a window needs seconds > 0, got {seconds}")
        window = OpenLoopWindow(self._rate, self._connections)
        cpu, busy = process_cpu_s(), thread_busy_s()
        with self._lock:
            if self._window is not None:
                raise ConfigError("one window at a time")
            window.opened_at = time.perf_counter()
            window.closed_at = window.opened_at + seconds
            self._window = window
            for job in self._held:  # taken ahead of their time by a sleeping sender
                self._claim(job, window)
        self._stop.wait(max(0.0, window.closed_at - time.perf_counter()))
        with self._lock:
            # What the schedule holds for the window and no sender has taken yet.
            while self._next_due < window.closed_at:
                self._draw()
            for job in self._upcoming:
                self._claim(job, window)
            self._window = None
        window.tally.seconds = seconds
        demand = process_demand(busy, thread_busy_s(), seconds)
        spent = process_cpu_s() - cpu
        with self._drained:
            self._drained.wait_for(lambda: window.pending == 0 or bool(self._failures), drain_s)
            window.unfinished = window.pending
            window.pending = -1  # closed: what finishes from now on is not counted
        window.tally.client = ClientCpu.of_processes(
            [(spent, seconds, demand)], window.tally.requests, users=self._connections
        )
        return window

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop the schedule, let each sender finish what it sends; raises a sender's failure.

        Raises:
            RuntimeError: a sender died of something other than a failed request (a bug), or
                did not finish within ``timeout_s``.
        """
        self._stop.set()
        deadline = time.perf_counter() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.perf_counter()))
        sys.setswitchinterval(self._switch_interval)
        if self._holding:
            self._holding = False
            release_collector()
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        if alive:
            raise RuntimeError(f"open-loop senders {alive} did not stop within {timeout_s} s")
        if self._failures:
            raise RuntimeError(f"an open-loop sender failed: {self._failures[0]!r}") from self._failures[0]

    # ------------------------------------------------------------ the schedule (under the lock)
    def _draw(self) -> None:
        """Append the next chunk of arrivals to the schedule."""
        for gap in schedule(self._rate, self._arrival, self._rng):
            self._upcoming.append(_Job(self._sequence, self._next_due))
            self._sequence += 1
            self._next_due += float(gap)

    def _claim(self, job: _Job, window: OpenLoopWindow) -> None:
        """Count ``job`` in ``window`` where its time falls inside it."""
        if job.window is None and window.opened_at <= job.scheduled < window.closed_at:
            job.window = window
            window.scheduled += 1
            window.pending += 1

    def _take(self) -> _Job:
        with self._lock:
            if not self._upcoming:
                self._draw()
            job = self._upcoming.popleft()
            job.taken = time.perf_counter()
            if self._window is not None:
                self._claim(job, self._window)
            self._held.add(job)
            return job

    # ------------------------------------------------------------ the senders
    def _send(self, index: int) -> None:
        fine_timer_slack()
        try:
            with self._connect(index) as request:
                while not self._stop.is_set():
                    job = self._take()
                    wait = job.scheduled - time.perf_counter()
                    # Most of the wait on the stop event, the last moments in a plain sleep.
                    if wait > _COARSE_S and self._stop.wait(wait - _COARSE_S):
                        break
                    if (left := job.scheduled - time.perf_counter()) > 0:
                        time.sleep(left)
                    self._one(request, job)
        except BaseException as exc:  # reported by stop(), never lost with the thread
            self._failures.append(exc)
            with self._drained:
                self._drained.notify_all()

    def _one(self, request: Request, job: _Job) -> None:
        with self._lock:
            self._held.discard(job)
            window = job.window
            # Taken late: at its time every connection had a request in flight.
            waited = job.taken - job.scheduled > LATE_MS / 1000.0
            if window is not None and window.pending >= 0:
                seen = self._connections if waited else self._in_flight
                window.in_flight_sum += seen
                window.in_flight_max = max(window.in_flight_max, seen)
            self._in_flight += 1
        sent = time.perf_counter()
        error: BundleError | None = None
        try:
            answer = request(job.sequence)
        except BundleError as exc:
            error = exc
        done = time.perf_counter()
        with self._drained:
            self._in_flight -= 1
            if window is None or window.pending < 0:
                return
            lag_ms = (sent - job.scheduled) * 1000.0
            window.sent += int(sent < window.closed_at)
            window.lag.record(max(lag_ms, 0.0))
            if lag_ms > LATE_MS:
                window.late += 1
                window.waited += int(waited)
            if error is not None:
                window.tally.error(error, done)
                logger.debug("open loop: %s", error)
            else:
                window.tally.answer((done - job.scheduled) * 1000.0, answer.rows, answer.label)
                window.service.record((done - sent) * 1000.0)
            window.pending -= 1
            if window.pending == 0:
                self._drained.notify_all()
