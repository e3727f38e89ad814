"""Small HTTP queries against a running tritonserver (KServe v2 REST API).

Plain ``http.client`` with no proxy handling on purpose: the server is local,
and an ``http_proxy`` in the environment must not route these through a proxy.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from bundle.errors import ServerError

# States of a version that still holds (or is taking) the model's instances.
_IN_USE = ("LOADING", "READY", "UNLOADING")
# Seconds between two polls of the server while waiting.
_POLL_S = 0.02


@dataclass(frozen=True)
class ModelStatus:
    """One entry of the repository index.

    Args:
        name: the model's name.
        version: its version, or "" if the model was never loaded.
        state: ``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE`` or ""
            (never loaded, explicit mode).
        reason: why the model is unavailable, as tritonserver says it.
    """

    name: str
    version: str
    state: str
    reason: str

    @property
    def failed(self) -> bool:
        """Whether the model tried to load and could not (not merely unloaded)."""
        return self.state == "UNAVAILABLE" and self.reason not in ("", "unloaded")


class ServerProbe:
    """Health, metadata and repository-index queries over HTTP.

    Args:
        host: the server's HTTP address.
        port: the server's HTTP port.
        timeout_s: per-request socket timeout.
        headers: sent with every request, e.g. the admin key's header when the
            repository API is restricted (:func:`server.security.admin_headers`).
    """

    def __init__(
        self, host: str, port: int, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None
    ) -> None:
        self._host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._port = port
        self._timeout_s = timeout_s
        self._headers = dict(headers or {})

    def _request(self, method: str, path: str, timeout_s: float | None = None) -> tuple[int, bytes]:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        connection = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        try:
            connection.request(method, path, body=b"" if method == "POST" else None, headers=self._headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def _status_ok(self, path: str) -> bool:
        try:
            status, _ = self._request("GET", path)
        except OSError:
            return False
        return status == 200

    def is_live(self) -> bool:
        """Whether the HTTP endpoint answers and the server says it is live."""
        return self._status_ok("/v2/health/live")

    def is_ready(self) -> bool:
        """Whether the server is ready: with strict readiness, every model loaded."""
        return self._status_ok("/v2/health/ready")

    def is_model_ready(self, name: str) -> bool:
        """Whether the server says model ``name`` (its latest version) is ready to serve."""
        return self._status_ok(f"/v2/models/{quote(name, safe='')}/ready")

    def _json(self, method: str, path: str, timeout_s: float | None = None) -> Any:
        try:
            status, body = self._request(method, path, timeout_s)
        except OSError as exc:
            raise ServerError(
                f"tritonserver at {self._host}:{self._port} did not answer {path}: {exc}"
            ) from exc
        if status != 200:
            raise ServerError(f"tritonserver answered {path} with HTTP {status}: {_error_text(body)}")
        return json.loads(body) if body else None

    def server_metadata(self) -> dict[str, Any]:
        """The server's name, version and extensions (``GET /v2``)."""
        metadata: dict[str, Any] = self._json("GET", "/v2")
        return metadata

    def repository_index(self) -> list[ModelStatus]:
        """Every model in the repository with its state (``POST /v2/repository/index``)."""
        entries = self._json("POST", "/v2/repository/index")
        return [
            ModelStatus(
                name=str(entry.get("name", "")),
                version=str(entry.get("version", "")),
                state=str(entry.get("state", "")),
                reason=str(entry.get("reason", "")),
            )
            for entry in entries
        ]

    def load_model(self, name: str, timeout_s: float = 120.0) -> None:
        """Load (or reload) ``name`` through the repository API; returns once it is ready.

        Raises:
            ServerError: the server refused (e.g. 403 without the admin key, or
                a model that failed to load) or did not answer in ``timeout_s``.
        """
        self._json("POST", f"/v2/repository/models/{quote(name, safe='')}/load", timeout_s)

    def unload_model(self, name: str, timeout_s: float = 60.0) -> None:
        """Ask tritonserver to unload ``name`` through the repository API (in-flight requests
        finish first). It answers before the model's instances are released:
        :meth:`wait_unloaded` waits for that."""
        self._json("POST", f"/v2/repository/models/{quote(name, safe='')}/unload", timeout_s)

    def wait_unloaded(self, name: str, timeout_s: float) -> None:
        """Return once the repository index shows no version of ``name`` loading, ready or
        unloading.

        Raises:
            ServerError: a version of it is still there after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            busy = [e for e in self.repository_index() if e.name == name and e.state in _IN_USE]
            if not busy:
                return
            if time.monotonic() >= deadline:
                states = ", ".join(f"version {e.version} {e.state}" for e in busy)
                raise ServerError(f"model '{name}' was not unloaded after {timeout_s:g} s ({states})")
            time.sleep(_POLL_S)

    def wait_model_ready(self, name: str, timeout_s: float) -> None:
        """Return once ``name`` answers ready.

        Raises:
            ServerError: it does not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not self.is_model_ready(name):
            if time.monotonic() >= deadline:
                raise ServerError(f"model '{name}' loaded but did not report ready within {timeout_s:g} s")
            time.sleep(_POLL_S)


def _error_text(body: bytes) -> str:
    """What an error answer says, in one line: the text of its ``{"error": ...}``, or the body."""
    text = body.decode(errors="replace")
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), str):
        text = decoded["error"]
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
