"""Dead models: a python-backend stub that died while its model still reports READY.

Each instance of a python-backend model (here: every model, since the local
``onnxruntime`` and ``pytorch`` backends and the bundle's stages are python-based)
runs in a ``triton_python_backend_stub`` process. When that process dies (SIGKILL,
the kernel's out-of-memory killer, a crash in native code), tritonserver 2.51 goes on
saying READY for the model and for itself (``/v2/health/ready``, the model's ready
endpoint and the repository index all answer as before), and answers every request
to the model with ``INTERNAL: Stub process '<instance>' is not healthy.``, for good.
A version of that model that has answered such a request can never be unloaded
either, so tritonserver then waits out its whole ``--exit-timeout-secs`` on SIGTERM
and exits 1. Later Triton releases mark such a model not ready; none restarts it.

:class:`StubWatch` finds such a stub: it looks at tritonserver's children every
``interval_s`` (a cheap ``/proc`` read), remembers every running stub
by pid, and reports a stub that became a zombie (tritonserver never reaps one that
died on its own), was not replaced by a new stub of its instance (a reload; one
that exited without a signal has ``replacement_grace_s`` for it), and whose model
version the repository index still says is READY
(a stub that exits because its model unloads does so while the version is
UNLOADING, and is reaped at once). What happens then is the launcher's
:class:`DeadModelAction`:

- ``reload`` (the default with explicit model control): unload the model, so that
  readiness (the server's and the model's) turns non-200 at once, then load it
  again (the stub kills of benchmarks/faults/result.md measure how long that
  takes). Requests meanwhile get ``NOT_FOUND: ... has
  no available versions`` (tritonserver 2.51's answer for a model without a ready
  version). The dead instance stays behind, unreleased, until the server stops;
  the launcher then kills tritonserver once only such instances are left, instead
  of waiting out the exit timeout.
- ``stop`` (the default with ``none`` model control, where tritonserver refuses
  the repository API): take the server out of service. tritonserver is stopped
  (readiness turns non-200 at once, in-flight requests to the other models finish),
  and ``python -m server serve`` starts it again (:mod:`server.supervisor`), or, with
  ``--no-restart``, exits 1 with one line naming the model, for a supervisor (systemd,
  a container's restart policy) to start it again.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bundle.errors import ServerError
from server.probes import ServerProbe
from server.processes import StubProcess, killed_by_signal, stub_processes

logger = logging.getLogger(__name__)

#: How often the watch looks at tritonserver's children.
WATCH_INTERVAL_S = 0.2
#: How long an exited stub's instance has to show again under a new pid (a reload)
#: before the stub counts as dead.
REPLACEMENT_GRACE_S = 1.0


class DeadModelAction(enum.StrEnum):
    """What the local server does when a model's python stub dies (see the module docstring)."""

    RELOAD = "reload"
    STOP = "stop"


@dataclass(frozen=True)
class DeadModel:
    """A model version whose python stub(s) died while it was READY.

    Args:
        model: the model's name.
        version: its version.
        stubs: the stubs that died (pid, instance, shared-memory region).
        seen_at: ``time.monotonic()`` when the watch judged them dead (see :meth:`StubWatch.look`).
    """

    model: str
    version: str
    stubs: tuple[StubProcess, ...]
    seen_at: float

    def describe(self) -> str:
        """``model 'dlrm_onnx' version 1 lost its backend process (stub dlrm_onnx_0_0, pid 123)``."""
        stubs = ", ".join(f"stub {stub.instance}, pid {stub.pid}" for stub in self.stubs)
        return f"model '{self.model}' version {self.version} lost its backend process ({stubs})"


@dataclass(frozen=True)
class Recovery:
    """One dead model the local server brought back, with when.

    Args:
        model: the model's name.
        version: the version whose stub died.
        seen_at: ``time.monotonic()`` when the watch saw the stub dead.
        ready_at: ``time.monotonic()`` when the reloaded model was READY again.
    """

    model: str
    version: str
    seen_at: float
    ready_at: float

    @property
    def seconds(self) -> float:
        """From the dead stub seen to the model ready again."""
        return self.ready_at - self.seen_at


