"""A model whose python stub dies never looks healthy, against the real local tritonserver.

tritonserver 2.51 alone keeps answering READY for a model whose stub was killed, and
fails every request to it for good. The bundle's local server watches the stubs
(:mod:`server.dead_models`):

- explicit model control: the model is unloaded (readiness turns non-200) and loaded
  again; under gRPC load no answer is wrong, answers come back within 15 s, and a
  SIGTERM afterwards stops the server at once with exit code 0;
- the same for the hot/cold embedding stage (a python-backend model too) under its
  ensemble: the stage and the ensemble that calls it come back together;
- ``none`` model control with ``--no-restart``: ``python -m server serve`` stops the server
  and exits 1 with one line naming the model (by default it restarts the server instead:
  ``test_serve_restarts.py``).

The load is :func:`lab.faults.crashes.measure_stub_kill` (checked load, readiness
polled every 50 ms), the engine of the ``crashes`` fault runners.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from clients.reference import OnnxReference
from criteo.tsv import Batch, read_batch
from lab.faults.crashes import RECOVERY_BOUND_S, answered_cases, kill_stub, measure_stub_kill
from lab.soak import Case
from server import LocalServer, free_ports
from server.probes import ServerProbe
from server.processes import stub_processes
from tests.cli import run_module

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]

MODEL = "dlrm_onnx"
# The dense step of a DLRM exported hot/cold: a python stub locally (the onnxruntime backend). The
# ensemble's other step, the embedding stage, is compiled and runs inside tritonserver: its crash
# is a server crash, which `python -m server serve` restarts (test_serve_restarts.py).
DENSE_STEP = "dlrm_dense"
BATCH = 64
#: A SIGTERM after the crash: drain and unload, not tritonserver's whole exit timeout (10 s).
STOP_BOUND_S = 5.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, labeled_file: Path) -> Path:
    """A tiny DLRM, trained briefly."""
    out = tmp_path_factory.mktemp("dead_model") / "dlrm"
    run_module("models", "train", "dlrm", "--data", str(labeled_file), "--preset", "tiny",
               "--table-size", "500", "--out", str(out))  # fmt: skip
    return out


def _export(checkpoint: Path, labeled_file: Path, repository: Path, *options: str) -> Path:
    run_module("export", "dlrm", "--checkpoint", str(checkpoint), "--repository", str(repository),
               "--check-data", str(labeled_file), "--check-rows", "1024", "--no-fp16", "--no-int8",
               *options)  # fmt: skip
    return repository


@pytest.fixture(scope="module")
def repository(checkpoint: Path, labeled_file: Path) -> Path:
    """``dlrm_onnx`` alone (FP32, tables in the graph)."""
    return _export(checkpoint, labeled_file, checkpoint.parent / "repository")


@pytest.fixture(scope="module")
def hot_cold_repository(checkpoint: Path, labeled_file: Path) -> Path:
    """``dlrm_onnx`` as an ensemble of the hot/cold embedding stage and the dense model."""
    return _export(checkpoint, labeled_file, checkpoint.parent / "hot_cold", "--embeddings", "hot-cold",
                   "--hot-budget", "8K", "--profile-data", str(labeled_file))  # fmt: skip


@pytest.fixture(scope="module")
def rows(labeled_file: Path) -> Batch:
    return read_batch(labeled_file, 2 * BATCH)


def _cases(repository: Path, rows: Batch) -> list[Case]:
    reference = OnnxReference(repository / MODEL / "1" / "model.onnx")
    batches = [rows.slice(0, BATCH), rows.slice(BATCH, 2 * BATCH)]
    return [Case(MODEL, batch, {"onnx": reference.predict(batch)}) for batch in batches]


def test_stub_killed_under_load_model_is_reloaded_and_never_looks_ready_while_down(
    start_triton: StartTriton, repository: Path, rows: Batch
) -> None:
    server = start_triton(repository, model_control_mode="explicit", load_models=(MODEL,))
    regions = _regions(server, MODEL)
    measured = measure_stub_kill(server, _cases(repository, rows), MODEL, rate=100.0)
    stopped = time.monotonic()
    code = server.stop()
    stop_s = time.monotonic() - stopped
    # tritonserver never frees the killed stub's shared memory; the launcher removes it on exit.
    assert regions and not [name for name in regions if Path("/dev/shm", name).exists()]

    tally = measured.tally
    assert tally.wrong == 0 and tally.errors == 0, (
        tally.summary()
    )  # the clients' retries ride over the reload
    assert measured.failure is None
    assert measured.recovery_s is not None and measured.recovery_s < RECOVERY_BOUND_S, tally.summary()
    assert [r.model for r in measured.recoveries] == [MODEL]
    (recovery,) = measured.recoveries
    # From the unload on, neither the server nor the model says ready until the reload is done.
    assert not measured.ready_while_down(margin_s=0.1)
    down = [r for r in measured.readiness if recovery.seen_at + 0.1 <= r.t_s < recovery.ready_at - 0.1]
    assert down and not any(r.server or r.model for r in down)
    assert measured.readiness[-1].server and measured.readiness[-1].model
    # A SIGTERM after the crash: at once, and a clean exit (tritonserver alone: 10 s, exit 1).
    assert code == 0 and stop_s < STOP_BOUND_S, (code, stop_s)
    print(
        f"stub kill: {tally.requests} requests, {tally.errors} failed {dict(tally.error_kinds)}, "
        f"{tally.wrong} wrong; answered again after {measured.recovery_s:.2f} s (reload "
        f"{recovery.seconds:.2f} s); not ready {measured.not_ready_s():.2f} s; SIGTERM: exit {code} in "
        f"{stop_s:.1f} s"
    )


def test_hot_cold_dense_step_stub_killed_under_load_step_and_ensemble_come_back(
    start_triton: StartTriton, hot_cold_repository: Path, rows: Batch
) -> None:
    server = start_triton(hot_cold_repository, model_control_mode="explicit", load_models=(MODEL,))
    # The ensemble's answers before the fault (its stages against numpy: test_embedding_stage.py).
    cases = answered_cases(server, MODEL, [rows.slice(0, BATCH), rows.slice(BATCH, 2 * BATCH)])
    regions = _regions(server, DENSE_STEP)
    measured = measure_stub_kill(server, cases, DENSE_STEP, rate=100.0)
    stopped = time.monotonic()
    code = server.stop()
    stop_s = time.monotonic() - stopped
    assert regions and not [name for name in regions if Path("/dev/shm", name).exists()]

    tally = measured.tally
    assert tally.wrong == 0 and tally.errors == 0, (
        tally.summary()
    )  # the clients' retries ride over the reload
    assert [r.model for r in measured.recoveries] == [DENSE_STEP]
    assert measured.recovery_s is not None and measured.recovery_s < RECOVERY_BOUND_S, tally.summary()
    # Unloading the step unloads the ensemble that calls it: neither says ready until both are back.
    assert not measured.ready_while_down(margin_s=0.1)
    assert code == 0 and stop_s < STOP_BOUND_S, (code, stop_s)
    print(
        f"dense step stub kill: {tally.requests} requests, {tally.errors} failed {dict(tally.error_kinds)}, "
        f"{tally.wrong} wrong; answered again after {measured.recovery_s:.2f} s; not ready "
        f"{measured.not_ready_s():.2f} s; SIGTERM: exit {code} in {stop_s:.1f} s"
    )


def _regions(server: LocalServer, model: str) -> list[str]:
    """The shared-memory regions of ``model``'s python stubs now."""
    assert server.pid is not None
    running, _ = stub_processes(server.pid)
    return [stub.region for stub in running if stub.model == model]


