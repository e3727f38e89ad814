"""Concurrency sweeps: one load-generator run per step, results read back from its step folder.

Two engines drive a step: locust (the bundle's users, below) and perf_analyzer,
Triton's own load tool and the reference the locust figures are checked
against (:mod:`loadtest.sweeps.perf_analyzer`). Both record the same step:
rates, latency percentiles, Triton's view, and the load generator's own CPU
(:mod:`loadtest.engine.client_cpu`), which marks a step client-bound.

One step is one ``(target, model, batch size, concurrency)``: ``concurrency``
closed-loop users (so that many requests in flight), in one locust process
or several (``--processes``) where one process's CPU would cap the load.
Each step runs as its own ``locust`` subprocess for ``warmup + duration``
seconds; every process that ran users writes its raw latencies and counts
of the measurement window, and the master writes the difference of Triton's
statistics over that window (:mod:`loadtest.sweeps.recorder`). This module never
imports locust, which would monkey-patch this process with gevent.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

import loadtest
from bundle.errors import BundleError, ConfigError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.client_cpu import ClientCpu, process_cpu_s, process_demand, thread_busy_s
from loadtest.engine.driver import Answer, Connect, Driver
from loadtest.engine.latency import PERCENTILES, Tally, merged_tallies
from loadtest.engine.payload import MAX_POOL_ROWS, PayloadPool, build_pool, build_stream
from loadtest.engine.served import triton_requests
from loadtest.engine.wire import RawGrpcInfer, RawHttpInfer, http_body, http_header_length, serialised_request
from loadtest.sweeps import perf_analyzer
from loadtest.sweeps.perf_analyzer_install import require as require_perf_analyzer
from loadtest.sweeps.stepfiles import (
    CPU_GLOB,
    LATENCY_GLOB,
    LOCUST_LOG,
    SERVER_COUNTERS,
    SERVER_STATS_FILE,
    STREAM_GLOB,
)

logger = logging.getLogger(__name__)

REPO_ROOT = Path(loadtest.__file__).resolve().parent.parent
#: The locustfile and user class of each protocol.
USERS: dict[str, tuple[Path, str]] = {
    "grpc": (REPO_ROOT / "loadtest" / "sweeps" / "locustfile.py", "GrpcTritonUser"),
    "http": (REPO_ROOT / "loadtest" / "sweeps" / "locustfile.py", "HttpTritonUser"),
    "fastapi": (REPO_ROOT / "loadtest" / "sweeps" / "peers" / "locustfile.py", "FastApiUser"),
}
TRITON_PROTOCOLS = ("grpc", "http")
#: What generates a step's load: the bundle's locust users, Triton's perf_analyzer, or the
#: bundle's closed-loop driver (threads in this process; what tune and the benchmarks run on).
ENGINES = ("locust", "perf_analyzer", "driver")
#: Extra seconds locust runs after the window closes, so the window is never cut short.
_TAIL_S = 1.0
#: How long a step may take beyond its run time (start-up, shutdown) before it is killed.
_STEP_GRACE_S = 60.0
#: Concurrency one locust process drives at most when processes are picked automatically.
USERS_PER_PROCESS = 8


def parse_cpus(text: str) -> frozenset[int]:
    """``"1"``, ``"0,2"`` or ``"2-3"`` -> the cores named, each one this process may use."""
    cores: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ConfigError(f"--client-cpus must be cores like 1 or 0,2 or 2-3, got {text!r}") from None
    allowed = os.sched_getaffinity(0)
    if not cores or not cores <= allowed:
        raise ConfigError(f"--client-cpus {text!r} names no core or a core outside {sorted(allowed)}")
    return frozenset(cores)


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; each value >= 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise ConfigError(f"{what} must be integers >= 1, got {text!r}")
    return values


@dataclass(frozen=True)
class Target:
    """A server the load goes to.

    Args:
        url: ``host:port`` of its endpoint for ``protocol`` (loopback only).
        protocol: ``grpc`` or ``http`` (Triton's endpoints) or ``fastapi`` (the FastAPI peer).
        label: the name reports give it, e.g. ``triton``, ``pytriton``, ``fastapi``.
        server_stats: read Triton's statistics API around each step (Triton protocols only).
        engine: the load generator, one of :data:`ENGINES`.
    """

    url: str
    protocol: str = "grpc"
    label: str = "triton"
    server_stats: bool = True
    engine: str = "locust"

    def __post_init__(self) -> None:
        if self.protocol not in USERS:
            raise ConfigError(f"unknown protocol {self.protocol!r}; choose one of {', '.join(USERS)}")
        host, _, port = self.url.rpartition(":")
        if not host or not port.isdigit() or "://" in self.url:
            raise ConfigError(f"url must be 'host:port' without a scheme, got {self.url!r}")
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]") and not host.startswith("127."):
            raise ConfigError(f"load tests send requests to this machine only (loopback), got host {host!r}")
        if self.server_stats and self.protocol not in TRITON_PROTOCOLS:
            raise ConfigError(f"server statistics need a Triton protocol, not {self.protocol!r}")
        if not self.label:
            raise ConfigError("label must not be empty")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.engine != "locust" and self.protocol not in TRITON_PROTOCOLS:
            raise ConfigError(f"{self.engine} speaks Triton's protocols only, not {self.protocol!r}")


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep.

    Args:
        models: model names, each swept in turn.
        batch_size: rows per request ``B``.
        concurrency: requests in flight per step (closed-loop users), ascending.
        duration_s: seconds measured per step.
        warmup_s: seconds run before the measurement window of each step.
        processes: locust processes per step (0: automatic, one per
            :data:`USERS_PER_PROCESS` users, at most the number of cores).
        request_timeout_s: a request slower than this fails.
        client_cpus: the cores the load generator may run on (None: any), e.g. cores the
            server does not use.
        stream: a streamed run's cursor (None: the steps cycle a pool).
    """

    models: tuple[str, ...]
    batch_size: int
    concurrency: tuple[int, ...]
    duration_s: float = 10.0
    warmup_s: float = 2.0
    processes: int = 0
    request_timeout_s: float = 60.0
    client_cpus: frozenset[int] | None = None
    stream: StreamCursor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "concurrency", tuple(self.concurrency))
        if not self.models or not all(self.models):
            raise ConfigError("name at least one model")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ConfigError(f"concurrency must be integers >= 1, got {self.concurrency}")
        if not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s}")
        if self.warmup_s < 0:
            raise ConfigError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if self.processes < 0:
            raise ConfigError(f"processes must be >= 0 (0: automatic), got {self.processes}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")

    def processes_for(self, concurrency: int, protocol: str = "http") -> int:
        """locust processes for a step of ``concurrency`` users over ``protocol``.

        gRPC: one user per process, whose calls block it (``--grpc-blocking``): gRPC on
        gevent's loop costs the client about 3x the CPU per request (measured, locust 2.47 and
        grpcio under gevent, batch 1: 490 us against 140 us).
        """
        if protocol == "grpc":
            return concurrency
        if self.processes:
            return min(self.processes, concurrency)
        return max(1, min(os.cpu_count() or 1, math.ceil(concurrency / USERS_PER_PROCESS)))

    @property
    def step_seconds(self) -> float:
        """Wall time of one step, start-up excluded."""
        return self.warmup_s + self.duration_s + _TAIL_S


