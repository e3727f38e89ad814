"""Keeps the local tritonserver serving: ``python -m server serve`` restarts it when it dies.

The bundle's compiled stages run inside tritonserver's own process, so a crash in one takes
the whole server down; so do the out-of-memory killer and a stray SIGKILL. :func:`supervise`
runs the server in the foreground and, when it dies, starts a new one on the same
repository and the same ports, within a :class:`RestartPolicy`:

- what counts as a death: tritonserver killed by a signal, tritonserver exiting on its own
  with a non-zero code, and the server taken out of service because a model lost its
  python stub (``--on-dead-model stop``, the default with ``none`` model control, see
  :mod:`server.dead_models`). A model that is reloaded in place (``reload``, the default
  with explicit model control) is no death: the server never stopped. tritonserver exiting
  on its own with code 0 was stopped by someone (a SIGTERM sent to it directly): it is not
  restarted, and the command stops with one line;
- each restart is logged in one line: what died and how (the signal's name or the exit
  code, or the model that lost its stub), the restart's number, and the seconds from the
  death seen to the new server ready; the dead server's log is kept beside the new one
  (``tritonserver.log.1`` is the latest, up to ``max_restarts`` of them);
- before each restart it waits ``backoff_s`` (doubled for each restart already in the
  window, at most :data:`MAX_BACKOFF_S`), then until the three ports are free again;
- a restart whose start fails (a model that no longer loads, a port still taken) counts as
  a restart, and the next one follows its backoff;
- once ``max_restarts`` restarts happened within ``window_s``, the next death stops the
  command with one line (exit 1), for whatever supervises it;
- the first start is never retried: a repository that does not load now will not load on
  a retry;
- SIGINT or SIGTERM stops the server (it drains and unloads) and returns 0, whatever it
  was doing: serving, waiting out a backoff, or starting again.

What it cannot do: restart itself, or notice a server that hangs without dying. A
supervisor (systemd, a container's restart policy) restarts the command when it exits,
and a liveness check (an inference, as compose's health check sends) catches a hang.
"""

from __future__ import annotations

import collections
import enum
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from bundle.errors import BundleError, ConfigError, ServerError
from server.config import ServerConfig
from server.installation import TritonInstallation
from server.launcher import LocalServer
from server.ports import port_in_use

logger = logging.getLogger(__name__)

#: Restarts allowed within :data:`DEFAULT_RESTART_WINDOW_S` before the command gives up.
DEFAULT_MAX_RESTARTS = 5
#: The window that :data:`DEFAULT_MAX_RESTARTS` counts restarts in, in seconds.
DEFAULT_RESTART_WINDOW_S = 600.0
#: The wait before the first restart in a window; doubled for each further one.
DEFAULT_RESTART_BACKOFF_S = 0.5
#: The longest wait before a restart, in seconds.
MAX_BACKOFF_S = 30.0
#: How long a restart waits for the ports of the server that died to be free again.
PORT_WAIT_S = 30.0
_POLL_S = 0.2
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class RestartPolicy:
    """When ``python -m server serve`` starts tritonserver again after it died.

    Args:
        enabled: restart at all; False: the first death stops the command (exit 1).
        max_restarts: restarts allowed within ``window_s``; the next death stops the command.
            0 never restarts, and says so in the line it stops with.
        window_s: the sliding window, in seconds, that ``max_restarts`` counts restarts in.
        backoff_s: the wait before the first restart in the window; doubled for each
            restart already in the window, at most :data:`MAX_BACKOFF_S`.
        port_wait_s: how long a restart waits for the ports to be free.
    """

    enabled: bool = True
    max_restarts: int = DEFAULT_MAX_RESTARTS
    window_s: float = DEFAULT_RESTART_WINDOW_S
    backoff_s: float = DEFAULT_RESTART_BACKOFF_S
    port_wait_s: float = PORT_WAIT_S

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int):
            raise ConfigError(f"max_restarts must be an integer, got {self.max_restarts!r}")
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if not self.window_s > 0:
            raise ConfigError(f"the restart window must be > 0 s, got {self.window_s!r}")
        if not 0 <= self.backoff_s <= MAX_BACKOFF_S:
            raise ConfigError(
                f"the restart backoff must be in 0..{MAX_BACKOFF_S:.0f} s, got {self.backoff_s!r}"
            )
        if not self.port_wait_s >= 0:
            raise ConfigError(f"port_wait_s must be >= 0, got {self.port_wait_s!r}")

    def backoff(self, recent: int) -> float:
        """Seconds to wait before a restart when ``recent`` restarts happened in the window."""
        return min(MAX_BACKOFF_S, self.backoff_s * 2**recent)

    def describe(self) -> str:
        """``at most <max_restarts> in <window_s> s``: the limit, as the restart lines state it."""
        return f"at most {self.max_restarts} in {self.window_s:.0f} s"


