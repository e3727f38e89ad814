"""Integration-test fixtures: real local tritonservers, started per repository.

Usage in any integration test module::

    @pytest.fixture(scope="module")
    def server(start_triton, my_repository: Path) -> Iterator[LocalServer]:
        server = start_triton(my_repository)        # ready: every model READY
        yield server
        server.stop()                               # optional: else at session end

    def test_something(server: LocalServer) -> None:
        client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bundle.errors import ServerError
from server import LocalServer, ServerConfig, TritonInstallation

StartTriton = Callable[..., LocalServer]


@pytest.fixture(scope="session")
def triton_installation() -> TritonInstallation:
    """The nvidia-pytriton wheel's tritonserver; skips the test where it is absent."""
    try:
        return TritonInstallation.locate()
    except ServerError as exc:
        pytest.skip(f"no local tritonserver: {exc}")


@pytest.fixture(scope="session")
def start_triton(
    triton_installation: TritonInstallation, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartTriton]:
    """Factory: ``start_triton(repository, **config_options) -> LocalServer``.

    Each call starts one tritonserver on ``repository`` on three free ports of
    127.0.0.1, with its log in a temporary folder (``server.log_file``), and
    returns once every model is ready; ``config_options`` are further
    ``ServerConfig`` fields (``model_control_mode``, ``load_models``, ...).
    A failed start raises ``ServerError`` with the server already stopped.
    Every server still running at the end of the session is stopped by its
    process id (SIGTERM, then SIGKILL of its process group after a timeout).
    """
    servers: list[LocalServer] = []
    logs = tmp_path_factory.mktemp("tritonserver-logs")
    counter = itertools.count()

    def start(repository: Path, **options: Any) -> LocalServer:
        options.setdefault("log_file", logs / f"{Path(repository).name}-{next(counter)}.log")
        server = LocalServer(
            ServerConfig.with_free_ports(Path(repository), **options),
            installation=triton_installation,
        )
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()
