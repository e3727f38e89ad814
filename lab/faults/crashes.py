"""Crashes under checked load: a python-backend stub, or tritonserver itself, killed with SIGKILL.

Each runner starts the bundle's local tritonserver (:class:`server.LocalServer`) on a
repository, puts it under checked load (:func:`lab.soak.checked_load`: gRPC
clients of :class:`clients.triton.TritonClient` with their retry policy, one batch size,
every answer compared with the answer the healthy server gave for the same rows before
the fault), waits for a steady stream of answers, kills something with SIGKILL, and
measures what the users saw:

- :func:`stub_killed`: the stub of a plain model (e.g. ``dlrm_onnx``); the server,
  in explicit model control, reloads the model (:mod:`server.dead_models`);
- :func:`step_stub_killed`: the stub of a hot/cold ensemble's dense step (the embedding stage is
  compiled and has no stub: its crash is a server crash, :mod:`lab.faults.server_crashes`)
  (``<family>_embedding``) that the ensemble (``<family>_onnx``) calls; the stage is
  reloaded, and the load goes to the ensemble;
- :func:`server_killed`: tritonserver and its stubs, then a new tritonserver started
  on the same ports, as an orchestrator would.

While the load runs, a thread polls ``/v2/health/ready`` and the model's ready endpoint
every 50 ms, so :class:`CrashMeasurement` says how long readiness turned non-200 and
whether it said 200 while the model could not answer. Recovery is the time from the
kill to the first correct answer after the outage (after the last failed request, and
after the server saw the dead stub).
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bundle.errors import BundleError, ServerError
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from lab.faults import FaultResult
from lab.soak import Case, Endpoint, checked_load
from loadtest.engine.driver import Driver
from loadtest.engine.latency import Tally
from server import LocalServer, ServerConfig
from server.dead_models import Recovery
from server.probes import ServerProbe
from server.processes import stub_processes

logger = logging.getLogger(__name__)

#: The bound on recovery: seconds from the kill to the first correct answer after it.
RECOVERY_BOUND_S = 15.0
#: Retries that ride over a reload or a restart of several seconds (about 25 s of backoff in all).
RIDE_OVER = RetryPolicy(max_tries=60, initial_backoff_s=0.05, max_backoff_s=0.5, jitter=0.2)
_READINESS_POLL_S = 0.05


@dataclass(frozen=True)
class Readiness:
    """One poll of the readiness endpoints, in the load's clock (seconds since it started)."""

    t_s: float
    server: bool
    model: bool


@dataclass
class CrashMeasurement:
    """What one kill under load did.

    Attributes:
        tally: every request of the load (answers, wrong answers, errors by kind).
        killed_at: when the kill was sent (load clock, seconds).
        answered_again_at: the first correct answer after the outage the kill caused (load
            clock), or None: after the last failed request and after the dead stub was seen.
        readiness: every poll of the server's and the model's ready endpoints.
        recoveries: the reloads the server did (:attr:`server.LocalServer.recoveries`),
            with ``seen_at``/``ready_at`` in the load clock.
        failure: the line of a server that took itself out of service, else None.
    """

    tally: Tally
    killed_at: float
    answered_again_at: float | None
    readiness: list[Readiness] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    failure: str | None = None

    @property
    def recovery_s(self) -> float | None:
        """Seconds from the kill to the first correct answer after it; None: never answered again."""
        return None if self.answered_again_at is None else self.answered_again_at - self.killed_at

    def not_ready_s(self) -> float:
        """Seconds after the kill during which a poll saw the server or the model not ready."""
        polls = [r for r in self.readiness if r.t_s >= self.killed_at]
        return sum(
            later.t_s - poll.t_s
            for poll, later in itertools.pairwise(polls)
            if not (poll.server and poll.model)
        )

    def ready_while_down(self, margin_s: float = 0.0) -> list[Readiness]:
        """Polls that said ready (both endpoints 200) while a dead model was being brought
        back (from ``margin_s`` after it was seen dead to ``margin_s`` before the reload
        returned): the lies a client could have believed."""
        spans = [(r.seen_at + margin_s, r.ready_at - margin_s) for r in self.recoveries]
        return [r for r in self.readiness if r.server and r.model and any(a <= r.t_s < b for a, b in spans)]