class _StopRequested(BaseException):
    """Raised by the signal handler in the main thread; carries the signal.

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` on the
    way up swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _request_stop(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signum)


class Outcome(enum.Enum):
    """How a served tritonserver ended (see :func:`death`)."""

    KILLED = "killed"
    FAILED = "failed"
    OUT_OF_SERVICE = "out of service"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Death:
    """What ended a server that was serving, in words.

    Args:
        outcome: how it ended.
        cause: ``tritonserver pid 12 was killed by SIGKILL``, ``tritonserver pid 12 exited
            with code 1``, or the model whose stub died (:attr:`LocalServer.failure_cause`).
        seen_at: ``time.monotonic()`` when the supervisor saw it.
    """

    outcome: Outcome
    cause: str
    seen_at: float


def death(server: LocalServer, seen_at: float) -> Death:
    """Describe how ``server`` (no longer serving) ended, from its failure or exit status."""
    if server.failure_cause is not None:
        return Death(Outcome.OUT_OF_SERVICE, server.failure_cause, seen_at)
    code = server.returncode
    if code is not None and code < 0:
        return Death(
            Outcome.KILLED, f"tritonserver pid {server.pid} was killed by {_signal_name(-code)}", seen_at
        )
    outcome = Outcome.STOPPED if code == 0 else Outcome.FAILED
    return Death(outcome, f"tritonserver pid {server.pid} exited on its own with code {code}", seen_at)


def _signal_name(number: int) -> str:
    """``SIGKILL``; ``signal 40`` for one without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _wait_for_death(server: LocalServer) -> Death:
    """Block while ``server`` serves; how it stopped serving."""
    while server.returncode is None and server.failure is None:
        time.sleep(_POLL_S)
    return death(server, time.monotonic())


def keep_log(log_file: Path, keep: int) -> Path | None:
    """Move ``log_file`` aside as ``<name>.1``, shifting older ones up to ``<name>.<keep>``.

    Returns:
        Where it went; None when there was no log to keep.
    """
    if not log_file.is_file():
        return None
    keep = max(1, keep)
    kept = [log_file.with_name(f"{log_file.name}.{n}") for n in range(1, keep + 1)]
    kept[-1].unlink(missing_ok=True)
    for older, newer in zip(reversed(kept[1:]), reversed(kept[:-1]), strict=True):
        if newer.is_file():
            newer.rename(older)
    log_file.rename(kept[0])
    return kept[0]


def wait_ports_free(config: ServerConfig, timeout_s: float) -> None:
    """Wait until no process holds the server's ports (the dead server's, or a stub it left);
    returns after ``timeout_s`` regardless: the start then names a port still taken."""
    deadline = time.monotonic() + timeout_s
    while any(port_in_use(port, config.address) for port in config.ports.values()):
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


