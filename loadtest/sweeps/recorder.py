"""What every locust process of a load test records, and the options it reads.

Imported by the locustfiles (:mod:`loadtest.sweeps.locustfile`,
:mod:`loadtest.sweeps.peers.locustfile`); importing it registers locust event
listeners, once per process:

- ``init_command_line_parser``: the load test's options (``--model``,
  ``--batch-size``, ``--payload``, ``--results-dir``, ``--warmup``,
  ``--window``, ``--server-stats``, ``--request-timeout``), which locust also
  reads from ``LOCUST_*`` environment variables and ``locust.conf``;
- ``init``: loads the payload pool, in every process that runs users;
- ``request``: counts every request that *completes inside the measurement
  window* (``warmup`` seconds after the test starts, for ``window`` seconds)
  in a :class:`~loadtest.engine.latency.Tally`: its exact latency in the one
  latency histogram, its sender's serial client time, errors by kind (the closed-loop driver,
  :mod:`loadtest.engine.driver`, keeps the same tally). With
  ``--skip-locust-stats`` (what the sweep runs) an answered request skips
  locust's event and its statistics: its latency is appended to a list, counted
  when the test stops (a locust event and a histogram update cost the client
  a sizeable share of what a batch-1 gRPC call costs it); failures still go
  through the event;
- ``test_stop``: writes ``latency-<pid>.json`` into ``--results-dir``, and
  ``client-cpu-<pid>.json``: this process's CPU seconds over the window (every
  process, the master included: the load generator's cost is all of them);
- on the master (or the single process): reads Triton's statistics at the
  window's start and end and writes their difference as ``server-stats.json``,
  with the server process's CPU over the window and its cores (``--server-pid``).

Nothing here imports TensorFlow or PyTorch.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import numpy as np
from locust import events
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from bundle.errors import BundleError, ConfigError
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.client_cpu import process_cpu_s, process_demand, thread_busy_s
from loadtest.engine.latency import Tally
from loadtest.engine.payload import PayloadPool, build_pool
from loadtest.sweeps.stepfiles import (
    cpu_file,
    latency_file,
    read_server,
    record_server,
    stream_file,
)

logger = logging.getLogger(__name__)


@dataclass
class Recording:
    """This process's requests inside the measurement window.

    Attributes:
        window_start: wall time (``time.time()``) the window opens; None before the test starts.
        window_end: wall time it closes (``inf``: at the end of the test).
        tally: the requests completed inside the window (latencies, errors by kind).
        errors_total: failed requests of the whole test, warm-up included.
        stopped_at: wall time the test stopped in this process.
        cpu_at_start, cpu_at_end: this process's CPU seconds when the window opened and closed.
        busy_at_start, busy_at_end: its threads' busy seconds (running or runnable) then.
        read_at_start, read_at_end: wall times those readings were taken. A starved process
            reads late, so its CPU share and demand are over the time between its readings,
            not over the window it was meant to read.
    """

    window_start: float | None = None
    window_end: float = float("inf")
    tally: Tally = field(default_factory=Tally)
    errors_total: int = 0
    stopped_at: float | None = None
    cpu_at_start: float | None = None
    cpu_at_end: float | None = None
    busy_at_start: dict[int, float] = field(default_factory=dict)
    busy_at_end: dict[int, float] = field(default_factory=dict)
    read_at_start: float | None = None
    read_at_end: float | None = None
    #: The window in ``time.perf_counter()``'s clock (what a request's end is compared with), and
    #: the latencies (ms) of the answers that ended inside it, not yet in ``tally``
    #: (:meth:`answered`, counted by :meth:`settle`).
    window_pc: tuple[float, float] = (float("inf"), float("inf"))
    pending_ms: list[float] = field(default_factory=list)
    #: ``--skip-locust-stats``: answered requests go to this record only, not through locust's event.
    record_only: bool = False

    def inside(self, ended_pc: float) -> bool:
        """Whether a request that ended at ``ended_pc`` (``perf_counter``) counts."""
        start, end = self.window_pc
        return start <= ended_pc < end

    def answered(self, latency_ms: float, ended_pc: float, serial_s: float = math.nan) -> None:
        """One answered request that ended at ``ended_pc``, its sender's serial client time before
        it ``serial_s`` (NaN: not measured): kept if inside the window. The least work per
        request: one comparison, one append, one addition."""
        if self.inside(ended_pc):
            self.pending_ms.append(latency_ms)
            self.tally.serial(serial_s)

    def settle(self) -> None:
        """Count the kept latencies into ``tally``."""
        for latency_ms in self.pending_ms:
            self.tally.answer(latency_ms)
        self.pending_ms.clear()

    def covered_s(self) -> float:
        """Seconds of the window this process was running for."""
        if self.window_start is None:
            return 0.0
        end = min(self.window_end, self.stopped_at if self.stopped_at is not None else time.time())
        return max(0.0, end - self.window_start)

    def to_json(self) -> dict[str, Any]:
        self.settle()
        self.tally.seconds = self.covered_s()
        return {
            "pid": os.getpid(),
            "window_start": self.window_start,
            "window_end": None if self.window_end == float("inf") else self.window_end,
            "errors_total": self.errors_total,
            "tally": self.tally.to_json(),
        }

    def cpu_json(self) -> dict[str, Any]:
        """This process's CPU seconds over the part of the window it ran."""
        if self.cpu_at_start is None:
            return {"pid": os.getpid(), "cpu_s": None, "seconds": 0.0, "process_demand": None}
        if self.cpu_at_end is not None and self.read_at_end is not None and self.read_at_start is not None:
            end, busy = self.cpu_at_end, self.busy_at_end
            seconds = max(0.0, self.read_at_end - self.read_at_start)
        else:  # the window lasts to the test's end: read now
            end, busy, seconds = process_cpu_s(), thread_busy_s(), self.covered_s()
        return {
            "pid": os.getpid(),
            "cpu_s": end - self.cpu_at_start,
            "seconds": seconds,
            "process_demand": process_demand(self.busy_at_start, busy, seconds),
        }


