"""Names of the files one sweep step's folder holds, and the server's view of a step's window.

Written by the locust processes (:mod:`loadtest.sweeps.recorder`) and the in-process engines,
read by the sweep (:mod:`loadtest.sweeps.sweep`), which must not import locust itself.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bundle.errors import BundleError
from loadtest.engine.server_cpu import SharedCores, allowed_cores, tree_cpu_s

if TYPE_CHECKING:
    from clients.triton import TritonClient

logger = logging.getLogger(__name__)

#: One per locust process that ran users: its counts and raw latency histogram.
LATENCY_GLOB = "latency-*.json"
#: Written by the locust master: Triton's statistics, difference over the window.
SERVER_STATS_FILE = "server-stats.json"
#: One per locust process, master included: its CPU seconds over the window.
CPU_GLOB = "client-cpu-*.json"
#: Triton's statistics counters a step records the difference of over its window.
SERVER_COUNTERS = (
    "inference_count",
    "execution_count",
    "success_count",
    "success_ns",
    "fail_count",
    "queue_ns",
    "compute_input_ns",
    "compute_infer_ns",
    "compute_output_ns",
)
#: One per process that ran users of a streamed step: the first row of every request it sent.
STREAM_GLOB = "stream-*.npy"
#: locust's own output.
LOCUST_LOG = "locust.log"


def latency_file(pid: int) -> str:
    """The latency file name of process ``pid``."""
    return f"latency-{pid}.json"


def cpu_file(pid: int) -> str:
    """The CPU file name of process ``pid``."""
    return f"client-cpu-{pid}.json"


def stream_file(pid: int) -> str:
    """The stream file name of process ``pid``."""
    return f"stream-{pid}.npy"


def server_counters(client: TritonClient, model: str) -> dict[str, int] | None:
    """Triton's :data:`SERVER_COUNTERS` of ``model`` now, or None (told) where they cannot be read."""
    try:
        stats = client.statistics(model)
    except BundleError as exc:
        logger.warning("could not read Triton's statistics of %s: %s", model, exc)
        return None
    return {key: int(getattr(stats[0], key)) for key in SERVER_COUNTERS} if stats else None


@dataclass(frozen=True)
class ServerReading:
    """The server at one instant of a step: Triton's counters of the model, and the CPU seconds of
    its process (with its children's) and the cores it may use.

    Attributes:
        counters: :data:`SERVER_COUNTERS` (None: not read, or could not be).
        cpu_s: the process tree's CPU seconds so far (None: no process given, or it is gone).
        cpus: the cores the process may run on (empty when ``cpu_s`` is None).
        at: when it was read (``time.time()``).
    """

    counters: dict[str, int] | None
    cpu_s: float | None
    cpus: frozenset[int]
    at: float


def read_server(client: TritonClient | None, model: str, pid: int | None) -> ServerReading:
    """The server now: ``model``'s counters through ``client`` (None: not read) and process ``pid``'s
    CPU and cores (None or 0: not read). A process that cannot be read is told once, not raised."""
    counters = server_counters(client, model) if client is not None else None
    cpu_s, cpus = None, frozenset[int]()
    if pid:
        try:
            cpu_s, cpus = tree_cpu_s(pid), allowed_cores(pid)
        except OSError as exc:
            logger.warning("could not read the CPU of server process %d: %s", pid, exc)
    return ServerReading(counters, cpu_s, cpus, time.time())


def server_cpu_between(before: ServerReading, after: ServerReading) -> dict[str, Any]:
    """The window's times and, where both readings have it, the server's CPU seconds over it and
    its cores: what :func:`shared_cores` reads."""
    fields: dict[str, Any] = {"from": before.at, "to": after.at}
    if before.cpu_s is not None and after.cpu_s is not None:
        fields["server_cpu_s"] = after.cpu_s - before.cpu_s
        fields["server_cpus"] = sorted(after.cpus)
    return fields


def server_document(model: str, before: ServerReading, after: ServerReading) -> dict[str, Any] | None:
    """What :data:`SERVER_STATS_FILE` holds for a window between two readings: the counters'
    difference, and :func:`server_cpu_between` (None: no counters)."""
    if before.counters is None or after.counters is None:
        return None
    delta = {key: after.counters[key] - before.counters[key] for key in SERVER_COUNTERS}
    return {"model": model, "delta": delta, **server_cpu_between(before, after)}


def record_server(
    folder: Path, model: str, before: ServerReading, after: ServerReading
) -> dict[str, Any] | None:
    """:func:`server_document` of the window, written to ``folder``'s :data:`SERVER_STATS_FILE`
    (the folder made where missing) and returned; None, and nothing written, without counters."""
    document = server_document(model, before, after)
    if document is not None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / SERVER_STATS_FILE).write_text(json.dumps(document))
    return document


def shared_cores(
    document: dict[str, Any] | None, client_cores: float, client_cpus: frozenset[int] | None
) -> SharedCores | None:
    """The load generator (``client_cores`` used, on ``client_cpus``, None: any) beside the server
    over a window's :func:`server_cpu_between` or :func:`server_document` (None: no document, or
    the server's CPU was not read)."""
    if not document or "server_cpu_s" not in document:
        return None
    seconds = float(document.get("to", 0.0)) - float(document.get("from", 0.0))
    if seconds <= 0:
        return None
    server_cores, server_cpus = document["server_cpu_s"] / seconds, frozenset(document["server_cpus"])
    return SharedCores.of(client_cores, client_cpus or allowed_cores(), server_cores, server_cpus)
