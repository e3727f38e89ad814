"""gRPC's client set-up for load generation (bundle.grpc_client), each case in a fresh interpreter:
gRPC reads its experiments once per process, when it is imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bundle.grpc_client import EXPERIMENTS_VARIABLE

ROOT = Path(__file__).resolve().parents[2]

# Sets up the client, says whether it did and what the environment holds after, then what a process
# it starts sees.
_PROBE = """
import os, subprocess, sys
{before}
from bundle.grpc_client import use_polling_client
print(use_polling_client())
import grpc  # what the load generator then does
print(os.environ.get("GRPC_EXPERIMENTS"))
child = "import os; print(os.environ.get('GRPC_EXPERIMENTS'))"
seen = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
print(seen.stdout.strip())
"""


def _probe(before: str = "", experiments: str | None = None) -> tuple[list[str], str]:
    env = {key: value for key, value in os.environ.items() if key != EXPERIMENTS_VARIABLE}
    if experiments is not None:
        env[EXPERIMENTS_VARIABLE] = experiments
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(before=before)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split(), done.stderr


def test_grpc_starts_without_the_event_engine_client_and_children_do_not_inherit_it() -> None:
    lines, stderr = _probe()
    assert lines == ["True", "None", "None"]
    # gRPC names an experiment it does not know on stderr: the pinned grpcio knows each of ours.
    assert "Unknown experiment" not in stderr


def test_grpc_would_name_an_unknown_experiment() -> None:
    # The check above can fail: an experiment gRPC does not know is named on stderr.
    lines, stderr = _probe(experiments="-no_such_experiment")
    assert lines == ["False", "-no_such_experiment", "-no_such_experiment"]
    assert "Unknown experiment: no_such_experiment" in stderr
    assert stderr.count("Unknown experiment") == 1  # the user's name alone: none of ours was set


def test_the_users_experiments_stand() -> None:
    lines, _ = _probe(experiments="event_engine_client")
    assert lines == ["False", "event_engine_client", "event_engine_client"]


def test_too_late_once_grpc_is_imported_and_it_says_so() -> None:
    lines, stderr = _probe(before="import grpc")
    assert lines == ["False", "None", "None"]
    assert "gRPC was imported before its client was set up" in stderr
