"""perf_analyzer as a sweep engine: one process per step, its own CSV read back into a step.

``python -m loadtest sweep --engine perf_analyzer`` runs each step as
``perf_analyzer --concurrency-range C:C``, with the sweep's rows as its input
data, and reads the step's figures from perf_analyzer's own ``-f`` CSV and
summary; nothing is re-measured here. Two figures it does not print come
from outside it, the same way for every engine: its CPU time (the child's
rusage) and the requests it sent over its whole run (Triton's statistics of
the model before and after), whose ratio is the client CPU per request.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import resource
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bundle.errors import BundleError, DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, RAW_ROWS_INPUT
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.client_cpu import ClientCpu, process_demand, thread_busy_s
from loadtest.engine.payload import PayloadPool, RequestForm, request_form, saved_bags
from loadtest.sweeps.stepfiles import server_counters

#: Rows written into perf_analyzer's input data (it builds each batch from consecutive rows).
INPUT_ROWS = 4096
#: perf_analyzer's stability rule: three windows within this percentage (its default, 10, rarely
#: settles on a shared 2-core machine, and an unsettled step has no result at all).
STABILITY_PERCENT = 25
MAX_TRIALS = 10
#: The windows perf_analyzer reports on: the last three, merged, once they agree.
REPORTED_WINDOWS = 3
STEP_CSV = "perf_analyzer.csv"
STEP_LOG = "perf_analyzer.log"
#: What perf_analyzer prints when its windows never agree (and it writes no CSV row).
UNSTABLE = "Failed to obtain stable measurement"
_SERVER_LINE = re.compile(
    r"Avg request latency: (?P<request>[\d.]+) usec \(overhead [\d.]+ usec \+ queue (?P<queue>[\d.]+) usec"
    r" \+ compute input (?P<input>[\d.]+) usec \+ compute infer (?P<infer>[\d.]+) usec"
    r" \+ compute output (?P<output>[\d.]+) usec\)"
)


def window_for(measured_s: float) -> float:
    """perf_analyzer's window for a step measured over ``measured_s`` seconds: it reports its last
    :data:`REPORTED_WINDOWS` windows merged, so they together cover the same time as the other
    engines' measurement (with a window of ``measured_s`` it would average three times as long,
    and smooth out what they see)."""
    return measured_s / REPORTED_WINDOWS


def write_input_data(
    pool: PayloadPool, path: Path, rows: int = INPUT_ROWS, form: RequestForm = "rows", batch_size: int = 1
) -> Path:
    """The pool's first ``rows`` rows as perf_analyzer's JSON input data, one batch-1 entry per row;
    for a raw-row model (``form="text"``), each row's text (its one BYTES element). For bags of any
    size (a model without Triton's batching) and for a ranking model (``form="ranking"``: one user
    and its ``batch_size`` candidates a request, under Triton's batch dimension), both run with
    ``-b 1`` (:func:`batch_flag`), one entry per request of ``batch_size`` rows, each tensor with
    its shape (a ranking request's without its batch dimension of one user)."""
    count = min(rows, pool.dense.shape[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    if form == "text":
        if pool.text is None:
            raise DataError(f"the payload from {pool.source} holds no row text for a raw-row model")
        texts = [row.decode("ascii") for row in pool.text[:count].tolist()]
        path.write_text(json.dumps({"data": [{RAW_ROWS_INPUT: [text]} for text in texts]}))
        return path
    if pool.variable_bags or form == "ranking":
        batches = pool.rebatched(batch_size)
        requests = [
            batches.batch(index, form) for index in range(max(1, min(len(batches), count // batch_size)))
        ]
        # A ranking request's tensors lead with its one user, which perf_analyzer's -b 1 adds.
        drop = 1 if form == "ranking" else 0
        entries: list[dict[str, Any]] = [
            {
                name: {"content": array.reshape(-1).tolist(), "shape": list(array.shape[drop:])}
                for name, array in request.items()
            }
            for request in requests
        ]
        path.write_text(json.dumps({"data": entries}))
        return path
    dense_rows, id_rows = _flat_rows(pool if pool.split is None else pool.rebatched(batch_size), count)
    dense, categorical = dense_rows.tolist(), id_rows.tolist()
    entries = [{DENSE_INPUT: d, CATEGORICAL_INPUT: c} for d, c in zip(dense, categorical, strict=True)]
    path.write_text(json.dumps({"data": entries}))
    return path


def input_data_for(payload: Path, model: str, batch_size: int) -> tuple[Path, int]:
    """perf_analyzer's input data for ``model``'s requests of ``batch_size`` rows from a sweep's
    payload pool (:func:`write_input_data`, written once beside it, one file per form and batch
    size), and the ``-b`` it runs with (:func:`batch_flag`: its samples/s then count requests of
    ``-b`` rows, which the caller scales by ``batch_size / -b``)."""
    form = request_form(model)
    variable = saved_bags(payload)
    name = "raw" if form == "text" else f"{form}-b{batch_size}"
    input_data = payload.with_name(f"perf_analyzer-input-{name}.json")
    if not input_data.is_file():
        write_input_data(PayloadPool.load(payload), input_data, form=form, batch_size=batch_size)
    return input_data, batch_flag(variable, batch_size, form == "ranking")


def _flat_rows(pool: PayloadPool, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool's first ``count`` rows as a flat model takes them: as they are, or with a split
    (:attr:`PayloadPool.split`) each batch's tiled rows."""
    if pool.split is None:
        return pool.dense[:count], pool.categorical[:count]
    parts = [pool.batch(index) for index in range(-(-count // pool.batch_size))]
    dense = np.concatenate([part[DENSE_INPUT] for part in parts])[:count]
    return dense, np.concatenate([part[CATEGORICAL_INPUT] for part in parts])[:count]


def batch_flag(variable_bags: bool, batch_size: int, ranking: bool = False) -> int:
    """perf_analyzer's ``-b`` for requests of ``batch_size`` rows: 1 where each input-data entry is
    a whole request (a pool of bags of any size, a ranking model's users), else the rows it stacks
    into one."""
    return 1 if variable_bags or ranking else batch_size


def command(
    binary: Path,
    url: str,
    protocol: str,
    model: str,
    batch_size: int,
    concurrency: int,
    window_s: float,
    input_data: Path,
    csv_path: Path,
    request_rate: float = 0.0,
    arrival: str = "poisson",
) -> list[str]:
    """perf_analyzer's command line for one step: ``concurrency`` requests in flight, or with
    ``request_rate`` its request-rate mode (``arrival``: ``poisson`` or ``constant``), at most
    ``concurrency`` threads sending."""
    if request_rate > 0:
        load = [
            "--request-rate-range", f"{request_rate:g}:{request_rate:g}:1",
            "--request-distribution", arrival, "--max-threads", str(concurrency),
        ]  # fmt: skip
    else:
        load = ["--concurrency-range", f"{concurrency}:{concurrency}"]
    return [
        str(binary), "-m", model, "-u", url, "-i", protocol, "-b", str(batch_size), *load,
        "--measurement-interval", str(max(1, round(window_s * 1000))),
        "--stability-percentage", str(STABILITY_PERCENT), "--max-trials", str(MAX_TRIALS),
        "--input-data", str(input_data), "-f", str(csv_path), "--verbose-csv",
    ]  # fmt: skip


@dataclass(frozen=True)
class Figures:
    """One step as perf_analyzer reported it (its CSV row and summary; latencies in ms)."""

    samples_per_s: float
    requests: int
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    server: dict[str, float]
    #: In request-rate mode, the share of requests it could not send on schedule (0: none said).
    delayed_percent: float = 0.0
    #: Its client time per request (ms): its CSV's "Client Send" plus "Client Recv", the time its
    #: client spends building and sending a request and reading its answer (NaN: not in the CSV).
    client_ms: float = math.nan


def failure_reason(returncode: int, output: str) -> str:
    """Why a perf_analyzer run gave no figures, in one line: its exit (code, or the signal that
    killed it) and the line of its ``output`` that says most, its line on the windows that never
    agreed where it printed one (it names the windows and the concurrency), else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("# ")]
    said = next((line for line in lines if line.startswith(f"{UNSTABLE} within")), lines[-1] if lines else "")
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        how = f"perf_analyzer was killed by {name}"
        return f"{how}; its last line: {said}" if said else f"{how}, having printed nothing"
    how = f"perf_analyzer exited with code {returncode}" if returncode else "perf_analyzer wrote no result"
    return f"{how}: {said}" if said else f"{how}, printing nothing"


def read_figures(csv_path: Path, stdout: str) -> Figures:
    """perf_analyzer's figures of a one-concurrency run: the ``-f`` CSV and its printed summary.

    Raises:
        BundleError: no CSV row (the run failed or never settled).
    """
    try:
        with open(csv_path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError:
        rows = []
    if not rows:
        raise BundleError(failure_reason(0, stdout))
    row = rows[-1]

    def ms(column: str) -> float:
        return float(row[column]) / 1000.0

    client = stdout.split("Client:", 1)[-1]
    count = re.search(r"Request count: (\d+)", client)
    server: dict[str, float] = {}
    section = stdout.split("Server:", 1)[-1] if "Server:" in stdout else ""
    for key, pattern in (
        ("inference_count", r"Inference count: (\d+)"),
        ("execution_count", r"Execution count: (\d+)"),
        ("success_count", r"Successful request count: (\d+)"),
    ):
        if match := re.search(pattern, section):
            server[key] = float(match[1])
    if match := _SERVER_LINE.search(section):
        server.update({key: float(value) / 1000.0 for key, value in match.groupdict().items()})
    delayed = re.search(r"([\d.]+)% of the requests were delayed", stdout)
    try:
        client_ms = ms("Client Send") + ms("Client Recv")
    except (KeyError, TypeError, ValueError):
        client_ms = math.nan
    return Figures(
        client_ms=client_ms,
        delayed_percent=float(delayed[1]) if delayed else 0.0,
        samples_per_s=float(row["Inferences/Second"]),
        requests=int(count[1]) if count else 0,
        p50_ms=ms("p50 latency"),
        p90_ms=ms("p90 latency"),
        p95_ms=ms("p95 latency"),
        p99_ms=ms("p99 latency"),
        mean_ms=ms("Avg latency"),
        server=server,
    )


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _served(client: TritonClient, model: str) -> int | None:
    """Requests Triton has counted for ``model`` so far, answered or failed."""
    counters = server_counters(client, model)
    return None if counters is None else counters["success_count"] + counters["fail_count"]


@dataclass(frozen=True)
class Run:
    """One perf_analyzer step: its figures, and its CPU over the whole run."""

    figures: Figures
    cpu: ClientCpu
    wall_s: float


def run_step(
    binary: Path,
    url: str,
    protocol: str,
    model: str,
    batch_size: int,
    concurrency: int,
    window_s: float,
    input_data: Path,
    folder: Path,
    timeout_s: float,
    cpus: frozenset[int] | None = None,
    request_rate: float = 0.0,
    arrival: str = "poisson",
) -> Run:
    """Run perf_analyzer for one step; its CSV and output go to ``folder``.

    ``cpus``: the cores it may run on (None: any); ``request_rate``, ``arrival``: its
    request-rate mode (see :func:`command`).

    Raises:
        BundleError: it failed, overran ``timeout_s``, or reported nothing.
    """
    folder.mkdir(parents=True, exist_ok=True)
    csv_path = folder / STEP_CSV
    csv_path.unlink(missing_ok=True)
    argv = command(
        binary,
        url,
        protocol,
        model,
        batch_size,
        concurrency,
        window_s,
        input_data,
        csv_path,
        request_rate,
        arrival,
    )
    cpu_before = _children_cpu_s()
    wire: Literal["grpc", "http"] = "grpc" if protocol == "grpc" else "http"
    stats = TritonClient(url, wire, timeout_s=10.0, retry=RetryPolicy(max_tries=2))
    log_path = folder / STEP_LOG
    try:
        before = _served(stats, model)
        with open(log_path, "w") as log:
            log.write(f"# {shlex.join(argv)}\n")
            log.flush()
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
            )
            started = time.perf_counter()
            first: dict[int, float] = {}
            last: dict[int, float] = {}
            first_at = last_at = started
            try:
                # Its threads' busy time, read while it runs (nothing is left to read once it exits).
                while process.poll() is None:
                    if time.perf_counter() - started > timeout_s:
                        raise BundleError(f"perf_analyzer overran {timeout_s:.0f} s: {shlex.join(argv)}")
                    busy = thread_busy_s(process.pid)
                    if busy:
                        if not first:
                            first, first_at = busy, time.perf_counter()
                        last, last_at = busy, time.perf_counter()
                    time.sleep(0.2)
            finally:
                if process.poll() is None:
                    process.kill()
                process.wait()
            wall = time.perf_counter() - started
        # The child's CPU (user + system, every thread) is in its reaped usage.
        cpu_s = _children_cpu_s() - cpu_before
        after = _served(stats, model)
    finally:
        stats.close()
    output = log_path.read_text()
    if process.returncode != 0:
        raise BundleError(failure_reason(process.returncode, output))
    figures = read_figures(csv_path, output)
    sent = after - before if before is not None and after is not None else 0
    span = last_at - first_at
    demand = process_demand(first, last, span) if span > 1.0 else math.nan
    allowed = None if cpus is None else len(cpus)
    # Its serial client time is its own client send and receive, judged as every engine's is (a
    # request-rate run is an open loop, where the client's time is not serial).
    serial_us = figures.client_ms * 1000.0 if request_rate <= 0 else math.nan
    cpu = ClientCpu.of_processes(
        [(cpu_s, wall, demand)], sent, allowed, concurrency, serial_us=serial_us, mean_ms=figures.mean_ms
    )
    return Run(figures, cpu, wall)


def describe(run: Run) -> dict[str, Any]:
    """A run's raw figures, for the step folder's JSON."""
    return {
        "figures": run.figures.__dict__,
        "cpu_s": run.cpu.cpu_s,
        "wall_s": run.wall_s,
        "requests_in_run": run.cpu.requests,
        "cpu_per_request_us": None if math.isnan(run.cpu.per_request_us) else run.cpu.per_request_us,
    }
