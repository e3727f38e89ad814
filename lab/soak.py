"""Checked load and the soak: a local tritonserver under steady load for minutes, every answer checked.

Checked load (:func:`checked_load`, also what the fault tests in
``tests/integration/test_reliability.py`` drive): the closed-loop driver
(:mod:`loadtest.engine.driver`) paced to a steady rate, each worker with its own
:class:`clients.triton.TritonClient` (HTTP or gRPC, retrying UNAVAILABLE by
its :class:`~clients.retry.RetryPolicy`), drawing a :class:`Case` at random,
and comparing the answer with every answer the case allows (e.g. the old and
the new version of a model during a reload): the label of the first that
matches is counted; no match is a *wrong* answer, an exception that survived
the retries an *error*.

The soak (:func:`run_soak`, ``python -m lab soak``) starts the bundle's
local tritonserver on a repository, keeps it under checked load (batch sizes
mixed, every answer compared with ONNX Runtime in this process), samples the
resident memory (RSS) of tritonserver and of its python stub processes every
few seconds, and reports:

- requests, rows, errors (target 0) and wrong answers (target 0);
- RSS growth from the end of the warm-up to the end (target < 5 %): the
  warm-up lets ONNX Runtime's arenas and the python backend's shared memory
  grow to the largest batch first, so what remains is growth under steady load;
- latency percentiles, and the server's own success and failure counts.

:func:`write_result` writes ``result.json``, ``result.md`` and ``rss.png``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from bundle.repository import MODEL_FILE, version_dir
from bundle.schema import RAW_MODEL_SUFFIX, is_raw_model
from bundle.snippets import section, section_end, section_start
from clients.options import Protocol
from clients.reference import OnnxReference
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from clients.verify import repository_models, sample_rows_with_text
from criteo.tsv import Batch, RowText
from loadtest.engine.driver import Answer, Connect, Driver, Request
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown

logger = logging.getLogger(__name__)

#: Targets of the soak: no failed request, resident memory growth under 5 %.
MAX_ERRORS = 0
MAX_RSS_GROWTH = 0.05


class SoakFailed(BundleError):
    """The soak missed a target (errors, wrong answers or RSS growth)."""


# ------------------------------------------------------------------ checked load
@dataclass(frozen=True)
class Case:
    """One request the load may send, with the answers it accepts.

    Args:
        model: model name.
        batch: the inputs (``B x 13`` dense, ``B x 26`` ids; or, for a raw-row model, the rows' text).
        answers: accepted ``B x 1`` outputs by label (e.g. ``{"v1": ..., "v2": ...}``).
        atol: largest absolute difference that still matches.
    """

    model: str
    batch: Batch | RowText
    answers: Mapping[str, np.ndarray]
    atol: float = 1e-6

    def __post_init__(self) -> None:
        if not self.answers:
            raise ConfigError(f"case for model {self.model!r} accepts no answer")
        for label, answer in self.answers.items():
            if answer.shape != (len(self.batch), 1):
                raise ConfigError(
                    f"answer {label!r} of model {self.model!r} has shape {answer.shape}, "
                    f"expected ({len(self.batch)}, 1)"
                )

    def label(self, output: np.ndarray) -> str | None:
        """The label of the accepted answer ``output`` matches, or None."""
        if output.shape != (len(self.batch), 1):
            return None
        for label, answer in self.answers.items():
            if np.all(np.abs(output - answer) <= self.atol):
                return label
        return None


@dataclass(frozen=True)
class Endpoint:
    """Where one worker sends, and over which protocol."""

    url: str
    protocol: Protocol


def checked_requests(
    endpoints: Sequence[Endpoint], cases: Sequence[Case], retry: RetryPolicy, timeout_s: float, seed: int
) -> Connect:
    """Worker ``i``'s connection: a client of ``endpoints[i]`` drawing ``cases`` at random (seed + i)."""
    if not endpoints or not cases:
        raise ConfigError("checked load needs at least one endpoint and one case")

    @contextmanager
    def connect(worker: int) -> Iterator[Request]:
        endpoint = endpoints[worker % len(endpoints)]
        rng = np.random.default_rng(seed + worker)
        with TritonClient(endpoint.url, endpoint.protocol, timeout_s, retry=retry) as client:

            def request(_: int) -> Answer:
                case = cases[int(rng.integers(len(cases)))]
                return Answer(len(case.batch), case.label(client.infer(case.model, case.batch.inputs())))

            yield request

    return connect


def checked_load(
    endpoints: Sequence[Endpoint],
    cases: Sequence[Case],
    rate: float,
    retry: RetryPolicy | None = None,
    timeout_s: float = 10.0,
    seed: int = 0,
) -> Driver:
    """A driver (not started) with one worker per endpoint, ``rate`` requests/s in all, every
    answer checked against its case."""
    connect = checked_requests(endpoints, cases, retry or RetryPolicy(), timeout_s, seed)
    return Driver(connect, len(endpoints), rate=rate, seed=seed)


# ------------------------------------------------------------------ the soak
@dataclass(frozen=True)
class SoakConfig:
    """One soak run.

    Args:
        repository: the model repository to serve.
        models: models to load and send to; every ONNX model of the repository when empty. A
            raw-row model (``<model>_raw``) is sent its rows' text and checked against its base
            model's reference on the same rows.
        references: ``(model, ONNX file)`` pairs: the in-graph model whose in-process answers a
            served model must give, for a model without an ONNX file of its own (a hot/cold
            ensemble: the same checkpoint exported in-graph); every other model is checked
            against its own ``model.onnx``.
        duration_s: length of the load, warm-up included.
        warmup_s: the RSS baseline is the first sample at or after this time.
        rate: requests per second over all client threads.
        threads: client threads; they alternate gRPC and HTTP.
        batch_sizes: request sizes, drawn uniformly per request.
        sample_interval_s: seconds between RSS samples.
        data: a Criteo TSV file to take rows from; synthetic rows when None.
        log_file: tritonserver's log.
        seed: of the rows and of the request draws.
    """

    repository: Path
    models: tuple[str, ...] = ()
    references: tuple[tuple[str, Path], ...] = ()
    duration_s: float = 600.0
    warmup_s: float = 60.0
    rate: float = 100.0
    threads: int = 2
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    sample_interval_s: float = 5.0
    data: Path | None = None
    log_file: Path = Path("logs/soak-tritonserver.log")
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "repository", Path(self.repository))
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "batch_sizes", tuple(self.batch_sizes))
        object.__setattr__(self, "references", tuple((str(m), Path(f)) for m, f in self.references))
        if not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s!r}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ConfigError(f"warmup_s must be in [0, duration_s), got {self.warmup_s!r}")
        if not self.rate > 0:
            raise ConfigError(f"rate must be > 0, got {self.rate!r}")
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads!r}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"batch_sizes must be positive, got {list(self.batch_sizes)}")
        if not self.sample_interval_s > 0:
            raise ConfigError(f"sample_interval_s must be > 0, got {self.sample_interval_s!r}")


