"""Whole load-test runs: servers up, in-process baselines, sweeps, one report.

- :func:`sweep_run` (``python -m loadtest sweep``): one or more models over
  one or more protocols of a running Triton (``--url``), or of a local
  tritonserver it starts on a repository, at one or more batch sizes.
- :func:`compare_run` (``python -m loadtest compare``): the same model and
  sweep against the bundle's local Triton, PyTriton binding an ONNX Runtime
  session, and a minimal FastAPI + ONNX Runtime server, all three up at once
  and their steps interleaved.

Both time the model in-process with ONNX Runtime (while no load runs), so
every report states served / in-process ratios measured side by side: a sweep
right before the steps of each batch size, a comparison once before the
first server starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from bundle.errors import BundleError, ConfigError, DataError
from bundle.records import RunRecord
from bundle.repository import CONFIG_NAME, config_bags, read_config
from bundle.schema import (
    LENGTHS_INPUT,
    USER_FEATURES_PARAMETER,
    VALUES_INPUT,
    VARIABLE_HOTNESS,
    FeatureSplit,
    is_ranking_model,
    is_raw_model,
)
from loadtest.engine.baseline import BaselineConfig, BaselineResult, InProcessModel
from loadtest.engine.client_cpu import threshold_line
from loadtest.engine.payload import MAX_POOL_ROWS, Hotness, PayloadPool
from loadtest.engine.session import serving_settings
from loadtest.engine.wire import request_bytes
from loadtest.sweeps.peers.process import PeerProcess
from loadtest.sweeps.perf_analyzer import MAX_TRIALS, STABILITY_PERCENT, window_for
from loadtest.sweeps.perf_analyzer_install import require as require_perf_analyzer
from loadtest.sweeps.report import Report, write_report
from loadtest.sweeps.steps import ENGINES, StepResult, StreamCursor, SweepConfig, Target, median_step
from loadtest.sweeps.sweep import make_payload, run_sweep

logger = logging.getLogger(__name__)
console = Console(stderr=True, soft_wrap=True)

MODEL_FILE = Path("1") / "model.onnx"
#: Report setting: resident memory of a local tritonserver and its stubs after the steps.
SERVER_RSS = "Server RSS after the steps (MiB, tritonserver + python stubs)"
#: The same without mapped files' and shared memory's pages (a row store's page cache, libraries).
SERVER_ANON = "Server anonymous memory after the steps (MiB, tritonserver + python stubs)"


@dataclass(frozen=True)
class RunOptions:
    """What every step of a run shares.

    Args:
        batch_sizes: rows per request; each is swept on its own.
        concurrency: requests in flight per step.
        duration_s: seconds measured per step.
        warmup_s: seconds before each step's window.
        processes: locust processes per step (0: automatic).
        max_rows_in_flight: skip steps whose ``concurrency x batch`` exceeds it (0: no cap);
            the lowest concurrency always runs.
        data: Criteo TSV file the requests' rows come from (None: synthetic).
        baseline: time each model in-process first.
        baseline_seconds: length of one timed repeat of the baseline.
        baseline_repeats: timed repeats per batch size (median reported).
        rounds: times each step runs, the targets interleaved; a step's figures are the median
            of its rounds and the report shows their spread.
        engines: what generates the load (:data:`loadtest.sweeps.steps.ENGINES`); several are
            interleaved step by step on the same server.
        client_cpus: the cores the load generator may run on (None: any).
        stream: send ``data``'s rows in order, each once over the run (the rows no cache has
            seen), instead of cycling a pool of at most 32,768 rows.
    """

    batch_sizes: tuple[int, ...]
    concurrency: tuple[int, ...]
    duration_s: float = 10.0
    warmup_s: float = 2.0
    processes: int = 0
    max_rows_in_flight: int = 0
    data: Path | None = None
    baseline: bool = True
    baseline_seconds: float = 1.0
    baseline_repeats: int = 5
    request_timeout_s: float = 60.0
    extra_settings: dict[str, Any] = field(default_factory=dict)
    rounds: int = 1
    engines: tuple[str, ...] = ("locust",)
    client_cpus: frozenset[int] | None = None
    stream: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        object.__setattr__(self, "engines", tuple(dict.fromkeys(self.engines)))
        if self.rounds < 1:
            raise ConfigError(f"--rounds must be >= 1, got {self.rounds}")
        unknown = [engine for engine in self.engines if engine not in ENGINES]
        if not self.engines or unknown:
            raise ConfigError(
                f"unknown engine {', '.join(unknown) or '(none)'}; choose from {', '.join(ENGINES)}"
            )
        object.__setattr__(self, "concurrency", tuple(sorted(set(self.concurrency))))
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ConfigError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if not self.concurrency or self.concurrency[0] < 1:
            raise ConfigError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.max_rows_in_flight < 0:
            raise ConfigError(f"max_rows_in_flight must be >= 0, got {self.max_rows_in_flight}")
        if self.data is not None and not Path(self.data).is_file():
            raise ConfigError(f"--data {self.data} is not a file")

    def concurrency_for(self, batch_size: int) -> tuple[int, ...]:
        """The concurrency levels swept at ``batch_size`` (capped by ``max_rows_in_flight``)."""
        if not self.max_rows_in_flight:
            return self.concurrency
        kept = tuple(c for c in self.concurrency if c * batch_size <= self.max_rows_in_flight)
        return kept or self.concurrency[:1]

    def sweep(
        self, models: Sequence[str], batch_size: int, stream: StreamCursor | None = None
    ) -> SweepConfig:
        return SweepConfig(
            models=tuple(models),
            batch_size=batch_size,
            concurrency=self.concurrency_for(batch_size),
            duration_s=self.duration_s,
            warmup_s=self.warmup_s,
            processes=self.processes,
            request_timeout_s=self.request_timeout_s,
            client_cpus=self.client_cpus,
            stream=stream,
        )

    def settings(self) -> dict[str, Any]:
        """What reports record of these options."""
        caps = {b: ",".join(map(str, self.concurrency_for(b))) for b in self.batch_sizes}
        return {
            "Batch sizes / concurrency": "; ".join(f"B={b}: {c}" for b, c in caps.items()),
            "Per step": f"{self.warmup_s:g} s warm-up, {self.duration_s:g} s measured, "
            f"locust processes {'auto' if not self.processes else self.processes}"
            + (
                f"; perf_analyzer: windows of {window_for(self.duration_s):.3g} s until three agree "
                f"within {STABILITY_PERCENT} % (at most {MAX_TRIALS}), those three reported"
                if "perf_analyzer" in self.engines
                else ""
            ),
            "Engines": ", ".join(self.engines),
            "Rounds": f"{self.rounds} per step, the engines and protocols interleaved; figures are the "
            "median of the rounds, the spread is (max - min) / median of samples/s"
            if self.rounds > 1
            else "1 per step (no spread: use --rounds 3)",
            "Client-bound": threshold_line(),
            "Load generator cores": (
                f"{_cores(self.client_cpus)}; "
                f"a server the run starts: {_cores(server_cpus(self.client_cpus))}"
                if self.client_cpus
                else "any"
            ),
            "Request rows": (
                f"streamed from {self.data} in order, each once (it wraps only past its last row)"
                if self.stream
                else f"a pool of at most {MAX_POOL_ROWS:,} rows of "
                f"{self.data or 'synthetic data (criteo.synth)'}, preprocessed once and cycled"
            ),
            **self.extra_settings,
        }


def _print_step(step: StepResult) -> None:
    server = ""
    if step.server is not None:
        server = f", server queue {step.server.queue_ms:.3f} ms compute {step.server.compute_infer_ms:.3f} ms"
    console.print(
        f"  {step.series} c={step.concurrency:<3d} {step.requests_per_s:9.1f} req/s "
        f"{step.samples_per_s:10.0f} samples/s  p50 {step.p50_ms:8.3f}  p99 {step.p99_ms:8.3f} ms  "
        f"errors {step.errors}  client {step.client_cpu_us:7.1f} us/req"
        f"{' CLIENT-BOUND' if step.client_bound else ''}{server}"
        + (f"\n    {step.bound_reason}" if step.bound_reason else ""),
        highlight=False,
        markup=False,
    )


def model_file(repository: Path, model: str) -> Path:
    """``<repository>/<model>/1/model.onnx``."""
    return repository / model / MODEL_FILE


def _described(
    repository: Path | None, urls: Sequence[str], protocols: Sequence[str], models: Sequence[str]
) -> Iterator[tuple[str, Any, Any]]:
    """Each of ``models`` with what says which inputs it takes: ``(model, its config, None)`` from
    ``repository``, or without one ``(model, None, its ModelSpec)`` from the server at ``urls[0]``
    (one client for them all); a model neither knows is left out."""
    client = None
    try:
        for model in models:
            if repository is not None and (repository / model / CONFIG_NAME).is_file():
                yield model, read_config(repository / model / CONFIG_NAME), None
            elif urls:
                if client is None:
                    from clients.triton import TritonClient

                    client = TritonClient(urls[0], protocols[0])  # type: ignore[arg-type]
                yield model, None, client.model_spec(model)
    finally:
        if client is not None:
            client.close()


def models_hotness(
    repository: Path | None, urls: Sequence[str], protocols: Sequence[str], models: Sequence[str]
) -> Hotness:
    """The ids per table the swept models take (None: one each; ``variable``: bags of any size, as
    values and lengths), from their configs in ``repository`` or, without one, from the server at
    ``urls[0]``.

    Raises:
        ConfigError: models that take different inputs (sweep them one at a time).
    """
    found: set[Hotness] = set()
    for _, config, spec in _described(
        repository, urls, protocols, [m for m in models if not is_raw_model(m)]
    ):
        if config is not None:
            found.add(config_bags(config))
        else:
            found.add(VARIABLE_HOTNESS if spec.variable_bags else spec.hotness)
    if len(found) > 1:
        raise ConfigError(
            f"the models {', '.join(models)} take different categorical inputs (one id per table, bags of "
            f"a fixed size, bags of any size as {VALUES_INPUT} and {LENGTHS_INPUT}): sweep them one at a time"
        )
    return found.pop() if found else None


def models_split(
    repository: Path | None, urls: Sequence[str], protocols: Sequence[str], models: Sequence[str]
) -> FeatureSplit | None:
    """The ranking models' split of the features (their ``user_features`` parameter) among the
    swept ``models``, from their configs in ``repository`` or, without one, from the server at
    ``urls[0]``; None where none is a ranking model. The payload then holds users
    (:meth:`~loadtest.engine.payload.PayloadPool.ranked`), and the flat models swept beside them
    get the same candidates as tiled rows.

    Raises:
        ConfigError: ranking models with different splits (sweep them one at a time).
    """
    found: set[FeatureSplit] = set()
    ranking = [model for model in models if is_ranking_model(model)]
    for model, config, spec in _described(repository, urls, protocols, ranking):
        if config is not None:
            parameters = config.parameters
            text = (
                parameters[USER_FEATURES_PARAMETER].string_value
                if USER_FEATURES_PARAMETER in parameters
                else ""
            )
            if not text:
                raise ConfigError(
                    f"{model}: its config records no {USER_FEATURES_PARAMETER} (is it a ranking model?)"
                )
            found.add(FeatureSplit.parse(text))
        else:
            if spec.user_features is None:
                raise ConfigError(f"{model}: the server's config records no {USER_FEATURES_PARAMETER}")
            found.add(spec.user_features)
    if len(found) > 1:
        raise ConfigError(
            f"the ranking models {', '.join(ranking)} split the features "
            f"differently ({'; '.join(sorted(split.text for split in found))}): sweep them one at a time"
        )
    return found.pop() if found else None


def models_payload(
    out: Path,
    data: Path | None,
    repository: Path | None,
    urls: Sequence[str],
    protocols: Sequence[str],
    models: Sequence[str],
    stream: bool = False,
) -> Path:
    """The payload every step sends to ``models`` (:func:`~loadtest.sweeps.sweep.make_payload`),
    in the inputs they take: their ids per table (:func:`models_hotness`) and, where one is a
    ranking model, users of its split (:func:`models_split`)."""
    hotness = models_hotness(repository, urls, protocols, models)
    return make_payload(out, data, stream, hotness, models_split(repository, urls, protocols, models))


def in_process_models(
    repository: Path | None, models: Sequence[str], options: RunOptions
) -> dict[str, InProcessModel]:
    """An in-process session of each model whose file is in ``repository`` (none without one)."""
    if not options.baseline or repository is None:
        return {}
    sessions = {}
    for model in models:
        if is_ranking_model(model):
            # Its graph takes Triton's batch of users (with its batch inputs), not one request.
            logger.warning("%s: a ranking model gets no in-process baseline", model)
            continue
        path = model_file(repository, model)
        if not path.is_file():
            logger.warning("no %s: %s gets no in-process baseline", path, model)
            continue
        config = BaselineConfig(
            path, options.batch_sizes, repeats=options.baseline_repeats, seconds=options.baseline_seconds
        )
        sessions[model] = InProcessModel(config)
    return sessions


def measure_in_process(
    sessions: dict[str, InProcessModel],
    batch_sizes: Sequence[int],
    pool: PayloadPool,
    into: dict[str, list[BaselineResult]],
) -> None:
    """Time each session at ``batch_sizes``; append the results to ``into[model]``."""
    for model, session in sessions.items():
        for batch_size in batch_sizes:
            result = session.measure(batch_size, pool)
            into.setdefault(model, []).append(result)
            console.print(
                f"  in-process {model} B={batch_size:<5d} {result.samples_per_s:10.0f} samples/s  "
                f"p50 {result.p50_ms:8.3f} ms  (ONNX Runtime, threads {result.threads or 'default'})",
                highlight=False,
            )


def _serving(repository: Path | None, models: Sequence[str]) -> dict[str, Any]:
    if repository is None:
        return {}
    settings = {}
    for model in models:
        path = model_file(repository, model)
        if path.is_file():
            s = serving_settings(path)
            settings[f"Serving {model}"] = (
                f"{s['instances']} instance(s), intra-op threads {s['threads'] or 'default'}, "
                f"max queue delay {s['max_queue_delay_us']} us (config.pbtxt)"
            )
    return settings


def wire_settings(
    payload: Path, models: Sequence[str], protocols: Sequence[str], batch_sizes: Sequence[int]
) -> dict[str, str]:
    """The report's lines on what a request carries: per model, protocol and batch size, the bytes
    a request sends and their share per sample; for a ranking model (one user and its ``B``
    candidates a request), that its samples are candidates and its requests users."""
    pool = PayloadPool.load(payload)
    sizes = []
    for model in models:
        for protocol in protocols:
            for batch_size in batch_sizes:
                where = f"{model} {protocol} B={batch_size}"
                try:
                    size = request_bytes(pool.rebatched(batch_size), model, protocol)
                except DataError as exc:  # a form this pool cannot make (it said so when the steps ran)
                    sizes.append(f"{where}: not measured ({exc})")
                    continue
                sizes.append(f"{where}: {size:,.0f} ({size / batch_size:,.1f})")
    settings = {"Bytes a request sends (per sample)": "; ".join(sizes)}
    ranking = [model for model in models if is_ranking_model(model)]
    if ranking and pool.split is not None:
        settings["Ranking requests"] = (
            f"{', '.join(ranking)}: one user and its B candidates a request, the user's features "
            f"{pool.split.text} sent once: samples/s are candidates/s, requests/s users/s"
            + (
                "; the flat models get the same candidates as the tiled rows"
                if len(ranking) < len(models)
                else ""
            )
        )
    return settings


def server_cpus(client_cpus: frozenset[int] | None) -> frozenset[int] | None:
    """The cores a local server gets beside a load generator on ``client_cpus``: the others
    (None, any core, when the client may run anywhere or takes every core)."""
    if not client_cpus:
        return None
    rest = frozenset(os.sched_getaffinity(0)) - client_cpus
    return rest or None


def _cores(cpus: frozenset[int] | None) -> str:
    return ",".join(map(str, sorted(cpus))) if cpus else "any"


@contextlib.contextmanager
def local_triton(
    repository: Path, models: Sequence[str], log_file: Path, client_cpus: frozenset[int] | None = None
) -> Iterator[Any]:
    """A local tritonserver serving only ``models`` of ``repository``, on free ports, kept off
    the load generator's cores (``client_cpus``) when others are left."""
    from server.config import ServerConfig
    from server.launcher import LocalServer

    config = ServerConfig.with_free_ports(
        repository, log_file=log_file, model_control_mode="explicit", load_models=tuple(models),
        cpus=server_cpus(client_cpus),
    )  # fmt: skip
    with LocalServer(config) as server:
        console.print(f"local tritonserver pid {server.pid}: grpc {server.grpc_url}, http {server.http_url}")
        yield server


