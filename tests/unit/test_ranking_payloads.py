"""The load tests' requests for a ranking model: a pool of users, each batch one user and its
candidates, sent as one ranking request or, to a flat model beside it, as the tiled rows.

Every engine builds its requests from one :class:`~loadtest.engine.payload.PayloadPool`: the
driver and locust (serialised gRPC messages and HTTP bodies), perf_analyzer (its input data)
and LoadGen (its query samples of drawn pairs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError, DataError
from bundle.schema import (
    CANDIDATE_CATEGORICAL_INPUT,
    CANDIDATE_DENSE_INPUT,
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    USER_CATEGORICAL_INPUT,
    USER_DENSE_INPUT,
    FeatureSplit,
)
from criteo.multihot import MLPERF_HOTNESS
from loadtest.engine.payload import PayloadPool, build_pool, request_form
from loadtest.engine.wire import request_bytes
from loadtest.sweeps import perf_analyzer
from loadtest.sweeps.mlperf import PairsPerQuery, QuerySamples, query_samples
from loadtest.sweeps.runs import models_split

SPLIT = FeatureSplit.parse("I1-I6,C1-C13")
CANDIDATES = 32


@pytest.fixture(scope="module")
def users() -> PayloadPool:
    return build_pool(1, batches=1024, seed=3).ranked(SPLIT)


def test_each_batch_is_one_user_sent_once_or_tiled_for_a_flat_model(users: PayloadPool) -> None:
    pool = users.rebatched(CANDIDATES)
    assert request_form("dlrm_onnx_int8_ranking") == "ranking" and request_form("dlrm_onnx_raw") == "text"
    for index in (0, 5):
        request, flat = pool.batch(index, "ranking"), pool.batch(index)
        assert {name: array.shape for name, array in request.items()} == {
            USER_DENSE_INPUT: (1, 6),
            USER_CATEGORICAL_INPUT: (1, 13),
            CANDIDATE_DENSE_INPUT: (1, CANDIDATES, 7),
            CANDIDATE_CATEGORICAL_INPUT: (1, CANDIDATES, 13),
        }
        dense, ids = SPLIT.tile(request)
        np.testing.assert_array_equal(flat[DENSE_INPUT], dense)
        np.testing.assert_array_equal(flat[CATEGORICAL_INPUT], ids)
        # The user is the batch's first row; each candidate keeps its own row's features.
        start = index * CANDIDATES
        np.testing.assert_array_equal(request[USER_DENSE_INPUT][0], users.dense[start, :6])
        np.testing.assert_array_equal(
            request[CANDIDATE_CATEGORICAL_INPUT][0], users.categorical[start : start + CANDIDATES, 13:]
        )


def test_a_ranking_request_sends_about_half_the_bytes_per_candidate(users: PayloadPool) -> None:
    pool = users.rebatched(128)
    for protocol in ("grpc", "http"):
        ranked = request_bytes(pool, "m_ranking", protocol)
        flat = request_bytes(pool, "m", protocol)
        # Half the features the user's: 7 of 13 dense and 13 of 26 ids a candidate, the user's once.
        assert 0.45 < ranked / flat < 0.55, (protocol, ranked, flat)


def test_the_split_survives_the_pools_file_and_a_multi_hot_model_splits_whole_bags(
    users: PayloadPool, tmp_path: Path
) -> None:
    loaded = PayloadPool.load(users.save(tmp_path / "payload.npz"))
    assert loaded.split == SPLIT and loaded.hotness is None
    bags = build_pool(1, batches=64).multi_hot(MLPERF_HOTNESS).ranked(SPLIT, MLPERF_HOTNESS)
    again = PayloadPool.load(bags.save(tmp_path / "bags.npz")).rebatched(8)
    assert again.hotness == MLPERF_HOTNESS
    user_positions, candidate_positions = SPLIT.positions(MLPERF_HOTNESS)
    request = again.batch(0, "ranking")
    assert request[USER_CATEGORICAL_INPUT].shape == (1, len(user_positions))
    assert request[CANDIDATE_CATEGORICAL_INPUT].shape == (1, 8, len(candidate_positions))


def test_a_ranking_request_from_rows_without_a_split_or_of_bags_of_any_size_is_refused() -> None:
    plain = build_pool(4, batches=2)
    with pytest.raises(DataError, match="knows no split of the features"):
        plain.batch(0, "ranking")
    with pytest.raises(ConfigError, match="not bags of any size"):
        plain.multi_hot("variable").ranked(SPLIT, "variable")


def test_perf_analyzer_gets_whole_user_requests_with_b_1(users: PayloadPool, tmp_path: Path) -> None:
    payload = users.save(tmp_path / "payload.npz")
    data, flag = perf_analyzer.input_data_for(payload, "dlrm_onnx_ranking", CANDIDATES)
    assert flag == 1 and data.name == f"perf_analyzer-input-ranking-b{CANDIDATES}.json"
    entries = json.loads(data.read_text())["data"]
    assert len(entries) == users.dense.shape[0] // CANDIDATES
    first = users.rebatched(CANDIDATES).batch(0, "ranking")
    for name, array in first.items():
        # Under Triton's batch dimension, which perf_analyzer's -b 1 adds: no user axis.
        assert entries[0][name]["shape"] == list(array.shape[1:])
        np.testing.assert_array_equal(np.asarray(entries[0][name]["content"], array.dtype), array.reshape(-1))
    flat, flat_flag = perf_analyzer.input_data_for(payload, "dlrm_onnx", CANDIDATES)
    assert flat_flag == CANDIDATES and flat != data
    rows = json.loads(flat.read_text())["data"]
    tiled = users.rebatched(CANDIDATES).batch(0)
    assert [row[DENSE_INPUT] for row in rows[:CANDIDATES]] == tiled[DENSE_INPUT].tolist()


def test_loadgens_drawn_pairs_are_each_one_user_and_its_candidates(users: PayloadPool) -> None:
    samples = query_samples(users, PairsPerQuery.parse("1:300"), seed=4, form="ranking")
    assert isinstance(samples, QuerySamples)
    for index in range(len(samples)):
        request = samples.batch(index, "ranking")
        assert request[CANDIDATE_DENSE_INPUT].shape == (1, int(samples.sizes[index]), 7)
        assert request[USER_DENSE_INPUT].shape == (1, 6)
    # A sample that wraps past the pool's last row is still one user.
    total = users.dense.shape[0]
    wrapped = QuerySamples(users, np.array([total - 3, 10]), "ranking").batch(1, "ranking")
    np.testing.assert_array_equal(wrapped[USER_DENSE_INPUT][0], users.dense[total - 3, :6])
    assert wrapped[CANDIDATE_DENSE_INPUT].shape == (1, 10, 7)
    with pytest.raises(ConfigError, match="held as 'ranking' requests"):
        samples.batch(0, "rows")


def _ranking_config(repository: Path, model: str, features: str) -> None:
    (repository / model).mkdir(parents=True)
    (repository / model / "config.pbtxt").write_text(
        f'name: "{model}"\nbackend: "onnxruntime"\nmax_batch_size: 64\n'
        f'parameters {{ key: "user_features" value {{ string_value: "{features}" }} }}\n'
    )


def test_the_swept_ranking_models_split_comes_from_their_configs(tmp_path: Path) -> None:
    _ranking_config(tmp_path, "a_ranking", "I1-I6,C1-C13")
    _ranking_config(tmp_path, "b_ranking", "C5")
    assert models_split(tmp_path, [], [], ["a", "a_ranking"]) == SPLIT
    assert models_split(tmp_path, [], [], ["a", "b"]) is None
    with pytest.raises(ConfigError, match="split the features differently"):
        models_split(tmp_path, [], [], ["a_ranking", "b_ranking"])
