"""``python -m server serve`` brings tritonserver back when it dies, against the real local server.

Each test runs the command as a user does, in a process of its own, on a tiny repository (one
python-backend model that doubles its input), and kills what a crash would kill:

- tritonserver SIGKILLed under HTTP load: the command stays up, logs its one restart line,
  the same ports answer again within the bound, and a SIGTERM then exits 0 and leaves no
  tritonserver;
- a model's python stub SIGKILLed with ``none`` model control: the server is taken out of
  service (``--on-dead-model stop``, the default there) and restarted;
- a server that keeps dying (the model kills tritonserver while it loads, once a flag file
  exists): the restarts fail, and once ``--max-restarts`` are used up the command exits 1
  with one line;
- ``--no-restart``: the first death exits 1 with one line.

Every process is ended by its id: the command, and each tritonserver it announced.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from server import free_ports

pytestmark = pytest.mark.integration

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODEL = "doubler"
WIDTH = 4
#: Seconds from the kill until requests are answered again (a tiny model loads in about 2 s).
RECOVERY_BOUND_S = 15.0
#: The command's start: tritonserver, the stub, one model.
START_BOUND_S = 60.0

MODEL_PY = '''
"""Doubles ``x``. With the config parameter ``crash_flag`` naming a file that exists, it kills
its tritonserver while it loads: a server that keeps dying."""

import json
import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        flag = json.loads(args["model_config"])["parameters"]["crash_flag"]["string_value"]
        if os.path.exists(flag):
            os.kill(os.getppid(), signal.SIGKILL)

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 2)]))
        return responses
'''


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """``doubler``: ``B x 4`` FP32 in, twice that out; dies while loading once ``crash.flag`` exists."""
    root = tmp_path / "repository"
    config = model_config_pb2.ModelConfig(name=MODEL, backend="python", max_batch_size=8)
    config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[WIDTH])
    config.output.add(name="y", data_type=model_config_pb2.TYPE_FP32, dims=[WIDTH])
    config.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU, count=1)
    config.parameters["crash_flag"].string_value = str(tmp_path / "crash.flag")
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    (root / MODEL / "1" / "model.py").write_text(MODEL_PY)
    return root


# ------------------------------------------------------------------ the command, in a process
def _pump(stream: IO[str], lines: queue.Queue[str], kept: list[str]) -> None:
    for line in stream:
        kept.append(line)
        lines.put(line)


@dataclass
class Serve:
    """``python -m server serve`` running in a process of its own; its output read by threads."""

    process: subprocess.Popen[str]
    http_port: int
    log_file: Path
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    stderr_lines: queue.Queue[str] = field(default_factory=queue.Queue)
    tritonservers: list[int] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def wait_ready(self) -> int:
        """Wait for the summary; tritonserver's pid, as the command prints it."""
        deadline = time.monotonic() + START_BOUND_S
        while not any(line.startswith("stop with Ctrl-C") for line in self.stdout):
            if time.monotonic() > deadline or self.process.poll() is not None:
                pytest.fail(f"no summary from serve:\n{''.join(self.stdout)}{''.join(self.stderr)}")
            time.sleep(0.1)
        found = re.search(r"tritonserver \S+ ready \(pid (\d+)\)", "".join(self.stdout))
        assert found, "".join(self.stdout)
        self.tritonservers.append(int(found.group(1)))
        return self.tritonservers[-1]

    def wait_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first stderr line from now on that matches ``pattern``; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(queue.Empty):
                line = self.stderr_lines.get(timeout=min(left, 0.2))
                if found := re.search(pattern, line):
                    pid = re.search(r"ready again as pid (\d+)", line)
                    if pid:
                        self.tritonservers.append(int(pid.group(1)))
                    return found
        pytest.fail(f"no line matching {pattern!r} within {timeout_s:.0f} s:\n{''.join(self.stderr)}")

    def wait_exit(self, timeout_s: float) -> int:
        code = self.process.wait(timeout=timeout_s)
        for reader in self.readers:
            reader.join(timeout=5)
        return code


@contextlib.contextmanager
def serve(repository: Path, tmp_path: Path, *options: str) -> Iterator[Serve]:
    """Run the command on free ports; at the end, kill by id whatever of it still runs."""
    http_port, grpc_port, metrics_port = free_ports(3)
    log_file = tmp_path / "tritonserver.log"
    command = [sys.executable, "-m", "server", "serve", "--repository", str(repository),
               "--http-port", str(http_port), "--grpc-port", str(grpc_port),
               "--metrics-port", str(metrics_port), "--log-file", str(log_file), *options]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stderr is not None
    running = Serve(process, http_port, log_file)
    for stream, kept, lines in (
        (process.stdout, running.stdout, queue.Queue[str]()),
        (process.stderr, running.stderr, running.stderr_lines),
    ):
        reader = threading.Thread(target=_pump, args=(stream, lines, kept), daemon=True)
        reader.start()
        running.readers.append(reader)
    try:
        yield running
    finally:
        if process.poll() is None:  # the test failed before the command stopped
            for pid in running.tritonservers:
                # Still the command's child (it is alive): the pid is that tritonserver's.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
            process.kill()
        running.wait_exit(30)
        process.stdout.close()
        process.stderr.close()


def _gone(pid: int) -> bool:
    """Whether no process with ``pid``, and none in its process group, still runs (a zombie
    waiting for init to reap it is dead)."""
    for process in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if (process.pid == pid or os.getpgid(process.pid) == pid) and (
                process.status() != psutil.STATUS_ZOMBIE
            ):
                return False
    return True


