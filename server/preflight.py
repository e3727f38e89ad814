"""Checks before tritonserver starts: does the python backend stub's interpreter have what the
repository's models need?

The local server runs every model through python-backend stubs, which import
numpy, onnxruntime and torch from this interpreter's environment (PYTHONPATH is
ignored by the stub). Two failures seen on a GPU machine came from there, and
neither said so where a user would look:

- a KIND_GPU instance with the CPU build of onnxruntime failed each model's
  load with a line in the server log only;
- numpy 2 made tritonserver 2.51's python backend answer every request with an
  empty output and no error at all.

So the launcher checks first and stops with one line naming what to install;
a KIND_GPU TorchScript model likewise needs a torch that sees a CUDA device.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Sequence
from pathlib import Path

from bundle.errors import ServerError

log = logging.getLogger(__name__)

#: Backends the local server runs through python-backend stubs (the bundle's own and Triton's).
PYTHON_BACKENDS = ("onnxruntime", "pytorch", "python")
#: The platform Triton maps to the ``pytorch`` backend (TorchScript models).
TORCH_PLATFORM = "pytorch_libtorch"
#: The command that installs the GPU build of ONNX Runtime in place of the CPU one.
GPU_SETUP = "make setup GPU=1"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _configs(repository: Path, models: Sequence[str]) -> list[tuple[str, object]]:
    """``(name, ModelConfig)`` of the repository's models (only ``models`` when given)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    found = []
    for path in sorted(repository.glob("*/config.pbtxt")):
        name = path.parent.name
        if models and name not in models:
            continue
        try:
            config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        except (OSError, text_format.ParseError):
            continue  # tritonserver itself reports a malformed config, with its model's name
        found.append((name, config))
    return found


def check_stub_environment(repository: Path, models: Sequence[str] = ()) -> None:
    """Raise unless this interpreter can run the repository's models in python-backend stubs.

    Args:
        repository: the model repository.
        models: the models that will load (empty: all).

    Raises:
        ServerError: numpy 2 with a python-backend model, no onnxruntime with an
            onnxruntime model, a KIND_GPU onnxruntime instance without
            onnxruntime-gpu's CUDA provider, or a KIND_GPU TorchScript instance
            where torch sees no CUDA device; the line names what to install.
    """
    from tritonclient.grpc import model_config_pb2

    gpu_kind = model_config_pb2.ModelInstanceGroup.KIND_GPU
    configs = _configs(repository, models)
    stubbed = [
        name
        for name, config in configs
        if config.backend in PYTHON_BACKENDS or config.platform == TORCH_PLATFORM  # type: ignore[attr-defined]
    ]
    torch_gpu = [
        name
        for name, config in configs
        if (config.backend == "pytorch" or config.platform == TORCH_PLATFORM)  # type: ignore[attr-defined]
        and any(group.kind == gpu_kind for group in config.instance_group)  # type: ignore[attr-defined]
    ]
    onnx = [name for name, config in configs if config.backend == "onnxruntime"]  # type: ignore[attr-defined]
    gpu = [
        name
        for name, config in configs
        if config.backend == "onnxruntime"  # type: ignore[attr-defined]
        and any(group.kind == gpu_kind for group in config.instance_group)  # type: ignore[attr-defined]
    ]
    numpy = _version("numpy")
    if stubbed and numpy is not None and int(numpy.split(".")[0]) >= 2:
        raise ServerError(
            f"{stubbed[0]} runs in a python backend stub, whose interpreter has numpy {numpy}: "
            "tritonserver 2.51's python backend answers empty outputs under numpy 2; "
            "install numpy<2 (pip install numpy==1.26.4)"
        )
    if onnx and _version("onnxruntime") is None and _version("onnxruntime-gpu") is None:
        raise ServerError(f"{onnx[0]} needs onnxruntime in the python backend stub's interpreter: make setup")
    if gpu:
        import onnxruntime as ort

        providers = ort.get_available_providers()
        if "CUDAExecutionProvider" not in providers:
            raise ServerError(
                f"{gpu[0]} has a KIND_GPU instance, but this onnxruntime offers {providers}: "
                f"install onnxruntime-gpu in place of onnxruntime ({GPU_SETUP})"
            )
    if torch_gpu:
        import torch  # only here: a second or so, and only for a repository with such a model

        if not torch.cuda.is_available():
            raise ServerError(
                f"{torch_gpu[0]} has a KIND_GPU instance, but torch {torch.__version__} here sees no CUDA "
                "device: install a CUDA build of torch in this venv, or load only the ONNX models "
                "(--model-control-mode explicit --load-model ...)"
            )
    log.debug(
        "stub environment: numpy %s, %d python-backend models, %d on GPU", numpy, len(stubbed), len(gpu)
    )