def _sweep_targets(
    targets: Sequence[Target],
    models: Sequence[str],
    options: RunOptions,
    out: Path,
    payload: Path,
    sessions: dict[str, InProcessModel] | None = None,
    baselines: dict[str, list[BaselineResult]] | None = None,
    cursor: StreamCursor | None = None,
    failed: list[str] | None = None,
) -> list[StepResult]:
    """Sweep every target at every batch size; with ``sessions``, time each model in-process
    right before the steps of each batch size (into ``baselines``), so the two are measured
    side by side, minutes apart at most."""
    steps: list[StepResult] = []
    pool = PayloadPool.load(payload) if sessions else None
    for batch_size in options.batch_sizes:
        if sessions and pool is not None and baselines is not None:
            measure_in_process(sessions, [batch_size], pool, baselines)
        for model in models:
            one_batch = replace(options, batch_sizes=(batch_size,))
            steps += _interleaved_steps(targets, model, one_batch, out, payload, cursor, failed)
    return steps


def _finish(
    title: str,
    record: RunRecord,
    steps: list[StepResult],
    baselines: dict[str, list[BaselineResult]],
    settings: dict[str, Any],
    out: Path,
    failed: Sequence[str] = (),
) -> tuple[Report, dict[str, Path]]:
    """The run's report, its record finished (end time, load), written into ``out``; ``failed``:
    the rounds left out of steps that other rounds measured, noted under its heading.

    Raises:
        BundleError: no step ran, no step has figures, or no step got an answer (the report is
            written first where there are steps, so the reasons can be read).
    """
    if not steps:
        raise BundleError("no step ran")
    report = Report(
        title=title,
        record=record.finish(),
        steps=steps,
        baselines=baselines,
        settings=settings,
        notes=[f"round left out: {line}" for line in failed],
    )
    paths = write_report(report, out)
    if not any(step.measured for step in steps):
        first = steps[0]
        raise BundleError(
            f"no step gave figures; the first, {first.series} c={first.concurrency}: {first.failure}; "
            f"report: {paths['markdown']}"
        )
    if not any(step.requests for step in steps):
        kinds = {kind for step in steps for kind in step.error_kinds}
        raise BundleError(f"no step got an answer ({'; '.join(sorted(kinds)) or 'no request completed'}); "
                          f"report: {paths['markdown']}")  # fmt: skip
    return report, paths


