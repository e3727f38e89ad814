"""What both CPU benchmarks share: the run's record, and interleaved in-process timing."""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from criteo.schema import OUTPUT
from loadtest.machine import describe, load_average
from loadtest.payload import PayloadPool
from loadtest.roofline import cpu_flags
from loadtest.session import ort_session, serving_settings


def cpu_pressure() -> str:
    """The kernel's CPU pressure line (``some avg10=.. avg60=..``): how often tasks waited for a core."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "unavailable"


def run_record(argv: list[str] | None = None) -> dict[str, Any]:
    """The machine, software, load and command of a run that starts now."""
    machine = describe()
    machine["cpu_flags"] = cpu_flags()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(["python", "-m", "benchmarks.cpu", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine,
        "load_average_start": list(load_average()),
        "cpu_pressure_start": cpu_pressure(),
    }


def finish_record(record: dict[str, Any]) -> None:
    """Add the load at the end of the run."""
    record["load_average_end"] = list(load_average())
    record["cpu_pressure_end"] = cpu_pressure()


def interleaved_in_process(
    model_files: dict[str, Path], pool: PayloadPool, rounds: int, seconds: float
) -> dict[str, dict[str, Any]]:
    """Samples/s of several ONNX files in this process, timed in turns.

    Each round runs every file for ``seconds`` (at least 3 calls), so a burst
    of background load hits them alike; the median round is reported. Each
    session gets the intra-op threads its config.pbtxt asks the server for.

    Returns:
        ``{name: {"samples_per_s", "repeats", "threads", "p50_ms"}}``.
    """
    batches = pool.batches()
    sessions = {}
    for name, path in model_files.items():
        threads = serving_settings(path)["threads"]
        session = ort_session(path, threads)
        for batch in batches[:3]:
            session.run([OUTPUT], batch)
        sessions[name] = (session, threads)
    rates: dict[str, list[float]] = {name: [] for name in model_files}
    latencies: dict[str, list[float]] = {name: [] for name in model_files}
    for _ in range(rounds):
        for name, (session, _) in sessions.items():
            calls = 0
            started = time.perf_counter()
            while True:
                before = time.perf_counter()
                session.run([OUTPUT], batches[calls % len(batches)])
                after = time.perf_counter()
                latencies[name].append((after - before) * 1000.0)
                calls += 1
                if after - started >= seconds and calls >= 3:
                    break
            rates[name].append(calls * pool.batch_size / (time.perf_counter() - started))
    return {
        name: {
            "samples_per_s": statistics.median(rates[name]),
            "repeats": rates[name],
            "threads": sessions[name][1],
            "p50_ms": float(np.percentile(latencies[name], 50)),
        }
        for name in model_files
    }


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A GitHub markdown table (first column left-aligned, the others right-aligned)."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def machine_lines(record: dict[str, Any]) -> list[str]:
    """The bullet list every result file starts with."""
    machine = record["machine"]
    flags = ", ".join(f"{flag} {'yes' if on else 'no'}" for flag, on in machine["cpu_flags"].items())
    return [
        f"- machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB; {flags}",
        f"- software: Python {machine['python']}, onnxruntime {machine['onnxruntime']}, "
        f"tritonclient {machine['tritonclient']}, nvidia-pytriton {machine['nvidia-pytriton']}",
        f"- load average (1/5/15 min) at start {record['load_average_start']}, at end "
        f"{record.get('load_average_end')}; CPU pressure at end: `{record.get('cpu_pressure_end')}` "
        "(the machine is shared; every measurement ran under `flock /tmp/bench.lock` once the "
        "1-minute load was below 1.0)",
        f"- date: {record['date']}",
        f"- command: `{record['command']}`",
    ]
