"""Concurrency sweeps: one load-generator run per step, results read back from its step folder.

Three engines drive a step (:func:`run_step`): locust (the bundle's users,
below), and in :mod:`loadtest.sweeps.engines` perf_analyzer, Triton's own load
tool and the reference the others are checked against, and the closed-loop
driver. All record the same step (:mod:`loadtest.sweeps.steps`): rates, latency
percentiles, Triton's view, and the load generator's own CPU
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

import contextlib
import json
import logging
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import loadtest
from bundle.errors import BundleError, ConfigError
from bundle.schema import FeatureSplit
from criteo.multihot import holds_bags
from loadtest.engine.client_cpu import ClientCpu
from loadtest.engine.latency import Tally, merged_tallies
from loadtest.engine.payload import (
    MAX_POOL_ROWS,
    STREAM_MAX_ROWS,
    Hotness,
    build_bag_pool,
    build_pool,
    build_stream,
)
from loadtest.engine.server_cpu import listening_pid
from loadtest.sweeps.engines import driver_step, perf_analyzer_step
from loadtest.sweeps.stepfiles import (
    CPU_GLOB,
    LATENCY_GLOB,
    LOCUST_LOG,
    SERVER_STATS_FILE,
    STREAM_GLOB,
    shared_cores,
)
from loadtest.sweeps.steps import (
    STEP_GRACE_S,
    ServerTimes,
    StepResult,
    SweepConfig,
    Target,
    _number,
)

logger = logging.getLogger(__name__)

REPO_ROOT = Path(loadtest.__file__).resolve().parent.parent
#: The locustfile and user class of each protocol.
USERS: dict[str, tuple[Path, str]] = {
    "grpc": (REPO_ROOT / "loadtest" / "sweeps" / "locustfile.py", "GrpcTritonUser"),
    "http": (REPO_ROOT / "loadtest" / "sweeps" / "locustfile.py", "HttpTritonUser"),
    "fastapi": (REPO_ROOT / "loadtest" / "sweeps" / "peers" / "locustfile.py", "FastApiUser"),
}


def collect_step(
    folder: Path,
    target: Target,
    model: str,
    batch_size: int,
    concurrency: int,
    processes: int,
    window_s: float,
    client_cpus: frozenset[int] | None = None,
) -> StepResult:
    """Read a step folder written by the locust processes into one :class:`StepResult`.

    Requests per second add up over processes, each over the part of the
    window it ran (the whole window, unless it stopped early). ``client_cpus``: the
    cores the load generator ran on (None: any); with the server's CPU and cores over the
    window, they say whether the load generator took CPU the server needed.

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
    server = None
    stats: dict[str, Any] = {}
    stats_path = folder / SERVER_STATS_FILE
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        server = ServerTimes.from_delta(stats["delta"])
    cpu_documents = [json.loads(path.read_text()) for path in sorted(folder.glob(CPU_GLOB))]
    cpu = ClientCpu.of_processes(
        [
            (float(d["cpu_s"]), float(d["seconds"]), _number(d.get("process_demand")))
            for d in cpu_documents
            if d.get("cpu_s") is not None
        ],
        tally.ok + tally.errors,
        None if client_cpus is None else len(client_cpus),
        concurrency,
        serial_us=tally.serial_us,
        mean_ms=tally.histogram.mean_ms,
    )
    step = StepResult.of_tally(
        target, model, batch_size, concurrency, tally, rate, cpu, processes=processes,
        seconds=sum(covered) / len(covered), server=server, errors_total=errors_total,
    )  # fmt: skip
    return step.beside_server(shared_cores(stats, cpu.share, client_cpus))


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
    processes = config.processes_for(concurrency)
    # The users send from native threads on plain sockets, under a launcher that leaves thread
    # locks unpatched.
    command = [
        sys.executable, "-m", "loadtest.sweeps.locust_main", "-f", str(locustfile), user_class,
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
        "--exit-code-on-error", "0", "--only-summary", "--loglevel", "WARNING", "--skip-locust-stats",
        "--csv", str(folder / "locust"),
    ]  # fmt: skip
    if target.server_stats:
        command += ["--server-stats", target.protocol]
        server_pid = listening_pid(target.url)
        if server_pid is not None:
            command += ["--server-pid", str(server_pid)]
    if config.stream is not None:
        command += ["--stream-start", str(config.stream.next_row), "--stream-stride", str(processes)]
    if processes > 1:
        command += ["--processes", str(processes)]
    return command


def _environment() -> dict[str, str]:
    """The environment of a locust step: the repository on the import path."""
    env = os.environ.copy()
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
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
    _wait_for_group(process.pid, _GROUP_EXIT_S)
    if code != 0:
        raise BundleError(f"locust exited with code {code} (log: {log_path}): {shlex.join(command)}")


#: How long a step's worker processes may outlive its master (they write their results as they stop).
_GROUP_EXIT_S = 30.0


def _wait_for_group(group: int, timeout_s: float) -> None:
    """Wait until no process of ``group`` is left (locust's master can exit while its workers still
    write their files); kill what is left after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    logger.warning("locust processes of group %d outlived their step by %.0f s: killed", group, timeout_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def make_payload(
    out: Path,
    data: Path | None,
    stream: bool = False,
    hotness: Hotness = None,
    split: FeatureSplit | None = None,
) -> Path:
    """Build the rows every step sends (once) and write them to ``out/payload.npz``: a pool of at
    most :data:`MAX_POOL_ROWS` rows, cycled; or with ``stream``, every row of ``data`` in order.
    For a multi-hot model (``hotness``: 26 counts, or ``variable`` for bags of any size), a file
    of the multi-hot text format gives its own bags (:func:`build_bag_pool`); a Criteo file's rows,
    or synthetic ones, get bags made from their ids (:meth:`PayloadPool.multi_hot`). With a ranking
    model's ``split``, each request's rows are one user and its candidates
    (:meth:`PayloadPool.ranked`)."""
    if stream and data is None:
        raise ConfigError("--stream sends the rows of a file: give --data FILE")
    if hotness is not None and data is not None and holds_bags(data):
        pool = build_bag_pool(data, hotness, STREAM_MAX_ROWS if stream else MAX_POOL_ROWS)
    elif stream and data is not None:
        pool = build_stream(data).multi_hot(hotness)
    else:
        pool = build_pool(1, data=data, batches=MAX_POOL_ROWS).multi_hot(hotness)
    return pool.ranked(split, hotness).save(out / "payload.npz")


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
        command, folder, config.step_seconds + config.request_timeout_s + STEP_GRACE_S, config.client_cpus
    )
    step = collect_step(
        folder,
        target,
        model,
        config.batch_size,
        concurrency,
        config.processes_for(concurrency),
        config.duration_s,
        config.client_cpus,
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
