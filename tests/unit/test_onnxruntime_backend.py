"""The local onnxruntime backend's session options, read from a config the repository writer built.

The backend is imported as the stub imports it, with a stand-in for the stub's utilities
(:mod:`tests.python_backends`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from google.protobuf import json_format
from onnx import TensorProto, helper, numpy_helper

from bundle.repository import MODEL_FILE, ORT_SPINNING_KEY, ServingConfig, build_config
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from tests.python_backends import ModelException, import_backend, load_instance


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The onnxruntime backend's ``model`` module, imported as the stub imports it."""
    yield import_backend(monkeypatch, "onnxruntime", "ort_backend_model")


def _tiny_model(path: Path) -> None:
    """``B x 13`` and ``B x 26`` in, ``B x 1`` out: sigmoid of a linear layer on the dense part."""
    weight = numpy_helper.from_array(np.full((NUM_DENSE, 1), 0.1, np.float32), "w")
    nodes = [
        helper.make_node("MatMul", [DENSE_INPUT, "w"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], [OUTPUT]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [
            helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["batch", NUM_DENSE]),
            helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["batch", NUM_CATEGORICAL]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])],
        [weight],
    )
    opset = helper.make_opsetid("", 17)
    model = helper.make_model(
        graph, opset_imports=[opset], ir_version=helper.find_min_ir_version_for([opset])
    )
    path.parent.mkdir(parents=True)
    onnx.save(model, path)


def _load(backend: Any, tmp_path: Path, serving: ServingConfig) -> Any:
    _tiny_model(tmp_path / "1" / MODEL_FILE)
    return load_instance(backend, tmp_path, build_config("dlrm_onnx_int8", serving))


@pytest.mark.parametrize("spinning", [False, True])
def test_spinning_reaches_the_session(backend: Any, tmp_path: Path, spinning: bool) -> None:
    instance = _load(backend, tmp_path, ServingConfig(intra_op_spinning=spinning))
    options = instance._session.get_session_options()
    assert options.get_session_config_entry(ORT_SPINNING_KEY) == ("1" if spinning else "0")


def test_cpu_profile_default_spins() -> None:
    config = build_config("dlrm_onnx_int8", ServingConfig())
    assert config.parameters[ORT_SPINNING_KEY].string_value == "1"


def test_bad_spinning_value_fails_the_load(backend: Any, tmp_path: Path) -> None:
    _tiny_model(tmp_path / "1" / MODEL_FILE)
    config = build_config("dlrm_onnx_int8", ServingConfig())
    config.parameters[ORT_SPINNING_KEY].string_value = "sometimes"
    with pytest.raises(ModelException, match="true or false"):
        backend.TritonPythonModel().initialize(
            {
                "model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
                "model_repository": str(tmp_path),
                "model_version": "1",
                "model_name": config.name,
                "model_instance_name": f"{config.name}_0",
            }
        )


def test_bag_checks_name_the_row_and_table(backend: Any) -> None:
    """A variable-bag request that does not add up gets one line; the names are the schema's."""
    from bundle.schema import LENGTHS_INPUT, VALUES_INPUT, VARIABLE_HOTNESS

    batched = sys.modules["batched_model"]
    assert (batched.BAG_DENSE, batched.BAG_VALUES, batched.BAG_LENGTHS) == (
        DENSE_INPUT,
        VALUES_INPUT,
        LENGTHS_INPUT,
    )
    assert batched.VARIABLE_HOTNESS == VARIABLE_HOTNESS
    lengths = np.ones((3, NUM_CATEGORICAL), dtype=np.int64)
    feeds = {
        DENSE_INPUT: np.zeros((3, NUM_DENSE), np.float32),
        VALUES_INPUT: np.arange(3 * NUM_CATEGORICAL, dtype=np.int64),
        LENGTHS_INPUT: lengths,
    }
    batched.check_bags(feeds)  # fits
    bad = lengths.copy()
    bad[2, 5], bad[2, 6] = -1, 3
    with pytest.raises(batched.RequestError, match=r"row 2, table C6 has a negative bag length \(-1\)"):
        batched.check_bags({**feeds, LENGTHS_INPUT: bad})
    more = lengths.copy()
    more[1, 0] = 4
    with pytest.raises(batched.RequestError, match="adds up to 81 ids, but 'categorical_values' holds 78"):
        batched.check_bags({**feeds, LENGTHS_INPUT: more})
    with pytest.raises(
        batched.RequestError, match="'dense_features' has 2 rows, 'categorical_lengths' has 3"
    ):
        batched.check_bags({**feeds, DENSE_INPUT: np.zeros((2, NUM_DENSE), np.float32)})