@dataclass(frozen=True)
class ServerTimes:
    """Triton's own view of a step, from its statistics API (difference over the window).

    Attributes:
        requests: successful requests the server counted.
        executions: model executions (dynamic batches).
        queue_ms, compute_input_ms, compute_infer_ms, compute_output_ms: mean time per request
            in each phase (a request shares its batch's compute time).
        request_ms: mean time per request inside the server, arrival to response.
        batch: mean rows per execution (what the dynamic batcher formed).
    """

    requests: int
    executions: int
    queue_ms: float
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float
    request_ms: float
    batch: float

    @classmethod
    def from_delta(cls, delta: dict[str, int]) -> ServerTimes:
        count = delta.get("success_count", 0)

        def mean(key: str) -> float:
            return delta.get(key, 0) / count / 1e6 if count else math.nan

        executions = delta.get("execution_count", 0)
        return cls(
            requests=count,
            executions=executions,
            queue_ms=mean("queue_ns"),
            compute_input_ms=mean("compute_input_ns"),
            compute_infer_ms=mean("compute_infer_ns"),
            compute_output_ms=mean("compute_output_ns"),
            request_ms=mean("success_ns"),
            batch=delta.get("inference_count", 0) / executions if executions else math.nan,
        )


@dataclass(frozen=True)
class StepResult:
    """One step's measurements.

    Attributes:
        label, model, protocol: what was loaded (target name, model, wire protocol).
        batch_size: rows per request.
        concurrency: requests in flight (users).
        processes: locust processes that ran the users.
        seconds: length of the measurement window.
        requests: successful requests completed in the window.
        errors: failed requests completed in the window.
        requests_per_s: ``requests / seconds``.
        samples_per_s: ``requests_per_s * batch_size``.
        p50_ms, p90_ms, p95_ms, p99_ms, mean_ms, max_ms: client-side latency of the
            successful requests (whole call, sub-millisecond resolution).
        server: Triton's statistics over the window (None: not a Triton target, or unavailable).
        errors_total: failed requests of the whole step, warm-up included.
        error_kinds: the most frequent error messages.
        engine: the load generator (:data:`ENGINES`).
        client_cpu_us: the load generator's CPU microseconds per request (all its processes).
        client_cores: cores it used on average over the window, all processes together.
        client_demand: core-seconds per second the load generator's processes were running or
            waiting for a CPU, all together.
        client_bound: whether the load generator, not the server, limited the step
            (:mod:`loadtest.engine.client_cpu`).
        rows_sent: rows the step sent from a stream, warm-up included (0: it cycled a pool).
        distinct_rows: how many of them were distinct (fewer once the stream wrapped).
        rounds: repeats of the step that its figures are the median of.
        samples_per_s_min, samples_per_s_max: the lowest and highest rate over those repeats.
    """

    label: str
    model: str
    protocol: str
    batch_size: int
    concurrency: int
    processes: int
    seconds: float
    requests: int
    errors: int
    requests_per_s: float
    samples_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    server: ServerTimes | None = None
    errors_total: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    engine: str = "locust"
    client_cpu_us: float = math.nan
    client_cores: float = math.nan
    client_demand: float = math.nan
    client_bound: bool = False
    rows_sent: int = 0
    distinct_rows: int = 0
    rounds: int = 1
    samples_per_s_min: float = math.nan
    samples_per_s_max: float = math.nan

    @property
    def series(self) -> str:
        """The curve this step belongs to: ``label model protocol B=..`` (and the engine, if not locust)."""
        engine = "" if self.engine == "locust" else f" [{self.engine}]"
        return f"{self.label} {self.model} {self.protocol} B={self.batch_size}{engine}"

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the rate over the step's repeats (0 for one repeat)."""
        if self.rounds < 2 or not self.samples_per_s > 0:
            return 0.0
        return (self.samples_per_s_max - self.samples_per_s_min) / self.samples_per_s

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (server statistics nested)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        """Read what :meth:`as_dict` produced (e.g. from a report's JSON)."""
        values = dict(data)
        server = values.pop("server", None)
        return cls(server=ServerTimes(**server) if server else None, **values)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def collect_step(
    folder: Path,
    target: Target,
    model: str,
    batch_size: int,
    concurrency: int,
    processes: int,
    window_s: float,
    allowed: int | None = None,
) -> StepResult:
    """Read a step folder written by the locust processes into one :class:`StepResult`.

    Requests per second add up over processes, each over the part of the
    window it ran (the whole window, unless it stopped early).

    Raises:
        BundleError: no process wrote its results.
    """
    files = sorted(folder.glob(LATENCY_GLOB))
    if not files:
        raise BundleError(f"no latency results in {folder}: see {folder / LOCUST_LOG}")
    # The processes ran side by side over one window: their rates add up, each over the part
    # of the window it covered; their latencies and counts merge.
    documents = [json.loads(path.read_text()) for path in files]
    tallies = [Tally.from_json(document["tally"]) for document in documents]
    errors_total = sum(int(document["errors_total"]) for document in documents)
    rate = sum(t.ok / (t.seconds or window_s) for t in tallies)
    covered = [t.seconds or window_s for t in tallies]
    tally = merged_tallies(tallies)
    histogram = tally.histogram
    p50, p90, p95, p99 = (histogram.percentile(q) for q in PERCENTILES)
    server = None
    stats_path = folder / SERVER_STATS_FILE
    if stats_path.is_file():
        server = ServerTimes.from_delta(json.loads(stats_path.read_text())["delta"])
    cpu_documents = [json.loads(path.read_text()) for path in sorted(folder.glob(CPU_GLOB))]
    cpu = ClientCpu.of_processes(
        [
            (float(d["cpu_s"]), float(d["seconds"]), _number(d.get("process_demand")))
            for d in cpu_documents
            if d.get("cpu_s") is not None
        ],
        tally.ok + tally.errors,
        allowed,
        concurrency,
    )
    return StepResult(
        label=target.label,
        model=model,
        protocol=target.protocol,
        batch_size=batch_size,
        concurrency=concurrency,
        processes=processes,
        seconds=sum(covered) / len(covered),
        requests=tally.ok,
        errors=tally.errors,
        requests_per_s=rate,
        samples_per_s=rate * batch_size,
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=histogram.mean_ms,
        max_ms=histogram.max_ms if histogram.count else math.nan,
        server=server,
        errors_total=errors_total,
        error_kinds=dict(tally.error_kinds.most_common(5)),
        client_cpu_us=cpu.per_request_us,
        client_cores=cpu.share,
        client_demand=cpu.total_demand,
        client_bound=cpu.bound,
        samples_per_s_min=rate * batch_size,
        samples_per_s_max=rate * batch_size,
    )


