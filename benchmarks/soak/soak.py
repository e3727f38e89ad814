"""The soak: a local tritonserver under steady load for minutes; requests, errors and memory growth.

:func:`run_soak` starts the bundle's local tritonserver on a repository,
sends a steady rate of requests from a few client threads (HTTP and gRPC,
batch sizes mixed, every answer compared with ONNX Runtime in this process),
samples the resident memory (RSS) of tritonserver and of its python stub
processes every few seconds, and reports:

- requests, rows, errors (target 0) and wrong answers (target 0);
- RSS growth from the end of the warm-up to the end (target < 5 %): the
  warm-up lets ONNX Runtime's arenas and the python backend's shared memory
  grow to the largest batch first, so what remains is growth under steady load;
- latency percentiles, and the server's own success and failure counts.

:func:`write_result` writes ``result.json`` and ``result.md`` with the machine,
the command, the date and the load average (the machine may be shared).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from benchmarks.soak.load import Case, LoadLoop, Worker
from bundle.errors import ConfigError
from clients.bench import machine_info
from clients.reference import OnnxReference
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from clients.verify import repository_models
from criteo.synth import SynthConfig, write_tsv
from criteo.tsv import Batch, read_batch
from server import LocalServer, ServerConfig

logger = logging.getLogger(__name__)

#: Targets of the issue: no failed request, resident memory growth under 5 %.
MAX_ERRORS = 0
MAX_RSS_GROWTH = 0.05


@dataclass(frozen=True)
class SoakConfig:
    """One soak run.

    Args:
        repository: the model repository to serve.
        models: models to load and send to; every ONNX model of the repository when empty.
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
    date: str
    command: str
    machine: dict[str, Any]
    load_average_start: tuple[float, float, float]
    load_average_end: tuple[float, float, float]
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
        document = asdict(self)
        document["memory"] = [
            {"t_s": round(s.t_s, 1), "server_rss": s.server_rss, "stubs_rss": s.stubs_rss, "total": s.total}
            for s in self.memory
        ]
        document["summary"] = {
            "requests": self.load["requests"],
            "errors": self.load["errors"],
            "wrong": self.load["wrong"],
            "rss_start_bytes": self.rss_start,
            "rss_after_warmup_bytes": self.rss_baseline,
            "rss_end_bytes": self.rss_end,
            "rss_growth": round(self.rss_growth, 5),
            "targets": {"errors": MAX_ERRORS, "rss_growth_below": MAX_RSS_GROWTH},
            "passed": self.passed,
        }
        return document


def _rows(config: SoakConfig, count: int) -> Batch:
    if config.data is not None:
        return read_batch(config.data, count)
    path = config.log_file.parent / "soak-rows.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_tsv(SynthConfig(rows=count, seed=config.seed + 1000), path)
    try:
        return read_batch(path)
    finally:
        path.unlink()


def _cases(config: SoakConfig, models: list[str]) -> list[Case]:
    """Per model and batch size, a slice of real rows and ONNX Runtime's answer for it."""
    rows = _rows(config, sum(config.batch_sizes))
    cases = []
    for model in models:
        reference = OnnxReference(config.repository / model / "1" / "model.onnx")
        start = 0
        for size in config.batch_sizes:
            batch = rows.slice(start, start + size)
            start += size
            cases.append(Case(model, batch, {"in_process": reference.predict(batch)}))
    return cases


class _MemorySampler:
    """Samples ``server.memory()`` every ``interval_s`` in a thread."""

    def __init__(self, server: LocalServer, interval_s: float) -> None:
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


