"""Wide & Deep: model, training, and ONNX export with parity against TensorFlow (tiny preset)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bundle.errors import ConfigError, ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.preprocess import hash_ids
from criteo.synth import SynthConfig, write_tsv
from criteo.tables import table_offsets
from criteo.tsv import Batch, read_batch
from models.config import CONFIG_FILE, DLRMConfig, TrainConfig, WideDeepConfig, save_config

#: The tiny layers with a different size per table, as real Criteo models have.
TINY = WideDeepConfig.preset("tiny", table_sizes=tuple(30 + 41 * t for t in range(NUM_CATEGORICAL)))
EXTREME_IDS = [-1, 2**62, -(2**62), 2**63 - 1, -(2**63), TINY.table_sizes[0], -TINY.table_sizes[3] - 1]


def _random_batch(rows: int, seed: int = 0) -> Batch:
    """Rows with ids spread over all of int64, plus rows of extreme ids."""
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0.0, 8.0, (rows, NUM_DENSE)).astype(np.float32)
    ids = rng.integers(-(2**63), 2**63 - 1, (rows, NUM_CATEGORICAL), dtype=np.int64)
    ids[: rows // 2] = rng.integers(0, 3 * max(TINY.table_sizes), (rows // 2, NUM_CATEGORICAL))
    for i, value in enumerate(EXTREME_IDS):
        ids[i, :] = value
    return Batch(dense, ids, None)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.tsv"
    write_tsv(SynthConfig(rows=4000, seed=3), path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data: Path) -> tuple[Path, dict[str, float]]:
    from models.train_wide_deep import train_wide_deep

    out = tmp_path_factory.mktemp("wide_deep")
    metrics = train_wide_deep(data, out, TINY, TrainConfig(epochs=1, batch_size=256, seed=1))
    return out, metrics


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, trained: tuple[Path, dict[str, float]]):
    from export.importers.onnx_wide_deep import WideDeepExporter

    exporter = WideDeepExporter(trained[0])
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    exporter.to_onnx(path, 17)
    return exporter, path


def test_model_inputs_outputs_and_shapes() -> None:
    import keras

    from models.wide_deep import build_wide_deep, logit_model

    keras.utils.set_random_seed(0)  # an unseeded init can saturate a float32 sigmoid to exactly 1.0
    model = build_wide_deep(TINY)
    assert sorted(t.name for t in model.inputs) == sorted([DENSE_INPUT, CATEGORICAL_INPUT])
    assert model.layers[-1].name == OUTPUT
    batch = _random_batch(16)
    probabilities = np.asarray(model(batch.inputs()))
    logits = np.asarray(logit_model(model)(batch.inputs()))
    assert probabilities.shape == (16, 1) and probabilities.dtype == np.float32
    # float32 sigmoid rounds logits beyond about +-17 to exactly 0 or 1: closed interval, finite.
    assert np.all(np.isfinite(probabilities) & (probabilities >= 0) & (probabilities <= 1))
    np.testing.assert_allclose(probabilities, 1 / (1 + np.exp(-logits)), rtol=1e-5, atol=1e-6)


def test_any_int64_id_is_reduced_into_its_table() -> None:
    from models.wide_deep import build_wide_deep, table_rows

    ids = np.resize(np.array(EXTREME_IDS, dtype=np.int64), (3, NUM_CATEGORICAL))
    rows = np.asarray(table_rows(ids, TINY.table_sizes))
    offsets = np.asarray(table_offsets(TINY.table_sizes))
    np.testing.assert_array_equal(rows - offsets, hash_ids(ids, TINY.table_sizes))

    model = build_wide_deep(TINY)
    dense = np.ones((3, NUM_DENSE), np.float32)
    reduced = hash_ids(ids, TINY.table_sizes)
    raw_out = np.asarray(model({DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}))
    reduced_out = np.asarray(model({DENSE_INPUT: dense, CATEGORICAL_INPUT: reduced}))
    assert np.all(np.isfinite(raw_out))
    np.testing.assert_array_equal(raw_out, reduced_out)


def test_training_writes_saved_model_and_config(trained: tuple[Path, dict[str, float]]) -> None:
    out, metrics = trained
    assert (out / "saved_model" / "saved_model.pb").is_file()
    assert set(metrics) == {"auc", "logloss", "rows"}
    assert 0.0 <= metrics["auc"] <= 1.0 and metrics["logloss"] > 0 and metrics["rows"] == 400
    saved = json.loads((out / CONFIG_FILE).read_text())
    assert saved["model"]["kind"] == "wide_deep"
    assert tuple(saved["model"]["table_sizes"]) == TINY.table_sizes
    assert saved["validation"] == metrics
    assert saved["train"]["batch_size"] == 256


def test_onnx_interface_and_ops(exported) -> None:
    _, path = exported
    model = onnx.load(str(path))
    assert sorted(v.name for v in model.graph.input) == sorted([DENSE_INPUT, CATEGORICAL_INPUT])
    assert [v.name for v in model.graph.output] == [OUTPUT]
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.shape.dim[0].dim_param == "batch"
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Gather") == 2 and "Div" not in ops
    (mod,) = [node for node in model.graph.node if node.op_type == "Mod"]
    assert [a.i for a in mod.attribute if a.name == "fmod"] in ([], [0])
    assert mod.input[0] == CATEGORICAL_INPUT


def test_onnx_matches_tensorflow(exported) -> None:
    exporter, path = exported
    batch = _random_batch(1024, seed=5)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnx_out = session.run([OUTPUT], batch.inputs())[0]
    tf_out = exporter.predict(batch)
    assert onnx_out.shape == tf_out.shape == (1024, 1)
    assert float(np.abs(onnx_out - tf_out).max()) <= 1e-5
    for rows in (1, 7):
        part = batch.slice(0, rows)
        out = session.run([OUTPUT], part.inputs())[0]
        assert out.shape == (rows, 1)
        np.testing.assert_allclose(out, tf_out[:rows], atol=1e-5)


def test_fp32_nodes_exist_and_fp16_runs(exported, data: Path) -> None:
    from export.graphs.fp16 import convert_to_fp16

    exporter, path = exported
    model = onnx.load(str(path))
    keep = exporter.fp32_nodes(model)
    by_name = {node.name: node for node in model.graph.node}
    assert [by_name[name].op_type for name in keep] == ["Add", "Sigmoid"]
    assert by_name[keep[1]].output[0] == OUTPUT
    fp16 = convert_to_fp16(model, keep)
    batch = read_batch(data, 512)
    fp32_out = ort.InferenceSession(str(path)).run(None, batch.inputs())[0]
    fp16_out = ort.InferenceSession(fp16.SerializeToString()).run(None, batch.inputs())[0]
    assert fp16_out.dtype == np.float32
    assert float(np.abs(fp16_out - fp32_out).max()) < 5e-3


def test_exporter_accepts_the_saved_model_folder(trained) -> None:
    from export.importers.onnx_wide_deep import WideDeepExporter

    exporter = WideDeepExporter(trained[0] / "saved_model")
    assert exporter.family == "wide_deep" and exporter.config == TINY


def test_exporter_errors(tmp_path: Path, exported) -> None:
    from export.importers.onnx_wide_deep import WideDeepExporter

    with pytest.raises(ExportError, match="no TensorFlow SavedModel"):
        WideDeepExporter(tmp_path / "missing")
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "saved_model" / "saved_model.pb").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"config\.json"):
        WideDeepExporter(tmp_path)
    save_config(DLRMConfig.preset("tiny"), tmp_path)
    with pytest.raises(ConfigError, match="not wide_deep"):
        WideDeepExporter(tmp_path)
    exporter, _ = exported
    with pytest.raises(ConfigError, match="opset"):
        exporter.to_onnx(tmp_path / "model.onnx", 9)


def test_the_graph_reduces_ids_itself_and_its_sizes_are_readable(exported, tmp_path: Path) -> None:
    """export.graphs.ids reads the table sizes from the Mod in front of the fused lookups, adding nothing."""
    from export.graphs.ids import ensure_id_reduction

    exporter, path = exported
    copy = tmp_path / "model.onnx"
    copy.write_bytes(path.read_bytes())
    reduction = ensure_id_reduction(copy)
    assert not reduction.added
    assert reduction.table_sizes == TINY.table_sizes == exporter.table_sizes
