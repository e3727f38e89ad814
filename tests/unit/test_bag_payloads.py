"""The load tools' requests for a model of bags of any size, offline: the pool's values and lengths,
cut into requests of any rows, saved and loaded, and the requests built from it (gRPC, HTTP with one
header length, perf_analyzer's whole-request entries)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from bundle.errors import ConfigError, DataError
from bundle.schema import DENSE_INPUT, LENGTHS_INPUT, NUM_CATEGORICAL, VALUES_INPUT, VARIABLE_HOTNESS
from criteo.multihot import draw_bags
from criteo.tsv import Batch
from loadtest.engine.payload import PayloadPool, build_pool
from loadtest.engine.wire import (
    http_bodies,
    http_body,
    http_header_length,
    serialised_requests,
)
from loadtest.sweeps import perf_analyzer


@pytest.fixture(scope="module")
def single() -> PayloadPool:
    return build_pool(1, batches=300)


@pytest.fixture(scope="module")
def bags(single: PayloadPool) -> PayloadPool:
    return single.multi_hot(VARIABLE_HOTNESS)


def test_bags_are_drawn_from_each_rows_ids_as_the_clients_draw_them(
    single: PayloadPool, bags: PayloadPool
) -> None:
    assert bags.variable_bags and bags.text is None
    expected = draw_bags(Batch(single.dense, single.categorical, None))
    np.testing.assert_array_equal(bags.categorical, expected.categorical)
    np.testing.assert_array_equal(bags.lengths, expected.lengths)  # type: ignore[arg-type]
    assert (expected.lengths == 0).any()  # empty bags are among them
    with pytest.raises(ConfigError, match="bags already"):
        bags.multi_hot(VARIABLE_HOTNESS)


def test_any_rows_are_their_own_values_and_lengths(bags: PayloadPool) -> None:
    lengths = bags.lengths
    assert lengths is not None
    starts = np.concatenate(([0], np.cumsum(lengths.sum(axis=1))))
    for start, stop in ((0, 7), (5, 70), (250, 300)):
        rows = bags.rows(start, stop)
        assert list(rows) == [DENSE_INPUT, VALUES_INPUT, LENGTHS_INPUT]
        np.testing.assert_array_equal(rows[VALUES_INPUT], bags.categorical[starts[start] : starts[stop]])
        np.testing.assert_array_equal(rows[LENGTHS_INPUT], lengths[start:stop])
        assert rows[DENSE_INPUT].shape == (stop - start, 13)


def test_rebatched_saved_and_loaded_the_requests_keep_their_rows(bags: PayloadPool, tmp_path: Path) -> None:
    pool = bags.rebatched(64)
    assert len(pool) == 4 and pool.lengths is not None and pool.lengths.shape == (256, NUM_CATEGORICAL)
    assert pool.categorical.size == int(pool.lengths.sum())
    loaded = PayloadPool.load(pool.save(tmp_path / "bags.npz"))
    for index in range(len(pool)):
        for name, array in pool.batch(index).items():
            np.testing.assert_array_equal(loaded.batch(index)[name], array)
    # Fewer rows than one request: the rows repeat, their values with them.
    small = PayloadPool(
        bags.dense[:3], bags.categorical[: int(bags.lengths[:3].sum())], 1, "t", lengths=bags.lengths[:3]
    )  # type: ignore[index]
    tiled = small.rebatched(8)
    np.testing.assert_array_equal(tiled.batch(0)[LENGTHS_INPUT][3:6], small.lengths)
    with pytest.raises(DataError, match="add up"):
        PayloadPool(bags.dense, bags.categorical[:-1], 1, "t", lengths=bags.lengths)


def test_grpc_and_http_requests_carry_each_requests_own_values(bags: PayloadPool) -> None:
    pool = bags.rebatched(32)
    messages = serialised_requests("dlrm_onnx", pool)
    first = service_pb2.ModelInferRequest.FromString(messages[0])
    shapes = {tensor.name: list(tensor.shape) for tensor in first.inputs}
    values = pool.batch(0)[VALUES_INPUT]
    assert shapes == {
        DENSE_INPUT: [32, 13],
        VALUES_INPUT: [values.size],
        LENGTHS_INPUT: [32, NUM_CATEGORICAL],
    }
    assert first.raw_input_contents[1] == values.tobytes()
    # HTTP: one header length for every body, and for any 32 rows from any row of the pool.
    length = http_header_length(pool)
    bodies = http_bodies(pool)
    assert all(
        json.loads(body[:length])["inputs"][1]["shape"] == [pool.batch(i)[VALUES_INPUT].size]
        for i, body in enumerate(bodies)
    )
    for start in range(0, bags.dense.shape[0] - 32, 17):
        body = http_body(bags.rows(start, start + 32), length)
        header = json.loads(body[:length])
        assert header["inputs"][2]["shape"] == [32, NUM_CATEGORICAL]


def test_perf_analyzer_gets_whole_requests_with_their_shapes(bags: PayloadPool, tmp_path: Path) -> None:
    path = perf_analyzer.write_input_data(bags, tmp_path / "in.json", rows=200, batch_size=50)
    entries = json.loads(path.read_text())["data"]
    assert len(entries) == 4
    request = bags.rebatched(50).batch(2)
    for name, array in request.items():
        assert entries[2][name]["shape"] == list(array.shape)
        np.testing.assert_allclose(entries[2][name]["content"], array.reshape(-1))
    assert perf_analyzer.batch_flag(bags.variable_bags, 50) == 1
    assert perf_analyzer.batch_flag(build_pool(8, batches=2).variable_bags, 50) == 50


def test_a_file_of_bags_gives_its_own_bags(tmp_path: Path) -> None:
    """A sweep's --data file of the multi-hot text format is sent as it is (its rows' own bags); a
    Criteo file's rows get bags drawn from their ids."""
    from criteo.multihot import holds_bags, read_bags
    from criteo.synth import SynthConfig, write_tsv
    from loadtest.sweeps.sweep import make_payload

    variable, fixed, criteo = tmp_path / "variable.tsv", tmp_path / "fixed.tsv", tmp_path / "criteo.tsv"
    write_tsv(SynthConfig(rows=500, seed=4, max_vocabulary=1000, bags=VARIABLE_HOTNESS), variable)
    write_tsv(SynthConfig(rows=500, seed=4, max_vocabulary=1000, bags=HOTNESS), fixed)
    write_tsv(SynthConfig(rows=500, seed=4, max_vocabulary=1000), criteo)
    assert holds_bags(variable) and holds_bags(fixed) and not holds_bags(criteo)

    pool = PayloadPool.load(make_payload(tmp_path / "v", variable, hotness=VARIABLE_HOTNESS))
    expected = read_bags(variable)
    np.testing.assert_array_equal(pool.lengths, expected.lengths)  # type: ignore[arg-type]
    np.testing.assert_array_equal(pool.categorical, expected.values)
    streamed = PayloadPool.load(make_payload(tmp_path / "s", variable, stream=True, hotness=VARIABLE_HOTNESS))
    np.testing.assert_array_equal(streamed.rows(10, 20)[LENGTHS_INPUT], expected.lengths[10:20])

    pool = PayloadPool.load(make_payload(tmp_path / "f", fixed, hotness=HOTNESS))
    assert pool.categorical.shape == (500, sum(HOTNESS)) and not pool.variable_bags
    # Bags of other sizes than the model's: one line naming the row and table.
    with pytest.raises(DataError, match="row 1, table C1: 2 ids, the model's bags hold 3"):
        make_payload(tmp_path / "x", fixed, hotness=(3,) * NUM_CATEGORICAL)
    drawn = PayloadPool.load(make_payload(tmp_path / "c", criteo, hotness=VARIABLE_HOTNESS))
    assert drawn.variable_bags and drawn.dense.shape[0] == 500  # bags drawn for the Criteo file's rows


HOTNESS = (2,) * 13 + (1,) * 13
