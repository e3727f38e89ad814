"""A hot/cold model served by the real local tritonserver: embedding stage + dense model as one ensemble.

The repository holds a tiny row store (26 tables of different sizes, W = 4), a
hand-made hot set, the stage (``export.tables.ensemble``), a stand-in dense ONNX model
built here whose answer depends on every tier (a Gather over its own hot rows,
a ScatterND of the cold rows, the dense features), and the ensemble. Each
answer is checked against numpy computing the same thing from the tables
directly (per lookup, with Python's ``%`` and a dict of hot ids: nothing shared
with the stage's code).
"""

from __future__ import annotations

import re
import shutil
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from bundle.errors import ConfigError, ServerError
from bundle.repository import MODEL_FILE, ServingConfig, read_config, version_dir, write_config
from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
)
from clients.options import Protocol, SharedMemory
from clients.triton import TritonClient
from export.stage.hot_cold_lookup import PARAM_COLD_READ_HINT_ROWS, PARAM_COLD_READS
from export.tables.ensemble import (
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    write_dense_config,
    write_embedding_stage,
    write_ensemble,
)
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStoreSpec, write_arrays
from server import LocalServer

pytestmark = pytest.mark.integration

FAMILY = "dlrm"
ENSEMBLE = ensemble_model_name(FAMILY)
STAGE = embedding_model_name(FAMILY)
WIDTH = 4
#: 26 tables of different sizes, 3 .. 53 rows.
TABLE_SIZES = tuple(3 + 2 * t for t in range(NUM_CATEGORICAL))
#: ScatterND and ReduceSum with axes as an input need opset >= 13; the stand-in pins one ONNX Runtime runs.
STAND_IN_OPSET = 17
PROTOCOLS = ("http", "grpc")
INT64 = np.iinfo(np.int64)
METRIC = re.compile(r"^ctr_embedding_lookups_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Tiers:
    """What the served model is made of, for the numpy reference.

    Attributes:
        tables: the store's 26 tables, ``size_t x W`` float32.
        hot_ids: each table's hot ids, in slot order (slot ``s`` = ``hot_ids[t][s - 1]``).
        hot_rows: the dense model's own hot rows, ``len(hot_ids[t]) x W`` (not the store's values,
            so a lookup served from the wrong tier changes the answer).
        embedding_weights: ``26 x W``; dense_weights: ``13``; bias: scalar.
    """

    tables: tuple[np.ndarray, ...]
    hot_ids: tuple[np.ndarray, ...]
    hot_rows: tuple[np.ndarray, ...]
    embedding_weights: np.ndarray
    dense_weights: np.ndarray
    bias: float

    def place(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``hot_slots``, ``cold_positions``, ``cold_rows`` and the ``B x 26 x W`` embeddings of raw ids."""
        slot_of = [{int(i): s + 1 for s, i in enumerate(ids_t)} for ids_t in self.hot_ids]
        batch = ids.shape[0]
        slots = np.zeros((batch, NUM_CATEGORICAL), dtype=np.int64)
        embeddings = np.zeros((batch, NUM_CATEGORICAL, WIDTH), dtype=np.float64)
        positions, rows = [], []
        for b in range(batch):
            for t in range(NUM_CATEGORICAL):
                row = int(ids[b, t]) % TABLE_SIZES[t]
                slot = slot_of[t].get(row, 0)
                slots[b, t] = slot
                if slot:
                    embeddings[b, t] = self.hot_rows[t][slot - 1]
                else:
                    positions.append(b * NUM_CATEGORICAL + t)
                    rows.append(self.tables[t][row])
                    embeddings[b, t] = self.tables[t][row]
        cold_rows = np.array(rows, dtype=np.float32).reshape(-1, WIDTH)
        return slots, np.array(positions, dtype=np.int64), cold_rows, embeddings

    def probability(self, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """``B x 1``: sigmoid of the weighted embeddings plus the weighted dense features."""
        embeddings = self.place(ids)[3]
        logit = (embeddings * self.embedding_weights).sum(axis=(1, 2))
        logit += dense.astype(np.float64) @ self.dense_weights + self.bias
        return (1.0 / (1.0 + np.exp(-logit)))[:, None]

    def hot_count(self, ids: np.ndarray) -> int:
        return int(np.count_nonzero(self.place(ids)[0]))


def _make_tiers() -> Tiers:
    rng = np.random.default_rng(7)
    tables = tuple(rng.normal(0, 0.5, (size, WIDTH)).astype(np.float32) for size in TABLE_SIZES)
    # A third of each table's ids (at least one), in a shuffled order: slot order is not id order.
    hot_ids = tuple(rng.permutation(size)[: max(1, size // 3)].astype(np.int64) for size in TABLE_SIZES)
    hot_rows = tuple(rng.normal(0, 0.5, (ids.size, WIDTH)).astype(np.float32) for ids in hot_ids)
    return Tiers(
        tables=tables,
        hot_ids=hot_ids,
        hot_rows=hot_rows,
        embedding_weights=rng.normal(0, 0.3, (NUM_CATEGORICAL, WIDTH)).astype(np.float32),
        dense_weights=rng.normal(0, 0.3, NUM_DENSE).astype(np.float32),
        bias=0.25,
    )


TIERS = _make_tiers()


def _stand_in_dense_model(tiers: Tiers) -> onnx.ModelProto:
    """The dense model's contract with trivial layers: every tier reaches ``click_probability``.

    ``hot = Gather(padded hot rows, t * (H + 1) + hot_slots)`` (slot 0 is a zero row),
    ``cold = ScatterND(zeros[B*26, W], cold_positions, cold_rows)``, then
    ``sigmoid(sum((hot + cold) * E) + dense @ w + b)``.
    """
    stride = max(ids.size for ids in tiers.hot_ids) + 1
    padded = np.zeros((NUM_CATEGORICAL * stride, WIDTH), dtype=np.float32)
    for t, rows in enumerate(tiers.hot_rows):
        padded[t * stride + 1 : t * stride + 1 + rows.shape[0]] = rows
    initializers = [
        numpy_helper.from_array(padded, "hot_table"),
        numpy_helper.from_array((np.arange(NUM_CATEGORICAL) * stride).astype(np.int64), "table_base"),
        numpy_helper.from_array(tiers.embedding_weights, "embedding_weights"),
        numpy_helper.from_array(tiers.dense_weights.reshape(NUM_DENSE, 1), "dense_weights"),
        numpy_helper.from_array(np.array([tiers.bias], dtype=np.float32), "bias"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
        numpy_helper.from_array(np.array([-1, WIDTH], dtype=np.int64), "flat_shape"),
        numpy_helper.from_array(np.array([-1, NUM_CATEGORICAL, WIDTH], dtype=np.int64), "lookup_shape"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis_1"),
        numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "axes_1_2"),
    ]
    nodes = [
        helper.make_node("Add", [HOT_SLOTS, "table_base"], ["hot_index"]),
        helper.make_node("Gather", ["hot_table", "hot_index"], ["hot"]),
        helper.make_node("Mul", ["hot", "zero"], ["zeros"]),
        helper.make_node("Reshape", ["zeros", "flat_shape"], ["zeros_flat"]),
        helper.make_node("Unsqueeze", [COLD_POSITIONS, "axis_1"], ["cold_index"]),
        helper.make_node("ScatterND", ["zeros_flat", "cold_index", COLD_ROWS], ["cold_flat"]),
        helper.make_node("Reshape", ["cold_flat", "lookup_shape"], ["cold"]),
        helper.make_node("Add", ["hot", "cold"], ["embeddings"]),
        helper.make_node("Mul", ["embeddings", "embedding_weights"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted", "axes_1_2"], ["embedding_logit"], keepdims=0),
        helper.make_node("Unsqueeze", ["embedding_logit", "axis_1"], ["embedding_column"]),
        helper.make_node("MatMul", [DENSE_INPUT, "dense_weights"], ["dense_logit"]),
        helper.make_node("Add", ["embedding_column", "dense_logit"], ["partial_logit"]),
        helper.make_node("Add", ["partial_logit", "bias"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    graph = helper.make_graph(
        nodes,
        "hot_cold_stand_in",
        [
            helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["B", NUM_DENSE]),
            helper.make_tensor_value_info(HOT_SLOTS, TensorProto.INT64, ["B", NUM_CATEGORICAL]),
            helper.make_tensor_value_info(COLD_POSITIONS, TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info(COLD_ROWS, TensorProto.FLOAT, ["N", WIDTH]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["B", 1])],
        initializer=initializers,
    )
    opset = helper.make_opsetid("", STAND_IN_OPSET)
    # This onnx writes a newer IR version than ONNX Runtime here reads: the opset's own suffices.
    model = helper.make_model(
        graph, opset_imports=[opset], ir_version=helper.find_min_ir_version_for([opset])
    )
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def hot_cold_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stage (2 instances reading cold rows with threads, its store inside its model folder), the
    stand-in dense model, the ensemble."""
    root = tmp_path_factory.mktemp("hot_cold")
    repository = root / "model_repository"
    # Inside the stage's model folder (not a version folder): written as a relative path.
    store_dir = repository / STAGE / "rows"
    write_arrays(store_dir, RowStoreSpec.for_dlrm(TABLE_SIZES, WIDTH), TIERS.tables)
    hot_set = HotSet(
        table_sizes=TABLE_SIZES,
        row_bytes=(WIDTH * 4,) * NUM_CATEGORICAL,
        budget_bytes=10**6,
        ids=TIERS.hot_ids,
        counts=tuple(np.ones(ids.size, dtype=np.int64) for ids in TIERS.hot_ids),
        profiled_lookups=sum(ids.size for ids in TIERS.hot_ids),
    )
    hot_path = hot_set.save(root / "hot.npz")
    # The stage reads cold rows with two threads here (the default way, prefetch, serves elsewhere).
    write_embedding_stage(
        repository, FAMILY, store_dir, hot_path, TABLE_SIZES, WIDTH, instances=2,
        cold_reads="threads", cold_read_threads=2,
    )  # fmt: skip
    dense_dir = version_dir(repository, dense_model_name(FAMILY))
    dense_dir.mkdir(parents=True)
    onnx.save(_stand_in_dense_model(TIERS), dense_dir / MODEL_FILE)
    write_dense_config(repository, FAMILY, WIDTH, ServingConfig(intra_op_threads=1))
    write_ensemble(repository, FAMILY)
    return repository


@pytest.fixture(scope="module")
def server(start_triton: Any, hot_cold_repository: Path) -> Iterator[LocalServer]:
    server = start_triton(hot_cold_repository)
    yield server
    server.stop()


def _client(server: LocalServer, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(
    server: LocalServer, protocol: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str]
) -> Any:
    module = httpclient if protocol == "http" else grpcclient
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    requested = [module.InferRequestedOutput(name) for name in outputs]
    client = _client(server, protocol)
    try:
        return client.infer(model, tensors, outputs=requested)
    finally:
        client.close()


def _probabilities(server: LocalServer, protocol: str, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    result = _infer(server, protocol, ENSEMBLE, {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}, [OUTPUT])
    return np.asarray(result.as_numpy(OUTPUT))


def _ids(case: str, rng: np.random.Generator) -> np.ndarray:
    """Raw ids for one case; each column's values reduce into its table as the case says."""
    batch = 1 if case == "batch_1" else 8
    ids = np.zeros((batch, NUM_CATEGORICAL), dtype=np.int64)
    for t, size in enumerate(TABLE_SIZES):
        hot = TIERS.hot_ids[t]
        cold = np.setdiff1d(np.arange(size), hot)
        if case == "all_hot":
            # Raw ids a few tables' lengths away (above and below zero) that reduce to hot rows.
            ids[:, t] = rng.choice(hot, batch) + size * rng.integers(-3, 4, batch)
        elif case == "all_cold":
            ids[:, t] = rng.choice(cold, batch)
        elif case == "out_of_range":
            ids[:, t] = rng.integers(INT64.min, INT64.max, batch, dtype=np.int64, endpoint=True)
        else:
            ids[:, t] = rng.integers(0, size, batch)
    if case == "out_of_range":
        ids[0, :4] = [INT64.min, INT64.max, -1, -TABLE_SIZES[3]]
    return ids


CASES = ("all_hot", "all_cold", "mixed", "out_of_range", "batch_1")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", CASES)
def test_ensemble_answers_as_numpy(server: LocalServer, protocol: str, case: str) -> None:
    rng = np.random.default_rng([CASES.index(case), PROTOCOLS.index(protocol)])
    ids = _ids(case, rng)
    dense = rng.normal(0, 1, (ids.shape[0], NUM_DENSE)).astype(np.float32)
    hot = TIERS.hot_count(ids)
    expected_hot = {"all_hot": ids.size, "all_cold": 0}.get(case)
    if expected_hot is not None:
        assert hot == expected_hot
    got = _probabilities(server, protocol, dense, ids)
    assert got.shape == (ids.shape[0], 1) and got.dtype == np.float32
    np.testing.assert_allclose(got, TIERS.probability(dense, ids), rtol=0, atol=1e-6)


def test_stage_outputs_follow_the_contract(server: LocalServer) -> None:
    """The stage itself: hot slots, ascending cold positions and the store's rows, exactly."""
    ids = _ids("out_of_range", np.random.default_rng(3))
    ids[1:] = _ids("mixed", np.random.default_rng(4))[1:]
    result = _infer(server, "grpc", STAGE, {CATEGORICAL_INPUT: ids}, [HOT_SLOTS, COLD_POSITIONS, COLD_ROWS])
    slots, positions, rows, _ = TIERS.place(ids)
    np.testing.assert_array_equal(result.as_numpy(HOT_SLOTS), slots)
    np.testing.assert_array_equal(result.as_numpy(COLD_POSITIONS), positions)
    np.testing.assert_array_equal(result.as_numpy(COLD_ROWS), rows)
    assert result.as_numpy(COLD_ROWS).dtype == np.float32
    assert 0 < positions.size < ids.size


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_request_gets_one_error_and_the_server_stays_up(server: LocalServer, protocol: str) -> None:
    dense = np.zeros((2, NUM_DENSE), dtype=np.float32)
    wrong = np.zeros((2, NUM_CATEGORICAL - 1), dtype=np.int64)
    with pytest.raises(InferenceServerException, match=CATEGORICAL_INPUT):
        _probabilities(server, protocol, dense, wrong)
    # Past Triton's own shape check (-1 matches 0 rows): refused by the stage, naming the input.
    empty = np.zeros((0, NUM_CATEGORICAL), dtype=np.int64)
    with pytest.raises(InferenceServerException, match=f"'{CATEGORICAL_INPUT}' is an empty batch"):
        _probabilities(server, protocol, dense[:0], empty)
    ids = _ids("mixed", np.random.default_rng(5))[:2]
    np.testing.assert_allclose(
        _probabilities(server, protocol, dense, ids), TIERS.probability(dense, ids), rtol=0, atol=1e-6
    )
    assert server.running


def test_bad_requests_in_flight_cost_the_others_nothing(server: LocalServer) -> None:
    """Good and empty requests sent at once: each good one is answered, each bad one refused."""
    rng = np.random.default_rng(6)
    requests = [_ids("mixed", rng)[: 0 if index % 3 == 0 else 4] for index in range(12)]

    def send(index: int) -> np.ndarray | str:
        ids = requests[index]
        dense = np.ones((ids.shape[0], NUM_DENSE), dtype=np.float32)
        try:
            got = _probabilities(server, "grpc", dense, ids)
        except InferenceServerException as exc:
            return str(exc)
        np.testing.assert_allclose(got, TIERS.probability(dense, ids), rtol=0, atol=1e-6)
        return got

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(send, range(12)))
    for index, answer in enumerate(answers):
        if index % 3 == 0:
            assert isinstance(answer, str) and "empty batch" in answer
        else:
            assert isinstance(answer, np.ndarray) and answer.shape == (4, 1)


def _lookup_counters(server: LocalServer) -> dict[str, float]:
    """``{tier: value}`` of the stage's counters on the server's Prometheus page."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    counters: dict[str, float] = {}
    for match in METRIC.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
        if labels.get("model") == STAGE:
            counters[labels["tier"]] = counters.get(labels["tier"], 0.0) + float(match.group("value"))
    return counters


def test_metrics_count_hot_and_cold_lookups(server: LocalServer) -> None:
    before = _lookup_counters(server)
    assert set(before) == {"hot", "cold"}, before
    ids = _ids("mixed", np.random.default_rng(8))
    dense = np.zeros((ids.shape[0], NUM_DENSE), dtype=np.float32)
    _probabilities(server, "http", dense, ids)
    after = _lookup_counters(server)
    hot = TIERS.hot_count(ids)
    assert after["hot"] - before["hot"] == hot
    assert after["cold"] - before["cold"] == ids.size - hot


@pytest.mark.parametrize(("protocol", "shared_memory"), [("http", "none"), ("grpc", "system")])
def test_the_bundle_client_infers_on_the_ensemble(
    server: LocalServer, protocol: Protocol, shared_memory: SharedMemory
) -> None:
    ids = _ids("mixed", np.random.default_rng(9))
    dense = np.zeros((ids.shape[0], NUM_DENSE), dtype=np.float32)
    url = server.http_url if protocol == "http" else server.grpc_url
    with TritonClient(url, protocol, shared_memory=shared_memory) as client:
        got = client.infer(ENSEMBLE, {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})
    np.testing.assert_allclose(got, TIERS.probability(dense, ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("parameter", "value", "message"),
    [
        (
            PARAM_COLD_READS,
            "mmap",
            "'cold_reads' must be one of io_uring, prefetch, threads, fault, got \"mmap\"",
        ),
        (PARAM_COLD_READ_HINT_ROWS, "many", "'cold_read_hint_rows' must be an integer >= 0, got \"many\""),
    ],
)
def test_a_bad_way_of_reading_cold_rows_fails_the_stage_in_one_line(
    start_triton: Any, hot_cold_repository: Path, tmp_path: Path, parameter: str, value: str, message: str
) -> None:
    repository = tmp_path / "model_repository"
    shutil.copytree(hot_cold_repository, repository)
    config = read_config(repository / STAGE / "config.pbtxt")
    config.parameters[parameter].string_value = value
    write_config(repository / STAGE, config)
    server = start_triton(repository, model_control_mode="explicit")
    with pytest.raises(ServerError) as failure:
        server.load_model(STAGE)
    assert message in str(failure.value)
    # The server stays up and loads the rest.
    server.load_model(dense_model_name(FAMILY))
    assert server.running and {(m.name, m.state) for m in server.models()} >= {
        (dense_model_name(FAMILY), "READY")
    }
    server.stop()


def test_the_cold_tier_benchmark_serves_both_conditions(
    hot_cold_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m lab cold-tier`` on this repository: every step answered, the stage's way
    set by the load's config override, the cold step started with the store evicted, and a
    step that hangs once run again on a new server."""
    from lab import cold_tier
    from lab.cold_tier import ColdTierOptions, run_cold_tier, write_cold_tier

    data = tmp_path / "heldout.tsv"
    rng = np.random.default_rng(11)
    with data.open("w") as out:
        for _ in range(40_000):
            ids = "\t".join(f"{v:x}" for v in rng.integers(0, 10**6, NUM_CATEGORICAL))
            out.write("0\t" + "\t".join(["2"] * NUM_DENSE) + "\t" + ids + "\n")
    # A copy: the module's server maps the original store, whose pages no eviction can drop.
    repository = tmp_path / "model_repository"
    shutil.copytree(hot_cold_repository, repository)
    options = ColdTierOptions(
        (repository,), data, ways=("prefetch", "threads"), batch_sizes=(8,), concurrency=(2,),
        rounds=1, seconds=0.5, warmup_s=0.2, probe_seconds=0.1, stream_rows=40_000,
        stage_instances=2, dense_instances=2, dense_threads=1,
    )  # fmt: skip
    # The second step times out once, as a hung server's load would: the round's steps of this
    # store run again on a new server and the report says so.
    real_step, calls = cold_tier._step, []

    def hangs_once(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise TimeoutError("timed out")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(cold_tier, "_step", hangs_once)
    report = run_cold_tier(options, "test")
    steps = report["steps"]
    assert [(s["way"], s["condition"]) for s in steps] == [
        ("prefetch", "cold"), ("prefetch", "warm"), ("threads", "cold"), ("threads", "warm"),
    ]  # fmt: skip
    assert len(calls) == 6 and len(report["retried"]) == 1 and "TimeoutError" in report["retried"][0]
    for step in steps:
        assert step["requests"] > 0 and step["errors"] == 0, step
        assert step["rows_sent"] <= 40_000  # each row once per step
        # The dense model kept the run's config through every reload of the stage and ensemble.
        assert (step["stage_instances"], step["dense_instances"], step["dense_threads"]) == (2, 2, 1), step
        assert step["cold_lookups_per_request"] > 0 and step["stage_ms_per_request"] > 0, step
        # The compiled stage runs in tritonserver's own threads: its CPU is the server's.
        assert step["server_cpu_ms_per_request"] > 0 and "stage_cpu_ms_per_request" not in step, step
        assert step["interrupt_cpu_ms_per_request"] >= 0 and step["steal_cpu_ms_per_request"] >= 0, step
    assert all(s["resident_at_start_bytes"] == 0 for s in steps if s["condition"] == "cold")
    assert report["stores"][0]["dtype"] == "float32" and report["best_iops"] > 0
    paths = write_cold_tier(report, tmp_path / "out")
    markdown = paths["markdown"].read_text()
    assert "| float32 | prefetch | 8 | 2 |" in markdown
    assert "CPU per request, cold / warm" in markdown and "[start:steps]" in markdown
    assert "stage: 2 instance(s) (set for this run)" in markdown
    assert "2 instance(s) x 1 intra-op thread(s) (set for this run)" in markdown
    assert "run again on a new server (the first try's steps dropped): round 1" in markdown
    # A step that would send a row twice stops, saying so, rather than count errors.
    with pytest.raises(ConfigError, match="sent all 64 rows read"):
        run_cold_tier(replace(options, stream_rows=64, ways=("prefetch",)), "test")
    # The stage's own cache in front of io_uring, its misses read with O_DIRECT (which the page
    # cache never sees, and the server's read bytes count): a cache of 10 rows keeps missing.
    monkeypatch.setattr(cold_tier, "_step", real_step)
    with pytest.raises(ConfigError, match="its warm steps must be 'cycled'"):
        replace(options, ways=("io_uring+cache",), cold_cache_bytes=1 << 20)
    cached = run_cold_tier(
        replace(
            options, ways=("io_uring+cache",), cold_cache_bytes=10 * WIDTH * 4, warm="cycled", pool_rows=64
        ),
        "test",
    )
    cold, warm = cached["steps"]
    assert cold["errors"] == warm["errors"] == 0 and cold["requests"] > 0 and warm["requests"] > 0
    assert cold["pages_read_per_request"] > 0, cold
    markdown = write_cold_tier(cached, tmp_path / "cached")["markdown"].read_text()
    assert "| float32 | io_uring+cache | 8 | 2 |" in markdown
    assert "- +cache: the stage keeps a cache of 160 bytes of cold rows" in markdown
