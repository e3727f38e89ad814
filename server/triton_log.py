"""Reads tritonserver's log for the reasons a start failed.

Used when the process exits before its HTTP endpoint could be asked, e.g.
when a port is taken (tritonserver loads the models first, then fails to bind).
"""

from __future__ import annotations

import re
from pathlib import Path

# main.cc: "failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already in use"
_SERVICE_FAILED = re.compile(r'failed to start (\w+) service: (.*?)"?\s*$', re.MULTILINE)
# model_lifecycle.cc: "failed to load 'name' version 1: Invalid argument: ..."
_MODEL_FAILED = re.compile(r"failed to load '([^']+)' version (\d+): (.*?)\"?\s*$", re.MULTILINE)
_LOADER_FAILED = re.compile(r"error while loading shared libraries: .*$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^E\d{4} .*$", re.MULTILINE)
# tritonserver.cc, when it cannot read the repository (it keeps running with --exit-on-error=false):
# "Internal: Unable to create S3 filesystem client. Check account credentials. ..."
_REPOSITORY_FAILED = re.compile(r'^E\d{4} [^\]]* tritonserver\.cc:\d+\] "(.*?)"?\s*$', re.MULTILINE)


def read_tail(path: Path, max_bytes: int = 256 * 1024) -> str:
    """The last ``max_bytes`` of a log file as text ("" if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            return handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def service_failures(text: str) -> list[str]:
    """Endpoints that failed to start, e.g. ``GRPC service: Unavailable - Socket '...' already in use``."""
    return [f"{name} service: {reason.strip()}" for name, reason in _SERVICE_FAILED.findall(text)]


def model_failures(text: str) -> dict[str, str]:
    """Failed model loads by model name: ``"version 1: <reason>"``.

    tritonserver escapes newlines inside a quoted log message; they are restored.
    """
    return {
        name: f"version {version}: " + reason.replace("\\n", "\n").strip()
        for name, version, reason in _MODEL_FAILED.findall(text)
    }


# model_repository_manager.cc, for a model folder whose config.pbtxt does not parse: the model is
# left out of the index's states (tritonserver 2.51 reports no failure for it, and says it is ready):
# "Poll failed for model directory 'name': failed to read text proto from /m/name/config.pbtxt"
_UNREADABLE = re.compile(r"Poll failed for model directory '([^']+)': (.*?)\"?\s*$", re.MULTILINE)


def unreadable_models(text: str) -> dict[str, str]:
    """Model folders tritonserver could not read (a config.pbtxt that does not parse), by name."""
    return {name: reason.replace("\\n", " ").strip() for name, reason in _UNREADABLE.findall(text)}


def last_error(text: str) -> str:
    """The most telling error line of a log: a loader error, else the last ``E`` line."""
    loader = _LOADER_FAILED.findall(text)
    if loader:
        return str(loader[-1]).strip()
    errors = [line for line in _ERROR_LINE.findall(text) if "CudaDriverHelper" not in line]
    return errors[-1].strip() if errors else ""


def repository_failures(text: str) -> list[str]:
    """Why tritonserver could not read its model repository (e.g. an unreachable S3 endpoint)."""
    return [reason.strip() for reason in _REPOSITORY_FAILED.findall(text)]


# server.cc, once a second while a stopping tritonserver waits for its models to unload:
# "Timeout 9: Found 2 live models and 0 in-flight non-inference requests"
_UNLOAD_WAIT = re.compile(
    r"Timeout -?\d+: Found (\d+) live models and (\d+) in-flight non-inference requests"
)
_UNLOADING_STARTED = "All models are stopped, unloading models"


def models_left_unloading(text: str) -> int | None:
    """How many models a stopping tritonserver still waits for, from its last unload-wait line.

    Returns:
        The count of live models, once in-flight inferences are done, tritonserver is
        unloading its models and no non-inference request is in flight; None before
        that (or when the log does not say).
    """
    started = text.rfind(_UNLOADING_STARTED)
    if started < 0:
        return None
    waits = _UNLOAD_WAIT.findall(text, started)
    if not waits:
        return None
    live, requests = waits[-1]
    return int(live) if int(requests) == 0 else None
