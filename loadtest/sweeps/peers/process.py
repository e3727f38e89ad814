"""A peer server as a child process: started, waited for, and stopped by its pid.

Each peer runs as ``python -m loadtest.sweeps.peers.<server> serve ...`` in a
process group of its own (PyTriton starts a tritonserver and a python-backend
stub below it), logs to a file, and is ready once its health URL answers 200.
Stopping sends SIGINT (both PyTriton and uvicorn shut down cleanly on it),
waits, then kills the group whose id is the pid this module started.
"""

from __future__ import annotations

import http.client
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from bundle.errors import ServerError
from loadtest.sweeps.sweep import REPO_ROOT

logger = logging.getLogger(__name__)

_POLL_S = 0.25


def http_ok(host: str, port: int, path: str, timeout_s: float = 2.0) -> bool:
    """Whether ``GET http://host:port/path`` answers 200 (no proxy: the server is local)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _running(pid: int) -> bool:
    """Whether process ``pid`` (our unreaped child) still runs, i.e. is not a zombie yet."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            # The state follows the command name, which is in parentheses and may hold spaces.
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class PeerProcess:
    """One peer server process.

    Args:
        name: for messages, e.g. ``fastapi``.
        module_args: arguments after ``python -m``,
            e.g. ``["loadtest.sweeps.peers.fastapi_server", "serve", ...]``.
        ready: ``(port, path)`` of the URL on 127.0.0.1 that answers 200 once it serves.
        log_file: where its output goes.
        startup_timeout_s: how long :meth:`start` waits for readiness.
        env: its environment (default: this process's); the repository root is put on PYTHONPATH.
    """

    def __init__(
        self,
        name: str,
        module_args: Sequence[str],
        ready: tuple[int, str],
        log_file: Path,
        startup_timeout_s: float = 180.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = [sys.executable, "-m", *module_args]
        self.ready = ready
        self.log_file = log_file
        self.startup_timeout_s = startup_timeout_s
        self.env = dict(os.environ if env is None else env)
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> PeerProcess:
        """Start the process and wait until it is ready.

        Raises:
            ServerError: it exited, or was not ready in time (it is stopped then).
        """
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_file.open("wb")
        self._log.write(f"# {shlex.join(self.command)}\n".encode())
        self._log.flush()
        env = dict(self.env)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        logger.info("%s peer pid %d starting (log %s)", self.name, self._process.pid, self.log_file)
        deadline = time.monotonic() + self.startup_timeout_s
        port, path = self.ready
        try:
            while not http_ok("127.0.0.1", port, path):
                code = self._process.poll()
                if code is not None:
                    raise ServerError(
                        f"{self.name} peer exited with code {code} before it was ready (log: {self.log_file})"
                    )
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"{self.name} peer not ready in {self.startup_timeout_s:.0f} s (log: {self.log_file})"
                    )
                time.sleep(_POLL_S)
        except BaseException:
            self.stop()
            raise
        logger.info("%s peer pid %d ready", self.name, self._process.pid)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT, then SIGKILL of its process group after ``timeout_s``; safe to call twice."""
        process = self._process
        if process is not None and process.returncode is None:
            if _running(process.pid):
                process.send_signal(signal.SIGINT)
                deadline = time.monotonic() + timeout_s
                while _running(process.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if _running(process.pid):
                    logger.warning(
                        "%s peer pid %d did not stop in %.0f s; killing it", self.name, process.pid, timeout_s
                    )
            # The process is not reaped yet (at most a zombie), so the group whose id is
            # its pid still exists and holds only what it started (PyTriton's
            # tritonserver and stubs): take them down with it.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                logger.debug("process group %d already gone", process.pid)
            process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> PeerProcess:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