def perf_analyzer_step(
    target: Target, model: str, config: SweepConfig, concurrency: int, payload: Path, folder: Path
) -> StepResult:
    """One step driven by perf_analyzer, its figures read from its own CSV and summary.

    Its input data are the sweep's rows (written once beside the payload); it runs its own
    stabilisation windows of ``config.duration_s`` each (``config.warmup_s`` is not used: its
    first windows are its warm-up).
    """
    input_data = payload.with_name("perf_analyzer-input.json")
    if not input_data.is_file():
        perf_analyzer.write_input_data(PayloadPool.load(payload), input_data)
    # Its windows until three agree, at most MAX_TRIALS of them.
    windows_s = (perf_analyzer.MAX_TRIALS + 1) * config.duration_s
    run = perf_analyzer.run_step(
        require_perf_analyzer(),
        target.url,
        target.protocol,
        model,
        config.batch_size,
        concurrency,
        config.duration_s,
        input_data,
        folder,
        timeout_s=windows_s + config.request_timeout_s + _STEP_GRACE_S,
        cpus=config.client_cpus,
    )
    (folder / "perf_analyzer.json").write_text(json.dumps(perf_analyzer.describe(run)))
    figures, served = run.figures, run.figures.server
    server = None
    if served.get("success_count"):
        count = served["success_count"]
        executions = served.get("execution_count", 0.0)
        server = ServerTimes(
            requests=int(count),
            executions=int(executions),
            queue_ms=served.get("queue", math.nan),
            compute_input_ms=served.get("input", math.nan),
            compute_infer_ms=served.get("infer", math.nan),
            compute_output_ms=served.get("output", math.nan),
            request_ms=served.get("request", math.nan),
            batch=served.get("inference_count", 0.0) / executions if executions else math.nan,
        )
    rate = figures.samples_per_s / config.batch_size
    return StepResult(
        label=target.label,
        model=model,
        protocol=target.protocol,
        batch_size=config.batch_size,
        concurrency=concurrency,
        processes=1,
        seconds=figures.requests / rate if rate > 0 else 0.0,
        requests=figures.requests,
        errors=0,
        requests_per_s=rate,
        samples_per_s=figures.samples_per_s,
        p50_ms=figures.p50_ms,
        p90_ms=figures.p90_ms,
        p95_ms=figures.p95_ms,
        p99_ms=figures.p99_ms,
        mean_ms=figures.mean_ms,
        max_ms=math.nan,
        server=server,
        engine="perf_analyzer",
        client_cpu_us=run.cpu.per_request_us,
        client_cores=run.cpu.share,
        client_demand=run.cpu.total_demand,
        client_bound=run.cpu.bound,
        samples_per_s_min=figures.samples_per_s,
        samples_per_s_max=figures.samples_per_s,
    )


