"""What went wrong in a call to tritonserver, as one line a user can act on.

tritonclient reports failures as ``InferenceServerException`` (with an HTTP
status such as ``"404"`` or a gRPC code such as ``"StatusCode.NOT_FOUND"``),
and transport failures as the transport's own exceptions
(``ConnectionRefusedError`` from the sync HTTP client, ``aiohttp`` errors from
the asyncio one). This module classifies them, so that retries happen on
UNAVAILABLE (and a model being reloaded) only, and turns them into :class:`~bundle.errors.ClientError`.
"""

from __future__ import annotations

import errno

from bundle.errors import ClientError

#: gRPC status names (as in ``grpc.StatusCode``) of a server that cannot take the call now.
_UNAVAILABLE_GRPC = "UNAVAILABLE"
_UNAVAILABLE_HTTP = 503
_NOT_FOUND_GRPC = "NOT_FOUND"
_NOT_FOUND_HTTP = 404
_TIMEOUT_GRPC = "DEADLINE_EXCEEDED"


def message(exc: BaseException) -> str:
    """The exception's text on one line, without tritonclient's ``[status]`` prefix."""
    text_method = getattr(exc, "message", None)
    text = text_method() if callable(text_method) else str(exc)
    text = " ".join(str(text or type(exc).__name__).split())
    # Triton prefixes request errors with the id, which is never set here.
    return text.removeprefix("[request id: <id_unknown>] ")


def _status(exc: BaseException) -> str | None:
    status_method = getattr(exc, "status", None)
    if not callable(status_method):
        return None
    status = status_method()
    return None if status is None else str(status)


def grpc_code(exc: BaseException) -> str | None:
    """``UNAVAILABLE``, ``NOT_FOUND``, ... for a gRPC failure, else None."""
    status = _status(exc)
    if status is None or not status.startswith("StatusCode."):
        return None
    return status.removeprefix("StatusCode.")


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of an HTTP failure (``404``, ``503``, ...), else None."""
    status = _status(exc)
    return int(status) if status is not None and status.isdigit() else None


def is_connection_refused(exc: BaseException) -> bool:
    """Whether nothing listens at the address (refused connection, any transport)."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    # aiohttp's ClientConnectorError carries the OSError of the connect call.
    if isinstance(getattr(exc, "os_error", None), ConnectionRefusedError):
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED:
        return True
    return grpc_code(exc) == _UNAVAILABLE_GRPC and "connection refused" in message(exc).lower()


#: Transport exceptions, by class name, of an HTTP connection the server closed under the client:
#: geventhttpclient's (the sync HTTP client; it retries idempotent methods itself, never the POST
#: of an inference) and aiohttp's (the asyncio one). Named, so that neither is imported here.
_DROPPED_CONNECTION_CLASSES = frozenset({"HTTPConnectionClosed", "ServerDisconnectedError"})


def is_connection_dropped(exc: BaseException) -> bool:
    """Whether the server closed or reset the connection under the call (it restarted, or a pooled
    HTTP connection had gone stale)."""
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return True
    return any(cls.__name__ in _DROPPED_CONNECTION_CLASSES for cls in type(exc).__mro__)


def is_unavailable(exc: BaseException) -> bool:
    """Whether the call failed because the server cannot take it now, so a retry may succeed.

    True for gRPC UNAVAILABLE, HTTP 503, a refused connection and a connection
    the server dropped (inference has no side effects, so sending it again is
    safe), and for the two answers tritonserver 2.51 gives while a model whose
    backend process died is being reloaded (:func:`is_model_reloading`); False for
    everything else, INVALID_ARGUMENT and an unknown model included, and for a call
    refused by a restricted API (Triton answers those with gRPC UNAVAILABLE).
    """
    if is_restricted(exc):
        return False
    return (
        is_connection_refused(exc)
        or is_connection_dropped(exc)
        or grpc_code(exc) == _UNAVAILABLE_GRPC
        or http_status(exc) == _UNAVAILABLE_HTTP
        or is_model_reloading(exc)
    )


#: tritonserver's text for a known model none of whose versions is ready (loading or unloading).
_NO_VERSION_READY = "has no available versions"
#: ... and for an instance whose python-backend stub process died (before the server reloads it).
_DEAD_STUB = ("Stub process", "is not healthy")


def is_model_reloading(exc: BaseException) -> bool:
    """Whether a known model cannot answer for now: none of its versions is ready (NOT_FOUND "has no
    available versions", while it unloads or loads), or its backend process has just died (INTERNAL
    "Stub process ... is not healthy", which the local server turns into a reload, and compose and
    Kubernetes into a restart). tritonserver 2.51 answers neither with UNAVAILABLE."""
    text = message(exc)
    if is_not_found(exc):
        return _NO_VERSION_READY in text
    internal = grpc_code(exc) == "INTERNAL" or http_status(exc) == 500
    return internal and all(part in text for part in _DEAD_STUB)


def is_restricted(exc: BaseException) -> bool:
    """Whether the server refused the call because its API is restricted behind a key."""
    return http_status(exc) == 403 or "protocol is restricted" in message(exc)


def is_not_found(exc: BaseException) -> bool:
    """Whether the server said the model (or version) does not exist."""
    return grpc_code(exc) == _NOT_FOUND_GRPC or http_status(exc) == _NOT_FOUND_HTTP


def is_timeout(exc: BaseException) -> bool:
    """Whether the call ran past its timeout."""
    return isinstance(exc, TimeoutError) or grpc_code(exc) == _TIMEOUT_GRPC


def is_transport_failure(exc: BaseException) -> bool:
    """Whether the call never got an answer from the server (not a server-side error)."""
    return is_unavailable(exc) or is_timeout(exc) or (isinstance(exc, OSError) and _status(exc) is None)


def unreachable(endpoint: str, protocol: str, exc: BaseException) -> ClientError:
    """``cannot reach tritonserver at HOST:PORT over PROTOCOL (reason)``."""
    if is_connection_refused(exc):
        reason = "connection refused"
    elif is_connection_dropped(exc):
        reason = f"connection closed by the server: {message(exc)}"
    else:
        reason = message(exc)
    return ClientError(f"cannot reach tritonserver at {endpoint} over {protocol} ({reason})")


def client_error(url: str, protocol: str, what: str, exc: BaseException) -> ClientError:
    """A ClientError for a failed call: unreachable server, or the server's own answer.

    Args:
        url: ``host:port`` called.
        protocol: ``http`` or ``grpc``.
        what: what was asked, e.g. ``model 'dlrm_onnx'``, for the message.
        exc: what tritonclient or the transport raised.
    """
    if is_timeout(exc):
        return ClientError(f"{what}: no answer from tritonserver at {url} over {protocol} within the timeout")
    if is_transport_failure(exc):
        return unreachable(url, protocol, exc)
    return ClientError(f"{what} at {protocol}://{url}: {message(exc)}")
