"""The Triton model repository writer.

Every config.pbtxt is built as a ``model_config_pb2.ModelConfig`` message and
written with ``text_format``, so Triton's own schema rejects a bad field at
write time; :func:`read_config` parses one back.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from criteo.schema import INPUTS, OUTPUTS, TensorSpec

CONFIG_NAME = "config.pbtxt"
MODEL_FILE = "model.onnx"
#: The backend name, the same for the local server's Python-based backend and the NGC image's C++ one.
ONNX_BACKEND = "onnxruntime"

Profile = Literal["cpu"]
PROFILES: tuple[str, ...] = ("cpu",)

_DATA_TYPES = {
    "FP32": mc.TYPE_FP32,
    "FP16": mc.TYPE_FP16,
    "INT64": mc.TYPE_INT64,
    "INT32": mc.TYPE_INT32,
}


@dataclass(frozen=True)
class ServingConfig:
    """How Triton serves one model.

    Args:
        profile: ``cpu`` (KIND_CPU instances).
        max_batch_size: the largest batch Triton forms or accepts.
        instances: model instances (each runs batches independently).
        max_queue_delay_us: how long the dynamic batcher waits to fill a batch.
        preferred_batch_sizes: batch sizes the dynamic batcher aims for (empty: as large as queued).
        intra_op_threads: ONNX Runtime threads per instance (0: ONNX Runtime's default).
        warmup_batch_sizes: batch sizes run once at load, so the first request is not slow.
    """

    profile: Profile = "cpu"
    max_batch_size: int = 4096
    instances: int = 1
    max_queue_delay_us: int = 100
    preferred_batch_sizes: tuple[int, ...] = ()
    intra_op_threads: int = 0
    warmup_batch_sizes: tuple[int, ...] = (1, 64)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if self.max_batch_size <= 0:
            raise ConfigError(f"max_batch_size must be positive, got {self.max_batch_size}")
        if self.instances <= 0:
            raise ConfigError(f"instances must be positive, got {self.instances}")
        if self.max_queue_delay_us < 0:
            raise ConfigError(f"max_queue_delay_us must be >= 0, got {self.max_queue_delay_us}")
        if self.intra_op_threads < 0:
            raise ConfigError(f"intra_op_threads must be >= 0, got {self.intra_op_threads}")
        for size in (*self.preferred_batch_sizes, *self.warmup_batch_sizes):
            if not 0 < size <= self.max_batch_size:
                raise ConfigError(f"batch size {size} is outside 1..max_batch_size={self.max_batch_size}")


def _tensor(spec: TensorSpec, message: Any) -> None:
    message.name = spec.name
    message.data_type = _DATA_TYPES[spec.triton_dtype]
    message.dims.extend(spec.shape)


def build_config(name: str, serving: ServingConfig) -> mc.ModelConfig:
    """The ModelConfig of an ONNX model named ``name`` with the shared schema's tensors."""
    config = mc.ModelConfig(name=name, backend=ONNX_BACKEND, max_batch_size=serving.max_batch_size)
    config.default_model_filename = MODEL_FILE
    for spec in INPUTS:
        _tensor(spec, config.input.add())
    for spec in OUTPUTS:
        _tensor(spec, config.output.add())
    config.dynamic_batching.max_queue_delay_microseconds = serving.max_queue_delay_us
    config.dynamic_batching.preferred_batch_size.extend(serving.preferred_batch_sizes)
    group = config.instance_group.add()
    group.count = serving.instances
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    if serving.intra_op_threads:
        # The key the NGC image's onnxruntime backend reads; the local backend reads it too.
        config.parameters["intra_op_thread_count"].string_value = str(serving.intra_op_threads)
    for size in serving.warmup_batch_sizes:
        warmup = config.model_warmup.add()
        warmup.name = f"zeros_batch_{size}"
        warmup.batch_size = size
        for spec in INPUTS:
            data = warmup.inputs[spec.name]
            data.data_type = _DATA_TYPES[spec.triton_dtype]
            data.dims.extend(spec.shape)
            data.zero_data = True
    return config


def write_config(model_dir: Path, config: mc.ModelConfig) -> Path:
    """Write ``config`` as ``model_dir/config.pbtxt``."""
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / CONFIG_NAME
    path.write_text(text_format.MessageToString(config))
    return path


def read_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt into a ModelConfig (raises ConfigError when it does not parse)."""
    try:
        return text_format.Parse(path.read_text(), mc.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise ConfigError(f"{path}: not a valid Triton model config ({exc})") from None


def version_dir(repository: Path, name: str, version: int = 1) -> Path:
    """The folder that holds version ``version`` of model ``name``."""
    return repository / name / str(version)


def add_model(
    repository: Path,
    name: str,
    serving: ServingConfig,
    version: int = 1,
    report: dict[str, Any] | None = None,
) -> Path:
    """Write the config of model ``name`` whose ONNX file is already in its version folder.

    Args:
        repository: the model repository root.
        name: the model name (``dlrm_onnx``, ...).
        serving: how Triton serves it.
        version: the version folder holding ``model.onnx``.
        report: export checks to keep beside the config as ``export_report.json``.

    Returns:
        The config path.
    """
    onnx_path = version_dir(repository, name, version) / MODEL_FILE
    if not onnx_path.is_file():
        raise ConfigError(f"{onnx_path} is missing: export the model before writing its config")
    if report is not None:
        (repository / name / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return write_config(repository / name, build_config(name, serving))


def clear_model(repository: Path, name: str) -> None:
    """Remove model ``name`` from the repository (before writing it anew)."""
    target = repository / name
    if target.exists():
        shutil.rmtree(target)
