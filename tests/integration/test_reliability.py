"""Faults under load, against the real local tritonserver.

- tritonserver (and its python stubs) killed with SIGKILL during a load run,
  then restarted on the same ports: the clients retry UNAVAILABLE with backoff
  and recover; the errors are counted and bounded by the requests that were in
  flight at the kill; every answer before and after is exact.
- A model reloaded to a new version under load (explicit model control, an
  authenticated load call): no request fails, and the new version serves.
- The 10-minute soak (``python -m lab soak``), a ``slow`` test at the end; the
  command itself runs briefly in ``tests/lab/test_lab_commands.py``.

The load is :func:`lab.soak.checked_load`: the closed-loop driver's
client threads of :class:`clients.triton.TritonClient` over gRPC and HTTP,
paced to a steady rate, every answer compared with ONNX Runtime in this process.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from clients.reference import OnnxReference
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from criteo.tsv import Batch, read_batch
from lab.soak import (
    Case,
    Endpoint,
    SoakConfig,
    checked_load,
    markdown,
    run_soak,
    write_result,
)
from loadtest.engine.latency import Tally
from server import LocalServer
from server.probes import ServerProbe
from server.processes import SHM_DIR, stub_regions
from server.security import generate_admin_key

StartTriton = Callable[..., LocalServer]

MODEL = "dlrm_onnx"
OTHER = "wide_deep_onnx"  # its graph becomes version 2 of MODEL in the reload test
SIZES = (1, 8, 32)
RATE = 150.0  # requests per second over all workers: steady, and light on 2 shared cores
WARM_REQUESTS = 40
# Rides over a restart of several seconds: about 25 s of backoff in all.
RESTART_RETRY = RetryPolicy(max_tries=60, initial_backoff_s=0.05, max_backoff_s=0.5, jitter=0.2)


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, sum(SIZES))


def _onnx(repository: Path, model: str) -> Path:
    return repository / model / "1" / "model.onnx"


def _cases(rows: Batch, answers: dict[str, OnnxReference]) -> list[Case]:
    cases, start = [], 0
    for size in SIZES:
        batch = rows.slice(start, start + size)
        start += size
        cases.append(Case(MODEL, batch, {label: ref.predict(batch) for label, ref in answers.items()}))
    return cases


def _workers(server: LocalServer) -> list[Endpoint]:
    return [
        Endpoint(server.grpc_url, "grpc"),
        Endpoint(server.http_url, "http"),
        Endpoint(server.grpc_url, "grpc"),
    ]


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _exact(server: LocalServer, rows: Batch, reference: OnnxReference) -> None:
    for protocol, url in (("grpc", server.grpc_url), ("http", server.http_url)):
        with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
            served = client.infer(MODEL, rows.inputs())
        np.testing.assert_allclose(served, reference.predict(rows), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- kill and restart
@pytest.mark.integration
def test_server_killed_and_restarted_under_load_clients_retry_and_recover(
    start_triton: StartTriton, exported_repository: Path, rows: Batch, tmp_path: Path
) -> None:
    server = start_triton(exported_repository, model_control_mode="explicit", load_models=(MODEL,))
    reference = OnnxReference(_onnx(exported_repository, MODEL))
    workers = _workers(server)
    loop = checked_load(
        workers, _cases(rows, {"v1": reference}), rate=RATE, retry=RESTART_RETRY, timeout_s=10
    )
    restarted = LocalServer(server.config.replace(log_file=tmp_path / "restarted.log"))
    try:
        with loop:
            _wait_for(lambda: loop.total.ok >= WARM_REQUESTS, "load before the kill")
            killed_pid = server.pid
            assert killed_pid is not None
            regions = stub_regions(killed_pid)
            killed_at = loop.elapsed_s()
            server.kill()  # SIGKILL to tritonserver's process group: the server and its stubs
            server.stop()  # reaps it; removes the stubs' shared-memory regions it left behind
            restarted.start()  # same ports, same repository; returns once the model is ready
            ready_at = loop.elapsed_s()
            answered = loop.total.ok
            _wait_for(lambda: loop.total.ok >= answered + WARM_REQUESTS, "load after the restart")
        stats = loop.total
        _exact(restarted, rows.slice(0, 16), reference)
        assert restarted.pid != killed_pid
    finally:
        restarted.stop()

    assert stats.wrong == 0
    # Every request waits out the restart in the clients' retries, the ones in flight at the
    # kill included: their connection drops (gRPC UNAVAILABLE, HTTP connection reset or
    # closed), and inference, free of side effects, is sent again.
    assert stats.errors == 0, stats.summary()
    for index, timeline in loop.timelines.items():
        assert any(t > ready_at for t, _ in timeline), f"worker {index} got no answer after the restart"
    assert regions and not [name for name in regions if (SHM_DIR / name).exists()]
    print(
        f"kill/restart: down {ready_at - killed_at:.2f} s; {stats.requests} requests, "
        f"{stats.errors} errors {dict(stats.error_kinds)}, latency {stats.summary()['latency_ms']}"
    )


# ---------------------------------------------------------------- reload under load
def _watch_readiness(probe: ServerProbe, stop: threading.Event, not_ready: list[float]) -> None:
    started = time.monotonic()
    while not stop.wait(0.05):
        if not probe.is_ready():
            not_ready.append(time.monotonic() - started)


def _monotonic(timeline: list[tuple[float, str]]) -> bool:
    """v1 answers, then v2 answers, never v1 after v2."""
    labels = [label for _, label in timeline]
    return labels == sorted(labels)


@pytest.mark.integration
def test_model_reloaded_to_a_new_version_under_load_without_a_failed_request(
    start_triton: StartTriton, exported_repository: Path, rows: Batch, tmp_path: Path
) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(exported_repository / MODEL, repository / MODEL)
    server = start_triton(
        repository, model_control_mode="explicit", load_models=(MODEL,), admin_key=generate_admin_key()
    )
    v1 = OnnxReference(_onnx(exported_repository, MODEL))
    v2 = OnnxReference(_onnx(exported_repository, OTHER))
    cases = _cases(rows, {"v1": v1, "v2": v2})
    for case in cases:  # the versions are told apart by their answers
        assert np.abs(case.answers["v1"] - case.answers["v2"]).max() > 1e-4
    loop = checked_load(_workers(server), cases, rate=RATE, retry=RetryPolicy(max_tries=1), timeout_s=10)
    not_ready: list[float] = []
    stop_watch = threading.Event()
    watcher = threading.Thread(
        target=_watch_readiness,
        args=(ServerProbe("127.0.0.1", server.config.http_port), stop_watch, not_ready),
    )
    with loop:
        _wait_for(lambda: loop.total.labels["v1"] >= WARM_REQUESTS, "load on version 1")
        # Version 2 appears at once, complete: staged beside the repository, then renamed in.
        stage = tmp_path / "stage" / "2"
        stage.mkdir(parents=True)
        shutil.copy2(_onnx(exported_repository, OTHER), stage / "model.onnx")
        os.rename(stage, repository / MODEL / "2")
        watcher.start()
        load_called_at = loop.elapsed_s()
        server.load_model(MODEL)  # authenticated (the server's key); returns once version 2 serves
        loaded_at = loop.elapsed_s()
        _wait_for(lambda: loop.total.labels["v2"] >= WARM_REQUESTS, "load on version 2")
    stop_watch.set()
    watcher.join()
    stats: Tally = loop.total

    # Retries were off: every request was answered first time, by one version or the other.
    assert stats.errors == 0 and stats.wrong == 0, stats.summary()
    assert stats.labels["v1"] >= WARM_REQUESTS and stats.labels["v2"] >= WARM_REQUESTS
    for index, timeline in loop.timelines.items():
        assert _monotonic(timeline), f"worker {index} got version 1 after version 2"
        assert all(label == "v2" for t, label in timeline if t > loaded_at + 0.5), index
    states = {(m.name, m.version): m.state for m in server.models()}
    assert states[(MODEL, "2")] == "READY" and states.get((MODEL, "1")) != "READY"
    with TritonClient(server.grpc_url, "grpc") as client:
        assert client.model_spec(MODEL).version == "2"
    _exact_v2 = rows.slice(0, 16)
    with TritonClient(server.http_url, "http") as client:
        np.testing.assert_allclose(client.infer(MODEL, _exact_v2.inputs()), v2.predict(_exact_v2), atol=1e-6)
    # For the record (docs/reliability.md): strict readiness may report not ready while version 1
    # unloads; the requests above were all answered regardless.
    print(
        f"reload: load call {loaded_at - load_called_at:.2f} s; /v2/health/ready false in "
        f"{len(not_ready)} of the 50 ms polls"
    )


def test_unload_returns_once_the_model_is_released_and_load_once_it_serves(
    start_triton: StartTriton, exported_repository: Path, tmp_path: Path
) -> None:
    """tritonserver's unload API answers before the model's instances (its python stubs) are
    released; the launcher's unload waits for that, so a load that follows never runs beside
    them, and its load returns once the model answers."""
    repository = tmp_path / "repository"
    for name in (MODEL, OTHER):
        shutil.copytree(exported_repository / name, repository / name)
    server = start_triton(repository, model_control_mode="explicit", load_models=(MODEL,))
    probe = ServerProbe("127.0.0.1", server.config.http_port)
    assert len(server.memory()) > 1  # tritonserver and the model's stub
    for _ in range(3):
        server.unload_model(MODEL)
        states = [m.state for m in server.models() if m.name == MODEL]
        assert states and all(state == "UNAVAILABLE" for state in states), states
        assert list(server.memory()) == [server.pid]  # its stub is gone: nothing else is loaded
        server.load_model(OTHER)
        assert probe.is_model_ready(OTHER)
        server.unload_model(OTHER)
        assert list(server.memory()) == [server.pid]
        server.load_model(MODEL)
        assert probe.is_model_ready(MODEL)


# ------------------------------------------------------------------------------ soak
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_soak_ten_minutes_meets_its_targets(exported_repository: Path, tmp_path: Path) -> None:
    """The issue's soak: 10 minutes (``SOAK_SECONDS`` to change), 0 errors, RSS growth < 5 %."""
    seconds = float(os.environ.get("SOAK_SECONDS", "600"))
    config = SoakConfig(
        exported_repository,
        duration_s=seconds,
        warmup_s=min(60.0, seconds / 5),
        log_file=tmp_path / "soak-tritonserver.log",
    )
    result = run_soak(config, command=f"SOAK_SECONDS={seconds:.0f} pytest -m slow {__file__}")
    write_result(result, tmp_path)
    assert result.passed, "\n".join(markdown(result))
