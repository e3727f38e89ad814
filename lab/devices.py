"""GPU served against CPU served on the same host, per model family (``python -m lab gpu-vs-cpu``).

NVIDIA's Wide & Deep blog states its GPU answer as two ratios against the CPU: lower latency
and higher throughput. This module states the bundle's own answer from two ``python -m lab gpu``
result documents taken on one machine: one of the gpu-profile repository (KIND_GPU instances),
one of the cpu-profile repository served on the host's cores (the CPU default, INT8, unless the
run measured other variants). Per family it compares

- the p50 latency of one request of one row with one request in flight (the step ``1x1``), of
  the model with the lowest such p50 on each side;
- the best served samples/s over every measured step, of the fastest model on each side that
  passes its AUC gate (a model whose gate is unknown counts as passing: a run records it).

Each side's machine and GPU come from its own run record, so a comparison of two machines
shows itself as one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.records import machine_with_flags
from loadtest.engine.writer import table, write_json, write_markdown

#: The families compared, as ``python -m lab gpu`` names them.
FAMILIES: tuple[str, ...] = ("dlrm", "wide_deep")


def read_result(path: Path) -> dict[str, Any]:
    """A ``python -m lab gpu`` result document (``result.json``, or a folder holding one)."""
    path = path / "result.json" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(f"no lab gpu result at {path}")
    document = json.loads(path.read_text())
    if "results" not in document:
        raise ConfigError(f"{path} is not a lab gpu result document (no 'results')")
    return document


def _batch1(result: dict[str, Any]) -> dict[str, Any] | None:
    steps = [s for s in result["served"] if s["batch_size"] == 1 and s["concurrency"] == 1]
    return steps[0] if steps else None


def _best(result: dict[str, Any]) -> dict[str, Any] | None:
    return max(result["served"], key=lambda s: s["samples_per_s"]) if result["served"] else None


def side(document: dict[str, Any], family: str) -> dict[str, Any]:
    """One side's answer for ``family``: the lowest batch-1 p50 and the best served samples/s.

    Returns:
        ``{"latency": {...} | None, "throughput": {...} | None}``, each naming the model and
        its step (``batch_size``, ``concurrency``) with ``p50_ms`` / ``p99_ms`` / ``samples_per_s``.
    """
    members = [r for r in document["results"] if r["family"] == family]
    latency = [(step["p50_ms"], r, step) for r in members if (step := _batch1(r))]
    passing = [
        (step["samples_per_s"], r, step)
        for r in members
        if r["gate"]["passes"] is not False and (step := _best(r))
    ]
    found: dict[str, Any] = {"latency": None, "throughput": None}
    if latency:
        _, r, step = min(latency, key=lambda item: item[0])
        found["latency"] = {
            "model": r["model"],
            "precision": r["precision"],
            "p50_ms": step["p50_ms"],
            "p99_ms": step["p99_ms"],
        }
    if passing:
        _, r, step = max(passing, key=lambda item: item[0])
        found["throughput"] = {
            "model": r["model"],
            "precision": r["precision"],
            "samples_per_s": step["samples_per_s"],
            "batch_size": step["batch_size"],
            "concurrency": step["concurrency"],
            "p99_ms": step["p99_ms"],
        }
    return found


def compare_devices(gpu: dict[str, Any], cpu: dict[str, Any], command: str) -> dict[str, Any]:
    """GPU against CPU per family, from two ``python -m lab gpu`` documents of one host.

    Returns:
        A document with each side's run record, and per family each side's answer
        (:func:`side`) and the ratios ``latency_cpu_over_gpu`` (CPU p50 / GPU p50) and
        ``throughput_gpu_over_cpu`` (GPU samples/s / CPU samples/s), ``None`` where a side
        lacks the step.
    """
    families = {}
    for family in FAMILIES:
        on_gpu, on_cpu = side(gpu, family), side(cpu, family)
        if not any(on_gpu.values()) and not any(on_cpu.values()):
            continue
        latency = (
            on_cpu["latency"]["p50_ms"] / on_gpu["latency"]["p50_ms"]
            if on_gpu["latency"] and on_cpu["latency"] and on_gpu["latency"]["p50_ms"] > 0
            else None
        )
        throughput = (
            on_gpu["throughput"]["samples_per_s"] / on_cpu["throughput"]["samples_per_s"]
            if on_gpu["throughput"] and on_cpu["throughput"] and on_cpu["throughput"]["samples_per_s"] > 0
            else None
        )
        families[family] = {
            "gpu": on_gpu,
            "cpu": on_cpu,
            "latency_cpu_over_gpu": latency,
            "throughput_gpu_over_cpu": throughput,
        }
    if not families:
        raise ConfigError("neither result holds a dlrm or wide_deep model")
    return {
        "command": command,
        "gpu_run": {key: gpu.get(key) for key in ("command", "started", "finished", "machine", "gpu")},
        "cpu_run": {key: cpu.get(key) for key in ("command", "started", "finished", "machine", "gpu")},
        "families": families,
    }


def _ms(found: dict[str, Any] | None) -> str:
    return f"`{found['model']}` {found['p50_ms']:.2f} ms" if found else "- (no 1x1 step)"


def _rate(found: dict[str, Any] | None) -> str:
    if not found:
        return "-"
    return (
        f"`{found['model']}` {found['samples_per_s'] / 1e6:.2f}M "
        f"({found['batch_size']}x{found['concurrency']}, p99 {found['p99_ms']:.1f} ms)"
    )


def _ratio(value: float | None) -> str:
    return f"**{value:.1f}x**" if value is not None else "-"


def write_devices_report(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write ``gpu_vs_cpu.json`` and ``gpu_vs_cpu.md`` into ``out``."""
    gpu_run = document["gpu_run"]
    lines = [
        f"# GPU served against CPU served on one host: {(gpu_run.get('gpu') or {}).get('name') or 'no GPU'}",
        "",
        f"- **Command**: `{document['command']}`",
        f"- **GPU run**: `{gpu_run.get('command')}`",
        f"- **CPU run**: `{document['cpu_run'].get('command')}`",
    ]
    for label, run in (("GPU run", gpu_run), ("CPU run", document["cpu_run"])):
        machine = run.get("machine")
        lines.append(f"- {label}'s machine: {machine_with_flags(machine) if machine else '-'}")
    lines += [
        "",
        "Latency: p50 of one row per request, one request in flight (the lowest on each side). "
        "Throughput: the best served samples/s over the measured steps, of models that pass "
        "their AUC gate.",
        "",
    ]
    lines += table(
        ["family", "GPU p50", "CPU p50", "CPU / GPU latency", "GPU best", "CPU best", "GPU / CPU throughput"],
        [
            [
                family,
                _ms(found["gpu"]["latency"]),
                _ms(found["cpu"]["latency"]),
                _ratio(found["latency_cpu_over_gpu"]),
                _rate(found["gpu"]["throughput"]),
                _rate(found["cpu"]["throughput"]),
                _ratio(found["throughput_gpu_over_cpu"]),
            ]
            for family, found in document["families"].items()
        ],
    )
    return {
        "json": write_json(out / "gpu_vs_cpu.json", document),
        "markdown": write_markdown(out / "gpu_vs_cpu.md", lines),
    }
