"""Taking a graph's table lookups out for the INT8 quantizer and putting them back (seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import export.graphs.lookup_cut as lookup_cut
import export.graphs.onnx_io as onnx_io
from bundle.memory import PeakMemory, resident
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from export.graphs.lookup_cut import cut_lookups, put_back_lookups, topological_order
from export.graphs.onnx_io import external_tensors, save_model
from export.graphs.parity import run_onnx
from export.graphs.quantize import QuantizeOptions, quantize_int8, quantized_op_counts
from export.importers.onnx_dlrm import DLRMExporter
from models.config import DLRMConfig, TrainConfig
from models.train_dlrm import train_dlrm


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.tsv"
    write_tsv(SynthConfig(rows=3000, seed=7, max_vocabulary=2000), path)
    return path


@pytest.fixture(scope="module")
def exporter(tmp_path_factory: pytest.TempPathFactory, data: Path) -> DLRMExporter:
    out = tmp_path_factory.mktemp("dlrm")
    train_dlrm(data, out, DLRMConfig.preset("tiny"), TrainConfig(batch_size=256, learning_rate=3e-3))
    return DLRMExporter(out)


@pytest.fixture(scope="module")
def fp32_file(tmp_path_factory: pytest.TempPathFactory, exporter: DLRMExporter) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    exporter.to_onnx(path, 17)
    return path


def test_cut_and_put_back_give_the_same_graph_answers(fp32_file: Path, data: Path, tmp_path: Path) -> None:
    model = onnx.load(str(fp32_file))
    initializers = {t.name: t for t in model.graph.initializer}
    lookups_before = [
        n.name for n in model.graph.node if n.op_type == "Gather" and n.input[0] in initializers
    ]
    cut = cut_lookups(model, min_bytes=0)
    assert lookups_before and [n.name for n in cut.nodes] == lookups_before
    assert {t.name for t in cut.tables} == {n.input[0] for n in cut.nodes}
    assert not {t.name for t in cut.tables} & {t.name for t in model.graph.initializer}
    assert set(cut.output_names) <= {value.name for value in model.graph.input}
    put_back_lookups(model, cut)
    assert not cut.tables
    path = tmp_path / "back.onnx"
    onnx.save_model(model, str(path))
    onnx.checker.check_model(str(path))
    rows = read_batch(data, 512)
    np.testing.assert_array_equal(run_onnx(path, rows), run_onnx(fp32_file, rows))


def test_a_small_or_shared_constant_stays() -> None:
    table = numpy_helper.from_array(np.ones((4, 3), np.float32), "table")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"], "lookup"),
            helper.make_node("Gather", ["table", "ids"], ["cols"], "columns", axis=1),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("cols", TensorProto.FLOAT, [4, 2]),
        ],
        [table],
    )
    model = helper.make_model(graph)
    assert not cut_lookups(model).nodes  # 48 bytes: under the threshold
    cut = cut_lookups(model, min_bytes=0)
    # The axis-1 Gather still reads the table, so the table stays in the graph.
    assert [node.name for node in cut.nodes] == ["lookup"] and not cut.tables
    assert [t.name for t in model.graph.initializer] == ["table"]


def test_topological_order_puts_producers_first() -> None:
    a = helper.make_node("Relu", ["x"], ["a"], "a")
    b = helper.make_node("Relu", ["a"], ["b"], "b")
    c = helper.make_node("Add", ["a", "b"], ["c"], "c")
    assert [n.name for n in topological_order([c, b, a], {"x"})] == ["a", "b", "c"]
    with pytest.raises(Exception, match="nothing produces"):
        topological_order([c, b], {"x"})


@pytest.mark.parametrize("method", ["static", "dynamic"])
def test_quantizing_without_the_tables_gives_the_whole_graphs_int8(
    exporter: DLRMExporter,
    fp32_file: Path,
    data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
) -> None:
    """The quantizer run on the graph less its lookups writes what it writes for the whole graph."""
    options = QuantizeOptions(method=method, calibration_rows=512)  # type: ignore[arg-type]
    calibration = read_batch(data, 512)
    keep = exporter.fp32_nodes(onnx.load(str(fp32_file)))
    whole = tmp_path / "whole.onnx"
    quantize_int8(fp32_file, whole, keep, options, calibration)  # tables under the threshold: not cut
    monkeypatch.setattr(lookup_cut, "CUT_TABLE_BYTES", 0)
    lean = tmp_path / "lean.onnx"
    quantize_int8(fp32_file, lean, keep, options, calibration)
    whole_model, lean_model = onnx.load(str(whole)), onnx.load(str(lean))
    assert quantized_op_counts(lean_model) == quantized_op_counts(whole_model)
    assert sorted(n.op_type for n in lean_model.graph.node) == sorted(
        n.op_type for n in whole_model.graph.node
    )
    rows = read_batch(data, 1024)
    np.testing.assert_allclose(run_onnx(lean, rows), run_onnx(whole, rows), rtol=0, atol=1e-6)


def _big_table_graph(path: Path, rows: int, width: int) -> int:
    """A lookup of a ``rows x width`` table into a two-layer MLP, with the table in an external
    data file; its bytes."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((rows, width), dtype=np.float32), "table")
    w1 = numpy_helper.from_array(rng.standard_normal((width, 16), dtype=np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4), dtype=np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["rows"], "lookup"),
            helper.make_node("MatMul", ["rows", "w1"], ["h"], "layer1"),
            helper.make_node("Relu", ["h"], ["r"], "relu"),
            helper.make_node("MatMul", ["r", "w2"], ["out"], "layer2"),
        ],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])],
        [table, w1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    save_model(model, path, threshold=0)
    return rows * width * 4


def test_a_table_on_disk_is_never_loaded(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "fp32" / "model.onnx"
    table_bytes = _big_table_graph(source, 1 << 19, 128)  # 256 MiB
    rows = read_batch(data, 2048)

    def feeds(batch: Batch) -> dict[str, np.ndarray]:
        return {"ids": batch.categorical[:, 0] % (1 << 19)}

    out = tmp_path / "int8" / "model.onnx"
    # The tables are copied into the output 64 MiB at a time; smaller chunks here, so that what is
    # measured is whether the table is held, not the copy's buffer.
    monkeypatch.setattr(onnx_io, "COPY_CHUNK", 8 << 20)
    before = resident()
    with PeakMemory() as peak:
        graph = quantize_int8(source, out, [], QuantizeOptions(calibration_rows=2048), rows, feeds=feeds)
    assert graph.quantized_nodes == ["layer1", "layer2"]
    if peak.available and before is not None:
        held = peak.anon_bytes - before["anon"]
        assert held < table_bytes / 2, f"{held / 2**20:.0f} MiB held to quantize beside a 256 MiB table"
    written = onnx.load(str(out), load_external_data=False)
    assert "table" in {t.name for t in external_tensors(written)}
    assert quantized_op_counts(written).get("DequantizeLinear", 0) >= 2
    # The same quantizer run with the table inside the graph it sees writes the same answers.
    monkeypatch.setattr(lookup_cut, "CUT_TABLE_BYTES", 1 << 40)
    whole = tmp_path / "whole" / "model.onnx"
    quantize_int8(source, whole, [], QuantizeOptions(calibration_rows=2048), rows, feeds=feeds)
    ids = feeds(read_batch(data, 1024))
    np.testing.assert_allclose(run_graph(out, ids), run_graph(whole, ids), rtol=1e-6, atol=1e-5)


def run_graph(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    return np.asarray(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0])
