"""ONNX Runtime sessions set up as the local Triton backend sets up its own.

The in-process baseline and the peer servers run the same ``model.onnx``
with the options of ``backends/onnxruntime/model.py`` (the defaults of
:func:`bundle.onnx_session.inference_session`): all graph optimizations, the
execution provider of the device it is served on, and the intra-op thread count
that the model's config.pbtxt asks for (0: ONNX Runtime's default, one
thread per core), so served and in-process numbers compare like with like.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bundle.errors import ConfigError, DataError
from bundle.onnx_session import inference_session, missing_provider

#: The config.pbtxt parameter both Triton onnxruntime backends read.
THREADS_PARAMETER = "intra_op_thread_count"


def ort_session(model_file: Path, threads: int = 0, device: str = "cpu") -> Any:
    """An ``onnxruntime.InferenceSession`` of ``model_file`` on ``device``, as the backend runs it.

    Args:
        model_file: an exported ``model.onnx`` (external data beside it is found).
        threads: intra-op threads (0: ONNX Runtime's default).
        device: ``cpu``, or ``gpu`` (ONNX Runtime's CUDA provider, as a KIND_GPU instance runs it).

    Raises:
        ConfigError: ``gpu`` with an onnxruntime that has no CUDA provider.
        DataError: the file is missing or ONNX Runtime cannot load it.
    """
    missing = missing_provider(device)
    if missing is not None:
        raise ConfigError(
            f"{model_file} is served on a GPU (KIND_GPU), but {missing}, or pass --no-baseline: "
            "its in-process baseline would time the CPU against the GPU"
        )
    return inference_session(model_file, device=device, intra_op_threads=threads)


def config_of(model_file: Path) -> Path | None:
    """The config.pbtxt of a repository model file ``<model>/<version>/model.onnx``, if there is one."""
    from bundle.repository import CONFIG_NAME

    candidate = model_file.resolve().parent.parent / CONFIG_NAME
    return candidate if candidate.is_file() else None


def _model_config(model_file: Path) -> Any | None:
    """The parsed config.pbtxt of a repository model file (None outside a model repository).

    Raises:
        DataError: the config exists but is not a valid Triton model config.
    """
    config_path = config_of(model_file)
    if config_path is None:
        return None
    # Imported here, as tritonclient's protobufs were: importing this module stays cheap.
    from bundle.repository import read_config

    try:
        return read_config(config_path)
    except ConfigError as exc:  # the same message; a broken file is this module's DataError
        raise DataError(str(exc)) from None


def serving_device(model_file: Path) -> str:
    """``gpu`` when the model's config.pbtxt puts an instance on a GPU (KIND_GPU), else ``cpu``."""
    from tritonclient.grpc import model_config_pb2

    config = _model_config(model_file)
    gpu = model_config_pb2.ModelInstanceGroup.KIND_GPU
    return "gpu" if config is not None and any(g.kind == gpu for g in config.instance_group) else "cpu"


def serving_settings(model_file: Path) -> dict[str, int]:
    """``threads`` (intra-op), ``instances`` and ``max_queue_delay_us`` of the model's config.pbtxt
    (zeros when the file is not inside a model repository)."""
    settings = {"threads": 0, "instances": 0, "max_queue_delay_us": 0}
    config = _model_config(model_file)
    if config is None:
        return settings
    raw = config.parameters[THREADS_PARAMETER].string_value if THREADS_PARAMETER in config.parameters else ""
    settings["threads"] = int(raw) if raw.isdigit() else 0
    settings["instances"] = sum(group.count or 1 for group in config.instance_group) or 1
    settings["max_queue_delay_us"] = int(config.dynamic_batching.max_queue_delay_microseconds)
    return settings


def device_binding(session: Any, batch: dict[str, Any], where: str = "cuda") -> Any:
    """An IOBinding of ``session`` with ``batch``'s inputs copied to ``where`` (``cuda`` or ``cpu``)
    once and a ``B x 1`` float32 output allocated there: calls through it move no tensor
    between host and device (and a CUDA graph can replay it: the addresses never change)."""
    import numpy as np
    import onnxruntime as ort

    from bundle.schema import OUTPUT

    binding = session.io_binding()
    for name, array in batch.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, where, 0))
    rows = next(iter(batch.values())).shape[0]
    binding.bind_ortvalue_output(
        OUTPUT, ort.OrtValue.ortvalue_from_shape_and_type((rows, 1), np.float32, where, 0)
    )
    return binding
