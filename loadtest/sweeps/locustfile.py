"""locust users that send inference requests to Triton over gRPC or HTTP.

Each user is one client with one connection (reused for every request),
sending pre-built batches of real-format rows back to back: ``N`` users keep
``N`` requests in flight. Run it headless, naming one user class::

    locust -f loadtest/sweeps/locustfile.py HttpTritonUser --headless -u 4 -r 4 -t 20s \\
        --host 127.0.0.1:8000 --model dlrm_onnx --batch-size 64 \\
        --results-dir reports/step --warmup 2 --window 15 --server-stats http

Users send from native threads, on the socket senders every load engine of the bundle uses
(:mod:`loadtest.engine.wire`: HTTP/1.1, and gRPC as HTTP/2 frames, a connection shared by up to
six users of a process as perf_analyzer's client shares a channel); they still report to
locust's events, so its UI, its web mode and its CSV read as usual. They cost the client least
under the launcher that leaves thread locks unpatched (:mod:`loadtest.sweeps.locust_main`)::

    python -m loadtest.sweeps.locust_main -f loadtest/sweeps/locustfile.py GrpcTritonUser \\
        --headless -u 4 -r 4 -t 20s --host 127.0.0.1:8001 --model dlrm_onnx

``python -m loadtest sweep`` runs it step by step. The options (listed under
"Triton load test" in ``--help``) also come from ``LOCUST_MODEL``-style
environment variables or ``locust.conf``; :mod:`loadtest.sweeps.recorder` keeps the
exact latency of every request (locust itself rounds to whole milliseconds).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import gevent
from locust import User, constant, task

from clients.options import Protocol
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.grpc_socket import GrpcSockets, SocketGrpcInfer
from loadtest.engine.payload import request_form
from loadtest.engine.wire import RawHttpInfer, http_body, http_header_length, serialised_request
from loadtest.sweeps.recorder import fire_failures, next_stream_row, options, payload_pool, timed_request

#: Seconds a raw user sends requests back to back before its task returns to locust. A return
#: per request costs the client more than the request's own Python: a yield to gevent's loop, and
#: for gRPC users a hand-over to and from their native thread (at batch 1, the client CPU per
#: request fell as the slices grew to the length set here). A stopping step waits for the slice
#: under way (``--stop-timeout``).
TASK_SLICE_S = 0.5
#: The pool's requests serialised, once per process and protocol: the users of a process share
#: them (serialising a pool is slow enough that each user's start would otherwise take a
#: noticeable time from the others in its process).
_MESSAGES: dict[str, list[bytes]] = {}
#: Users of this process that send from native threads (the thread pool grows to fit them).
_THREADED_USERS = [0]
#: The gRPC connections of this process's users, by host (users share them, six to one).
_GRPC_SOCKETS: dict[str, GrpcSockets] = {}


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
        #: A raw-row model takes the rows' text (the pool holds both forms), a ranking model one
        #: user's request a batch.
        self._form = request_form(self._model)
        self._batches = [] if self._stream else payload_pool().batches(self._form)
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
        return pool.rows(row, stop, self._form)

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
    request is one call with those bytes on a plain socket, from the user's native thread (a
    thread of gevent's pool), its answer checked by length, its serial client time recorded. A
    streamed step builds each request from the stream's next rows when it is sent."""

    abstract = True

    def open(self) -> tuple[Callable[[dict[str, Any]], bytes], SocketGrpcInfer | RawHttpInfer]:
        """How a batch becomes a request's bytes, and the sender that sends them."""
        raise NotImplementedError

    def on_start(self) -> None:
        super().on_start()
        self._encode, self._raw = self.open()
        if not self._stream and self.protocol not in _MESSAGES:
            _MESSAGES[self.protocol] = [self._encode(b) for b in payload_pool().batches(self._form)]
        self._messages = [] if self._stream else _MESSAGES[self.protocol]
        threads = gevent.get_hub().threadpool
        _THREADED_USERS[0] += 1
        threads.maxsize = max(threads.maxsize, _THREADED_USERS[0] + 1)

    def send(self) -> None:
        """The task: one slice of requests, from this user's native thread (its failures then
        reach locust from this greenlet)."""
        failures: list[dict[str, Any]] = []
        try:
            gevent.get_hub().threadpool.apply(self.send_for_a_slice, (failures,))
        finally:
            fire_failures(self.environment, failures)

    def on_stop(self) -> None:
        self._raw.close()
        super().on_stop()

    def send_for_a_slice(self, failures: list[dict[str, Any]] | None = None) -> None:
        """Send requests back to back for :data:`TASK_SLICE_S` (at least one), then return;
        ``failures``: see :func:`~loadtest.sweeps.recorder.timed_request`."""
        deadline = time.perf_counter() + TASK_SLICE_S
        self.send_next(failures)
        while time.perf_counter() < deadline:
            self.send_next(failures)

    def send_next(self, failures: list[dict[str, Any]] | None = None) -> None:
        """Send the next request (the pool's next batch, or the stream's next rows) and time it."""
        if self._stream:
            message = self._encode(self.next_rows())
        else:
            message = self._messages[self._next % len(self._messages)]
            self._next += 1
        rows, raw = self._batch_size, self._raw
        timed_request(
            self.environment, self.protocol.upper(), self._model, lambda: raw(message, rows),
            rows, self.host, failures=failures, serial=lambda: raw.serial_s,
        )  # fmt: skip


class GrpcTritonUser(RawTritonUser):
    """Triton's gRPC endpoint (``--host 127.0.0.1:8001``); tensors as raw bytes in the message.

    Each user sends its requests from a native thread of gevent's thread pool, a slice at a
    time, as HTTP/2 frames on a plain socket (:class:`~loadtest.engine.grpc_socket.SocketGrpcInfer`),
    on a connection it shares with up to five other users of its process.
    """

    protocol = "grpc"

    def open(self) -> tuple[Callable[[dict[str, Any]], bytes], SocketGrpcInfer | RawHttpInfer]:
        host = self.host or ""
        sockets = _GRPC_SOCKETS.get(host)
        if sockets is None:
            sockets = _GRPC_SOCKETS[host] = GrpcSockets(host, self._timeout_s)
        return partial(serialised_request, self._model), sockets.open()

    @task
    def infer(self) -> None:
        self.send()


class HttpTritonUser(RawTritonUser):
    """Triton's HTTP/REST endpoint (``--host 127.0.0.1:8000``); tensors in the binary-data extension.

    Each user sends from a native thread of gevent's thread pool, a slice at a time, on a plain
    blocking socket (:class:`~loadtest.engine.wire.RawHttpInfer`).
    """

    protocol = "http"

    def open(self) -> tuple[Callable[[dict[str, Any]], bytes], SocketGrpcInfer | RawHttpInfer]:
        length = http_header_length(payload_pool(), self._form)
        encode = partial(http_body, header_length=length)
        return encode, RawHttpInfer(self.host or "", self._model, length, self._timeout_s)

    @task
    def infer(self) -> None:
        self.send()
