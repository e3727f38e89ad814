"""Writes into a repository interrupted: a command killed with SIGKILL at chosen points, and a
write that runs out of space.

Each run starts from a copy of a complete repository (``before``), runs a command that
writes into it (``python -m export dlrm ...``, ``python -m export rollout-hot-set ...``),
and kills the command's process group when its log reaches a point (a line that matches a
pattern) or after a delay. Then the bundle's local tritonserver starts on the copy (the
start finishes or discards the interrupted write, :func:`bundle.staging.recover`) and
every model of ``before`` is asked the same rows over gRPC. Each answer must equal,
exactly, the answer of the same model served from ``before`` or from ``after`` (the
repository the same command wrote without interruption), and the models of one family
must all be one or all the other: a family whose variants came from two runs is a
*mixed* outcome. A model that fails to load, or a staging folder left behind, fails the run.

The disk-full run gives the command a file-size limit (``RLIMIT_FSIZE``, no root needed): it
must stop with one ``error: ... no space left ...`` line and leave the repository byte for
byte as it was.
"""

from __future__ import annotations

import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bundle.staging import JOURNAL, staging_root
from clients.triton import TritonClient
from criteo.tsv import Batch
from lab.faults import FaultResult
from server import LocalServer
from server.config import ServerConfig

log = logging.getLogger(__name__)

#: Max |served - expected|: the same file served twice answers the same numbers.
EXACT = 1e-6
#: The placeholder for the repository in a command's arguments.
REPOSITORY = "{repository}"


@dataclass(frozen=True)
class KillPoint:
    """When the writing command dies: at the first log line matching ``pattern`` (None: never
    waits for a line), after ``delay_s`` more seconds."""

    name: str
    pattern: str | None = None
    delay_s: float = 0.0


#: Spread over an export's run: start-up, the FP32 graph, FP16, INT8, its check, the commit.
EXPORT_POINTS = (
    KillPoint("at start-up (imports)", None, 0.3),
    KillPoint("writing the FP32 graph", r"exporting \w+ to "),
    KillPoint("converting to FP16", r"converting .* to FP16"),
    KillPoint("quantizing to INT8", r"quantizing .* to INT8"),
    KillPoint("checking INT8", r"quantizing \d+ layers"),
    KillPoint("moving the models in", r"moving \d+ staged entries"),
)

#: Spread over a rollout's run (with ``--url``: a server in explicit model-control mode).
ROLLOUT_POINTS = (
    KillPoint("at start-up (imports)", None, 0.3),
    KillPoint("after choosing the hot set", r"hot set version \d+:"),
    KillPoint("building the variants", r"(converting|quantizing) .* at "),
    KillPoint("moving the versions in", r"moving \d+ staged entries"),
    KillPoint("loading the new versions", r"loading \w+_embedding"),
    KillPoint("loading the switched ensembles", r"loading \w+_onnx"),
)


@dataclass(frozen=True)
class Killed:
    """One command run to a kill point: whether it was killed there, and after how long."""

    killed: bool
    seconds: float
    returncode: int | None
    tail: str


def run_to(command: Sequence[str], point: KillPoint, env: Mapping[str, str] | None = None) -> Killed:
    """Run ``command`` (its own process group) and SIGKILL the group at ``point``.

    A command that ends before the point is not killed (``killed`` False).
    """
    started = time.monotonic()
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    assert process.stderr is not None
    matched = threading.Event()
    lines: list[str] = []
    pattern = None if point.pattern is None else re.compile(point.pattern)

    def read() -> None:
        for line in process.stderr:  # type: ignore[union-attr]
            lines.append(line)
            if pattern is not None and pattern.search(line):
                matched.set()
        matched.set()  # the command ended (or closed stderr): stop waiting

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if pattern is not None:
        matched.wait(timeout=600)
    if point.delay_s:
        time.sleep(point.delay_s)
    killed = process.poll() is None
    if killed:
        os.killpg(process.pid, signal.SIGKILL)
    returncode = process.wait()
    reader.join(timeout=10)
    return Killed(killed, time.monotonic() - started, returncode, "".join(lines[-5:]))


