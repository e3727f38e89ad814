"""LocalServer: starts the wheel's tritonserver on a model repository and stops it.

Typical use (tests, the demo, load tests)::

    config = ServerConfig.with_free_ports(Path("model_repository"))
    with LocalServer(config) as server:        # returns once every model is READY
        client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
        ...

Once ready, the server watches its models' python stubs (:mod:`server.dead_models`):
a model whose stub died is reloaded (explicit model control) or the server is taken
out of service (``failure`` names the model), so a dead model never looks healthy.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from bundle.errors import ServerError
from bundle.s3 import S3Url
from bundle.staging import recover
from server.config import ModelControlMode, ServerConfig
from server.dead_models import DeadModel, DeadModelAction, Recovery, StubWatch
from server.installation import TritonInstallation
from server.ports import ensure_ports_free
from server.preflight import check_stub_environment
from server.probes import ModelStatus, ServerProbe
from server.processes import stub_regions, tree_rss, unlink_regions
from server.repository_view import ViewKeeper, sync_view
from server.security import admin_headers, redact, restricted_api_args
from server.triton_log import (
    last_error,
    model_failures,
    models_left_unloading,
    read_tail,
    repository_failures,
    service_failures,
    unreadable_models,
)

logger = logging.getLogger(__name__)

_POLL_INTERVAL_S = 0.1
# Seconds a load or unload call still waits for the model to settle once its ``timeout`` is spent.
_SETTLE_FLOOR_S = 5.0
# How much longer than tritonserver's own --exit-timeout-secs stop() waits
# before it kills: unloading python stubs takes a few seconds on its own.
_KILL_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
# How long an S3 endpoint may take to accept a connection before start() gives up.
_ENDPOINT_TIMEOUT_S = 5.0


def _parent_death_signal(cpus: frozenset[int] | None = None) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when its parent thread dies, and with
    ``cpus`` keeps it (and every process it starts) on those cores.

    So a launcher killed with SIGKILL (or a test run killed by a timeout) leaves
    no tritonserver holding ports. Linux only; elsewhere None.
    """
    if not sys.platform.startswith("linux"):
        return None
    # Resolved here, in the parent: the child may only make these calls.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    set_affinity = os.sched_setaffinity

    def _set() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if cpus:
            set_affinity(0, cpus)

    return _set