@dataclass
class MemorySample:
    """tritonserver's and its stubs' resident memory at one moment (bytes)."""

    t_s: float
    server_rss: int
    stubs_rss: int

    @property
    def total(self) -> int:
        return self.server_rss + self.stubs_rss


@dataclass
class SoakResult:
    """What :func:`run_soak` measured (see the module docstring)."""

    config: dict[str, Any]
    record: RunRecord
    tritonserver: str
    models: list[str]
    seconds: float
    load: dict[str, Any]
    server_counts: dict[str, dict[str, int]]
    memory: list[MemorySample] = field(default_factory=list)
    baseline_index: int = 0
    completed: bool = True

    @property
    def rss_start(self) -> int:
        """Total RSS right after the server was ready."""
        return self.memory[0].total

    @property
    def rss_baseline(self) -> int:
        """Total RSS at the end of the warm-up."""
        return self.memory[self.baseline_index].total

    @property
    def rss_end(self) -> int:
        return self.memory[-1].total

    @property
    def rss_growth(self) -> float:
        """RSS growth from the end of the warm-up to the end, as a fraction."""
        return (self.rss_end - self.rss_baseline) / self.rss_baseline

    @property
    def passed(self) -> bool:
        """Whole run served, errors and wrong answers at most the target, RSS growth under it."""
        return (
            self.completed
            and self.load["errors"] + self.load["wrong"] <= MAX_ERRORS
            and self.rss_growth < MAX_RSS_GROWTH
            and self.load["requests"] > 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.record.to_json(),
            "config": self.config,
            "tritonserver": self.tritonserver,
            "models": self.models,
            "seconds": self.seconds,
            "load": self.load,
            "server_counts": self.server_counts,
            "memory": [
                {
                    "t_s": round(m.t_s, 1),
                    "server_rss": m.server_rss,
                    "stubs_rss": m.stubs_rss,
                    "total": m.total,
                }
                for m in self.memory
            ],
            "baseline_index": self.baseline_index,
            "completed": self.completed,
            "summary": {
                "requests": self.load["requests"],
                "errors": self.load["errors"],
                "wrong": self.load["wrong"],
                "rss_start_bytes": self.rss_start,
                "rss_after_warmup_bytes": self.rss_baseline,
                "rss_end_bytes": self.rss_end,
                "rss_growth": round(self.rss_growth, 5),
                "targets": {"errors": MAX_ERRORS, "rss_growth_below": MAX_RSS_GROWTH},
                "passed": self.passed,
            },
        }


