"""export.graphs.fp16: a user's own Cast-to-float nodes inside the FP16 region load and run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle.errors import ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from export.graphs import fp16, onnx_io
from export.graphs.fp16 import convert_to_fp16
from export.graphs.onnx_io import DataFile, save_model


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(
        rng.normal(size=(NUM_DENSE + NUM_CATEGORICAL, 1)).astype(np.float32), "w"
    )
    nodes = [
        # ids as float features: the pattern onnxconverter-common leaves at to=FLOAT
        helper.make_node("Cast", [CATEGORICAL_INPUT], ["ids_f"], name="ids_to_float", to=TensorProto.FLOAT),
        helper.make_node("Concat", [DENSE_INPUT, "ids_f"], ["features"], name="concat", axis=1),
        helper.make_node("MatMul", ["features", "w"], ["logit"], name="matmul"),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["batch", NUM_DENSE]),
            helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["batch", NUM_CATEGORICAL]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(model: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    rng = np.random.default_rng(1)
    feeds = {
        DENSE_INPUT: rng.random((4, NUM_DENSE), dtype=np.float32),
        CATEGORICAL_INPUT: rng.integers(0, 3, (4, NUM_CATEGORICAL)),
    }
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    fp16 = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    expected, got = fp32.run([OUTPUT], feeds)[0], fp16.run([OUTPUT], feeds)[0]
    assert got.dtype == np.float32 and got.shape == (4, 1)
    np.testing.assert_allclose(got, expected, atol=5e-3)


def test_casts_to_float_in_the_fp16_region_become_casts_to_float16() -> None:
    model = _model()
    _check(model, convert_to_fp16(model, ["sigmoid"]))


def test_a_graph_over_the_protobuf_limit_takes_its_shapes_from_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over 2 GB the converter's in-memory shape inference fails: the shapes come from the file
    (weights in external data). Here the limit is lowered to 0 bytes to take that path."""
    path = tmp_path / "model.onnx"
    save_model(_model(), path, threshold=0)
    monkeypatch.setattr(fp16, "EXTERNAL_DATA_THRESHOLD", 0)
    model = onnx.load(str(path))
    with pytest.raises(ExportError, match="needs the path"):
        convert_to_fp16(model, ["sigmoid"])
    converted = convert_to_fp16(model, ["sigmoid"], source=path)
    assert not list(tmp_path.glob("*.shapes"))
    _check(_model(), converted)


def _table_model() -> onnx.ModelProto:
    """``Sigmoid((Gather(table, ids) @ w) @ kept_w @ w2)``: every weight large enough to go
    external; ``kept_w`` feeds a node kept in FP32."""
    rng = np.random.default_rng(2)
    initializers = [
        numpy_helper.from_array(rng.normal(size=(3000, 8)).astype(np.float32) * 0.1, "table"),
        numpy_helper.from_array(rng.normal(size=(8, 300)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(rng.normal(size=(300, 300)).astype(np.float32) * 0.05, "kept_w"),
        numpy_helper.from_array(rng.normal(size=(300, 1)).astype(np.float32) * 0.05, "w2"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather", axis=0),
        helper.make_node("MatMul", ["rows", "w"], ["hidden"], name="matmul"),
        helper.make_node("MatMul", ["hidden", "kept_w"], ["wide"], name="kept"),
        helper.make_node("MatMul", ["wide", "w2"], ["logit"], name="last"),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT], name="sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {
        t.name: numpy_helper.to_array(t, base_dir=str(path.parent))
        for t in onnx.load(str(path)).graph.initializer
    }


def test_weights_left_in_their_data_file_convert_in_chunks_as_the_converter_converts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The FP16 file made from a graph whose weights were never loaded (converted 4 KiB at a time)
    holds the same tensors as the converter's own in-memory conversion, and answers the same."""
    fp32_path = tmp_path / "fp32" / "model.onnx"
    save_model(_table_model(), fp32_path, threshold=0)
    monkeypatch.setattr(onnx_io, "COPY_CHUNK", 4096)
    in_memory = tmp_path / "memory" / "model.onnx"
    save_model(convert_to_fp16(onnx.load(str(fp32_path)), ["kept", "sigmoid"]), in_memory)

    streamed = tmp_path / "streamed" / "model.onnx"
    graph = onnx.load(str(fp32_path), load_external_data=False)
    with pytest.raises(ExportError, match="needs their file"):
        convert_to_fp16(graph, ["kept", "sigmoid"], source=fp32_path)
    data = DataFile(streamed)
    converted = convert_to_fp16(graph, ["kept", "sigmoid"], source=fp32_path, data=data)
    save_model(converted, streamed, source_dir=fp32_path.parent, data=data)

    expected, got = _initializers(in_memory), _initializers(streamed)
    assert {name: a.dtype for name, a in got.items()} == {name: a.dtype for name, a in expected.items()}
    assert got["kept_w"].dtype == np.float32 and got["table"].dtype == np.float16
    for name, array in expected.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)
    feeds = {"ids": np.array([0, 7, 2999, 7])}
    run = [
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run([OUTPUT], feeds)[0]
        for path in (in_memory, streamed)
    ]
    np.testing.assert_array_equal(run[1], run[0])
