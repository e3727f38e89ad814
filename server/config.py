"""The local server's configuration: one frozen dataclass that checks itself."""

from __future__ import annotations

import enum
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.s3 import S3Url, is_s3_url
from server.dead_models import DeadModelAction
from server.ports import free_ports
from server.security import DEFAULT_RESTRICTED_APIS, check_admin_key, check_restricted_apis

DEFAULT_LOG_FILE = Path("logs/tritonserver.log")

# Flags the launcher sets itself; passing them again in extra_args would make
# the server disagree with what LocalServer believes (ports, addresses, paths).
_MANAGED_FLAGS = (
    "--model-repository",
    "--model-store",
    "--backend-directory",
    "--http-port",
    "--grpc-port",
    "--metrics-port",
    "--http-address",
    "--grpc-address",
    "--metrics-address",
    "--model-control-mode",
    "--load-model",
    "--exit-on-error",
    "--exit-timeout-secs",
    "--log-file",
    "--log-verbose",
    # The restriction carries the admin key: only ServerConfig.admin_key sets it,
    # so the launcher knows the key and keeps it out of its logs.
    "--http-restricted-api",
    "--grpc-restricted-protocol",
)


def is_loopback(address: str) -> bool:
    """Whether endpoints bound to ``address`` are reachable from this machine only."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


class ModelControlMode(enum.StrEnum):
    """How tritonserver loads models (its ``--model-control-mode``).

    ``none`` loads every model in the repository at start and never reloads;
    ``explicit`` loads only the models named by ``load_models`` (or later
    through the repository API); ``poll`` loads every model and reloads the ones
    whose files change (every ``--repository-poll-secs``, 15 s by default: give it
    in ``extra_args``).
    """

    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


def _check_port(name: str, port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"{name} must be an integer in 1..65535, got {port!r}")


@dataclass(frozen=True)
class ServerConfig:
    """Everything needed to start one local tritonserver.

    Args:
        repository: the Triton model repository to serve: a directory, or an ``s3://`` URL in
            tritonserver's form (:mod:`bundle.s3`), kept as a string and passed on as it is;
            tritonserver downloads that repository at start, with the credentials of the
            usual AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
            ``AWS_DEFAULT_REGION``) in this process's environment.
        http_port: port of the HTTP/REST endpoint (KServe v2 protocol).
        grpc_port: port of the gRPC endpoint.
        metrics_port: port of the Prometheus metrics endpoint (``/metrics``).
        address: the interface all three endpoints bind to; ``127.0.0.1``
            keeps the server private to this machine.
        log_file: where the server's stdout and stderr go (truncated at start).
        model_control_mode: ``none`` (load everything) or ``explicit``.
        load_models: models to load at start; only with ``explicit``.
        log_verbose: tritonserver's ``--log-verbose`` level (0 = off).
        startup_timeout_s: how long ``start()`` waits for readiness.
        exit_timeout_s: how long tritonserver may drain in-flight requests
            on stop; the launcher kills it if it takes 5 s longer than that.
        extra_args: further tritonserver flags, e.g. ``("--backend-config=python,
            shm-default-byte-size=4194304",)``; flags the launcher manages
            (ports, addresses, repository, restrictions, ...) are rejected.
        admin_key: when set, the ``restricted_apis`` of both endpoints answer
            only requests that carry this key (see :mod:`server.security`);
            at least 16 characters of ``[A-Za-z0-9._~+/-]``. Never shown by
            ``repr``; :func:`server.security.read_admin_key` reads it from
            ``$TRITON_ADMIN_KEY`` or a file.
        restricted_apis: the API groups behind the key (default:
            model-repository, shared-memory, trace, logging).
        allow_open_admin_apis: serve on a non-loopback ``address`` without an
            admin key; refused by default, because anyone who reaches the port
            could then load and unload models and register shared memory.
        on_dead_model: what the launcher does when a model's python stub dies
            (:mod:`server.dead_models`): ``reload`` it (explicit model control
            only: tritonserver refuses the repository API otherwise) or ``stop``
            the server; None: ``reload`` with explicit model control, else ``stop``.
        allow_failed_models: start even when some models fail to load (a damaged file, a
            config that does not parse): each is named in one warning line and the others
            serve; the server's readiness stays non-200 (``--strict-readiness``), each
            served model's own ready endpoint says 200. False: such a start is an error.
        cpus: the cores tritonserver and its backends' processes run on (None: any), e.g. the
            cores a load generator on the same machine leaves free.
    """

    repository: Path | str
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = "127.0.0.1"
    log_file: Path = DEFAULT_LOG_FILE
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    load_models: tuple[str, ...] = ()
    log_verbose: int = 0
    startup_timeout_s: float = 120.0
    exit_timeout_s: int = 10
    extra_args: tuple[str, ...] = field(default=())
    admin_key: str | None = field(default=None, repr=False)
    restricted_apis: tuple[str, ...] = DEFAULT_RESTRICTED_APIS
    allow_open_admin_apis: bool = False
    on_dead_model: DeadModelAction | None = None
    allow_failed_models: bool = False
    cpus: frozenset[int] | None = None

    def __post_init__(self) -> None:
        # Accept str paths and lists from callers, store canonical types so the
        # frozen config stays hashable and comparable.
        if is_s3_url(self.repository):
            object.__setattr__(self, "repository", str(S3Url.parse(str(self.repository))))
        else:
            object.__setattr__(self, "repository", Path(self.repository))
        object.__setattr__(self, "log_file", Path(self.log_file))
        if self.cpus is not None:
            cpus = frozenset(int(core) for core in self.cpus)
            allowed = os.sched_getaffinity(0)
            if not cpus or not cpus <= allowed:
                raise ConfigError(
                    f"server cores {sorted(cpus)} are not among this process's cores {sorted(allowed)}"
                )
            object.__setattr__(self, "cpus", cpus)
        try:
            object.__setattr__(self, "model_control_mode", ModelControlMode(self.model_control_mode))
        except ValueError:
            choices = ", ".join(mode.value for mode in ModelControlMode)
            raise ConfigError(
                f"model_control_mode must be one of {choices}, got {self.model_control_mode!r}"
            ) from None
        object.__setattr__(self, "load_models", _as_str_tuple("load_models", self.load_models))
        object.__setattr__(self, "extra_args", _as_str_tuple("extra_args", self.extra_args))

        ports = {
            "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "metrics_port": self.metrics_port,
        }
        for name, port in ports.items():
            _check_port(name, port)
        if len(set(ports.values())) != len(ports):
            raise ConfigError(f"http, grpc and metrics ports must differ, got {ports}")
        if not self.address:
            raise ConfigError("address must not be empty")
        if self.load_models and self.model_control_mode is not ModelControlMode.EXPLICIT:
            raise ConfigError("load_models needs model_control_mode 'explicit'")
        if not isinstance(self.log_verbose, int) or self.log_verbose < 0:
            raise ConfigError(f"log_verbose must be an integer >= 0, got {self.log_verbose!r}")
        if not self.startup_timeout_s > 0:
            raise ConfigError(f"startup_timeout_s must be > 0, got {self.startup_timeout_s!r}")
        if not isinstance(self.exit_timeout_s, int) or self.exit_timeout_s < 0:
            raise ConfigError(f"exit_timeout_s must be an integer >= 0, got {self.exit_timeout_s!r}")
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _MANAGED_FLAGS:
                raise ConfigError(f"extra_args must not set {flag}: the launcher sets it from ServerConfig")
        if self.on_dead_model is not None:
            try:
                object.__setattr__(self, "on_dead_model", DeadModelAction(self.on_dead_model))
            except ValueError:
                choices = ", ".join(action.value for action in DeadModelAction)
                raise ConfigError(
                    f"on_dead_model must be one of {choices}, got {self.on_dead_model!r}"
                ) from None
            if (
                self.on_dead_model is DeadModelAction.RELOAD
                and self.model_control_mode is not ModelControlMode.EXPLICIT
            ):
                raise ConfigError(
                    "on_dead_model 'reload' needs model_control_mode 'explicit' "
                    "(tritonserver refuses to load or unload a model otherwise)"
                )
        object.__setattr__(self, "restricted_apis", check_restricted_apis(self.restricted_apis))
        if self.admin_key is not None:
            check_admin_key(self.admin_key)
        elif not is_loopback(self.address) and not self.allow_open_admin_apis:
            raise ConfigError(
                f"address {self.address} exposes the admin APIs ({', '.join(self.restricted_apis)}) "
                f"beyond this machine: set an admin key (TRITON_ADMIN_KEY), or allow_open_admin_apis"
            )

    @property
    def dead_model_action(self) -> DeadModelAction:
        """``on_dead_model``, or its default for the model control mode."""
        if self.on_dead_model is not None:
            return self.on_dead_model
        if self.model_control_mode is ModelControlMode.EXPLICIT:
            return DeadModelAction.RELOAD
        return DeadModelAction.STOP

    @property
    def restricted(self) -> bool:
        """Whether the admin APIs need the key."""
        return self.admin_key is not None

    @property
    def remote(self) -> bool:
        """Whether the repository is in object storage (an ``s3://`` URL), not a local directory."""
        return isinstance(self.repository, str)

    @property
    def repository_argument(self) -> str:
        """tritonserver's ``--model-repository`` value: the URL, or the directory's absolute path."""
        return self.repository if isinstance(self.repository, str) else str(self.repository.resolve())

    @classmethod
    def with_free_ports(cls, repository: Path | str, **options: Any) -> ServerConfig:
        """A config for ``repository`` whose three ports are free right now.

        Args:
            repository: the model repository directory (or ``s3://`` URL).
            **options: any other ServerConfig field except the ports.

        Returns:
            The config; the ports can still be taken by another process before
            the server binds them, which ``LocalServer.start`` then reports.
        """
        address = options.get("address", "127.0.0.1")
        http_port, grpc_port, metrics_port = free_ports(3, host=address)
        return cls(
            repository=repository,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            **options,
        )

    def replace(self, **changes: Any) -> ServerConfig:
        """A copy with ``changes`` applied (and validated again)."""
        return replace(self, **changes)

    @property
    def ports(self) -> dict[str, int]:
        """The endpoints' ports by endpoint name (``http``, ``grpc``, ``metrics``)."""
        return {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}


def _as_str_tuple(name: str, values: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ConfigError(f"{name} must be a sequence of strings, not one string {values!r}")
    result = tuple(values)
    if not all(isinstance(value, str) and value for value in result):
        raise ConfigError(f"{name} must hold non-empty strings, got {result!r}")
    return result
