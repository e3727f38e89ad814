"""Served throughput of one model at one concurrency, on the closed-loop driver.

What the roofline and the CPU benchmarks measure through a server:
``concurrency`` workers (:class:`loadtest.engine.driver.Driver`), each with its own
:class:`clients.triton.TritonClient`, keep that many requests of
``pool.batch_size`` rows in flight; after a warm-up, ``repeats`` windows of
``seconds`` each count the requests that complete inside them, and the
median window is the figure. The load runs on between windows, so each
window starts with the pipeline full.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ClientError, ConfigError
from clients.options import Protocol, SharedMemory
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.driver import Answer, Connect, Driver, Request
from loadtest.engine.grpc_socket import GrpcSockets, SocketGrpcInfer
from loadtest.engine.latency import Tally, merged_tallies
from loadtest.engine.payload import PayloadPool, request_form
from loadtest.engine.wire import RawHttpInfer, http_bodies, http_header_length, serialised_requests


@dataclass(frozen=True)
class ServedResult:
    """Served throughput at one concurrency.

    Attributes:
        model: the served model.
        protocol: ``grpc`` or ``http``.
        batch_size: rows per request.
        concurrency: requests in flight.
        samples_per_s: median over the repeats.
        repeats: each repeat's samples/s.
        p50_ms, p99_ms: request latency over all repeats.
        errors: failed requests over all repeats (a failed request is not retried).
    """

    model: str
    protocol: str
    batch_size: int
    concurrency: int
    samples_per_s: float
    repeats: tuple[float, ...]
    p50_ms: float
    p99_ms: float
    errors: int = 0


def triton_requests(
    url: str,
    protocol: Protocol,
    model: str,
    pool: PayloadPool,
    workers: int,
    timeout_s: float = 120.0,
    shared_memory: SharedMemory = "none",
    first: int = 0,
    stride: int = 0,
) -> Connect:
    """Each worker's connection: its own client, sending the pool's batches in turn.

    Worker ``i`` starts at batch ``first + i`` and steps by ``stride`` (default
    ``workers``), so requests in flight at one moment carry different rows (with
    several client processes, each gets its own ``first`` and the total as
    ``stride``). Requests are not retried and not checked against the model's
    metadata: the load measures the server. Without shared memory, requests are serialised
    once and sent as bytes on the socket senders (:func:`raw_connection`: the least client work
    per request, as the sweep's locust users send them). ``shared_memory="system"`` puts each
    worker's inputs and output in its own registered region, through the bundle's client
    (tritonclient, over grpcio for gRPC): that path is what a user's own shared-memory client
    runs, and what such a load measures with the server.
    """
    step = stride or workers
    if shared_memory == "none":
        return _raw_requests(url, protocol, model, pool, timeout_s, first, step)

    @contextmanager
    def connect(worker: int) -> Iterator[Request]:
        batches = pool.batches(request_form(model))
        with TritonClient(
            url,
            protocol,
            timeout_s,
            shared_memory=shared_memory,
            retry=RetryPolicy(max_tries=1),
            validate=False,
        ) as client:

            def request(sequence: int) -> Answer:
                client.infer(model, batches[(first + worker + sequence * step) % len(batches)])
                return Answer(pool.batch_size)

            yield request

    return connect


def raw_connection(
    url: str,
    protocol: Protocol,
    model: str,
    header_length: int,
    timeout_s: float,
    rows: int,
    message: Callable[[int, int], bytes],
) -> Connect:
    """Each worker's own sender on a plain socket (:mod:`loadtest.engine.wire`): its request
    ``sequence`` sends ``message(worker, sequence)`` (a serialised ``ModelInferRequest``, or an
    HTTP body whose JSON header is ``header_length`` bytes), its answer checked to hold ``rows``
    scores and its serial client time in the :class:`Answer`; gRPC calls as HTTP/2 frames, a
    connection shared by up to :data:`~loadtest.engine.grpc_socket.SHARE` workers (as
    perf_analyzer's client shares a channel), HTTP on a keep-alive connection each."""
    sockets = GrpcSockets(url, timeout_s) if protocol == "grpc" else None

    @contextmanager
    def connect(worker: int) -> Iterator[Request]:
        infer: SocketGrpcInfer | RawHttpInfer = (
            sockets.open() if sockets is not None else RawHttpInfer(url, model, header_length, timeout_s)
        )
        try:

            def request(sequence: int) -> Answer:
                infer(message(worker, sequence), rows)
                return Answer(rows, serial_s=infer.serial_s)

            yield request
        finally:
            infer.close()

    return connect


def _raw_requests(
    url: str,
    protocol: Protocol,
    model: str,
    pool: PayloadPool,
    timeout_s: float,
    first: int,
    step: int,
) -> Connect:
    """Requests without tritonclient in the timed path: each batch serialised once, sent as bytes
    on the worker's own connection, its answer checked by length (:func:`raw_connection`)."""
    if protocol == "grpc":
        messages, header_length = serialised_requests(model, pool), 0
    else:
        form = request_form(model)
        messages, header_length = http_bodies(pool, form), http_header_length(pool, form)

    def message(worker: int, sequence: int) -> bytes:
        return messages[(first + worker + sequence * step) % len(messages)]

    return raw_connection(url, protocol, model, header_length, timeout_s, pool.batch_size, message)


def _check_load(protocol: str, concurrency: int, repeats: int, seconds: float, warmup_s: float) -> None:
    """Refuse a load that cannot be measured (either function below)."""
    if protocol not in ("grpc", "http"):
        raise ConfigError(f"protocol must be grpc or http, got {protocol!r}")
    if concurrency < 1 or repeats < 1 or seconds <= 0 or warmup_s < 0:
        raise ConfigError("concurrency and repeats must be >= 1, seconds > 0 and warmup_s >= 0")


def _result(
    url: str,
    model: str,
    protocol: str,
    batch_size: int,
    concurrency: int,
    rates: list[float],
    tally: Tally,
    seconds: float,
) -> ServedResult:
    """The median of the windows' ``rates``, and the latency and errors of their merged ``tally``."""
    if not tally.answered:
        raise ClientError(
            f"{model} at {url} answered no request in {len(rates)} x {seconds:g} s: {dict(tally.error_kinds)}"
        )
    return ServedResult(
        model=model,
        protocol=protocol,
        batch_size=batch_size,
        concurrency=concurrency,
        samples_per_s=statistics.median(rates),
        repeats=tuple(rates),
        p50_ms=tally.histogram.percentile(50),
        p99_ms=tally.histogram.percentile(99),
        errors=tally.errors,
    )


def served_throughput(
    url: str,
    model: str,
    pool: PayloadPool,
    concurrency: int,
    protocol: str = "grpc",
    seconds: float = 5.0,
    repeats: int = 3,
    warmup_s: float = 2.0,
) -> ServedResult:
    """Samples/s of ``model`` served at ``url``: ``concurrency`` requests of ``pool.batch_size`` rows
    always in flight, ``repeats`` windows of ``seconds`` after ``warmup_s``; the median window.

    A request counts when its answer arrives inside a window.
    """
    _check_load(protocol, concurrency, repeats, seconds, warmup_s)
    connect = triton_requests(url, protocol, model, pool, concurrency)  # type: ignore[arg-type]
    with Driver(connect, concurrency) as driver:
        driver.wait(warmup_s)
        windows = [driver.measure(seconds) for _ in range(repeats)]
    rates = [window.samples_per_s for window in windows]
    return _result(
        url, model, protocol, pool.batch_size, concurrency, rates, merged_tallies(windows), seconds
    )


def spread(concurrency: int, max_processes: int) -> tuple[int, int]:
    """``(processes, workers per process)`` for ``concurrency`` requests in flight: the most
    processes, at most ``max_processes``, that divide ``concurrency`` evenly."""
    if concurrency < 1 or max_processes < 1:
        raise ConfigError(
            f"concurrency and max_processes must be >= 1, got {concurrency} and {max_processes}"
        )
    processes = max(p for p in range(1, min(concurrency, max_processes) + 1) if concurrency % p == 0)
    return processes, concurrency // processes


@dataclass(frozen=True)
class _Job:
    """What one client process of :func:`served_throughput_processes` runs."""

    url: str
    protocol: str
    model: str
    pool: str
    workers: int
    first: int
    stride: int
    shared_memory: str
    warmup_s: float
    seconds: float
    repeats: int


def _client_process(job: _Job, barrier: Any, results: Any) -> None:
    """One client process: its workers load the server; after the barrier (every process's
    workers running), the warm-up, then ``repeats`` windows, sent back as tallies."""
    try:
        pool = PayloadPool.load(Path(job.pool))
        connect = triton_requests(
            job.url,
            job.protocol,  # type: ignore[arg-type]
            job.model,
            pool,
            job.workers,
            shared_memory=job.shared_memory,  # type: ignore[arg-type]
            first=job.first,
            stride=job.stride,
        )
        with Driver(connect, job.workers) as driver:
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
            driver.wait(job.warmup_s)
            windows = [driver.measure(job.seconds) for _ in range(job.repeats)]
        results.put(("ok", [window.to_json() for window in windows]))
    except BaseException as exc:  # reported to the parent, which raises it as one line
        with contextlib.suppress(Exception):
            barrier.abort()
        results.put(("error", f"{type(exc).__name__}: {exc}".splitlines()[0]))


#: Seconds every client process may take to start and reach the common start line.
BARRIER_TIMEOUT_S = 120.0


def served_throughput_processes(
    url: str,
    model: str,
    pool: PayloadPool,
    concurrency: int,
    workdir: Path,
    protocol: str = "grpc",
    shared_memory: SharedMemory = "none",
    max_processes: int = 8,
    seconds: float = 2.0,
    repeats: int = 3,
    warmup_s: float = 2.0,
) -> ServedResult:
    """:func:`served_throughput` from several client processes, for loads one Python process
    cannot send (a GPU serves more samples/s than one process's gRPC client sends; the
    figures: benchmarks/gpu/result.md).

    ``concurrency`` requests in flight are spread over at most ``max_processes``
    processes (:func:`spread`), each running the bundle's :class:`Driver` on its
    share. The processes start their windows together (a barrier, then the
    warm-up), so window ``k`` of every process covers the same seconds; a
    window's rate is the sum over processes, and the median window is the figure.
    """
    _check_load(protocol, concurrency, repeats, seconds, warmup_s)
    processes, workers = spread(concurrency, max_processes)
    pool_file = pool.save(workdir / f"pool-{pool.batch_size}.npz")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes)
    results = context.Queue()
    children = [
        context.Process(
            target=_client_process,
            args=(
                _Job(
                    url,
                    protocol,
                    model,
                    str(pool_file),
                    workers,
                    index * workers,
                    concurrency,
                    shared_memory,
                    warmup_s,
                    seconds,
                    repeats,
                ),
                barrier,
                results,
            ),
            daemon=True,
        )
        for index in range(processes)
    ]
    for child in children:
        child.start()
    limit_s = BARRIER_TIMEOUT_S + warmup_s + repeats * seconds + 60.0
    deadline = time.monotonic() + limit_s
    answers: list[tuple[str, Any]] = []
    try:
        while len(answers) < processes:
            try:
                answers.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
            except queue.Empty:
                raise ClientError(
                    f"{processes} client processes against {model} did not report within {limit_s:.0f} s"
                ) from None
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
                child.join()
    failures = [str(detail) for status, detail in answers if status != "ok"]
    if failures:
        raise ClientError(f"a client process against {model} failed: {failures[0]}")
    per_process = [[Tally.from_json(window) for window in detail] for _, detail in answers]
    rates = [sum(windows[k].samples_per_s for windows in per_process) for k in range(repeats)]
    tally = merged_tallies(window for windows in per_process for window in windows)
    return _result(url, model, protocol, pool.batch_size, concurrency, rates, tally, seconds)