def served_answers(
    repository: Path, models: Sequence[str], batch: Batch, log_file: Path, timeout_s: float = 120
) -> dict[str, np.ndarray]:
    """Start the local tritonserver on ``repository`` (every model must load) and ask each model the rows."""
    config = ServerConfig.with_free_ports(repository, log_file=log_file, startup_timeout_s=timeout_s)
    with LocalServer(config).start() as server, TritonClient(server.grpc_url, "grpc") as client:
        return {name: client.infer(name, batch.inputs()) for name in models}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= EXACT))


def classify(
    answers: Mapping[str, np.ndarray], before: Mapping[str, np.ndarray], after: Mapping[str, np.ndarray]
) -> dict[str, str]:
    """Each model's answer as ``before``, ``after``, ``either`` (the two agree) or ``wrong``."""
    kinds = {}
    for name, answer in answers.items():
        old, new = _same(answer, before[name]), _same(answer, after[name])
        kinds[name] = "either" if old and new else "before" if old else "after" if new else "wrong"
    return kinds


@dataclass(frozen=True)
class WriteFaults:
    """What the write faults run on.

    Args:
        before: a complete repository (copied for each run, never written).
        command: the writing command, ``REPOSITORY`` where the repository goes.
        models: the models every run must serve (those of ``before``).
        rows: the rows each model is asked.
        what: ``export`` or ``rollout``, for the table.
        env: the command's environment (None: this process's).
    """

    before: Path
    command: tuple[str, ...]
    models: tuple[str, ...]
    rows: Batch
    what: str
    env: Mapping[str, str] | None = None

    def command_on(self, repository: Path) -> list[str]:
        return [str(repository) if part == REPOSITORY else part for part in self.command]


def _reference(faults: WriteFaults, work: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The answers served from ``before`` and from the uninterrupted write (in ``work``)."""
    before = served_answers(faults.before, faults.models, faults.rows, work / "before.log")
    after_repo = work / "after"
    shutil.copytree(faults.before, after_repo)
    done = subprocess.run(faults.command_on(after_repo), capture_output=True, text=True, env=faults.env)
    if done.returncode != 0:
        raise RuntimeError(f"the uninterrupted {faults.what} failed: {done.stderr.strip()[-2000:]}")
    after = served_answers(after_repo, faults.models, faults.rows, work / "after.log")
    return before, after


def left_behind(repository: Path) -> str:
    """What an interrupted write left beside ``repository`` for the next start to handle."""
    root = staging_root(repository)
    runs = [run for run in root.iterdir() if run.is_dir()] if root.is_dir() else []
    if not runs:
        return "nothing staged"
    if any((run / JOURNAL).is_file() for run in runs):
        return "a decided write, finished by the server's start"
    return "an undecided write, discarded by the server's start"


def _after_kill(
    fault: str,
    repository: Path,
    killed: Killed,
    models: Sequence[str],
    rows: Batch,
    before: Mapping[str, np.ndarray],
    after: Mapping[str, np.ndarray],
    log_file: Path,
    restarted: bool = False,
) -> FaultResult:
    """Start the server on ``repository`` after ``killed`` and measure: every model answers as
    ``before`` or as ``after`` (all of them the same), and no staging folder is left.

    Args:
        restarted: the kill happened while a server ran on the repository (it was stopped); the
            kill must then have happened (a command that ended first measured nothing of it).
        after: the uninterrupted command's answers; ``before`` itself where the command moves no
            answer (a rollout), so that they read "as before".
    """
    left = left_behind(repository)
    started = time.monotonic()
    try:
        answers = served_answers(repository, models, rows, log_file)
    except Exception as exc:  # the server did not start: a model that was there is lost
        return FaultResult(fault, f"server failed to start: {exc}", 0, 1, 0, None, False)
    recovery = time.monotonic() - started
    kinds = classify(answers, before, after)
    wrong = sum(kind == "wrong" for kind in kinds.values())
    states = set(kinds.values()) - {"either"}
    mixed = len(states) > 1
    staged = staging_root(repository).exists()
    state = "/".join(sorted(states)) or ("before" if after is before else "either")
    seen = (
        f"{'killed' if killed.killed else 'finished before the point'} after {killed.seconds:.1f} s, "
        f"{left}{' (restarted)' if restarted else ''}; {len(answers)} models answer as {state}"
        + ("; variants MIXED" if mixed else "")
        + ("; staging left" if staged else "")
    )
    ok = not (wrong or mixed or staged) and (killed.killed or not restarted)
    log.info("%s: %s", fault, seen)
    return FaultResult(fault, seen, len(answers), 0, wrong, recovery, ok)


def interrupted_writes(faults: WriteFaults, points: Sequence[KillPoint]) -> list[FaultResult]:
    """One :class:`FaultResult` per kill point (see the module docstring)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="write-faults-") as tmp:
        work = Path(tmp)
        before, after = _reference(faults, work)
        for index, point in enumerate(points):
            repository = work / f"run{index}" / "model_repository"
            shutil.copytree(faults.before, repository)
            killed = run_to(faults.command_on(repository), point, faults.env)
            fault = f"{faults.what} killed {point.name}"
            log_file = work / f"run{index}.log"
            results.append(
                _after_kill(fault, repository, killed, faults.models, faults.rows, before, after, log_file)
            )
    return results


