"""Bring-your-own TensorFlow/Keras model: input mapping, dtype/shape handling, format detection, errors.

The mapping and detection tests need no TensorFlow; the conversion tests build
tiny models of their own (tables of 3..60 rows) and convert them without a server.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bundle.errors import ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS
from criteo.tsv import Batch
from export.graphs.parity import run_onnx
from export.importers.keras_inputs import ModelInput, map_inputs
from export.importers.keras_sources import detect_format
from export.importers.onnx_keras import casts_to_fp32, sigmoid_and_logit_sum
from export.importers.sources import SourceOptions, parse_input_map

#: Tables of the per-feature test module: a different size per column.
SIZES = tuple(3 + 2 * i for i in range(NUM_CATEGORICAL))


def _per_feature_inputs(id_shape: tuple[int | None, ...] = (None,)) -> list[ModelInput]:
    dense = [ModelInput(name, "float32", (None, 1)) for name in DENSE_COLUMNS]
    return dense + [ModelInput(name, "int64", id_shape) for name in CATEGORICAL_COLUMNS]


def _options(*entries: str, **kwargs: Any) -> SourceOptions:
    return SourceOptions(input_map=parse_input_map(list(entries)), **kwargs)


# --- input mapping (no TensorFlow) ---------------------------------------------------------------


def test_two_tensors_by_their_own_names() -> None:
    inputs = [
        ModelInput(CATEGORICAL_INPUT, "int64", (None, NUM_CATEGORICAL)),
        ModelInput(DENSE_INPUT, "float32", (None, NUM_DENSE)),
    ]
    bindings = map_inputs(inputs, SourceOptions(), "m")
    assert [(b.input.name, b.describe()) for b in bindings] == [
        (DENSE_INPUT, DENSE_INPUT),
        (CATEGORICAL_INPUT, CATEGORICAL_INPUT),
    ]
    assert [b.per_row_shape for b in bindings] == [(NUM_DENSE,), (NUM_CATEGORICAL,)]


def test_one_input_per_feature_by_default_names() -> None:
    inputs = _per_feature_inputs()
    inputs[NUM_DENSE + 3] = ModelInput("C4", "int32", (None, 1))
    bindings = {b.input.name: b for b in map_inputs(inputs[::-1], SourceOptions(), "m")}
    assert bindings["I4"].describe() == "dense_features[:, 3]"
    assert bindings["C26"].describe() == "categorical_ids[:, 25]"
    assert bindings["C1"].per_row_shape == () and bindings["C4"].per_row_shape == (1,)
    assert bindings["I1"].per_row_shape == (1,)


def test_input_map_names_per_feature_and_two_tensors() -> None:
    inputs = [ModelInput(f"int_{i}", "float64", (None,)) for i in range(NUM_DENSE)]
    inputs += [ModelInput(f"cat_{i}", "int32", None) for i in range(NUM_CATEGORICAL)]
    options = _options("dense_features=int_0..int_12", "categorical_ids=cat_0..cat_25")
    bindings = map_inputs(inputs, options, "m")
    assert [b.input.name for b in bindings] == [i.name for i in inputs]
    assert bindings[-1].describe() == "categorical_ids[:, 25]" and bindings[-1].per_row_shape == (1,)

    two = [ModelInput("dense", "float32", (None, 13)), ModelInput("sparse", "int32", (None, None))]
    bindings = map_inputs(two, _options("dense_features=dense", "categorical_ids=sparse"), "m")
    assert [(b.input.name, b.column) for b in bindings] == [("dense", None), ("sparse", None)]


def _mapping_error(inputs: list[ModelInput], options: SourceOptions | None = None) -> str:
    with pytest.raises(ExportError) as info:
        map_inputs(inputs, options or SourceOptions(), "the SavedModel /m")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the SavedModel /m has inputs that cannot be mapped")
    return message


def test_an_input_nothing_feeds_is_an_error_listing_the_inputs() -> None:
    message = _mapping_error([*_per_feature_inputs(), ModelInput("hour", "int64", (None,))])
    assert "nothing feeds hour" in message
    assert "I1 float32 [None, 1]" in message and "hour int64 [None]" in message
    assert "--input-map" in message


def test_unknown_names_and_mapped_names_the_model_lacks() -> None:
    message = _mapping_error([ModelInput("x", "float32", (None, 3)), ModelInput("y", "int64", (None,))])
    assert "no input named dense_features or I1..I13" in message
    assert "no input named categorical_ids or C1..C26" in message
    assert "nothing feeds x, y" in message

    inputs = _per_feature_inputs()
    message = _mapping_error(inputs[:-1])
    assert "the model has no input C26 (for categorical_ids)" in message

    message = _mapping_error(inputs, _options("categorical_ids=cat_0..cat_25"))
    assert "the model has no input cat_0" in message and "named by --input-map" in message
    assert "nothing feeds C1" in message


@pytest.mark.parametrize(
    ("replaced", "expected"),
    [
        (ModelInput("C3", "string", (None,)), "C3 is string"),
        (ModelInput("C3", "int64", (32, 1)), "fixed batch size 32"),
        (ModelInput("C3", "int64", (None, 2)), "C3 has shape [None, 2], not [None] or [None, 1]"),
        (ModelInput("C3", "int64", (None, 1, 1)), "C3 has shape [None, 1, 1]"),
    ],
)
def test_dtypes_and_shapes_that_cannot_be_fed(replaced: ModelInput, expected: str) -> None:
    inputs = _per_feature_inputs()
    inputs[NUM_DENSE + 2] = replaced
    assert expected in _mapping_error(inputs)


def test_a_whole_tensor_of_the_wrong_width_or_fed_twice() -> None:
    inputs = [ModelInput("dense", "float32", (None, 12)), ModelInput("sparse", "int64", (None, 26))]
    message = _mapping_error(inputs, _options("dense_features=dense", "categorical_ids=sparse"))
    assert "dense has shape [None, 12], not [None, 13] for dense_features" in message
    message = _mapping_error(inputs[1:], _options("dense_features=sparse", "categorical_ids=sparse"))
    assert "sparse is fed twice" in message


# --- format detection (no TensorFlow) ------------------------------------------------------------


def test_detect_format_of_models(tmp_path: Path) -> None:
    saved = tmp_path / "exported"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    assert detect_format(saved) == "savedmodel"
    archive = tmp_path / "m.keras"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("config.json", "{}")
    assert detect_format(archive) == "keras"
    trained = tmp_path / "trained"
    (trained / "saved_model").mkdir(parents=True)
    (trained / "config.json").write_text("{}")
    (trained / "saved_model" / "saved_model.pb").write_bytes(b"")
    assert detect_format(trained) == "bundle"
    assert detect_format(trained / "saved_model") == "bundle"


def _format_error(path: Path) -> str:
    with pytest.raises(ExportError) as info:
        detect_format(path)
    message = str(info.value)
    assert "\n" not in message and "expected a TensorFlow SavedModel folder" in message
    return message


def test_paths_that_are_no_model(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert "is a file of 5 bytes, not a model" in _format_error(text)
    (tmp_path / "empty").mkdir()
    assert "is an empty folder" in _format_error(tmp_path / "empty")
    fake = tmp_path / "fake.keras"
    fake.write_text("not a zip")
    assert "not a Keras archive (not a zip" in _format_error(fake)
    (tmp_path / "old.h5").write_bytes(b"\x89HDF")
    assert "legacy Keras HDF5" in _format_error(tmp_path / "old.h5")
    assert "does not exist" in _format_error(tmp_path / "missing")
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    (outer / "inner" / "saved_model.pb").write_bytes(b"")
    assert f"a SavedModel is in {outer / 'inner'}: pass that" in _format_error(outer)
    assert "pass its folder" in _format_error(outer / "inner" / "saved_model.pb")


# --- FP32 nodes of the FP16 variant (no TensorFlow) ----------------------------------------------


def _graph(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])]
    outputs = [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 1])]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializers))


def test_fp32_nodes_sigmoid_and_the_sum_of_two_logits() -> None:
    bias = numpy_helper.from_array(np.ones((1,), np.float32), "bias")
    two_logits = _graph(
        [
            helper.make_node("Relu", ["x"], ["wide"], name="wide"),
            helper.make_node("Neg", ["x"], ["deep"], name="deep"),
            helper.make_node("Add", ["wide", "deep"], ["logit"], name="sum"),
            helper.make_node("Sigmoid", ["logit"], ["p"], name="sigmoid"),
            helper.make_node("Identity", ["p"], [OUTPUT], name="out"),
        ],
        [],
    )
    assert sigmoid_and_logit_sum(two_logits) == ["sum", "sigmoid"]
    bias_add = _graph(
        [
            helper.make_node("Add", ["x", "bias"], ["logit"], name="bias_add"),
            helper.make_node("Sigmoid", ["logit"], [OUTPUT], name="sigmoid"),
        ],
        [bias],
    )
    assert sigmoid_and_logit_sum(bias_add) == ["sigmoid"]
    no_sigmoid = _graph([helper.make_node("Identity", ["x"], [OUTPUT], name="id")], [])
    assert sigmoid_and_logit_sum(no_sigmoid) == []


def test_casts_to_fp32_are_kept() -> None:
    model = _graph(
        [
            helper.make_node("Cast", ["x"], ["i"], name="to_int", to=TensorProto.INT64),
            helper.make_node("Cast", ["i"], [OUTPUT], name="to_float", to=TensorProto.FLOAT),
        ],
        [],
    )
    assert casts_to_fp32(model) == ["to_float"]


# --- conversion of small models of our own (TensorFlow, no server) -------------------------------


@pytest.fixture(scope="module")
def tf() -> Any:
    from models.wide_deep import quiet_tensorflow

    return quiet_tensorflow()


def _rows(rows: int, seed: int = 0, in_range: bool = True) -> Batch:
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0, 5, (rows, NUM_DENSE)).astype(np.float32)
    if in_range:
        ids = rng.integers(0, np.asarray(SIZES)[None, :], (rows, NUM_CATEGORICAL), dtype=np.int64)
    else:
        ids = rng.integers(-(2**63), 2**63 - 1, (rows, NUM_CATEGORICAL), dtype=np.int64)
        ids[0], ids[1] = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    return Batch(dense, ids, None)


def _per_feature_module(tf: Any, path: Path) -> Path:
    """Dense inputs int_0..int_12 float64 [B]; ids cat_0..cat_25 int32 [B, 1] / int64 [B]; a logit
    of shape [B]; plain tf.gather lookups that do not reduce ids."""
    rng = np.random.default_rng(1)
    specs = [tf.TensorSpec([None], tf.float64, name=f"int_{i}") for i in range(NUM_DENSE)]
    specs += [
        tf.TensorSpec([None, 1] if i % 2 else [None], tf.int32 if i % 2 else tf.int64, name=f"cat_{i}")
        for i in range(NUM_CATEGORICAL)
    ]
    module = tf.Module()
    module.tables = [tf.Variable(rng.normal(0, 0.5, (size, 3)).astype(np.float32)) for size in SIZES]
    module.kernel = tf.Variable(rng.normal(0, 0.3, (NUM_CATEGORICAL * 3 + NUM_DENSE,)).astype(np.float32))

    @tf.function(input_signature=specs)
    def serve(*tensors: Any) -> dict[str, Any]:
        counts = tf.cast(tf.stack(tensors[:NUM_DENSE], axis=1), tf.float32)
        looked_up = [
            tf.gather(table, tf.reshape(ids, [-1]))
            for table, ids in zip(module.tables, tensors[NUM_DENSE:], strict=True)
        ]
        hidden = tf.concat([*looked_up, counts], axis=1)
        return {"score": tf.reduce_sum(hidden * module.kernel, axis=1)}

    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return path


def test_per_feature_savedmodel_dtypes_shapes_and_table_sizes_from_the_graph(tf: Any, tmp_path: Path) -> None:
    from export.importers.keras_sources import open_wide_deep_source

    path = _per_feature_module(tf, tmp_path / "per_feature")
    options = _options("dense_features=int_0..int_12", "categorical_ids=cat_0..cat_25", logits=True)
    exporter = open_wide_deep_source(path, options)
    out = tmp_path / "model.onnx"
    exporter.to_onnx(out, 17)
    graph = onnx.load(str(out))
    assert [i.name for i in graph.graph.input] == [DENSE_INPUT, CATEGORICAL_INPUT]
    assert [o.name for o in graph.graph.output] == [OUTPUT]
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert exporter.table_sizes == SIZES
    source = exporter.source
    assert source["format"] == "savedmodel" and source["signature"] == "serving_default"
    assert source["inputs"]["int_4"] == "dense_features[:, 4]"
    assert source["inputs"]["cat_25"] == "categorical_ids[:, 25]"
    assert source["output"] == "score" and source["id_reduction_added"] is True
    assert source["table_sizes_from"] == "the graph's embedding tables"
    for batch in (_rows(200), _rows(200, seed=2, in_range=False)):
        expected = exporter.predict(batch)
        assert expected.shape == (200, 1) and expected.dtype == np.float32
        np.testing.assert_allclose(run_onnx(out, batch), expected, atol=1e-5)
    # The model's own output on in-range ids, outside the exporter.
    batch = _rows(8)
    loaded = tf.saved_model.load(str(path)).signatures["serving_default"]
    feed = {f"int_{i}": tf.constant(batch.dense[:, i].astype(np.float64)) for i in range(NUM_DENSE)}
    for i in range(NUM_CATEGORICAL):
        column = batch.categorical[:, i]
        feed[f"cat_{i}"] = tf.constant(column[:, None].astype(np.int32) if i % 2 else column)
    own = tf.math.sigmoid(loaded(**feed)["score"]).numpy().reshape(-1, 1)
    np.testing.assert_allclose(exporter.predict(batch), own, atol=1e-6)
    # The weights are initializers, not graph inputs, and the FP16 block list names real nodes.
    assert len(graph.graph.initializer) >= NUM_CATEGORICAL
    names = {node.name for node in graph.graph.node}
    assert set(exporter.fp32_nodes(graph)) <= names


def _signature_module(tf: Any, path: Path, outputs: dict[str, Any]) -> Path:
    module = tf.Module()
    specs = [
        tf.TensorSpec([None, NUM_DENSE], tf.float32, name=DENSE_INPUT),
        tf.TensorSpec([None, NUM_CATEGORICAL], tf.int64, name=CATEGORICAL_INPUT),
    ]

    @tf.function(input_signature=specs)
    def serve(dense: Any, ids: Any) -> dict[str, Any]:
        total = tf.reduce_sum(dense, axis=1, keepdims=True) + tf.cast(
            tf.reduce_sum(tf.math.floormod(ids, 7), axis=1, keepdims=True), tf.float32
        )
        return {name: make(total) for name, make in outputs.items()}

    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return path


def test_output_errors_and_logits_without_flag(tf: Any, tmp_path: Path) -> None:
    from export.importers.keras_sources import open_wide_deep_source

    two = _signature_module(tf, tmp_path / "two", {"p": tf.sigmoid, "q": tf.sigmoid})
    with pytest.raises(ExportError, match=r"has 2 outputs \(p, q\)"):
        open_wide_deep_source(two, SourceOptions())
    wide = _signature_module(tf, tmp_path / "wide", {"p": lambda t: tf.tile(t, [1, 3])})
    with pytest.raises(ExportError, match=r"output p has shape \(None, 3\)"):
        open_wide_deep_source(wide, SourceOptions())
    logits = _signature_module(tf, tmp_path / "logits", {"logit": lambda t: t})
    exporter = open_wide_deep_source(logits, SourceOptions())
    with pytest.raises(ExportError, match=r"outside \[0, 1\].*--logits"):
        exporter.predict(_rows(16))
    # The model reduces ids itself (floormod): no reduction is added and raw ids reach it.
    exporter = open_wide_deep_source(logits, SourceOptions(logits=True))
    exporter.to_onnx(tmp_path / "logits.onnx", 17)
    assert exporter.source["id_reduction_added"] is False
    assert [n.op_type for n in onnx.load(str(tmp_path / "logits.onnx")).graph.node].count("Mod") == 1
    batch = _rows(32, in_range=False)
    np.testing.assert_allclose(run_onnx(tmp_path / "logits.onnx", batch), exporter.predict(batch), atol=1e-6)


def test_an_input_the_model_ignores_stays_in_the_served_interface(tf: Any, tmp_path: Path) -> None:
    from export.importers.keras_sources import open_wide_deep_source

    module = tf.Module()
    specs = [tf.TensorSpec([None, 1], tf.float32, name=name) for name in DENSE_COLUMNS]
    specs += [tf.TensorSpec([None], tf.int64, name=name) for name in CATEGORICAL_COLUMNS]

    @tf.function(input_signature=specs)
    def serve(*tensors: Any) -> dict[str, Any]:
        ids = tf.stack(tensors[NUM_DENSE:], axis=1)
        return {"p": tf.sigmoid(tf.cast(tf.reduce_sum(tf.math.floormod(ids, 5), axis=1), tf.float32) - 50)}

    module.serve = serve
    tf.saved_model.save(module, str(tmp_path / "ids_only"), signatures={"serving_default": serve})
    exporter = open_wide_deep_source(tmp_path / "ids_only", SourceOptions())
    exporter.to_onnx(tmp_path / "ids_only.onnx", 17)
    graph = onnx.load(str(tmp_path / "ids_only.onnx")).graph
    assert [i.name for i in graph.input] == [DENSE_INPUT, CATEGORICAL_INPUT]
    batch = _rows(16, in_range=False)
    np.testing.assert_allclose(
        run_onnx(tmp_path / "ids_only.onnx", batch), exporter.predict(batch), atol=1e-6
    )


def test_keras_file_with_custom_layer_suggests_model_export(tf: Any, tmp_path: Path) -> None:
    import keras

    from export.importers.keras_sources import open_wide_deep_source

    class Doubling(keras.layers.Layer):
        def call(self, x: Any) -> Any:
            return x * 2.0

    dense = keras.Input(shape=(NUM_DENSE,), name=DENSE_INPUT)
    ids = keras.Input(shape=(NUM_CATEGORICAL,), dtype="int64", name=CATEGORICAL_INPUT)
    counts = keras.layers.Concatenate()([Doubling()(dense), keras.ops.cast(ids, "float32")])
    model = keras.Model([dense, ids], keras.layers.Dense(1, activation="sigmoid")(counts))
    path = tmp_path / "custom.keras"
    model.save(str(path))
    with pytest.raises(ExportError) as info:
        open_wide_deep_source(path, SourceOptions())
    message = str(info.value)
    assert "\n" not in message
    assert "custom object 'Doubling' is not defined here" in message and "model.export(DIR)" in message