class StubWatch:
    """Watches tritonserver ``pid``'s python stubs in a thread; reports the ones that died.

    Args:
        pid: tritonserver's process id.
        probe: asks the repository index whether a dead stub's model version is READY.
        on_dead: called in the watch's thread with the dead model versions of one look;
            an exception it raises is logged, and the watch goes on.
        interval_s: seconds between looks.
        replacement_grace_s: seconds an exited stub has to be replaced before it counts as dead.
    """

    def __init__(
        self,
        pid: int,
        probe: ServerProbe,
        on_dead: Callable[[Sequence[DeadModel]], None],
        interval_s: float = WATCH_INTERVAL_S,
        replacement_grace_s: float = REPLACEMENT_GRACE_S,
    ) -> None:
        self._pid = pid
        self._probe = probe
        self._on_dead = on_dead
        self._interval_s = interval_s
        self._grace_s = replacement_grace_s
        self._known: dict[int, StubProcess] = {}
        self._exited: dict[int, tuple[StubProcess, float]] = {}  # pid: (stub, when it is judged)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stub-watch-{pid}", daemon=True)

    def start(self) -> StubWatch:
        """Take note of the running stubs, then watch them in a daemon thread."""
        self.look()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; waits for the thread unless called from it (from ``on_dead``)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def look(self) -> list[DeadModel]:
        """One look: remember the running stubs, return the versions whose stubs died.

        A stub killed by a signal (SIGKILL, the out-of-memory killer, a crash) is
        judged at once. One that exited on its own is judged ``replacement_grace_s``
        later: tritonserver reloads a version (a hot-set rollout does so) by starting
        new instances and letting the old ones exit, and the new instance's stub may
        not show yet (forked, not yet exec'd) when the old one is gone. An exited stub
        whose instance runs again under another pid by then is forgiven; so is one
        whose version the index no longer calls READY (it exited because the version
        unloads). When the index cannot be read, the exited stubs wait for the next look.
        """
        running, zombies = stub_processes(self._pid)
        now = time.monotonic()
        for pid, status in sorted(zombies.items()):
            if pid in self._known:
                judged_at = now if killed_by_signal(status) else now + self._grace_s
                self._exited[pid] = (self._known.pop(pid), judged_at)
        alive = {stub.pid for stub in running}
        self._known = {pid: stub for pid, stub in self._known.items() if pid in alive}  # reaped ones go
        for stub in running:
            # The stub that completes a loading model's config exits once done: never a death.
            if not stub.completes_config:
                self._known.setdefault(stub.pid, stub)
        replaced = {(stub.model, stub.version, stub.instance) for stub in running}
        for pid, (stub, _) in list(self._exited.items()):
            if (stub.model, stub.version, stub.instance) in replaced:
                logger.debug("stub %s (pid %d) exited: its instance loaded again", stub.instance, stub.pid)
                del self._exited[pid]
        due = [pid for pid, (_, due_at) in self._exited.items() if now >= due_at]
        if not due:
            return []
        try:
            ready = {(m.name, m.version) for m in self._probe.repository_index() if m.state == "READY"}
        except ServerError as exc:
            logger.debug("repository index unreadable; exited stubs kept for the next look: %s", exc)
            return []
        by_version: dict[tuple[str, str], list[StubProcess]] = {}
        for pid in due:
            stub, _ = self._exited.pop(pid)
            if (stub.model, stub.version) in ready:
                by_version.setdefault((stub.model, stub.version), []).append(stub)
            else:
                logger.debug("stub %s (pid %d) exited with its unloading model", stub.instance, stub.pid)
        return [DeadModel(name, version, tuple(stubs), now) for (name, version), stubs in by_version.items()]

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            dead = self.look()
            if not dead or self._stop.is_set():
                continue
            try:
                self._on_dead(dead)
            except Exception:  # the watch must outlive one failed reaction; logged in full
                logger.exception("handling dead model(s) %s failed", ", ".join(d.model for d in dead))
