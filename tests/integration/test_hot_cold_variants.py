"""FP16 and INT8 variants of a hot/cold model, through the real CLI and the real tritonserver.

A tiny DLRM (PyTorch) and a tiny Wide & Deep (Keras), each with a different size per
table, are exported hot/cold with a hot budget of a few kB and the cpu profile's
default variants. Each variant must be an ensemble of the one shared stage and its
own dense model, serve over HTTP and gRPC what its two stages compute in-process,
and stay within its AUC tolerance of the FP32 pair. A new hot set rolled out on a
server in explicit model-control mode must switch every ensemble to version 2, and
(FP32 row store) leave every variant's answers where they were: the INT8 dense model
keeps version 1's quantization parameters. Exporting the family in the graph again
removes the variants' ensembles and dense models. A DLRM exported with
``--stream-tables`` (no all-in-graph graph) serves what its stages compute.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bundle.repository import read_config
from bundle.schema import NUM_CATEGORICAL, raw_model_name
from clients.triton import TritonClient
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from export.graphs.parity import compare, extreme_id_rows
from export.tables.ensemble import dense_model_name, embedding_model_name, ensemble_model_name
from export.tables.hot_rows import HotSet
from export.tables.placement import run_hot_cold
from export.tables.row_store import RowStore
from server import LocalServer
from server.security import generate_admin_key
from tests.cli import run_module as _run

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]

FAMILIES = ("dlrm", "wide_deep")
PRECISIONS = ("fp16", "int8")
#: 26 tables of different sizes, 60 .. 635 rows.
TABLE_SIZES = tuple(60 + 23 * t for t in range(NUM_CATEGORICAL))
HOT_BUDGET = "8K"
#: Served vs the same two stages in-process: one ONNX Runtime build on both sides.
SERVED_TOLERANCE = 1e-5
#: A new hot set with an FP32 store: the same values reach the same layers.
ROLLOUT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Exported:
    root: Path
    repository: Path
    output: dict[str, str]
    models: dict[str, Path]
    fresh: Path


def _export_args(family: str, model: Path, labeled_file: Path) -> list[str]:
    source = ["--checkpoint" if family == "dlrm" else "--saved-model", str(model)]
    return [family.replace("_", "-"), *source, "--check-data", str(labeled_file), "--check-rows", "1024"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Exported:
    root = tmp_path_factory.mktemp("hot_cold_variants")
    repository = root / "repository"
    sizes = ",".join(map(str, TABLE_SIZES))
    output, models = {}, {}
    for family in FAMILIES:
        model = root / family
        _run("models", "train", family.replace("_", "-"), "--data", str(labeled_file), "--preset", "tiny",
             "--table-sizes", sizes, "--out", str(model))  # fmt: skip
        done = _run("export", *_export_args(family, model, labeled_file), "--repository", str(repository),
                    "--embeddings", "hot-cold", "--hot-budget", HOT_BUDGET,
                    "--profile-data", str(labeled_file))  # fmt: skip
        output[family], models[family] = done.stdout + done.stderr, model
    fresh = root / "fresh.tsv"
    write_tsv(SynthConfig(rows=3_000, seed=29, exponent=0.8), fresh)
    return Exported(root, repository, output, models, fresh)


@pytest.fixture(scope="module")
def server(start_triton: StartTriton, exported: Exported) -> Iterator[LocalServer]:
    server = start_triton(exported.repository)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def batches(labeled_file: Path) -> list[Batch]:
    rows = read_batch(labeled_file, 1024)
    return [rows.slice(0, 1), rows, extreme_id_rows(rows.slice(0, 64))]


def _stages(repository: Path, family: str, version: int = 1) -> tuple[HotSet, RowStore]:
    stage = repository / embedding_model_name(family)
    return HotSet.load(stage / str(version) / "hot_set.npz"), RowStore.open(stage / "rows")


def _in_process(repository: Path, family: str, precision: str, batch: Batch, version: int = 1) -> np.ndarray:
    hot, store = _stages(repository, family, version)
    dense = repository / dense_model_name(family, precision) / str(version) / "model.onnx"
    return run_hot_cold(dense, hot, store, batch)


def _served(server: LocalServer, name: str, batch: Batch) -> list[np.ndarray]:
    answers = []
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
            answers.append(client.infer(name, batch.inputs()))
    return answers


def _steps(repository: Path, name: str) -> dict[str, int]:
    config = read_config(repository / name / "config.pbtxt")
    assert config.platform == "ensemble"
    return {step.model_name: step.model_version for step in config.ensemble_scheduling.step}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_export_writes_each_variant_over_the_shared_stage(exported: Exported, family: str) -> None:
    stage = embedding_model_name(family)
    for precision in PRECISIONS:
        name = ensemble_model_name(family, precision)
        dense = dense_model_name(family, precision)
        assert f"{name}: {precision.upper()} dense model over {stage}" in exported.output[family]
        assert _steps(exported.repository, name) == {stage: 1, dense: 1}
        config = read_config(exported.repository / dense / "config.pbtxt")
        assert config.backend == "onnxruntime" and config.max_batch_size == 0
        report = json.loads((exported.repository / name / "export_report.json").read_text())
        assert report["recipe"]["precision"] == precision
        assert abs(report["parity"]["auc_delta"]) <= report["recipe"]["auc_tolerance"]
    # One stage and one row store for all three ensembles.
    assert sorted(p.name for p in exported.repository.iterdir() if p.name.startswith(stage)) == [stage]
    int8 = json.loads((exported.repository / f"{family}_onnx_int8" / "export_report.json").read_text())
    assert int8["int8_nodes"] and int8["quantization"]["method"] == "static"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_variant_serves_what_its_two_stages_compute(
    server: LocalServer, exported: Exported, batches: list[Batch], family: str, precision: str
) -> None:
    name = ensemble_model_name(family, precision)
    for batch in batches:  # one row, 1024 rows, and ids at the int64 limits
        expected = _in_process(exported.repository, family, precision, batch)
        for served in _served(server, name, batch):
            assert served.shape == (len(batch), 1) and served.dtype == np.float32
            np.testing.assert_allclose(served, expected, rtol=0, atol=SERVED_TOLERANCE)
    rows = batches[1]
    assert rows.labels is not None
    fp32 = _in_process(exported.repository, family, "", rows)
    variant = _served(server, name, rows)[1]
    report = json.loads((exported.repository / name / "export_report.json").read_text())
    delta = compare(variant, fp32, rows.labels).auc_delta
    assert delta is not None and abs(delta) <= report["recipe"]["auc_tolerance"]
    assert np.max(np.abs(variant - fp32)) > 0  # a variant, not the FP32 model under another name


def test_a_rollout_switches_every_ensemble_and_keeps_the_variants_answers(
    start_triton: StartTriton, exported: Exported, batches: list[Batch], labeled_file: Path, tmp_path: Path
) -> None:
    family = "dlrm"
    repository = tmp_path / "repository"
    shutil.copytree(exported.repository, repository)
    names = [ensemble_model_name(family, precision) for precision in ("", *PRECISIONS)]
    key = generate_admin_key()
    server = start_triton(repository, model_control_mode="explicit", load_models=tuple(names), admin_key=key)
    before = {name: _served(server, name, batches[1])[1] for name in names}
    done = _run("export", "rollout-hot-set", "--repository", str(repository), "--family", family,
                "--profile-data", str(exported.fresh), "--check-data", str(labeled_file),
                "--url", server.http_url, env={**os.environ, "TRITON_ADMIN_KEY": key})  # fmt: skip
    assert f"{family}_onnx: hot set version 2 served:" in done.stdout
    assert "FP16 AUC delta" in done.stdout and "INT8 AUC delta" in done.stdout
    states = {(m.name, m.version): m.state for m in server.models()}
    stage = embedding_model_name(family)
    for precision in ("", *PRECISIONS):
        name, dense = ensemble_model_name(family, precision), dense_model_name(family, precision)
        assert _steps(repository, name) == {stage: 2, dense: 2}
        assert states[(dense, "2")] == "READY" and states.get((dense, "1")) != "READY", states
        assert (repository / dense / "retired" / "1").is_dir()
        for batch in batches:
            expected = _in_process(repository, family, precision, batch, version=2)
            for served in _served(server, name, batch):
                np.testing.assert_allclose(served, expected, rtol=0, atol=SERVED_TOLERANCE)
        # An FP32 store: the new hot set moves no answer, INT8 included.
        np.testing.assert_allclose(
            _served(server, name, batches[1])[1], before[name], rtol=0, atol=ROLLOUT_TOLERANCE
        )
    report = json.loads((repository / f"{family}_onnx_int8" / "export_report.json").read_text())
    assert (
        report["version"] == 2
        and report["rollouts"][-1]["parity_vs_old"]["max_abs_diff"] <= ROLLOUT_TOLERANCE
    )
    server.stop()


def test_exports_that_write_no_variants_remove_them(
    exported: Exported, labeled_file: Path, tmp_path: Path
) -> None:
    family = "dlrm"
    repository = tmp_path / "repository"
    shutil.copytree(exported.repository, repository)
    args = _export_args(family, exported.models[family], labeled_file)
    variants = {f"{family}_{kind}_{p}" for kind in ("onnx", "dense") for p in PRECISIONS}
    # Hot/cold again without variants: none is left out of step with the new dense model.
    _run("export", *args, "--repository", str(repository), "--hot-budget", HOT_BUDGET,
         "--no-fp16", "--no-int8", "--profile-data", str(labeled_file))  # fmt: skip
    assert not variants & {p.name for p in repository.iterdir()}
    # In the graph: the stage and every dense model go; the in-graph variants are plain ONNX models.
    _run("export", *args, "--repository", str(repository))
    left = {p.name for p in repository.iterdir() if p.name.startswith(family)}
    served = {f"{family}_onnx", f"{family}_onnx_fp16", f"{family}_onnx_int8"}
    assert left == served | {raw_model_name(name) for name in served} | {raw_model_name(family)}
    for name in served:
        assert read_config(repository / name / "config.pbtxt").platform != "ensemble"
        assert (repository / name / "1" / "model.onnx").is_file()


def test_a_streamed_export_serves_what_its_stages_compute(
    start_triton: StartTriton, exported: Exported, batches: list[Batch], labeled_file: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "streamed"
    done = _run("export", *_export_args("dlrm", exported.models["dlrm"], labeled_file), "--repository",
                str(repository), "--hot-budget", HOT_BUDGET, "--stream-tables", "--no-int8",
                "--profile-data", str(labeled_file))  # fmt: skip
    assert "dlrm_onnx" in done.stdout and "framework" in done.stdout
    assert not (repository / "dlrm_onnx" / "1" / "model.onnx").exists()
    server = start_triton(repository)
    for precision in ("", "fp16"):
        for batch in batches:
            expected = _in_process(repository, "dlrm", precision, batch)
            for served in _served(server, ensemble_model_name("dlrm", precision), batch):
                np.testing.assert_allclose(served, expected, rtol=0, atol=SERVED_TOLERANCE)
    server.stop()