def sweep_run(
    models: Sequence[str],
    protocols: Sequence[str],
    urls: Sequence[str],
    repository: Path | None,
    options: RunOptions,
    out: Path,
    title: str,
    command: str,
    raw: Path | None = None,
) -> tuple[Report, dict[str, Path]]:
    """Baseline, then sweep ``models`` over ``protocols``; write the report into ``out``.

    Args:
        models: model names.
        protocols: ``grpc`` and/or ``http``.
        urls: one ``host:port`` per protocol of a running server; empty: start a
            local tritonserver on ``repository`` (serving only ``models``).
        repository: the model repository (model files for the baseline; the
            served repository when no ``urls``).
        options: batch sizes, concurrency, durations, baseline.
        out: the report folder.
        title: the report's heading.
        command: the command line, recorded in the report.
        raw: where the payload, each step's raw files and server logs go (default ``out/raw``).
    """
    if urls and len(urls) != len(protocols):
        raise ConfigError(f"give one --url per --protocol ({len(protocols)}), got {len(urls)}")
    if not urls and repository is None:
        raise ConfigError("give --url of a running server, or --repository to start a local one")
    if urls and repository is None and options.baseline:
        raise ConfigError(
            "the in-process baseline (the served / in-process ratio of the report) reads the model files: "
            "add --repository DIR, the repository the server at --url serves, or --no-baseline"
        )
    if "perf_analyzer" in options.engines:
        if options.stream:
            raise ConfigError("perf_analyzer cycles its input data: --stream needs --engine locust or driver")
        require_perf_analyzer()
    if options.stream and any(is_raw_model(model) for model in models):
        raise ConfigError("--stream sends tensors, and a raw-row model takes the rows as text: use --cycle")
    raw = raw or out / "raw"
    out.mkdir(parents=True, exist_ok=True)
    record = RunRecord.begin(command)
    failed: list[str] = []
    payload = models_payload(raw, options.data, repository, urls, protocols, models, options.stream)
    cursor = StreamCursor(len(PayloadPool.load(payload).dense)) if options.stream else None
    sessions = in_process_models(repository, models, options)
    in_process: dict[str, list[BaselineResult]] = {}
    memory: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        endpoints = list(zip(protocols, urls, strict=True)) if urls else []
        if not urls and repository is not None:
            server = stack.enter_context(
                local_triton(repository, models, raw / "tritonserver.log", options.client_cpus)
            )
            endpoints = [(p, server.grpc_url if p == "grpc" else server.http_url) for p in protocols]
        targets = [
            Target(url, protocol, "triton", engine=engine)
            for protocol, url in endpoints
            for engine in options.engines
        ]
        steps = _sweep_targets(targets, models, options, raw, payload, sessions, in_process, cursor, failed)
        if not urls:
            # tritonserver and its python stubs (which hold the ONNX Runtime sessions), after the load.
            memory[SERVER_RSS] = round(sum(server.memory().values()) / 2**20, 1)
            memory[SERVER_ANON] = round(sum(server.memory(anonymous=True).values()) / 2**20, 1)
    settings = {
        **options.settings(),
        **_serving(repository, models),
        **wire_settings(payload, models, protocols, options.batch_sizes),
        **memory,
    }
    if cursor is not None:
        settings["Rows streamed"] = (
            f"{cursor.sent:,} sent over the run, {cursor.distinct:,} of them distinct, "
            f"of the stream's {cursor.rows:,}"
        )
    return _finish(title, record, steps, in_process, settings, out, failed)


