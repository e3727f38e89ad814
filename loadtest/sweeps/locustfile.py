"""locust users that send inference requests to Triton over gRPC or HTTP.

Each user is one client with one connection (reused for every request),
sending pre-built batches of real-format rows back to back: ``N`` users keep
``N`` requests in flight. Run it headless, naming one user class::

    locust -f loadtest/sweeps/locustfile.py GrpcTritonUser --headless -u 4 -r 4 -t 20s \\
        --host 127.0.0.1:8001 --model dlrm_onnx --batch-size 64 \\
        --results-dir reports/step --warmup 2 --window 15 --server-stats grpc

``python -m loadtest sweep`` runs it step by step. The options (listed under
"Triton load test" in ``--help``) also come from ``LOCUST_MODEL``-style
environment variables or ``locust.conf``; :mod:`loadtest.sweeps.recorder` keeps the
exact latency of every request (locust itself rounds to whole milliseconds).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

from locust import User, constant, task

from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT
from clients.options import Protocol
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.wire import RawGrpcInfer, RawHttpInfer, http_body, http_header_length, serialised_request
from loadtest.sweeps.recorder import next_stream_row, options, payload_pool, timed_request


class TritonUser(User):
    """A closed-loop user: one request in flight, the next sent as soon as the answer is read.

    Each protocol's subclass holds the one task (a task here would be inherited beside it,
    and locust would run both).

    The request's latency is the client's whole call (request built, sent,
    answer received and decoded to a ``B x 1`` array). Failed requests are
    reported as failures, never retried: a load test counts them.
    """

    abstract = True
    wait_time = constant(0)
    protocol: ClassVar[Protocol]

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        parsed = options(environment)
        self._model: str = parsed.model
        self._batch_size: int = parsed.batch_size
        self._timeout_s: float = parsed.request_timeout
        #: Streamed: each request takes the stream's next rows (built then); else the pool's batches.
        self._stream: bool = parsed.stream_start >= 0
        self._batches = [] if self._stream else payload_pool().batches()
        # Users start at different batches so that concurrent requests differ.
        self._next = random.randrange(len(self._batches)) if self._batches else 0
        self._client: TritonClient | None = None

    def on_start(self) -> None:
        self._client = TritonClient(
            self.host or "", self.protocol, timeout_s=self._timeout_s, retry=RetryPolicy(max_tries=1)
        )
        # The model's metadata is fetched once here, not inside a timed request.
        self._timed("metadata", lambda client: client.model_spec(self._model), report_success=False)

    def on_stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def next_rows(self) -> dict[str, Any]:
        """The stream's next ``B`` rows, as the model's inputs."""
        pool = payload_pool()
        row = next_stream_row(self.environment, self._batch_size)
        stop = row + self._batch_size
        return {DENSE_INPUT: pool.dense[row:stop], CATEGORICAL_INPUT: pool.categorical[row:stop]}

    def infer_with_client(self) -> None:
        """One request through the bundle's client (tritonclient underneath)."""
        inputs = self._batches[self._next % len(self._batches)]
        self._next += 1
        self._timed(self._model, lambda client: client.infer(self._model, inputs))

    def _timed(self, name: str, call: Any, report_success: bool = True) -> None:
        client = self._client
        if client is None:
            return
        timed_request(
            self.environment,
            self.protocol.upper(),
            name,
            lambda: int(getattr(call(client), "nbytes", 0)),
            self._batch_size,
            self.host,
            report_success,
        )


class RawTritonUser(TritonUser):
    """A user whose requests are serialised once, at start (:mod:`loadtest.engine.wire`): a
    request is one call with those bytes, its answer checked by length. A streamed step builds
    each request from the stream's next rows when it is sent."""

    abstract = True

    def open(self) -> tuple[Callable[[dict[str, Any]], bytes], RawGrpcInfer | RawHttpInfer]:
        """How a batch becomes a request's bytes, and the connection that sends them."""
        raise NotImplementedError

    def on_start(self) -> None:
        super().on_start()
        self._encode, self._raw = self.open()
        self._messages = [] if self._stream else [self._encode(b) for b in payload_pool().batches()]

    def on_stop(self) -> None:
        self._raw.close()
        super().on_stop()

    def send_next(self) -> None:
        """Send the next request (the pool's next batch, or the stream's next rows) and time it."""
        if self._stream:
            message = self._encode(self.next_rows())
        else:
            message = self._messages[self._next % len(self._messages)]
            self._next += 1
        rows = self._batch_size
        timed_request(
            self.environment, self.protocol.upper(), self._model, lambda: self._raw(message, rows),
            rows, self.host,
        )  # fmt: skip


class GrpcTritonUser(RawTritonUser):
    """Triton's gRPC endpoint (``--host 127.0.0.1:8001``); tensors as raw bytes in the message."""

    protocol = "grpc"

    def open(self) -> tuple[Callable[[dict[str, Any]], bytes], RawGrpcInfer | RawHttpInfer]:
        return partial(serialised_request, self._model), RawGrpcInfer(self.host or "", self._timeout_s)

    @task
    def infer(self) -> None:
        self.send_next()


class HttpTritonUser(RawTritonUser):
    """Triton's HTTP/REST endpoint (``--host 127.0.0.1:8000``); tensors in the binary-data extension."""

    protocol = "http"

    def open(self) -> tuple[Callable[[dict[str, Any]], bytes], RawGrpcInfer | RawHttpInfer]:
        length = http_header_length(payload_pool())
        return http_body, RawHttpInfer(self.host or "", self._model, length, self._timeout_s)

    @task
    def infer(self) -> None:
        self.send_next()
