"""The closed loop's senders against the real local tritonserver: the socket senders that the
driver's workers and locust's users send through answer as grpcio and a plain HTTP client do
(the same scores, the same error in one line), locust still reports them to its own statistics,
and the serial-client-time flag fires on a step whose client is slow, not on a fast one.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ClientError
from loadtest.engine.client_cpu import SERIAL_REASON, SERIAL_SHARE
from loadtest.engine.driver import Driver
from loadtest.engine.grpc_socket import SocketGrpcInfer
from loadtest.engine.payload import build_pool
from loadtest.engine.served import raw_connection
from loadtest.engine.wire import (
    HEADER_LENGTH,
    RawHttpInfer,
    http_body,
    http_header_length,
    serialised_request,
)
from loadtest.sweeps.sweep import REPO_ROOT, USERS
from server import LocalServer
from tests.grpcio_reference import GrpcioInfer

pytestmark = pytest.mark.integration

MODEL = "dlrm_onnx"
#: Rows of a request the tiny model refuses: one more than its config's max_batch_size.
TOO_MANY_ROWS = 4097


def _http_reference(url: str, body: bytes, header_length: int, rows: int) -> np.ndarray:
    """The scores of ``body`` sent with Python's own HTTP client, or its error in the senders' form."""
    request = urllib.request.Request(
        f"http://{url}/v2/models/{MODEL}/infer",
        data=body,
        headers={HEADER_LENGTH: str(header_length), "Content-Type": "application/octet-stream"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            data, json_length = answer.read(), int(answer.headers[HEADER_LENGTH])
    except urllib.error.HTTPError as exc:
        raise ClientError(f"{url}: HTTP {exc.code} {exc.read()[:200].decode(errors='replace')}") from None
    scores = np.frombuffer(data, dtype="<f4", offset=json_length)
    assert scores.shape == (rows,)
    return scores


def test_the_socket_senders_answer_as_grpcio_and_a_plain_http_client_do(
    exported_server: LocalServer,
) -> None:
    """Bit for bit the same scores over gRPC and HTTP at batch 1, 64 and 1024, and for a request
    the model refuses (more rows than its max_batch_size) the same one-line error."""
    grpc_url, http_url = exported_server.grpc_url, exported_server.http_url
    grpc_ours, grpc_theirs = SocketGrpcInfer(grpc_url, timeout_s=30), GrpcioInfer(grpc_url, timeout_s=30)
    try:
        for rows in (1, 64, 1024, TOO_MANY_ROWS):
            batch = build_pool(rows, batches=1).batch(0)
            request = serialised_request(MODEL, batch)
            body, length = http_body(batch), http_header_length(build_pool(rows, batches=1))
            http_ours = RawHttpInfer(http_url, MODEL, length, timeout_s=30)
            try:
                if rows == TOO_MANY_ROWS:
                    errors = []
                    for call in (
                        partial(grpc_theirs.scores, request),
                        partial(grpc_ours, request, rows),
                        partial(_http_reference, http_url, body, length, rows),
                        partial(http_ours, body, rows),
                    ):
                        with pytest.raises(ClientError) as error:
                            call()
                        errors.append(str(error.value))
                    assert errors[0] == errors[1] and errors[2] == errors[3], errors
                    assert all("\n" not in e and "batch-size must be <= 4096" in e for e in errors), errors
                    continue
                grpc_ours(request, rows)
                http_ours(body, rows)
                expected = grpc_theirs.scores(request)
                assert expected.shape == (rows,)
                assert np.array_equal(grpc_ours.last_scores(), expected)
                assert np.array_equal(http_ours.last_scores(), _http_reference(http_url, body, length, rows))
                assert np.array_equal(http_ours.last_scores(), expected)
            finally:
                http_ours.close()
    finally:
        grpc_ours.close()
        grpc_theirs.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_driver_sends_through_the_socket_senders_and_measures_their_serial_time(
    exported_server: LocalServer, protocol: str
) -> None:
    """Four workers, 200 requests: every one answered, and each worker's every request after its
    first carries the time from its last answer's arrival to its send."""
    from loadtest.engine.served import triton_requests

    url = exported_server.grpc_url if protocol == "grpc" else exported_server.http_url
    pool = build_pool(8, batches=16)
    connect = triton_requests(url, protocol, MODEL, pool, 4)  # type: ignore[arg-type]
    with Driver(connect, 4, max_requests=200) as driver:
        total = driver.join(120)
    assert total.ok == 200 and total.errors == 0, dict(total.error_kinds)
    assert total.serial_count == 200 - 4
    assert 0 < total.serial_us < total.histogram.mean_ms * 1000


