"""The asyncio client: tritonclient's ``http.aio`` / ``grpc.aio`` with requests in flight.

Same checks, retries and error lines as :class:`clients.triton.TritonClient`;
:meth:`AsyncTritonClient.infer_batches` keeps up to ``max_in_flight``
requests pending and yields the answers in input order. With system shared
memory each request in flight holds a region of its own (a small pool,
registered once, reused, unregistered and destroyed on close).

Create it inside a running event loop::

    async with AsyncTritonClient("127.0.0.1:8001", "grpc") as client:
        async for batch, probabilities in client.infer_batches("dlrm_onnx", batches, max_in_flight=4):
            ...
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from bundle.errors import BundleError, ClientError
from clients import failures, ranking, request, retry
from clients import protocol as wire
from clients.batching import RowsT, located, ordered
from clients.connection import Connection
from clients.protocol import ModelState
from clients.request import Prepared
from clients.shm import SystemRegion, region_bytes, registration_error
from clients.stats import ModelStats, parse_statistics
from clients.validation import ModelSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncTritonClient(Connection):
    """An asyncio connection to one tritonserver over HTTP (aiohttp) or gRPC (grpc.aio).

    Takes the arguments of :class:`clients.connection.Connection` (url, protocol,
    timeout, shared memory, validation, retry policy, admin key), or a
    :class:`ClientOptions` through :meth:`from_options`. One event loop only;
    concurrent ``infer`` calls on one client are fine.
    """

    ASYNCIO = True

    def _setup(self) -> None:
        self._spec_lock = asyncio.Lock()
        self._free: list[SystemRegion] = []
        self._regions: list[SystemRegion] = []
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    async def __aenter__(self) -> AsyncTritonClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ calls
    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` with retries on UNAVAILABLE; any failure as a ClientError about ``what``."""
        if self._closed:
            raise ClientError(f"{self!r} is closed")
        try:
            return await retry.acall(fn, self.options.retry, f"{self.options.endpoint} {what}")
        except BundleError:
            raise
        except Exception as exc:  # tritonclient's and the transport's errors, classified here
            raise failures.client_error(self.url, self.protocol, what, exc) from exc

    async def is_ready(self) -> bool:
        """Whether the server answers and is ready (False when it is down; never raises)."""
        try:
            return bool(await self._client.is_server_ready(**self._kwargs))
        except Exception:  # a refused connection is an answer here, not an error
            return False

    async def server_live(self) -> bool:
        """Whether the server says it is live (ClientError when it cannot be reached)."""
        return bool(await self._call("server live", lambda: self._client.is_server_live(**self._kwargs)))

    async def server_metadata(self) -> dict[str, Any]:
        """The server's name, version and extensions."""
        return dict(
            await self._call("server metadata", lambda: self._client.get_server_metadata(**self._json))
        )

    async def repository_index(self) -> list[ModelState]:
        """Every model of the repository with its state."""
        document = await self._call(
            "repository index", lambda: self._client.get_model_repository_index(**self._json)
        )
        return wire.index_entries(document)

    async def statistics(self, model: str = "", version: str = "") -> list[ModelStats]:
        """Inference statistics of ``model`` (every model when "")."""
        document = await self._call(
            f"statistics of model {model!r}",
            lambda: self._client.get_inference_statistics(model, version, **self._json),
        )
        return parse_statistics(document)

    async def model_spec(self, model: str, version: str = "") -> ModelSpec:
        """What ``model`` accepts and returns (fetched once, also under concurrent calls)."""
        key = (model, version)
        async with self._spec_lock:
            if key not in self._specs:
                try:
                    metadata = await self._call(
                        f"model {model!r}",
                        lambda: self._client.get_model_metadata(model, version, **self._json),
                    )
                    config = await self._call(
                        f"model {model!r}",
                        lambda: self._client.get_model_config(model, version, **self._json),
                    )
                except ClientError as exc:
                    raise await self._diagnose(model, exc) from exc.__cause__
                self._specs[key] = ModelSpec.from_server(metadata, config)
        return self._specs[key]

    async def _diagnose(self, model: str, error: ClientError) -> ClientError:
        cause = error.__cause__
        if cause is None or failures.is_transport_failure(cause):
            return error
        try:
            index = await self.repository_index()
        except ClientError:
            return error
        return wire.model_problem(model, self.options, index) or error

    # -------------------------------------------------------------- inference
    async def infer(self, model: str, inputs: Mapping[str, np.ndarray], version: str = "") -> np.ndarray:
        """Run ``model`` on one batch: inputs as for :meth:`TritonClient.infer`; ``B x 1`` float32."""
        if self._closing:
            raise ClientError(f"{self!r} is closed")
        self._active += 1
        self._idle.clear()
        try:
            return await self._infer(model, inputs, version)
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _infer(self, model: str, inputs: Mapping[str, np.ndarray], version: str) -> np.ndarray:
        spec = await self.model_spec(model, version) if self.options.validate else None
        if spec is not None and spec.user_features is not None and ranking.is_flat(inputs):
            requests = ranking.user_requests(spec.user_features, spec.hotness, inputs)
            parts = await asyncio.gather(*(self._infer(model, request, version) for request in requests))
            return ranking.answers(list(parts))
        pairs, rows = spec.validate(inputs) if spec is not None else request.unchecked_inputs(inputs)
        output = request.output_for(spec)
        if self.options.shared_memory != "system":
            prepared = request.build(self._module, self.protocol, model, version, pairs, rows, output)
            return request.decode(prepared, await self._send(prepared))
        slices = request.shm_layout(pairs, output, rows)
        region = await self._acquire(region_bytes(slices))
        # Back to the pool only after a completed answer: after a failure or a
        # cancellation the server may still write into the region, so it stays
        # out of use until close() unregisters and destroys it.
        prepared = request.build_shm(self._module, model, version, pairs, rows, output, region, slices)
        result = request.decode(prepared, await self._send(prepared))
        self._free.append(region)
        return result

    async def infer_outputs(
        self, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], version: str = ""
    ) -> dict[str, np.ndarray]:
        """:meth:`TritonClient.infer_outputs`, awaited."""
        if self._closing:
            raise ClientError(f"{self!r} is closed")
        prepared = request.build_named(self._module, self.protocol, model, version, inputs, outputs)
        result = await self._send(prepared)
        return request.decode_named(result, outputs, f"{self.options.endpoint} model {model!r}")

    async def _send(self, prepared: Prepared) -> Any:
        def infer() -> Awaitable[Any]:
            return self._client.infer(
                prepared.model,
                prepared.inputs,
                model_version=prepared.version,
                outputs=prepared.outputs,
                **self._kwargs,
            )

        try:
            return await self._call(f"model {prepared.model!r}", infer)
        except ClientError as exc:
            if exc.__cause__ is not None and failures.is_not_found(exc.__cause__):
                raise await self._diagnose(prepared.model, exc) from exc.__cause__
            raise

    async def infer_batches(
        self, model: str, batches: Iterable[RowsT], max_in_flight: int = 4, version: str = ""
    ) -> AsyncIterator[tuple[RowsT, np.ndarray]]:
        """Infer every batch with up to ``max_in_flight`` requests pending; yield in input order.

        Yields:
            ``(batch, B x 1 float32 probabilities)`` in the order of ``batches``.
        """
        if self.options.validate:
            await self.model_spec(model, version)  # one fetch, and a bad model fails before any batch

        async def one(batch: RowsT) -> np.ndarray:
            try:
                return await self.infer(model, batch.inputs(), version)
            except ClientError as exc:
                raise located(batch, exc) from exc.__cause__

        results = ordered(batches, one, max_in_flight)
        try:
            async for item in results:
                yield item
        finally:
            await results.aclose()

    # ---------------------------------------------------------- shared memory
    async def _acquire(self, nbytes: int) -> SystemRegion:
        """A free registered region of at least ``nbytes`` (grown or created as needed)."""
        for index, region in enumerate(self._free):
            if region.byte_size >= nbytes:
                return self._free.pop(index)
        if self._free:
            await self._release(self._free.pop())
        region = SystemRegion(nbytes)
        # Tracked before registering: if registration fails or is cancelled after
        # the server took it, close() still unregisters and destroys it.
        self._regions.append(region)
        try:
            await self._call(
                "shared memory registration",
                lambda: self._client.register_system_shared_memory(
                    region.name, region.key, region.byte_size, **self._admin
                ),
            )
        except ClientError as exc:
            raise registration_error(exc) from exc.__cause__
        logger.debug("registered %r with %s", region, self.options.endpoint)
        return region

    async def _release(self, region: SystemRegion) -> None:
        """Unregister ``region`` (best effort) and destroy it locally."""
        if region in self._regions:
            self._regions.remove(region)
        try:
            await self._client.unregister_system_shared_memory(region.name, **self._admin)
        except Exception as exc:  # the server may be gone; the local segment must go regardless
            logger.debug("could not unregister %r: %s", region, failures.message(exc))
        region.destroy()

    async def close(self) -> None:
        """Wait for requests in flight (up to the timeout), release every shared-memory
        region (unregister, destroy) and close the connection; idempotent."""
        if self._closed:
            return
        self._closing = True
        try:
            if self._active:
                try:
                    await asyncio.wait_for(self._idle.wait(), self.options.timeout_s)
                except TimeoutError:
                    logger.debug("%d requests still in flight at close", self._active)
            for region in list(self._regions):
                await self._release(region)
            self._free.clear()
        finally:
            self._closed = True
            await self._client.close()
