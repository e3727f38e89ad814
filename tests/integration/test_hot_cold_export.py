"""Hot/cold models end to end: models exported by the real CLI, served by the real tritonserver.

Each family (tiny preset, a different size per table) is trained once and exported
twice by ``python -m export``: all tables in the graph into repository A, and with
a hot budget of a few kB (most rows cold) into repository B, where ``<family>_onnx``
is the ensemble of ``<family>_embedding`` and ``<family>_dense``. DLRM takes the
auto placement and profiles its check data; Wide & Deep is forced hot/cold and
profiles ``--profile-data``. A local tritonserver serves B; over HTTP and gRPC, with
the bundle's own client, the ensemble must answer what ONNX Runtime computes on
A's all-in-graph model within 1e-6, for hot, cold, mixed and out-of-range ids and
batch 1, and the stage's hot/cold counters must count exactly the lookups sent.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bundle.repository import read_config
from bundle.schema import (
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    NUM_CATEGORICAL,
    OUTPUT,
    RAW_ROWS_INPUT,
    raw_model_name,
)
from clients.options import Protocol
from clients.triton import TritonClient
from clients.verify import in_process
from criteo.tsv import Batch, parse_lines, read_batch, to_batch
from export.raw_rows import STAGE_MODEL
from export.tables.ensemble import dense_model_name, embedding_model_name, ensemble_model_name
from export.tables.hot_rows import HotSet
from loadtest.engine.payload import build_pool
from server import LocalServer
from tests.cli import run_module as _run

pytestmark = pytest.mark.integration

FAMILIES = ("dlrm", "wide_deep")
PROTOCOLS: tuple[Protocol, ...] = ("http", "grpc")
#: 26 tables of different sizes, 60 .. 635 rows (9,035 rows in all).
TABLE_SIZES = tuple(60 + 23 * t for t in range(NUM_CATEGORICAL))
#: About 250 hot rows of 9,035: most rows are cold, yet every table keeps a few hot.
HOT_BUDGET = "8K"
TOLERANCE = 1e-6
INT64 = np.iinfo(np.int64)
METRIC = re.compile(r"^ctr_embedding_lookups_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$", re.MULTILINE)
CASES = ("hot", "cold", "mixed", "out_of_range", "batch_1_hot", "batch_1_cold")


@dataclass(frozen=True)
class Exports:
    """Repository A (all in the graph), repository B (hot/cold), and what each hot/cold export said."""

    in_graph: Path
    hot_cold: Path
    output: dict[str, str]

    def reference(self, family: str) -> Path:
        return self.in_graph / ensemble_model_name(family) / "1" / "model.onnx"

    def hot_set(self, family: str) -> HotSet:
        return HotSet.load(self.hot_cold / embedding_model_name(family) / "1" / "hot_set.npz")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Exports:
    root = tmp_path_factory.mktemp("hot_cold_export")
    in_graph, hot_cold = root / "repository_a", root / "repository_b"
    sizes = ",".join(map(str, TABLE_SIZES))
    train = ["--data", str(labeled_file), "--preset", "tiny", "--table-sizes", sizes]
    quick = ["--check-data", str(labeled_file), "--check-rows", "1024", "--no-int8", "--no-fp16"]
    budget = ["--hot-budget", HOT_BUDGET]
    split = {
        "dlrm": budget,
        "wide_deep": ["--embeddings", "hot-cold", *budget, "--profile-data", str(labeled_file)],
    }
    output = {}
    for family in FAMILIES:
        command = family.replace("_", "-")
        model = root / family
        _run("models", "train", command, *train, "--out", str(model))
        source = ["--checkpoint" if family == "dlrm" else "--saved-model", str(model)]
        _run("export", command, *source, *quick, "--repository", str(in_graph))
        done = _run("export", command, *source, *quick, "--repository", str(hot_cold), *split[family])
        output[family] = done.stdout + done.stderr
    return Exports(in_graph, hot_cold, output)


@pytest.fixture(scope="module")
def server(start_triton: Any, exports: Exports) -> Iterator[LocalServer]:
    server = start_triton(exports.hot_cold)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 64)


def test_the_export_says_what_it_placed_and_writes_the_ensemble(exports: Exports) -> None:
    assert "more than the hot budget" in exports.output["dlrm"]  # auto: the INFO line says why
    assert "--embeddings hot-cold: the embedding tables take" in exports.output["wide_deep"]
    expected = {f"{family}{suffix}" for family in FAMILIES for suffix in ("_onnx", "_embedding", "_dense")}
    expected |= {raw_model_name(ensemble_model_name(family)) for family in FAMILIES} | {STAGE_MODEL}
    expected |= {raw_model_name(family) for family in FAMILIES}  # over the only served model
    assert {path.name for path in exports.hot_cold.iterdir()} == expected
    for family in FAMILIES:
        name = ensemble_model_name(family)
        assert f"{name}: hot/cold:" in exports.output[family]  # the CLI's summary line
        assert read_config(exports.hot_cold / name / "config.pbtxt").platform == "ensemble"
        report = json.loads((exports.hot_cold / name / "export_report.json").read_text())
        hot = exports.hot_set(family)
        assert report["placement"] == "hot-cold"
        assert report["parity"]["max_abs_diff"] <= TOLERANCE
        assert report["hot_rows"] == hot.rows and report["hot_bytes"] <= 8 * 1024
        assert report["hot_rows"] < report["table_rows"] / 20  # most rows cold
        assert min(hot.table_rows) >= 1  # every table keeps hot rows: the "hot" batches are all hot
        assert report["expected_hit_rate"] == pytest.approx(hot.expected_hit_rate)
        assert hot.expected_hit_rate > 0.2  # skewed lookups: a few hot rows take many of them
        assert 0 < report["measured_hit_rate"]["hit_rate"] < 1
        assert report["profile"]["from"] == ("--check-data" if family == "dlrm" else "--profile-data")
        assert report["row_store"]["dtype"] == "float32"
        assert report["row_store"]["bytes"] == report["table_rows"] * report["row_store"]["width"] * 4


def _ids(case: str, hot: HotSet, rng: np.random.Generator) -> np.ndarray:
    """Raw ids for one case: each column's ids reduce to the rows the case names."""
    batch = 1 if case.startswith("batch_1") else 32
    ids = np.empty((batch, NUM_CATEGORICAL), dtype=np.int64)
    for t, size in enumerate(TABLE_SIZES):
        cold = np.setdiff1d(np.arange(size), hot.ids[t])
        # Raw ids many table lengths away, above and below zero, that reduce to the chosen rows.
        shift = size * rng.integers(-(10**9), 10**9, batch)
        if case in ("hot", "batch_1_hot"):
            ids[:, t] = rng.choice(hot.ids[t], batch) + shift
        elif case in ("cold", "batch_1_cold"):
            ids[:, t] = rng.choice(cold, batch) + shift
        elif case == "out_of_range":
            ids[:, t] = rng.integers(INT64.min, INT64.max, batch, dtype=np.int64, endpoint=True)
        else:
            pool = np.concatenate([hot.ids[t], rng.choice(cold, hot.ids[t].size)])
            ids[:, t] = rng.choice(pool, batch)
    if case == "out_of_range":
        ids[0, :6] = [INT64.min, INT64.max, INT64.min + 1, INT64.max - 1, -1, -TABLE_SIZES[5]]
    return ids


