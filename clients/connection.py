"""What the sync and asyncio clients share: options checked once, the tritonclient
client built for them, and the per-protocol keyword arguments of each call."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from clients import protocol as wire
from clients.options import ClientOptions, Protocol, SharedMemory
from clients.retry import RetryPolicy
from clients.shm import cuda_unavailable
from clients.validation import ModelSpec


class Connection:
    """Base of :class:`clients.triton.TritonClient` and :class:`clients.aio.AsyncTritonClient`.

    Args:
        url: ``host:port`` of the protocol's endpoint.
        protocol: ``http`` or ``grpc``.
        timeout_s: network timeout of each call.
        shared_memory: ``none``, ``system`` (inputs and outputs through POSIX
            shared memory; the server must run on this host) or ``cuda``
            (not available in this bundle: raises ClientError).
        validate: check each request against the model's metadata and config
            before sending it (one metadata fetch per model, cached).
        retry: retries on UNAVAILABLE; the default policy when None.
        admin_key: the server's admin key, for shared-memory registration on a server that
            restricts it (see ``python -m server serve --admin-key``).

    Raises:
        ConfigError: an invalid option.
        ClientError: ``shared_memory="cuda"``.
    """

    #: Whether the subclass uses tritonclient's ``.aio`` modules.
    ASYNCIO: ClassVar[bool] = False

    def __init__(
        self,
        url: str,
        protocol: Protocol = "grpc",
        timeout_s: float = 30.0,
        *,
        shared_memory: SharedMemory = "none",
        validate: bool = True,
        retry: RetryPolicy | None = None,
        admin_key: str | None = None,
    ) -> None:
        options = ClientOptions(
            url=url,
            protocol=protocol,
            timeout_s=timeout_s,
            shared_memory=shared_memory,
            validate=validate,
            retry=retry or RetryPolicy(),
            admin_key=admin_key,
        )
        if options.shared_memory == "cuda":
            raise cuda_unavailable()
        self.options = options
        self.url = options.url
        self.protocol: Protocol = options.protocol
        self._module = wire.protocol_module(options.protocol, asyncio=self.ASYNCIO)
        self._client: Any = wire.new_client(options, asyncio=self.ASYNCIO)
        self._json = wire.json_kwargs(options)
        self._kwargs = wire.call_kwargs(options)
        self._admin = wire.admin_kwargs(options)
        self._specs: dict[tuple[str, str], ModelSpec] = {}
        self._closed = False
        self._setup()

    def _setup(self) -> None:
        """The subclass's own state (shared-memory regions, locks); nothing here."""

    @classmethod
    def from_options(cls, options: ClientOptions) -> Self:
        """A client for ``options`` (what the CLI builds)."""
        return cls(
            options.url,
            options.protocol,
            options.timeout_s,
            shared_memory=options.shared_memory,
            validate=options.validate,
            retry=options.retry,
            admin_key=options.admin_key,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options.endpoint}, shared_memory={self.options.shared_memory})"