_recording = Recording()
_pool: dict[str, PayloadPool] = {}
#: The master's greenlet reading Triton's statistics (joined before the process exits).
_stats_greenlet: list[gevent.Greenlet] = []
#: First row of every request this process sent from the stream (streamed steps).
_stream_sent: list[int] = []
_stream_turn = itertools.count()
#: The greenlet reading this process's CPU time at the window's start and end.
_cpu_greenlet: list[gevent.Greenlet] = []


def payload_pool() -> PayloadPool:
    """The payload pool of this process (loaded at ``init``)."""
    if "pool" not in _pool:
        raise ConfigError("the payload pool is not loaded: is this running under locust?")
    return _pool["pool"]


def next_stream_row(environment: Environment, batch_size: int) -> int:
    """The first row of this process's next streamed request: process ``i`` of ``P`` takes the
    stream's batches ``i``, ``i + P``, ... after ``--stream-start``; past the end the stream
    wraps (the repeats show in the step's distinct-row count)."""
    parsed = options(environment)
    runner = environment.runner
    index = runner.worker_index if isinstance(runner, WorkerRunner) else 0
    row = parsed.stream_start + (index + next(_stream_turn) * parsed.stream_stride) * batch_size
    row %= max(1, len(payload_pool().dense) - batch_size + 1)
    _stream_sent.append(row)
    return row


def load_payload(payload: str, batch_size: int) -> PayloadPool:
    """A pool of ``batch_size``-row batches from a ``.npz`` pool, a Criteo TSV file, or synthetic rows."""
    if not payload:
        return build_pool(batch_size)
    path = Path(payload)
    if path.suffix == ".npz":
        return PayloadPool.load(path).rebatched(batch_size)
    return build_pool(batch_size, data=path)


