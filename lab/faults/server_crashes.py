"""tritonserver itself crashing under ``python -m server serve``, which starts it again.

Each runner runs ``python -m server serve`` with its defaults (``none`` model control; it
restarts a tritonserver that dies, :mod:`server.supervisor`) in a process of its own, as a
user runs it, on a repository made for the fault; puts it under checked load
(:func:`lab.soak.checked_load`: two gRPC clients of :class:`clients.triton.TritonClient`
with the retry policy that rides over a restart, every answer compared with the answer the
healthy server gave for the same rows); sends tritonserver a signal; and measures:

- recovery: seconds from the signal to the first correct answer to a request sent after
  tritonserver was dead;
- the requests that failed after the clients' retries, and the wrong answers;
- the command's restart line, and that a SIGTERM afterwards stops it with exit code 0,
  leaving no tritonserver behind.

The faults:

- :func:`server_crash`: tritonserver SIGKILLed (the out-of-memory killer, a stray kill)
  while ``dlrm_onnx`` serves;
- :func:`stage_crash`: a compiled stage crashing the server process. The compiled raw-row
  stage (the Triton C++ backend ``raw_rows``) runs inside tritonserver, so a crash in it is
  a SIGSEGV of tritonserver itself. It is simulated by sending tritonserver SIGSEGV while
  ``dlrm_onnx_raw`` (the compiled stage, then ``dlrm_onnx``) serves: the same signal reaches
  the same handler (Triton prints its stack trace and dies by the signal). What this cannot
  show is what a real fault may do first: corrupt memory, answer wrongly, or hang in the
  handler.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from bundle.errors import ConfigError, ServerError
from bundle.repository import version_dir, write_config
from bundle.schema import raw_model_name
from clients.triton import TritonClient
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, RowText, iter_row_text
from export.raw_rows import STAGE_MODEL, build_stage_config
from lab.faults import FaultResult
from lab.faults.crashes import RECOVERY_BOUND_S, RIDE_OVER, synthetic_rows
from lab.soak import Case, Endpoint, checked_load
from loadtest.engine.driver import Driver
from server.installation import COMPILED_STAGES
from server.ports import free_ports

logger = logging.getLogger(__name__)

#: The compiled raw-row stage's backend name, and the library ``make stages`` builds for it.
STAGE_BACKEND = "raw_rows"
STAGE_LIBRARY = COMPILED_STAGES / STAGE_BACKEND / f"libtriton_{STAGE_BACKEND}.so"
#: How long the command may take to print its summary (every model loaded).
START_TIMEOUT_S = 120.0
_RESTARTED = re.compile(
    r"was killed by (?P<signal>\S+): restart (?P<number>\d+) .*ready again as pid (?P<pid>\d+) "
    r"in (?P<seconds>[\d.]+) s"
)


# ------------------------------------------------------------------ the command, in a process
@dataclass
class ServeProcess:
    """``python -m server serve`` in a process of its own, its output read by two threads."""

    process: subprocess.Popen[str]
    grpc_url: str
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    tritonservers: list[int] = field(default_factory=list)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait for the command's summary; tritonserver's pid, as it prints it."""
        deadline = time.monotonic() + timeout_s
        while not any(line.startswith("stop with Ctrl-C") for line in self.stdout):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "".join(self.stderr[-5:]).strip()
                raise ServerError(f"python -m server serve did not get ready: {tail}")
            time.sleep(0.1)
        found = re.search(r"tritonserver \S+ ready \(pid (\d+)\)", "".join(self.stdout))
        if found is None:
            raise ServerError(f"python -m server serve printed no pid: {''.join(self.stdout)}")
        self.tritonservers.append(int(found.group(1)))
        return self.tritonservers[-1]

    def restart_line(self) -> re.Match[str] | None:
        """The command's first restart line, parsed; None before it logged one."""
        for line in list(self.stderr):
            if found := _RESTARTED.search(line):
                if int(found["pid"]) not in self.tritonservers:
                    self.tritonservers.append(int(found["pid"]))
                return found
        return None


def _pump(stream: IO[str], kept: list[str]) -> None:
    for line in stream:
        kept.append(line)