def _server_counters(client: TritonClient, model: str) -> dict[str, int] | None:
    try:
        stats = client.statistics(model)
    except BundleError as exc:
        logger.warning("could not read Triton's statistics of %s: %s", model, exc)
        return None
    return {key: int(getattr(stats[0], key)) for key in SERVER_COUNTERS} if stats else None


def _streamed_requests(
    url: str,
    protocol: Literal["grpc", "http"],
    model: str,
    payload: Path,
    config: SweepConfig,
    workers: int,
    first_rows: list[int],
) -> Connect:
    """The driver's requests of a streamed step: worker ``w``'s ``k``-th request takes the stream's
    batch ``w + k * workers`` after the cursor, built when it is sent; each first row is recorded
    into ``first_rows`` (the stream wraps past its end)."""
    stream = PayloadPool.load(payload)
    cursor, batch_size = config.stream, config.batch_size
    if cursor is None:
        raise ConfigError("a streamed step needs the run's stream cursor")
    start, span = cursor.next_row, max(1, len(stream.dense) - batch_size + 1)
    header_length = http_header_length(stream.rebatched(batch_size))

    @contextmanager
    def connect(worker: int) -> Iterator[Callable[[int], Answer]]:
        infer: RawGrpcInfer | RawHttpInfer
        if protocol == "grpc":
            infer = RawGrpcInfer(url, config.request_timeout_s)
        else:
            infer = RawHttpInfer(url, model, header_length, config.request_timeout_s)
        try:

            def request(sequence: int) -> Answer:
                row = (start + (worker + sequence * workers) * batch_size) % span
                first_rows.append(row)
                rows = {
                    DENSE_INPUT: stream.dense[row : row + batch_size],
                    CATEGORICAL_INPUT: stream.categorical[row : row + batch_size],
                }
                infer(serialised_request(model, rows) if protocol == "grpc" else http_body(rows), batch_size)
                return Answer(batch_size)

            yield request
        finally:
            infer.close()

    return connect


