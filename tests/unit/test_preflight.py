"""server.preflight: the launcher stops before tritonserver starts when the stub's interpreter
lacks what the repository's models need, with one line naming what to install."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bundle.errors import ServerError
from server import LocalServer, ServerConfig
from server.preflight import GPU_SETUP, check_stub_environment


def _model(repository: Path, name: str, kind: str, backend: str = "onnxruntime") -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "{backend}"\ninstance_group {{ kind: {kind} }}\n'
    )


def test_a_gpu_instance_needs_onnxruntime_gpu(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    _model(tmp_path, "dlrm_onnx", "KIND_CPU")
    check_stub_environment(tmp_path)  # CPU only: nothing missing
    _model(tmp_path, "dlrm_onnx_fp16", "KIND_GPU")
    with pytest.raises(
        ServerError, match=rf"dlrm_onnx_fp16 has a KIND_GPU instance.*onnxruntime-gpu.*{GPU_SETUP}"
    ):
        check_stub_environment(tmp_path)
    check_stub_environment(tmp_path, models=("dlrm_onnx",))  # only the CPU model loads: fine
    # The launcher refuses before it starts anything (no tritonserver, no port taken).
    server = LocalServer(ServerConfig.with_free_ports(tmp_path, log_file=tmp_path / "log.txt"))
    with pytest.raises(ServerError, match="onnxruntime-gpu"):
        server.start()
    assert not server.running and not (tmp_path / "log.txt").exists()


def test_a_gpu_torchscript_instance_needs_torch_with_cuda(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    (tmp_path / "dlrm_torch" / "1").mkdir(parents=True)
    config = 'name: "dlrm_torch"\nplatform: "pytorch_libtorch"\ninstance_group {{ kind: {} }}\n'
    (tmp_path / "dlrm_torch" / "config.pbtxt").write_text(config.format("KIND_CPU"))
    check_stub_environment(tmp_path)  # CPU instances: torch's CPU build runs them
    (tmp_path / "dlrm_torch" / "config.pbtxt").write_text(config.format("KIND_GPU"))
    with pytest.raises(
        ServerError,
        match=rf"^dlrm_torch has a KIND_GPU instance, but torch {re.escape(torch.__version__)} here",
    ):
        check_stub_environment(tmp_path)


def test_numpy_2_is_refused_for_python_backend_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server import preflight

    _model(tmp_path, "stage", "KIND_CPU", backend="python")
    real = preflight._version
    monkeypatch.setattr(preflight, "_version", lambda p: "2.1.0" if p == "numpy" else real(p))
    with pytest.raises(ServerError, match=r"numpy 2\.1\.0.*numpy<2"):
        check_stub_environment(tmp_path)
