"""One client API over tritonclient's HTTP and gRPC protocols.

Tensor names and dtypes come from :mod:`criteo.schema`; every failure becomes
a :class:`~bundle.errors.ClientError` with one clear line.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Literal

import numpy as np

from bundle.errors import ClientError
from criteo.schema import INPUTS, OUTPUT

Protocol = Literal["http", "grpc"]
PROTOCOLS: tuple[str, ...] = ("http", "grpc")


def _message(exc: Exception) -> str:
    text = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return " ".join(str(text).split())


class TritonClient:
    """A connection to one Triton server over HTTP or gRPC (reused across calls).

    Args:
        url: ``host:port`` of the protocol's endpoint.
        protocol: ``http`` or ``grpc``.
        timeout_s: network timeout of each call.
    """

    def __init__(self, url: str, protocol: Protocol = "grpc", timeout_s: float = 30.0) -> None:
        if protocol not in PROTOCOLS:
            raise ClientError(f"unknown protocol {protocol!r}; choose http or grpc")
        self.url = url
        self.protocol = protocol
        self._timeout_s = timeout_s
        try:
            if protocol == "http":
                import tritonclient.http as module

                self._client: Any = module.InferenceServerClient(
                    url, connection_timeout=timeout_s, network_timeout=timeout_s
                )
            else:
                import tritonclient.grpc as module  # type: ignore[no-redef]

                self._client = module.InferenceServerClient(url)
        except Exception as exc:  # tritonclient raises several unrelated types here
            raise ClientError(f"cannot create a {protocol} client for {url}: {_message(exc)}") from exc
        self._module = module

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def is_ready(self) -> bool:
        """Whether the server answers and is ready (False when it is down)."""
        try:
            return bool(self._client.is_server_ready())
        except Exception:  # a refused connection is an answer here, not an error
            return False

    def infer(self, model: str, inputs: dict[str, np.ndarray], version: str = "") -> np.ndarray:
        """Run ``model`` on one batch.

        Args:
            model: model name in the repository.
            inputs: ``dense_features`` (``B x 13`` float32) and ``categorical_ids`` (``B x 26`` int64).
            version: model version ("" for the server's choice).

        Returns:
            ``B x 1`` float32 probabilities.
        """
        tensors = []
        for spec in INPUTS:
            if spec.name not in inputs:
                raise ClientError(f"input {spec.name!r} is missing")
            array = np.ascontiguousarray(inputs[spec.name], dtype=spec.dtype)
            tensor = self._module.InferInput(spec.name, list(array.shape), spec.triton_dtype)
            if self.protocol == "http":
                tensor.set_data_from_numpy(array, binary_data=True)
            else:
                tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        if self.protocol == "http":
            outputs = [self._module.InferRequestedOutput(OUTPUT, binary_data=True)]
        else:
            outputs = [self._module.InferRequestedOutput(OUTPUT)]
        try:
            result = self._client.infer(model, tensors, model_version=version, outputs=outputs)
        except Exception as exc:  # InferenceServerException and transport errors alike
            raise ClientError(f"{self.protocol}://{self.url} {model}: {_message(exc)}") from exc
        output = result.as_numpy(OUTPUT)
        if output is None:
            raise ClientError(f"{model}: the response holds no {OUTPUT!r}")
        return np.asarray(output)
