"""A hot/cold model served with its cold tier really on disk: cold against warm, side by side.

``python -m lab cold-tier --repository DIR --data HELDOUT.tsv`` starts the local
tritonserver on a repository holding a hot/cold model (an ensemble of the
embedding stage and the dense model) and, for each way of reading cold rows
(:class:`~export.stage.hot_cold_lookup.ColdReads`, loaded into the stage
by a config override), batch size and concurrency, measures two conditions in turn:

- **cold**: the stage unloaded and loaded again (its load reads the whole store to
  verify it, through ``pread``, so nothing is mapped yet), then the store evicted
  from the page cache (``posix_fadvise(DONTNEED)``; the bytes still resident are
  recorded), then the step;
- **warm**: the whole store read into the page cache first (``--warm resident``), or a pool
  of held-out rows sent once before a window that sends them over and over
  (``--warm cycled``: a way with the stage's own cache of cold rows fills it so), then
  the step.

Each step sends the held-out file's rows in order, each once (the closed-loop
driver, :mod:`loadtest.engine.driver`, over gRPC), and starts at the file's first
row: a cold step's rows are cold again after the eviction. Per step it records
samples/s, p50 and p99, the stage's compute time per request (Triton's statistics
of the stage), its cold lookups per request (the stage's
``ctr_embedding_lookups_total`` counter), and the pages read from disk per request (the
bytes the server's processes had the kernel fetch from storage during the window,
``read_bytes``, in pages: through the page cache or, for a way with the stage's own
cache, with O_DIRECT). The disk's own random-read rate is probed in the same run
(:func:`~lab.cold_reads.disk_iops`); a cold step's *disk-bound
time* per request is its pages read / the best probed rate.

Writes ``cold_tier.json``, ``cold_tier.md`` and ``cold_tier.png``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bundle.errors import ConfigError
from bundle.records import RunRecord, machine_with_flags
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT
from bundle.snippets import section_end, section_start
from criteo.tsv import iter_batches
from export.stage.hot_cold_lookup import (
    COLD_READ_FAULT,
    COLD_READS,
    PAGE_BYTES,
    PARAM_COLD_CACHE_BYTES,
    PARAM_COLD_READ_THREADS,
    PARAM_COLD_READS,
    STORE_ROWS_FILE,
    StoreRows,
    open_store,
)
from lab.cold_reads import disk_table, evict, probe_disk, resident_bytes, stage_files
from loadtest.engine.driver import Driver
from loadtest.engine.served import raw_connection
from loadtest.engine.session import THREADS_PARAMETER
from loadtest.engine.wire import serialised_request
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from server.config import ServerConfig
from server.launcher import LocalServer
from server.processes import tree_cpu_s, tree_read_bytes

#: The two conditions, in the order each step takes them.
CONDITIONS = ("cold", "warm")
#: What a warm step means (:class:`ColdTierOptions`).
WARM_CONDITIONS = ("resident", "cycled")
#: A way's suffix in :attr:`ColdTierOptions.ways`: the stage keeps a cache of cold rows
#: (``cold_cache_bytes``) and reads what it misses that way.
CACHED = "+cache"
#: Bytes read at a time when the store is read into the page cache.
_WARM_READ_BYTES = 16 << 20
#: Evictions tried before a step starts with what is still resident (a stub that has
#: just exited may still hold its mapping for a moment).
_EVICT_TRIES = 10
logger = logging.getLogger(__name__)

#: Tries of one round's steps of one store: a hung server is replaced once.
_BLOCK_ATTEMPTS = 2


@dataclass(frozen=True)
class ColdTierOptions:
    """What to measure.

    Args:
        repositories: repositories each holding the hot/cold model (e.g. the same model with
            an FP16 and an int8 store), measured side by side.
        data: held-out Criteo TSV, sent in order (each row once per step).
        model: the ensemble clients call.
        stage: its embedding stage.
        ways: the ways of reading cold rows compared (:data:`COLD_READS`), each but ``fault``
            also with :data:`CACHED`: the stage's own cache of ``cold_cache_bytes`` in front.
        cold_cache_bytes: the stage's cache of cold rows, for the ways with :data:`CACHED`.
        batch_sizes: rows per request.
        concurrency: requests in flight.
        rounds: turns the steps take (each round: every way, batch size, concurrency, condition).
        seconds: the measured window of a step.
        warmup_s: requests sent before the window (rows of the same stream).
        threads: threads of the ``threads`` way.
        probe_seconds: seconds of each disk probe.
        stream_rows: held-out rows read (a step that would send more fails and says so).
        warm: what a warm step means: ``resident`` (the whole store read into memory first;
            it must fit) or ``cycled`` (a pool of the first ``pool_rows`` held-out rows sent
            once, then over and over: their pages cached, as a load test that cycles a pool
            sees it; for a store larger than memory).
        pool_rows: rows of the ``cycled`` pool.
        stage_instances: instances of the embedding stage for the run (0: as exported).
        dense_instances: instances of the ensemble's dense model for the run (0: as exported).
        dense_threads: ONNX Runtime intra-op threads of each (0: as exported).
    """

    repositories: tuple[Path, ...]
    data: Path
    model: str = "dlrm_onnx"
    stage: str = "dlrm_embedding"
    ways: tuple[str, ...] = ("io_uring", "fault")
    batch_sizes: tuple[int, ...] = (64, 1024)
    concurrency: tuple[int, ...] = (1, 4)
    rounds: int = 2
    seconds: float = 20.0
    warmup_s: float = 1.0
    threads: int = 8
    probe_seconds: float = 5.0
    stream_rows: int = 1_500_000
    warm: str = "resident"
    pool_rows: int = 32_768
    stage_instances: int = 0
    dense_instances: int = 0
    dense_threads: int = 0
    cold_cache_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.repositories:
            raise ConfigError("give at least one repository")
        known = [*COLD_READS, *(way + CACHED for way in COLD_READS if way != COLD_READ_FAULT)]
        unknown = [way for way in self.ways if way not in known]
        if unknown or not self.ways:
            raise ConfigError(f"ways must be some of {', '.join(known)}; got {list(self.ways)}")
        if any(way.endswith(CACHED) for way in self.ways):
            if self.cold_cache_bytes < 1:
                raise ConfigError(f"a way with {CACHED} needs a cold cache size (cold_cache_bytes) >= 1")
            if self.warm != "cycled":
                raise ConfigError(
                    f"a way with {CACHED} keeps rows that requests read, not pages of the page cache: "
                    "its warm steps must be 'cycled'"
                )
        if (
            not self.batch_sizes
            or min(self.batch_sizes) < 1
            or not self.concurrency
            or min(self.concurrency) < 1
        ):
            raise ConfigError("batch sizes and concurrency must be integers >= 1")
        if self.rounds < 1 or self.seconds <= 0 or self.warmup_s < 0:
            raise ConfigError("need rounds >= 1, seconds > 0 and warmup_s >= 0")
        if min(self.stage_instances, self.dense_instances, self.dense_threads) < 0:
            raise ConfigError("stage and dense instances and threads must be >= 0 (0: as exported)")
        if self.warm not in WARM_CONDITIONS or self.pool_rows < 1:
            raise ConfigError(f"warm must be one of {', '.join(WARM_CONDITIONS)}, with pool_rows >= 1")


class StreamExhausted(Exception):
    """A step would send a row twice: not a request's error, the end of the measurement (the
    driver stops and raises it)."""


class _Stream:
    """The held-out rows as model inputs, sent in order from the first row on each step."""

    def __init__(self, path: Path, rows: int) -> None:
        dense, categorical, have = [], [], 0
        for batch in iter_batches(path):
            dense.append(batch.dense)
            categorical.append(batch.categorical)
            have += len(batch)
            if have >= rows:
                break
        self.dense = np.concatenate(dense)[:rows]
        self.categorical = np.concatenate(categorical)[:rows]

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def connect(
        self, url: str, model: str, batch_size: int, workers: int, sent: list[int], cycle: int = 0
    ) -> Any:
        """The driver's requests: worker ``w``'s ``k``-th request takes batch ``w + k * workers``
        (modulo ``cycle`` batches when ``cycle`` > 0: a pool sent over and over)."""
        batches = len(self) // batch_size

        def message(worker: int, sequence: int) -> bytes:
            index = worker + sequence * workers
            if cycle:
                index %= cycle
            if index >= batches:
                raise StreamExhausted(
                    f"the step sent all {len(self):,} rows read; give more --stream-rows or fewer --seconds"
                )
            sent.append(index)
            row = index * batch_size
            rows = {
                DENSE_INPUT: self.dense[row : row + batch_size],
                CATEGORICAL_INPUT: self.categorical[row : row + batch_size],
            }
            return serialised_request(model, rows)

        return raw_connection(url, "grpc", model, 0, 120.0, batch_size, message)


def _warm(store: StoreRows) -> None:
    """Read the whole store into the page cache."""
    with open(store.path / STORE_ROWS_FILE, "rb", buffering=0) as handle:
        while handle.read(_WARM_READ_BYTES):
            pass


def _cold_lookups(metrics_url: str, stage: str) -> float:
    """The stage's cold lookups so far (its counter, summed over stubs)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("ctr_embedding_lookups_total{")
            and 'tier="cold"' in line
            and f'model="{stage}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@dataclass(frozen=True)
