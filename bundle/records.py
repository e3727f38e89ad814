"""What a measurement ran on and how: the machine, the command, the date, and the load across the run.

Every result file of the bundle starts from one :class:`RunRecord`: the load
tests, the soak, the roofline, the CPU benchmarks and the client-cost bench.
This machine may be shared, so a record does not stop at the load average at
the start and the end: a thread samples the 1-minute load average every few
seconds while the run lasts, and the record keeps its minimum, median and
maximum.

``python -m bundle.records`` prints the machine it runs on in the words of a
record's machine line (:func:`this_machine`), for the benchmark scripts that
write their summaries by hand.
"""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError

#: Libraries whose versions a record keeps.
PACKAGES = ("numpy", "onnxruntime", "tritonclient", "grpcio", "nvidia-pytriton", "locust")
#: CPU flags a record keeps (what the ONNX Runtime kernels of the CPU profile can use): the vector
#: width tells two machines of one model name apart (this project's "AMD EPYC" has been both an
#: AVX2-only and an AVX-512 part).
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` (or /proc/cpuinfo) gives it."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    for line in text.splitlines():
        if line.strip().startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags(wanted: Sequence[str] = CPU_FLAGS) -> dict[str, bool]:
    """Which of ``wanted`` the CPU reports in /proc/cpuinfo (all False when unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return {flag: flag in present for flag in wanted}
    except OSError:
        pass
    return dict.fromkeys(wanted, False)


def memory_gib() -> float:
    """Total memory in GiB (0 when unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return 0.0


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (NaN where the system has none)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        nan = float("nan")
        return nan, nan, nan
    return round(one, 2), round(five, 2), round(fifteen, 2)


def cpu_pressure() -> str:
    """The kernel's CPU pressure line (``some avg10=.. avg60=..``): how often tasks waited for a core."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "unavailable"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe() -> dict[str, Any]:
    """The machine and software a measurement runs on (JSON-ready)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "cores_usable": usable,
        "memory_gib": memory_gib(),
        "cpu_flags": cpu_flags(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{package: _version(package) for package in PACKAGES},
        "load_average": load_average(),
    }


def machine_summary(machine: dict[str, Any]) -> str:
    """One line: ``<cpu>, <cores> cores, <memory> GiB``."""
    cpu, cores, memory = (
        machine.get("cpu", "unknown"),
        machine.get("cores", "?"),
        machine.get("memory_gib", "?"),
    )
    return f"{cpu}, {cores} cores, {memory} GiB"


def machine_with_flags(machine: dict[str, Any]) -> str:
    """:func:`machine_summary` and the CPU flags the record shows present, as ``(avx2, avx512f)``.

    Only the flags the record looked for are named: a record that predates a flag in
    :data:`CPU_FLAGS` neither claims nor denies it. A record without flags gets none.
    """
    flags = machine.get("cpu_flags")
    if flags is None:
        return machine_summary(machine)
    on = [flag for flag, present in flags.items() if present]
    return f"{machine_summary(machine)} ({', '.join(on) or 'none of ' + ', '.join(flags)})"


def this_machine() -> str:
    """The machine this runs on, as a record's machine line names it: :func:`machine_with_flags`
    of :func:`describe` (CPU model, cores, memory and the CPU flags present)."""
    return machine_with_flags(describe())


def command_line(stage: str, argv: Sequence[str] | None = None) -> str:
    """The command that runs now, as ``python -m <stage> ...`` (``argv``: this process's arguments)."""
    return shlex.join(["python", "-m", stage, *(sys.argv[1:] if argv is None else argv)])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunRecord:
    """One run: its command, machine, dates, and the load average across it.

    Start one with :meth:`begin` (or as a context manager, which finishes it):
    a daemon thread then samples the 1-minute load average every
    ``sample_every_s`` until :meth:`finish`.

    Attributes:
        command: the command line that produced the result.
        started, finished: UTC timestamps (ISO 8601); ``finished`` empty while running.
        machine: :func:`describe` at the start.
        load_start, load_end: the 1/5/15-minute load averages at the start and the end.
        load_samples: the 1-minute load average sampled during the run (start and end included).
        cpu_pressure_end: the kernel's CPU pressure line at the end.
    """

    command: str
    started: str
    machine: dict[str, Any]
    load_start: tuple[float, float, float]
    finished: str = ""
    load_end: tuple[float, float, float] | None = None
    load_samples: list[float] = field(default_factory=list)
    cpu_pressure_end: str = ""
    _stop: threading.Event | None = field(default=None, repr=False, compare=False)
    _sampler: threading.Thread | None = field(default=None, repr=False, compare=False)

    @classmethod
    def begin(cls, command: str, sample_every_s: float = 5.0) -> RunRecord:
        """A record of a run that starts now; the load is sampled until :meth:`finish`."""
        if not sample_every_s > 0:
            raise ConfigError(f"sample_every_s must be > 0, got {sample_every_s}")
        machine = describe()
        record = cls(command, _now(), machine, machine["load_average"])
        record.load_samples.append(record.load_start[0])
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(sample_every_s):
                record.load_samples.append(load_average()[0])

        record._stop = stop
        record._sampler = threading.Thread(target=sample, name="load-sampler", daemon=True)
        record._sampler.start()
        return record

    def finish(self) -> RunRecord:
        """Stop sampling; stamp the end time and load (a second call changes nothing)."""
        if self.finished:
            return self
        if self._stop is not None and self._sampler is not None:
            self._stop.set()
            self._sampler.join()
        self.finished = _now()
        self.load_end = load_average()
        self.load_samples.append(self.load_end[0])
        self.cpu_pressure_end = cpu_pressure()
        return self

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.finish()

    def load_during(self) -> dict[str, float]:
        """Min, median and max of the 1-minute load average over the run (NaN when unsampled)."""
        samples = [s for s in self.load_samples if s == s]  # NaN != NaN
        if not samples:
            nan = float("nan")
            return {"min": nan, "median": nan, "max": nan, "samples": 0}
        return {
            "min": min(samples),
            "median": round(statistics.median(samples), 2),
            "max": max(samples),
            "samples": len(samples),
        }

    def to_json(self) -> dict[str, Any]:
        """The record's fields (JSON-ready); result documents put them at their top level."""
        return {
            "command": self.command,
            "started": self.started,
            "finished": self.finished,
            "machine": self.machine,
            "load_start": list(self.load_start),
            "load_end": None if self.load_end is None else list(self.load_end),
            "load_during": self.load_during(),
            "load_samples": self.load_samples,
            "cpu_pressure_end": self.cpu_pressure_end,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> RunRecord:
        """Read :meth:`to_json`'s fields, or those of a load-test report written before records
        (``load_after``, and the start's load inside ``machine``)."""
        machine = document["machine"]
        start = document.get("load_start") or machine.get("load_average") or (float("nan"),) * 3
        end = document.get("load_end") or document.get("load_after")
        samples = document.get("load_samples") or [start[0], *([end[0]] if end else [])]
        return cls(
            command=document["command"],
            started=document["started"],
            machine=machine,
            load_start=tuple(start),
            finished=document.get("finished", ""),
            load_end=None if end is None else tuple(end),
            load_samples=list(samples),
            cpu_pressure_end=document.get("cpu_pressure_end", ""),
        )

    def lines(self) -> list[str]:
        """The markdown bullets every result file starts with: date, machine, software, load, command."""
        machine = self.machine
        software = ", ".join(f"{p} {machine[p]}" for p in PACKAGES if p in machine)
        during = self.load_during()
        end = "-" if self.load_end is None else ", ".join(map(str, self.load_end))
        return [
            f"- **Date (UTC)**: {self.started} to {self.finished or '-'}",
            f"- **Machine**: {machine_with_flags(machine)}; {machine.get('platform', '')}",
            f"- **Software**: Python {machine.get('python')}, {software}",
            f"- **Load average** (1/5/15 min) at start: {', '.join(map(str, self.load_start))}; "
            f"at end: {end}; 1-min during the run: {during['min']}-{during['max']} "
            f"(median {during['median']}, {during['samples']} samples). The machine may be shared.",
            f"- **Command**: `{self.command}`",
        ]


if __name__ == "__main__":
    print(this_machine())
