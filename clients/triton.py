"""The synchronous client: one connection to tritonserver over HTTP or gRPC.

Tensor names and dtypes come from the model's metadata (which the export
wrote from :mod:`bundle.schema`); every request is checked against it before
it is sent (:mod:`clients.validation`), calls that meet UNAVAILABLE are
retried with backoff (:mod:`clients.retry`), and every failure becomes a
:class:`~bundle.errors.ClientError` with one clear line
(:mod:`clients.failures`). Not thread-safe: one client per thread.

Example::

    with TritonClient("127.0.0.1:8001", "grpc", shared_memory="system") as client:
        probabilities = client.infer("dlrm_onnx", batch.inputs())   # B x 1 float32
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from bundle.errors import BundleError, ClientError
from clients import failures, ranking, request, retry
from clients import protocol as wire
from clients.batching import RowsT, located
from clients.connection import Connection
from clients.options import PROTOCOLS, Protocol
from clients.protocol import ModelState
from clients.request import Prepared
from clients.shm import SystemRegion, region_bytes, registration_error
from clients.stats import ModelStats, parse_statistics
from clients.validation import ModelSpec

__all__ = ["PROTOCOLS", "Protocol", "TritonClient"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TritonClient(Connection):
    """A connection to one tritonserver over HTTP or gRPC, reused across calls.

    Takes the arguments of :class:`clients.connection.Connection` (url, protocol,
    timeout, shared memory, validation, retry policy, admin key), or a
    :class:`ClientOptions` through :meth:`from_options`.
    """

    def _setup(self) -> None:
        self._region: SystemRegion | None = None

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ calls
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` with retries on UNAVAILABLE; any failure as a ClientError about ``what``."""
        if self._closed:
            raise ClientError(f"{self!r} is closed")
        try:
            return retry.call(fn, self.options.retry, f"{self.options.endpoint} {what}")
        except BundleError:
            raise
        except Exception as exc:  # tritonclient's and the transport's errors, classified here
            raise failures.client_error(self.url, self.protocol, what, exc) from exc

    def is_ready(self) -> bool:
        """Whether the server answers and is ready (False when it is down; never raises)."""
        try:
            return bool(self._client.is_server_ready(**self._kwargs))
        except Exception:  # a refused connection is an answer here, not an error
            return False

    def server_live(self) -> bool:
        """Whether the server says it is live (ClientError when it cannot be reached)."""
        return bool(self._call("server live", lambda: self._client.is_server_live(**self._kwargs)))

    def server_ready(self) -> bool:
        """Whether the server says it is ready: every model it should load is READY."""
        return bool(self._call("server ready", lambda: self._client.is_server_ready(**self._kwargs)))

    def server_metadata(self) -> dict[str, Any]:
        """The server's name, version and extensions."""
        return dict(self._call("server metadata", lambda: self._client.get_server_metadata(**self._json)))

    def model_ready(self, model: str, version: str = "") -> bool:
        """Whether ``model`` (``version``) is loaded and ready."""
        return bool(
            self._call(
                f"model {model!r} ready", lambda: self._client.is_model_ready(model, version, **self._kwargs)
            )
        )

    def repository_index(self) -> list[ModelState]:
        """Every model of the repository with its state."""
        document = self._call(
            "repository index", lambda: self._client.get_model_repository_index(**self._json)
        )
        return wire.index_entries(document)

    def statistics(self, model: str = "", version: str = "") -> list[ModelStats]:
        """Inference statistics of ``model`` (every model when "")."""
        what = f"statistics of model {model!r}" if model else "statistics"
        document = self._call(
            what, lambda: self._client.get_inference_statistics(model, version, **self._json)
        )
        return parse_statistics(document)

    def model_spec(self, model: str, version: str = "") -> ModelSpec:
        """What ``model`` accepts and returns, from its metadata and config (cached).

        Raises:
            ClientError: the server is down, the model is unknown or not ready.
        """
        key = (model, version)
        if key not in self._specs:
            try:
                metadata = self._call(
                    f"model {model!r}", lambda: self._client.get_model_metadata(model, version, **self._json)
                )
                config = self._call(
                    f"model {model!r}", lambda: self._client.get_model_config(model, version, **self._json)
                )
            except ClientError as exc:
                raise self._diagnose(model, exc) from exc.__cause__
            self._specs[key] = ModelSpec.from_server(metadata, config)
        return self._specs[key]

    def _diagnose(self, model: str, error: ClientError) -> ClientError:
        """A clearer error for a failed model call: unknown or not-ready model, when the index says so."""
        cause = error.__cause__
        if cause is None or failures.is_transport_failure(cause):
            return error
        try:
            index = self.repository_index()
        except ClientError:
            return error
        return wire.model_problem(model, self.options, index) or error

    # -------------------------------------------------------------- inference
    def infer(self, model: str, inputs: Mapping[str, np.ndarray], version: str = "") -> np.ndarray:
        """Run ``model`` on one batch.

        Args:
            model: model name in the repository.
            inputs: ``dense_features`` (``B x 13`` float32) and ``categorical_ids``
                (``B x 26`` int64), or whatever the model's metadata lists.
            version: model version ("" for the server's choice).

        Returns:
            ``B x 1`` float32 probabilities (a ranking request: ``1 x C x 1``). Flat rows sent
            to a ranking model go as one request per run of rows that share a user's features
            (:mod:`clients.ranking`), their answers back in the rows' order.

        Raises:
            ClientError: invalid inputs (nothing sent), server down, unknown or
                not-ready model, or the server rejected the request.
        """
        spec = self.model_spec(model, version) if self.options.validate else None
        if spec is not None and spec.user_features is not None and ranking.is_flat(inputs):
            requests = ranking.user_requests(spec.user_features, spec.hotness, inputs)
            return ranking.answers([self.infer(model, request, version) for request in requests])
        prepared = self.prepare(model, inputs, version)
        try:
            result = self.send(prepared)
        except ClientError:
            # A request that timed out may still be answered into the region
            # later: never reuse it for another request.
            if prepared.region is not None:
                self._release_region()
            raise
        return self.decode(prepared, result)

    def infer_outputs(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        """One request of ``inputs`` as given (each with its own shape: a DLRMv3 user's, say), the
        named ``outputs`` back by name; the server checks the inputs.

        Raises:
            ClientError: server down, unknown or not-ready model, or the server refused the
                request (its one line).
        """
        prepared = request.build_named(self._module, self.protocol, model, version, inputs, outputs)
        return request.decode_named(self.send(prepared), outputs, f"{self.options.endpoint} model {model!r}")

    def prepare(self, model: str, inputs: Mapping[str, np.ndarray], version: str = "") -> Prepared:
        """Check ``inputs`` and build the request (into shared memory when enabled); nothing is sent."""
        spec = self.model_spec(model, version) if self.options.validate else None
        pairs, rows = spec.validate(inputs) if spec is not None else request.unchecked_inputs(inputs)
        output = request.output_for(spec)
        if self.options.shared_memory == "system":
            slices = request.shm_layout(pairs, output, rows)
            region = self._region_for(region_bytes(slices))
            return request.build_shm(self._module, model, version, pairs, rows, output, region, slices)
        return request.build(self._module, self.protocol, model, version, pairs, rows, output)

    def send(self, prepared: Prepared) -> Any:
        """Send a prepared request (retried on UNAVAILABLE); the raw tritonclient result."""
        what = f"model {prepared.model!r}"

        def infer() -> Any:
            return self._client.infer(
                prepared.model,
                prepared.inputs,
                model_version=prepared.version,
                outputs=prepared.outputs,
                **self._kwargs,
            )

        try:
            return self._call(what, infer)
        except ClientError as exc:
            if exc.__cause__ is not None and failures.is_not_found(exc.__cause__):
                raise self._diagnose(prepared.model, exc) from exc.__cause__
            raise

    def decode(self, prepared: Prepared, result: Any) -> np.ndarray:
        """The output of a result: ``B x 1`` float32 (copied out of shared memory when used)."""
        return request.decode(prepared, result)

    def infer_batches(
        self, model: str, batches: Iterable[RowsT], version: str = ""
    ) -> Iterator[tuple[RowsT, np.ndarray]]:
        """Infer batch after batch, one request in flight; yields each batch with its ``B x 1`` output."""
        for batch in batches:
            try:
                answer = self.infer(model, batch.inputs(), version)
            except ClientError as exc:
                raise located(batch, exc) from exc.__cause__
            yield batch, answer

    # ---------------------------------------------------------- shared memory
    def _region_for(self, nbytes: int) -> SystemRegion:
        """The client's registered region, re-created larger when ``nbytes`` do not fit."""
        if self._region is not None and self._region.byte_size >= nbytes:
            return self._region
        self._release_region()
        region = SystemRegion(nbytes)
        # Kept before registering: if registration fails after the server took
        # it (a timeout), releasing still unregisters it there.
        self._region = region
        try:
            self._call(
                "shared memory registration",
                lambda: self._client.register_system_shared_memory(
                    region.name, region.key, region.byte_size, **self._admin
                ),
            )
        except ClientError as exc:
            self._release_region()
            raise registration_error(exc) from exc.__cause__
        except BaseException:
            self._release_region()
            raise
        logger.debug("registered %r with %s", region, self.options.endpoint)
        return region

    def _release_region(self) -> None:
        """Unregister the region from the server (best effort) and destroy it locally."""
        region, self._region = self._region, None
        if region is None:
            return
        try:
            self._client.unregister_system_shared_memory(region.name, **self._admin)
        except Exception as exc:  # the server may be gone; the local segment must go regardless
            logger.debug("could not unregister %r: %s", region, failures.message(exc))
        region.destroy()

    def close(self) -> None:
        """Release shared memory (unregister, destroy) and close the connection; idempotent."""
        if self._closed:
            return
        try:
            self._release_region()
        finally:
            self._closed = True
            self._client.close()