def driver_step(
    target: Target, model: str, config: SweepConfig, concurrency: int, payload: Path, folder: Path
) -> StepResult:
    """One step driven by the closed-loop driver (:mod:`loadtest.engine.driver`), in this process:
    ``concurrency`` worker threads, ``config.warmup_s`` then one window of ``config.duration_s``.

    Its client CPU is this process's over the window (the sweep does nothing else meanwhile;
    the server is another process).
    """
    wire: Literal["grpc", "http"] = "grpc" if target.protocol == "grpc" else "http"
    first_rows: list[int] = []
    if config.stream is not None:
        connect = _streamed_requests(target.url, wire, model, payload, config, concurrency, first_rows)
    else:
        pool = PayloadPool.load(payload).rebatched(config.batch_size)
        connect = triton_requests(
            target.url, wire, model, pool, concurrency, timeout_s=config.request_timeout_s
        )
    stats = TritonClient(target.url, wire, timeout_s=10.0, retry=RetryPolicy(max_tries=2))
    allowed = None if config.client_cpus is None else len(config.client_cpus)
    affinity = os.sched_getaffinity(0)
    try:
        if config.client_cpus is not None:
            os.sched_setaffinity(0, config.client_cpus)  # the worker threads inherit it
        with Driver(connect, concurrency) as driver:
            driver.wait(config.warmup_s)
            before = _server_counters(stats, model)
            cpu0, busy0, started = process_cpu_s(), thread_busy_s(), time.perf_counter()
            tally = driver.measure(config.duration_s)
            cpu1, busy1, seconds = process_cpu_s(), thread_busy_s(), time.perf_counter() - started
            after = _server_counters(stats, model)
    finally:
        os.sched_setaffinity(0, affinity)
        stats.close()
    rows_sent = distinct_rows = 0
    if config.stream is not None:
        rows_sent, distinct_rows = config.stream.record(np.asarray(first_rows, np.int64), config.batch_size)
    demand = process_demand(busy0, busy1, seconds)
    cpu = ClientCpu.of_processes([(cpu1 - cpu0, seconds, demand)], tally.requests, allowed, concurrency)
    server = None
    if before is not None and after is not None:
        delta = {key: after[key] - before[key] for key in SERVER_COUNTERS}
        (folder / SERVER_STATS_FILE).write_text(json.dumps({"model": model, "delta": delta}))
        server = ServerTimes.from_delta(delta)
    histogram = tally.histogram
    p50, p90, p95, p99 = (histogram.percentile(q) for q in PERCENTILES)
    rate = tally.ok / tally.seconds if tally.seconds > 0 else 0.0
    return StepResult(
        label=target.label,
        model=model,
        protocol=target.protocol,
        batch_size=config.batch_size,
        concurrency=concurrency,
        processes=1,
        seconds=tally.seconds,
        requests=tally.ok,
        errors=tally.errors,
        requests_per_s=rate,
        samples_per_s=rate * config.batch_size,
        p50_ms=p50,
        p90_ms=p90,
        p95_ms=p95,
        p99_ms=p99,
        mean_ms=histogram.mean_ms,
        max_ms=histogram.max_ms if histogram.count else math.nan,
        server=server,
        errors_total=tally.errors,
        error_kinds=dict(tally.error_kinds.most_common(5)),
        engine="driver",
        rows_sent=rows_sent,
        distinct_rows=distinct_rows,
        client_cpu_us=cpu.per_request_us,
        client_cores=cpu.share,
        client_demand=cpu.total_demand,
        client_bound=cpu.bound,
        samples_per_s_min=rate * config.batch_size,
        samples_per_s_max=rate * config.batch_size,
    )


