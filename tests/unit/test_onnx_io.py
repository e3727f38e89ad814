"""export.graphs.onnx_io: data files with page-aligned tensors, copied in chunks from another model's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.graphs import onnx_io
from export.graphs.onnx_io import ALIGNMENT, external_info, save_model, weights_bytes


def _model(rows: int = 1000, dim: int = 8) -> onnx.ModelProto:
    """``out = Gather(table, ids) @ w``: a table, a weight, and a tiny inline constant."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.normal(size=(rows, dim)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.normal(size=(dim, 64)).astype(np.float32), "w")
    tiny = numpy_helper.from_array(np.ones(64, dtype=np.float32), "bias")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], name="gather"),
        helper.make_node("MatMul", ["rows", "w"], ["product"], name="matmul"),
        helper.make_node("Add", ["product", "bias"], ["out"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 64])],
        [table, weight, tiny],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["out"], {"ids": np.array([0, 5, 999, 5])})[0]


def test_large_tensors_go_to_the_data_file_at_page_aligned_offsets(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    files = save_model(_model(), path, threshold=0)
    assert files == [path, tmp_path / "model.onnx.data"]
    graph = onnx.load(str(path), load_external_data=False)
    placed = {
        t.name: external_info(t) for t in graph.graph.initializer if t.data_location == TensorProto.EXTERNAL
    }
    assert sorted(placed) == ["table", "w"]  # the 256-byte bias stays inline
    assert all(int(info["offset"]) % ALIGNMENT == 0 for info in placed.values())
    assert int(placed["table"]["length"]) == 1000 * 8 * 4
    assert weights_bytes(graph) == weights_bytes(_model())
    assert (path.with_name("model.onnx.data").stat().st_mode & 0o777) == 0o644
    loaded = onnx.load(str(path))
    for mine, theirs in zip(loaded.graph.initializer, _model().graph.initializer, strict=True):
        np.testing.assert_array_equal(numpy_helper.to_array(mine), numpy_helper.to_array(theirs))


def test_a_model_not_loaded_is_copied_in_chunks_into_a_new_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"
    save_model(_model(), first, threshold=0)
    expected = _run(first)
    monkeypatch.setattr(onnx_io, "COPY_CHUNK", 4096)  # the table takes 8 chunks
    graph = onnx.load(str(first), load_external_data=False)
    with pytest.raises(ValueError, match="say where their files lie"):
        save_model(graph, second)
    save_model(graph, second, source_dir=first.parent)
    np.testing.assert_array_equal(_run(second), expected)
    assert (tmp_path / "a" / "model.onnx.data").read_bytes() == (
        tmp_path / "b" / "model.onnx.data"
    ).read_bytes()


def test_small_models_stay_in_one_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.with_name("model.onnx.data").write_bytes(b"stale")
    assert save_model(_model(), path) == [path]
    assert not path.with_name("model.onnx.data").exists()
    np.testing.assert_array_equal(_run(path), _run_inline())


def _run_inline() -> np.ndarray:
    session = ort.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["out"], {"ids": np.array([0, 5, 999, 5])})[0]
