"""grpcio's own call of Triton's inference method, the reference the bundle's socket senders are
held to: the same serialised ``ModelInferRequest`` in, the answer's bytes out, a failed call as
one line in the senders' form (``host:port: STATUS message``)."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np

from bundle.errors import ClientError
from loadtest.engine.wire import MODEL_INFER, answer_scores


class GrpcioInfer:
    """One grpcio channel to ``url``, its inference method called with bytes (no retries)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self._timeout_s = url, timeout_s
        options = [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.enable_retries", 0),
        ]
        self._channel = grpc.insecure_channel(url, options=options)
        self._call: Any = self._channel.unary_unary(MODEL_INFER)

    def scores(self, request: bytes) -> np.ndarray:
        """The answer's scores, or :class:`ClientError` with the call's status and message."""
        try:
            answer: bytes = self._call(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise ClientError(f"{self.url}: {getattr(code, 'name', code)} {details}") from None
        return answer_scores(answer)

    def close(self) -> None:
        self._channel.close()
