"""The dead-stub watch tells a stub that died from one that exited because its model unloaded or reloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from server import dead_models
from server.dead_models import StubWatch
from server.probes import ModelStatus
from server.processes import StubProcess


def _stub(pid: int, instance: str = "dlrm_embedding_0_0", version: str = "2") -> StubProcess:
    return StubProcess(pid, "dlrm_embedding", version, instance, f"/stub-{pid}")


class _Index:
    """A repository index whose READY versions the test sets."""

    def __init__(self) -> None:
        self.ready: set[tuple[str, str]] = {("dlrm_embedding", "2")}

    def repository_index(self) -> list[ModelStatus]:
        return [ModelStatus(name, version, "READY", "") for name, version in self.ready]


class _Clock:
    """``time.monotonic`` for the watch, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


GRACE_S = 1.0


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A watch over processes the test lists: ``watch.processes = (running, zombie pids)``."""
    index = _Index()
    clock = _Clock()
    state: dict[str, Any] = {"processes": ([_stub(10), _stub(11, "dlrm_embedding_0_1")], {})}
    monkeypatch.setattr(dead_models, "stub_processes", lambda pid: state["processes"])
    monkeypatch.setattr(dead_models.time, "monotonic", clock)
    watcher = StubWatch(1, index, on_dead=lambda dead: None, replacement_grace_s=GRACE_S)  # type: ignore[arg-type]
    assert watcher.look() == []
    return watcher, state, index, clock


KILLED = 9  # exit status: killed by SIGKILL
EXITED = 0  # exit status: exit(0)


def test_a_stub_killed_while_its_version_is_ready_is_dead_at_once(watch: Any) -> None:
    watcher, state, _, clock = watch
    state["processes"] = ([_stub(11, "dlrm_embedding_0_1")], {10: KILLED})
    (dead,) = watcher.look()
    assert (dead.model, dead.version, [s.pid for s in dead.stubs]) == ("dlrm_embedding", "2", [10])
    assert dead.seen_at == clock.now
    clock.now += GRACE_S
    assert watcher.look() == []  # reported once


def test_a_stub_that_exits_while_its_version_is_ready_is_dead_once_its_grace_is_over(watch: Any) -> None:
    watcher, state, _, clock = watch
    state["processes"] = ([_stub(11, "dlrm_embedding_0_1")], {10: EXITED})
    assert watcher.look() == []  # not replaced yet: it may be a reload
    clock.now += GRACE_S / 2
    assert watcher.look() == []
    clock.now += GRACE_S / 2
    (dead,) = watcher.look()
    assert [s.pid for s in dead.stubs] == [10]
    assert dead.seen_at == clock.now  # judged now: readiness turns false from here on
    clock.now += GRACE_S
    assert watcher.look() == []


def test_a_stub_whose_version_unloads_is_not_dead(watch: Any) -> None:
    watcher, state, index, clock = watch
    index.ready = set()
    state["processes"] = ([], {10: EXITED, 11: KILLED})
    assert watcher.look() == []
    clock.now += GRACE_S
    assert watcher.look() == []


def test_a_stub_replaced_by_a_reload_of_its_ready_version_is_not_dead(watch: Any) -> None:
    watcher, state, _, clock = watch
    # Version 2 loaded again: new instances under new pids, the old ones exiting.
    state["processes"] = ([_stub(20), _stub(21, "dlrm_embedding_0_1")], {10: EXITED, 11: EXITED})
    assert watcher.look() == []
    clock.now += GRACE_S
    assert watcher.look() == []
    # The new instances are watched as any other.
    state["processes"] = ([_stub(21, "dlrm_embedding_0_1")], {20: KILLED})
    (dead,) = watcher.look()
    assert [s.pid for s in dead.stubs] == [20]


def test_a_stub_whose_replacement_shows_a_look_later_is_not_dead(watch: Any) -> None:
    watcher, state, _, clock = watch
    # The old instance exited before the reload's new stub shows (forked, not yet exec'd) ...
    state["processes"] = ([_stub(11, "dlrm_embedding_0_1")], {10: EXITED})
    assert watcher.look() == []
    # ... which it does within the grace.
    clock.now += GRACE_S / 4
    state["processes"] = ([_stub(20), _stub(11, "dlrm_embedding_0_1")], {10: EXITED})
    assert watcher.look() == []
    clock.now += GRACE_S
    assert watcher.look() == []


def test_exited_stubs_wait_for_an_index_that_cannot_be_read(watch: Any) -> None:
    watcher, state, index, clock = watch

    def unreadable() -> list[Any]:
        raise dead_models.ServerError("connection refused")

    state["processes"] = ([_stub(11, "dlrm_embedding_0_1")], {10: KILLED})
    readable = index.repository_index
    index.repository_index = unreadable
    assert watcher.look() == []
    clock.now += GRACE_S
    assert watcher.look() == []
    index.repository_index = readable
    (dead,) = watcher.look()
    assert [s.pid for s in dead.stubs] == [10]


def test_a_zombie_exit_status_tells_a_kill_from_an_exit() -> None:
    import os
    import signal
    import time

    from server.processes import exit_status, killed_by_signal

    children = {}
    for how in ("exit", "kill"):
        pid = os.fork()
        if pid == 0:
            if how == "exit":
                os._exit(0)
            time.sleep(60)
            os._exit(0)
        children[how] = pid
    try:
        os.kill(children["kill"], signal.SIGKILL)
        deadline = time.monotonic() + 10

        def zombie(pid: int) -> bool:
            return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"

        while time.monotonic() < deadline and not all(zombie(pid) for pid in children.values()):
            time.sleep(0.01)
        statuses = {how: exit_status(pid) for how, pid in children.items()}
        assert statuses == {"exit": 0, "kill": signal.SIGKILL}
        assert not killed_by_signal(statuses["exit"]) and killed_by_signal(statuses["kill"])
    finally:
        for pid in children.values():
            os.waitpid(pid, 0)
    assert exit_status(children["exit"]) is None  # reaped


def test_the_stub_that_completes_a_loading_models_config_is_never_taken_for_a_dead_one(watch: Any) -> None:
    """The python backend starts a stub named after the model to complete its config while it
    loads (a rollout loads the stage again); it exits once done, and no instance replaces it."""
    watcher, state, _, clock = watch
    completing = _stub(12, instance="dlrm_embedding")
    assert completing.completes_config and not _stub(10).completes_config
    state["processes"] = ([_stub(10), _stub(11, "dlrm_embedding_0_1"), completing], {})
    assert watcher.look() == []
    state["processes"] = ([_stub(10), _stub(11, "dlrm_embedding_0_1")], {12: EXITED})
    for _ in range(3):
        clock.now += GRACE_S
        assert watcher.look() == []
    # Nor when it is killed (the backend kills one whose config code raised).
    state["processes"] = (
        [_stub(10), _stub(11, "dlrm_embedding_0_1"), _stub(13, instance="dlrm_embedding")],
        {},
    )
    assert watcher.look() == []
    state["processes"] = ([_stub(10), _stub(11, "dlrm_embedding_0_1")], {13: KILLED})
    assert watcher.look() == []