class _Cpu:
    """CPU seconds so far: each process of the server's tree (tritonserver, whose threads run the
    compiled stage, and the stubs of its python-backend models), the machine's interrupt handling
    (I/O completions run there, charged to no process), and the time the hypervisor took from this
    machine's CPUs (steal; 0 on bare metal)."""

    processes: dict[int, float]
    interrupts: float
    steal: float

    @classmethod
    def now(cls, server: LocalServer) -> _Cpu:
        pid = server.pid
        seconds = tree_cpu_s(pid) if pid is not None else {}
        machine = psutil.cpu_times()
        return cls(
            dict(seconds),
            float(machine.irq + machine.softirq),
            float(getattr(machine, "steal", 0.0)),
        )

    def since(self, before: _Cpu) -> tuple[float, float, float]:
        """Seconds spent from ``before`` to this reading: the server's, the interrupts' and the
        steal. A process gone in between (a stub of a version just unloaded, still exiting when
        ``before`` was read) counts nothing; one started in between, all of its time."""
        spent = {pid: max(0.0, cpu - before.processes.get(pid, 0.0)) for pid, cpu in self.processes.items()}
        return (
            sum(spent.values()),
            self.interrupts - before.interrupts,
            self.steal - before.steal,
        )


def _stage_compute_ns(client: Any, stage: str) -> tuple[int, int]:
    """The stage's requests so far and their summed compute time (ns), from Triton's statistics."""
    stats = client.get_inference_statistics(model_name=stage)
    count = ns = 0
    for entry in stats.get("model_stats", []):
        compute = entry.get("inference_stats", {}).get("compute_infer", {})
        count += int(compute.get("count", 0))
        ns += int(compute.get("ns", 0))
    return count, ns


