"""Open against closed loop on one served model, in one run: its capacity under a p99 budget,
the tail a closed loop hides, and MLPerf's verdict at that rate.

One local tritonserver serves the model. In turn:

1. the capacity search (:func:`loadtest.sweeps.capacity.search_capacity`): the highest Poisson
   rate whose p99, from each request's scheduled time, holds ``budget_ms``;
2. open-loop steps at fractions of that rate (:func:`loadtest.sweeps.rates.rate_step`): latency
   percentiles against the offered rate;
3. closed-loop steps at each concurrency (the bundle's driver, as ``loadtest sweep --engine
   driver`` runs them): p99 against the throughput they reached;
4. MLPerf's Server scenario through the official LoadGen at the rate found, a query of
   ``batch_size`` pairs (:mod:`loadtest.sweeps.mlperf`), with LoadGen's verdict.

The report sets the open loop's and the closed loop's p99 against the samples/s each reached,
on one chart, so the difference coordinated omission makes shows at the same throughput.
``python -m lab open-loop`` writes ``open_loop.json``, ``open_loop.md`` and ``open_loop.png``;
``benchmarks/open_loop/run.sh`` makes the committed ones.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.records import RunRecord, machine_with_flags
from bundle.snippets import section_end, section_start
from loadtest.engine.open_loop import CONNECTIONS, WakeUps, wake_ups
from loadtest.engine.payload import PayloadPool
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.capacity import search_capacity, step_measurer
from loadtest.sweeps.rates import RateLoad, RateStep, flag_rule
from loadtest.sweeps.steps import StepResult, SweepConfig, Target

#: The report's section the documentation includes.
SECTION = "open-loop"


@dataclass(frozen=True)
class OpenLoopOptions:
    """What ``python -m lab open-loop`` measures.

    Args:
        repository: the model repository a local tritonserver serves.
        model: the model.
        batch_size: rows per request (and pairs per LoadGen query).
        budget_ms: the p99 budget of the capacity search.
        fractions: of the rate found, the open-loop steps' rates.
        concurrency: the closed-loop steps.
        duration_s: each step's measured window, seconds.
        warmup_s: each step's warm-up, seconds.
        start_rate: the capacity search's first rate.
        resolution: the capacity search's resolution (a share).
        max_rate: the capacity search's highest rate.
        connections: the open loop's connections.
        loadgen_duration_s: LoadGen's minimum duration, seconds.
        loadgen_min_queries: LoadGen's minimum query count.
        data: the request rows (None: synthetic).
        protocol: ``grpc`` or ``http``.
        client_cpus: the cores every load generator here runs on (the server the others; None: any).
        min_requests: requests each open-loop step holds at least (its window is lengthened at
            low rates).
    """

    repository: Path
    model: str
    batch_size: int = 64
    budget_ms: float = 10.0
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    duration_s: float = 10.0
    warmup_s: float = 2.0
    start_rate: float = 20.0
    resolution: float = 0.05
    max_rate: float = 100_000.0
    connections: int = CONNECTIONS
    loadgen_duration_s: float = 60.0
    loadgen_min_queries: int = 1024
    data: Path | None = None
    protocol: str = "grpc"
    client_cpus: frozenset[int] | None = None
    min_requests: int = 1000

    def __post_init__(self) -> None:
        if (
            not self.fractions
            or min(self.fractions) <= 0
            or not self.concurrency
            or min(self.concurrency) < 1
        ):
            raise ConfigError("fractions must be > 0 and concurrency levels >= 1, at least one of each")


def _closed_step(
    target: Target, options: OpenLoopOptions, concurrency: int, payload: Path, raw: Path
) -> StepResult:
    from loadtest.sweeps.engines import driver_step

    folder = raw / f"closed-c{concurrency}"
    folder.mkdir(parents=True, exist_ok=True)
    config = SweepConfig(
        (options.model,),
        options.batch_size,
        (concurrency,),
        options.duration_s,
        options.warmup_s,
        client_cpus=options.client_cpus,
    )
    return driver_step(target, options.model, config, concurrency, payload, folder)


def _loadgen(
    endpoint: str, options: OpenLoopOptions, rate: float, payload: Path, out: Path
) -> dict[str, Any]:
    from loadtest.sweeps.mlperf import run_loadgen, triton_sender

    pool = PayloadPool.load(payload).rebatched(options.batch_size)
    affinity = os.sched_getaffinity(0)
    try:
        if options.client_cpus is not None:
            os.sched_setaffinity(0, options.client_cpus)  # LoadGen's threads and the senders inherit it
        with triton_sender(endpoint, options.protocol, options.model) as send:
            run = run_loadgen(
                send, pool, "server", out, target_qps=rate, latency_bound_ms=options.budget_ms,
                duration_s=options.loadgen_duration_s, min_queries=options.loadgen_min_queries,
                connections=options.connections,
            )  # fmt: skip
    finally:
        os.sched_setaffinity(0, affinity)
    return {"valid": run.valid, "summary": run.summary, "failed": run.failed, "lines": run.lines()}


def _plain(value: Any) -> Any:
    """An option as JSON holds it: a path as text, a set of cores as a sorted list."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, frozenset):
        return sorted(value)
    return value