class Supervisor:
    """Runs one local tritonserver at a time on ``config``, restarting it by ``policy``.

    Args:
        config: the server to run; every restart runs the same.
        policy: when to restart.
        on_ready: called once the first server is ready (``python -m server serve`` prints its
            endpoints and models there); restarts are logged in one line instead.
        installation: the tritonserver to run; found in the nvidia-pytriton wheel when omitted.
    """

    def __init__(
        self,
        config: ServerConfig,
        policy: RestartPolicy,
        on_ready: Callable[[LocalServer], None] = lambda server: None,
        installation: TritonInstallation | None = None,
    ) -> None:
        self._config = config
        self._policy = policy
        self._on_ready = on_ready
        self._installation = installation
        self._server = LocalServer(config, installation)
        self._restarts: collections.deque[float] = collections.deque()
        self._total = 0
        # Between a server that died and the next one started: nothing runs that a stop could end.
        self._down = False

    @property
    def server(self) -> LocalServer:
        """The server running now (or the last one)."""
        return self._server

    def run(self) -> int:
        """Start the server, serve until SIGINT or SIGTERM, restarting it when it dies.

        The signal is forwarded to tritonserver, which drains and unloads; a
        second signal while it does kills it.

        Returns:
            tritonserver's exit code; 0 after a requested stop.

        Raises:
            ServerError: the first start failed; tritonserver died and restarting is off
                or its restarts are used up; or it exited on its own with code 0.
        """
        previous = {sig: signal.signal(sig, _request_stop) for sig in _STOP_SIGNALS}
        received: int = signal.SIGTERM
        try:
            try:
                self._server.start()
                self._on_ready(self._server)
                while True:
                    self._restart(_wait_for_death(self._server))
            except _StopRequested as stop:
                received = stop.signum
                logger.info("received %s; stopping tritonserver", signal.Signals(received).name)
            finally:
                for sig in _STOP_SIGNALS:
                    signal.signal(sig, lambda signum, frame: self._server.kill())
                code = self._server.stop(received)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if code is None or self._down or -code in _STOP_SIGNALS:
            # Killed by the very signal we forwarded (tritonserver had not yet set up its
            # handlers: a stop during start-up), or asked to stop while no server ran (waiting
            # to restart one): stopping was what was asked.
            return 0
        return code

    def _restart(self, dead: Death) -> None:
        """Bring a server back after ``dead``, or raise ServerError when it must not be."""
        self._server.stop()  # reaps it; ends the stubs it left behind and removes their files
        self._down = True
        log_file = self._config.log_file
        if dead.outcome is Outcome.STOPPED:
            raise ServerError(f"{dead.cause}: stopped by someone else, not restarted (log: {log_file})")
        if not self._policy.enabled:
            if dead.outcome is Outcome.OUT_OF_SERVICE and self._server.failure is not None:
                raise ServerError(self._server.failure)
            raise ServerError(f"{dead.cause}; not restarted (--no-restart) (log: {log_file})")
        last_error = ""
        while True:
            now = time.monotonic()
            while self._restarts and now - self._restarts[0] > self._policy.window_s:
                self._restarts.popleft()
            recent = len(self._restarts)
            if recent >= self._policy.max_restarts:
                raise ServerError(
                    f"{dead.cause}; not restarted: {recent} restart(s) within {self._policy.window_s:.0f} s "
                    f"already, the most --max-restarts allows"
                    + (f"; the last one failed: {last_error}" if last_error else f" (log: {log_file})")
                )
            time.sleep(self._policy.backoff(recent))
            wait_ports_free(self._config, self._policy.port_wait_s)
            self._restarts.append(time.monotonic())
            self._total += 1
            number = f"restart {self._total} ({recent + 1} of {self._policy.describe()})"
            kept = keep_log(log_file, self._policy.max_restarts)
            self._server = LocalServer(self._config, self._installation)
            self._down = False
            try:
                self._server.start()
            except BundleError as exc:  # it did not start (and is stopped): the next try follows
                self._down = True
                last_error = str(exc)
                logger.warning("%s: %s failed: %s", dead.cause, number, exc)
                continue
            logger.warning(
                "%s: %s, tritonserver ready again as pid %s in %.1f s (%s)",
                dead.cause,
                number,
                self._server.pid,
                time.monotonic() - dead.seen_at,
                f"the log of the one that died: {kept}" if kept else f"log: {log_file}",
            )
            return


def supervise(
    config: ServerConfig,
    policy: RestartPolicy | None = None,
    on_ready: Callable[[LocalServer], None] = lambda server: None,
) -> int:
    """Run tritonserver on ``config`` in the foreground until SIGINT or SIGTERM, restarting it
    by ``policy`` (the defaults when None); see :class:`Supervisor`.

    Returns:
        0 after a requested stop; else tritonserver's exit code on that stop.

    Raises:
        ServerError: it could not start, or died and was not restarted.
    """
    return Supervisor(config, policy or RestartPolicy(), on_ready).run()
