"""Free-port selection and "is this port taken?" checks for the local server."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping

from bundle.errors import ConfigError, ServerError


def free_ports(count: int, host: str = "127.0.0.1") -> tuple[int, ...]:
    """Ports that nothing listens on right now, all different.

    All sockets stay bound until every port is picked, so the kernel cannot
    hand out the same port twice.

    Args:
        count: how many ports.
        host: the interface they must be free on.

    Returns:
        ``count`` distinct port numbers.
    """
    if count < 1:
        raise ConfigError(f"count must be >= 1, got {count}")
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
    return tuple(ports)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether binding ``host:port`` would fail because something holds it.

    SO_REUSEADDR is set, as tritonserver sets it, so a port left in TIME_WAIT
    by a server that just stopped does not count as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def ensure_ports_free(ports: Mapping[str, int], host: str = "127.0.0.1") -> None:
    """Raise ServerError naming the first endpoint whose port is taken.

    Args:
        ports: port by endpoint name, e.g. ``{"http": 8000, "grpc": 8001}``.
        host: the interface the server will bind.
    """
    for endpoint, port in ports.items():
        if port_in_use(port, host):
            raise ServerError(
                f"{endpoint} port {port} on {host} is already in use (another tritonserver?); "
                f"stop that process or choose another port with --{endpoint}-port"
            )