def locust_command(
    target: Target,
    model: str,
    config: SweepConfig,
    concurrency: int,
    payload: Path,
    folder: Path,
) -> list[str]:
    """The locust command line of one step.

    Paths are made absolute: locust runs with the repository root as its working
    directory (so its locustfile imports the bundle), wherever ``--out`` points.
    """
    payload, folder = payload.resolve(), folder.resolve()
    locustfile, user_class = USERS[target.protocol]
    processes = config.processes_for(concurrency, target.protocol)
    command = [
        sys.executable, "-m", "locust", "-f", str(locustfile), user_class,
        "--headless", "--users", str(concurrency), "--spawn-rate", str(concurrency),
        # Let each user finish the request it has in flight when the step ends: tritonserver 2.51
        # (the local server) can crash when a gRPC client cancels an in-flight request
        # (triton-inference-server/server#7368, fixed in 2.53).
        "--run-time", f"{math.ceil(config.step_seconds)}s",
        "--stop-timeout", f"{math.ceil(config.request_timeout_s)}",
        "--host", target.url, "--model", model, "--batch-size", str(config.batch_size),
        "--payload", str(payload), "--results-dir", str(folder),
        "--warmup", f"{config.warmup_s:g}", "--window", f"{config.duration_s:g}",
        "--request-timeout", f"{config.request_timeout_s:g}",
        "--exit-code-on-error", "0", "--only-summary", "--loglevel", "WARNING",
        "--csv", str(folder / "locust"),
    ]  # fmt: skip
    if target.server_stats:
        command += ["--server-stats", target.protocol]
    if target.protocol == "grpc":
        command += ["--grpc-blocking"]
    if config.stream is not None:
        command += ["--stream-start", str(config.stream.next_row), "--stream-stride", str(processes)]
    if processes > 1:
        command += ["--processes", str(processes)]
    return command