def _rows(config: SoakConfig, count: int) -> tuple[Batch, RowText]:
    """``count`` rows, parsed and as their text (the same rows, read or generated once)."""
    batch, text = sample_rows_with_text(config.data, count, seed=config.seed + 1000)
    rows = np.empty((len(text), 1), dtype=np.object_)
    rows[:, 0] = text.tolist()
    return batch, RowText(rows, 1, str(config.data or "<synthetic>"))


def reference_file(config: SoakConfig, model: str) -> Path:
    """The ONNX file whose in-process answers ``model`` must give (:attr:`SoakConfig.references`).

    Raises:
        ConfigError: a model without an ONNX file of its own that no reference names.
    """
    named = dict(config.references)
    base = model.removesuffix(RAW_MODEL_SUFFIX)
    for key in (model, base):
        if key in named:
            if not named[key].is_file():
                raise ConfigError(f"the reference of model {key!r} is not a file: {named[key]}")
            return named[key]
    own = version_dir(config.repository, base) / MODEL_FILE
    if not own.is_file():
        raise ConfigError(
            f"model {base!r} has no {MODEL_FILE} to check its answers against (a hot/cold ensemble?): "
            f"name the in-graph export of the same checkpoint with --reference {base}=PATH/{MODEL_FILE}"
        )
    return own


def _cases(config: SoakConfig, models: list[str]) -> list[Case]:
    """Per model and batch size, a slice of real rows and ONNX Runtime's answer for it."""
    rows, text = _rows(config, sum(config.batch_sizes))
    cases = []
    for model in models:
        reference = OnnxReference(reference_file(config, model))
        start = 0
        for size in config.batch_sizes:
            batch = rows.slice(start, start + size)
            sent = text.slice(start, start + size) if is_raw_model(model) else batch
            start += size
            cases.append(Case(model, sent, {"in_process": reference.predict(batch)}))
    return cases


class _MemorySampler:
    """Samples ``server.memory()`` every ``interval_s`` in a thread."""

    def __init__(self, server: Any, interval_s: float) -> None:
        self._server = server
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._started = time.monotonic()
        self.samples: list[MemorySample] = []

    def sample(self) -> None:
        rss = self._server.memory()
        if rss and self._server.pid in rss:
            server_rss = rss[self._server.pid]
            self.samples.append(
                MemorySample(time.monotonic() - self._started, server_rss, sum(rss.values()) - server_rss)
            )

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()

    def __enter__(self) -> _MemorySampler:
        self._started = time.monotonic()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _server_counts(url: str, models: list[str]) -> dict[str, dict[str, int]]:
    with TritonClient(url, "grpc") as client:
        stats = {s.name: s for s in client.statistics()}
    return {
        name: {
            "success": stats[name].success_count,
            "fail": stats[name].fail_count,
            "rows": stats[name].inference_count,
        }
        for name in models
        if name in stats
    }


def run_soak(config: SoakConfig, command: str) -> SoakResult:
    """Serve ``config.repository`` locally and keep it under checked load for ``config.duration_s``.

    Args:
        config: the run.
        command: the command line to record.

    Returns:
        The measurements; :attr:`SoakResult.passed` says whether the targets held.
    """
    from server import LocalServer, ServerConfig

    models = list(config.models) or repository_models(config.repository)
    if not models:
        raise ConfigError(f"{config.repository} holds no ONNX models")
    cases = _cases(config, models)
    record = RunRecord.begin(command)
    server_config = ServerConfig.with_free_ports(
        config.repository, model_control_mode="explicit", load_models=tuple(models), log_file=config.log_file
    )
    with LocalServer(server_config) as server:
        urls = {"grpc": server.grpc_url, "http": server.http_url}
        protocols: list[Protocol] = [("grpc", "http")[index % 2] for index in range(config.threads)]
        endpoints = [Endpoint(urls[protocol], protocol) for protocol in protocols]
        version = str(server.metadata().get("version", "?"))
        logger.info(
            "soak: %s for %.0f s at %.0f requests/s over %d threads (log %s)",
            ", ".join(models), config.duration_s, config.rate, config.threads, config.log_file,
        )  # fmt: skip
        # No retries: a request that meets UNAVAILABLE counts as an error here.
        # Counted from here: the models' config warm-up requests are already in the statistics.
        counts_before = _server_counts(server.grpc_url, models)
        load = checked_load(endpoints, cases, config.rate, RetryPolicy(max_tries=1), seed=config.seed)
        started = time.monotonic()
        next_report = 60.0
        with _MemorySampler(server, config.sample_interval_s) as sampler, load:
            while (elapsed := time.monotonic() - started) < config.duration_s and server.running:
                time.sleep(min(1.0, config.duration_s - elapsed))
                if elapsed >= next_report:
                    next_report += 60.0
                    total = load.total
                    logger.info("soak: %.0f s, %d requests, %d errors", elapsed, total.requests, total.errors)
        seconds = time.monotonic() - started
        completed = server.running
        if not completed:
            logger.error("soak: tritonserver exited after %.0f s (log %s)", seconds, config.log_file)
        counts = {}
        if completed:
            counts_after = _server_counts(server.grpc_url, models)
            counts = {
                name: {key: value - counts_before[name][key] for key, value in after.items()}
                for name, after in counts_after.items()
            }
    baseline = next(
        (i for i, s in enumerate(sampler.samples) if s.t_s >= config.warmup_s), len(sampler.samples) - 1
    )
    return SoakResult(
        config={
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
            "references": {model: str(path) for model, path in config.references},
        },
        record=record.finish(),
        tritonserver=version,
        models=models,
        seconds=round(seconds, 1),
        load=load.total.summary(),
        server_counts=counts,
        memory=sampler.samples,
        baseline_index=baseline,
        completed=completed,
    )


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


