"""TensorRT engines built by ``python -m export tensorrt`` from tiny trained models (GPU and TensorRT only).

Runs where ``tensorrt`` (>= 10) imports and a CUDA GPU is visible, e.g. inside
the trt-build image with the bundle's test dependencies; skips cleanly
elsewhere. Checks the built plans against ONNX Runtime FP32 and, on the
engine itself, that ids at the int64 limits, negative or far past the table
give exactly what their reduced ids give (the graph's INT64 ``Mod``), so no
lookup ever fell out of range.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ExportError
from bundle.repository import PLAN_FILE, read_config
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from export.graphs.parity import run_onnx

pytestmark = pytest.mark.gpu

TABLE_SIZE = 500
FAMILIES = ("dlrm", "wide_deep")


def _gpu_or_skip() -> None:
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed (it builds in the compose trt-build service)")
    from export.engines.trt_engine import CudaRuntime, load_tensorrt

    try:
        load_tensorrt()
        if CudaRuntime().device_count() < 1:
            pytest.skip("no CUDA GPU visible")
    except ExportError as exc:
        pytest.skip(str(exc))


def _checked(*args: str) -> str:
    completed = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, f"{args} failed:\n{completed.stdout}\n{completed.stderr}"
    return completed.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(repository, labeled file)``: tiny models exported with --profile gpu, plans built."""
    _gpu_or_skip()
    root = tmp_path_factory.mktemp("trt")
    rows = root / "rows.tsv"
    write_tsv(SynthConfig(rows=6_000, seed=11), rows)
    train = ["--data", str(rows), "--preset", "tiny", "--table-size", str(TABLE_SIZE)]
    repository = root / "model_repository_gpu"
    check = ["--repository", str(repository), "--check-data", str(rows), "--check-rows", "2048"]
    _checked("models", "train", "dlrm", *train, "--out", str(root / "dlrm"))
    _checked("export", "dlrm", "--checkpoint", str(root / "dlrm"), "--profile", "gpu", *check)
    _checked("models", "train", "wide-deep", *train, "--out", str(root / "wide_deep"))
    _checked("export", "wide-deep", "--saved-model", str(root / "wide_deep"), "--profile", "gpu", *check)
    _checked("export", "tensorrt", *check)
    return repository, rows


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_matches_onnx_fp32(built: tuple[Path, Path], family: str) -> None:
    repository, _ = built
    name = f"{family}_trt"
    assert (repository / name / "1" / PLAN_FILE).stat().st_size > 0
    report = json.loads((repository / name / "export_report.json").read_text())
    assert report["checked_against"] == f"{family}_onnx"
    assert abs(report["parity"]["auc_delta"]) <= 1e-3
    assert report["parity"]["max_abs_diff"] <= 0.02 and report["extreme_max_abs_diff"] <= 0.02
    assert report["build_key"]["strongly_typed"] is True
    config = read_config(repository / name / "config.pbtxt")
    assert report["build_key"]["profile"]["max_batch"] >= config.max_batch_size


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_reduces_out_of_range_ids_like_the_graph(built: tuple[Path, Path], family: str) -> None:
    from export.engines.trt_engine import EngineRunner

    repository, rows_file = built
    rows = read_batch(rows_file, 64)
    info = np.iinfo(np.int64)
    extremes = np.array(
        [info.min, info.max, -1, -(2**40) - 3, 2**62 + 11, 10**12, TABLE_SIZE], dtype=np.int64
    )
    ids = np.resize(extremes, rows.categorical.shape)
    ids[:, ::3] = rows.categorical[:, ::3] * -7
    wild = Batch(rows.dense, ids, None)
    # np.mod is floor-mod, as ONNX Mod(fmod=0): the row each id selects in its table.
    reduced = Batch(rows.dense, np.mod(ids, TABLE_SIZE), None)
    plan = (repository / f"{family}_trt" / "1" / PLAN_FILE).read_bytes()
    with EngineRunner(plan) as runner:
        for size in (1, 3, 64):
            got = runner.run(wild.slice(0, size))
            assert got.shape == (size, 1) and got.dtype == np.float32
            assert np.all(np.isfinite(got)) and np.all((got >= 0) & (got <= 1))
            np.testing.assert_array_equal(got, runner.run(reduced.slice(0, size)))
        fp32 = run_onnx(repository / f"{family}_onnx" / "1" / "model.onnx", wild)
        assert float(np.max(np.abs(runner.run(wild) - fp32))) <= 0.02


def test_second_run_keeps_current_plans(built: tuple[Path, Path]) -> None:
    repository, rows = built
    before = {p: p.stat().st_mtime_ns for p in repository.glob(f"*_trt/1/{PLAN_FILE}")}
    output = _checked(
        "export",
        "tensorrt",
        "--repository",
        str(repository),
        "--check-data",
        str(rows),
        "--check-rows",
        "2048",
    )
    assert "(kept)" in output
    assert {p: p.stat().st_mtime_ns for p in before} == before