# ------------------------------------------------------------------ the load
@dataclass
class Load:
    """A thread sending one request after another over HTTP; each answer's (start, end, ok)."""

    port: int
    results: list[tuple[float, float, bool]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        x = np.arange(2 * WIDTH, dtype=np.float32).reshape(2, WIDTH)
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with httpclient.InferenceServerClient(
                    f"127.0.0.1:{self.port}", connection_timeout=2, network_timeout=2
                ) as client:
                    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
                    tensor.set_data_from_numpy(x)
                    y = client.infer(MODEL, [tensor]).as_numpy("y")
                ok = y is not None and np.array_equal(y, 2 * x)
            except Exception:  # every failure counts as one; the load goes on
                ok = False
                time.sleep(0.05)
            self.results.append((started, time.monotonic(), ok))

    def answered_after(self, t: float) -> float | None:
        """When the first request sent after ``t`` was answered correctly."""
        return min((end for start, end, ok in self.results if ok and start > t), default=None)


@contextlib.contextmanager
def load(port: int) -> Iterator[Load]:
    running = Load(port)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop.set()
        thread.join(timeout=10)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)


# ------------------------------------------------------------------ the tests
def test_a_killed_tritonserver_is_restarted_on_the_same_ports_and_sigterm_still_stops_all(
    repository: Path, tmp_path: Path
) -> None:
    with serve(repository, tmp_path) as running:
        killed = running.wait_ready()
        with load(running.http_port) as requests:
            _wait_for(lambda: sum(ok for *_, ok in requests.results) >= 20, "answers before the kill", 30)
            killed_at = time.monotonic()
            os.kill(killed, signal.SIGKILL)
            line = running.wait_line(
                rf"tritonserver pid {killed} was killed by SIGKILL: restart 1 \(1 of at most 5 in 600 s\), "
                r"tritonserver ready again as pid (\d+) in ([\d.]+) s \(the log of the one that died: (.+)\)",
                RECOVERY_BOUND_S,
            )
            _wait_for(lambda: requests.answered_after(killed_at) is not None, "an answer", RECOVERY_BOUND_S)
            answered_at = requests.answered_after(killed_at)
            failed = sum(not ok for start, _, ok in requests.results if start > killed_at - 1)
        restarted = int(line.group(1))
        assert restarted != killed and running.process.poll() is None
        assert Path(line.group(3)) == running.log_file.with_name(running.log_file.name + ".1")
        assert Path(line.group(3)).is_file() and running.log_file.is_file()
        assert _gone(killed)  # the dead server's stub was ended with it

        running.process.send_signal(signal.SIGTERM)
        assert running.wait_exit(30) == 0, "".join(running.stderr)
    assert _gone(restarted)
    assert answered_at is not None
    print(
        f"tritonserver SIGKILL under serve: answered again {answered_at - killed_at:.1f} s after the "
        f"kill, {failed} failed requests (no client retries); serve said ready in {line.group(2)} s"
    )


def test_a_dead_stub_in_none_model_control_restarts_the_server(repository: Path, tmp_path: Path) -> None:
    with serve(repository, tmp_path) as running:
        pid = running.wait_ready()
        [stub] = [child for child in psutil.Process(pid).children() if "stub" in child.name()]
        killed_at = time.monotonic()
        stub.kill()
        line = running.wait_line(
            rf"model '{MODEL}' version 1 lost its backend process \(stub {MODEL}_0_0, pid {stub.pid}\): "
            r"restart 1 .*ready again as pid (\d+)",
            RECOVERY_BOUND_S,
        )
        with load(running.http_port) as requests:
            _wait_for(lambda: requests.answered_after(killed_at) is not None, "an answer", RECOVERY_BOUND_S)
        assert running.process.poll() is None
        running.process.send_signal(signal.SIGTERM)
        assert running.wait_exit(30) == 0, "".join(running.stderr)
    assert _gone(pid) and _gone(int(line.group(1)))


def test_restarts_used_up_exit_1_with_one_line(repository: Path, tmp_path: Path) -> None:
    with serve(repository, tmp_path, "--max-restarts", "2", "--restart-backoff", "0") as running:
        pid = running.wait_ready()
        (tmp_path / "crash.flag").touch()  # from now on every start dies while the model loads
        os.kill(pid, signal.SIGKILL)
        code = running.wait_exit(2 * START_BOUND_S)
    stderr = [line for line in running.stderr if line.strip()]
    assert code == 1, "".join(stderr)
    failures = [
        line for line in stderr if re.search(r"restart \d \(\d of at most 2 in 600 s\) failed:", line)
    ]
    assert len(failures) == 2, "".join(stderr)
    last = stderr[-1]
    assert last.startswith(
        f"error: tritonserver pid {pid} was killed by SIGKILL; not restarted: 2 restart(s)"
    )
    assert "the last one failed: tritonserver exited with code -9 before it was ready" in last
    assert _gone(pid)


def test_no_restart_exits_1_at_the_first_death(repository: Path, tmp_path: Path) -> None:
    with serve(repository, tmp_path, "--no-restart") as running:
        pid = running.wait_ready()
        os.kill(pid, signal.SIGKILL)
        code = running.wait_exit(30)
    stderr = [line for line in running.stderr if line.strip()]
    assert code == 1
    assert stderr[-1] == (
        f"error: tritonserver pid {pid} was killed by SIGKILL; not restarted (--no-restart) "
        f"(log: {running.log_file})\n"
    )
    assert not any("restart 1" in line for line in stderr)
    assert _gone(pid)
