"""What a sweep is made of: its targets and settings, one step's result, and a streamed run's cursor.

Every engine (:mod:`loadtest.sweeps.sweep` for locust, :mod:`loadtest.sweeps.engines` for
perf_analyzer and the closed-loop driver) fills the same :class:`StepResult`, so reports,
ratios and ``tune`` read one shape whichever engine measured.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from bundle.errors import ConfigError
from loadtest.engine.client_cpu import ClientCpu
from loadtest.engine.latency import PERCENTILES, Tally
from loadtest.engine.server_cpu import SharedCores

logger = logging.getLogger(__name__)

#: Wire protocols a target may speak: Triton's two, and the FastAPI peer's.
PROTOCOLS = ("grpc", "http", "fastapi")
TRITON_PROTOCOLS = ("grpc", "http")
#: What generates a step's load: the bundle's locust users, Triton's perf_analyzer, or the
#: bundle's closed-loop driver (threads in this process; what tune and the benchmarks run on).
ENGINES = ("locust", "perf_analyzer", "driver")
#: Extra seconds locust runs after the window closes, so the window is never cut short.
TAIL_S = 1.0
#: How long a step may take beyond its run time (start-up, shutdown) before it is killed.
STEP_GRACE_S = 60.0
#: Concurrency one locust process drives at most when processes are picked automatically.
USERS_PER_PROCESS = 8


def parse_cpus(text: str) -> frozenset[int]:
    """``"1"``, ``"0,2"`` or ``"2-3"`` -> the cores named, each one this process may use."""
    cores: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ConfigError(f"--client-cpus must be cores like 1 or 0,2 or 2-3, got {text!r}") from None
    allowed = os.sched_getaffinity(0)
    if not cores or not cores <= allowed:
        raise ConfigError(f"--client-cpus {text!r} names no core or a core outside {sorted(allowed)}")
    return frozenset(cores)


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; each value >= 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise ConfigError(f"{what} must be integers >= 1, got {text!r}")
    return values


@dataclass(frozen=True)
class Target:
    """A server the load goes to.

    Args:
        url: ``host:port`` of its endpoint for ``protocol`` (loopback only).
        protocol: ``grpc`` or ``http`` (Triton's endpoints) or ``fastapi`` (the FastAPI peer).
        label: the name reports give it, e.g. ``triton``, ``pytriton``, ``fastapi``.
        server_stats: read Triton's statistics API around each step (Triton protocols only).
        engine: the load generator, one of :data:`ENGINES`.
    """

    url: str
    protocol: str = "grpc"
    label: str = "triton"
    server_stats: bool = True
    engine: str = "locust"

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        host, _, port = self.url.rpartition(":")
        if not host or not port.isdigit() or "://" in self.url:
            raise ConfigError(f"url must be 'host:port' without a scheme, got {self.url!r}")
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]") and not host.startswith("127."):
            raise ConfigError(f"load tests send requests to this machine only (loopback), got host {host!r}")
        if self.server_stats and self.protocol not in TRITON_PROTOCOLS:
            raise ConfigError(f"server statistics need a Triton protocol, not {self.protocol!r}")
        if not self.label:
            raise ConfigError("label must not be empty")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.engine != "locust" and self.protocol not in TRITON_PROTOCOLS:
            raise ConfigError(f"{self.engine} speaks Triton's protocols only, not {self.protocol!r}")


@dataclass(frozen=True)
class SweepConfig:
    """What to sweep.

    Args:
        models: model names, each swept in turn.
        batch_size: rows per request ``B``.
        concurrency: requests in flight per step (closed-loop users), ascending.
        duration_s: seconds measured per step.
        warmup_s: seconds run before the measurement window of each step.
        processes: locust processes per step (0: automatic, one per
            :data:`USERS_PER_PROCESS` users, at most the number of cores).
        request_timeout_s: a request slower than this fails.
        client_cpus: the cores the load generator may run on (None: any), e.g. cores the
            server does not use.
        stream: a streamed run's cursor (None: the steps cycle a pool).
    """

    models: tuple[str, ...]
    batch_size: int
    concurrency: tuple[int, ...]
    duration_s: float = 10.0
    warmup_s: float = 2.0
    processes: int = 0
    request_timeout_s: float = 60.0
    client_cpus: frozenset[int] | None = None
    stream: StreamCursor | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "concurrency", tuple(self.concurrency))
        if not self.models or not all(self.models):
            raise ConfigError("name at least one model")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ConfigError(f"concurrency must be integers >= 1, got {self.concurrency}")
        if not self.duration_s > 0:
            raise ConfigError(f"duration_s must be > 0, got {self.duration_s}")
        if self.warmup_s < 0:
            raise ConfigError(f"warmup_s must be >= 0, got {self.warmup_s}")
        if self.processes < 0:
            raise ConfigError(f"processes must be >= 0 (0: automatic), got {self.processes}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")

    def processes_for(self, concurrency: int) -> int:
        """locust processes for a step of ``concurrency`` users: up to
        :data:`USERS_PER_PROCESS` users each (users send from native threads), at most one per
        core, or ``--processes``."""
        if self.processes:
            return min(self.processes, concurrency)
        return max(1, min(os.cpu_count() or 1, math.ceil(concurrency / USERS_PER_PROCESS)))

    @property
    def step_seconds(self) -> float:
        """Wall time of one step, start-up excluded."""
        return self.warmup_s + self.duration_s + TAIL_S


@dataclass(frozen=True)
class ServerTimes:
    """Triton's own view of a step, from its statistics API (difference over the window).

    Attributes:
        requests: successful requests the server counted.
        executions: model executions (dynamic batches).
        queue_ms, compute_input_ms, compute_infer_ms, compute_output_ms: mean time per request
            in each phase (a request shares its batch's compute time).
        request_ms: mean time per request inside the server, arrival to response.
        batch: mean rows per execution (what the dynamic batcher formed).
    """

    requests: int
    executions: int
    queue_ms: float
    compute_input_ms: float
    compute_infer_ms: float
    compute_output_ms: float
    request_ms: float
    batch: float

    @classmethod
    def from_delta(cls, delta: dict[str, int]) -> ServerTimes:
        count = delta.get("success_count", 0)

        def mean(key: str) -> float:
            return delta.get(key, 0) / count / 1e6 if count else math.nan

        executions = delta.get("execution_count", 0)
        return cls(
            requests=count,
            executions=executions,
            queue_ms=mean("queue_ns"),
            compute_input_ms=mean("compute_input_ns"),
            compute_infer_ms=mean("compute_infer_ns"),
            compute_output_ms=mean("compute_output_ns"),
            request_ms=mean("success_ns"),
            batch=delta.get("inference_count", 0) / executions if executions else math.nan,
        )

    @classmethod
    def from_perf_analyzer(cls, served: dict[str, float]) -> ServerTimes | None:
        """The server's view that perf_analyzer printed for its measured windows (its counts, and
        its mean times per request in ms; :func:`loadtest.sweeps.perf_analyzer.read_figures`), or
        None where it printed none."""
        count = served.get("success_count")
        if not count:
            return None
        executions = served.get("execution_count", 0.0)
        return cls(
            requests=int(count),
            executions=int(executions),
            queue_ms=served.get("queue", math.nan),
            compute_input_ms=served.get("input", math.nan),
            compute_infer_ms=served.get("infer", math.nan),
            compute_output_ms=served.get("output", math.nan),
            request_ms=served.get("request", math.nan),
            batch=served.get("inference_count", 0.0) / executions if executions else math.nan,
        )


@dataclass(frozen=True)
class StepResult:
    """One step's measurements.

    Attributes:
        label, model, protocol: what was loaded (target name, model, wire protocol).
        batch_size: rows per request.
        concurrency: requests in flight (users).
        processes: locust processes that ran the users.
        seconds: length of the measurement window.
        requests: successful requests completed in the window.
        errors: failed requests completed in the window.
        requests_per_s: ``requests / seconds``.
        samples_per_s: ``requests_per_s * batch_size``.
        p50_ms, p90_ms, p95_ms, p99_ms, mean_ms, max_ms: client-side latency of the
            successful requests (whole call, sub-millisecond resolution).
        server: Triton's statistics over the window (None: not a Triton target, or unavailable).
        errors_total: failed requests of the whole step, warm-up included.
        error_kinds: the most frequent error messages.
        engine: the load generator (:data:`ENGINES`).
        client_cpu_us: the load generator's CPU microseconds per request (all its processes).
        client_cores: cores it used on average over the window, all processes together.
        client_demand: core-seconds per second the load generator's processes were running or
            waiting for a CPU, all together.
        client_serial_us: its serial client time per request (us): from an answer's arrival to
            the next request's send (perf_analyzer: its client send plus receive); NaN where not
            measured (:data:`~loadtest.engine.client_cpu.SERIAL_SHARE` says when it flags a step).
        client_bound: whether the load generator, not the server, limited the step
            (:mod:`loadtest.engine.client_cpu`), or took CPU the server needed on cores the two
            share (:mod:`loadtest.engine.server_cpu`).
        bound_reason: why the step is client-bound, in words (empty: it is not): the part of
            :func:`~loadtest.engine.client_cpu.threshold_line` its window broke.
        server_cores: cores the server's processes used on average over the window (NaN: not read).
        shared_share: the load generator's share of the CPU the two used on the cores they share
            (NaN: no core shared, or the server's CPU not read).
        rows_sent: rows the step sent from a stream, warm-up included (0: it cycled a pool).
        distinct_rows: how many of them were distinct (fewer once the stream wrapped).
        rounds: repeats of the step that its figures are the median of.
        samples_per_s_min, samples_per_s_max: the lowest and highest rate over those repeats.
        round_rates: samples/s of each repeat in the order they ran (NaN: that repeat gave no
            figures), so a step can be set beside another's repeat by repeat (the sweep runs the
            engines' rounds back to back: :func:`paired_ratios`).
        failure: why the step has no figures, in one line (empty: it has them): its engine gave
            none (perf_analyzer found no stable measurement, a load generator crashed or
            overran its time). Such a step keeps its row in every report, its figures NaN
            (:meth:`without_figures`).
    """

    label: str
    model: str
    protocol: str
    batch_size: int
    concurrency: int
    processes: int
    seconds: float
    requests: int
    errors: int
    requests_per_s: float
    samples_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    server: ServerTimes | None = None
    errors_total: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    engine: str = "locust"
    client_cpu_us: float = math.nan
    client_cores: float = math.nan
    client_demand: float = math.nan
    client_serial_us: float = math.nan
    client_bound: bool = False
    bound_reason: str = ""
    server_cores: float = math.nan
    shared_share: float = math.nan
    rows_sent: int = 0
    distinct_rows: int = 0
    rounds: int = 1
    samples_per_s_min: float = math.nan
    samples_per_s_max: float = math.nan
    round_rates: tuple[float, ...] = ()
    failure: str = ""

    @property
    def measured(self) -> bool:
        """Whether the step has figures (its engine gave them; see ``failure``)."""
        return not self.failure

    @property
    def series(self) -> str:
        """The curve this step belongs to: ``label model protocol B=..`` (and the engine, if not locust)."""
        engine = "" if self.engine == "locust" else f" [{self.engine}]"
        return f"{self.label} {self.model} {self.protocol} B={self.batch_size}{engine}"

    @property
    def spread(self) -> float:
        """``(max - min) / median`` of the rate over the step's repeats (0 for one repeat)."""
        if self.rounds < 2 or not self.samples_per_s > 0:
            return 0.0
        return (self.samples_per_s_max - self.samples_per_s_min) / self.samples_per_s

    @classmethod
    def of_tally(
        cls,
        target: Target,
        model: str,
        batch_size: int,
        concurrency: int,
        tally: Tally,
        requests_per_s: float,
        cpu: ClientCpu,
        **fields: Any,
    ) -> StepResult:
        """A step from the tally of its window (the latencies and counts of every process merged),
        its request rate and its load generator's CPU; ``fields``: the rest (``processes``,
        ``seconds``, ``server``, ``engine``, ...)."""
        histogram = tally.histogram
        p50, p90, p95, p99 = (histogram.percentile(q) for q in PERCENTILES)
        samples_per_s = requests_per_s * batch_size
        fields.setdefault("seconds", tally.seconds)
        fields.setdefault("errors_total", tally.errors)
        return cls(
            label=target.label, model=model, protocol=target.protocol, batch_size=batch_size,
            concurrency=concurrency, requests=tally.ok, errors=tally.errors,
            requests_per_s=requests_per_s, samples_per_s=samples_per_s,
            p50_ms=p50, p90_ms=p90, p95_ms=p95, p99_ms=p99, mean_ms=histogram.mean_ms,
            max_ms=histogram.max_ms if histogram.count else math.nan,
            error_kinds=dict(tally.error_kinds.most_common(5)),
            client_cpu_us=cpu.per_request_us, client_cores=cpu.share, client_demand=cpu.total_demand,
            client_serial_us=cpu.serial_us, client_bound=cpu.bound, bound_reason=cpu.reason(),
            samples_per_s_min=samples_per_s, samples_per_s_max=samples_per_s,
            round_rates=(samples_per_s,), **fields,
        )  # fmt: skip

    @classmethod
    def without_figures(
        cls, target: Target, model: str, batch_size: int, concurrency: int, reason: str
    ) -> StepResult:
        """The row of a step whose engine gave no figures: every figure NaN, nothing counted, and
        ``reason`` (made one line) as its :attr:`failure`."""
        nan = math.nan
        return cls(
            label=target.label, model=model, protocol=target.protocol, batch_size=batch_size,
            concurrency=concurrency, processes=0, seconds=0.0, requests=0, errors=0,
            requests_per_s=nan, samples_per_s=nan, p50_ms=nan, p90_ms=nan, p95_ms=nan, p99_ms=nan,
            mean_ms=nan, max_ms=nan, engine=target.engine, round_rates=(nan,),
            failure=one_line(reason) or "no reason given",
        )  # fmt: skip

    def beside_server(self, shared: SharedCores | None) -> StepResult:
        """This step with the server's CPU beside the load generator's (None: not read): the server's
        cores used, the load generator's share of the shared cores, and the step client-bound, with
        the reason, where the load generator took CPU the server needed."""
        if shared is None:
            return self
        return replace(
            self,
            server_cores=shared.server_cores,
            shared_share=shared.share,
            client_bound=self.client_bound or shared.took_from_server,
            bound_reason="; ".join(filter(None, (self.bound_reason, shared.reason()))),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (server statistics nested)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        """Read what :meth:`as_dict` produced (e.g. from a report's JSON)."""
        values = dict(data)
        server = values.pop("server", None)
        # JSON holds a NaN figure as null: read it back as NaN, so arithmetic on it stays defined.
        for name in _FLOAT_FIELDS & values.keys():
            values[name] = _number(values[name])
        values["round_rates"] = tuple(_number(v) for v in values.get("round_rates") or ())
        return cls(server=ServerTimes(**server) if server else None, **values)


_FLOAT_FIELDS = frozenset(f.name for f in fields(StepResult) if f.type in (float, "float"))


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined by ``; ``, runs of blanks made one space."""
    return "; ".join(" ".join(line.split()) for line in text.splitlines() if line.strip())


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def median_of(name: str, items: Sequence[Any]) -> float:
    """The median of attribute ``name`` over ``items``."""
    return float(statistics.median(getattr(item, name) for item in items))


def medians(items: Sequence[Any], *names: str) -> dict[str, Any]:
    """Each attribute of ``names``, its median over ``items`` (:func:`median_of`), by name: the
    keyword arguments of a combined round."""
    return {name: median_of(name, items) for name in names}


def median_server(rounds: Sequence[ServerTimes | None]) -> ServerTimes | None:
    """Triton's times over several rounds of one step: request and execution counts add up, the
    times and the batch are the median of the rounds that read them (None: none did)."""
    timed = [r for r in rounds if r is not None]
    if not timed:
        return None
    return ServerTimes(
        requests=sum(t.requests for t in timed),
        executions=sum(t.executions for t in timed),
        **medians(
            timed,
            "queue_ms",
            "compute_input_ms",
            "compute_infer_ms",
            "compute_output_ms",
            "request_ms",
            "batch",
        ),
    )


#: The load generator's figures that a step's rounds combine into by their median.
_CLIENT_MEDIANS = (
    "client_cpu_us", "client_cores", "client_demand", "client_serial_us", "server_cores", "shared_share"
)  # fmt: skip


def median_step(rounds: Sequence[StepResult]) -> StepResult:
    """One step from several rounds of the same (server, model, protocol, batch, concurrency, engine):
    rates, percentiles, means, client CPU and Triton's times are the median over the rounds;
    ``requests``, ``errors`` and ``seconds`` add up, ``max_ms`` is the largest, the rate's lowest
    and highest are kept (the spread), and the step is client-bound when at least half of its
    rounds were. One round is returned as is.

    Rounds without figures (:attr:`StepResult.failure`) are left out of the medians; a step none
    of whose rounds has figures is returned without figures, with the first round's reason."""
    if not rounds:
        raise ValueError("no rounds to combine")
    if len(rounds) == 1:
        return rounds[0]
    keys = {(r.label, r.model, r.protocol, r.batch_size, r.concurrency, r.engine) for r in rounds}
    if len(keys) > 1:
        raise ValueError(f"rounds of different steps: {sorted(keys)}")
    measured = [r for r in rounds if r.measured]
    every_rate = tuple(rate for r in rounds for rate in r.round_rates)
    if not measured:
        return replace(rounds[0], failure=f"no figures in any of {len(rounds)} rounds: {rounds[0].failure}")
    if len(measured) < len(rounds):
        return replace(median_step(measured), round_rates=every_rate)
    first = rounds[0]

    server = median_server([r.server for r in rounds])
    # Bound when at least half of the repeats were: the median repeat's verdict.
    bound = 2 * sum(r.client_bound for r in rounds) >= len(rounds)
    kinds: dict[str, int] = {}
    for r in rounds:
        for kind, count in r.error_kinds.items():
            kinds[kind] = kinds.get(kind, 0) + count
    return replace(
        first,
        processes=max(r.processes for r in rounds),
        seconds=sum(r.seconds for r in rounds),
        requests=sum(r.requests for r in rounds),
        errors=sum(r.errors for r in rounds),
        **medians(
            rounds, "requests_per_s", "samples_per_s", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms"
        ),
        max_ms=max(r.max_ms for r in rounds),
        server=server,
        errors_total=sum(r.errors_total for r in rounds),
        error_kinds=kinds,
        **medians(rounds, *_CLIENT_MEDIANS),
        bound_reason=next((r.bound_reason for r in rounds if r.bound_reason), "") if bound else "",
        client_bound=bound,
        rounds=sum(r.rounds for r in rounds),
        samples_per_s_min=min(r.samples_per_s_min for r in rounds),
        samples_per_s_max=max(r.samples_per_s_max for r in rounds),
        round_rates=every_rate,
    )


def paired_ratios(step: StepResult, reference: StepResult) -> list[float]:
    """``step``'s rate over ``reference``'s, repeat by repeat: the rounds that both measured, in
    the order they ran (empty: the two do not have the same number of repeats recorded, e.g. a
    report written before repeats were). Rounds taken back to back see the same state of a shared
    machine, so their ratio keeps what the engines differ by and drops most of what the machine
    drifted by between rounds."""
    if len(step.round_rates) != len(reference.round_rates):
        return []
    return [
        ours / theirs
        for ours, theirs in zip(step.round_rates, reference.round_rates, strict=True)
        if ours > 0 and theirs > 0
    ]


@dataclass
class StreamCursor:
    """Where a streamed run is in its rows, and which rows it has sent.

    Attributes:
        rows: rows in the stream.
        next_row: the first row the next step starts at.
        seen: whether each row has been sent (so repeats, once the stream wraps, are counted).
        sent: rows sent over the run, repeats included.
    """

    rows: int
    next_row: int = 0
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    sent: int = 0

    def __post_init__(self) -> None:
        if not len(self.seen):
            self.seen = np.zeros(self.rows, dtype=bool)

    def record(self, first_rows: np.ndarray, batch_size: int) -> tuple[int, int]:
        """Record requests whose first rows are ``first_rows``; the step's rows sent and distinct."""
        if not len(first_rows):
            return 0, 0
        rows = (first_rows[:, None] + np.arange(batch_size)[None, :]).ravel() % self.rows
        self.seen[rows] = True
        self.sent += rows.size
        self.next_row = (int(first_rows.max()) + batch_size) % self.rows
        return int(rows.size), int(np.unique(rows).size)

    @property
    def distinct(self) -> int:
        """Rows sent at least once over the run."""
        return int(self.seen.sum())