def _tritonserver_pid(serve: subprocess.Popen[str]) -> int:
    children = [c for c in psutil.Process(serve.pid).children() if c.name() == "tritonserver"]
    if not children:
        raise AssertionError("python -m server serve runs no tritonserver")
    return children[0].pid


def test_serve_in_none_mode_without_restarts_exits_1_naming_the_model_when_its_stub_dies(
    repository: Path, tmp_path: Path
) -> None:
    http_port, grpc_port, metrics_port = free_ports(3)
    ports = [
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
    ]
    command = [sys.executable, "-m", "server", "serve", "--repository", str(repository), *ports,
               "--log-file", str(tmp_path / "tritonserver.log"), "--no-restart"]  # fmt: skip
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    probe = ServerProbe("127.0.0.1", http_port)
    try:
        # Its summary ends with this line once every model is ready and the stubs are watched.
        assert serve.stdout is not None
        for line in serve.stdout:
            if line.startswith("stop with Ctrl-C"):
                break
        assert serve.poll() is None and probe.is_ready(), "python -m server serve did not get ready"
        stub_pid = kill_stub(_tritonserver_pid(serve), MODEL)
        killed = time.monotonic()
        _, stderr = serve.communicate(timeout=RECOVERY_BOUND_S)
        exit_s = time.monotonic() - killed
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert serve.returncode == 1, stderr
    assert f"model '{MODEL}' version 1 lost its backend process" in lines[-1], stderr
    assert f"pid {stub_pid}" in lines[-1]
    assert not probe.is_ready() and not probe.is_live()
    print(f"none mode: serve exited 1 {exit_s:.1f} s after the stub kill: {lines[-1]}")
