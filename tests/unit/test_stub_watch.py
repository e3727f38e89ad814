"""The dead-stub watch tells a stub that died from one that exited because its model unloaded or reloaded."""

from __future__ import annotations

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


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A watch over processes the test lists: ``watch.processes = (running, zombie pids)``."""
    index = _Index()
    state: dict[str, Any] = {"processes": ([_stub(10), _stub(11, "dlrm_embedding_0_1")], set())}
    monkeypatch.setattr(dead_models, "stub_processes", lambda pid: state["processes"])
    watcher = StubWatch(1, index, on_dead=lambda dead: None)  # type: ignore[arg-type]
    assert watcher.look() == []
    return watcher, state, index


def test_a_stub_that_dies_while_its_version_is_ready_is_dead(watch: Any) -> None:
    watcher, state, _ = watch
    state["processes"] = ([_stub(11, "dlrm_embedding_0_1")], {10})
    (dead,) = watcher.look()
    assert (dead.model, dead.version, [s.pid for s in dead.stubs]) == ("dlrm_embedding", "2", [10])
    assert watcher.look() == []  # reported once


def test_a_stub_whose_version_unloads_is_not_dead(watch: Any) -> None:
    watcher, state, index = watch
    index.ready = set()
    state["processes"] = ([], {10, 11})
    assert watcher.look() == []


def test_a_stub_replaced_by_a_reload_of_its_ready_version_is_not_dead(watch: Any) -> None:
    watcher, state, _ = watch
    # Version 2 loaded again: new instances under new pids, the old ones exiting.
    state["processes"] = ([_stub(20), _stub(21, "dlrm_embedding_0_1")], {10, 11})
    assert watcher.look() == []
    # The new instances are watched as any other.
    state["processes"] = ([_stub(21, "dlrm_embedding_0_1")], {20})
    (dead,) = watcher.look()
    assert [s.pid for s in dead.stubs] == [20]
