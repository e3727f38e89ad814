"""export.graphs.ids: probing graphs with out-of-range ids, reading table sizes, inserting the reduction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle.errors import ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from export.graphs.ids import PROBE_IDS, ensure_id_reduction, probe, probe_rows, read_table_sizes

SIZES = tuple(3 + 7 * i for i in range(NUM_CATEGORICAL))
DIM = 4


def _io() -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    inputs = [
        helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["batch", NUM_DENSE]),
        helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["batch", NUM_CATEGORICAL]),
    ]
    outputs = [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])]
    return inputs, outputs


def _head(nodes: list[onnx.NodeProto], summed: str) -> None:
    """dense row-sum + embeddings' sum -> sigmoid -> click_probability (B x 1)."""
    nodes += [
        helper.make_node("ReduceSum", [summed, "axes_1"], ["logit_ids"], keepdims=1),
        helper.make_node("ReduceSum", [DENSE_INPUT, "axes_1"], ["logit_dense"], keepdims=1),
        helper.make_node("Add", ["logit_ids", "logit_dense"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]


def _save(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto], path: Path) -> Path:
    initializers.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axes_1"))
    inputs, outputs = _io()
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def per_column_graph(path: Path, split: bool = False, keras_fixup: bool = False) -> Path:
    """26 tables of different sizes, each looked up with its own column (Gather axis 1, or Split);
    with ``keras_fixup``, through the negative-index fix-up that Keras' Embedding puts in front of
    its lookup (``x < 0 ? x + n : x`` as tf2onnx writes it with Less, Not, Cast, Mul and Add)."""
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    initializers = []
    if split:
        columns = [f"split_{k}" for k in range(NUM_CATEGORICAL)]
        nodes.append(helper.make_node("Split", [CATEGORICAL_INPUT], columns, axis=1))
    pooled = []
    initializers.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"))
    for k, size in enumerate(SIZES):
        initializers.append(numpy_helper.from_array(rng.normal(size=(size, DIM)).astype(np.float32), f"t{k}"))
        if split:
            initializers.append(numpy_helper.from_array(np.array([1], dtype=np.int64), f"sq{k}"))
            nodes.append(helper.make_node("Squeeze", [f"split_{k}", f"sq{k}"], [f"col{k}"]))
        else:
            initializers.append(numpy_helper.from_array(np.array(k, dtype=np.int64), f"k{k}"))
            nodes.append(helper.make_node("Gather", [CATEGORICAL_INPUT, f"k{k}"], [f"col{k}"], axis=1))
        if keras_fixup:
            initializers.append(numpy_helper.from_array(np.array(size, dtype=np.int64), f"n{k}"))
            nodes += [
                helper.make_node("Less", [f"col{k}", "zero"], [f"neg{k}"]),
                helper.make_node("Not", [f"neg{k}"], [f"pos{k}"]),
                helper.make_node("Cast", [f"neg{k}"], [f"negi{k}"], to=TensorProto.INT64),
                helper.make_node("Cast", [f"pos{k}"], [f"posi{k}"], to=TensorProto.INT64),
                helper.make_node("Add", [f"col{k}", f"n{k}"], [f"wrapped{k}"]),
                helper.make_node("Mul", [f"negi{k}", f"wrapped{k}"], [f"a{k}"]),
                helper.make_node("Mul", [f"col{k}", f"posi{k}"], [f"b{k}"]),
                helper.make_node("Add", [f"a{k}", f"b{k}"], [f"fixed{k}"]),
            ]
        source = f"fixed{k}" if keras_fixup else f"col{k}"
        nodes.append(helper.make_node("Cast", [source], [f"c32_{k}"], to=TensorProto.INT32))
        nodes.append(helper.make_node("Gather", [f"t{k}", f"c32_{k}"], [f"e{k}"]))
        pooled.append(f"e{k}")
    nodes.append(helper.make_node("Concat", pooled, ["embedded"], axis=1))
    _head(nodes, "embedded")
    return _save(nodes, initializers, path)


def fused_graph(path: Path, reduce: bool) -> Path:
    """One stacked table; with ``reduce``, Mod by the 26 sizes and Add of the offsets in front (the
    bundle's own layout), else ids offset without a reduction."""
    rng = np.random.default_rng(1)
    offsets = np.cumsum((0, *SIZES[:-1])).astype(np.int64)[None, :]
    initializers = [
        numpy_helper.from_array(rng.normal(size=(sum(SIZES), DIM)).astype(np.float32), "table"),
        numpy_helper.from_array(np.asarray([SIZES], dtype=np.int64), "sizes"),
        numpy_helper.from_array(offsets, "offsets"),
    ]
    nodes = []
    ids = CATEGORICAL_INPUT
    if reduce:
        nodes.append(helper.make_node("Mod", [ids, "sizes"], ["reduced"], fmod=0))
        ids = "reduced"
    nodes += [
        helper.make_node("Add", [ids, "offsets"], ["rows"]),
        helper.make_node("Gather", ["table", "rows"], ["embedded"]),
        helper.make_node("ReduceSum", ["embedded", "axes_1"], ["pooled"], keepdims=0),
    ]
    _head(nodes, "pooled")
    return _save(nodes, initializers, path)


def _run(path: Path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    dense = np.linspace(0, 1, len(ids) * NUM_DENSE, dtype=np.float32).reshape(len(ids), NUM_DENSE)
    return session.run([OUTPUT], {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids})[0]


def _in_range_ids(rows: int = 32) -> np.ndarray:
    rng = np.random.default_rng(2)
    return np.stack([rng.integers(0, size, rows) for size in SIZES], axis=1).astype(np.int64)


@pytest.mark.parametrize(
    ("split", "keras_fixup"),
    [(False, False), (True, False), (False, True)],
    ids=["gather-column", "split", "keras-negative-index-fixup"],
)
def test_per_column_tables_are_read_and_reduced(tmp_path: Path, split: bool, keras_fixup: bool) -> None:
    path = per_column_graph(tmp_path / "m.onnx", split=split, keras_fixup=keras_fixup)
    ids = _in_range_ids()
    before = _run(path, ids)
    assert probe(path) is not None  # out of bounds in ONNX Runtime
    assert read_table_sizes(onnx.load(str(path))) == dict(enumerate(SIZES))

    reduction = ensure_id_reduction(path)

    assert reduction.added and reduction.table_sizes == SIZES
    assert reduction.origin == "the graph's embedding tables"
    assert probe(path) is None
    np.testing.assert_array_equal(_run(path, ids), before)  # in-range ids: the same answers
    extreme = probe_rows()[CATEGORICAL_INPUT]
    np.testing.assert_array_equal(_run(path, extreme), _run(path, reduction.reduce(extreme)))
    assert np.all(reduction.reduce(extreme) >= 0)


def test_given_sizes_win_and_a_graph_that_reduces_is_left_alone(tmp_path: Path) -> None:
    own = fused_graph(tmp_path / "own.onnx", reduce=True)
    bytes_before = own.read_bytes()
    reduction = ensure_id_reduction(own)
    assert not reduction.added and reduction.table_sizes == SIZES
    assert own.read_bytes() == bytes_before
    ids = np.resize(np.array(PROBE_IDS, dtype=np.int64), (2, NUM_CATEGORICAL))
    np.testing.assert_array_equal(reduction.reduce(ids), ids)  # nothing added: ids pass as they are


def test_untraceable_columns_need_table_sizes(tmp_path: Path) -> None:
    path = fused_graph(tmp_path / "fused.onnx", reduce=False)
    with pytest.raises(ExportError, match=r"C1, C2, .*C26 cannot be read.*--table-sizes"):
        ensure_id_reduction(path)
    reduction = ensure_id_reduction(path, SIZES)
    assert reduction.added and reduction.origin == "--table-sizes"
    assert probe(path) is None
    ids = _in_range_ids()
    assert _run(path, ids).shape == (len(ids), 1)


def test_wrong_number_of_sizes_is_a_config_error(tmp_path: Path) -> None:
    path = per_column_graph(tmp_path / "m.onnx")
    with pytest.raises(Exception, match="needs 26 sizes"):
        ensure_id_reduction(path, SIZES[:5])
