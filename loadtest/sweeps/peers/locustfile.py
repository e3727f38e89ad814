"""The locust user of the FastAPI peer (:mod:`loadtest.sweeps.peers.fastapi_server`).

Same closed loop, payloads and recording as :mod:`loadtest.sweeps.locustfile`'s
Triton users, over one keep-alive HTTP connection per user speaking the
binary format of :mod:`loadtest.sweeps.peers.wire`::

    locust -f loadtest/sweeps/peers/locustfile.py FastApiUser --headless -u 4 -r 4 -t 20s \\
        --host 127.0.0.1:8100 --model dlrm_onnx --batch-size 64 --results-dir reports/step
"""

from __future__ import annotations

import random
from typing import Any

from geventhttpclient import HTTPClient
from locust import User, constant, task

from bundle.errors import ClientError
from loadtest.sweeps.peers import wire
from loadtest.sweeps.recorder import options, payload_pool, timed_request


class FastApiUser(User):
    """A closed-loop user of the FastAPI peer: one request in flight, answers decoded to ``B x 1``."""

    wait_time = constant(0)

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        parsed = options(environment)
        self._model: str = parsed.model
        self._path = wire.infer_path(parsed.model)
        self._timeout_s: float = parsed.request_timeout
        self._bodies = [wire.encode_inputs(batch) for batch in payload_pool().batches()]
        self._next = random.randrange(len(self._bodies))
        self._client: HTTPClient | None = None

    def on_start(self) -> None:
        host, _, port = (self.host or "").rpartition(":")
        self._client = HTTPClient(
            host,
            int(port),
            concurrency=1,
            connection_timeout=self._timeout_s,
            network_timeout=self._timeout_s,
        )

    def on_stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @task
    def infer(self) -> None:
        if self._client is None:
            return
        body, rows = self._bodies[self._next % len(self._bodies)]
        self._next += 1
        headers = {wire.BATCH_HEADER: str(rows), "content-type": wire.CONTENT_TYPE}
        client = self._client

        def call() -> int:
            response = client.post(self._path, body=body, headers=headers)
            answer = response.read()
            if response.status_code != 200:
                raise ClientError(f"HTTP {response.status_code}: {answer[:200]!r}")
            return int(wire.decode_output(answer, rows).nbytes)

        timed_request(self.environment, "FASTAPI", self._model, call, rows, self.host)