# ------------------------------------------------------------------ options
@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    group = parser.add_argument_group("Triton load test (loadtest)")
    group.add_argument("--model", type=str, default="dlrm_onnx", help="Model name to infer.")
    group.add_argument("--batch-size", type=int, default=1, help="Rows per request.")
    group.add_argument(
        "--payload",
        type=str,
        default="",
        help="Request rows: a .npz pool written by loadtest, a Criteo TSV file, or empty for synthetic rows.",
    )
    group.add_argument(
        "--results-dir", type=str, default="", help="Folder for raw latencies and server statistics."
    )
    group.add_argument("--warmup", type=float, default=0.0, help="Seconds after the start not measured.")
    group.add_argument(
        "--window", type=float, default=0.0, help="Seconds measured after the warm-up (0: until the end)."
    )
    group.add_argument(
        "--server-stats",
        type=str,
        default="",
        choices=["", "grpc", "http"],
        help="Read Triton's statistics of --model from --host over this protocol ('' = off).",
    )
    group.add_argument(
        "--server-pid",
        type=int,
        default=0,
        help="The server's process: its CPU (with its children's) and cores are read with its "
        "statistics (0: not read).",
    )
    group.add_argument("--request-timeout", type=float, default=60.0, help="Seconds per request.")
    group.add_argument(
        "--stream-start",
        type=int,
        default=-1,
        help="Send the payload's rows in order from this row, each once, instead of cycling its "
        "batches (-1: cycle).",
    )
    group.add_argument(
        "--stream-stride", type=int, default=1, help="Processes taking turns on the stream's batches."
    )
    group.add_argument(
        "--skip-locust-stats",
        action="store_true",
        help="Count answered requests only in the load test's own record (--results-dir), not in "
        "locust's statistics: a locust event per request costs the client a fifth of a batch-1 "
        "gRPC call. Failures are reported to locust either way.",
    )


def options(environment: Environment) -> Any:
    """The parsed options, checked."""
    parsed = environment.parsed_options
    if parsed is None:
        raise ConfigError("locust parsed no options")
    if parsed.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {parsed.batch_size}")
    if parsed.warmup < 0 or parsed.window < 0:
        raise ConfigError("--warmup and --window must be >= 0")
    return parsed


def _runs_users(environment: Environment) -> bool:
    return not isinstance(environment.runner, MasterRunner)


def _measures_server(environment: Environment) -> bool:
    return not isinstance(environment.runner, WorkerRunner)


# ------------------------------------------------------------------ process set-up
@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    parsed = options(environment)
    _recording.record_only = bool(parsed.skip_locust_stats)
    if _runs_users(environment) and "pool" not in _pool:
        started = time.perf_counter()
        _pool["pool"] = load_payload(parsed.payload, parsed.batch_size)
        logger.info(
            "payload pool: %d batches of %d rows from %s in %.1f s",
            len(_pool["pool"]),
            parsed.batch_size,
            _pool["pool"].source,
            time.perf_counter() - started,
        )


# ------------------------------------------------------------------ timing
def timed_request(
    environment: Environment,
    request_type: str,
    name: str,
    call: Callable[[], int],
    batch_size: int,
    url: str | None,
    report_success: bool = True,
    failures: list[dict[str, Any]] | None = None,
    serial: Callable[[], float] | None = None,
) -> None:
    """Run one request, time it, and fire locust's ``request`` event with its exact latency.

    ``call`` returns the answer's size in bytes; a :class:`BundleError` or
    :class:`OSError` it raises is the request's failure (reported, never
    retried: a load test counts it). ``report_success=False`` reports only
    a failure (a set-up call such as the model's metadata). With
    ``failures`` (a request sent from a native thread, where locust's
    events must not fire), a failure's event is appended there instead, for
    :func:`fire_failures` to fire from the user's greenlet. ``serial``: the sender's serial
    client time before this request (:class:`~loadtest.engine.wire.Turnaround`), read after an
    answer.
    """
    start_time = time.time()
    started = time.perf_counter()
    exception: BaseException | None = None
    length = 0
    try:
        length = call()
    except (BundleError, OSError) as exc:
        exception = exc
    ended = time.perf_counter()
    elapsed_ms = (ended - started) * 1000.0
    serial_s = serial() if serial is not None and exception is None else math.nan
    if exception is None and (_recording.record_only or not report_success):
        if report_success:
            _recording.answered(elapsed_ms, ended, serial_s)
        return
    event = {
        "request_type": request_type,
        "name": name,
        "response_time": elapsed_ms,
        "response_length": length,
        "response": None,
        "context": {"batch_size": batch_size, "serial_s": serial_s},
        "exception": exception,
        "start_time": start_time,
        "url": url,
    }
    if failures is not None and exception is not None:
        failures.append(event)
        return
    environment.events.request.fire(**event)


