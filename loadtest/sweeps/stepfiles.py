"""Names of the files one sweep step's folder holds.

Written by the locust processes (:mod:`loadtest.sweeps.recorder`), read by the sweep
(:mod:`loadtest.sweeps.sweep`), which must not import locust itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bundle.errors import BundleError

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