# ------------------------------------------------------------------ building blocks
def synthetic_rows(count: int, seed: int = 0) -> Batch:
    """``count`` rows of the skewed synthetic Criteo generator."""
    with tempfile.TemporaryDirectory(prefix="fault-rows-") as folder:
        path = Path(folder) / "rows.tsv"
        write_tsv(SynthConfig(rows=count, seed=seed), path)
        return read_batch(path)


def answered_cases(server: LocalServer, model: str, batches: list[Batch]) -> list[Case]:
    """One case per batch, accepting the answer the healthy server gives for it now."""
    with TritonClient(server.grpc_url, "grpc") as client:
        return [Case(model, batch, {"healthy": client.infer(model, batch.inputs())}) for batch in batches]


def _watch_readiness(probe: ServerProbe, model: str, clock: Callable[[], float], stop: threading.Event,
                     polls: list[Readiness]) -> None:  # fmt: skip
    while not stop.wait(_READINESS_POLL_S):
        polls.append(Readiness(clock(), probe.is_ready(), probe.is_model_ready(model)))


@contextmanager
def readiness_polls(server: LocalServer, model: str, clock: Callable[[], float]) -> Iterator[list[Readiness]]:
    """Poll the server's and ``model``'s ready endpoints every 50 ms while the block runs."""
    polls: list[Readiness] = []
    stop = threading.Event()
    probe = ServerProbe("127.0.0.1", server.config.http_port, timeout_s=1.0)
    thread = threading.Thread(target=_watch_readiness, args=(probe, model, clock, stop, polls), daemon=True)
    thread.start()
    try:
        yield polls
    finally:
        stop.set()
        thread.join()


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            logger.warning("timed out after %.0f s waiting for %s", timeout_s, what)
            return False
        time.sleep(0.05)
    return True


def _first_answer_after(loop: Driver, t_s: float) -> float | None:
    return min((t for timeline in loop.timelines.values() for t, _ in timeline if t > t_s), default=None)


def kill_stub(tritonserver_pid: int, model: str) -> int:
    """SIGKILL the python stub of ``model``'s first instance; its pid.

    Args:
        tritonserver_pid: the process id of the tritonserver that runs the stub.
        model: the model whose stub to kill.

    Raises:
        ServerError: that tritonserver runs no stub for ``model``.
    """
    running, _ = stub_processes(tritonserver_pid)
    stubs = sorted(
        (stub for stub in running if stub.model == model and not stub.completes_config),
        key=lambda stub: stub.instance,
    )
    if not stubs:
        raise ServerError(f"tritonserver pid {tritonserver_pid} runs no python stub of model '{model}'")
    os.kill(stubs[0].pid, signal.SIGKILL)
    logger.info("killed the stub %s (pid %d) of model '%s'", stubs[0].instance, stubs[0].pid, model)
    return stubs[0].pid


