"""A new hot set rolled out as a new model version, through the real CLI and the real tritonserver.

A tiny DLRM (a different size per table) is exported twice by ``python -m export``:
all tables in the graph (the reference answers), and hot/cold with a hot budget of a
few kB. A fresh profile (traffic drawn with another seed and a flatter skew) chooses
another hot set; ``python -m export rollout-hot-set --url ...`` writes version 2 of
the stage and the dense model and switches a server in explicit model-control mode
to it while client threads (HTTP and gRPC, retries off) send batches of hot, cold,
mixed and out-of-range ids. Every request must be answered, every answer must equal
the all-in-graph model's within 1e-6 (a stage of one version with the dense model of
the other would answer wrong numbers), and version 2 must be what serves at the end.
Without ``--url`` the files go straight to the final state; bad requests of the
command get one error line and leave the repository as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bundle.repository import read_config
from bundle.schema import NUM_CATEGORICAL
from clients.reference import OnnxReference
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from export.tables.ensemble import (
    LOOKUP_GRAPH_FILE,
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
)
from export.tables.hot_rows import HotSet
from export.tables.placement import run_hot_cold
from export.tables.row_store import RowStore
from lab.soak import Case, Endpoint, checked_load
from server import LocalServer
from server.security import generate_admin_key
from tests.cli import run_module as _run

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]

FAMILY = "dlrm"
NAME, STAGE, DENSE = ensemble_model_name(FAMILY), embedding_model_name(FAMILY), dense_model_name(FAMILY)
#: 26 tables of different sizes, 60 .. 635 rows.
TABLE_SIZES = tuple(60 + 23 * t for t in range(NUM_CATEGORICAL))
HOT_BUDGET = "8K"
TOLERANCE = 1e-6
RATE = 120.0  # requests per second over all workers: steady, and light on 2 shared cores
WARM_REQUESTS = 40
METRIC = re.compile(r'^ctr_embedding_lookups_total\{[^}]*version="(\d+)"[^}]*\}\s+(\S+)$', re.MULTILINE)


@dataclass(frozen=True)
class Exported:
    """The hot/cold repository, the all-in-graph reference graph, and a fresh traffic file."""

    repository: Path
    reference: Path
    fresh: Path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Exported:
    root = tmp_path_factory.mktemp("hot_set_rollout")
    sizes = ",".join(map(str, TABLE_SIZES))
    model = root / "dlrm"
    _run("models", "train", "dlrm", "--data", str(labeled_file), "--preset", "tiny", "--table-sizes", sizes,
         "--out", str(model))  # fmt: skip
    quick = ["--checkpoint", str(model), "--check-data", str(labeled_file), "--check-rows", "1024",
             "--no-int8", "--no-fp16"]  # fmt: skip
    _run("export", "dlrm", *quick, "--repository", str(root / "in_graph"))
    _run("export", "dlrm", *quick, "--repository", str(root / "hot_cold"), "--hot-budget", HOT_BUDGET)
    fresh = root / "fresh.tsv"
    write_tsv(SynthConfig(rows=3_000, seed=29, exponent=0.8), fresh)
    return Exported(root / "hot_cold", root / "in_graph" / NAME / "1" / "model.onnx", fresh)


@pytest.fixture
def repository(exported: Exported, tmp_path: Path) -> Path:
    """A copy of the hot/cold repository that the test may roll forward."""
    copy = tmp_path / "repository"
    shutil.copytree(exported.repository, copy)
    return copy


def _batches(labeled_file: Path) -> list[Batch]:
    rows = read_batch(labeled_file, 200)
    extreme = rows.slice(100, 132)
    ids = extreme.categorical.copy()
    ids[0::3] = np.iinfo(np.int64).max
    ids[1::3] = np.iinfo(np.int64).min
    ids[2::3] = -ids[2::3] - 7
    out_of_range = Batch(extreme.dense, ids, extreme.labels)
    return [rows.slice(0, 1), rows.slice(1, 17), rows.slice(17, 81), out_of_range]


def _hot_set(repository: Path, version: int) -> HotSet:
    folder = repository / STAGE / str(version)
    if not folder.is_dir():  # a replaced version
        folder = repository / STAGE / "retired" / str(version)
    return HotSet.load(folder / "hot_set.npz")


def _steps(repository: Path) -> dict[str, int]:
    config = read_config(repository / NAME / "config.pbtxt")
    return {step.model_name: step.model_version for step in config.ensemble_scheduling.step}


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _exact(server: LocalServer, batches: list[Batch], reference: OnnxReference) -> None:
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
            for batch in batches:
                served = client.infer(NAME, batch.inputs())
                np.testing.assert_allclose(served, reference.predict(batch), rtol=0, atol=TOLERANCE)


def _lookups_by_version(server: LocalServer) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.config.metrics_port}/metrics", timeout=10) as page:
        text = page.read().decode()
    counts: dict[str, float] = {}
    for version, value in METRIC.findall(text):
        counts[version] = counts.get(version, 0.0) + float(value)
    return counts


def test_export_keeps_the_lookup_graph_and_pins_the_versions(exported: Exported) -> None:
    graph = exported.repository / DENSE / LOOKUP_GRAPH_FILE
    assert graph.is_file() and graph.stat().st_size < 200_000  # layers only: no table values
    assert _steps(exported.repository) == {STAGE: 1, DENSE: 1}
    assert (exported.repository / STAGE / "rows" / "store.json").is_file()  # beside the versions


def test_rollout_under_load_switches_versions_without_a_failed_request(
    start_triton: StartTriton, exported: Exported, repository: Path, labeled_file: Path
) -> None:
    key = generate_admin_key()
    server = start_triton(repository, model_control_mode="explicit", load_models=(NAME,), admin_key=key)
    reference = OnnxReference(exported.reference)
    batches = _batches(labeled_file)
    cases = [Case(NAME, batch, {"exact": reference.predict(batch)}, atol=TOLERANCE) for batch in batches]
    workers = [
        Endpoint(server.grpc_url, "grpc"),
        Endpoint(server.http_url, "http"),
        Endpoint(server.grpc_url, "grpc"),
    ]
    loop = checked_load(workers, cases, rate=RATE, retry=RetryPolicy(max_tries=1), timeout_s=30)
    env = {**os.environ, "TRITON_ADMIN_KEY": key}
    with loop:
        _wait_for(lambda: loop.total.requests >= WARM_REQUESTS, "load on version 1")
        done = _run("export", "rollout-hot-set", "--repository", str(repository), "--family", FAMILY,
                    "--profile-data", str(exported.fresh), "--check-data", str(labeled_file),
                    "--url", server.http_url, env=env)  # fmt: skip
        after = loop.total.requests
        _wait_for(lambda: loop.total.requests >= after + WARM_REQUESTS, "load on version 2")
    stats = loop.total

    # Retries were off: every request was answered first time, and every answer was exact.
    assert stats.errors == 0 and stats.wrong == 0, stats.summary()
    assert f"{NAME}: hot set version 2 served:" in done.stdout
    old, new = _hot_set(repository, 1), _hot_set(repository, 2)
    assert any(not np.array_equal(a, b) for a, b in zip(old.ids, new.ids, strict=True))  # a new hot set
    states = {(m.name, m.version): m.state for m in server.models()}
    for model in (STAGE, DENSE):
        assert states[(model, "2")] == "READY" and states.get((model, "1")) != "READY", states
    assert _steps(repository) == {STAGE: 2, DENSE: 2}
    counts = _lookups_by_version(server)
    assert counts.get("2", 0) > 0, counts  # the new stage served lookups
    served_before = counts.get("2", 0)
    _exact(server, batches, reference)
    assert _lookups_by_version(server)["2"] > served_before
    report = json.loads((repository / NAME / "export_report.json").read_text())
    assert report["version"] == 2 and report["hot_rows"] == new.rows
    (rollout,) = report["rollouts"]
    assert rollout["applied_on_server"] and rollout["parity_vs_old"]["max_abs_diff"] <= TOLERANCE


def test_rollout_without_a_server_writes_the_final_state(
    start_triton: StartTriton, exported: Exported, repository: Path, labeled_file: Path
) -> None:
    done = _run("export", "rollout-hot-set", "--repository", str(repository), "--profile-data",
                str(exported.fresh), "--check-data", str(labeled_file))  # fmt: skip
    assert "written (load it on the server" in done.stdout
    assert _steps(repository) == {STAGE: 2, DENSE: 2}
    for model in (STAGE, DENSE):
        assert sorted(p.name for p in (repository / model).iterdir() if p.name.isdigit()) == ["2"]
        assert (repository / model / "retired" / "1").is_dir()
    server = start_triton(repository)
    assert {(m.name, m.version) for m in server.models() if m.state == "READY"} >= {
        (STAGE, "2"),
        (DENSE, "2"),
    }
    _exact(server, _batches(labeled_file), OnnxReference(exported.reference))
    server.stop()


def test_an_int8_store_is_exported_rolled_out_and_served(
    start_triton: StartTriton, exported: Exported, tmp_path: Path, labeled_file: Path
) -> None:
    """The same model with an int8 row store: the INT8 AUC gate at export and at rollout, and
    the served answers equal to the stages run in-process on the same store."""
    repository = tmp_path / "int8"
    _run("export", "dlrm", "--checkpoint", str(exported.repository.parent / "dlrm"), "--check-data",
         str(labeled_file), "--check-rows", "1024", "--no-int8", "--no-fp16", "--repository", str(repository),
         "--hot-budget", HOT_BUDGET, "--store-dtype", "int8")  # fmt: skip
    report = json.loads((repository / NAME / "export_report.json").read_text())
    assert report["row_store"]["dtype"] == "int8" and set(report["tolerance"]) == {"auc_delta"}
    fp32 = json.loads((exported.repository / NAME / "export_report.json").read_text())["row_store"]["bytes"]
    assert report["row_store"]["bytes"] == fp32 // 2  # D 8: 8 codes + a scale and a bias, against 32 bytes
    done = _run("export", "rollout-hot-set", "--repository", str(repository), "--profile-data",
                str(exported.fresh), "--check-data", str(labeled_file))  # fmt: skip
    assert re.search(r"max abs diff vs version 1 \S+, AUC delta [-+]\d", done.stdout), done.stdout
    assert _steps(repository) == {STAGE: 2, DENSE: 2}
    store = RowStore.open(repository / STAGE / "rows")
    hot = _hot_set(repository, 2)
    dense = repository / DENSE / "2" / "model.onnx"
    server = start_triton(repository)
    reference = OnnxReference(exported.reference)
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
            for batch in _batches(labeled_file):
                served = client.infer(NAME, batch.inputs())
                np.testing.assert_allclose(
                    served, run_hot_cold(dense, hot, store, batch), rtol=0, atol=TOLERANCE
                )
                # Within the quantization's reach of the FP32 model.
                np.testing.assert_allclose(served, reference.predict(batch), rtol=0, atol=0.02)
    server.stop()


def test_rollout_refusals_are_one_line_and_change_nothing(
    start_triton: StartTriton, exported: Exported, repository: Path, labeled_file: Path
) -> None:
    def files() -> dict[Path, bytes]:  # the server's stubs may add __pycache__
        return {
            p: p.read_bytes() for p in repository.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        }

    before = files()
    base = ["export", "rollout-hot-set", "--repository", str(repository), "--check-data", str(labeled_file)]

    def refused(*args: str) -> str:
        done = _run(*base, *args, check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr  # INFO lines may come first
        return errors[0]

    # The profile that chose the serving hot set chooses it again.
    assert "nothing to roll out" in refused("--profile-data", str(labeled_file))
    assert "has no model wide_deep_onnx" in refused(
        "--profile-data", str(exported.fresh), "--family", "wide_deep"
    )
    in_graph = exported.reference.parents[2]
    line = refused("--profile-data", str(exported.fresh), "--repository", str(in_graph))
    assert "is not a hot/cold model" in line
    assert "does not exist" in refused("--profile-data", str(repository / "missing.tsv"))
    # A server that does not take explicit loads: the files are put back as they were.
    server = start_triton(repository)
    line = refused("--profile-data", str(exported.fresh), "--url", server.http_url)
    assert "loading" in line and "explicit" in line
    server.stop()
    assert files() == before