def fire_failures(environment: Environment, failures: list[dict[str, Any]]) -> None:
    """Fire the failures :func:`timed_request` kept aside (from the user's greenlet)."""
    for event in failures:
        environment.events.request.fire(**event)
    failures.clear()


# ------------------------------------------------------------------ recording
@events.test_start.add_listener
def _on_test_start(environment: Environment, **_: Any) -> None:
    parsed = options(environment)
    now, now_pc = time.time(), time.perf_counter()
    _recording.window_start = now + parsed.warmup
    _recording.window_end = _recording.window_start + parsed.window if parsed.window > 0 else float("inf")
    _recording.window_pc = (now_pc + parsed.warmup, now_pc + parsed.warmup + (parsed.window or float("inf")))
    if _measures_server(environment) and parsed.server_stats and parsed.results_dir:
        _stats_greenlet.append(gevent.spawn(_server_stats, environment))
    if parsed.results_dir:
        _cpu_greenlet.append(gevent.spawn(_window_cpu))


def _window_cpu() -> None:
    """Read this process's CPU time when the window opens and when it closes."""
    start = _recording.window_start or time.time()
    gevent.sleep(max(0.0, start - time.time()))
    _recording.cpu_at_start, _recording.busy_at_start = process_cpu_s(), thread_busy_s()
    _recording.read_at_start = time.time()
    if _recording.window_end != float("inf"):
        gevent.sleep(max(0.0, _recording.window_end - time.time()))
        _recording.cpu_at_end, _recording.busy_at_end = process_cpu_s(), thread_busy_s()
        _recording.read_at_end = time.time()


@events.request.add_listener
def _on_request(
    response_time: float,
    exception: BaseException | None = None,
    context: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    ended = time.perf_counter()
    if exception is None:
        _recording.answered(response_time, ended, (context or {}).get("serial_s", math.nan))
        return
    _recording.errors_total += 1
    if _recording.inside(ended):
        _recording.tally.error(exception)


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_: Any) -> None:
    if _recording.stopped_at is None:
        _recording.stopped_at = time.time()
    parsed = options(environment)
    for greenlet in _stats_greenlet:
        # Its last read is due at the window's end, which the run time leaves room for.
        greenlet.join(timeout=15.0)
        if not greenlet.ready():
            logger.warning("Triton's statistics were not read in time; the step has none")
            greenlet.kill(block=False)
    _stats_greenlet.clear()
    for greenlet in _cpu_greenlet:
        greenlet.kill(block=False)
    _cpu_greenlet.clear()
    if not parsed.results_dir:
        return
    folder = Path(parsed.results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / cpu_file(os.getpid())).write_text(json.dumps(_recording.cpu_json()))
    if not _runs_users(environment):
        return
    if parsed.stream_start >= 0:
        np.save(folder / stream_file(os.getpid()), np.asarray(_stream_sent, dtype=np.int64))
    path = folder / latency_file(os.getpid())
    path.write_text(json.dumps(_recording.to_json()))
    logger.info(
        "%d requests (%d errors) in the window; raw latencies in %s",
        _recording.tally.ok,
        _recording.tally.errors,
        path,
    )


# ------------------------------------------------------------------ server statistics
def _server_stats(environment: Environment) -> None:
    """Read Triton's statistics at the window's start and end; write their difference."""
    parsed = options(environment)
    host = parsed.host or ""
    window_start = _recording.window_start or time.time()
    client = TritonClient(host, parsed.server_stats, timeout_s=10.0, retry=RetryPolicy(max_tries=2))
    try:
        gevent.sleep(max(0.0, window_start - time.time()))
        before = read_server(client, parsed.model, parsed.server_pid)
        if parsed.window > 0:
            gevent.sleep(max(0.0, _recording.window_end - time.time()))
        else:
            return
        after = read_server(client, parsed.model, parsed.server_pid)
    finally:
        client.close()
    record_server(Path(parsed.results_dir), parsed.model, before, after)