def run_soak(config: SoakConfig, command: str = "") -> SoakResult:
    """Serve ``config.repository`` locally and keep it under load for ``config.duration_s``.

    Args:
        config: the run.
        command: the command line to record (this process's when empty).

    Returns:
        The measurements; :attr:`SoakResult.passed` says whether the targets held.
    """
    models = list(config.models) or repository_models(config.repository)
    if not models:
        raise ConfigError(f"{config.repository} holds no ONNX models")
    cases = _cases(config, models)
    load_start = os.getloadavg()
    date = datetime.now(UTC).isoformat(timespec="seconds")
    server_config = ServerConfig.with_free_ports(
        config.repository, model_control_mode="explicit", load_models=tuple(models), log_file=config.log_file
    )
    with LocalServer(server_config) as server:
        urls = {"grpc": server.grpc_url, "http": server.http_url}
        protocols = [("grpc", "http")[index % 2] for index in range(config.threads)]
        workers = [Worker(urls[protocol], protocol) for protocol in protocols]  # type: ignore[arg-type]
        version = str(server.metadata().get("version", "?"))
        logger.info(
            "soak: %s for %.0f s at %.0f requests/s over %d threads (log %s)",
            ", ".join(models), config.duration_s, config.rate, config.threads, config.log_file,
        )  # fmt: skip
        # No retries: a request that meets UNAVAILABLE counts as an error here.
        # Counted from here: the models' config warm-up requests are already in the statistics.
        counts_before = _server_counts(server.grpc_url, models)
        loop = LoadLoop(workers, cases, rate=config.rate, retry=RetryPolicy(max_tries=1), seed=config.seed)
        started = time.monotonic()
        next_report = 60.0
        with _MemorySampler(server, config.sample_interval_s) as sampler, loop:
            while (elapsed := time.monotonic() - started) < config.duration_s and server.running:
                time.sleep(min(1.0, config.duration_s - elapsed))
                if elapsed >= next_report:
                    next_report += 60.0
                    stats = loop.stats
                    logger.info("soak: %.0f s, %d requests, %d errors", elapsed, stats.requests, stats.errors)
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
        config={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        date=date,
        command=command or shlex.join(["python", "-m", "benchmarks.soak", *sys.argv[1:]]),
        machine={**machine_info(), "memory_bytes": psutil.virtual_memory().total},
        load_average_start=_rounded(load_start),
        load_average_end=_rounded(os.getloadavg()),
        tritonserver=version,
        models=models,
        seconds=round(seconds, 1),
        load=loop.stats.as_dict(),
        server_counts=counts,
        memory=sampler.samples,
        baseline_index=baseline,
        completed=completed,
    )


def _rounded(values: tuple[float, float, float]) -> tuple[float, float, float]:
    return (round(values[0], 2), round(values[1], 2), round(values[2], 2))


def _mib(value: int) -> str:
    return f"{value / 2**20:.1f} MiB"


def markdown(result: SoakResult) -> str:
    """A short human-readable report of ``result``."""
    load, machine, config = result.load, result.machine, result.config
    latency = load["latency_ms"]
    verdict = "passed" if result.passed else "FAILED"
    lines = [
        "# Soak: the local tritonserver under steady load",
        "",
        f"Targets: 0 failed requests, RSS growth < {MAX_RSS_GROWTH:.0%} (tritonserver + its python stubs, "
        f"from the end of the {config['warmup_s']:.0f} s warm-up to the end). Result: **{verdict}**.",
        "",
        f"- date: {result.date}",
        f"- command: `{result.command}`",
        f"- machine: {machine.get('cpu')}, {machine.get('cpus')} CPUs ({machine.get('cpus_usable')} usable), "
        f"{_mib(machine.get('memory_bytes', 0))} RAM, {machine.get('os')}",
        f"- load average (1, 5, 15 min) at start {tuple(result.load_average_start)} and end "
        f"{tuple(result.load_average_end)}: the machine is shared with other jobs",
        f"- tritonserver {result.tritonserver} (nvidia-pytriton wheel), Python-based onnxruntime backend; "
        f"models: {', '.join(result.models)}",
        f"- load: {config['rate']:.0f} requests/s over {config['threads']} client threads (gRPC and HTTP), "
        f"batch sizes {config['batch_sizes']}, every answer compared with ONNX Runtime in process",
        "",
        "| | value |",
        "|---|---:|",
        f"| duration | {result.seconds:.0f} s |",
        f"| requests | {load['requests']} |",
        f"| rows | {load['rows']} |",
        f"| errors | {load['errors']} |",
        f"| wrong answers | {load['wrong']} |",
        f"| latency p50 / p99 / p99.9 | {latency.get('p50', '-')} / {latency.get('p99', '-')} / "
        f"{latency.get('p99.9', '-')} ms |",
        f"| RSS right after start | {_mib(result.rss_start)} |",
        f"| RSS after warm-up | {_mib(result.rss_baseline)} |",
        f"| RSS at end | {_mib(result.rss_end)} |",
        f"| **RSS growth after warm-up** | **{result.rss_growth:+.2%}** |",
        "",
        "Server-side counts during the load (statistics API): "
        + ", ".join(
            f"{name} {c['success']} ok / {c['fail']} failed" for name, c in result.server_counts.items()
        ),
        "",
    ]
    if load["error_kinds"]:
        lines += ["Errors:", "", *(f"- {count} x {kind}" for kind, count in load["error_kinds"].items()), ""]
    lines += ["RSS samples (time, total) are in `result.json`.", ""]
    return "\n".join(lines)


def write_result(result: SoakResult, out_dir: Path) -> tuple[Path, Path]:
    """Write ``result.json`` and ``result.md`` into ``out_dir``; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "result.json", out_dir / "result.md"
    json_path.write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path
