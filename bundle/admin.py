"""How a client shows tritonserver its admin key: the one definition the server (which sets up
the restriction, :mod:`server.security`) and the clients (which send the key) share."""

from __future__ import annotations

from bundle.errors import ConfigError

#: Environment variable the CLIs and docker-compose.yml read the key from.
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
#: The HTTP header that carries the key.
ADMIN_HEADER = "admin-key"
#: The gRPC metadata key that carries it (tritonserver adds the prefix).
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"


def admin_headers(key: str, protocol: str) -> dict[str, str]:
    """The header that opens the restricted APIs: pass as ``headers=`` to a tritonclient call.

    Args:
        key: the admin key.
        protocol: ``http`` or ``grpc``.
    """
    if protocol == "http":
        return {ADMIN_HEADER: key}
    if protocol == "grpc":
        return {GRPC_ADMIN_HEADER: key}
    raise ConfigError(f"unknown protocol {protocol!r}; choose http or grpc")