def run_open_loop(options: OpenLoopOptions, out: Path, command: str) -> dict[str, Any]:
    """Measure (see the module); the JSON-ready result. LoadGen's logs go to ``out/loadgen``."""
    from loadtest.sweeps.rates import open_endpoints
    from loadtest.sweeps.runs import models_payload

    record = RunRecord.begin(command)
    raw = out / "raw"
    payload = models_payload(raw, options.data, options.repository, [], [options.protocol], [options.model])
    load = RateLoad(
        connections=options.connections, duration_s=options.duration_s, warmup_s=options.warmup_s,
        client_cpus=options.client_cpus, min_requests=options.min_requests,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        ((_, endpoint),) = open_endpoints(
            stack, [options.model], [options.protocol], [], options.repository, raw, options.client_cpus
        )
        target = Target(endpoint, options.protocol, "triton", engine="driver")
        woke = wake_ups(options.client_cpus)
        print(f"timer: {woke.line()}", flush=True)
        measure = step_measurer(
            target, options.model, options.batch_size, payload, raw, load, options.budget_ms
        )
        capacity = search_capacity(
            measure, options.budget_ms, options.start_rate, options.resolution, options.max_rate
        )
        print(capacity.statement(), flush=True)
        found = capacity.best.request_rate if capacity.best is not None else options.start_rate
        opened = [measure(round(found * fraction, 1)) for fraction in options.fractions]
        closed = []
        for concurrency in options.concurrency:
            step = _closed_step(target, options, concurrency, payload, raw)
            print(
                f"closed loop c={concurrency}: {step.samples_per_s:,.0f} samples/s, p99 {step.p99_ms:.2f} ms"
            )
            closed.append(step)
        loadgen = _loadgen(endpoint, options, found, payload, out / "loadgen")
        print("\n".join(loadgen["lines"]), flush=True)
    return {
        **record.finish().to_json(),
        "options": {key: _plain(value) for key, value in asdict(options).items()},
        "wake_ups": asdict(woke),
        "capacity": capacity.to_json(),
        "open": [step.as_dict() for step in opened],
        "closed": [step.as_dict() for step in closed],
        "loadgen": loadgen,
    }


def report_lines(document: dict[str, Any]) -> list[str]:
    """The markdown report (the documentation includes its :data:`SECTION`)."""
    options, capacity = document["options"], document["capacity"]
    opened = [RateStep.from_dict(step) for step in document["open"]]
    closed = [StepResult.from_dict(step) for step in document["closed"]]
    loadgen = document["loadgen"]
    found = capacity["best"]["request_rate"] if capacity["best"] else options["start_rate"]
    lines = [
        "# Open against closed loop, capacity under a p99 budget, and MLPerf's verdict",
        "",
        section_start(SECTION),
        f"- command: `{document.get('command', '')}`; started {document.get('started', '')}",
        *([f"- machine: {machine_with_flags(document['machine'])}"] if "machine" in document else []),
        f"- model: `{options['model']}` over {options['protocol']}, batch {options['batch_size']}, one local "
        f"tritonserver; each step {options['warmup_s']:g} s warm-up, {options['duration_s']:g} s measured"
        + (f" (the open loop's longer where {options['min_requests']:,} requests need it)"
           if options.get("min_requests") else ""),
        f"- open loop: Poisson arrivals, {options['connections']} connections; {flag_rule()}",
        *([f"- timer: {WakeUps(**document['wake_ups']).line()}"] if "wake_ups" in document else []),
        "",
        f"**{capacity['statement']}**",
        "",
        "Open loop at fractions of that rate (latency from each request's scheduled time):",
        "",
        *table(
            ["rate asked /s", "rate sent /s", "samples/s", "p50 ms", "p99 ms", "p99.9 ms", "p99 from send ms",
             "in flight mean / max", "flag"],
            [
                [f"{s.request_rate:g}", s.achieved_rate, s.samples_per_s, s.p50_ms, s.p99_ms, s.p999_ms,
                 s.service_p99_ms, f"{s.in_flight_mean:.1f} / {s.in_flight_max}", s.flag or "-"]
                for s in opened
            ],
            "rrrrrrrrl",
        ),
        "",
        "Closed loop (each user sends when its last answer is back):",
        "",
        *table(
            ["concurrency", "samples/s", "p50 ms", "p99 ms", "client-bound"],
            [[c.concurrency, c.samples_per_s, c.p50_ms, c.p99_ms, "yes" if c.client_bound else "no"]
             for c in closed],
            "rrrrl",
        ),
        "",
        f"MLPerf Server scenario through LoadGen at {found:g} queries/s, latency bound "
        f"{options['budget_ms']:g} ms:",
        "",
        "```",
        *loadgen["lines"][:-1],
        "```",
        "",
        section_end(SECTION),
        "",
        "![open and closed loop](open_loop.png)",
        "",
    ]  # fmt: skip
    return lines


def _flagged(steps: list[RateStep], x: str) -> list[tuple[str, float, float]]:
    """A "flagged" note at the p99 of each step whose generator did not keep its schedule."""
    return [("flagged", float(getattr(step, x)), step.p99_ms) for step in steps if step.flag]


def write_open_loop(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """``open_loop.json``, ``open_loop.md`` and ``open_loop.png`` in ``out``."""
    budget = float(document["options"]["budget_ms"])
    opened = sorted((RateStep.from_dict(s) for s in document["open"]), key=lambda s: s.request_rate)
    closed = [StepResult.from_dict(s) for s in document["closed"]]
    rates = [s.request_rate for s in opened]
    by_rate = Panel(
        "Open loop: latency against the offered rate",
        "offered rate (requests/s)",
        "latency from the schedule (ms)",
        [
            Series("p50", rates, [s.p50_ms for s in opened], "o-"),
            Series("p99", rates, [s.p99_ms for s in opened], "s-", notes=_flagged(opened, "request_rate")),
            Series("p99.9", rates, [s.p999_ms for s in opened], "^-"),
            Series(f"p99 budget {budget:g} ms", [rates[0], rates[-1]], [budget, budget], "--"),
        ],
        ylog=True,
    )
    by_throughput = Panel(
        "p99 at the throughput reached: open against closed loop",
        "samples/s reached",
        "p99 latency (ms)",
        [
            Series(
                "open loop (from the schedule)",
                [s.samples_per_s for s in opened],
                [s.p99_ms for s in opened],
                "s-",
                notes=_flagged(opened, "samples_per_s"),
            ),
            Series(
                "closed loop (from the send)",
                [s.samples_per_s for s in closed],
                [s.p99_ms for s in closed],
                "o-",
                notes=[("client-bound", s.samples_per_s, s.p99_ms) for s in closed if s.client_bound],
            ),
        ],
        ylog=True,
    )
    return {
        "json": write_json(out / "open_loop.json", document),
        "markdown": write_markdown(out / "open_loop.md", report_lines(document)),
        "png": plot(out / "open_loop.png", "Open against closed loop", [by_rate, by_throughput]),
    }