def _peer_processes(
    model: str, path: Path, out: Path, serving: dict[str, int], protocol: str
) -> dict[str, Any]:
    """Factories of the two peers, each on free ports of 127.0.0.1."""
    from server.installation import TritonInstallation
    from server.ports import free_ports

    def pytriton() -> tuple[PeerProcess, Target]:
        http_port, grpc_port, metrics_port = free_ports(3)
        args = [
            "loadtest.sweeps.peers.pytriton_server", "serve", "--model-file", str(path), "--model", model,
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
            "--max-queue-delay-us", str(serving["max_queue_delay_us"]), "--threads", str(serving["threads"]),
        ]  # fmt: skip
        process = PeerProcess(
            "pytriton",
            args,
            ready=(http_port, f"/v2/models/{model}/ready"),
            log_file=out / "pytriton.log",
            # PyTriton's tritonserver and python stubs need what the bundle's local server needs
            # (the interpreter's libpython first on LD_LIBRARY_PATH), else the stub loads another
            # libpython than its standard library belongs to.
            env=TritonInstallation.locate().environment(),
        )
        port = grpc_port if protocol == "grpc" else http_port
        # PyTriton restricts its statistics endpoint to a generated token: no server statistics.
        return process, Target(f"127.0.0.1:{port}", protocol, "pytriton", server_stats=False)

    def fastapi() -> tuple[PeerProcess, Target]:
        (port,) = free_ports(1)
        args = [
            "loadtest.sweeps.peers.fastapi_server", "serve", "--model-file", str(path), "--model", model,
            "--port", str(port), "--threads", str(serving["threads"]),
        ]  # fmt: skip
        process = PeerProcess(
            "fastapi",
            args,
            ready=(port, "/v1/ready"),
            log_file=out / "fastapi.log",
        )
        return process, Target(f"127.0.0.1:{port}", "fastapi", "fastapi", server_stats=False)

    return {"pytriton": pytriton, "fastapi": fastapi}