class LocalServer:
    """One tritonserver process serving ``config.repository`` on this machine.

    Args:
        config: ports, repository, log file and options of the server.
        installation: the tritonserver to run; found in the nvidia-pytriton
            wheel when omitted.

    The process runs in its own session (so a Ctrl-C in a terminal reaches only
    the launcher, which forwards it) and gets SIGTERM if the thread that called
    ``start()`` exits: start it from a thread that outlives it (the main thread).
    """

    def __init__(self, config: ServerConfig, installation: TritonInstallation | None = None) -> None:
        self._config = config
        self._installation = installation
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle: IO[bytes] | None = None
        self._backend_dir: Path | None = None
        # The repository as tritonserver 2.51 can load it, where it holds torch_aoti models.
        self._view_dir: Path | None = None
        self._view_keeper: ViewKeeper | None = None
        # Regions of python stubs killed with SIGKILL: nobody else removes them.
        self._orphan_regions: list[str] = []
        self._watch: StubWatch | None = None
        self._stopping = False
        # Instances whose stub died: tritonserver may never release them (see stop()).
        self._dead_instances = 0
        self._killed_after_drain = False
        self._failure: str | None = None
        self._failure_cause: str | None = None
        self._recoveries: list[Recovery] = []
        self._stop_lock = threading.RLock()
        headers = admin_headers(config.admin_key, "http") if config.admin_key else None
        self._probe = ServerProbe(config.address, config.http_port, headers=headers)

    # ----------------------------------------------------------------- state
    @property
    def config(self) -> ServerConfig:
        """The configuration this server was created with."""
        return self._config

    @property
    def pid(self) -> int | None:
        """Process id of tritonserver, or None if never started."""
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """Whether the tritonserver process is alive."""
        return self._process is not None and _exit_status(self._process) is None

    @property
    def returncode(self) -> int | None:
        """tritonserver's exit code once it has exited (negative: the signal that killed it), else None.

        0 too when ``stop()`` killed it once only instances whose stub had died were left.
        Asking does not reap the process: ``stop()`` still ends the python stubs that a
        tritonserver which died left behind, by its process group.
        """
        if self._process is None:
            return None
        code = _exit_status(self._process)
        return 0 if code is not None and self._killed_after_drain else code

    @property
    def failure(self) -> str | None:
        """Why the server took itself out of service (a model lost its stub), in one line; else None."""
        return self._failure

    @property
    def failure_cause(self) -> str | None:
        """What took the server out of service, without what was done about it, e.g. ``model 'm'
        version 1 lost its backend process (stub m_0_0, pid 12)``; else None."""
        return self._failure_cause

    @property
    def recoveries(self) -> list[Recovery]:
        """The models it reloaded after their stub died, in order."""
        return list(self._recoveries)

    @property
    def _client_host(self) -> str:
        return "127.0.0.1" if self._config.address in ("0.0.0.0", "") else self._config.address

    @property
    def http_url(self) -> str:
        """``host:port`` of the HTTP endpoint, as ``tritonclient.http`` takes it."""
        return f"{self._client_host}:{self._config.http_port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of the gRPC endpoint, as ``tritonclient.grpc`` takes it."""
        return f"{self._client_host}:{self._config.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics page (``http://host:port/metrics``)."""
        return f"http://{self._client_host}:{self._config.metrics_port}/metrics"

    @property
    def log_file(self) -> Path:
        """Where tritonserver's output goes."""
        return self._config.log_file

    def admin_headers(self, protocol: str) -> dict[str, str]:
        """The header that opens the restricted APIs over ``protocol`` (``http``/``grpc``).

        Pass it as ``headers=`` to tritonclient's load/unload, repository-index
        and shared-memory calls. Empty when the server is not restricted.
        """
        key = self._config.admin_key
        return admin_headers(key, protocol) if key else {}

    # ------------------------------------------------------------- lifecycle
    def command(self, installation: TritonInstallation, backend_dir: Path) -> list[str]:
        """The tritonserver command line for this config.

        Args:
            installation: the tritonserver to run.
            backend_dir: the assembled ``--backend-directory``.

        Returns:
            argv, binary first.
        """
        config = self._config
        command = [
            str(installation.binary),
            f"--model-repository={self._view_dir or config.repository_argument}",
            f"--backend-directory={backend_dir}",
            f"--cache-directory={installation.caches}",
            f"--http-address={config.address}",
            f"--http-port={config.http_port}",
            f"--grpc-address={config.address}",
            f"--grpc-port={config.grpc_port}",
            f"--metrics-address={config.address}",
            f"--metrics-port={config.metrics_port}",
            f"--model-control-mode={config.model_control_mode.value}",
            *(f"--load-model={name}" for name in config.load_models),
            # Keep running when a model fails, so start() can ask the repository
            # index which model failed and why, then stop the server itself.
            "--exit-on-error=false",
            f"--exit-timeout-secs={config.exit_timeout_s}",
            f"--log-verbose={config.log_verbose}",
            *config.extra_args,
        ]
        if config.admin_key:
            command += restricted_api_args(config.restricted_apis, config.admin_key)
        return command

    def start(self, wait: bool = True) -> LocalServer:
        """Start tritonserver and, by default, wait until every model is ready.

        Args:
            wait: call ``wait_ready()`` before returning.

        Returns:
            self, for chaining.

        Raises:
            ServerError: the repository is missing (or its object storage is
                unreachable), a port is taken, the process exited, a model
                failed to load, or readiness timed out; the server is stopped
                before the error propagates.
        """
        if self.running:
            raise ServerError(f"tritonserver is already running (pid {self.pid})")
        config = self._config
        if isinstance(config.repository, Path):
            if not config.repository.is_dir():
                what = "is not a directory" if config.repository.exists() else "does not exist"
                raise ServerError(f"model repository {config.repository} {what}")
            # A write into the repository that its process did not finish (an export or rollout
            # killed among its renames) is finished, an unfinished one discarded, before Triton reads it.
            recover(config.repository)
            check_stub_environment(config.repository, config.load_models)
        else:
            # tritonserver downloads the repository itself; its configs are not here to check.
            _check_endpoint(config.repository)
            logger.info("tritonserver downloads the repository %s at start", config.repository)
        ensure_ports_free(config.ports, host=config.address)
        installation = self._installation or TritonInstallation.locate()

        self._backend_dir = Path(tempfile.mkdtemp(prefix="tritonserver-backends-"))
        try:
            if isinstance(config.repository, Path):
                self._make_view(config.repository)
            installation.build_backend_directory(self._backend_dir)
            command = self.command(installation, self._backend_dir)
            env = installation.environment()
            config.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = config.log_file.open("wb")
            # The admin key is part of argv (tritonserver reads it nowhere else);
            # the copy-paste command in the log shows a placeholder instead.
            reproduce = redact(
                f"LD_LIBRARY_PATH={shlex.quote(env['LD_LIBRARY_PATH'])} "
                f"PATH={shlex.quote(str(installation.python_bin))}:$PATH {shlex.join(command)}",
                config.admin_key,
            )
            self._log_handle.write(f"# started by server.launcher:\n# {reproduce}\n".encode())
            self._log_handle.flush()
            logger.debug("starting: %s", reproduce)
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_parent_death_signal(config.cpus),
            )
        except BaseException:
            self._cleanup_files()
            raise
        logger.info(
            "tritonserver pid %d starting: http %s, grpc %s, metrics %s; log %s",
            self._process.pid,
            self.http_url,
            self.grpc_url,
            self.metrics_url,
            config.log_file,
        )
        if wait:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def _make_view(self, repository: Path) -> None:
        """Serve a view of ``repository`` (:mod:`server.repository_view`) where it holds models of
        the ``torch_aoti`` platform, which tritonserver 2.51 refuses; else the repository itself."""
        view = Path(tempfile.mkdtemp(prefix="tritonserver-repository-"))
        try:
            changed = sync_view(repository, view)
        except BaseException:
            shutil.rmtree(view, ignore_errors=True)
            raise
        if not changed:
            shutil.rmtree(view, ignore_errors=True)
            return
        self._view_dir = view
        # A server that loads models after its start (polling, or told through the repository API,
        # by this launcher or another client) reads a view kept in step.
        if self._config.model_control_mode is not ModelControlMode.NONE:
            self._view_keeper = ViewKeeper(repository, view).start()
        logger.info(
            "tritonserver 2.51 refuses platform torch_aoti: it serves %s through %s, where the configs of "
            "%s name only their backend (the repository is unchanged)",
            repository, view, ", ".join(changed),
        )  # fmt: skip

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the server is ready, i.e. every model it should load is READY.

        Args:
            timeout: seconds; ``config.startup_timeout_s`` when None.

        Raises:
            ServerError: the process exited (the reason is read from its log),
                a model failed to load (named, with tritonserver's reason), or
                the timeout passed. The server keeps running: call ``stop()``.
        """
        process = self._require_process()
        timeout_s = self._config.startup_timeout_s if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            code = _exit_status(process)
            if code is not None:
                raise self._exit_error(code)
            if self._probe.is_ready():
                unreadable = self._unreadable_models()
                if unreadable and not self._config.allow_failed_models:
                    raise ServerError(f"{_describe_failures(unreadable)} (log: {self.log_file})")
                self._warn_failed(unreadable)
                logger.info("tritonserver pid %d ready after %.1f s", process.pid, time.monotonic() - started)
                self._start_watch(process.pid)
                return
            if self._config.remote:
                # A repository it cannot read leaves tritonserver running, not live, with
                # no model in its index: only its log says why.
                self._check_remote_repository()
            if self._probe.is_live():
                try:
                    index = self._probe.repository_index()
                except ServerError as exc:
                    # Usually the process is exiting; the next poll() says why.
                    logger.debug("repository index not available yet: %s", exc)
                else:
                    failed = [model for model in index if model.failed]
                    if failed and not self._config.allow_failed_models:
                        raise ServerError(f"{_describe_failures(failed)} (log: {self.log_file})")
                    if failed and all(model.state == "READY" or model.failed for model in index):
                        # Every model settled, some failed: with allow_failed_models the rest serve.
                        self._warn_failed([*failed, *self._unreadable_models()])
                        logger.info(
                            "tritonserver pid %d serving after %.1f s",
                            process.pid,
                            time.monotonic() - started,
                        )
                        self._start_watch(process.pid)
                        return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"tritonserver (pid {process.pid}) was not ready after {timeout_s:.0f} s "
                    f"(log: {self.log_file})"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _unreadable_models(self) -> list[ModelStatus]:
        """Model folders tritonserver skipped because their config.pbtxt does not parse (it loads every
        folder in none and poll model control, yet reports no failure for these: only its log names them)."""
        if self._config.remote or self._config.model_control_mode is ModelControlMode.EXPLICIT:
            return []
        reasons = unreadable_models(read_tail(self.log_file))
        return [ModelStatus(name, "", "UNAVAILABLE", reason) for name, reason in sorted(reasons.items())]

    def _warn_failed(self, failed: list[ModelStatus]) -> None:
        for model in failed:
            logger.warning("%s; the other models serve (log: %s)", _describe_failures([model]), self.log_file)

    def models(self) -> list[ModelStatus]:
        """Every model in the repository with its state, from the repository index."""
        self._require_process()
        return self._probe.repository_index()

    def metadata(self) -> dict[str, Any]:
        """The server's name, version and extensions."""
        self._require_process()
        return self._probe.server_metadata()

    def memory(self, anonymous: bool = False) -> dict[int, int]:
        """Resident memory (bytes) of tritonserver and each python stub, by pid; {} when not running.

        ``anonymous``: without the resident pages of mapped files and shared memory (see
        :func:`server.processes.tree_rss`).
        """
        return tree_rss(self.pid, anonymous) if self.running and self.pid is not None else {}

    def load_model(self, name: str, timeout: float = 120.0) -> None:
        """Load or reload ``name`` (explicit model control), with the admin key if set.

        tritonserver loads the repository's current versions beside the ones
        serving and switches once they are ready, so requests keep being answered.

        Returns once the model answers ready.

        Raises:
            ServerError: refused, the model failed to load, or ``timeout`` passed.
        """
        self._require_process()
        if self._view_dir is not None and isinstance(self._config.repository, Path):
            sync_view(self._config.repository, self._view_dir)  # a model written since the start
        started = time.monotonic()
        self._probe.load_model(name, timeout)
        self._probe.wait_model_ready(name, max(_SETTLE_FLOOR_S, timeout - (time.monotonic() - started)))

    def unload_model(self, name: str, timeout: float = 60.0) -> None:
        """Unload ``name`` (explicit model control), with the admin key if set.

        Returns once tritonserver has released it: its unload API answers before that, and a
        load of the same or another model meanwhile would run beside the instances still going.

        Raises:
            ServerError: refused, or still not unloaded after ``timeout``.
        """
        self._require_process()
        started = time.monotonic()
        self._probe.unload_model(name, timeout)
        self._probe.wait_unloaded(name, max(_SETTLE_FLOOR_S, timeout - (time.monotonic() - started)))

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int | None:
        """Ask tritonserver to exit with ``sig``; kill it if it does not in time.

        Safe to call more than once, from any thread, and on a server that already exited.
        When a model's stub had died, tritonserver 2.51 may never release that instance
        and would wait out its whole exit timeout, then exit 1: once its log says that
        only such instances are left (requests drained, every other model unloaded),
        this kills it instead and reports 0.

        Args:
            sig: the signal to send (SIGTERM or SIGINT: tritonserver drains
                in-flight requests and unloads its models on either).
            timeout: seconds to wait before SIGKILL; by default
                ``config.exit_timeout_s`` plus a few seconds.

        Returns:
            tritonserver's exit code (negative: killed by that signal), or None
            if it was never started.
        """
        with self._stop_lock:
            process = self._process
            if process is None:
                return None
            self._stopping = True  # from here the watch reacts to nothing
            if process.returncode is None and _exit_status(process) is not None:
                # It died on its own (killed, crashed): its python stubs outlive it, orphans in
                # its process group that still hold memory and shared-memory regions.
                self._kill_group(process)
            if process.poll() is None:
                wait_s = self._config.exit_timeout_s + _KILL_GRACE_S if timeout is None else timeout
                logger.info("stopping tritonserver pid %d (%s)", process.pid, signal.Signals(sig).name)
                process.send_signal(sig)
                self._wait_exit(process, wait_s)
                logger.info("tritonserver pid %d exited with code %s", process.pid, self.returncode)
            # After the exit: a reload in progress in the watch's thread ends with the server.
            if self._watch is not None:
                self._watch.stop()
            self._cleanup_files()
            return self.returncode

    def _wait_exit(self, process: subprocess.Popen[bytes], wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                process.wait(
                    timeout=_POLL_INTERVAL_S
                    if self._dead_instances
                    else max(0.0, deadline - time.monotonic())
                )
                return
            except subprocess.TimeoutExpired:
                pass
            left = (
                models_left_unloading(read_tail(self.log_file, 64 * 1024)) if self._dead_instances else None
            )
            if left is not None and left <= self._dead_instances:
                logger.info(
                    "tritonserver pid %d: only %d model instance(s) whose python stub died are left, which "
                    "tritonserver cannot release; killing it instead of waiting out its exit timeout",
                    process.pid,
                    left,
                )
                self._killed_after_drain = True
            elif time.monotonic() < deadline:
                continue
            else:
                logger.warning(
                    "tritonserver pid %d still running after %.0f s; killing it", process.pid, wait_s
                )
            self._kill_group(process)
            process.wait()
            return

    def kill(self) -> None:
        """SIGKILL tritonserver and its python stubs (its process group) now.

        Does not wait, so a signal handler may call it while ``stop()`` waits;
        ``stop()`` afterwards reaps the process and removes its files.
        """
        process = self._process
        self._stopping = True
        # returncode stays None until the process is reaped, so until then its
        # pid (and group id) cannot have been reused by another process.
        if process is not None and process.returncode is None:
            self._kill_group(process)

    def __enter__(self) -> LocalServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # --------------------------------------------------------------- helpers
    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise ServerError("tritonserver was not started; call start() first")
        return self._process

    def _start_watch(self, pid: int) -> None:
        if self._watch is None and not self._stopping:
            self._watch = StubWatch(pid, self._probe, self._on_dead_models).start()

    def _on_dead_models(self, dead: Sequence[DeadModel]) -> None:
        """Reload each model whose stub died, or take the server out of service (the watch's thread)."""
        if self._stopping:
            return
        for model in dead:
            self._dead_instances += len(model.stubs)
            # tritonserver never frees a dead stub's shared-memory region: removed once it exits.
            self._orphan_regions += [stub.region for stub in model.stubs]
        if self._config.dead_model_action is DeadModelAction.STOP:
            described = "; ".join(model.describe() for model in dead)
            mode = self._config.model_control_mode.value
            self._take_out_of_service(
                described,
                f"{described}: stopped the server, since {mode} model control cannot reload a model "
                f"(log: {self.log_file})",
            )
            return
        for model in dead:
            if self._stopping:
                return
            logger.warning("%s; reloading it", model.describe())
            try:
                # Unloading first turns the server's and the model's readiness non-200 at once.
                self._probe.unload_model(model.model)
                self._probe.load_model(model.model, self._config.startup_timeout_s)
            except ServerError as exc:
                if not self._stopping:
                    self._take_out_of_service(
                        model.describe(),
                        f"{model.describe()} and could not be reloaded: {exc}; stopped the server",
                    )
                return
            recovery = Recovery(model.model, model.version, model.seen_at, time.monotonic())
            self._recoveries.append(recovery)
            logger.warning(
                "model '%s' reloaded, ready again %.1f s after its stub died", model.model, recovery.seconds
            )

    def _take_out_of_service(self, cause: str, line: str) -> None:
        """Record the failure (``cause``; ``line``: it and what was done about it) and ask
        tritonserver to stop: readiness turns non-200 at once."""
        self._failure_cause = cause
        self._failure = line
        logger.error("%s", line)
        process = self._process
        if process is not None and _exit_status(process) is None and not self._stopping:
            process.send_signal(signal.SIGTERM)

    def _kill_group(self, process: subprocess.Popen[bytes]) -> None:
        # The process was started in its own session, so its pid is the group
        # id of it and its python stubs. Only called while it is unreaped, so
        # the group id cannot belong to anything else.
        # A SIGKILLed tritonserver cannot remove its stubs' shared-memory
        # regions from /dev/shm: note their names first, remove them once reaped.
        self._orphan_regions += stub_regions(process.pid)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            logger.debug("process group %d already gone", process.pid)

    def _cleanup_files(self) -> None:
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._orphan_regions:
            unlink_regions(self._orphan_regions)
            self._orphan_regions = []
        if self._backend_dir is not None:
            shutil.rmtree(self._backend_dir, ignore_errors=True)
            self._backend_dir = None
        if self._view_keeper is not None:
            self._view_keeper.stop()
            self._view_keeper = None
        if self._view_dir is not None:
            shutil.rmtree(self._view_dir, ignore_errors=True)
            self._view_dir = None

    def _check_remote_repository(self) -> None:
        """Raise if tritonserver logged that it cannot read its ``s3://`` repository.

        It then serves on with no models and is never ready: without this a
        wrong endpoint, bucket or key would only show as a readiness timeout.
        """
        if self._log_handle is not None:
            self._log_handle.flush()
        reasons = repository_failures(read_tail(self.log_file))
        if reasons:
            raise ServerError(
                f"tritonserver cannot read the model repository {self._config.repository}: {reasons[-1]} "
                f"(log: {self.log_file})"
            )

    def _exit_error(self, code: int) -> ServerError:
        if self._log_handle is not None:
            self._log_handle.flush()
        # tritonserver may echo a flag it could not parse: never the key in a message.
        text = redact(read_tail(self.log_file), self._config.admin_key)
        where = f"(log: {self.log_file})"
        services = service_failures(text)
        if services:
            return ServerError(f"tritonserver could not start its {'; '.join(services)} {where}")
        failures = model_failures(text)
        if failures:
            described = "; ".join(f"'{name}' {_one_line(reason)}" for name, reason in failures.items())
            return ServerError(f"model(s) failed to load: {described} {where}")
        detail = last_error(text) or "no error in its log"
        return ServerError(f"tritonserver exited with code {code} before it was ready: {detail} {where}")


def _exit_status(process: subprocess.Popen[bytes]) -> int | None:
    """``process``'s exit code as ``Popen.returncode`` gives it (negative: killed by that signal),
    without reaping it; None while it runs.

    Until it is reaped its pid, which is also its process group's id, cannot be taken by
    another process, so the group can still be killed safely.
    """
    if process.returncode is not None:
        return process.returncode
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped meanwhile (another thread's wait)
        return process.poll()
    if info is None:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def _check_endpoint(url: str) -> None:
    """Raise unless the S3 endpoint that ``url`` names (if any) accepts a connection.

    tritonserver's S3 client retries an unreachable endpoint for about a minute
    before it logs why; a connection attempt here says so in seconds.
    """
    endpoint = S3Url.parse(url).endpoint
    if endpoint is None:
        return  # AWS itself: its endpoint depends on the region and the SDK's settings
    host, _, port = endpoint.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=_ENDPOINT_TIMEOUT_S).close()
    except OSError as exc:
        raise ServerError(
            f"cannot reach the S3 endpoint {endpoint} of the model repository {url}: {exc}"
        ) from None


def _one_line(reason: str) -> str:
    """tritonserver's reason without the python stub's ``At: file(line)`` trace."""
    head = reason.split("\n\nAt:", 1)[0]
    return " ".join(head.split())


def _describe_failures(failed: list[ModelStatus]) -> str:
    parts = [
        f"'{model.name}'"
        + (f" version {model.version}" if model.version else "")
        + f": {_one_line(model.reason)}"
        for model in failed
    ]
    noun = "model" if len(parts) == 1 else f"{len(parts)} models"
    return f"{noun} failed to load: " + "; ".join(parts)


def run_tritonserver(arguments: Sequence[str]) -> int:
    """Run the bundle's tritonserver with ``arguments`` in the foreground; its exit code.

    For tools that start tritonserver themselves with their own arguments (Model
    Analyzer's ``--triton-server-path``): the backend directory (the python
    backend and the bundle's CPU backends) and the environment its stubs need are
    added, as :class:`LocalServer` adds them; nothing else. SIGINT and SIGTERM
    are passed on to tritonserver, and the backend directory is removed after it
    exits.
    """
    installation = TritonInstallation.locate()
    backend_dir = Path(tempfile.mkdtemp(prefix="tritonserver-backends-"))
    try:
        installation.build_backend_directory(backend_dir)
        command = [str(installation.binary), f"--backend-directory={backend_dir}", *arguments]
        process = subprocess.Popen(command, env=installation.environment(), preexec_fn=_parent_death_signal())

        def forward(signum: int, frame: object) -> None:
            process.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return process.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        shutil.rmtree(backend_dir, ignore_errors=True)
