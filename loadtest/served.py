"""Served throughput of one model at one concurrency, on the closed-loop driver.

What the roofline and the CPU benchmarks measure through a server:
``concurrency`` workers (:class:`loadtest.driver.Driver`), each with its own
:class:`clients.triton.TritonClient`, keep that many requests of
``pool.batch_size`` rows in flight; after a warm-up, ``repeats`` windows of
``seconds`` each count the requests that complete inside them, and the
median window is the figure. The load runs on between windows, so each
window starts with the pipeline full.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bundle.errors import ClientError, ConfigError
from clients.options import Protocol
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.driver import Answer, Connect, Driver, Request
from loadtest.latency import merged_tallies
from loadtest.payload import PayloadPool


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
    url: str, protocol: Protocol, model: str, pool: PayloadPool, workers: int, timeout_s: float = 120.0
) -> Connect:
    """Each worker's connection: its own client, sending the pool's batches in turn.

    Worker ``i`` starts at batch ``i`` and steps by ``workers``, so requests in
    flight at one moment carry different rows. Requests are not retried and
    not checked against the model's metadata: the load measures the server.
    """

    @contextmanager
    def connect(worker: int) -> Iterator[Request]:
        batches = pool.batches()
        with TritonClient(url, protocol, timeout_s, retry=RetryPolicy(max_tries=1), validate=False) as client:

            def request(sequence: int) -> Answer:
                client.infer(model, batches[(worker + sequence * workers) % len(batches)])
                return Answer(pool.batch_size)

            yield request

    return connect


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
    if protocol not in ("grpc", "http"):
        raise ConfigError(f"protocol must be grpc or http, got {protocol!r}")
    if concurrency < 1 or repeats < 1 or seconds <= 0 or warmup_s < 0:
        raise ConfigError("concurrency and repeats must be >= 1, seconds > 0 and warmup_s >= 0")
    connect = triton_requests(url, protocol, model, pool, concurrency)  # type: ignore[arg-type]
    with Driver(connect, concurrency) as driver:
        driver.wait(warmup_s)
        windows = [driver.measure(seconds) for _ in range(repeats)]
    rates = [window.samples_per_s for window in windows]
    tally = merged_tallies(windows)
    if not tally.answered:
        raise ClientError(
            f"{model} at {url} answered no request in {repeats} x {seconds:g} s: {dict(tally.error_kinds)}"
        )
    return ServedResult(
        model=model,
        protocol=protocol,
        batch_size=pool.batch_size,
        concurrency=concurrency,
        samples_per_s=statistics.median(rates),
        repeats=tuple(rates),
        p50_ms=tally.histogram.percentile(50),
        p99_ms=tally.histogram.percentile(99),
        errors=tally.errors,
    )