PEERS: tuple[str, ...] = ("pytriton", "fastapi")


def compare_run(
    repository: Path,
    model: str,
    protocol: str,
    options: RunOptions,
    out: Path,
    title: str,
    command: str,
    peers: Sequence[str] = PEERS,
    raw: Path | None = None,
) -> tuple[Report, dict[str, Path]]:
    """The same model and sweep against the local Triton and each peer, their steps interleaved.

    Args:
        repository: holds ``<model>/1/model.onnx`` and its config.pbtxt; the
            peers serve the same file with the config's threads and queue delay.
        model: the model name.
        protocol: how the load reaches Triton and PyTriton (``grpc`` or ``http``);
            the FastAPI peer speaks its own binary HTTP format.
        options: batch sizes, concurrency, durations.
        out: the report folder.
        title: the report's title.
        command: the command line, recorded in the report.
        peers: which peers to run (``pytriton``, ``fastapi``).
        raw: where the payload, each step's raw files and server logs go (default ``out/raw``).
    """
    rounds = options.rounds
    if options.stream:
        raise ConfigError("compare cycles a pool for every server alike; --stream is for sweep")
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise ConfigError(f"unknown peers {sorted(unknown)}; choose from {', '.join(PEERS)}")
    path = model_file(repository, model)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist")
    raw = raw or out / "raw"
    out.mkdir(parents=True, exist_ok=True)
    record = RunRecord.begin(command)
    failed: list[str] = []
    payload = models_payload(raw, options.data, repository, [], [], [model])
    in_process: dict[str, list[BaselineResult]] = {}
    # Timed once, before any server runs: the peers are compared with each other.
    measure_in_process(
        in_process_models(repository, [model], options),
        options.batch_sizes,
        PayloadPool.load(payload),
        in_process,
    )
    serving = serving_settings(path)
    factories = _peer_processes(model, path, raw, serving, protocol)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            local_triton(repository, [model], raw / "tritonserver.log", options.client_cpus)
        )
        url = server.grpc_url if protocol == "grpc" else server.http_url
        targets = [Target(url, protocol, "triton")]
        for peer in peers:
            process, target = factories[peer]()
            stack.enter_context(process)
            console.print(f"{peer} peer pid {process.pid}: {target.protocol} {target.url}")
            targets.append(target)
        steps = _interleaved_steps(targets, model, options, raw, payload, failed=failed)
    rank = {target.label: i for i, target in enumerate(targets)}
    steps.sort(key=lambda step: (rank[step.label], step.batch_size, step.concurrency))
    settings = {
        **options.settings(),
        **_serving(repository, [model]),
        "Peers": "pytriton: PyTriton 0.7 binding one ONNX Runtime session (@batch, same dynamic batcher "
        "delay and threads); fastapi: FastAPI + uvicorn (1 worker), ONNX Runtime in its thread pool, "
        "binary request/response bodies",
        "Order": "all servers up at once (idle while another is measured); at each batch size and "
        "concurrency the servers take their step back to back, the first one rotating"
        + (
            f"; {rounds} rounds per level, each server's rates and percentiles the median of its rounds "
            "(requests and seconds: all rounds)"
            if rounds > 1
            else ""
        ),
    }
    return _finish(title, record, steps, in_process, settings, out, failed)


