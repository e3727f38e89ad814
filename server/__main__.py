"""``python -m server serve --repository DIR|s3://...``: the local tritonserver, in the foreground.

When tritonserver dies (killed, crashed, or taken out of service because a model lost its
python stub), the command starts it again on the same ports, a bounded number of times
(:mod:`server.supervisor`); ``--no-restart`` makes it exit 1 instead, for a supervisor of
its own. A model whose python stub dies is reloaded in place (``--model-control-mode
explicit``) or takes the server down (``none``); ``--on-dead-model`` chooses (see
:mod:`server.dead_models`).

``python -m server promtool install`` fetches promtool, the checker of the compose stack's alert
rules, into the venv (:mod:`server.promtool`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bundle.cli import new_app, run
from bundle.errors import BundleError, ServerError
from bundle.options import GrpcPort, HttpPort, MetricsPort, OptionalInstall, TritonLog
from server.config import DEFAULT_LOG_FILE, ModelControlMode, ServerConfig
from server.dead_models import DeadModelAction
from server.launcher import LocalServer, run_tritonserver
from server.promtool import install as install_promtool
from server.security import ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_ADMIN_HEADER, read_admin_key
from server.supervisor import (
    DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_BACKOFF_S,
    DEFAULT_RESTART_WINDOW_S,
    RestartPolicy,
    supervise,
)

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
            "stop the server, which is then restarted (--restart) or exits 1 naming the model "
            "(--no-restart). Default: reload with explicit model control, else stop."
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
    restart: Annotated[
        bool,
        typer.Option(
            "--restart/--no-restart",
            help="Start tritonserver again, on the same ports, when it dies (killed, crashed, or stopped "
            "because a model lost its backend process); --no-restart: exit 1 with one line instead.",
        ),
    ] = True,
    max_restarts: Annotated[
        int,
        typer.Option(help="Restarts allowed within --restart-window; the next death exits 1 with one line."),
    ] = DEFAULT_MAX_RESTARTS,
    restart_window: Annotated[
        float, typer.Option(help="Seconds over which --max-restarts counts restarts.")
    ] = DEFAULT_RESTART_WINDOW_S,
    restart_backoff: Annotated[
        float,
        typer.Option(
            help="Seconds to wait before the first restart in the window; doubled for each further one."
        ),
    ] = DEFAULT_RESTART_BACKOFF_S,
) -> None:
    """Start tritonserver, wait until its models are ready, run until Ctrl-C or SIGTERM, and start
    it again when it dies.

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
    policy = RestartPolicy(
        enabled=restart, max_restarts=max_restarts, window_s=restart_window, backoff_s=restart_backoff
    )
    code = supervise(config, policy, on_ready=_print_summary)
    if code != 0:
        raise ServerError(f"tritonserver exited with code {code} (log: {log_file})")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def tritonserver(context: typer.Context) -> None:
    """Run tritonserver with the arguments that follow, adding the bundle's backend directory and
    the environment its stubs need: for tools that start tritonserver themselves, e.g. Model
    Analyzer's --triton-server-path (through a one-line script that runs this command)."""
    raise typer.Exit(run_tritonserver(list(context.args)))


promtool_app = new_app(
    "promtool, Prometheus's rule checker, which the tests run over the compose stack's alert rules."
)
app.add_typer(promtool_app, name="promtool")


@promtool_app.command("install")
def promtool_install(optional: OptionalInstall = False) -> None:
    """Download Debian's prometheus package pinned in requirements-promtool.txt, check its SHA-256, and
    unpack its promtool into the venv's bin folder (no root)."""
    try:
        path, version = install_promtool(progress=lambda line: print(f"promtool: {line}", flush=True))
    except BundleError as exc:
        if not optional:
            raise
        print(f"promtool not installed: {exc}; the promtool tests of tests/unit/test_alerts.py will skip")
        return
    print(f"promtool: {path} ({version})")


if __name__ == "__main__":
    run(app)