def interrupted_live(
    before: Path,
    arguments: Sequence[str],
    models: Sequence[str],
    rows: Batch,
    points: Sequence[KillPoint],
    admin_key: str,
) -> list[FaultResult]:
    """A command that loads into a live server (``python -m export rollout-hot-set ... --url``),
    killed at each of ``points``: the server (explicit model control, ``models`` loaded) is then
    stopped and a new one started on the repository, which must serve ``models`` as ``before`` did.

    Args:
        before: the complete repository (copied for each run).
        arguments: the command after ``python -m``, ``REPOSITORY`` where the repository goes; ``--url``
            is added.
        models: the models loaded and asked (answers that a completed command does not move).
        rows: the rows asked.
        points: the kill points.
        admin_key: the server's admin key, given to the command as ``TRITON_ADMIN_KEY``.
    """
    results = []
    with tempfile.TemporaryDirectory(prefix="write-faults-") as tmp:
        work = Path(tmp)
        expected = served_answers(before, models, rows, work / "before.log")
        for index, point in enumerate(points):
            repository = work / f"live{index}" / "model_repository"
            shutil.copytree(before, repository)
            config = ServerConfig.with_free_ports(
                repository,
                log_file=work / f"live{index}-server.log",
                model_control_mode="explicit",
                load_models=tuple(models),
                admin_key=admin_key,
            )
            fault = f"rollout on a live server killed {point.name}"
            with LocalServer(config).start() as server:
                command = [*python_module(*arguments), "--url", server.http_url]
                command = [str(repository) if part == REPOSITORY else part for part in command]
                killed = run_to(command, point, {**os.environ, "TRITON_ADMIN_KEY": admin_key})
            log_file = work / f"live{index}.log"
            results.append(
                _after_kill(
                    fault, repository, killed, models, rows, expected, expected, log_file, restarted=True
                )
            )
    return results


def _limit_file_size(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def disk_full(faults: WriteFaults, limit_bytes: int = 64 * 1024) -> FaultResult:
    """The command with a file-size limit of ``limit_bytes`` on a copy of ``before``."""
    with tempfile.TemporaryDirectory(prefix="write-faults-") as tmp:
        repository = Path(tmp) / "model_repository"
        shutil.copytree(faults.before, repository)
        snapshot = _snapshot(repository)
        done = subprocess.run(
            faults.command_on(repository),
            capture_output=True,
            text=True,
            env=None if faults.env is None else dict(faults.env),
            preexec_fn=lambda: _limit_file_size(limit_bytes),
        )
        errors = [line.replace(tmp, "COPY") for line in done.stderr.splitlines() if line.startswith("error:")]
        last = done.stderr.strip()[-300:]
        seen = errors[-1] if errors else f"exit {done.returncode}, no error line: {last}"
        unchanged = _snapshot(repository) == snapshot and not staging_root(repository).exists()
        answers = served_answers(repository, faults.models, faults.rows, Path(tmp) / "server.log")
        before = served_answers(faults.before, faults.models, faults.rows, Path(tmp) / "before.log")
        wrong = sum(not _same(answers[name], before[name]) for name in faults.models)
    ok = done.returncode == 1 and len(errors) == 1 and "no space left" in seen and unchanged and not wrong
    fault = f"{faults.what} out of space (file-size limit {limit_bytes // 1024} KiB)"
    return FaultResult(fault, seen, len(answers), 0, wrong, None, ok)


def python_module(*args: str) -> tuple[str, ...]:
    """``python -m *args`` with this interpreter."""
    return (sys.executable, "-m", *args)