def _window(url: str, rows: int, delay_s: float, workers: int = 2) -> tuple[float, str, float]:
    """One 2-second window of the driver over gRPC, each request's bytes handed over ``delay_s``
    late (a slow client: the time falls between an answer and the next send); its serial client
    time per request (us), its client-bound reason and its serial share of the mean latency."""
    batch = build_pool(rows, batches=1).batch(0)
    message = serialised_request(MODEL, batch)

    def slow(worker: int, sequence: int) -> bytes:
        if delay_s:
            time.sleep(delay_s)
        return message

    connect = raw_connection(url, "grpc", MODEL, 0, 30.0, rows, slow)
    with Driver(connect, workers) as driver:
        driver.wait(0.5)
        window = driver.measure(2.0)
    assert window.errors == 0 and window.ok > 0 and window.client is not None
    return window.serial_us, window.client.reason(), window.client.serial_share


def test_the_serial_time_flag_fires_on_a_slow_client_and_not_on_a_fast_one(
    exported_server: LocalServer,
) -> None:
    url = exported_server.grpc_url
    # 3 ms of the client's own between an answer and the next request, at batch 64.
    serial_us, reason, share = _window(url, 64, 0.003)
    assert serial_us >= 3000 and share > SERIAL_SHARE
    assert SERIAL_REASON in reason and f"{serial_us:.0f} us" in reason and "mean latency" in reason
    # The socket sender's own time at batch 1024 is a small part of the request.
    serial_us, reason, share = _window(url, 1024, 0.0, workers=1)
    assert serial_us > 0 and share < SERIAL_SHARE, (serial_us, share)
    assert SERIAL_REASON not in reason


def _locust(server: LocalServer, protocol: str, folder: Path, rows: int) -> dict[str, list[dict[str, str]]]:
    """Two locust users of ``protocol`` for 3 s, with locust's own statistics on (as a user runs
    it by hand, not as the sweep does); locust's CSV files by name."""
    locustfile, user_class = USERS[protocol]
    url = server.grpc_url if protocol == "grpc" else server.http_url
    command = [
        sys.executable, "-m", "loadtest.sweeps.locust_main", "-f", str(locustfile), user_class,
        "--headless", "--users", "2", "--spawn-rate", "2", "--run-time", "3s", "--host", url,
        "--model", MODEL, "--batch-size", str(rows), "--results-dir", str(folder), "--warmup", "0.5",
        "--exit-code-on-error", "0", "--only-summary", "--loglevel", "WARNING",
        "--csv", str(folder / "locust"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    tables = {}
    for name in ("stats", "failures"):
        with open(folder / f"locust_{name}.csv", newline="") as handle:
            tables[name] = list(csv.DictReader(handle))
    return tables


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_locust_users_send_through_the_socket_senders_and_report_to_locust(
    exported_server: LocalServer, protocol: str, tmp_path: Path
) -> None:
    """locust's own statistics count the users' requests; the load test's record holds their
    serial client time; a request the server refuses is one failure row in locust's CSV, its
    error the same line the grpcio or plain HTTP reference gives."""
    tables = _locust(exported_server, protocol, tmp_path / "ok", 8)
    (row,) = [r for r in tables["stats"] if r["Name"] == MODEL]
    assert int(row["Request Count"]) > 0 and int(row["Failure Count"]) == 0, row
    assert not tables["failures"]
    (record,) = (tmp_path / "ok").glob("latency-*.json")
    tally = json.loads(record.read_text())["tally"]
    assert tally["serial_count"] > 0 and tally["serial_s"] > 0

    tables = _locust(exported_server, protocol, tmp_path / "refused", TOO_MANY_ROWS)
    (row,) = [r for r in tables["stats"] if r["Name"] == MODEL]
    assert int(row["Request Count"]) == int(row["Failure Count"]) > 0, row
    (failure,) = tables["failures"]
    batch = build_pool(TOO_MANY_ROWS, batches=1).batch(0)
    with pytest.raises(ClientError) as expected:
        if protocol == "grpc":
            reference = GrpcioInfer(exported_server.grpc_url, timeout_s=30)
            try:
                reference.scores(serialised_request(MODEL, batch))
            finally:
                reference.close()
        else:
            length = http_header_length(build_pool(TOO_MANY_ROWS, batches=1))
            _http_reference(exported_server.http_url, http_body(batch), length, TOO_MANY_ROWS)
    # locust's failures CSV holds the exception's repr: the same error, the same one line.
    assert failure["Error"] == repr(expected.value) and "\n" not in failure["Error"], failure
    assert not math.isnan(float(row["Average Response Time"]))
