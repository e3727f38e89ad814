"""``python -m lab open-loop`` at tiny sizes against the real local tritonserver (the model of
:mod:`tests.stall_model`, which answers in about a millisecond): every part of the run is
measured and reported, LoadGen's verdict included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.stall_model import MODEL, write_stall_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_open_loop_measures_capacity_both_loops_and_loadgen(tmp_path: Path) -> None:
    repository = write_stall_model(tmp_path / "repository")
    out = tmp_path / "out"
    run = subprocess.run(
        [
            sys.executable, "-m", "lab", "open-loop", "--repository", str(repository), "--model", MODEL,
            "--batch-size", "4", "--p99-budget-ms", "50", "--rate-fractions", "0.5,1", "--concurrency", "1,2",
            "--duration", "1", "--warmup", "0.2", "--start-rate", "40", "--max-rate", "80",
            "--resolution", "0.5", "--connections", "8", "--loadgen-duration", "1",
            "--loadgen-min-queries", "20", "--min-requests", "20", "--out", str(out),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    document = json.loads((out / "open_loop.json").read_text())
    assert document["capacity"]["budget_ms"] == 50 and document["capacity"]["steps"]
    found = document["capacity"]["best"]["request_rate"] if document["capacity"]["best"] else 40
    assert [step["request_rate"] for step in document["open"]] == [round(found * 0.5, 1), round(found, 1)]
    assert [step["concurrency"] for step in document["closed"]] == [1, 2]
    assert all(step["samples_per_s"] > 0 for step in document["open"] + document["closed"])
    assert document["loadgen"]["summary"]["Result is"] in ("VALID", "INVALID")
    assert (out / "loadgen" / "mlperf_log_summary.txt").is_file()
    markdown = (out / "open_loop.md").read_text()
    assert "**capacity at p99 50 ms" in markdown or "**no rate held" in markdown
    assert "LoadGen server: Result is" in markdown and (out / "open_loop.png").stat().st_size > 0
