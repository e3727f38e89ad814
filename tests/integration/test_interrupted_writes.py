"""Writes into a served repository, interrupted: through the real CLIs and the real tritonserver.

- ``python -m export dlrm`` of a second checkpoint into a repository that holds a complete
  export of a first one, killed with SIGKILL at six points from start-up to its commit.
- ``python -m export rollout-hot-set`` of a hot/cold DLRM with FP16 and INT8 variants,
  killed at six points, with ``--url`` against a server in explicit model-control mode.
- The export with a file-size limit (a full disk, without root).

After each kill the local tritonserver starts on the repository (its start finishes or
discards the interrupted write), every model that was there loads, and each answers
exactly as before or exactly as the uninterrupted command made it, all of a family the
same (:mod:`lab.faults.writes`). A rollout does not move an answer, so there both
agree; there the point is that every ensemble, stage and dense model still loads.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bundle.schema import NUM_CATEGORICAL
from clients.reference import OnnxReference
from clients.retry import RetryPolicy
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import read_batch
from lab.faults import FaultResult
from lab.faults.writes import (
    EXPORT_POINTS,
    REPOSITORY,
    ROLLOUT_POINTS,
    WriteFaults,
    disk_full,
    interrupted_live,
    interrupted_writes,
    python_module,
    served_answers,
)
from lab.soak import Case, Endpoint, checked_load
from server import LocalServer
from server.security import generate_admin_key
from tests.cli import run_module as _run

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]

MODEL = "dlrm_onnx"
FAMILY_MODELS = ("dlrm_onnx", "dlrm_onnx_fp16", "dlrm_onnx_int8")
TABLE_SIZES = ",".join(str(60 + 23 * t) for t in range(NUM_CATEGORICAL))


def _check(results: list[FaultResult], points: int) -> None:
    assert len(results) == points
    for result in results:
        assert result.ok and result.wrong == 0, result
    print("\n".join(f"{r.fault}: {r.seen}" for r in results))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> dict[str, Path]:
    """Two tiny DLRMs of the same shape trained from different seeds: their answers differ."""
    root = tmp_path_factory.mktemp("interrupted")
    out = {}
    for name, seed in (("first", "1"), ("second", "2")):
        out[name] = root / name
        _run("models", "train", "dlrm", "--data", str(labeled_file), "--preset", "tiny", "--table-sizes",
             TABLE_SIZES, "--seed", seed, "--out", str(out[name]))  # fmt: skip
    return out


def _export_args(checkpoint: Path, labeled_file: Path) -> list[str]:
    return ["export", "dlrm", "--checkpoint", str(checkpoint), "--check-data", str(labeled_file),
            "--check-rows", "1024", "--int8-auc-tolerance", "1.0"]  # fmt: skip


def test_an_export_killed_at_six_points_leaves_one_complete_family(
    checkpoints: dict[str, Path], labeled_file: Path, tmp_path: Path
) -> None:
    before = tmp_path / "model_repository"
    _run(*_export_args(checkpoints["first"], labeled_file), "--repository", str(before))
    rows = read_batch(labeled_file, 64)
    faults = WriteFaults(
        before,
        python_module(*_export_args(checkpoints["second"], labeled_file), "--repository", REPOSITORY),
        FAMILY_MODELS,
        rows,
        "export",
    )
    first = served_answers(before, FAMILY_MODELS, rows, tmp_path / "first.log")
    results = interrupted_writes(faults, EXPORT_POINTS)
    _check(results, len(EXPORT_POINTS))
    # The two checkpoints answer differently, so "as before or as after" says something.
    second = tmp_path / "second"
    _run(*_export_args(checkpoints["second"], labeled_file), "--repository", str(second))
    answers = served_answers(second, FAMILY_MODELS, rows, tmp_path / "second.log")
    assert all(not np.allclose(first[name], answers[name], atol=1e-4) for name in FAMILY_MODELS)
    # Both states occur: the early points leave the first export, the last one the second.
    seen = " ".join(r.seen for r in results)
    assert "as before" in seen and "as after" in seen, seen
    runs = {
        json.loads((second / name / "export_report.json").read_text())["run"]["id"] for name in FAMILY_MODELS
    }
    assert len(runs) == 1, "every model of one export records the same run"


def test_an_export_out_of_space_is_one_line_and_changes_nothing(
    checkpoints: dict[str, Path], labeled_file: Path, tmp_path: Path
) -> None:
    before = tmp_path / "model_repository"
    _run(*_export_args(checkpoints["first"], labeled_file), "--repository", str(before))
    faults = WriteFaults(
        before,
        python_module(*_export_args(checkpoints["second"], labeled_file), "--repository", REPOSITORY),
        FAMILY_MODELS,
        read_batch(labeled_file, 16),
        "export",
    )
    result = disk_full(faults)
    assert result.ok, result
    assert result.seen.startswith("error: no space left on the device"), result.seen


def test_a_rollout_killed_at_six_points_leaves_every_model_serving(
    checkpoints: dict[str, Path], labeled_file: Path, tmp_path: Path
) -> None:
    before = tmp_path / "model_repository"
    _run(*_export_args(checkpoints["first"], labeled_file), "--repository", str(before), "--hot-budget", "8K")
    assert json.loads((before / "dlrm_onnx" / "export_report.json").read_text())["placement"] == "hot-cold"
    fresh = tmp_path / "fresh.tsv"
    write_tsv(SynthConfig(rows=3_000, seed=29, exponent=0.8), fresh)
    rollout = ["export", "rollout-hot-set", "--repository", REPOSITORY, "--family", "dlrm", "--profile-data",
               str(fresh), "--check-data", str(labeled_file), "--check-rows", "512"]  # fmt: skip
    rows = read_batch(labeled_file, 64)
    # Files only: the points up to the moves (the later ones need a server to load into).
    files_only = WriteFaults(before, python_module(*rollout), FAMILY_MODELS, rows, "rollout")
    _check(interrupted_writes(files_only, ROLLOUT_POINTS[:4]), 4)

    # Against a live server in explicit model-control mode: killed while it loads.
    live = interrupted_live(before, rollout, FAMILY_MODELS, rows, ROLLOUT_POINTS[4:], generate_admin_key())
    _check(live, len(ROLLOUT_POINTS) - 4)


def test_an_export_into_a_polled_repository_never_loads_a_half_written_model(
    start_triton: StartTriton, checkpoints: dict[str, Path], labeled_file: Path, tmp_path: Path
) -> None:
    """A server in poll mode (every second) under checked load while the export of the second
    checkpoint replaces the first: every answer is the first's or the second's, the server never
    fails a load, and in the end it serves the second."""
    repository = tmp_path / "model_repository"
    quick = ["--no-fp16", "--no-int8"]
    _run(*_export_args(checkpoints["first"], labeled_file), *quick, "--repository", str(repository))
    second = tmp_path / "second"
    _run(*_export_args(checkpoints["second"], labeled_file), *quick, "--repository", str(second))
    references = {
        "first": OnnxReference(_copy_model(repository, tmp_path / "first.onnx")),
        "second": OnnxReference(_copy_model(second, tmp_path / "second.onnx")),
    }
    rows = read_batch(labeled_file, 48)
    cases = [
        Case(MODEL, batch, {label: ref.predict(batch) for label, ref in references.items()})
        for batch in (rows.slice(0, 1), rows.slice(1, 17), rows.slice(17, 48))
    ]
    server = start_triton(repository, model_control_mode="poll", extra_args=("--repository-poll-secs=1",))
    endpoints = [Endpoint(server.grpc_url, "grpc"), Endpoint(server.http_url, "http")]
    retry = RetryPolicy(max_tries=20, initial_backoff_s=0.05, max_backoff_s=0.5)
    loop = checked_load(endpoints, cases, rate=60.0, retry=retry, timeout_s=10)
    with loop:
        _wait_for(lambda: loop.total.labels["first"] >= 30, "answers of the first export")
        _run(*_export_args(checkpoints["second"], labeled_file), *quick, "--repository", str(repository))
        _wait_for(lambda: loop.total.labels["second"] >= 30, "the polling server to serve the second export")
    stats = loop.total
    assert stats.wrong == 0 and stats.errors == 0, stats.summary()
    log = server.log_file.read_text()
    assert "failed to load" not in log and "successfully loaded 'dlrm_onnx'" in log.replace('"', "'"), log[
        -2000:
    ]


def _copy_model(repository: Path, to: Path) -> Path:
    return Path(shutil.copyfile(repository / MODEL / "1" / "model.onnx", to))


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