def median_step(rounds: Sequence[StepResult]) -> StepResult:
    """One step from several rounds of the same (server, model, protocol, batch, concurrency, engine):
    rates, percentiles, means, client CPU and Triton's times are the median over the rounds;
    ``requests``, ``errors`` and ``seconds`` add up, ``max_ms`` is the largest, the rate's lowest
    and highest are kept (the spread), and the step is client-bound when at least half of its
    rounds were. One round is returned as is."""
    if not rounds:
        raise ValueError("no rounds to combine")
    first = rounds[0]
    if len(rounds) == 1:
        return first
    keys = {(r.label, r.model, r.protocol, r.batch_size, r.concurrency, r.engine) for r in rounds}
    if len(keys) > 1:
        raise ValueError(f"rounds of different steps: {sorted(keys)}")

    def median(name: str, items: Sequence[Any]) -> float:
        return float(statistics.median(getattr(item, name) for item in items))

    server = None
    timed = [r.server for r in rounds if r.server is not None]
    if timed:
        server = ServerTimes(
            requests=sum(t.requests for t in timed),
            executions=sum(t.executions for t in timed),
            queue_ms=median("queue_ms", timed),
            compute_input_ms=median("compute_input_ms", timed),
            compute_infer_ms=median("compute_infer_ms", timed),
            compute_output_ms=median("compute_output_ms", timed),
            request_ms=median("request_ms", timed),
            batch=median("batch", timed),
        )
    kinds: dict[str, int] = {}
    for r in rounds:
        for kind, count in r.error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
    return replace(
        first,
        processes=max(r.processes for r in rounds),
        seconds=sum(r.seconds for r in rounds),
        requests=sum(r.requests for r in rounds),
        errors=sum(r.errors for r in rounds),
        requests_per_s=median("requests_per_s", rounds),
        samples_per_s=median("samples_per_s", rounds),
        p50_ms=median("p50_ms", rounds),
        p90_ms=median("p90_ms", rounds),
        p95_ms=median("p95_ms", rounds),
        p99_ms=median("p99_ms", rounds),
        mean_ms=median("mean_ms", rounds),
        max_ms=max(r.max_ms for r in rounds),
        server=server,
        errors_total=sum(r.errors_total for r in rounds),
        error_kinds=kinds,
        client_cpu_us=median("client_cpu_us", rounds),
        client_cores=median("client_cores", rounds),
        client_demand=median("client_demand", rounds),
        # Bound when at least half of the repeats were: the median repeat's verdict.
        client_bound=2 * sum(r.client_bound for r in rounds) >= len(rounds),
        rounds=sum(r.rounds for r in rounds),
        samples_per_s_min=min(r.samples_per_s_min for r in rounds),
        samples_per_s_max=max(r.samples_per_s_max for r in rounds),
    )


def _environment() -> dict[str, str]:
    env = os.environ.copy()
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    # gRPC's poll() poller costs a blocking client less CPU per call than its default epoll1
    # (measured: 181 against 248 us per batch-1 request, grpcio 1.x, one channel per process).
    env.setdefault("GRPC_POLL_STRATEGY", "poll")
    return env


def run_locust(
    command: Sequence[str], folder: Path, timeout_s: float, cpus: frozenset[int] | None = None
) -> None:
    """Run one locust step; its output goes to ``folder/locust.log``.

    The process gets its own process group: a step that overruns ``timeout_s``
    is killed with every worker it forked, by that group's id (its pid). With
    ``cpus``, it and every worker it forks run on those cores only.

    Raises:
        BundleError: locust exited non-zero or overran its time.
    """
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / LOCUST_LOG
    with open(log_path, "wb") as log:
        log.write(f"# {shlex.join(command)}\n".encode())
        log.flush()
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_environment(),
            cwd=REPO_ROOT,
            start_new_session=True,
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise BundleError(f"locust overran {timeout_s:.0f} s and was killed (log: {log_path})") from None
        except BaseException:
            # Ctrl-C or an error here: take the whole step down with us.
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    if code != 0:
        raise BundleError(f"locust exited with code {code} (log: {log_path}): {shlex.join(command)}")


def make_payload(out: Path, data: Path | None, stream: bool = False) -> Path:
    """Build the rows every step sends (once) and write them to ``out/payload.npz``: a pool of at
    most :data:`MAX_POOL_ROWS` rows, cycled; or with ``stream``, every row of ``data`` in order."""
    if stream and data is None:
        raise ConfigError("--stream sends the rows of a file: give --data FILE")
    if stream and data is not None:
        return build_stream(data).save(out / "payload.npz")
    return build_pool(1, data=data, batches=MAX_POOL_ROWS).save(out / "payload.npz")


