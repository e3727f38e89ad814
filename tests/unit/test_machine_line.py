"""The machine line a benchmark script writes into a summary of its own (``python -m bundle.records``)
reads as the load-test reports' does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bundle import records
from bundle.records import RunRecord, machine_with_flags, this_machine

ROOT = Path(__file__).resolve().parents[2]


def test_this_machine_is_named_as_a_record_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = {
        "cpu": "AMD EPYC", "cores": 2, "memory_gib": 23.5, "platform": "Linux",
        "cpu_flags": {"avx2": True, "avx512f": False, "amx_bf16": False},
    }  # fmt: skip
    monkeypatch.setattr(records, "describe", lambda: machine)
    assert this_machine() == "AMD EPYC, 2 cores, 23.5 GiB (avx2)"
    record = RunRecord(command="-", started="-", machine=machine, load_start=(0.0, 0.0, 0.0))
    assert f"- **Machine**: {this_machine()}; Linux" in record.lines()


def test_the_module_prints_the_line_of_the_machine_it_runs_on() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bundle.records"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [machine_with_flags(records.describe())]
    assert done.stderr == ""
