"""The in-process reference reads a file the way its graph takes rows: one id per table, bags of
a recorded size, or bags of any size (no server; graphs built by hand, seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bundle.errors import ClientError, DataError
from bundle.schema import (
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    HOTNESS_METADATA,
    LENGTHS_INPUT,
    NUM_CATEGORICAL,
    OUTPUT,
    VALUES_INPUT,
    VARIABLE_HOTNESS,
)
from clients.reference import OnnxReference
from criteo.multihot import read_bags
from criteo.synth import SynthConfig, write_tsv

HOTNESS = (2,) * 13 + (1,) * 13


def _graph(path: Path, inputs: list[onnx.ValueInfoProto], hotness: str | None = None) -> Path:
    """A graph whose answer is the sigmoid of each row's first dense feature (its other inputs
    unused): enough to tell which rows it was given."""
    nodes = [
        helper.make_node("Slice", [DENSE_INPUT, "zero", "one", "one"], ["first"]),
        helper.make_node("Sigmoid", ["first"], [OUTPUT]),
    ]
    constants = [
        helper.make_tensor(name, TensorProto.INT64, [1], [value]) for name, value in (("zero", 0), ("one", 1))
    ]
    graph = helper.make_graph(
        nodes,
        "reference",
        inputs,
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["B", 1])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if hotness is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = HOTNESS_METADATA, hotness
    onnx.save_model(model, str(path))
    return path


def _dense() -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["B", 13])


def _ids(width: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["B", width])


def _file(path: Path, bags: tuple[int, ...] | str | None) -> Path:
    write_tsv(SynthConfig(rows=300, seed=3, max_vocabulary=1000, bags=bags), path)
    return path


def test_bags_of_any_size_are_read_as_values_and_lengths(tmp_path: Path) -> None:
    inputs = [
        _dense(),
        helper.make_tensor_value_info(VALUES_INPUT, TensorProto.INT64, ["N"]),
        helper.make_tensor_value_info(LENGTHS_INPUT, TensorProto.INT64, ["B", NUM_CATEGORICAL]),
    ]
    reference = OnnxReference(_graph(tmp_path / "bags.onnx", inputs))
    assert reference.variable_bags and reference.hotness is None
    data = _file(tmp_path / "bags.tsv", VARIABLE_HOTNESS)
    batches = list(reference.batches(data, 128))
    assert [len(b) for b in batches] == [128, 128, 44]
    expected = read_bags(data)
    np.testing.assert_array_equal(np.concatenate([b.lengths for b in batches]), expected.lengths)  # type: ignore[attr-defined]
    probabilities = np.concatenate([reference.predict(b) for b in batches])
    np.testing.assert_allclose(probabilities[:, 0], 1 / (1 + np.exp(-expected.dense[:, 0])), rtol=1e-6)


def test_bags_of_the_recorded_size_are_read_as_ids(tmp_path: Path) -> None:
    hotness = ",".join(map(str, HOTNESS))
    reference = OnnxReference(_graph(tmp_path / "fixed.onnx", [_dense(), _ids(sum(HOTNESS))], hotness))
    assert reference.hotness == HOTNESS and not reference.variable_bags
    batches = list(reference.batches(_file(tmp_path / "fixed.tsv", HOTNESS), 256))
    assert [b.categorical.shape for b in batches] == [(256, 39), (44, 39)]
    assert reference.predict(batches[0]).shape == (256, 1)
    # A file of one id per table is not what this graph takes: one line, naming the bag.
    with pytest.raises(DataError, match="C1"):
        list(reference.batches(_file(tmp_path / "single.tsv", None), 256))


def test_one_id_per_table_and_a_bad_record(tmp_path: Path) -> None:
    reference = OnnxReference(_graph(tmp_path / "single.onnx", [_dense(), _ids(NUM_CATEGORICAL)]))
    assert reference.hotness is None and not reference.variable_bags
    batches = list(reference.batches(_file(tmp_path / "single.tsv", None), 200))
    assert [b.categorical.shape for b in batches] == [(200, 26), (100, 26)]
    with pytest.raises(ClientError, match="not 26 counts"):
        OnnxReference(_graph(tmp_path / "bad.onnx", [_dense(), _ids(NUM_CATEGORICAL)], "3,4"))