@dataclass(frozen=True)
class _Store:
    """One repository of the run and its stage's store."""

    label: str
    repository: Path
    rows: StoreRows


def _stores(options: ColdTierOptions) -> list[_Store]:
    """Each repository's store, labelled by its dtype, with its rows where the stores' tables
    differ, and its folder where two would still share a label."""
    opened = [
        (repo, open_store(stage_files(repo, options.stage)[0], verify=False)) for repo in options.repositories
    ]
    same_tables = len({rows.table_sizes for _, rows in opened}) == 1
    labels = [
        rows.dtype if same_tables else f"{rows.dtype}, {rows.data.shape[0] / 1e6:.1f}M rows"
        for _, rows in opened
    ]
    return [
        _Store(label if labels.count(label) == 1 else f"{label} ({repo.name})", repo, rows)
        for label, (repo, rows) in zip(labels, opened, strict=True)
    ]


def run_cold_tier(options: ColdTierOptions, command: str, progress: Any = None) -> dict[str, Any]:
    """Every repository, way, batch size, concurrency and condition, ``rounds`` times; the report.

    Each round takes the repositories in turn, each served by a server of its own that
    lives for its steps of that round.
    """
    stores = _stores(options)
    record = RunRecord.begin(command)
    steps: list[dict[str, Any]] = []
    evict(stores[0].rows)
    probes = probe_disk(stores[0].rows.path / STORE_ROWS_FILE, options.probe_seconds)
    stream = _Stream(options.data, options.stream_rows)
    retried: list[str] = []
    for round_ in range(options.rounds):
        for store in stores:
            for attempt in range(1, _BLOCK_ATTEMPTS + 1):
                first = len(steps)
                try:
                    _serve_block(options, store, stream, round_, steps, progress)
                    break
                except ConfigError:
                    raise
                except Exception as exc:
                    # A load or request that never returns (the server hung) would lose a run of
                    # an hour: the store's steps of this round run again on a new server, once.
                    del steps[first:]
                    if attempt == _BLOCK_ATTEMPTS:
                        raise
                    what = f"round {round_ + 1}, store {store.label}: {type(exc).__name__}: {exc}"
                    logger.warning("%s; its steps run again on a new server", what)
                    retried.append(what)
    record.finish()
    best = max(probes, key=lambda probe: probe.iops)
    for step in steps:
        step["disk_bound_ms"] = step["pages_read_per_request"] / best.iops * 1e3
    return {
        "record": record.to_json(),
        "options": {
            **asdict(options),
            "repositories": [str(repo) for repo in options.repositories],
            "data": str(options.data),
        },
        "stores": [
            {
                "label": store.label,
                "path": str(store.rows.path),
                "bytes": int(store.rows.data.nbytes),
                "dtype": store.rows.dtype,
                "row_bytes": int(store.rows.data.shape[1] * store.rows.data.dtype.itemsize),
            }
            for store in stores
        ],
        "disk": [probe.to_json() for probe in probes],
        "best_iops": best.iops,
        "steps": steps,
        "retried": retried,
        "summary": summarise(steps, options, [store.label for store in stores]),
    }


