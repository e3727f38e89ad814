"""Requests to the real tritonserver through tritonclient alone (not the bundle's client), so a
test sees what the server answers to exactly the tensors it sends."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from server import LocalServer

#: The wire type of each numpy dtype a test sends (float64 too: a wrong dtype on purpose).
WIRE_TYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.int64): "INT64",
    np.dtype(np.int32): "INT32",
}


def client(server: LocalServer, protocol: str) -> Any:
    """tritonclient's HTTP or gRPC client of ``server``."""
    if protocol == "http":
        return triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
    return triton_grpc.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))


def infer(connection: Any, model: str, inputs: dict[str, np.ndarray]) -> Any:
    """One request of ``inputs``, each tensor with its own shape and dtype; tritonclient's result
    (InferenceServerException where the server refuses it)."""
    module = triton_http if isinstance(connection, triton_http.InferenceServerClient) else triton_grpc
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), WIRE_TYPES[array.dtype])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return connection.infer(model, tensors)
