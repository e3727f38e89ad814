"""What differs between tritonclient's HTTP and gRPC clients, in one place.

The two take different keyword arguments (gRPC has ``as_json`` and a
per-call ``client_timeout``; HTTP answers JSON and sets its timeouts on the
connection) and shape some answers differently (the repository index is a
list over HTTP, ``{"models": [...]}`` over gRPC). The sync and asyncio
clients call through these helpers so they agree on every protocol.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from bundle.admin import admin_headers
from bundle.errors import ClientError
from clients.options import ClientOptions


def protocol_module(protocol: str, asyncio: bool = False) -> ModuleType:
    """``tritonclient.http``/``grpc``, or their ``.aio`` form (imported on first use)."""
    if protocol not in ("http", "grpc"):
        raise ClientError(f"unknown protocol {protocol!r}; choose http or grpc")
    return importlib.import_module(f"tritonclient.{protocol}{'.aio' if asyncio else ''}")


def json_kwargs(options: ClientOptions) -> dict[str, Any]:
    """Keyword arguments of a metadata-style call that should answer JSON."""
    if options.protocol == "grpc":
        return {"as_json": True, "client_timeout": options.timeout_s}
    return {}


def call_kwargs(options: ClientOptions) -> dict[str, Any]:
    """Keyword arguments of any other call (health, shared memory, inference)."""
    if options.protocol == "grpc":
        return {"client_timeout": options.timeout_s}
    return {}


def admin_kwargs(options: ClientOptions) -> dict[str, Any]:
    """Keyword arguments of a restricted call (shared-memory registration): the call's own and,
    with an admin key, the header that carries it."""
    kwargs = call_kwargs(options)
    if options.admin_key:
        kwargs["headers"] = admin_headers(options.admin_key, options.protocol)
    return kwargs


def grpc_channel_args(options: ClientOptions) -> list[tuple[str, Any]]:
    """tritonclient's default gRPC channel arguments, with reconnects paced by ``options.retry``.

    A gRPC channel that failed to connect waits its own reconnect backoff
    (1 s at first, growing) and fails every call with UNAVAILABLE meanwhile,
    so retries spaced 0.1 s apart would never reach a server that came up in
    between. Its backoff follows the retry policy here instead.
    """
    from tritonclient.grpc import KeepAliveOptions
    from tritonclient.grpc._client import MAX_GRPC_MESSAGE_SIZE

    keepalive = KeepAliveOptions()
    initial_ms = max(int(options.retry.initial_backoff_s * 1000), 10)
    max_ms = max(int(options.retry.max_backoff_s * 1000), initial_ms)
    return [
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_SIZE),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", initial_ms),
        ("grpc.min_reconnect_backoff_ms", initial_ms),
        ("grpc.max_reconnect_backoff_ms", max_ms),
    ]


def new_client(options: ClientOptions, asyncio: bool = False) -> Any:
    """A tritonclient ``InferenceServerClient`` for ``options`` (no call made yet).

    The HTTP clients keep their connections open between calls (keep-alive);
    a gRPC client keeps one channel.
    """
    module = protocol_module(options.protocol, asyncio)
    try:
        if options.protocol == "http" and asyncio:
            return module.InferenceServerClient(options.url, conn_timeout=options.timeout_s)
        if options.protocol == "http":
            return module.InferenceServerClient(
                options.url, connection_timeout=options.timeout_s, network_timeout=options.timeout_s
            )
        return module.InferenceServerClient(options.url, channel_args=grpc_channel_args(options))
    except Exception as exc:  # tritonclient raises several unrelated types here
        raise ClientError(f"cannot create a {options.protocol} client for {options.url}: {exc}") from exc


@dataclass(frozen=True)
class ModelState:
    """One entry of the server's repository index.

    Attributes:
        name: model name.
        version: loaded version, "" when never loaded.
        state: ``READY``, ``LOADING``, ``UNAVAILABLE``, ... or "" (never loaded).
        reason: why it is not ready, as the server says it.
    """

    name: str
    version: str
    state: str
    reason: str

    @property
    def ready(self) -> bool:
        return self.state == "READY"


def index_entries(document: Any) -> list[ModelState]:
    """The repository index in either protocol's form, as :class:`ModelState` entries."""
    entries = document.get("models", []) if isinstance(document, Mapping) else document
    return [
        ModelState(
            name=str(entry.get("name", "")),
            version=str(entry.get("version", "")),
            state=str(entry.get("state", "")),
            reason=str(entry.get("reason", "")),
        )
        for entry in entries or []
    ]


def model_problem(model: str, options: ClientOptions, index: list[ModelState]) -> ClientError | None:
    """Why ``model`` cannot serve, judged from the repository index; None if it looks ready."""
    states = {entry.name: entry for entry in index}
    entry = states.get(model)
    if entry is None:
        served = ", ".join(sorted(states)) or "no models"
        return ClientError(f"unknown model {model!r} at {options.endpoint}; the server has: {served}")
    if not entry.ready:
        state = entry.state or "not loaded"
        reason = f": {entry.reason}" if entry.reason else ""
        return ClientError(f"model {model!r} at {options.endpoint} is not ready ({state}{reason})")
    return None