def _serve_block(
    options: ColdTierOptions,
    store: _Store,
    stream: _Stream,
    round_: int,
    steps: list[dict[str, Any]],
    progress: Any,
) -> None:
    """One round's steps of one store, on a server of their own (appended to ``steps``)."""
    import tritonclient.http as httpclient

    with ExitStack() as stack:
        config = ServerConfig.with_free_ports(store.repository, model_control_mode="explicit")
        server = stack.enter_context(LocalServer(config))
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600.0)
        stack.callback(client.close)
        server.load_model(options.stage, timeout=1800)
        base = client.get_model_config(options.stage)
        dense = _serve_dense(server, client, options)
        for way in options.ways:
            for size in options.batch_sizes:
                for concurrency in options.concurrency:
                    for condition in CONDITIONS:
                        at = _Step(way, size, concurrency, condition)
                        step = _step(options, server, client, store.rows, stream, base, at)
                        served = _serving(client, options.stage, dense)
                        steps.append({"round": round_, "store": store.label, **step, **served})
                        if progress is not None:
                            progress()


@dataclass(frozen=True)
class _Step:
    """Where a step stands: the way of reading, batch size, concurrency and condition."""

    way: str
    batch_size: int
    concurrency: int
    condition: str


def _dense_model(client: Any, options: ColdTierOptions) -> str:
    """The ensemble's dense model: its step that is not the stage."""
    steps = client.get_model_config(options.model).get("ensemble_scheduling", {}).get("step", [])
    names = [step["model_name"] for step in steps if step["model_name"] != options.stage]
    if len(names) != 1:
        raise ConfigError(f"'{options.model}' is not an ensemble of '{options.stage}' and one dense model")
    return str(names[0])


def _serve_dense(server: LocalServer, client: Any, options: ColdTierOptions) -> str:
    """Load the ensemble once to find its dense model; with ``dense_instances`` or
    ``dense_threads`` set, load that model again, explicitly, with them (a config override
    that stays while the steps reload the stage and the ensemble). Its name."""
    server.load_model(options.model, timeout=600)
    dense = _dense_model(client, options)
    if options.dense_instances or options.dense_threads:
        config = client.get_model_config(dense)
        if options.dense_instances:
            _set_instances(config, options.dense_instances)
        if options.dense_threads:
            parameters = config.setdefault("parameters", {})
            parameters[THREADS_PARAMETER] = {"string_value": str(options.dense_threads)}
        server.unload_model(options.model, timeout=300)
        client.load_model(dense, config=json.dumps(config))
    return dense


