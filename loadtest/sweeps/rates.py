"""Request-rate steps: the load at a rate set in advance, whatever the answers do (open loop).

``python -m loadtest sweep --request-rate 500,1000,2000`` runs one step per rate, per model,
protocol and batch size, with the bundle's open-loop driver (:mod:`loadtest.engine.open_loop`):
Poisson arrivals by default (``--arrival constant`` for equal gaps), each request's latency
measured from its *scheduled* time, so a stall counts in every request it holds up. A step
records the rate asked and the rate achieved, the requests in flight (mean and maximum), the
late and the unfinished requests, the send lag, the latency from the send beside the latency
from the schedule, and Triton's own view (queue and compute) over the window; a step whose
generator could not keep its schedule is flagged, with the reason
(:meth:`loadtest.engine.open_loop.OpenLoopWindow.flag`), and its figures describe an
overloaded server or client, not the server at that rate.

The report (``rates.json``, ``rates.md``, ``rates.png``) plots latency percentiles against the
offered rate, one panel per batch size, with ``--p99-budget-ms`` as a line where given.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bundle.errors import BundleError, ConfigError, DataError
from bundle.records import RunRecord
from bundle.snippets import section
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from loadtest.engine.open_loop import ARRIVALS, CONNECTIONS, LATE_MS, MAX_LATE_SHARE, MIN_SENT_SHARE, OpenLoop
from loadtest.engine.payload import PayloadPool
from loadtest.engine.served import triton_requests
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.perf_analyzer import UNSTABLE
from loadtest.sweeps.stepfiles import read_server, record_server
from loadtest.sweeps.steps import ServerTimes, Target, median_server, medians

logger = logging.getLogger(__name__)

#: What can drive request-rate steps: the bundle's open loop, and perf_analyzer's request-rate mode.
RATE_ENGINES = ("driver", "perf_analyzer")
#: Two engines' p50 and p99 at one rate agree when each ratio is within this of 1.
AGREEMENT = 0.10
#: The report's section that sets the two engines side by side (the documentation includes it).
AGREEMENT_SECTION = "agreement"
#: The latency percentiles a rate step reports (from the schedule).
RATE_PERCENTILES = (50.0, 90.0, 99.0, 99.9)


@dataclass(frozen=True)
class RateLoad:
    """How every rate step sends, whichever command runs it (``sweep --request-rate``,
    ``capacity``, ``lab open-loop``) and whichever engine.

    Args:
        arrival: ``poisson`` or ``constant`` (:data:`~loadtest.engine.open_loop.ARRIVALS`).
        connections: requests in flight at most (the open loop's sender threads, perf_analyzer's
            ``--max-threads``).
        duration_s: each step's measured window, seconds (at least; see ``min_requests``).
        warmup_s: the load before it, seconds (perf_analyzer's windows settle it instead).
        request_timeout_s: how long a request may take; the window's requests are followed to
            their answers that long after it closes.
        client_cpus: the cores the load generator runs on (None: any).
        seed: of the arrival times.
        min_requests: requests each window holds at least, at the rate asked: a window shorter
            than that is lengthened (:meth:`window_s`). A p99 read from fewer than 1,000
            requests rests on fewer than 10 latencies above it, so one hiccup moves it.
    """

    arrival: str = "poisson"
    connections: int = CONNECTIONS
    duration_s: float = 10.0
    warmup_s: float = 2.0
    request_timeout_s: float = 60.0
    client_cpus: frozenset[int] | None = None
    seed: int = 0
    min_requests: int = 0

    def __post_init__(self) -> None:
        if self.min_requests < 0:
            raise ConfigError(f"--min-requests must be >= 0, got {self.min_requests}")
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"--arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if self.connections < 1:
            raise ConfigError(f"--connections must be >= 1, got {self.connections}")
        if not self.duration_s > 0 or self.warmup_s < 0 or not self.request_timeout_s > 0:
            raise ConfigError(
                f"a rate step needs a window > 0 s, a warm-up >= 0 s and a request timeout > 0 s, got "
                f"{self.duration_s:g}, {self.warmup_s:g} and {self.request_timeout_s:g}"
            )

    def window_s(self, rate: float) -> float:
        """The measured window of a step at ``rate`` requests/s: ``duration_s``, or longer where
        ``min_requests`` at that rate need longer."""
        return max(self.duration_s, self.min_requests / rate)

    def per_step(self) -> str:
        """The load of each step, as reports state it."""
        measured = f"{self.duration_s:g} s measured"
        if self.min_requests:
            measured = f"{measured} (longer where {self.min_requests:,} requests need it)"
        return f"{self.warmup_s:g} s warm-up, {measured}, {self.connections} connections"


#: Each rate step's load where a caller gives none.
DEFAULT_LOAD = RateLoad()


def parse_rates(text: str) -> tuple[float, ...]:
    """``"500,1000,2000"`` -> the rates, ascending; each > 0 per second.

    Raises:
        ConfigError: not numbers > 0.
    """
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--request-rate must be comma-separated requests per second, got {text!r}"
        ) from None
    if not rates or not all(math.isfinite(rate) and rate > 0 for rate in rates):
        raise ConfigError(f"--request-rate must be requests per second > 0, got {text!r}")
    return tuple(sorted(set(rates)))


@dataclass(frozen=True)
class RateStep:
    """One request-rate step's measurements (latency in ms, from each request's scheduled time
    unless said otherwise).

    Attributes:
        label, model, protocol, batch_size: what was loaded.
        arrival: ``poisson`` or ``constant``.
        request_rate: the rate asked (requests per second).
        scheduled_rate: what the schedule asked inside the window (a Poisson schedule varies).
        achieved_rate: requests sent per second of the window.
        answered_per_s, samples_per_s: accepted answers (and their rows) per second.
        connections: requests in flight at most.
        seconds: the window's length.
        requests, errors: answered and failed requests of the window.
        late: requests sent more than :data:`~loadtest.engine.open_loop.LATE_MS` late.
        unfinished: requests without an answer when the step ended.
        in_flight_mean, in_flight_max: requests in flight as each arrived.
        p50_ms, p90_ms, p99_ms, p999_ms, max_ms: latency from the schedule.
        service_p99_ms: p99 latency from the send (what a closed loop measures).
        send_lag_p99_ms: p99 of sent minus scheduled.
        flag: why the generator did not keep its schedule ("" when it did).
        server: Triton's statistics over the window (None where unread).
        client_cpu_us: the load generator's CPU per request.
        engine: ``driver`` (the bundle's open loop).
        rounds: the repeats of the step its figures are the median of (:func:`median_rate_step`).
        service_p50_ms: p50 latency from the send. perf_analyzer starts a request's clock when
            it sends it, so its steps' ``service_*`` figures are its own percentiles.
    """

    label: str
    model: str
    protocol: str
    batch_size: int
    arrival: str
    request_rate: float
    scheduled_rate: float
    achieved_rate: float
    answered_per_s: float
    samples_per_s: float
    connections: int
    seconds: float
    requests: int
    errors: int
    late: int
    unfinished: int
    in_flight_mean: float
    in_flight_max: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    service_p99_ms: float
    send_lag_p99_ms: float
    flag: str
    server: ServerTimes | None = None
    client_cpu_us: float = math.nan
    engine: str = "driver"
    rounds: int = 1
    service_p50_ms: float = math.nan

    @property
    def series(self) -> str:
        """The curve this step belongs to (the engine named unless it is the bundle's driver)."""
        engine = "" if self.engine == "driver" else f" [{self.engine}]"
        return f"{self.label} {self.model} {self.protocol} B={self.batch_size}{engine}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RateStep:
        """A step as :meth:`as_dict` gave it, or read back from JSON, which holds NaN as null."""

        def numbers(values: dict[str, Any]) -> dict[str, Any]:
            return {key: math.nan if value is None else value for key, value in values.items()}

        values = dict(data)
        server = values.pop("server", None)
        return cls(server=ServerTimes(**numbers(server)) if server else None, **numbers(values))


def median_rate_step(rounds: Sequence[RateStep]) -> RateStep:
    """One step from several rounds of the same (series, rate): rates, percentiles and means are
    the median of the rounds that have figures, Triton's times as :func:`~loadtest.sweeps.steps.median_server`
    combines them; requests, errors, late and unfinished requests and seconds add up, the
    maximums are the largest. The step is flagged when at least half of its rounds were (the
    median round's verdict), with how many and the first round's reason. One round is returned
    as is.

    Raises:
        ValueError: no rounds, or rounds of different steps.
    """
    if not rounds:
        raise ValueError("no rounds to combine")
    first = rounds[0]
    if len(rounds) == 1:
        return first
    keys = {(r.series, r.request_rate) for r in rounds}
    if len(keys) > 1:
        raise ValueError(f"rounds of different steps: {sorted(keys)}")
    flagged = [r.flag for r in rounds if r.flag]
    flag = (
        f"{len(flagged)} of {len(rounds)} rounds flagged: {flagged[0]}"
        if 2 * len(flagged) >= len(rounds)
        else ""
    )

    # A perf_analyzer round that found no stable measurement has no figures to take a median of.
    measured = [r for r in rounds if not math.isnan(r.samples_per_s)] or list(rounds)

    return replace(
        first,
        **medians(
            measured,
            "scheduled_rate",
            "achieved_rate",
            "answered_per_s",
            "samples_per_s",
            "in_flight_mean",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "p999_ms",
            "service_p50_ms",
            "service_p99_ms",
            "send_lag_p99_ms",
            "client_cpu_us",
        ),
        seconds=sum(r.seconds for r in rounds),
        requests=sum(r.requests for r in rounds),
        errors=sum(r.errors for r in rounds),
        late=sum(r.late for r in rounds),
        unfinished=sum(r.unfinished for r in rounds),
        in_flight_max=max(r.in_flight_max for r in rounds),
        max_ms=max(r.max_ms for r in rounds),
        flag=flag,
        server=median_server([r.server for r in rounds]),
        rounds=sum(r.rounds for r in rounds),
    )


def rate_step(
    target: Target,
    model: str,
    batch_size: int,
    rate: float,
    payload: Path,
    folder: Path,
    load: RateLoad = DEFAULT_LOAD,
) -> RateStep:
    """One step at ``rate`` requests per second of ``batch_size`` rows: ``load.warmup_s`` of load,
    then one window of ``load.window_s(rate)`` whose requests are each followed to their answer (at
    most ``load.request_timeout_s`` after it closes)."""
    arrival, connections, request_timeout_s = load.arrival, load.connections, load.request_timeout_s
    wire: Literal["grpc", "http"] = "grpc" if target.protocol == "grpc" else "http"
    pool = PayloadPool.load(payload).rebatched(batch_size)
    connect = triton_requests(target.url, wire, model, pool, connections, timeout_s=request_timeout_s)
    stats = TritonClient(target.url, wire, timeout_s=10.0, retry=RetryPolicy(max_tries=2))
    affinity = os.sched_getaffinity(0)
    try:
        if load.client_cpus is not None:
            os.sched_setaffinity(0, load.client_cpus)  # the sender threads inherit it
        with OpenLoop(connect, rate, arrival, connections, load.seed) as sending:
            if load.warmup_s > 0:
                sending.measure(load.warmup_s, drain_s=request_timeout_s)
            before = read_server(stats if target.server_stats else None, model, None)
            window = sending.measure(load.window_s(rate), drain_s=request_timeout_s)
            after = read_server(stats if target.server_stats else None, model, None)
    finally:
        os.sched_setaffinity(0, affinity)
        stats.close()
    document = record_server(folder, model, before, after)
    server = ServerTimes.from_delta(document["delta"]) if document is not None else None
    tally, histogram = window.tally, window.tally.histogram
    p50, p90, p99, p999 = (histogram.percentile(q) for q in RATE_PERCENTILES)
    client = tally.client
    return RateStep(
        label=target.label, model=model, protocol=target.protocol, batch_size=batch_size, arrival=arrival,
        request_rate=rate, scheduled_rate=window.scheduled_rate, achieved_rate=window.achieved_rate,
        answered_per_s=tally.requests_per_s, samples_per_s=tally.requests_per_s * batch_size,
        connections=connections, seconds=tally.seconds, requests=tally.ok, errors=tally.errors,
        late=window.late, unfinished=window.unfinished, in_flight_mean=window.in_flight_mean,
        in_flight_max=window.in_flight_max, p50_ms=p50, p90_ms=p90, p99_ms=p99, p999_ms=p999,
        max_ms=histogram.max_ms if histogram.count else math.nan,
        service_p50_ms=window.service.percentile(50), service_p99_ms=window.service.percentile(99),
        send_lag_p99_ms=window.lag.percentile(99),
        flag=window.flag(), server=server,
        client_cpu_us=client.per_request_us if client is not None else math.nan,
    )  # fmt: skip


def step_line(step: RateStep) -> str:
    """One step in one line, as a run prints it."""
    line = (
        f"{step.series} {step.request_rate:g}/s: sent {step.achieved_rate:.0f}/s, "
        f"p50 {step.p50_ms:.2f} ms, p99 {step.p99_ms:.2f} ms, p99.9 {step.p999_ms:.2f} ms"
    )
    return line + (f" FLAGGED: {step.flag}" if step.flag else "")


def perf_analyzer_rate_step(
    target: Target,
    model: str,
    batch_size: int,
    rate: float,
    payload: Path,
    folder: Path,
    load: RateLoad = DEFAULT_LOAD,
) -> RateStep:
    """One step at ``rate`` driven by perf_analyzer's request-rate mode (``load.connections``
    threads at most; its windows settle it, so ``load.warmup_s`` is not used), its figures its
    own: throughput and latency percentiles from its CSV, and the share of requests it says it
    delayed, which flags the step above :data:`~loadtest.engine.open_loop.MAX_LATE_SHARE`."""
    from loadtest.sweeps import perf_analyzer
    from loadtest.sweeps.perf_analyzer_install import require

    input_data, requests_of = perf_analyzer.input_data_for(payload, model, batch_size)
    arrival, connections = load.arrival, load.connections
    window_s = perf_analyzer.window_for(load.window_s(rate))
    try:
        run = perf_analyzer.run_step(
            require(), target.url, target.protocol, model, requests_of, connections, window_s, input_data,
            folder, timeout_s=(perf_analyzer.MAX_TRIALS + 1) * window_s + load.request_timeout_s + 60.0,
            cpus=load.client_cpus, request_rate=rate, arrival=arrival,
        )  # fmt: skip
    except BundleError as exc:
        if UNSTABLE not in str(exc):
            raise
        # No figures of its own to report: the step says so, flagged, and the run goes on.
        return RateStep(
            label=target.label, model=model, protocol=target.protocol, batch_size=batch_size, arrival=arrival,
            request_rate=rate, scheduled_rate=rate, achieved_rate=math.nan, answered_per_s=math.nan,
            samples_per_s=math.nan, connections=connections, seconds=0.0, requests=0, errors=0, late=0,
            unfinished=0, in_flight_mean=math.nan, in_flight_max=0, p50_ms=math.nan, p90_ms=math.nan,
            p99_ms=math.nan, p999_ms=math.nan, max_ms=math.nan, service_p99_ms=math.nan,
            send_lag_p99_ms=math.nan, server=None, client_cpu_us=math.nan, engine="perf_analyzer",
            flag=f"perf_analyzer found no stable measurement in {perf_analyzer.MAX_TRIALS} windows of "
            f"{window_s:.3g} s (a busy machine, or too few requests per window)",
        )  # fmt: skip
    (folder / "perf_analyzer.json").write_text(json.dumps(perf_analyzer.describe(run)))
    figures = run.figures
    # perf_analyzer counts inferences of its -b: for whole-request entries, requests.
    answered = figures.samples_per_s / requests_of
    delayed = figures.delayed_percent / 100.0
    flag = f"perf_analyzer delayed {delayed:.1%} of the requests" if delayed > MAX_LATE_SHARE else ""
    return RateStep(
        label=target.label, model=model, protocol=target.protocol, batch_size=batch_size, arrival=arrival,
        request_rate=rate, scheduled_rate=rate, achieved_rate=answered, answered_per_s=answered,
        samples_per_s=answered * batch_size, connections=connections,
        seconds=figures.requests / answered if answered > 0 else 0.0, requests=figures.requests, errors=0,
        late=round(delayed * figures.requests), unfinished=0, in_flight_mean=math.nan, in_flight_max=0,
        p50_ms=figures.p50_ms, p90_ms=figures.p90_ms, p99_ms=figures.p99_ms, p999_ms=math.nan,
        max_ms=math.nan, service_p50_ms=figures.p50_ms, service_p99_ms=figures.p99_ms,
        send_lag_p99_ms=math.nan, flag=flag, server=ServerTimes.from_perf_analyzer(figures.server),
        client_cpu_us=run.cpu.per_request_us, engine="perf_analyzer",
    )  # fmt: skip


def agrees(ours: RateStep, theirs: RateStep) -> bool | None:
    """Whether the open loop's step and perf_analyzer's at one rate agree within
    :data:`AGREEMENT` on p50 and on p99, each engine's figures as it reports them: the open
    loop's from each request's scheduled time, perf_analyzer's from its send (None: either is
    flagged, so there is nothing to judge).

    Both clocks stop at the answer; they start at different points, and each engine's own work
    per request falls inside its interval: the open loop's send lag (waking up at the scheduled
    time) inside its own, perf_analyzer's serialising of the request and its hand-over of the
    answer to a callback thread inside its. Timed from the send, the open loop's interval holds
    a ``sendmsg`` of bytes serialised in advance, and comes out shorter than perf_analyzer's by
    perf_analyzer's own client time: the report sets those ratios and both engines' client CPU
    per request beside the verdict."""
    if ours.flag or theirs.flag:
        return None
    ratios = (ours.p50_ms / theirs.service_p50_ms, ours.p99_ms / theirs.service_p99_ms)
    return all(abs(ratio - 1) <= AGREEMENT for ratio in ratios)


def server_ratio(ours: RateStep, theirs: RateStep) -> float:
    """The server's mean time per request in ``ours`` over ``theirs`` (NaN: either unread)."""
    if ours.server is None or theirs.server is None or not theirs.server.request_ms > 0:
        return math.nan
    return ours.server.request_ms / theirs.server.request_ms


def agreement_rows(steps: Sequence[RateStep]) -> list[list[Any]]:
    """Each driver step beside perf_analyzer's at the same (model, protocol, batch, rate): their
    p50 and p99 as each reports them (the driver's from the schedule), the ratios, whether they
    agree (``-``: either was flagged; :func:`agrees`), the server's mean time per request under
    the one over the other (Triton's statistics: where the latencies differ by as much, the
    server, not the measurement, differed), the driver's p50 and p99 from the send over
    perf_analyzer's, and each engine's client CPU per request."""
    theirs = {
        (s.label, s.model, s.protocol, s.batch_size, s.request_rate): s
        for s in steps
        if s.engine == "perf_analyzer"
    }
    rows = []
    for ours in steps:
        if ours.engine != "driver":
            continue
        other = theirs.get((ours.label, ours.model, ours.protocol, ours.batch_size, ours.request_rate))
        if other is None:
            continue
        verdict = agrees(ours, other)
        rows.append(
            [
                ours.series, f"{ours.request_rate:g}",
                ours.p50_ms, other.service_p50_ms, ours.p50_ms / other.service_p50_ms,
                ours.p99_ms, other.service_p99_ms, ours.p99_ms / other.service_p99_ms,
                "- (flagged)" if verdict is None else ("yes" if verdict else "no"),
                server_ratio(ours, other),
                f"{ours.service_p50_ms / other.service_p50_ms:.3f} / "
                f"{ours.service_p99_ms / other.service_p99_ms:.3f}",
                f"{ours.client_cpu_us:.0f} / {other.client_cpu_us:.0f}",
            ]
        )  # fmt: skip
    return rows


def flag_rule() -> str:
    """The flag's rule, as the reports state it."""
    return (
        f"a step is flagged when fewer than {MIN_SENT_SHARE:.0%} of the requests scheduled in its window "
        f"were sent in it, or more than {MAX_LATE_SHARE:.0%} were sent more than {LATE_MS:g} ms after "
        "their scheduled time; latency counts from the scheduled time"
    )


def report_lines(
    title: str, record: dict[str, Any], settings: dict[str, str], steps: Sequence[RateStep]
) -> list[str]:
    """The markdown report of a rate run."""
    lines = [f"# {title}", "", f"- command: `{record.get('command', '')}`"]
    lines += [f"- {key}: {value}" for key, value in settings.items()]
    lines += [f"- flag: {flag_rule()}", ""]
    rows = []
    for step in steps:
        server = step.server
        rows.append(
            [
                step.series, f"{step.request_rate:g}", step.achieved_rate, step.samples_per_s,
                step.p50_ms, step.p99_ms, step.p999_ms, step.service_p99_ms, step.send_lag_p99_ms,
                f"{step.in_flight_mean:.1f} / {step.in_flight_max}", step.late, step.errors + step.unfinished,
                server.queue_ms if server else math.nan,
                server.compute_infer_ms if server else math.nan,
                step.flag or "-",
            ]
        )  # fmt: skip
    lines += table(
        [
            "series", "rate asked /s", "rate sent /s", "samples/s", "p50 ms", "p99 ms", "p99.9 ms",
            "p99 from send ms", "send lag p99 ms", "in flight mean / max", "late", "failed",
            "server queue ms", "server compute ms", "flag",
        ],
        rows,
        "lrrrrrrrrrrrrrl",
    )  # fmt: skip
    agreement = agreement_rows(steps)
    if agreement:
        judged = [row[8] for row in agreement if row[8] != "- (flagged)"]  # the verdict
        lines += [
            "",
            *section(AGREEMENT_SECTION, [
                "The bundle's open loop against perf_analyzer's request-rate mode, same server, same rate, "
                "each engine's p50 and p99 as it reports them: the open loop's from each request's "
                "scheduled time, perf_analyzer's from its send. The server's own mean time per request "
                "(Triton's statistics over the open loop's window and perf_analyzer's measured windows), "
                "one over the other, tells a difference in the server's work from one in the measurement. "
                "Timed from the send too, the open loop's interval holds less of its own work than "
                "perf_analyzer's (bytes serialised in advance, no hand-over of the answer to another "
                "thread): the last two columns set those ratios and each engine's client CPU per request "
                "side by side:",
                "",
                *table(
                    ["series", "rate /s", "p50 ms", "perf_analyzer p50 ms", "ratio",
                     "p99 ms", "perf_analyzer p99 ms", "ratio", f"within {AGREEMENT:.0%}",
                     "server time ratio", "from the send: p50 / p99 ratio",
                     "client CPU us/request: open loop / perf_analyzer"],
                    agreement,
                    "lrrrrrrrlrrr",
                ),
                "",
                f"{judged.count('yes')} of {len(judged)} steps neither engine flagged agree within "
                f"{AGREEMENT:.0%} on p50 and p99; {len(agreement) - len(judged)} flagged.",
            ]),
        ]  # fmt: skip
    lines += ["", "![latency against the offered rate](rates.png)", ""]
    return lines


def write_rate_report(
    title: str,
    record: dict[str, Any],
    settings: dict[str, str],
    steps: Sequence[RateStep],
    out: Path,
    budget_ms: float | None = None,
) -> dict[str, Path]:
    """``rates.json``, ``rates.md`` and ``rates.png`` in ``out``."""
    panels = []
    for batch_size in sorted({step.batch_size for step in steps}):
        series = []
        for name in dict.fromkeys(step.series for step in steps if step.batch_size == batch_size):
            mine = [step for step in steps if step.series == name]
            # perf_analyzer times a request from its send, and reports no p99.9.
            clock = " (from the send)" if mine[0].engine == "perf_analyzer" else ""
            for key, label, style in (
                ("p50_ms", "p50", "o-"),
                ("p99_ms", "p99", "s-"),
                ("p999_ms", "p99.9", "^-"),
            ):
                rates, values = [s.request_rate for s in mine], [getattr(s, key) for s in mine]
                if all(math.isnan(value) for value in values):
                    continue
                series.append(
                    Series(f"{name} {label}{clock}", rates, values, style, color_key=f"{name} {label}")
                )
        if budget_ms is not None and series:
            rates = [step.request_rate for step in steps if step.batch_size == batch_size]
            series.append(
                Series(f"p99 budget {budget_ms:g} ms", [min(rates), max(rates)], [budget_ms] * 2, "--")
            )
        panels.append(
            Panel(
                f"B={batch_size}",
                "offered rate (requests/s)",
                "latency (ms; the open loop's from the schedule)",
                series,
                ylog=True,
            )
        )
    document = {
        **record, "title": title, "settings": settings, "budget_ms": budget_ms,
        "steps": [s.as_dict() for s in steps],
    }  # fmt: skip
    return {
        "json": write_json(out / "rates.json", document),
        "markdown": write_markdown(out / "rates.md", report_lines(title, record, settings, steps)),
        "png": plot(out / "rates.png", title, panels),
    }


def is_rate_document(document: Any) -> bool:
    """Whether a JSON document is a ``rates.json`` (steps at request rates)."""
    steps = document.get("steps") if isinstance(document, dict) else None
    return (
        bool(steps) and isinstance(steps, list) and isinstance(steps[0], dict) and "request_rate" in steps[0]
    )


def rate_document(path: Path) -> dict[str, Any] | None:
    """The ``rates.json`` at ``path``, or None for any other file (readable or not)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if is_rate_document(document) else None


def rewrite_rate_report(path: Path, out: Path, document: dict[str, Any] | None = None) -> dict[str, Path]:
    """``rates.json``, ``rates.md`` and ``rates.png`` written again in ``out`` from the ``rates.json``
    at ``path`` (``document``, when the caller has read it already), by this version's report
    (its title from the file, or from the ``rates.md`` beside it for a file that predates it).

    Raises:
        DataError: the file is not a ``rates.json``.
    """
    if document is None:
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"{path}: not readable as JSON ({exc})") from None
        if not is_rate_document(document):
            raise DataError(f"{path}: not a rates.json (no steps at request rates)")
    beside = path.with_suffix(".md")
    first = beside.read_text().split("\n", 1)[0] if beside.exists() else ""
    title = document.get("title") or (first[2:] if first.startswith("# ") else "Open-loop steps")
    record = {k: v for k, v in document.items() if k not in ("title", "settings", "budget_ms", "steps")}
    steps = [RateStep.from_dict(step) for step in document["steps"]]
    return write_rate_report(
        title, record, document.get("settings", {}), steps, out, document.get("budget_ms")
    )


def _rounds(
    url: str,
    protocol: str,
    model: str,
    batch_size: int,
    rate: float,
    engines: Sequence[str],
    rounds: int,
    payload: Path,
    raw: Path,
    load: RateLoad,
) -> list[RateStep]:
    """One rate's steps, an engine's rounds each combined (:func:`median_rate_step`)."""
    by_engine: dict[str, list[RateStep]] = {engine: [] for engine in engines}
    for round_ in range(rounds):
        first = round_ % len(engines)
        for engine in [*engines[first:], *engines[:first]]:
            target = Target(url, protocol, "triton", engine=engine)
            folder = raw / f"{model}-{protocol}-{engine}-b{batch_size}-r{rate:g}"
            if rounds > 1:
                folder = folder / f"round{round_ + 1}"
            try:
                step = _one_step(target, model, batch_size, rate, payload, folder, load)
            except BundleError as exc:
                raise BundleError(
                    f"{model} over {protocol}, B={batch_size}, {rate:g}/s, {engine}: {exc}"
                ) from exc
            by_engine[engine].append(step)
            print(step_line(step) + (f", round {round_ + 1}/{rounds}" if rounds > 1 else ""), flush=True)
    return [median_rate_step(done) for done in by_engine.values()]


def _one_step(
    target: Target, model: str, batch_size: int, rate: float, payload: Path, folder: Path, load: RateLoad
) -> RateStep:
    step = perf_analyzer_rate_step if target.engine == "perf_analyzer" else rate_step
    return step(target, model, batch_size, rate, payload, folder, load)


def check_endpoints(protocols: Sequence[str], urls: Sequence[str], repository: Path | None) -> None:
    """Raises ConfigError unless there is one ``url`` per protocol, or a repository to serve."""
    if urls and len(urls) != len(protocols):
        raise ConfigError(f"give one --url per --protocol ({len(protocols)}), got {len(urls)}")
    if not urls and repository is None:
        raise ConfigError("give --url of a running server, or --repository to start a local one")


def open_endpoints(
    stack: contextlib.ExitStack,
    models: Sequence[str],
    protocols: Sequence[str],
    urls: Sequence[str],
    repository: Path | None,
    raw: Path,
    client_cpus: frozenset[int] | None,
) -> list[tuple[str, str]]:
    """``(protocol, url)`` of each protocol: the running servers' ``urls``, or a local tritonserver
    serving ``models`` of ``repository`` (kept off ``client_cpus`` where cores are left), which
    ``stack`` stops."""
    from loadtest.sweeps.runs import local_triton

    check_endpoints(protocols, urls, repository)
    if urls or repository is None:
        return list(zip(protocols, urls, strict=True))
    server = stack.enter_context(local_triton(repository, models, raw / "tritonserver.log", client_cpus))
    return [(p, server.grpc_url if p == "grpc" else server.http_url) for p in protocols]


def rate_run(
    models: Sequence[str],
    protocols: Sequence[str],
    urls: Sequence[str],
    repository: Path | None,
    batch_sizes: Sequence[int],
    rates: Sequence[float],
    out: Path,
    title: str,
    command: str,
    load: RateLoad = DEFAULT_LOAD,
    *,
    data: Path | None = None,
    budget_ms: float | None = None,
    raw: Path | None = None,
    engines: Sequence[str] = ("driver",),
    rounds: int = 1,
) -> tuple[list[RateStep], dict[str, Path]]:
    """Every (model, protocol, batch size, rate) step against running servers (``urls``, one
    per protocol) or a local tritonserver serving ``repository``; the report in ``out``. With
    ``rounds`` > 1 each rate runs that many rounds in a row, the engines taking turns (the one
    that goes first rotating), and each step is the median of its rounds (:func:`median_rate_step`)."""
    if rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {rounds}")
    from loadtest.sweeps.runs import models_payload, wire_settings

    if not engines or any(engine not in RATE_ENGINES for engine in engines):
        raise ConfigError(
            f"--request-rate runs the bundle's open-loop driver or perf_analyzer's request-rate mode "
            f"(--engine {','.join(RATE_ENGINES)}), not {','.join(engines) or 'none'}: "
            "locust runs closed loops"
        )
    check_endpoints(protocols, urls, repository)
    raw = raw or out / "raw"
    out.mkdir(parents=True, exist_ok=True)
    record = RunRecord.begin(command)
    payload = models_payload(raw, data, repository, urls, protocols, models)
    steps: list[RateStep] = []
    with contextlib.ExitStack() as stack:
        endpoints = open_endpoints(stack, models, protocols, urls, repository, raw, load.client_cpus)
        for model in models:
            for protocol, url in endpoints:
                for batch_size in batch_sizes:
                    for rate in rates:
                        steps += _rounds(
                            url, protocol, model, batch_size, rate, engines, rounds, payload, raw, load
                        )
    settings = {
        "arrival": load.arrival,
        "per step": load.per_step()
        + (
            f"; {rounds} rounds in a row, the engines taking turns; figures are the median of the rounds"
            if rounds > 1
            else ""
        ),
        "request rows": str(data or "synthetic data (criteo.synth)"),
        **wire_settings(payload, models, protocols, batch_sizes),
    }
    paths = write_rate_report(title, record.finish().to_json(), settings, steps, out, budget_ms)
    return steps, paths
