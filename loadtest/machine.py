"""What a result was measured on: CPU, cores, memory, load average, library versions."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any


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
    """The 1, 5 and 15 minute load averages."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        nan = float("nan")
        return nan, nan, nan
    return round(one, 2), round(five, 2), round(fifteen, 2)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe() -> dict[str, Any]:
    """The machine and software a measurement ran on (JSON-ready)."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "memory_gib": memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": _version("onnxruntime"),
        "tritonclient": _version("tritonclient"),
        "nvidia-pytriton": _version("nvidia-pytriton"),
        "locust": _version("locust"),
        "load_average": load_average(),
    }


def summary(machine: dict[str, Any]) -> str:
    """One line: ``<cpu>, <cores> cores, <memory> GiB``."""
    cpu, cores, memory = (
        machine.get("cpu", "unknown"),
        machine.get("cores", "?"),
        machine.get("memory_gib", "?"),
    )
    return f"{cpu}, {cores} cores, {memory} GiB"
