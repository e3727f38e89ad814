"""The least work per request: inference requests serialised once, sent as bytes.

A load generator that builds ``InferInput`` objects, copies tensors and
checks metadata on every request measures its own Python, not the server. Here
each batch of a payload pool becomes one serialised request before the load
starts: a gRPC ``ModelInferRequest``, or an HTTP body in Triton's binary-data
extension (JSON header, then the raw tensors). A request is then one call
with those bytes, and the answer is checked by one length (``B`` FP32
scores), so a wrong or empty answer still fails the request. The server sees
the bytes tritonclient would send.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from bundle.errors import ClientError, DataError
from bundle.schema import OUTPUT
from clients.validation import triton_dtype
from loadtest.engine.payload import PayloadPool

#: Triton's gRPC inference method.
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
#: Bytes per score of the output (FP32).
_SCORE_BYTES = 4


def serialised_request(model: str, batch: dict[str, np.ndarray], version: str = "") -> bytes:
    """One batch as a serialised ``ModelInferRequest`` for ``model`` (tensors raw)."""
    message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in batch.items():
        array = np.ascontiguousarray(array)
        tensor = message.inputs.add()
        tensor.name, tensor.datatype = name, triton_dtype(array.dtype)
        tensor.shape.extend(array.shape)
        message.raw_input_contents.append(array.tobytes())
    message.outputs.add().name = OUTPUT
    return bytes(message.SerializeToString())


def serialised_requests(model: str, pool: PayloadPool, version: str = "") -> list[bytes]:
    """Every batch of ``pool`` as a serialised ``ModelInferRequest`` for ``model``."""
    return [serialised_request(model, batch, version) for batch in pool.batches()]


def _check_scores(output_bytes: list[int], rows: int) -> None:
    """One output of ``rows`` FP32 scores, or :class:`DataError`."""
    if output_bytes != [rows * _SCORE_BYTES]:
        raise DataError(
            f"answer holds {output_bytes} output bytes, expected {rows * _SCORE_BYTES} ({rows} scores)"
        )


class RawGrpcInfer:
    """One channel to Triton's gRPC endpoint and its inference method, bytes in, bytes out.

    Args:
        url: ``host:port``.
        timeout_s: a request slower than this fails.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            url, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        )
        # No serialiser: the requests are bytes already, and the answer is read below.
        self._call: Any = self._channel.unary_unary(MODEL_INFER)

    def __call__(self, request: bytes, rows: int) -> int:
        """Send one serialised request of ``rows`` rows; the answer's size in bytes.

        Raises:
            ClientError: the server answered with an error (its gRPC status and message).
            DataError: the answer does not hold ``rows`` scores.
        """
        try:
            answer: bytes = self._call(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise ClientError(f"{self.url}: {getattr(code, 'name', code)} {details}") from None
        response = service_pb2.ModelInferResponse.FromString(answer)
        _check_scores([len(c) for c in response.raw_output_contents], rows)
        return len(answer)

    def close(self) -> None:
        self._channel.close()


#: The HTTP header that says how long the JSON part of a binary-data body is.
HEADER_LENGTH = "Inference-Header-Content-Length"


def http_body(batch: dict[str, np.ndarray]) -> bytes:
    """One batch as the body of an HTTP inference request (binary-data extension)."""
    arrays = [np.ascontiguousarray(array) for array in batch.values()]
    header = {
        "inputs": [
            {"name": name, "shape": list(array.shape), "datatype": triton_dtype(array.dtype),
             "parameters": {"binary_data_size": array.nbytes}}
            for name, array in zip(batch, arrays, strict=True)
        ],
        "outputs": [{"name": OUTPUT, "parameters": {"binary_data": True}}],
    }  # fmt: skip
    return json.dumps(header, separators=(",", ":")).encode() + b"".join(a.tobytes() for a in arrays)


def http_bodies(pool: PayloadPool) -> list[bytes]:
    """Every batch of ``pool`` as an HTTP body, its JSON header's length the same for every
    batch (:func:`http_header_length`)."""
    return [http_body(batch) for batch in pool.batches()]


def http_header_length(pool: PayloadPool) -> int:
    """The length of the JSON header of :func:`http_body` for ``pool``'s batches (all one shape)."""
    batch = pool.batch(0)
    return len(http_body(batch)) - sum(np.ascontiguousarray(a).nbytes for a in batch.values())


class RawHttpInfer:
    """One keep-alive connection to Triton's HTTP endpoint, bodies in, the answer's length out.

    Args:
        url: ``host:port``.
        model: the model every request goes to.
        header_length: the JSON header length of every body (:func:`http_header_length`).
        timeout_s: a request slower than this fails.
    """

    def __init__(self, url: str, model: str, header_length: int, timeout_s: float) -> None:
        from geventhttpclient import HTTPClient

        host, _, port = url.rpartition(":")
        self.url = url
        self._client = HTTPClient(host, int(port), connection_timeout=timeout_s, network_timeout=timeout_s)
        self._path = f"/v2/models/{model}/infer"
        self._headers = {HEADER_LENGTH: str(header_length), "Content-Type": "application/octet-stream"}

    def __call__(self, body: bytes, rows: int) -> int:
        """Send one body of ``rows`` rows; the answer's size in bytes.

        Raises:
            ClientError: no answer, or an error status (with the server's message).
            DataError: the answer does not hold ``rows`` scores.
        """
        try:
            response = self._client.post(self._path, body=body, headers=self._headers)
            answer = response.read()
        except (OSError, ValueError) as exc:
            raise ClientError(f"{self.url}: {exc}") from None
        if response.status_code != 200:
            raise ClientError(
                f"{self.url}: HTTP {response.status_code} {answer[:200].decode(errors='replace')}"
            )
        json_length = int(str(response.get(HEADER_LENGTH) or len(answer)))
        _check_scores([len(answer) - json_length], rows)
        return len(answer)

    def close(self) -> None:
        self._client.close()
