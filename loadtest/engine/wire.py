"""The least work per request: gRPC inference requests serialised once, sent as bytes.

A load generator that builds ``InferInput`` objects, copies tensors and
checks metadata on every request measures its own Python, not the server. Here
each batch of a payload pool becomes one serialised ``ModelInferRequest``
before the load starts; a request is then one call on a raw gRPC method with
those bytes, and the answer is checked by one length (``B`` FP32 scores), so a
wrong or empty answer still fails the request. The server sees the same bytes
tritonclient would send.
"""

from __future__ import annotations

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


def serialised_requests(model: str, pool: PayloadPool, version: str = "") -> list[bytes]:
    """Every batch of ``pool`` as a serialised ``ModelInferRequest`` for ``model`` (tensors raw)."""
    requests = []
    for batch in pool.batches():
        message = service_pb2.ModelInferRequest(model_name=model, model_version=version)
        for name, array in batch.items():
            array = np.ascontiguousarray(array)
            tensor = message.inputs.add()
            tensor.name, tensor.datatype = name, triton_dtype(array.dtype)
            tensor.shape.extend(array.shape)
            message.raw_input_contents.append(array.tobytes())
        message.outputs.add().name = OUTPUT
        requests.append(message.SerializeToString())
    return requests


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
        contents = response.raw_output_contents
        if len(contents) != 1 or len(contents[0]) != rows * _SCORE_BYTES:
            got, wanted = [len(c) for c in contents], rows * _SCORE_BYTES
            raise DataError(f"answer holds {got} output bytes, expected {wanted} ({rows} scores)")
        return len(answer)

    def close(self) -> None:
        self._channel.close()
