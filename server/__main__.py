"""``python -m server serve --repository DIR|s3://...``: the local tritonserver, in the foreground.

A model whose python stub dies is reloaded (``--model-control-mode explicit``) or the
command stops the server and exits 1 with one line naming the model (``none``), for a
supervisor to restart it; ``--on-dead-model`` chooses (see :mod:`server.dead_models`).
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from bundle.cli import new_app, run
from bundle.errors import ServerError
from bundle.options import GrpcPort, HttpPort, MetricsPort, TritonLog
from server.config import DEFAULT_LOG_FILE, ModelControlMode, ServerConfig
from server.dead_models import DeadModelAction
from server.launcher import LocalServer, run_tritonserver
from server.security import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_ADMIN_HEADER, read_admin_key

logger = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

app = new_app(
    "The real tritonserver (from the nvidia-pytriton wheel) on a model repository, "
    "without Docker, with a CPU onnxruntime backend."
)


# The only ``--repository`` that takes an S3 URL; the other commands' take a folder (bundle.options).
RepositoryOrUrl = Annotated[
    str,
    typer.Option(
        "--repository",
        "-r",
        help="Triton model repository to serve: a directory, or s3://bucket/prefix (s3://host:port/bucket/"
        "prefix for another S3-compatible endpoint), downloaded by tritonserver with the credentials in "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION.",
    ),
]


class _StopRequested(BaseException):
    """Raised by the signal handler in the main thread; carries the signal.

    A BaseException, like KeyboardInterrupt, so no ``except Exception`` on the
    way up swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _request_stop(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signum)


def _print_summary(server: LocalServer) -> None:
    """Print the endpoints and the models with their state (the command's output)."""
    version = server.metadata().get("version", "?")
    print(f"tritonserver {version} ready (pid {server.pid})")
    print(f"  http     http://{server.http_url}")
    print(f"  grpc     {server.grpc_url}")
    print(f"  metrics  {server.metrics_url}")
    print(f"  log      {server.log_file}")
    config = server.config
    if config.restricted:
        print(
            f"admin APIs ({', '.join(config.restricted_apis)}) need the key: "
            f"header '{ADMIN_HEADER}' (http), '{GRPC_ADMIN_HEADER}' (grpc)"
        )
    else:
        print(f"admin APIs open to anyone who reaches the ports (set {ADMIN_KEY_ENV} to restrict them)")
    models = server.models()
    print("models:" if models else "models: none in the repository")
    width = max((len(model.name) for model in models), default=0)
    for model in models:
        reason = f" ({model.reason})" if model.reason else ""
        version_text = model.version or "-"
        state = model.state or "not loaded"
        print(f"  {model.name:<{width}}  version {version_text:<3} {state}{reason}")
    print("stop with Ctrl-C or SIGTERM", flush=True)


def serve_forever(config: ServerConfig) -> int:
    """Start the server, print its endpoints, and run until SIGINT or SIGTERM.

    The signal is forwarded to tritonserver, which drains and unloads; a
    second signal while it does kills it.

    Args:
        config: the server to run.

    Returns:
        tritonserver's exit code; 0 after a requested stop.

    Raises:
        ServerError: it could not start, it exited without being asked to, or it
            was taken out of service because a model lost its python stub.
    """
    server = LocalServer(config)
    previous = {sig: signal.signal(sig, _request_stop) for sig in _STOP_SIGNALS}
    received: int = signal.SIGTERM
    try:
        try:
            server.start()
            _print_summary(server)
            while server.running and server.failure is None:
                time.sleep(0.2)
            if server.failure is not None:
                raise ServerError(server.failure)
            raise ServerError(
                f"tritonserver exited on its own with code {server.returncode} (log: {server.log_file})"
            )
        except _StopRequested as stop:
            received = stop.signum
            logger.info("received %s; stopping tritonserver", signal.Signals(received).name)
        finally:
            for sig in _STOP_SIGNALS:
                signal.signal(sig, lambda signum, frame: server.kill())
            code = server.stop(received)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code is None or code == -received:
        # Killed by the very signal we forwarded: tritonserver had not yet set up
        # its handlers (a stop during start-up). Stopping was what was asked.
        return 0
    return code


@app.command()
def serve(
    repository: RepositoryOrUrl,
    http_port: HttpPort = 8000,
    grpc_port: GrpcPort = 8001,
    metrics_port: MetricsPort = 8002,
    address: Annotated[
        str, typer.Option(help="Interface to bind; 0.0.0.0 to serve other machines.")
    ] = "127.0.0.1",
    log_file: TritonLog = DEFAULT_LOG_FILE,
    model_control_mode: Annotated[
        ModelControlMode,
        typer.Option(
            help="none: load every model; explicit: only --load-model; poll: every model, reloaded when its "
            "files change."
        ),
    ] = ModelControlMode.NONE,
    load_model: Annotated[
        list[str] | None, typer.Option(help="Model to load at start (explicit mode; repeatable).")
    ] = None,
    startup_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for every model to be ready.")
    ] = 120.0,
    log_verbose: Annotated[int, typer.Option(help="tritonserver --log-verbose level.")] = 0,
    admin_key_file: Annotated[
        Path | None,
        typer.Option(
            help=f"File holding the admin key (else ${ADMIN_KEY_ENV}); with a key, the model-repository, "
            "shared-memory, trace and logging APIs answer only requests that carry it."
        ),
    ] = None,
    allow_open_admin_apis: Annotated[
        bool,
        typer.Option(
            "--allow-open-admin-apis",
            help="Serve a non-loopback --address without an admin key (anyone reaching it can load models).",
        ),
    ] = False,
    on_dead_model: Annotated[
        DeadModelAction | None,
        typer.Option(
            help="When a model's backend process dies: reload the model (explicit model control only), or "
            "stop the server and exit 1 naming it. Default: reload with explicit model control, else stop."
        ),
    ] = None,
    allow_failed_models: Annotated[
        bool,
        typer.Option(
            "--allow-failed-models",
            help="Serve the models that load when others fail (a damaged file, a config that does not "
            "parse): each failed one is named in one line; the server's readiness stays non-200.",
        ),
    ] = False,
) -> None:
    """Start tritonserver, wait until its models are ready, run until Ctrl-C or SIGTERM.

    The admin key is read from --admin-key-file or the environment, never from
    an option, so it stays out of this command's argv.
    """
    config = ServerConfig(
        repository=repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        address=address,
        log_file=log_file,
        model_control_mode=model_control_mode,
        load_models=tuple(load_model or ()),
        startup_timeout_s=startup_timeout,
        log_verbose=log_verbose,
        admin_key=read_admin_key(admin_key_file),
        allow_open_admin_apis=allow_open_admin_apis,
        on_dead_model=on_dead_model,
        allow_failed_models=allow_failed_models,
    )
    code = serve_forever(config)
    if code != 0:
        raise ServerError(f"tritonserver exited with code {code} (log: {log_file})")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def tritonserver(context: typer.Context) -> None:
    """Run tritonserver with the arguments that follow, adding the bundle's backend directory and
    the environment its stubs need: for tools that start tritonserver themselves, e.g. Model
    Analyzer's --triton-server-path (through a one-line script that runs this command)."""
    raise typer.Exit(run_tritonserver(list(context.args)))


if __name__ == "__main__":
    run(app)
