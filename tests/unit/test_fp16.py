"""export.fp16: a user's own Cast-to-float nodes inside the FP16 region load and run."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from criteo.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from export.fp16 import convert_to_fp16


def test_casts_to_float_in_the_fp16_region_become_casts_to_float16() -> None:
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

    converted = convert_to_fp16(model, ["sigmoid"])

    feeds = {
        DENSE_INPUT: rng.random((4, NUM_DENSE), dtype=np.float32),
        CATEGORICAL_INPUT: rng.integers(0, 3, (4, NUM_CATEGORICAL)),
    }
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    fp16 = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    expected, got = fp32.run([OUTPUT], feeds)[0], fp16.run([OUTPUT], feeds)[0]
    assert got.dtype == np.float32 and got.shape == (4, 1)
    np.testing.assert_allclose(got, expected, atol=5e-3)