@dataclass
class StreamCursor:
    """Where a streamed run is in its rows, and which rows it has sent.

    Attributes:
        rows: rows in the stream.
        next_row: the first row the next step starts at.
        seen: whether each row has been sent (so repeats, once the stream wraps, are counted).
        sent: rows sent over the run, repeats included.
    """

    rows: int
    next_row: int = 0
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    sent: int = 0

    def __post_init__(self) -> None:
        if not len(self.seen):
            self.seen = np.zeros(self.rows, dtype=bool)

    def record(self, first_rows: np.ndarray, batch_size: int) -> tuple[int, int]:
        """Record requests whose first rows are ``first_rows``; the step's rows sent and distinct."""
        if not len(first_rows):
            return 0, 0
        rows = (first_rows[:, None] + np.arange(batch_size)[None, :]).ravel() % self.rows
        self.seen[rows] = True
        self.sent += rows.size
        self.next_row = (int(first_rows.max()) + batch_size) % self.rows
        return int(rows.size), int(np.unique(rows).size)

    @property
    def distinct(self) -> int:
        """Rows sent at least once over the run."""
        return int(self.seen.sum())


def step_folder(out: Path, target: Target, model: str, batch_size: int, concurrency: int) -> Path:
    """Where one step's raw results go."""
    engine = "" if target.engine == "locust" else f"-{target.engine}"
    return out / "steps" / f"{target.label}-{model}-{target.protocol}{engine}-b{batch_size}-c{concurrency}"


def run_step(
    target: Target, model: str, config: SweepConfig, concurrency: int, payload: Path, folder: Path
) -> StepResult:
    """One step of ``target``'s engine; its raw files go to ``folder`` (emptied first)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*"):
        stale.unlink()
    if target.engine == "perf_analyzer":
        if config.stream is not None:
            raise ConfigError("perf_analyzer cycles its input data: --stream needs --engine locust or driver")
        return perf_analyzer_step(target, model, config, concurrency, payload, folder)
    if target.engine == "driver":
        return driver_step(target, model, config, concurrency, payload, folder)
    command = locust_command(target, model, config, concurrency, payload, folder)
    logger.debug("step: %s", shlex.join(command))
    run_locust(
        command, folder, config.step_seconds + config.request_timeout_s + _STEP_GRACE_S, config.client_cpus
    )
    step = collect_step(
        folder,
        target,
        model,
        config.batch_size,
        concurrency,
        config.processes_for(concurrency, target.protocol),
        config.duration_s,
        None if config.client_cpus is None else len(config.client_cpus),
    )
    if config.stream is None:
        return step
    files = sorted(folder.glob(STREAM_GLOB))
    first_rows = np.concatenate([np.load(path) for path in files]) if files else np.zeros(0, np.int64)
    sent, distinct = config.stream.record(first_rows, config.batch_size)
    return replace(step, rows_sent=sent, distinct_rows=distinct)


def run_sweep(
    target: Target,
    config: SweepConfig,
    out: Path,
    payload: Path,
    on_step: Callable[[StepResult], None] | None = None,
) -> list[StepResult]:
    """Run every step of ``config`` against ``target``, model after model, concurrency ascending.

    Args:
        target: the server and protocol.
        config: models, batch size, concurrency levels, durations.
        out: the sweep folder; each step's raw files go to ``out/steps/<step>/``.
        payload: the ``.npz`` pool every step sends (:func:`make_payload`).
        on_step: called after each step (progress).

    Returns:
        One result per step, in run order.
    """
    results = []
    for model in config.models:
        for concurrency in config.concurrency:
            folder = step_folder(out, target, model, config.batch_size, concurrency)
            started = time.perf_counter()
            result = run_step(target, model, config, concurrency, payload, folder)
            logger.debug("step done in %.1f s", time.perf_counter() - started)
            results.append(result)
            if on_step is not None:
                on_step(result)
    return results