def measure_stub_kill(
    server: LocalServer,
    cases: list[Case],
    stub_model: str,
    rate: float = 100.0,
    workers: int = 2,
    retry: RetryPolicy = RIDE_OVER,
    warm_requests: int = 40,
    recovery_timeout_s: float = RECOVERY_BOUND_S,
) -> CrashMeasurement:
    """Kill ``stub_model``'s stub while ``cases`` load ``server``; measure until answers come back.

    Args:
        server: a ready local server.
        cases: the checked requests (all to one model: the one whose readiness is polled).
        stub_model: whose stub to kill (the model itself, or a stage it calls).
        rate: requests per second over all workers.
        workers: gRPC client threads.
        retry: the clients' retry policy.
        warm_requests: correct answers to see before the kill, and after the recovery.
        recovery_timeout_s: how long to wait for answers after the kill.
    """
    model = cases[0].model
    endpoints = [Endpoint(server.grpc_url, "grpc") for _ in range(workers)]
    loop = checked_load(endpoints, cases, rate=rate, retry=retry, timeout_s=10)
    with loop, readiness_polls(server, model, loop.elapsed_s) as polls:
        _wait_for(lambda: loop.total.ok >= warm_requests, "answers before the kill", 60)
        offset = time.monotonic() - loop.elapsed_s()
        killed_at = loop.elapsed_s()
        if server.pid is None:
            raise ServerError("tritonserver is not running")
        kill_stub(server.pid, stub_model)
        _wait_for(
            lambda: _first_answer_after(loop, killed_at) is not None or server.failure is not None,
            "answers after the kill",
            recovery_timeout_s,
        )
        if server.failure is None:
            _wait_for(lambda: bool(server.recoveries), "the reload", recovery_timeout_s)
            answered = loop.total.ok
            _wait_for(lambda: loop.total.ok >= answered + warm_requests, "answers after the recovery", 30)
    recoveries = [
        Recovery(r.model, r.version, r.seen_at - offset, r.ready_at - offset) for r in server.recoveries
    ]
    # Answers that came just after the kill were computed before it; the outage ends with the
    # last failed request, and no answer comes from the dead stub once the watch has seen it.
    outage = max([killed_at, loop.total.last_error_s or killed_at, *(r.seen_at for r in recoveries)])
    return CrashMeasurement(
        loop.total, killed_at, _first_answer_after(loop, outage), polls, recoveries, server.failure
    )


# ------------------------------------------------------------------ the runners
def _stub_fault(
    fault: str,
    repository: Path,
    model: str,
    stub_model: str,
    batch_size: int,
    rate: float,
    log_dir: Path | None,
) -> FaultResult:
    config = ServerConfig.with_free_ports(
        repository,
        model_control_mode="explicit",
        load_models=(model,),
        log_file=(log_dir or Path(tempfile.mkdtemp(prefix="fault-logs-"))) / f"{stub_model}-stub-kill.log",
    )
    rows = synthetic_rows(2 * batch_size)
    with LocalServer(config) as server:
        cases = answered_cases(
            server, model, [rows.slice(0, batch_size), rows.slice(batch_size, 2 * batch_size)]
        )
        measured = measure_stub_kill(server, cases, stub_model, rate=rate)
        stopped = time.monotonic()
        code = server.stop()
        stop_s = time.monotonic() - stopped
    tally, recovery = measured.tally, measured.recovery_s
    kinds = ", ".join(f"{count} x {kind}" for kind, count in tally.error_kinds.most_common(3)) or "none"
    seen = (
        measured.failure
        if measured.failure
        else f"failed: {kinds}; readiness non-200 for {measured.not_ready_s():.1f} s; "
        f"SIGTERM afterwards: exit {code} in {stop_s:.1f} s"
    )
    return FaultResult(
        fault=fault,
        seen=seen,
        requests=tally.requests,
        failed=tally.errors,
        wrong=tally.wrong,
        recovery_s=None if recovery is None else round(recovery, 2),
        ok=tally.wrong == 0 and recovery is not None and recovery <= RECOVERY_BOUND_S and code == 0,
    )


def stub_killed(
    repository: Path,
    model: str = "dlrm_onnx",
    batch_size: int = 64,
    rate: float = 100.0,
    log_dir: Path | None = None,
) -> FaultResult:
    """Stub SIGKILL under load (plain model): ``model``'s python stub killed while it serves.

    Args:
        repository: a model repository holding ``model``.
        model: a plain (non-ensemble) model, served in explicit model control.
        batch_size: rows per request.
        rate: requests per second over the two gRPC clients.
        log_dir: where tritonserver's log goes (a temporary folder when None).
    """
    fault = f"stub SIGKILL under load ({model})"
    return _stub_fault(fault, repository, model, model, batch_size, rate, log_dir)


