"""Run the bundle's CLIs as a user does: ``python -m <package> ...`` in a process of its own.

TensorFlow and PyTorch never load into one process, so tests that train or export
through both families run each command in a child process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_module(
    *args: str, env: Mapping[str, str] | None = None, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m *args``; its output.

    Raises:
        RuntimeError: ``check`` and the command exited non-zero (its output in the message).
    """
    command = [sys.executable, "-m", *args]
    environment = None if env is None else dict(env)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=environment, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done
