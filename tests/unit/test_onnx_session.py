"""The bundle's one ONNX Runtime session factory: its options, and one clear error for a file that
is not an ONNX model or a device this onnxruntime cannot run on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from bundle.errors import ClientError, ConfigError, DataError, ExportError
from bundle.onnx_session import GRAPH_OPTIMIZATIONS, PROVIDERS, inference_session, missing_provider

ROOT = Path(__file__).resolve().parents[2]
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _model_bytes() -> bytes:
    """``y = sigmoid(x)`` on a ``B x 2`` float32 ``x``."""
    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"])],
        "sigmoid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(_model_bytes())
    return path


def _runs(session: object) -> None:
    x = np.zeros((3, 2), dtype=np.float32)
    (y,) = session.run(["y"], {"x": x})  # type: ignore[attr-defined]
    np.testing.assert_allclose(y, np.full((3, 2), 0.5, dtype=np.float32))


def test_a_file_or_bytes_open_on_the_cpu_with_the_backends_defaults(model_file: Path) -> None:
    for model in (model_file, str(model_file), _model_bytes()):
        session = inference_session(model)
        assert session.get_providers() == ["CPUExecutionProvider"]
        options = session.get_session_options()
        assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        assert options.intra_op_num_threads == 0 and options.inter_op_num_threads == 0
        _runs(session)


def test_threads_optimization_level_and_quiet_are_set(model_file: Path) -> None:
    for level in GRAPH_OPTIMIZATIONS:
        session = inference_session(
            model_file, intra_op_threads=2, inter_op_threads=1, graph_optimization=level, quiet=True
        )
        options = session.get_session_options()
        assert options.graph_optimization_level == getattr(ort.GraphOptimizationLevel, level)
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
        assert options.log_severity_level == 4
        _runs(session)


def test_a_profile_is_written_under_the_prefix(model_file: Path, tmp_path: Path) -> None:
    session = inference_session(model_file, profile_prefix=tmp_path / "profile")
    _runs(session)
    written = Path(session.end_profiling())
    assert written.parent == tmp_path and written.name.startswith("profile")
    assert any(event.get("name") == "model_run" for event in json.loads(written.read_text()))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"intra_op_threads": -1}, "intra_op_threads must be >= 0, got -1"),
        ({"inter_op_threads": -2}, "inter_op_threads must be >= 0, got -2"),
        ({"graph_optimization": "all"}, "graph_optimization must be one of ORT_DISABLE_ALL, .*got 'all'"),
        ({"device": "tpu"}, "device must be one of cpu, gpu, got 'tpu'"),
        ({"cuda_graph": True}, "a CUDA graph needs device gpu, got 'cpu'"),
    ],
)
def test_a_wrong_option_is_a_config_error(model_file: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        inference_session(model_file, **options)  # type: ignore[arg-type]


def test_a_missing_file_or_one_that_is_not_onnx_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"model file .*missing\.onnx does not exist"):
        inference_session(tmp_path / "missing.onnx")
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n")
    with pytest.raises(
        DataError, match=r"notes\.onnx is not an ONNX model \(onnxruntime: .*INVALID_PROTOBUF"
    ):
        inference_session(text)
    with pytest.raises(DataError, match=r"^an in-memory model of 7 bytes is not an ONNX model"):
        inference_session(b"garbage")


def test_the_error_is_the_callers_stages(tmp_path: Path) -> None:
    """The export's checks raise ExportError, a client ClientError: the same line either way."""
    broken = tmp_path / "model.onnx"
    broken.write_bytes(_model_bytes()[:20])
    for error in (ExportError, ClientError):
        with pytest.raises(error, match=r"model\.onnx (is not an ONNX model|cannot load)") as caught:
            inference_session(broken, error=error)
        assert caught.value.__cause__ is not None


def test_a_model_onnx_runtime_cannot_build_names_the_file(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "odd.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(DataError, match=r"onnxruntime cannot load .*odd\.onnx: .*NoSuchOp"):
        inference_session(path)


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA")
def test_the_gpu_without_onnxruntime_gpu_is_one_clear_error(model_file: Path) -> None:
    assert missing_provider("cpu") is None
    reason = missing_provider("gpu")
    assert reason is not None and "has no CUDAExecutionProvider" in reason and "onnxruntime-gpu" in reason
    with pytest.raises(ConfigError, match=r"has no CUDAExecutionProvider .*install onnxruntime-gpu"):
        inference_session(model_file, device="gpu")


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA")
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available")
def test_a_cuda_provider_that_falls_back_to_the_cpu_is_an_error(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime runs on the CPU, with a log line only, when CUDA does not start: a GPU
    measurement would time the CPU. Here the CUDA provider is listed but cannot start."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [*PROVIDERS["gpu"]])
    with pytest.raises(ConfigError, match=r"CUDAExecutionProvider did not start for .*model\.onnx"):
        inference_session(model_file, device="gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu")
def test_the_gpu_runs_on_cuda(model_file: Path) -> None:
    session = inference_session(model_file, device="gpu")
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    _runs(session)


def test_importing_it_does_not_import_onnxruntime() -> None:
    code = "import sys, bundle.onnx_session; print('onnxruntime' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