def _set_instances(config: dict[str, Any], count: int) -> None:
    """Give each instance group of a model's config (JSON, as the server reports it) ``count``."""
    for group in config.setdefault("instance_group", [{"kind": "KIND_CPU"}]):
        group["count"] = count


def _instances(config: dict[str, Any]) -> int:
    return sum(int(group.get("count", 1)) for group in config.get("instance_group", []))


def _serving(client: Any, stage: str, dense: str) -> dict[str, Any]:
    """How the stage and the dense model are served now, read back from the server: their
    instances, and the dense model's intra-op threads (0: ONNX Runtime's default)."""
    config = client.get_model_config(dense)
    threads = config.get("parameters", {}).get(THREADS_PARAMETER, {}).get("string_value", "0")
    return {
        "stage_instances": _instances(client.get_model_config(stage)),
        "dense_model": dense,
        "dense_instances": _instances(config),
        "dense_threads": int(threads or 0),
    }


def _load(server: LocalServer, client: Any, options: ColdTierOptions, base: dict[str, Any], way: str) -> None:
    """Unload the ensemble and the stage, load the stage reading cold rows ``way``, then the ensemble."""
    for name in (options.model, options.stage):
        server.unload_model(name, timeout=300)
    config = json.loads(json.dumps(base))
    parameters = config.setdefault("parameters", {})
    cached = way.endswith(CACHED)
    parameters[PARAM_COLD_READS] = {"string_value": way.removesuffix(CACHED)}
    parameters[PARAM_COLD_CACHE_BYTES] = {"string_value": str(options.cold_cache_bytes if cached else 0)}
    parameters[PARAM_COLD_READ_THREADS] = {"string_value": str(options.threads)}
    if options.stage_instances:
        _set_instances(config, options.stage_instances)
    client.load_model(options.stage, config=json.dumps(config))
    server.load_model(options.model, timeout=600)


