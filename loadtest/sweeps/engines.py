"""The sweep's engines besides locust: perf_analyzer, Triton's own load tool and the reference,
and the bundle's closed-loop driver, each filling one :class:`~loadtest.sweeps.steps.StepResult`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Literal

import numpy as np

from bundle.errors import ConfigError
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.client_cpu import ClientCpu, process_cpu_s, process_demand, thread_busy_s
from loadtest.engine.driver import Connect, Driver
from loadtest.engine.payload import PayloadPool, request_form
from loadtest.engine.served import raw_connection, triton_requests
from loadtest.engine.server_cpu import listening_pid
from loadtest.engine.wire import http_body, http_header_length, serialised_request
from loadtest.sweeps import perf_analyzer
from loadtest.sweeps.perf_analyzer_install import require as require_perf_analyzer
from loadtest.sweeps.stepfiles import read_server, record_server, server_cpu_between, shared_cores
from loadtest.sweeps.steps import STEP_GRACE_S, ServerTimes, StepResult, SweepConfig, Target

logger = logging.getLogger(__name__)


def perf_analyzer_step(
    target: Target, model: str, config: SweepConfig, concurrency: int, payload: Path, folder: Path
) -> StepResult:
    """One step driven by perf_analyzer, its figures read from its own CSV and summary.

    Its input data are the sweep's rows (written once beside the payload); it runs its own
    stabilisation windows, a third of ``config.duration_s`` each, so that the three it reports
    cover the step's measured seconds like every other engine's (``config.warmup_s`` is not
    used: its first windows are its warm-up).
    """
    input_data, requests_of = perf_analyzer.input_data_for(payload, model, config.batch_size)
    # Its windows until three agree, at most MAX_TRIALS of them.
    window_s = perf_analyzer.window_for(config.duration_s)
    windows_s = (perf_analyzer.MAX_TRIALS + 1) * window_s
    # The server's CPU over the whole run (its windows are most of it), beside perf_analyzer's own.
    server_pid = listening_pid(target.url)
    before = read_server(None, model, server_pid)
    run = perf_analyzer.run_step(
        require_perf_analyzer(),
        target.url,
        target.protocol,
        model,
        requests_of,
        concurrency,
        window_s,
        input_data,
        folder,
        timeout_s=windows_s + config.request_timeout_s + STEP_GRACE_S,
        cpus=config.client_cpus,
    )
    after = read_server(None, model, server_pid)
    (folder / "perf_analyzer.json").write_text(json.dumps(perf_analyzer.describe(run)))
    figures, served = run.figures, run.figures.server
    # perf_analyzer counts inferences of its -b: for whole-request entries, requests.
    samples_per_s = figures.samples_per_s * config.batch_size / requests_of
    server = ServerTimes.from_perf_analyzer(served)
    rate = samples_per_s / config.batch_size
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
        samples_per_s=samples_per_s,
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
        bound_reason=run.cpu.reason(),
        client_serial_us=run.cpu.serial_us,
        samples_per_s_min=samples_per_s,
        samples_per_s_max=samples_per_s,
        round_rates=(samples_per_s,),
    ).beside_server(shared_cores(server_cpu_between(before, after), run.cpu.share, config.client_cpus))


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
    form = request_form(model)
    header_length = http_header_length(stream.rebatched(batch_size), form)

    def message(worker: int, sequence: int) -> bytes:
        row = (start + (worker + sequence * workers) * batch_size) % span
        first_rows.append(row)
        rows = stream.rows(row, row + batch_size, form)
        return serialised_request(model, rows) if protocol == "grpc" else http_body(rows, header_length)

    return raw_connection(url, protocol, model, header_length, config.request_timeout_s, batch_size, message)


def driver_step(
    target: Target, model: str, config: SweepConfig, concurrency: int, payload: Path, folder: Path
) -> StepResult:
    """One step driven by the closed-loop driver (:mod:`loadtest.engine.driver`), in this process:
    ``concurrency`` worker threads, ``config.warmup_s`` then one window of ``config.duration_s``.

    Its workers send on the socket senders (:func:`~loadtest.engine.served.raw_connection`). Its
    client CPU is this process's over the window (the sweep does nothing else meanwhile; the
    server is another process), its serial client time the senders' own measure.
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
    server_pid = listening_pid(target.url)
    allowed = None if config.client_cpus is None else len(config.client_cpus)
    affinity = os.sched_getaffinity(0)
    try:
        if config.client_cpus is not None:
            os.sched_setaffinity(0, config.client_cpus)  # the worker threads inherit it
        with Driver(connect, concurrency) as driver:
            driver.wait(config.warmup_s)
            before = read_server(stats, model, server_pid)
            cpu0, busy0, started = process_cpu_s(), thread_busy_s(), time.perf_counter()
            tally = driver.measure(config.duration_s)
            cpu1, busy1, seconds = process_cpu_s(), thread_busy_s(), time.perf_counter() - started
            after = read_server(stats, model, server_pid)
    finally:
        os.sched_setaffinity(0, affinity)
        stats.close()
    rows_sent = distinct_rows = 0
    if config.stream is not None:
        rows_sent, distinct_rows = config.stream.record(np.asarray(first_rows, np.int64), config.batch_size)
    demand = process_demand(busy0, busy1, seconds)
    cpu = ClientCpu.of_processes(
        [(cpu1 - cpu0, seconds, demand)], tally.requests, allowed, concurrency,
        serial_us=tally.serial_us, mean_ms=tally.histogram.mean_ms,
    )  # fmt: skip
    document = record_server(folder, model, before, after)
    server = ServerTimes.from_delta(document["delta"]) if document is not None else None
    rate = tally.ok / tally.seconds if tally.seconds > 0 else 0.0
    step = StepResult.of_tally(
        target, model, config.batch_size, concurrency, tally, rate, cpu, processes=1, server=server,
        engine="driver", rows_sent=rows_sent, distinct_rows=distinct_rows,
    )  # fmt: skip
    return step.beside_server(shared_cores(document, cpu.share, config.client_cpus))