def step_stub_killed(
    repository: Path,
    model: str = "dlrm_onnx",
    step: str = "dlrm_dense",
    batch_size: int = 64,
    rate: float = 100.0,
    log_dir: Path | None = None,
) -> FaultResult:
    """Stub SIGKILL under load (hot/cold dense step): the stub of the ensemble's dense step (the
    onnxruntime backend, a python stub locally) killed while the ensemble ``model`` serves.

    Args:
        repository: a repository with ``model`` exported hot/cold (ensemble of the embedding
            stage and ``step``).
        model: the ensemble the load goes to.
        step: the dense step (``<family>_dense``) whose stub is killed.
        batch_size: rows per request.
        rate: requests per second over the two gRPC clients.
        log_dir: where tritonserver's log goes (a temporary folder when None).
    """
    fault = f"stub SIGKILL under load (hot/cold dense step {step} of {model})"
    return _stub_fault(fault, repository, model, step, batch_size, rate, log_dir)


def server_killed(
    repository: Path,
    model: str = "dlrm_onnx",
    batch_size: int = 64,
    rate: float = 100.0,
    log_dir: Path | None = None,
    warm_requests: int = 40,
) -> FaultResult:
    """tritonserver SIGKILL under load (then restarted): the server and its stubs killed, and a
    new one started on the same ports and repository, as an orchestrator restarts a container.

    Args:
        repository: a model repository holding ``model``.
        model: the model the load goes to.
        batch_size: rows per request.
        rate: requests per second over the two gRPC clients.
        log_dir: where the two servers' logs go (a temporary folder when None).
        warm_requests: correct answers to see before the kill and after the restart.
    """
    logs = log_dir or Path(tempfile.mkdtemp(prefix="fault-logs-"))
    config = ServerConfig.with_free_ports(
        repository, model_control_mode="explicit", load_models=(model,), log_file=logs / "server-kill.log"
    )
    rows = synthetic_rows(2 * batch_size)
    restarted = LocalServer(config.replace(log_file=logs / "server-kill-restarted.log"))
    seen_error = ""
    try:
        with LocalServer(config) as server:
            cases = answered_cases(
                server, model, [rows.slice(0, batch_size), rows.slice(batch_size, 2 * batch_size)]
            )
            endpoints = [Endpoint(server.grpc_url, "grpc") for _ in range(2)]
            loop = checked_load(endpoints, cases, rate=rate, retry=RIDE_OVER, timeout_s=10)
            with loop:
                _wait_for(lambda: loop.total.ok >= warm_requests, "answers before the kill", 60)
                killed_at = loop.elapsed_s()
                server.kill()  # SIGKILL to tritonserver's process group: the server and its stubs
                server.stop()  # reaps it; removes the stubs' shared-memory regions it left behind
                # No answer can come from here until the new server serves.
                restarting_at = loop.elapsed_s()
                try:
                    restarted.start()
                except BundleError as exc:
                    seen_error = str(exc)
                else:
                    answered = loop.total.ok
                    _wait_for(
                        lambda: loop.total.ok >= answered + warm_requests, "answers after the restart", 60
                    )
    finally:
        restarted.stop()
    tally = loop.total
    answered_at = _first_answer_after(loop, restarting_at)
    recovery = None if answered_at is None else answered_at - killed_at
    kinds = ", ".join(f"{count} x {kind}" for kind, count in tally.error_kinds.most_common(3))
    seen = seen_error or (
        f"requests waited out the restart in the clients' retries; failed: {kinds or 'none'}"
    )
    return FaultResult(
        fault="tritonserver SIGKILL under load (then restarted)",
        seen=seen,
        requests=tally.requests,
        failed=tally.errors,
        wrong=tally.wrong,
        recovery_s=None if recovery is None else round(recovery, 2),
        ok=tally.wrong == 0 and tally.errors == 0 and recovery is not None and recovery <= RECOVERY_BOUND_S,
    )


def exact(server: LocalServer, cases: list[Case]) -> bool:
    """Whether ``server`` now gives every case its accepted answer (one request each, no retry)."""
    with TritonClient(server.grpc_url, "grpc") as client:
        return all(case.label(np.asarray(client.infer(case.model, case.batch.inputs()))) for case in cases)