def _step(
    options: ColdTierOptions,
    server: LocalServer,
    client: Any,
    store: StoreRows,
    stream: _Stream,
    base: dict[str, Any],
    at: _Step,
) -> dict[str, Any]:
    """One measured step."""
    _load(server, client, options, base, at.way)
    if at.condition == "cold":
        resident = evict(store)
        for _ in range(_EVICT_TRIES):
            if resident < store.data.nbytes // 1000:
                break
            time.sleep(1.0)
            resident = evict(store)
    elif options.warm == "resident":
        _warm(store)
        resident = resident_bytes(store)
    sent: list[int] = []
    cycle = 0
    if at.condition == "warm" and options.warm == "cycled":
        # The pool's rows once, before the window: their pages are then what the page cache holds.
        cycle = max(1, options.pool_rows // at.batch_size)
        prime = stream.connect(server.grpc_url, options.model, at.batch_size, at.concurrency, sent, cycle)
        with Driver(prime, at.concurrency, max_requests=cycle) as driver:
            driver.wait(3600.0)
        resident = resident_bytes(store)
    connect = stream.connect(server.grpc_url, options.model, at.batch_size, at.concurrency, sent, cycle)
    try:
        with Driver(connect, at.concurrency) as driver:
            driver.wait(options.warmup_s)
            before_read = tree_read_bytes(server.pid) if server.pid is not None else 0
            before_lookups = _cold_lookups(server.metrics_url, options.stage)
            before_count, before_ns = _stage_compute_ns(client, options.stage)
            before_cpu = _Cpu.now(server)
            window = driver.measure(options.seconds)
            after_cpu = _Cpu.now(server)
            after_read = tree_read_bytes(server.pid) if server.pid is not None else 0
            after_lookups = _cold_lookups(server.metrics_url, options.stage)
            after_count, after_ns = _stage_compute_ns(client, options.stage)
    except RuntimeError as exc:
        if isinstance(exc.__cause__, StreamExhausted):
            raise ConfigError(str(exc.__cause__)) from None
        raise
    stage_requests = max(1, after_count - before_count)
    server_s, interrupts_s, steal_s = after_cpu.since(before_cpu)
    return {
        **asdict(at),
        "resident_at_start_bytes": resident,
        "samples_per_s": window.rows / window.seconds if window.seconds else 0.0,
        "requests": window.answered,
        "errors": window.errors,
        "p50_ms": window.histogram.percentile(50) if window.answered else float("nan"),
        "p99_ms": window.histogram.percentile(99) if window.answered else float("nan"),
        "rows_sent": len(sent) * at.batch_size,
        "stage_ms_per_request": (after_ns - before_ns) / stage_requests / 1e6,
        "cold_lookups_per_request": (after_lookups - before_lookups) / stage_requests,
        "pages_read_per_request": max(0, after_read - before_read) / PAGE_BYTES / stage_requests,
        "server_cpu_ms_per_request": server_s / stage_requests * 1e3,
        "interrupt_cpu_ms_per_request": interrupts_s / stage_requests * 1e3,
        "steal_cpu_ms_per_request": steal_s / stage_requests * 1e3,
    }


def _median(steps: list[dict[str, Any]], key: str, **match: Any) -> float:
    """The median of ``key`` over the steps that match every ``match`` (nan for none)."""
    values = [s[key] for s in steps if all(s[k] == v for k, v in match.items())]
    return float(np.median(values)) if values else float("nan")


#: A step's CPU per request: the server's, the machine's interrupts and the hypervisor's steal.
_CPU_KEYS = (
    "server_cpu_ms_per_request",
    "interrupt_cpu_ms_per_request",
    "steal_cpu_ms_per_request",
)


def summarise(
    steps: list[dict[str, Any]], options: ColdTierOptions, stores: list[str]
) -> list[dict[str, Any]]:
    """Per store, way, batch size and concurrency: median samples/s cold and warm, their ratio,
    the cold step's stage time against its disk-bound time, and both against the first store's."""
    rows = []
    for store in stores:
        for way in options.ways:
            for size in options.batch_sizes:
                for concurrency in options.concurrency:
                    at: dict[str, Any] = {
                        "store": store,
                        "way": way,
                        "batch_size": size,
                        "concurrency": concurrency,
                    }
                    cold = _median(steps, "samples_per_s", condition="cold", **at)
                    warm = _median(steps, "samples_per_s", condition="warm", **at)
                    stage = _median(steps, "stage_ms_per_request", condition="cold", **at)
                    warm_stage = _median(steps, "stage_ms_per_request", condition="warm", **at)
                    disk = _median(steps, "disk_bound_ms", condition="cold", **at)
                    first = {**at, "store": stores[0]}
                    rows.append(
                        {
                            **at,
                            "cold_samples_per_s": cold,
                            "warm_samples_per_s": warm,
                            "cold_over_warm": cold / warm if warm else float("nan"),
                            "cold_over_first_store": cold
                            / _median(steps, "samples_per_s", condition="cold", **first),
                            "warm_over_first_store": warm
                            / _median(steps, "samples_per_s", condition="warm", **first),
                            "cold_p50_ms": _median(steps, "p50_ms", condition="cold", **at),
                            "cold_p99_ms": _median(steps, "p99_ms", condition="cold", **at),
                            "warm_p99_ms": _median(steps, "p99_ms", condition="warm", **at),
                            "cold_lookups_per_request": _median(
                                steps, "cold_lookups_per_request", condition="cold", **at
                            ),
                            "pages_read_per_request": _median(
                                steps, "pages_read_per_request", condition="cold", **at
                            ),
                            "cold_stage_ms": stage,
                            "warm_stage_ms": warm_stage,
                            **{
                                f"{condition}_{key}": _median(steps, key, condition=condition, **at)
                                for condition in CONDITIONS
                                for key in _CPU_KEYS
                            },
                            "disk_bound_ms": disk,
                            "cold_stage_over_disk_bound": stage / disk if disk > 0 else float("nan"),
                            "cold_rows_ms": stage - warm_stage,
                            "cold_rows_over_disk_bound": (stage - warm_stage) / disk
                            if disk > 0
                            else float("nan"),
                        }
                    )
    return rows


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes:
#: everything below the title but the chart; the served steps with the tables that follow them;
#: the steps table alone.
SECTION_RESULTS = "results"
SECTION_STEPS = "steps"
SECTION_STEPS_TABLE = "steps-table"


def _size_text(count: int) -> str:
    """A byte count in the largest binary unit it is a whole number of (``2 GiB``, ``160 bytes``)."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count and count % 2**power == 0:
            return f"{count >> power} {unit}"
    return f"{count} bytes"


def write_cold_tier(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """``cold_tier.json``, ``cold_tier.md`` and ``cold_tier.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    record, options = report["record"], report["options"]
    stores = [store["label"] for store in report["stores"]]
    evicted = [s["resident_at_start_bytes"] for s in report["steps"] if s["condition"] == "cold"]
    lines = [
        "# A hot/cold model with its cold tier on disk: cold against warm",
        "",
        section_start(SECTION_RESULTS),
        f"- command: `{record['command']}`; started {record['started']}",
        *([f"- machine: {machine_with_flags(record['machine'])}"] if "machine" in record else []),
        "- stores: "
        + "; ".join(
            f"{s['label']}, {s['bytes'] / 1e9:.2f} GB ({s['row_bytes']} bytes a row)"
            for s in report["stores"]
        )
        + f"; model `{options['model']}`, stage `{options['stage']}`",
        f"- load: gRPC, the closed-loop driver, {options['seconds']:g} s per step after "
        f"{options['warmup_s']:g} s, {options['rounds']} rounds (medians)",
        "- traffic: the held-out rows in order, each once per step, from the first row; cold steps start "
        f"with the store evicted (at most {max(evicted, default=0) / 2**20:.1f} MiB of it still resident), "
        + (
            "warm steps with all of it in memory"
            if options["warm"] == "resident"
            else f"warm steps cycle a pool of the first {options['pool_rows']:,} rows, sent once before "
            "the window (their pages cached: what a load test that cycles a pool measures)"
        ),
        "- stage: "
        + " or ".join(str(n) for n in sorted({s["stage_instances"] for s in report["steps"]}))
        + " instance(s)"
        + (" (set for this run)" if options.get("stage_instances") else " (as exported)")
        + "; dense model: "
        + "; ".join(
            f"`{model}` {instances} instance(s) x "
            + (f"{threads} intra-op thread(s)" if threads else "ONNX Runtime's default intra-op threads")
            for model, instances, threads in sorted(
                {(s["dense_model"], s["dense_instances"], s["dense_threads"]) for s in report["steps"]}
            )
        )
        + (
            " (set for this run)"
            if options.get("dense_instances") or options.get("dense_threads")
            else " (as exported)"
        ),
        *(
            [
                f"- {CACHED}: the stage keeps a cache of {_size_text(options['cold_cache_bytes'])} "
                "of cold rows (`cold_cache_bytes`), shared by its instances and empty at each step's "
                "start, and reads the rows it misses with O_DIRECT; a warm step's pool fills it before "
                "the window"
            ]
            if any(way.endswith(CACHED) for way in options["ways"])
            else []
        ),
        "- disk-bound ms: a cold step's pages read from disk per request / the disk's best random-read rate; "
        "cold rows' ms: what they add to the stage's time per request (its time cold less its time warm, "
        "which leaves out the backend's fixed cost per request)",
        f"- failed requests: {sum(s['errors'] for s in report['steps'])} in all steps",
        *(
            f"- run again on a new server (the first try's steps dropped): {what}"
            for what in report.get("retried", [])
        ),
        "",
        *disk_table(report["disk"]),
        "",
        section_start(SECTION_STEPS),
        section_start(SECTION_STEPS_TABLE),
        *table(
            [
                "store",
                "cold reads",
                "batch",
                "concurrency",
                "cold samples/s",
                "warm samples/s",
                "cold / warm",
                "cold p50 / p99 ms",
                "warm p99 ms",
                "cold lookups / request",
                "pages read / request",
                "stage ms cold / warm",
                "disk-bound ms",
                "stage cold / disk-bound",
                "cold rows' ms",
                "cold rows' / disk-bound",
            ],
            [
                [
                    r["store"],
                    r["way"],
                    r["batch_size"],
                    r["concurrency"],
                    f"{r['cold_samples_per_s']:,.0f}",
                    f"{r['warm_samples_per_s']:,.0f}",
                    f"{r['cold_over_warm']:.2f}",
                    f"{r['cold_p50_ms']:.1f} / {r['cold_p99_ms']:.1f}",
                    f"{r['warm_p99_ms']:.1f}",
                    f"{r['cold_lookups_per_request']:.0f}",
                    f"{r['pages_read_per_request']:.0f}",
                    f"{r['cold_stage_ms']:.1f} / {r['warm_stage_ms']:.1f}",
                    f"{r['disk_bound_ms']:.1f}",
                    f"{r['cold_stage_over_disk_bound']:.2f}",
                    f"{r['cold_rows_ms']:.1f}",
                    f"{r['cold_rows_over_disk_bound']:.2f}",
                ]
                for r in report["summary"]
            ],
            "llrrrrrrrrrrrrrr",
        ),
        section_end(SECTION_STEPS_TABLE),
        "",
    ]
    if len(stores) > 1:
        lines += [
            f"Each store against the {stores[0]} store, same way, batch size and concurrency:",
            "",
            *table(
                [
                    "store",
                    "cold reads",
                    "batch",
                    "concurrency",
                    "cold samples/s ratio",
                    "warm samples/s ratio",
                ],
                [
                    [
                        r["store"],
                        r["way"],
                        r["batch_size"],
                        r["concurrency"],
                        f"{r['cold_over_first_store']:.2f}",
                        f"{r['warm_over_first_store']:.2f}",
                    ]
                    for r in report["summary"]
                    if r["store"] != stores[0]
                ],
                "llrrrr",
            ),
            "",
        ]
    if all(f"cold_{key}" in r for r in report["summary"] for key in _CPU_KEYS):
        lines += [
            "CPU per request, cold / warm, in ms: the server's (tritonserver, the compiled stage "
            "inside it, and the dense model; every model of the ensemble), the machine's interrupt "
            "handling (disk completions are charged to no process) and the time the hypervisor "
            "took from the machine's CPUs (steal):",
            "",
            *table(
                ["store", "cold reads", "batch", "concurrency", "server", "interrupts", "steal"],
                [
                    [
                        r["store"],
                        r["way"],
                        r["batch_size"],
                        r["concurrency"],
                        *(f"{r[f'cold_{key}']:.2f} / {r[f'warm_{key}']:.2f}" for key in _CPU_KEYS),
                    ]
                    for r in report["summary"]
                ],
                "llrrrrr",
            ),
            "",
        ]
    lines += [
        section_end(SECTION_STEPS),
        section_end(SECTION_RESULTS),
        "",
        "![cold against warm](cold_tier.png)",
        "",
    ]
    panels = []
    for size in options["batch_sizes"]:
        series = []
        for store in stores:
            for way in options["ways"]:
                for condition in CONDITIONS:
                    rows = [
                        r
                        for r in report["summary"]
                        if (r["store"], r["way"], r["batch_size"]) == (store, way, size)
                    ]
                    series.append(
                        Series(
                            f"{store}, {way}, {condition}",
                            [r["concurrency"] for r in rows],
                            [r[f"{condition}_samples_per_s"] for r in rows],
                            "o-" if condition == "warm" else "s--",
                            f"{store} {way}",
                        )
                    )
        panels.append(
            Panel(
                f"batch {size}",
                "concurrency",
                "samples/s",
                series,
                xlog2=True,
                xticks=list(options["concurrency"]),
            )
        )
    return {
        "json": write_json(out / "cold_tier.json", report),
        "markdown": write_markdown(out / "cold_tier.md", lines),
        "plot": plot(
            out / "cold_tier.png",
            "Hot/cold model: store evicted (cold) and "
            + ("in memory (warm)" if options["warm"] == "resident" else "a cycled pool of rows (warm)"),
            panels,
        ),
    }
