"""DLRM: the PyTorch model, its training, and its ONNX export (tiny preset, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from bundle.errors import ConfigError, ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.synth import SynthConfig, write_tsv
from criteo.tables import table_offsets
from criteo.tsv import Batch, read_batch
from export.importers.onnx_dlrm import DLRMExporter
from models.config import CONFIG_FILE, DLRMConfig, TrainConfig, WideDeepConfig, load_config, save_config
from models.dlrm import DLRM, WEIGHTS_FILE
from models.train_dlrm import train_dlrm

#: The tiny layers with a different size per table, as real Criteo models have.
TINY = DLRMConfig.preset("tiny", table_sizes=tuple(40 + 37 * t for t in range(NUM_CATEGORICAL)))
OPSET = 17
#: Ids that a plain lookup would reject: negative, huge, past the table.
EXTREME_IDS = (-1, 2**62, -(2**62), 2**63 - 1, -(2**63), TINY.table_sizes[0] * 7 + 3, TINY.table_sizes[0])


def _random_inputs(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    dense = torch.rand(rows, NUM_DENSE, generator=generator) * 5
    ids = torch.randint(-(2**62), 2**62, (rows, NUM_CATEGORICAL), generator=generator)
    return dense, ids


def test_forward_shapes() -> None:
    torch.manual_seed(0)  # an unseeded init can saturate a float32 sigmoid to exactly 1.0
    model = DLRM(TINY).eval()
    dense, ids = _random_inputs(5)
    with torch.no_grad():
        probabilities = model(dense, ids)
        logits = model.logits(dense, ids)
        embedded = model.embed(ids)
        interaction = model.interaction(model.bottom_mlp(dense), embedded)
    assert probabilities.shape == (5, 1)
    assert probabilities.dtype == torch.float32
    assert logits.shape == (5, 1)
    assert embedded.shape == (5, NUM_CATEGORICAL, TINY.embedding_dim)
    assert interaction.shape == (5, TINY.num_interactions)
    assert TINY.num_interactions == 351 + TINY.embedding_dim
    torch.testing.assert_close(probabilities, torch.sigmoid(logits))
    assert bool((torch.isfinite(probabilities) & (probabilities >= 0) & (probabilities <= 1)).all())


def test_any_int64_id_looks_up_id_mod_table_size() -> None:
    model = DLRM(TINY).eval()
    sizes, offsets = TINY.table_sizes, table_offsets(TINY.table_sizes)
    ids = torch.tensor(
        [[EXTREME_IDS[(row + t) % len(EXTREME_IDS)] for t in range(NUM_CATEGORICAL)] for row in range(7)]
    )
    with torch.no_grad():
        embedded = model.embed(ids)
    weight = model.embedding.weight.detach()
    for row in range(ids.shape[0]):
        for t in range(NUM_CATEGORICAL):
            raw = int(ids[row, t])
            # Python's % is non-negative for a positive size.
            expected = weight[offsets[t] + raw % sizes[t]]
            assert torch.equal(embedded[row, t], expected), (raw, t)


def test_interaction_is_the_lower_triangle_of_dot_products() -> None:
    model = DLRM(TINY)
    dense = torch.randn(2, TINY.embedding_dim)
    embedded = torch.randn(2, NUM_CATEGORICAL, TINY.embedding_dim)
    out = model.interaction(dense, embedded)
    vectors = torch.cat([dense.unsqueeze(1), embedded], dim=1)
    expected = [float(vectors[0, i] @ vectors[0, j]) for i in range(NUM_CATEGORICAL + 1) for j in range(i)]
    torch.testing.assert_close(out[0, : TINY.embedding_dim], dense[0])
    torch.testing.assert_close(out[0, TINY.embedding_dim :], torch.tensor(expected))


@pytest.fixture(scope="module")
def synthetic_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.tsv"
    write_tsv(SynthConfig(rows=3000, seed=3, max_vocabulary=2000), path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, synthetic_file: Path) -> Path:
    out = tmp_path_factory.mktemp("dlrm")
    train_dlrm(synthetic_file, out, TINY, TrainConfig(batch_size=256, learning_rate=3e-3))
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, checkpoint: Path) -> tuple[DLRMExporter, Path]:
    exporter = DLRMExporter(checkpoint)
    path = tmp_path_factory.mktemp("onnx") / "dlrm.onnx"
    exporter.to_onnx(path, OPSET)
    return exporter, path


def test_train_writes_weights_and_config(checkpoint: Path) -> None:
    assert (checkpoint / WEIGHTS_FILE).is_file()
    assert load_config(checkpoint) == TINY
    saved = json.loads((checkpoint / CONFIG_FILE).read_text())
    validation = saved["validation"]
    assert set(validation) == {"auc", "logloss", "rows"}
    assert 0.0 <= validation["auc"] <= 1.0
    assert validation["logloss"] > 0.0
    assert validation["rows"] == 300
    assert saved["train"]["batch_size"] == 256


def test_train_returns_validation_metrics(tmp_path: Path, synthetic_file: Path) -> None:
    metrics = train_dlrm(
        synthetic_file, tmp_path, TINY, TrainConfig(batch_size=512, max_rows=1000), valid=synthetic_file
    )
    assert metrics["rows"] == 3000
    assert 0.0 <= metrics["auc"] <= 1.0


def _parity_batch(path: Path, rows: int = 1024) -> Batch:
    batch = read_batch(path, rows)
    ids = batch.categorical.copy()
    rng = np.random.default_rng(0)
    ids[:64] = rng.integers(-(2**63), 2**63 - 1, (64, NUM_CATEGORICAL), dtype=np.int64, endpoint=True)
    for row, value in enumerate(EXTREME_IDS):
        ids[64 + row] = value
    return Batch(batch.dense, ids, batch.labels)


def test_onnx_matches_torch_on_any_ids(exported: tuple[DLRMExporter, Path], synthetic_file: Path) -> None:
    exporter, path = exported
    batch = _parity_batch(synthetic_file)
    expected = exporter.predict(batch)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run([OUTPUT], batch.inputs())
    assert got.shape == (1024, 1)
    assert got.dtype == np.float32
    assert expected.shape == (1024, 1)
    assert expected.dtype == np.float32
    assert float(np.abs(got - expected).max()) <= 1e-5


def test_onnx_graph_is_clean_with_a_dynamic_batch(exported: tuple[DLRMExporter, Path]) -> None:
    _, path = exported
    model = onnx.load(str(path))
    ops = [node.op_type for node in model.graph.node]
    assert "Loop" not in ops
    assert "Mod" in ops
    assert ops.count("Gather") == 2  # the 26 fused tables, and the interaction's pairs
    assert [i.name for i in model.graph.input] == [DENSE_INPUT, CATEGORICAL_INPUT]
    assert [o.name for o in model.graph.output] == [OUTPUT]
    for value in (*model.graph.input, *model.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for rows in (1, 7):
        dense, ids = _random_inputs(rows, seed=rows)
        (got,) = session.run([OUTPUT], {DENSE_INPUT: dense.numpy(), CATEGORICAL_INPUT: ids.numpy()})
        assert got.shape == (rows, 1)


def test_fp32_nodes_exist_in_the_graph(exported: tuple[DLRMExporter, Path]) -> None:
    exporter, path = exported
    model = onnx.load(str(path))
    names = exporter.fp32_nodes(model)
    by_name = {node.name: node for node in model.graph.node}
    assert names
    assert set(names) <= set(by_name)
    assert any(by_name[name].op_type == "MatMul" for name in names)
    assert any(by_name[name].op_type == "Sigmoid" for name in names)
    assert all("/interaction/" in name or by_name[name].op_type == "Sigmoid" for name in names)


def test_exporter_rejects_a_wide_deep_config(tmp_path: Path) -> None:
    save_config(WideDeepConfig.preset("tiny"), tmp_path)
    with pytest.raises(ConfigError, match="dlrm"):
        DLRMExporter(tmp_path)


def test_exporter_reports_missing_or_corrupt_weights(tmp_path: Path) -> None:
    save_config(TINY, tmp_path)
    with pytest.raises(ExportError, match="not found"):
        DLRMExporter(tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ExportError, match="state dict"):
        DLRMExporter(tmp_path)
    torch.save(DLRM(DLRMConfig.preset("tiny", table_size=10)).state_dict(), tmp_path / WEIGHTS_FILE)
    with pytest.raises(ExportError, match="do not match"):
        DLRMExporter(tmp_path)


def test_exporter_rejects_an_opset_without_mod(exported: tuple[DLRMExporter, Path], tmp_path: Path) -> None:
    exporter, _ = exported
    with pytest.raises(ConfigError, match="opset"):
        exporter.to_onnx(tmp_path / "old.onnx", 10)
    assert not (tmp_path / "old.onnx").exists()


def test_the_graph_reduces_ids_itself_and_its_sizes_are_readable(
    exported: tuple[DLRMExporter, Path], tmp_path: Path
) -> None:
    """export.graphs.ids reads the table sizes from the Mod in front of the fused lookup and adds nothing."""
    from export.graphs.ids import ensure_id_reduction

    exporter, path = exported
    copy = tmp_path / "model.onnx"
    copy.write_bytes(path.read_bytes())
    reduction = ensure_id_reduction(copy)
    assert not reduction.added
    assert reduction.table_sizes == TINY.table_sizes == exporter.table_sizes
    assert copy.read_bytes() == path.read_bytes()
    assert exporter.source["table_sizes"] == list(TINY.table_sizes)