@contextlib.contextmanager
def serving(repository: Path, log_file: Path) -> Iterator[ServeProcess]:
    """``python -m server serve`` with its defaults on ``repository`` and three free ports; at the
    end, whatever of it still runs is killed by its id."""
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [sys.executable, "-m", "server", "serve", "--repository", str(repository),
               "--http-port", str(http_port), "--grpc-port", str(grpc_port),
               "--metrics-port", str(metrics_port), "--log-file", str(log_file)]  # fmt: skip
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    running = ServeProcess(process, f"127.0.0.1:{grpc_port}")
    readers = [
        threading.Thread(target=_pump, args=(stream, kept), daemon=True)
        for stream, kept in ((process.stdout, running.stdout), (process.stderr, running.stderr))
        if stream is not None
    ]
    for reader in readers:
        reader.start()
    try:
        yield running
    finally:
        if process.poll() is None:
            for pid in running.tritonservers:
                # The command still runs, so it has not reaped them: each pid is its tritonserver's.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            process.kill()
        process.wait()
        for reader in readers:
            reader.join(timeout=5)


def _dead(pid: int) -> bool:
    """Whether process ``pid`` is dead (exited, possibly not yet reaped)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            logger.warning("timed out after %.0f s waiting for %s", timeout_s, what)
            return False
        time.sleep(0.02)
    return True


def _first_answer_after(loop: Driver, t_s: float) -> float | None:
    """When the first correct answer after ``t_s`` came (the load's clock): once tritonserver is
    dead, it comes from the one started after it."""
    return min((t for timeline in loop.timelines.values() for t, _ in timeline if t > t_s), default=None)


# ------------------------------------------------------------------ the measurement
def crash_under_serve(
    fault: str,
    repository: Path,
    model: str,
    batches: Sequence[Batch | RowText],
    sig: signal.Signals,
    log_dir: Path,
    rate: float = 100.0,
    warm_requests: int = 40,
) -> FaultResult:
    """Send tritonserver ``sig`` while ``model`` serves checked load under ``python -m server serve``.

    Args:
        fault: the row's name.
        repository: what the command serves (every model of it: ``none`` model control).
        model: the model the load goes to.
        batches: the requests' rows; each accepts the answer the healthy server gives it.
        sig: the signal (SIGKILL: a kill; SIGSEGV: a crash).
        log_dir: where tritonserver's logs go (the dead server's is kept beside as ``.1``).
        rate: requests per second over the two gRPC clients.
        warm_requests: correct answers to see before the signal and after the recovery.
    """
    restarted: re.Match[str] | None = None
    with serving(repository, log_dir / f"{model}-{sig.name}.log") as served:
        pid = served.wait_ready()
        with TritonClient(served.grpc_url, "grpc") as client:
            cases = [
                Case(model, batch, {"healthy": client.infer(model, batch.inputs())}) for batch in batches
            ]
        endpoints = [Endpoint(served.grpc_url, "grpc") for _ in range(2)]
        loop = checked_load(endpoints, cases, rate=rate, retry=RIDE_OVER, timeout_s=10)
        with loop:
            _wait_for(lambda: loop.total.ok >= warm_requests, "answers before the signal", 60)
            sent_at = loop.elapsed_s()
            os.kill(pid, sig)
            logger.info("sent %s to tritonserver pid %d", sig.name, pid)
            _wait_for(lambda: _dead(pid), "tritonserver to die", 30)
            dead_at = loop.elapsed_s()
            _wait_for(
                lambda: _first_answer_after(loop, dead_at) is not None, "answers again", 2 * RECOVERY_BOUND_S
            )
            answered = loop.total.ok
            _wait_for(lambda: loop.total.ok >= answered + warm_requests, "answers after the recovery", 30)
        _wait_for(lambda: served.restart_line() is not None, "the restart line", 5)
        restarted = served.restart_line()
        alive = served.process.poll() is None
        stopped = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        try:
            code: int | None = served.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        stop_s = time.monotonic() - stopped
        left = [p for p in served.tritonservers if not _dead(p)]
    tally = loop.total
    answered_at = _first_answer_after(loop, dead_at)
    recovery = None if answered_at is None else answered_at - sent_at
    kinds = ", ".join(f"{count} x {kind}" for kind, count in tally.error_kinds.most_common(3)) or "none"
    if restarted is None:
        seen = f"no restart line from serve (alive: {alive}); {''.join(served.stderr[-3:]).strip()}"
    else:
        seen = (
            f"serve: tritonserver was killed by {restarted['signal']}, restart {restarted['number']}, "
            f"ready again in {restarted['seconds']} s; failed: {kinds}; "
            f"SIGTERM afterwards: exit {code} in {stop_s:.1f} s"
            + (f"; tritonserver left running: {left}" if left else "")
        )
    return FaultResult(
        fault=fault,
        seen=seen,
        requests=tally.requests,
        failed=tally.errors,
        wrong=tally.wrong,
        recovery_s=None if recovery is None else round(recovery, 2),
        ok=tally.wrong == 0
        and restarted is not None
        and alive
        and recovery is not None
        and recovery <= RECOVERY_BOUND_S
        and code == 0
        and not left,
    )


# ------------------------------------------------------------------ the repositories
def _copy_models(source: Path, target: Path, models: Sequence[str]) -> Path:
    for name in models:
        if not (source / name).is_dir():
            raise ConfigError(f"{source} has no model {name}")
        shutil.copytree(source / name, target / name)
    return target


def serve_compiled_stage(repository: Path) -> None:
    """Make ``repository``'s raw-row stage (``criteo_rows``) the compiled one: its config says
    ``backend: "raw_rows"`` and its version folder holds no file.

    Raises:
        ConfigError: the compiled stages are not built here.
    """
    if not STAGE_LIBRARY.is_file():
        raise ConfigError(
            f"the compiled stages are not built ({STAGE_LIBRARY} is missing): run `make stages`"
        )
    folder = version_dir(repository, STAGE_MODEL, 1)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = build_stage_config()
    config.backend = STAGE_BACKEND
    write_config(repository / STAGE_MODEL, config)


def _row_text(count: int, seed: int) -> RowText:
    """``count`` rows of the synthetic generator, as their text (what a raw-row model takes)."""
    with tempfile.TemporaryDirectory(prefix="fault-rows-") as folder:
        path = Path(folder) / "rows.tsv"
        write_tsv(SynthConfig(rows=count, seed=seed), path)
        return next(iter_row_text(path, count))


# ------------------------------------------------------------------ the runners
def server_crash(
    repository: Path, work: Path, model: str = "dlrm_onnx", batch_size: int = 64, log_dir: Path | None = None
) -> FaultResult:
    """Server crash: tritonserver SIGKILLed under load while ``python -m server serve`` (its
    defaults) serves ``model`` alone (copied out of ``repository`` into ``work``)."""
    served = _copy_models(repository, Path(tempfile.mkdtemp(prefix="server-crash-", dir=work)), [model])
    rows = synthetic_rows(2 * batch_size)
    return crash_under_serve(
        f"server crash: tritonserver SIGKILL under load, restarted by python -m server serve ({model})",
        served,
        model,
        [rows.slice(0, batch_size), rows.slice(batch_size, 2 * batch_size)],
        signal.SIGKILL,
        log_dir or served,
    )


def stage_crash(
    repository: Path, work: Path, model: str = "dlrm_onnx", batch_size: int = 64, log_dir: Path | None = None
) -> FaultResult:
    """Stage crash: SIGSEGV to tritonserver while the compiled raw-row stage serves under load
    (``<model>_raw``: the stage, then ``model``, copied out of ``repository`` into ``work`` with
    the stage made the compiled one), under ``python -m server serve`` with its defaults.

    Raises:
        ConfigError: the compiled stages are not built, or ``repository`` has no raw-row model.
    """
    raw = raw_model_name(model)
    served = _copy_models(
        repository, Path(tempfile.mkdtemp(prefix="stage-crash-", dir=work)), [STAGE_MODEL, model, raw]
    )
    serve_compiled_stage(served)
    rows = _row_text(2 * batch_size, seed=0)
    return crash_under_serve(
        f"stage crash: SIGSEGV sent to tritonserver (standing in for a crash in the compiled raw-row "
        f"stage, which runs inside it) under load, restarted by python -m server serve ({raw})",
        served,
        raw,
        [rows.slice(0, batch_size), rows.slice(batch_size, 2 * batch_size)],
        signal.SIGSEGV,
        log_dir or served,
    )
