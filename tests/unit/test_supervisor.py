"""The restart policy of ``python -m server serve`` and what it keeps, without a server.

The restarts themselves run against the real tritonserver in
``tests/integration/test_serve_restarts.py``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from bundle.errors import ConfigError
from server.launcher import _exit_status
from server.supervisor import MAX_BACKOFF_S, RestartPolicy, keep_log


def test_the_defaults_restart_a_few_times_with_a_short_first_backoff() -> None:
    policy = RestartPolicy()
    assert policy.enabled and policy.max_restarts >= 1
    assert policy.backoff(0) <= 1.0
    assert policy.describe() == f"at most {policy.max_restarts} in {policy.window_s:.0f} s"


def test_the_backoff_doubles_for_each_restart_in_the_window_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=0.5)
    assert [policy.backoff(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    assert policy.backoff(20) == MAX_BACKOFF_S
    assert RestartPolicy(backoff_s=0).backoff(3) == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"max_restarts": 1.5}, "max_restarts must be an integer"),
        ({"max_restarts": True}, "max_restarts must be an integer"),
        ({"window_s": 0}, "restart window must be > 0"),
        ({"backoff_s": -1}, "restart backoff must be in"),
        ({"backoff_s": MAX_BACKOFF_S + 1}, "restart backoff must be in"),
        ({"port_wait_s": -1}, "port_wait_s must be >= 0"),
    ],
)
def test_a_wrong_policy_fails_where_it_is_made(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RestartPolicy(**changes)  # type: ignore[arg-type]


def test_the_dead_servers_logs_are_kept_newest_first_up_to_a_bound(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    assert keep_log(log, 2) is None  # nothing to keep yet
    for text in ("first", "second", "third"):
        log.write_text(text)
        assert keep_log(log, 2) == tmp_path / "tritonserver.log.1"
        assert not log.exists()
    assert (tmp_path / "tritonserver.log.1").read_text() == "third"
    assert (tmp_path / "tritonserver.log.2").read_text() == "second"
    assert not (tmp_path / "tritonserver.log.3").exists()


def test_an_exit_is_seen_without_reaping_the_process() -> None:
    """Until reaped, a dead process's pid (its process group's id) cannot be reused, so the
    launcher can still end what it left in its group."""
    process = subprocess.Popen(["sleep", "30"])
    try:
        assert _exit_status(process) is None
        process.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _exit_status(process) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _exit_status(process) == -signal.SIGKILL
        assert process.returncode is None  # not reaped yet
        assert process.wait(timeout=5) == -signal.SIGKILL
        assert _exit_status(process) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
