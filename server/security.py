"""The admin key that restricts tritonserver's admin APIs, and how it travels.

tritonserver 2.51 fences API groups behind a shared-secret header
(``--http-restricted-api=<apis>:<header>=<value>`` and
``--grpc-restricted-protocol=<protocols>:<header>=<value>``). The bundle
restricts the groups that change the server or reach beyond one request:

- ``model-repository``: load, unload and the repository index;
- ``shared-memory``: registering a region makes the server read and write
  host (or GPU) memory by name;
- ``trace`` and ``logging``: change what the server traces and logs.

Health, metadata, inference, model-config and statistics stay open: the
clients read the model config to validate requests, and statistics are public
on the metrics port anyway.

A request to a restricted API carries the key in the header ``admin-key``
(HTTP) or the metadata key ``triton-grpc-protocol-admin-key`` (gRPC; Triton
prefixes the name it was given). Without it, HTTP answers 403 and gRPC
UNAVAILABLE, both with "... is restricted, expecting header ...".

The key itself comes from the environment (``TRITON_ADMIN_KEY``) or a file,
never from a command-line option of the bundle. tritonserver reads it only
from its own argv, so it is visible in ``/proc/<pid>/cmdline`` (``ps``) to
users of the same host who may see that process; the launcher keeps it out of
its log lines and out of ``repr(ServerConfig)``.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

# Defined in bundle.admin, which the clients share; re-exported here for the server's callers.
from bundle.admin import ADMIN_HEADER as ADMIN_HEADER
from bundle.admin import ADMIN_KEY_ENV as ADMIN_KEY_ENV
from bundle.admin import GRPC_ADMIN_HEADER as GRPC_ADMIN_HEADER
from bundle.admin import admin_headers as admin_headers
from bundle.errors import ConfigError

#: Every API group tritonserver 2.51 can restrict (HTTP and gRPC share the names).
RESTRICTABLE_APIS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
#: What the bundle restricts when a key is set.
DEFAULT_RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")

MIN_KEY_LENGTH = 16
# A header value that needs no quoting anywhere: URL-safe base64 and hex tokens
# (``openssl rand -hex 32``, ``secrets.token_urlsafe``) fit; ':' and '=' would
# confuse tritonserver's parsing of the flag.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/-]+")

REDACTED = "<admin-key>"


def check_admin_key(key: str) -> None:
    """Raise ConfigError unless ``key`` is long enough and made of safe characters.

    The message never contains the key.
    """
    if not isinstance(key, str):
        raise ConfigError(f"the admin key must be a string, got {type(key).__name__}")
    if len(key) < MIN_KEY_LENGTH:
        raise ConfigError(
            f"the admin key must have at least {MIN_KEY_LENGTH} characters, got {len(key)} "
            f"(make one with `openssl rand -hex 32`)"
        )
    if not _KEY_PATTERN.fullmatch(key):
        raise ConfigError(
            "the admin key may hold only letters, digits and . _ ~ + / - "
            "(make one with `openssl rand -hex 32`)"
        )


def check_restricted_apis(apis: Iterable[str]) -> tuple[str, ...]:
    """The API group names, checked against :data:`RESTRICTABLE_APIS`; no duplicates, not empty."""
    if isinstance(apis, str):
        raise ConfigError(f"restricted_apis must be a sequence of names, not one string {apis!r}")
    result = tuple(apis)
    unknown = [api for api in result if api not in RESTRICTABLE_APIS]
    if unknown:
        raise ConfigError(f"unknown API group(s) {unknown}; choose from {', '.join(RESTRICTABLE_APIS)}")
    if len(set(result)) != len(result):
        raise ConfigError(f"restricted_apis names a group twice: {list(result)}")
    if not result:
        raise ConfigError("restricted_apis must name at least one API group")
    return result


def read_admin_key(key_file: Path | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The admin key from ``key_file`` if given, else from ``$TRITON_ADMIN_KEY``; None if neither.

    A file holds the key on its first line (surrounding whitespace is dropped).

    Raises:
        ConfigError: the file is missing or unreadable, or the key is invalid.
    """
    if key_file is not None:
        try:
            text = Path(key_file).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the admin key file {key_file}: {exc}") from None
        key = text.strip()
        where = f"admin key file {key_file}"
    else:
        env = os.environ if environ is None else environ
        key = env.get(ADMIN_KEY_ENV, "").strip()
        if not key:
            return None
        where = f"${ADMIN_KEY_ENV}"
    try:
        check_admin_key(key)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return key


def generate_admin_key() -> str:
    """A fresh random key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def restricted_api_args(apis: Iterable[str], key: str) -> list[str]:
    """The two tritonserver flags that put ``apis`` behind ``key`` on HTTP and gRPC."""
    group = ",".join(apis)
    return [
        f"--http-restricted-api={group}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={group}:{ADMIN_HEADER}={key}",
    ]


def redact(text: str, key: str | None) -> str:
    """``text`` with every occurrence of ``key`` replaced by ``<admin-key>``."""
    return text.replace(key, REDACTED) if key else text