def _lookups(server: LocalServer, family: str) -> dict[str, float]:
    """``{tier: count}`` of the family's embedding stage on the metrics endpoint."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for match in METRIC.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        if labels.get("model") == embedding_model_name(family):
            counts[labels["tier"]] = counts.get(labels["tier"], 0.0) + float(match.group("value"))
    return counts


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("family", FAMILIES)
def test_the_ensemble_answers_as_the_in_graph_model(
    server: LocalServer, exports: Exports, rows: Batch, family: str, protocol: Protocol
) -> None:
    hot = exports.hot_set(family)
    url = server.http_url if protocol == "http" else server.grpc_url
    rng = np.random.default_rng([FAMILIES.index(family), PROTOCOLS.index(protocol)])
    with TritonClient(url, protocol) as client:
        for case in CASES:
            ids = _ids(case, hot, rng)
            batch = Batch(rows.dense[: len(ids)], ids, None)
            hits = int(hot.hits(ids).sum())
            if case.endswith("hot"):
                assert hits == ids.size
            elif case.endswith("cold"):
                assert hits == 0
            before = _lookups(server, family)
            served = client.infer(ensemble_model_name(family), batch.inputs())
            after = _lookups(server, family)
            assert served.shape == (len(ids), 1) and served.dtype == np.float32, case
            expected = in_process(exports.reference(family), batch)
            diff = float(np.max(np.abs(served.astype(np.float64) - expected)))
            assert diff <= TOLERANCE, (case, diff)
            assert after["hot"] - before["hot"] == hits, case
            assert after["cold"] - before["cold"] == ids.size - hits, case


@pytest.mark.parametrize("family", FAMILIES)
def test_the_load_test_payload_runs_on_the_ensemble(
    server: LocalServer, exports: Exports, labeled_file: Path, family: str
) -> None:
    """The load test's request pool (rows of the data file, as locust sends them), batch by batch."""
    pool = build_pool(256, labeled_file, batches=2)
    with TritonClient(server.grpc_url, "grpc") as client:
        for inputs in pool.batches():
            served = client.infer(ensemble_model_name(family), inputs)
            batch = Batch(inputs[DENSE_INPUT], inputs[CATEGORICAL_INPUT], None)
            expected = in_process(exports.reference(family), batch)
            assert float(np.max(np.abs(served.astype(np.float64) - expected))) <= TOLERANCE


