"""The SLA question: the highest Poisson request rate whose p99 holds a latency budget.

``python -m loadtest capacity --p99-budget-ms 10`` measures open-loop steps
(:func:`loadtest.sweeps.rates.rate_step`) and searches their rate: from ``--start``, the rate
doubles while the step holds the budget (or, where the start does not hold it, halves until a
rate does, down to ``start /`` :data:`LOWEST_SHARE`), then the interval between the highest rate that held
and the lowest that did not is halved (geometrically) until the failing rate is within
``--resolution`` of the passing one. A step holds the budget when its p99, counted from each
request's scheduled time, is within it, no request failed or was left unfinished, and the
generator sent at least :data:`~loadtest.engine.open_loop.MIN_SENT_SHARE` of its schedule. A
step flagged for late sends alone can hold: its latency is counted from each request's scheduled
time, so the lag is inside its p99 and could only have raised it. The answer is the highest
rate that held, with its p50, p99, p99.9 and Triton's queue and compute times; each rate is
measured once, so a rate near the edge can land on either side from run to run, which the
resolution does not hide.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.records import RunRecord
from loadtest.engine.open_loop import MIN_SENT_SHARE, wake_ups
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.rates import (
    DEFAULT_LOAD,
    RateLoad,
    RateStep,
    check_endpoints,
    flag_rule,
    open_endpoints,
    rate_step,
    step_line,
)
from loadtest.sweeps.steps import Target

#: The rate the search starts at, per second, by default.
START_RATE = 50.0
#: The search stops when the failing rate is within this share of the passing one.
RESOLUTION = 0.05
#: Where the start rate does not hold, the search halves down to ``start / LOWEST_SHARE``.
LOWEST_SHARE = 64.0
#: The highest rate the search tries, per second, by default.
MAX_RATE = 100_000.0


def holds(step: RateStep, budget_ms: float) -> str:
    """Why ``step`` does not hold ``budget_ms`` ("" when it does)."""
    if step.errors or step.unfinished:
        return f"{step.errors} failed and {step.unfinished} unfinished requests"
    if not step.achieved_rate >= MIN_SENT_SHARE * step.scheduled_rate:
        return f"flagged: {step.flag}"
    if not step.p99_ms <= budget_ms:
        return f"p99 {step.p99_ms:.2f} ms over the budget" + (f" (flagged: {step.flag})" if step.flag else "")
    return ""


@dataclass
class Capacity:
    """A search's outcome.

    Attributes:
        budget_ms: the p99 budget.
        resolution: the search's stopping width (the failing rate within this share of the passing one).
        steps: every step measured, in the order measured.
        verdicts: why each step failed ("" where it held), in the same order.
        best: the highest rate that held (None: not even the first).
        failed_above: the lowest rate above ``best`` that did not hold (None: the search reached
            its highest rate holding).
    """

    budget_ms: float
    resolution: float
    steps: list[RateStep] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    best: RateStep | None = None
    failed_above: RateStep | None = None

    def statement(self) -> str:
        """The answer in one line."""
        if self.best is None:
            if not self.steps:
                return f"no rate held a p99 of {self.budget_ms:g} ms: nothing measured"
            first, last = self.steps[0].request_rate, self.steps[-1].request_rate
            tried = f"{first:g}/s did not" if first == last else f"{first:g}/s down to {last:g}/s did not"
            return f"no rate held a p99 of {self.budget_ms:g} ms: {tried} ({self.verdicts[-1]})"
        best = self.best
        edge = (
            f"{self.failed_above.request_rate:g}/s did not hold it"
            if self.failed_above is not None
            else "the search's highest rate held it"
        )
        return (
            f"capacity at p99 {self.budget_ms:g} ms: {best.request_rate:g} requests/s "
            f"({best.samples_per_s:,.0f} samples/s; p50 {best.p50_ms:.2f} ms, p99 {best.p99_ms:.2f} ms, "
            f"p99.9 {best.p999_ms:.2f} ms); {edge} (resolution {self.resolution:.0%})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "budget_ms": self.budget_ms,
            "resolution": self.resolution,
            "statement": self.statement(),
            "best": None if self.best is None else self.best.as_dict(),
            "failed_above": None if self.failed_above is None else self.failed_above.as_dict(),
            "steps": [step.as_dict() for step in self.steps],
            "verdicts": self.verdicts,
        }


def check_search(budget_ms: float, start: float, resolution: float, max_rate: float) -> None:
    """Raises ConfigError unless the budget, the start rate and the resolution are > 0 and the
    highest rate at least the start."""
    if not (budget_ms > 0 and start > 0 and resolution > 0 and max_rate >= start):
        raise ConfigError(
            f"--p99-budget-ms, --start-rate and --resolution must be > 0 and --max-rate >= --start-rate, "
            f"got {budget_ms:g}, {start:g}, {resolution:g} and {max_rate:g}"
        )


def search_capacity(
    measure: Callable[[float], RateStep],
    budget_ms: float,
    start: float = START_RATE,
    resolution: float = RESOLUTION,
    max_rate: float = MAX_RATE,
) -> Capacity:
    """The highest rate whose step holds ``budget_ms``, by doubling from ``start`` and then
    halving the interval (geometric means) until the failing rate is within ``resolution`` of the
    passing one; ``measure(rate)`` runs one step.

    Raises:
        ConfigError: a budget, start, resolution or highest rate that is not > 0 (or a start above
            the highest rate).
    """
    check_search(budget_ms, start, resolution, max_rate)
    result = Capacity(budget_ms, resolution)

    def step(rate: float) -> bool:
        measured = measure(rate)
        verdict = holds(measured, budget_ms)
        result.steps.append(measured)
        result.verdicts.append(verdict)
        if verdict:
            if result.failed_above is None or rate < result.failed_above.request_rate:
                result.failed_above = measured
            return False
        if result.best is None or rate > result.best.request_rate:
            result.best = measured
        return True

    rate = start
    if step(rate):
        while rate < max_rate:
            rate = min(rate * 2.0, max_rate)
            if not step(rate):
                break
        else:
            return result
    else:
        # Over the budget from the start: halve down to a rate that holds, or to the lowest.
        while result.best is None and rate / 2.0 >= start / LOWEST_SHARE:
            rate /= 2.0
            step(rate)
        if result.failed_above is not None:
            rate = result.failed_above.request_rate
    if result.best is None:
        return result
    low, high = result.best.request_rate, rate
    while high > low * (1.0 + resolution):
        middle = round(math.sqrt(low * high), 1)
        if not low < middle < high:
            break
        if step(middle):
            low = middle
        else:
            high = middle
    return result


def step_measurer(
    target: Target, model: str, batch_size: int, payload: Path, raw: Path, load: RateLoad, budget_ms: float
) -> Callable[[float], RateStep]:
    """``measure(rate)`` for :func:`search_capacity`: one :func:`~loadtest.sweeps.rates.rate_step`
    of ``load`` (its files in ``raw/r<rate>``), printed in one line with its verdict."""

    def measure(rate: float) -> RateStep:
        step = rate_step(target, model, batch_size, rate, payload, raw / f"r{rate:g}", load)
        print(f"{step_line(step)}: {holds(step, budget_ms) or 'holds the budget'}", flush=True)
        return step

    return measure


def write_capacity_report(
    capacity: Capacity, title: str, record: dict[str, Any], settings: dict[str, str], out: Path
) -> dict[str, Path]:
    """``capacity.json``, ``capacity.md`` and ``capacity.png`` in ``out``."""
    lines = [f"# {title}", "", f"- command: `{record.get('command', '')}`"]
    lines += [f"- {key}: {value}" for key, value in settings.items()]
    lines += [
        f"- search: double from the first rate while the p99 holds, then halve the interval until the "
        f"failing rate is within {capacity.resolution:.0%} of the passing one; each rate measured once",
        f"- flag: {flag_rule()}",
        "",
        f"**{capacity.statement()}**",
        "",
    ]
    rows = []
    for measured, verdict in zip(capacity.steps, capacity.verdicts, strict=True):
        server = measured.server
        rows.append(
            [
                f"{measured.request_rate:g}", measured.achieved_rate, measured.p50_ms, measured.p99_ms,
                measured.p999_ms, server.queue_ms if server else math.nan,
                server.compute_infer_ms if server else math.nan, verdict or "holds",
            ]
        )  # fmt: skip
    header = ["rate asked /s", "rate sent /s", "p50 ms", "p99 ms", "p99.9 ms", "server queue ms"]
    lines += table([*header, "server compute ms", "verdict"], rows, "rrrrrrrl")
    lines += ["", "![p99 of each rate tried against the budget](capacity.png)", ""]
    ordered = sorted(capacity.steps, key=lambda s: s.request_rate)
    rates = [s.request_rate for s in ordered]
    series = [
        Series("p50", rates, [s.p50_ms for s in ordered], "o-"),
        Series("p99", rates, [s.p99_ms for s in ordered], "s-"),
        Series("p99.9", rates, [s.p999_ms for s in ordered], "^-"),
    ]
    if rates:
        series.append(
            Series(f"budget {capacity.budget_ms:g} ms", [rates[0], rates[-1]], [capacity.budget_ms] * 2, "--")
        )
    panel = Panel(
        "Latency from the schedule at each rate tried", "offered rate (requests/s)", "ms", series, ylog=True
    )
    document = {**record, "settings": settings, **capacity.to_json()}
    return {
        "json": write_json(out / "capacity.json", document),
        "markdown": write_markdown(out / "capacity.md", lines),
        "png": plot(out / "capacity.png", title, [panel]),
    }


def capacity_run(
    model: str,
    protocol: str,
    url: str | None,
    repository: Path | None,
    batch_size: int,
    budget_ms: float,
    out: Path,
    title: str,
    command: str,
    *,
    start: float = START_RATE,
    resolution: float = RESOLUTION,
    max_rate: float = MAX_RATE,
    load: RateLoad = DEFAULT_LOAD,
    data: Path | None = None,
) -> tuple[Capacity, dict[str, Path]]:
    """The capacity of ``model`` at a p99 of ``budget_ms`` (Poisson arrivals: ``load.arrival`` must
    say so), against a running server (``url``) or a local tritonserver serving ``repository``;
    the report in ``out``.

    Raises:
        ConfigError: see :func:`search_capacity`; no server to load.
    """
    from loadtest.sweeps.runs import models_payload, wire_settings

    if load.arrival != "poisson":
        raise ConfigError(f"the capacity is searched with Poisson arrivals, not {load.arrival!r}")
    urls = [url] if url else []
    check_endpoints([protocol], urls, repository)
    check_search(budget_ms, start, resolution, max_rate)
    raw = out / "raw"
    out.mkdir(parents=True, exist_ok=True)
    record = RunRecord.begin(command)
    payload = models_payload(raw, data, repository, urls, [protocol], [model])
    with contextlib.ExitStack() as stack:
        ((_, endpoint),) = open_endpoints(stack, [model], [protocol], urls, repository, raw, load.client_cpus)
        target = Target(endpoint, protocol, "triton", engine="driver")
        woke = wake_ups(load.client_cpus)
        measure = step_measurer(target, model, batch_size, payload, raw, load, budget_ms)
        capacity = search_capacity(measure, budget_ms, start, resolution, max_rate)
    settings = {
        "model": f"{model} over {protocol}, batch {batch_size}",
        "per step": f"{load.per_step()}, Poisson arrivals",
        "request rows": str(data or "synthetic data (criteo.synth)"),
        "timer": woke.line(),
        **wire_settings(payload, [model], [protocol], [batch_size]),
    }
    paths = write_capacity_report(capacity, title, record.finish().to_json(), settings, out)
    return capacity, paths
