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
from export.graphs import fp16
from export.graphs.fp16 import convert_to_fp16
from export.graphs.onnx_io import save_model


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
