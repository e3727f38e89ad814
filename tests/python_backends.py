"""The bundle's python backends (``backends``), imported in a test as the stub imports them.

A backend runs inside tritonserver's python stub, where ``triton_python_backend_utils`` exists;
here a stand-in module with the few names ``initialize`` uses takes its place.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

BACKENDS = Path(__file__).resolve().parents[1] / "backends"


class ModelException(Exception):
    """The stand-in's ``TritonModelException``."""


def stand_in_utils(warnings: list[str]) -> types.ModuleType:
    """What ``initialize`` needs of ``triton_python_backend_utils``; each warning the backend
    logs is appended to ``warnings``."""
    module = types.ModuleType("triton_python_backend_utils")
    module.TritonModelException = ModelException  # type: ignore[attr-defined]
    module.Logger = types.SimpleNamespace(log_info=lambda _: None, log_warn=warnings.append)  # type: ignore[attr-defined]
    types_by_name = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64}
    module.triton_string_to_numpy = types_by_name.__getitem__  # type: ignore[attr-defined]
    return module


def import_backend(monkeypatch: pytest.MonkeyPatch, backend: str, name: str) -> types.ModuleType:
    """``backends/<backend>/model.py`` imported as module ``name``, after the
    ``batched_model.py`` the server copies beside it, with the stand-in utilities; all in
    ``sys.modules`` for this test only. The module's ``warnings`` lists what it logged as a warning.

    ``backends`` itself is not put on ``sys.path``, where its ``onnxruntime/`` folder
    would shadow the onnxruntime package.
    """
    warnings: list[str] = []
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stand_in_utils(warnings))
    _import(monkeypatch, "batched_model", BACKENDS / "batched_model.py")
    module = _import(monkeypatch, name, BACKENDS / backend / "model.py")
    module.warnings = warnings  # type: ignore[attr-defined]
    return module


def _import(monkeypatch: pytest.MonkeyPatch, name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def load_instance(backend: types.ModuleType, folder: Path, config: mc.ModelConfig) -> Any:
    """An instance of ``backend``'s model initialized as the stub does it, on the CPU: ``config``
    for the model whose version 1 lies in ``folder``."""
    instance = backend.TritonPythonModel()
    instance.initialize(
        {
            "model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
            "model_repository": str(folder),
            "model_version": "1",
            "model_name": config.name,
            "model_instance_name": f"{config.name}_0",
            "model_instance_kind": "CPU",
            "model_instance_device_id": "0",
        }
    )
    return instance
