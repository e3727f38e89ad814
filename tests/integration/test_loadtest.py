"""Load tests end to end: a 2-step locust sweep against the real local tritonserver.

The sweep runs as a user runs it (``python -m loadtest sweep``, locust as
subprocesses) on the tiny exported DLRM over gRPC, a few seconds per step;
the test then reads every output back and checks that they agree with each
other. The latency histogram's percentiles are checked against numpy on
known samples.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtest.engine.latency import LatencyHistogram, merged
from server import LocalServer, free_ports

pytestmark = pytest.mark.integration

MODEL = "dlrm_onnx"
BATCH = 8
CONCURRENCY = (1, 2)
PERCENTILE_KEYS = ("p50_ms", "p90_ms", "p95_ms", "p99_ms")


def test_histogram_percentiles_match_the_samples_within_a_bucket() -> None:
    rng = np.random.default_rng(0)
    samples = rng.lognormal(mean=-0.5, sigma=0.8, size=20_000)  # ms, mostly sub-millisecond
    first, second = LatencyHistogram(), LatencyHistogram()
    first.record_many(samples[:7_000])
    second.record_many(samples[7_000:])
    histogram = LatencyHistogram.from_json(json.loads(json.dumps(merged([first, second]).to_json())))
    assert histogram.count == samples.size
    values = [histogram.percentile(q) for q in (50, 90, 95, 99)]
    assert values == sorted(values)
    for q, value in zip((50, 90, 95, 99), values, strict=True):
        exact = float(np.percentile(samples, q, method="inverted_cdf"))
        assert value == pytest.approx(exact, rel=2e-3)
    assert histogram.mean_ms == pytest.approx(samples.mean())


@pytest.fixture(scope="module")
def sweep_out(
    exported_server: LocalServer, exported_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The report folder of a 2-step gRPC sweep (concurrency 1, 2) of the tiny DLRM."""
    out = tmp_path_factory.mktemp("loadtest") / "report"
    command = [
        sys.executable, "-m", "loadtest", "sweep", "--model", MODEL, "--protocol", "grpc",
        "--url", exported_server.grpc_url, "--repository", str(exported_repository),
        "--batch-size", str(BATCH), "--concurrency", ",".join(map(str, CONCURRENCY)),
        "--duration", "3", "--warmup", "1", "--baseline-seconds", "0.2", "--baseline-repeats", "2",
        "--out", str(out),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    assert f"report: {out / 'report.md'}" in completed.stdout
    return out


def test_sweep_writes_every_output(sweep_out: Path) -> None:
    for name in (
        "steps.csv",
        "report.json",
        "report.md",
        "latency_vs_throughput.png",
        "p99_vs_concurrency.png",
    ):
        path = sweep_out / name
        assert path.is_file() and path.stat().st_size > 0, name
    for png in ("latency_vs_throughput.png", "p99_vs_concurrency.png"):
        assert (sweep_out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (sweep_out / "report.md").read_text()
    assert "![latency vs throughput](latency_vs_throughput.png)" in markdown
    assert "Served / in-process throughput" in markdown
    assert "**Command**: `python -m loadtest sweep" in markdown


def test_outputs_agree_with_each_other(sweep_out: Path) -> None:
    with open(sweep_out / "steps.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    report = json.loads((sweep_out / "report.json").read_text())
    steps = report["steps"]
    assert [int(r["concurrency"]) for r in rows] == list(CONCURRENCY)
    assert [s["concurrency"] for s in steps] == list(CONCURRENCY)
    for row, step in zip(rows, steps, strict=True):
        assert row["model"] == step["model"] == MODEL
        assert row["protocol"] == "grpc" and int(row["batch_size"]) == BATCH
        requests_per_s, samples_per_s = float(row["requests_per_s"]), float(row["samples_per_s"])
        assert int(row["requests"]) > 0 and requests_per_s > 0
        assert samples_per_s == pytest.approx(requests_per_s * BATCH, rel=1e-9)
        assert requests_per_s == pytest.approx(int(row["requests"]) / float(row["seconds"]), rel=0.02)
        percentiles = [float(row[key]) for key in PERCENTILE_KEYS]
        assert percentiles == sorted(percentiles)
        assert 0 < percentiles[0] <= float(row["max_ms"])
        assert int(row["errors"]) == 0 and step["errors_total"] == 0
        for key in ("requests_per_s", "samples_per_s", *PERCENTILE_KEYS):
            assert float(row[key]) == pytest.approx(step[key], rel=1e-12)
        # Triton's statistics over the same window saw about the same requests.
        server = step["server"]
        assert server is not None and server["requests"] > 0
        assert server["requests"] == pytest.approx(int(row["requests"]), rel=0.25)
        assert server["queue_ms"] >= 0 and server["compute_infer_ms"] > 0

    summary = report["summary"]["throughput"]
    assert len(summary) == 1 and summary[0]["batch_size"] == BATCH
    # The best step no client limited (the best of all where every step was client-bound).
    server_bound = [r for r in rows if r["client_bound"] == "False"] or rows
    best = max(float(r["samples_per_s"]) for r in server_bound)
    for row, step in zip(rows, steps, strict=True):
        assert float(row["client_cpu_us"]) > 0 and step["client_cores"] > 0
        assert row["client_bound"] == str(step["client_bound"]) and row["engine"] == "locust"
    assert summary[0]["served_samples_per_s"] == pytest.approx(best)
    baseline = report["baselines"][MODEL][0]
    assert baseline["batch_size"] == BATCH and baseline["samples_per_s"] > 0
    assert summary[0]["ratio"] == pytest.approx(best / baseline["samples_per_s"])
    assert not math.isnan(report["summary"]["latency"][0]["ratio"])
    assert report["machine"]["cores"] >= 1 and report["command"].startswith("python -m loadtest sweep")


def test_compare_sweeps_triton_and_both_peers_on_the_same_file(
    exported_repository: Path, tmp_path: Path
) -> None:
    """``python -m loadtest compare``: the local Triton, PyTriton and FastAPI each serve the tiny
    DLRM file for one short step; every server answers without errors and the report compares
    Triton with each peer."""
    out = tmp_path / "peers"
    command = [
        sys.executable, "-m", "loadtest", "compare", "--repository", str(exported_repository),
        "--model", MODEL, "--protocol", "grpc", "--batch-size", str(BATCH), "--concurrency", "1",
        "--duration", "2", "--warmup", "1", "--baseline-seconds", "0.2", "--baseline-repeats", "1",
        "--out", str(out),
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=420, check=False)
    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    report = json.loads((out / "report.json").read_text())
    steps = {step["label"]: step for step in report["steps"]}
    assert sorted(steps) == ["fastapi", "pytriton", "triton"]
    for label, step in steps.items():
        assert step["requests"] > 0 and step["errors"] == 0, label
        assert step["samples_per_s"] == pytest.approx(step["requests_per_s"] * BATCH, rel=1e-9)
    peers = {entry["peer"]: entry for entry in report["summary"]["peers"]}
    assert sorted(peers) == ["fastapi", "pytriton"]
    for peer, entry in peers.items():
        assert entry["samples_per_s"] == pytest.approx(steps["triton"]["samples_per_s"])
        assert entry["peer_samples_per_s"] == pytest.approx(steps[peer]["samples_per_s"])
        assert entry["throughput_ratio"] == pytest.approx(
            entry["samples_per_s"] / entry["peer_samples_per_s"]
        )
    assert "against its peers" in (out / "report.md").read_text()
    assert (out / "latency_vs_throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_served_throughput_on_the_driver_counts_windows_of_answered_requests(
    exported_server: LocalServer,
) -> None:
    """The closed-loop driver against the real server: two requests in flight, two timed windows."""
    from loadtest.engine.payload import build_pool
    from loadtest.engine.served import served_throughput

    pool = build_pool(BATCH, batches=16)
    for protocol, url in (("grpc", exported_server.grpc_url), ("http", exported_server.http_url)):
        result = served_throughput(url, MODEL, pool, 2, protocol, seconds=0.5, repeats=2, warmup_s=0.2)
        assert result.errors == 0 and len(result.repeats) == 2 and all(r > 0 for r in result.repeats)
        assert result.samples_per_s == pytest.approx(sum(result.repeats) / 2)  # the median of two
        assert 0 < result.p50_ms <= result.p99_ms and result.batch_size == BATCH


def test_the_raw_http_client_checks_answers_and_fails_bad_ones_in_one_line(
    exported_server: LocalServer,
) -> None:
    """The load generators' HTTP client (a plain socket, the answer read by its length) against
    the real server: an answer of the wrong size, an error answer, a model the server does not
    have and a server that is not there each fail the request in one line; the connection
    then serves the next request."""
    from bundle.errors import ClientError, DataError
    from loadtest.engine.payload import build_pool
    from loadtest.engine.wire import RawHttpInfer, http_body, http_header_length

    pool = build_pool(BATCH, batches=4)
    body, length = http_body(pool.batch(0)), http_header_length(pool)
    raw = RawHttpInfer(exported_server.http_url, MODEL, length, timeout_s=10)
    try:
        assert raw(body, BATCH) == raw(http_body(pool.batch(1)), BATCH) > BATCH * 4
        with pytest.raises(DataError, match=f"expected {(BATCH + 1) * 4}"):
            raw(body, BATCH + 1)
        with pytest.raises(ClientError, match=r"HTTP 400 .*") as error:
            raw(body[: len(body) - 4], BATCH)  # one value short of its shape
        assert "\n" not in str(error.value)
        assert raw(body, BATCH) > 0  # the connection still serves
        raw.close()
        assert raw(body, BATCH) > 0  # and is opened again after a close
    finally:
        raw.close()
    unknown = RawHttpInfer(exported_server.http_url, "no_such_model", length, timeout_s=10)
    with pytest.raises(ClientError, match=r"HTTP 4\d\d .*no_such_model"):
        unknown(body, BATCH)
    unknown.close()
    with pytest.raises(ClientError, match=r"127\.0\.0\.1"):
        RawHttpInfer(f"127.0.0.1:{free_ports(1)[0]}", MODEL, length, timeout_s=5)(body, BATCH)


def test_grpc_on_a_socket_answers_as_grpcio_does_and_fails_bad_calls_in_one_line(
    exported_server: LocalServer,
) -> None:
    """The load engines' gRPC client (HTTP/2 frames on a plain socket) against the real server,
    beside grpcio: the same scores, a request larger than the server's first flow-control
    window and frame size sent whole, and the same one-line errors for an unknown model, bytes
    that are no request and a server that is not there; the connection then serves on."""
    from bundle.errors import ClientError, DataError
    from loadtest.engine.grpc_socket import SocketGrpcInfer
    from loadtest.engine.payload import build_pool
    from loadtest.engine.wire import serialised_request
    from tests.grpcio_reference import GrpcioInfer

    url = exported_server.grpc_url
    small = serialised_request(MODEL, build_pool(BATCH, batches=1).batch(0))
    large = serialised_request(MODEL, build_pool(1024, batches=1).batch(0))
    assert len(large) > 4 * 65_535  # several windows and frames of HTTP/2's defaults
    ours, theirs = SocketGrpcInfer(url, timeout_s=30), GrpcioInfer(url, timeout_s=30)
    try:
        for _ in range(3):
            for request, rows in ((small, BATCH), (large, 1024)):
                assert ours(request, rows) > rows * 4
                assert np.array_equal(ours.last_scores(), theirs.scores(request))
        with pytest.raises(DataError, match=f"expected {(BATCH + 1) * 4}"):
            ours(small, BATCH + 1)
        unknown = serialised_request("no_such_model", build_pool(BATCH, batches=1).batch(0))
        for bad in (unknown, b"\xff\xfe not a request"):
            with pytest.raises(ClientError) as expected:
                theirs.scores(bad)
            with pytest.raises(ClientError) as error:
                ours(bad, BATCH)
            assert str(error.value) == str(expected.value) and "\n" not in str(error.value)
        assert ours(small, BATCH) > 0  # the connection still serves
        ours.close()
        assert ours(small, BATCH) > 0  # and is opened again after a close
    finally:
        ours.close()
        theirs.close()
    with pytest.raises(ClientError, match=r"127\.0\.0\.1:\d+: .*refused"):
        SocketGrpcInfer(f"127.0.0.1:{free_ports(1)[0]}", timeout_s=5)(small, BATCH)


def test_grpc_senders_sharing_connections_each_get_their_answers(exported_server: LocalServer) -> None:
    """Six senders, three to a connection, each sending its own batch size at once: every answer
    holds its sender's rows, over two connections."""
    import threading

    from loadtest.engine.grpc_socket import GrpcSockets
    from loadtest.engine.payload import build_pool
    from loadtest.engine.wire import serialised_request

    sockets = GrpcSockets(exported_server.grpc_url, timeout_s=30, share=3)
    senders = [sockets.open() for _ in range(6)]
    answers: dict[int, list[int]] = {}
    failures: list[BaseException] = []

    def send(index: int) -> None:
        rows = index + 1
        request = serialised_request(MODEL, build_pool(rows, batches=1).batch(0))
        try:
            answers[index] = [senders[index](request, rows) for _ in range(20)]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not failures
    assert {i: set(a) for i, a in answers.items()} == {i: {answers[i][0]} for i in range(6)}
    assert sorted(a[0] for a in answers.values()) == [a[0] for _, a in sorted(answers.items())]
    connections = {id(sender._slot.connection) for sender in senders}
    assert len(connections) == 2
    for sender in senders:
        sender.close()