def _interleaved_steps(
    targets: Sequence[Target],
    model: str,
    options: RunOptions,
    out: Path,
    payload: Path,
    cursor: StreamCursor | None = None,
    failed: list[str] | None = None,
) -> list[StepResult]:
    """One step per target at each (batch size, concurrency), the targets back to back and the
    one that goes first rotating, so a machine whose load drifts over the run (shared cores)
    weighs on every server, protocol and engine alike instead of on whichever ran last. With
    ``options.rounds`` > 1 each level repeats that many times in a row and each target's step
    is the median of its rounds (:func:`loadtest.sweeps.steps.median_step`). A step whose engine
    gives no figures (perf_analyzer found no stable measurement, a load generator crashed) is told
    and kept, without figures and with the reason (:meth:`StepResult.without_figures`); the run
    goes on. ``failed`` gets a line for each round left out of a step that other rounds measured
    (the step's own row no longer says it)."""
    steps: list[StepResult] = []
    rounds = options.rounds
    turn = 0
    for batch_size in options.batch_sizes:
        config = options.sweep([model], batch_size, cursor)
        for concurrency in config.concurrency:
            level = replace(config, concurrency=(concurrency,))
            by_target: dict[Target, list[StepResult]] = {target: [] for target in targets}
            for round_ in range(rounds):
                console.print(
                    f"[bold]batch {batch_size}, concurrency {concurrency}"
                    + (f", round {round_ + 1}/{rounds}" if rounds > 1 else "")
                    + "[/bold]"
                )
                folder = out / f"round{round_ + 1}" if rounds > 1 else out
                for target in (*targets[turn:], *targets[:turn]):
                    try:
                        by_target[target] += run_sweep(target, level, folder, payload, on_step=_print_step)
                    except ConfigError:
                        raise
                    except BundleError as exc:
                        step = StepResult.without_figures(target, model, batch_size, concurrency, str(exc))
                        console.print(
                            f"  {step.series} c={concurrency}: no figures: {step.failure}",
                            highlight=False,
                            markup=False,
                        )
                        by_target[target].append(step)
                turn = (turn + 1) % len(targets)
            for results in by_target.values():
                missing = [r for r in results if not r.measured]
                if failed is not None and missing and len(missing) < len(results):
                    failed.append(
                        f"{missing[0].series} c={concurrency}: {len(missing)} of {len(results)} rounds "
                        f"gave no figures, the step's are the median of the others: {missing[0].failure}"
                    )
                steps.append(median_step(results))
    return steps
