"""gRPC's Python client, set up for a load generator before gRPC starts.

grpcio's default client runs on its EventEngine: the EventEngine's own threads read the
connection and hand each answer to the thread waiting on its call, a wake-up between threads on
every request. With the ``event_engine_client`` experiment turned off (and the EventEngine's
endpoints with it), the waiting thread polls the connection itself: a load generator's client
then takes less CPU per request, and adds less latency over perf_analyzer's C++ client
(docs/loadtests-engines.md has the measurement).

gRPC reads ``GRPC_EXPERIMENTS`` once, when it is imported. :func:`use_polling_client` sets it
for that import and removes it again, so the processes a load test starts (tritonserver,
perf_analyzer, locust) get the environment they were given. The entry points that generate load
(``python -m loadtest``, ``python -m lab``) call it before anything imports gRPC.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

logger = logging.getLogger(__name__)

#: The variable gRPC reads its experiments from (a comma-separated list; ``-name`` turns one off).
EXPERIMENTS_VARIABLE = "GRPC_EXPERIMENTS"
#: What :func:`use_polling_client` sets it to for gRPC's import: the EventEngine client and its
#: endpoints off.
POLLING_CLIENT = "-event_engine_client,-event_engine_for_all_other_endpoints"


def use_polling_client() -> bool:
    """Import gRPC with the EventEngine client turned off; whether it was.

    It is not where gRPC was imported already (too late: this logs a warning), nor where the
    environment sets ``GRPC_EXPERIMENTS`` (the user's choice stands)."""
    if EXPERIMENTS_VARIABLE in os.environ:
        return False
    if "grpc" in sys.modules:
        logger.warning("gRPC was imported before its client was set up: it keeps its default client")
        return False
    os.environ[EXPERIMENTS_VARIABLE] = POLLING_CLIENT
    try:
        importlib.import_module("grpc")
    finally:
        del os.environ[EXPERIMENTS_VARIABLE]
    return True
