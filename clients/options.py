"""Options of a connection to tritonserver: one frozen dataclass that checks itself.

The CLI builds a :class:`ClientOptions` from its flags and hands it to
:class:`clients.triton.TritonClient` or :class:`clients.aio.AsyncTritonClient`;
a wrong value fails here, at the line that set it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bundle.errors import ConfigError
from clients.retry import RetryPolicy

Protocol = Literal["http", "grpc"]
PROTOCOLS: tuple[str, ...] = ("http", "grpc")

#: ``none``: tensors travel in the request body; ``system``: POSIX shared
#: memory on the server's host; ``cuda``: CUDA IPC memory (gpu profile only).
SharedMemory = Literal["none", "system", "cuda"]
SHARED_MEMORY: tuple[str, ...] = ("none", "system", "cuda")

#: tritonserver's default ports per protocol, for a URL given without one.
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}


def default_url(protocol: str, host: str = "127.0.0.1") -> str:
    """``host:port`` of tritonserver's default endpoint for ``protocol``."""
    if protocol not in DEFAULT_PORTS:
        raise ConfigError(f"unknown protocol {protocol!r}; choose http or grpc")
    return f"{host}:{DEFAULT_PORTS[protocol]}"


def _check_url(url: str) -> None:
    if not isinstance(url, str) or not url:
        raise ConfigError("url must be a non-empty 'host:port'")
    if "://" in url:
        raise ConfigError(f"url must be 'host:port' without a scheme, got {url!r}")
    host, _, port = url.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"url must be 'host:port' with a port in 1..65535, got {url!r}")


@dataclass(frozen=True)
class ClientOptions:
    """How to reach one tritonserver endpoint and how to talk to it.

    Args:
        url: ``host:port`` of the protocol's endpoint (no scheme).
        protocol: ``http`` or ``grpc``.
        timeout_s: network timeout of each call, in seconds.
        shared_memory: where request and response tensors live: ``none`` (in the
            message), ``system`` (POSIX shared memory; client and server on one
            host) or ``cuda`` (needs the gpu profile and a GPU).
        validate: check every request against the model's metadata and config
            (names, dtypes, shapes, max batch size) before sending it.
        retry: retries of calls that fail with UNAVAILABLE.
        admin_key: the server's admin key, sent with shared-memory registration
            when the server restricts that API (never shown in reprs or messages).
    """

    url: str
    protocol: Protocol = "grpc"
    timeout_s: float = 30.0
    shared_memory: SharedMemory = "none"
    validate: bool = True
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    admin_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"unknown protocol {self.protocol!r}; choose http or grpc")
        _check_url(self.url)
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, got {self.timeout_s!r}")
        if self.shared_memory not in SHARED_MEMORY:
            raise ConfigError(
                f"unknown shared memory kind {self.shared_memory!r}; choose one of {', '.join(SHARED_MEMORY)}"
            )
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")

    @property
    def endpoint(self) -> str:
        """``protocol://host:port``, for messages."""
        return f"{self.protocol}://{self.url}"
