"""``python -m loadtest tune`` end to end: a tiny space searched through the real local tritonserver,
its report files read back, and ``--apply``'s config parsed back and loaded by a server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bundle.repository import CONFIG_NAME, read_config
from loadtest.engine.session import THREADS_PARAMETER

pytestmark = pytest.mark.integration


def test_tune_searches_reports_and_applies_through_the_server(
    exported_repository: Path, start_triton, tmp_path: Path
) -> None:
    repository = tmp_path / "repository"  # --apply writes here, never into the shared fixture
    for name in ("dlrm_onnx", "dlrm_onnx_int8"):
        shutil.copytree(exported_repository / name, repository / name)
    out = tmp_path / "report"
    command = [
        sys.executable, "-m", "loadtest", "tune", "--repository", str(repository), "--model", "dlrm",
        "--p99-budget-ms", "500", "--variants", "fp32,int8", "--instances", "1,2", "--threads", "0",
        "--queue-delay-us", "100", "--preferred", "none;32", "--batch-sizes", "16", "--concurrency", "1,2",
        "--window", "0.25", "--warmup", "0.1", "--min-windows", "2", "--max-windows", "3",
        "--confirm-rounds", "1", "--top", "3", "--apply", "--out", str(out),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "winner:" in completed.stdout and "applied:" in completed.stdout

    document = json.loads((out / "report.json").read_text())
    assert (out / "frontier.png").stat().st_size > 0
    markdown = (out / "report.md").read_text()
    assert "brute force over the same space" in markdown and "## Throughput vs p99 frontier" in markdown
    # The default (INT8, cpu-profile settings) plus 2 variants x 2 instance counts x 2 preferred sets.
    assert document["space"]["server_points"] == 8
    # Each grid point: a steady step's two warm-up windows and every measured window.
    assert document["time"]["brute_force_s"] == pytest.approx(8 * 2 * (2 * 0.1 + 3 * 0.25))
    # How much less the search measured is a benchmark's figure (benchmarks/tune), not a test's: on this
    # tiny space it is timing noise. Here only the accounting: measured time > 0, the fraction from it.
    spent = document["time"]
    assert spent["search_measured_s"] > 0
    assert spent["search_fraction"] == pytest.approx(spent["search_measured_s"] / spent["brute_force_s"])
    trials = document["trials"]
    assert trials and all(t["errors"] == 0 and t["requests"] > 0 for t in trials), [
        (t["server_label"], t["client"], t["errors"], t["first_error"])
        for t in trials
        if t["errors"] or not t["requests"]
    ]
    assert trials[0]["server"] == document["default"]["server"]  # the default goes first
    winner = document["winner"]
    assert winner["feasible"] and winner["confirmed"]["samples_per_s"] > 0
    assert document["default"]["confirmed"]["samples_per_s"] > 0
    assert document["top"] and all("diff" in entry for entry in document["top"])
    finalists = document["finalists"]
    assert sum(f["is_winner"] for f in finalists) == 1 and sum(f["is_default"] for f in finalists) == 1
    for entry in finalists:  # the loads each tried side by side, and why each was kept or dropped
        loads = entry["loads"]
        assert loads[0]["client"] == entry["client"]  # it starts at the search's load
        assert all(load["reason"].startswith(("kept", "dropped")) for load in loads)
        assert loads[-1]["kept"] == entry["held"] and loads[-1]["client"] == entry["confirmed"]["client"]
        assert len(entry["confirmed"]["rounds_samples_per_s"]) == loads[-1]["rounds"] >= 1
    assert winner["loads"][-1]["kept"] and winner["client"] == winner["loads"][-1]["client"]
    assert "### Loads tried side by side" in markdown

    written = read_config(repository / winner["model"] / CONFIG_NAME)
    assert written.instance_group[0].count == winner["server"]["instances"]
    assert list(written.dynamic_batching.preferred_batch_size) == winner["server"]["preferred"]
    assert THREADS_PARAMETER not in written.parameters
    server = start_triton(repository, model_control_mode="explicit", load_models=(winner["model"],))
    assert any(m.name == winner["model"] and m.state == "READY" for m in server.models())
    server.stop()


def _tiny_tune(repository: Path, out: Path, *options: str) -> dict[str, Any]:
    """``python -m loadtest tune`` of dlrm on one instance and one client load, a few short
    windows, with ``options`` (the variants, ``--raw``); its report.json."""
    command = [
        sys.executable, "-m", "loadtest", "tune", "--repository", str(repository), "--model", "dlrm",
        *options, "--p99-budget-ms", "500", "--instances", "1", "--threads", "0",
        "--queue-delay-us", "100", "--batch-sizes", "16", "--concurrency", "1", "--window", "0.25",
        "--warmup", "0.1", "--min-windows", "2", "--max-windows", "2", "--confirm-rounds", "1",
        "--finalists", "1", "--out", str(out),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


def test_tune_raw_sends_the_rows_as_text_to_the_raw_row_models(
    exported_repository: Path, tmp_path: Path
) -> None:
    """``--raw``: every request goes to the variant's raw-row model, and the config searched is the
    variant's; the user's repository is only read."""
    out = tmp_path / "report"
    document = _tiny_tune(exported_repository, out, "--raw", "--variants", "int8")
    assert document["raw"] is True and document["request_models"] == ["dlrm_onnx_int8_raw"]
    trials = document["trials"]
    assert trials and all(t["errors"] == 0 and t["requests"] > 0 for t in trials)
    assert document["winner"]["model"] == "dlrm_onnx_int8"  # the config tuned is the variant's
    assert "each row's text to the variant's raw-row model" in (out / "report.md").read_text()


def test_tune_of_one_variant_still_measures_the_shipped_default_beside_it(
    exported_repository: Path, tmp_path: Path
) -> None:
    """``--variants fp32`` on a repository whose shipped default is the INT8 variant: the default is
    measured beside the search all the same (its config read too), as Model Analyzer's comparison
    asks of tune."""
    document = _tiny_tune(exported_repository, tmp_path / "report", "--variants", "fp32")
    trials = document["trials"]
    assert {t["server"]["variant"] for t in trials} == {"fp32", "int8"}
    assert trials[0]["server"] == document["default"]["server"] and document["default"]["server"][
        "variant"
    ] == ("int8")
    assert all(t["errors"] == 0 and t["requests"] > 0 for t in trials)


def test_tune_by_capacity_searches_the_rate_confirms_and_applies_through_the_server(
    exported_repository: Path, start_triton, tmp_path: Path
) -> None:
    """``--objective capacity``: the default searched first in open-loop Poisson steps, the other
    config from the default's samples/s upward, both side by side, the winner applied."""
    repository = tmp_path / "repository"  # --apply writes here, never into the shared fixture
    for name in ("dlrm_onnx", "dlrm_onnx_int8"):
        shutil.copytree(exported_repository / name, repository / name)
    out = tmp_path / "report"
    command = [
        sys.executable, "-m", "loadtest", "tune", "--objective", "capacity", "--repository", str(repository),
        "--model", "dlrm", "--p99-budget-ms", "500", "--variants", "int8", "--instances", "1,2",
        "--threads", "0", "--queue-delay-us", "100", "--batch-sizes", "8", "--start-rate", "20",
        "--max-rate", "80", "--resolution", "0.5", "--rate-window", "1", "--min-requests", "20",
        "--warmup", "0.2", "--connections", "8", "--confirm-rounds", "1", "--apply", "--out", str(out),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    document = json.loads((out / "capacity.json").read_text())  # written before --apply
    assert document["objective"] == "capacity" and (out / "capacity.png").stat().st_size > 0
    searched = document["searched"]
    assert searched[0]["server"] == document["default"]["server"]  # the default goes first
    assert len(searched) == 2 and searched[0]["capacity"]["steps"][0]["request_rate"] == 20
    steps = [step for entry in searched for step in entry["capacity"]["steps"]]
    assert all(s["errors"] == 0 and s["requests"] > 0 for s in steps)
    # Which rates hold depends on the machine's load (a loaded one falls behind its schedule);
    # the rules do not: a config searched after the default starts at the default's samples/s.
    default, other = searched
    if default["rate"] > 0:
        assert other["capacity"]["steps"][0]["request_rate"] == pytest.approx(default["rate"], abs=0.05)
    markdown = (out / "capacity.md").read_text()
    assert "## Every search" in markdown
    winner = document["winner"]
    if winner is None:  # nothing held side by side: said, and --apply refuses in one line
        assert completed.returncode != 0 and "no configuration held" in completed.stdout
        assert "nothing to apply" in completed.stderr and "applied:" not in completed.stdout
        return
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "winner:" in completed.stdout and "applied:" in completed.stdout and "Winner: **" in markdown
    assert winner["held"] and winner["confirmed_samples_per_s"] > 0
    assert document["finalists"][0]["server"] == document["default"]["server"]
    written = read_config(repository / winner["model"] / CONFIG_NAME)
    assert written.instance_group[0].count == winner["server"]["instances"]
    server = start_triton(repository, model_control_mode="explicit", load_models=(winner["model"],))
    assert any(m.name == winner["model"] and m.state == "READY" for m in server.models())
    server.stop()
