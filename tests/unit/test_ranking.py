"""Ranking variants in-process: the feature split, the graph, and the local backend's batching of users.

A tiny DLRM is exported once by the real CLIs (opset 17, and opset 13 for the map of
candidates to users that needs no scatter); its ranking graph must answer as the flat
graph on the tiled rows, every user of a batch as alone, and refuse a user with no
candidate or whose parts disagree. The local onnxruntime backend (imported as the stub
imports it) batches users as Triton's C++ backends would hand them to the model.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bundle.errors import ConfigError
from bundle.repository import MODEL_FILE, ServingConfig, build_ranking_config
from bundle.schema import (
    CANDIDATE_CATEGORICAL_INPUT,
    CANDIDATE_DENSE_INPUT,
    CANDIDATE_DENSE_SHAPE_INPUT,
    CANDIDATE_SHAPE_INPUT,
    CATEGORICAL_INPUT,
    CATEGORICAL_NAMES,
    DENSE_INPUT,
    DENSE_NAMES,
    NUM_CATEGORICAL,
    NUM_DENSE,
    USER_DENSE_INPUT,
    FeatureSplit,
    ranking_feeds,
)
from criteo.rows import CATEGORICAL_COLUMNS, DENSE_COLUMNS
from export.ranking.graph import ranking_graph
from tests.python_backends import import_backend, load_instance

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("I1,I2,C1,C3-C9", "C5", "I1-I13,C1-C25", "I1-I13", "C1-C26,I7")
SIZES = (3, 1, 5, 64, 2)


def test_the_schema_names_the_data_contracts_columns() -> None:
    assert (tuple(DENSE_COLUMNS), tuple(CATEGORICAL_COLUMNS)) == (DENSE_NAMES, CATEGORICAL_NAMES)


def test_a_split_reads_names_and_ranges_and_writes_them_back() -> None:
    split = FeatureSplit.parse(" i1, I2 ,C1,C3-C9,C4-C4 ".replace("C4-C4", "C10"))
    assert split.user_dense == (0, 1) and split.user_categorical == (0, 2, 3, 4, 5, 6, 7, 8, 9)
    assert split.text == "I1,I2,C1,C3-C10"
    assert FeatureSplit.parse(split.text) == split
    assert split.candidate_dense == tuple(range(2, NUM_DENSE))
    user, candidate = split.positions((2,) * NUM_CATEGORICAL)
    assert user[:3] == (0, 1, 4) and len(user) + len(candidate) == 2 * NUM_CATEGORICAL


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I14", "names no column"),
        ("X3", "is not a column name"),
        ("C9-C3", "runs backwards"),
        ("C1,C1", "named before"),
        ("", "none named"),
        ("I1-I13,C1-C26", "every feature is the user's"),
        ("I1-C3", "is not a column name"),
    ],
)
def test_a_bad_split_gets_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FeatureSplit.parse(text)


@pytest.fixture(scope="module")
def flat_models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("ranking_unit")
    run = [sys.executable, "-m", "models", "random-dlrm", "--preset", "tiny", "--out", str(root / "dlrm")]
    subprocess.run(run, check=True, capture_output=True, cwd=ROOT)
    paths = {}
    for opset in (13, 17):
        repository = root / f"opset{opset}"
        export = [sys.executable, "-m", "export", "dlrm", "--checkpoint", str(root / "dlrm"),
                  "--repository", str(repository), "--opset", str(opset), "--no-fp16", "--no-int8",
                  "--no-raw-rows", "--check-rows", "1024"]  # fmt: skip
        done = subprocess.run(export, capture_output=True, text=True, cwd=ROOT, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        paths[opset] = repository / "dlrm_onnx" / "1" / MODEL_FILE
    return paths


def _session(model: onnx.ModelProto | Path) -> Any:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _requests(split: FeatureSplit, sizes: tuple[int, ...], seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    requests = []
    for size in sizes:
        dense = np.log1p(rng.integers(0, 1000, (size, NUM_DENSE))).astype(np.float32)
        ids = rng.integers(-(2**62), 2**62, (size, NUM_CATEGORICAL), dtype=np.int64)
        requests.append(split.split(dense, ids))
    return requests


def _flat(session: Any, split: FeatureSplit, requests: list[dict[str, np.ndarray]]) -> np.ndarray:
    tiled = [split.tile(request) for request in requests]
    dense = np.concatenate([part for part, _ in tiled])
    ids = np.concatenate([part for _, part in tiled])
    return session.run(None, {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})[0]


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("text", SPLITS)
def test_the_ranking_graph_answers_as_the_flat_graph_on_the_tiled_rows(
    flat_models: dict[int, Path], opset: int, text: str
) -> None:
    split = FeatureSplit.parse(text)
    source = onnx.load(str(flat_models[opset]))
    made = ranking_graph(source, split)
    assert made.lookups == 1 and made.tiled == ()
    assert made.once == (1 if split.user_categorical else 0)
    onnx.checker.check_model(made.model)
    flat, ranking = _session(flat_models[opset]), _session(made.model)
    requests = _requests(split, SIZES, seed=opset)
    together = ranking.run(None, ranking_feeds(requests, split))[0]
    np.testing.assert_allclose(together, _flat(flat, split, requests), rtol=0, atol=1e-6)
    alone = np.concatenate([ranking.run(None, ranking_feeds([request], split))[0] for request in requests])
    np.testing.assert_allclose(alone, together, rtol=0, atol=1e-6)


def test_the_ranking_graph_refuses_a_user_without_candidates_or_with_parts_that_disagree(
    flat_models: dict[int, Path],
) -> None:
    split = FeatureSplit.parse(SPLITS[0])
    ranking = _session(ranking_graph(onnx.load(str(flat_models[17])), split).model)
    feeds = ranking_feeds(_requests(split, (3, 2), seed=1), split)
    empty = {**feeds, CANDIDATE_SHAPE_INPUT: np.asarray([[3, 18], [0, 18]], np.int32)}
    with pytest.raises(Exception, match="every_user_needs_candidates"):
        ranking.run(None, empty)
    apart = {**feeds, CANDIDATE_DENSE_SHAPE_INPUT: np.asarray([[2, 11], [3, 11]], np.int32)}
    with pytest.raises(Exception, match="its_two_parts_agree_on"):
        ranking.run(None, apart)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    module = import_backend(monkeypatch, "onnxruntime", "ort_backend_ranking")
    utils = sys.modules["triton_python_backend_utils"]
    monkeypatch.setattr(utils, "get_input_tensor_by_name", _Request.tensor, raising=False)
    yield module


def test_the_local_backend_batches_users_and_answers_each_its_own(
    backend: Any, flat_models: dict[int, Path], tmp_path: Path
) -> None:
    split = FeatureSplit.parse(SPLITS[0])
    made = ranking_graph(onnx.load(str(flat_models[17])), split)
    (tmp_path / "1").mkdir()
    onnx.save(made.model, tmp_path / "1" / MODEL_FILE)
    config = build_ranking_config("dlrm_onnx_ranking", ServingConfig(), split)
    instance = load_instance(backend, tmp_path, config)
    requests = _requests(split, SIZES, seed=5)
    answers = instance._run(requests)  # what execute answers a batch of these requests with
    expected = _flat(_session(flat_models[17]), split, requests)
    start = 0
    for request, (answer,) in zip(requests, answers, strict=True):
        count = request[CANDIDATE_DENSE_INPUT].shape[1]
        assert answer.shape == (1, count, 1)
        np.testing.assert_allclose(answer.reshape(-1), expected[start : start + count, 0], rtol=0, atol=1e-6)
        start += count
    bad = {**requests[0], CANDIDATE_CATEGORICAL_INPUT: requests[0][CANDIDATE_CATEGORICAL_INPUT][:, :1]}
    with pytest.raises(backend.RequestError, match="disagree on the number of candidates"):
        instance._read_request(_Request(bad))
    with pytest.raises(backend.RequestError, match="holds no values"):
        instance._read_request(
            _Request({**requests[0], CANDIDATE_DENSE_INPUT: np.zeros((1, 0, 11), np.float32)})
        )
    assert USER_DENSE_INPUT in instance._read_request(_Request(requests[1]))


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class _Request:
    """What ``_read_request`` reads of a ``pb_utils.InferenceRequest``."""

    def __init__(self, inputs: dict[str, np.ndarray]) -> None:
        self._tensors = [_Tensor(name, array) for name, array in inputs.items()]

    def inputs(self) -> list[_Tensor]:
        return self._tensors

    @staticmethod
    def tensor(request: _Request, name: str) -> _Tensor | None:
        """``pb_utils.get_input_tensor_by_name``."""
        return next((tensor for tensor in request._tensors if tensor.name() == name), None)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("BATCH_ELEMENT_COUNT", [6, 2]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT", [6, 8]),
        ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", [0, 6, 8]),
        ("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", [0] * 6),
        ("BATCH_ITEM_SHAPE", [[3, 2], [1, 2]]),
        ("BATCH_ITEM_SHAPE_FLATTEN", [3, 2, 1, 2]),
    ],
)
def test_batch_inputs_are_what_tritons_backends_give_a_model(
    backend: Any, kind: str, expected: list[Any]
) -> None:
    batched = sys.modules["batched_model"]
    spec = batched.BatchInputSpec(kind, ("target",), np.dtype(np.int32), "source")
    value = spec.value([np.zeros((1, 3, 2)), np.zeros((1, 1, 2))])
    assert value.dtype == np.int32 and value.tolist() == expected


def test_a_batch_output_takes_its_source_inputs_shape(backend: Any) -> None:
    batched = sys.modules["batched_model"]
    output = batched.TensorSpec("click_probability", "TYPE_FP32", np.dtype(np.float32), (-1, 1))
    assert batched.BatchOutputSpec.shape(output, (1, 7, 18)) == (1, 7, 1)


def test_a_synthetic_file_of_users_holds_runs_that_share_the_users_features(tmp_path: Path) -> None:
    from clients.ranking import user_runs
    from criteo.synth import SynthConfig, UserRequests, write_tsv
    from criteo.tsv import read_batch

    split = FeatureSplit.parse("I1-I4,C1-C6,C20")
    requests = UserRequests(split, candidates=25, spread="geometric", users=30)
    write_tsv(SynthConfig(rows=4000, seed=3, users=requests), tmp_path / "users.tsv")
    rows = read_batch(tmp_path / "users.tsv", 4000)
    runs = user_runs(split, None, rows.dense, rows.categorical)
    lengths = np.asarray([stop - start for start, stop in runs])
    # Runs of a drawn length around the mean; two requests of one popular user in a row are one run.
    assert lengths.sum() == 4000 and 15 < lengths.mean() < 60
    user, candidate = split.positions()
    for start, stop in runs[:20]:
        assert (rows.categorical[start:stop, list(user)] == rows.categorical[start, list(user)]).all()
        assert (
            rows.dense[start:stop, list(split.user_dense)] == rows.dense[start, list(split.user_dense)]
        ).all()
    # The candidates' own features vary within a run, and the popular users come back.
    start, stop = max(runs, key=lambda run: run[1] - run[0])
    assert len(np.unique(rows.categorical[start:stop, candidate[-1]])) > 1
    keys = {tuple(rows.categorical[start, list(user)]) for start, _ in runs}
    assert len(keys) < len(runs)
    assert rows.labels is not None and 0.05 < float(rows.labels.mean()) < 0.6
    plain = tmp_path / "plain.tsv"
    write_tsv(SynthConfig(rows=100, seed=3), plain)
    assert len(user_runs(split, None, *read_batch(plain, 100).inputs().values())) > 90