def test_only_the_ensemble_and_its_steps_are_served(server: LocalServer) -> None:
    with TritonClient(server.http_url, "http") as client:
        ready = {state.name for state in client.repository_index() if state.state == "READY"}
    names = (ensemble_model_name, embedding_model_name, dense_model_name)
    raw = {raw_model_name(ensemble_model_name(family)) for family in FAMILIES} | {STAGE_MODEL}
    raw |= {raw_model_name(family) for family in FAMILIES}
    assert ready == {name(family) for family in FAMILIES for name in names} | raw


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_raw_rows_through_the_hot_cold_ensemble_score_as_preprocessed_rows(
    server: LocalServer, labeled_file: Path, protocol: Protocol
) -> None:
    """``<family>_onnx_raw`` over the hot/cold ensemble: the raw-row stage, then the embedding
    stage and the dense model, as the ensemble scores the client's own preprocessed rows."""
    lines = [line.split("\t", 1)[1] for line in labeled_file.read_text().splitlines()[:48]]
    batch = to_batch(parse_lines(lines, fields=39))
    module: Any = grpcclient if protocol == "grpc" else httpclient
    raw = module.InferInput(RAW_ROWS_INPUT, [len(lines), 1], "BYTES")
    raw.set_data_from_numpy(np.array([line.encode() for line in lines], dtype=np.object_).reshape(-1, 1))
    with (
        TritonClient(server.grpc_url if protocol == "grpc" else server.http_url, protocol) as client,
        module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url) as plain,
    ):
        for family in FAMILIES:
            expected = client.infer(ensemble_model_name(family), batch.inputs())
            answered = plain.infer(raw_model_name(ensemble_model_name(family)), [raw]).as_numpy(OUTPUT)
            assert answered.shape == expected.shape == (len(lines), 1)
            assert float(np.max(np.abs(answered - expected))) <= TOLERANCE