RSS_PNG = "rss.png"


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes: the
#: targets and figures below the title, and the line under the chart that says where the samples are.
SECTION_RESULTS = "results"
SECTION_SAMPLES = "samples"


def markdown(result: SoakResult) -> list[str]:
    """A short human-readable report of ``result``."""
    load, config = result.load, result.config
    latency = load["latency_ms"]
    verdict = "passed" if result.passed else "FAILED"
    lines = [
        "# Soak: the local tritonserver under steady load",
        "",
        section_start(SECTION_RESULTS),
        f"Targets: 0 failed requests, RSS growth < {MAX_RSS_GROWTH:.0%} (tritonserver + its python stubs, "
        f"from the end of the {config['warmup_s']:.0f} s warm-up to the end). Result: **{verdict}**.",
        "",
        *result.record.lines(),
        f"- **Server**: tritonserver {result.tritonserver} (nvidia-pytriton wheel), Python-based onnxruntime "
        f"backend; models: {', '.join(result.models)}",
        f"- **Load**: {config['rate']:.0f} requests/s over {config['threads']} client threads "
        f"({'gRPC and HTTP' if config['threads'] > 1 else 'gRPC'}), batch sizes {config['batch_sizes']}, "
        "every answer compared with ONNX Runtime in process"
        + "".join(
            f"; {model}'s with `{path}`" for model, path in sorted((config.get("references") or {}).items())
        ),
        "",
        *table(
            ["", "value"],
            [
                ["duration", f"{result.seconds:.0f} s"],
                ["requests", str(load["requests"])],
                ["rows", str(load["rows"])],
                ["errors", str(load["errors"])],
                ["wrong answers", str(load["wrong"])],
                [
                    "latency p50 / p99 / p99.9",
                    f"{latency.get('p50', '-')} / {latency.get('p99', '-')} / {latency.get('p99.9', '-')} ms",
                ],
                ["RSS right after start", _mib(result.rss_start)],
                ["RSS after warm-up", _mib(result.rss_baseline)],
                ["RSS at end", _mib(result.rss_end)],
                ["**RSS growth after warm-up**", f"**{result.rss_growth:+.2%}**"],
            ],
        ),
        "",
        "Server-side counts during the load (statistics API; a model an ensemble calls counts those "
        "calls too): "
        + ", ".join(
            f"{name} {c['success']} ok / {c['fail']} failed" for name, c in result.server_counts.items()
        ),
        "",
    ]
    if load["error_kinds"]:
        lines += ["Errors:", "", *(f"- {count} x {kind}" for kind, count in load["error_kinds"].items()), ""]
    while lines[-1] == "":
        lines.pop()
    lines += [section_end(SECTION_RESULTS), "", f"![RSS over the run]({RSS_PNG})", ""]
    lines += section(SECTION_SAMPLES, ["RSS samples are in `result.json`."])
    return lines


def write_result(result: SoakResult, out_dir: Path) -> dict[str, Path]:
    """Write ``result.json``, ``result.md`` and ``rss.png`` (RSS against time) into ``out_dir``."""
    seconds = [s.t_s for s in result.memory]
    mib = 2.0**20
    panel = Panel(
        "resident memory during the soak",
        "seconds since the server was ready",
        "RSS (MiB)",
        [
            Series("tritonserver + stubs", seconds, [s.total / mib for s in result.memory], ".-"),
            Series("tritonserver", seconds, [s.server_rss / mib for s in result.memory], ".-"),
            Series("python stubs", seconds, [s.stubs_rss / mib for s in result.memory], ".-"),
        ],
        vlines=[(result.memory[result.baseline_index].t_s, "RSS baseline (end of warm-up)")],
    )
    return {
        "json": write_json(out_dir / "result.json", result.as_dict()),
        "markdown": write_markdown(out_dir / "result.md", markdown(result)),
        "png": plot(out_dir / RSS_PNG, "Soak: the local tritonserver under steady load", [panel]),
    }
