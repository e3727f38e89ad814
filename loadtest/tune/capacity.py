"""``python -m loadtest tune --objective capacity``: the serving config with the highest Poisson
rate whose p99 holds a budget, the figure a recommender's SLA is written in.

The closed-loop tune (:mod:`loadtest.tune.search`) ranks configs by the samples/s a fixed
number of users gets within the budget. Here each server config of the space
(:mod:`loadtest.tune.space`) is loaded into the same scratch server (:class:`ServedProbe`) and,
per client batch size, the capacity search of :mod:`loadtest.sweeps.capacity` runs on it: open-loop
Poisson steps whose latency counts from each request's scheduled time, doubling and then halving
the interval to ``resolution``. A config's figure is its best rate times the batch size, in
samples/s.

Pruning: the first config (the shipped default) is searched in full and becomes the incumbent.
Every later (config, batch size) is first measured at the rate that would equal the incumbent's
samples/s; a config that does not hold the budget there cannot beat it and is dropped after that
one step (it is *dominated*). One that holds is searched upward from there.

Confirmation: each rate was measured once, and a rate near the edge lands on either side from run
to run. The ``finalists`` best configs and the default are measured again at their rates, side by
side, in ``rounds`` rounds of alternating order; a config holds where its median p99 is within the
budget and no request of any round failed. The winner is the one with the most samples/s among
those that held.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from bundle.errors import ConfigError
from bundle.records import RunRecord
from bundle.snippets import section_end, section_start
from loadtest.engine.payload import PayloadPool
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.capacity import Capacity, check_search, holds, search_capacity
from loadtest.sweeps.rates import RateLoad, RateStep
from loadtest.tune.search import TuneOptions, plan, request_pools
from loadtest.tune.space import ServerPoint, candidate_config, config_diff, config_text, model_name

#: The report's named section (:mod:`bundle.snippets`): the winner against the default.
SECTION_WINNER = "capacity-winner"
#: A config over the budget side by side is measured again at this share of its rate.
STEP_DOWN = 0.8


@dataclass(frozen=True)
class CapacityPolicy:
    """How the capacity tune measures.

    Args:
        budget_ms: the p99 budget.
        load: each rate step's load (Poisson arrivals).
        start_rate: the first search's first rate, requests/s.
        resolution: each search's stopping width (a share).
        max_rate: the highest rate tried, requests/s.
        rounds: rounds of each side-by-side stage.
        finalists: the best configs confirmed beside the default.
        step_downs: stages after the first, in which each config over the budget is measured
            again at :data:`STEP_DOWN` of its rate, beside every other.
    """

    budget_ms: float
    load: RateLoad = field(default_factory=RateLoad)
    start_rate: float = 50.0
    resolution: float = 0.05
    max_rate: float = 100_000.0
    rounds: int = 3
    finalists: int = 3
    step_downs: int = 2

    def __post_init__(self) -> None:
        check_search(self.budget_ms, self.start_rate, self.resolution, self.max_rate)
        if self.load.arrival != "poisson":
            raise ConfigError(f"the capacity is searched with Poisson arrivals, not {self.load.arrival!r}")
        if self.rounds < 1 or self.finalists < 1 or self.step_downs < 0:
            raise ConfigError(
                f"rounds and finalists must be >= 1 and step_downs >= 0, got {self.rounds}, "
                f"{self.finalists} and {self.step_downs}"
            )


@dataclass
class Found:
    """One (server config, batch size)'s search.

    Attributes:
        server: the config.
        batch_size: rows per request.
        capacity: the search (its steps and its best rate).
        dominated_at: the rate (equal to the incumbent's samples/s) this config did not hold, so
            it was not searched further (None: searched).
    """

    server: ServerPoint
    batch_size: int
    capacity: Capacity
    dominated_at: float | None = None

    @property
    def rate(self) -> float:
        """The best rate that held, requests/s (0: none)."""
        return self.capacity.best.request_rate if self.capacity.best is not None else 0.0

    @property
    def samples_per_s(self) -> float:
        """That rate's samples/s asked (the rate times the batch size)."""
        return self.rate * self.batch_size

    @property
    def label(self) -> str:
        return f"{self.server.label} B={self.batch_size}"

    def outcome(self) -> str:
        """How its search ended, in words."""
        if self.dominated_at is not None:
            return f"dominated: did not hold {self.dominated_at:g}/s, the incumbent's samples/s"
        return self.capacity.statement()

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server.as_dict(),
            "server_label": self.server.label,
            "batch_size": self.batch_size,
            "rate": self.rate,
            "samples_per_s": self.samples_per_s,
            "dominated_at": self.dominated_at,
            "outcome": self.outcome(),
            "capacity": self.capacity.to_json(),
        }


class RateProbe(Protocol):
    """What the capacity tune needs of a probe (:class:`~loadtest.tune.search.ServedProbe`)."""

    def load(self, point: ServerPoint) -> None:
        """Serve ``point``."""

    def rate_step(self, batch_size: int, rate: float, load: RateLoad) -> RateStep:
        """One open-loop step at ``rate`` requests/s of ``batch_size`` rows on the loaded point."""


def search_capacities(
    probe: RateProbe,
    points: Sequence[ServerPoint],
    batch_sizes: Sequence[int],
    policy: CapacityPolicy,
    on_step: Callable[[ServerPoint, int, RateStep, str], None] = lambda *_: None,
) -> list[Found]:
    """Every (config, batch size) searched or dropped as dominated, in the order measured; the
    first config sets the incumbent (see the module)."""
    found: list[Found] = []
    incumbent = 0.0
    for point in points:
        probe.load(point)
        for batch_size in batch_sizes:
            measure = _once_per_rate(probe, point, batch_size, policy, on_step)

            if incumbent <= 0:
                capacity = search_capacity(
                    measure, policy.budget_ms, policy.start_rate, policy.resolution, policy.max_rate
                )
                found.append(Found(point, batch_size, capacity))
            else:
                even = round(incumbent / batch_size, 1)
                if even > policy.max_rate:
                    untried = Capacity(policy.budget_ms, policy.resolution)
                    found.append(Found(point, batch_size, untried, even))
                    continue
                first = measure(even)
                if verdict := holds(first, policy.budget_ms):
                    capacity = Capacity(policy.budget_ms, policy.resolution, [first], [verdict])
                    found.append(Found(point, batch_size, capacity, even))
                    continue
                capacity = search_capacity(
                    measure, policy.budget_ms, even, policy.resolution, max(policy.max_rate, even)
                )
                found.append(Found(point, batch_size, capacity))
            incumbent = max(incumbent, found[-1].samples_per_s)
    return found


def _once_per_rate(
    probe: RateProbe,
    point: ServerPoint,
    batch_size: int,
    policy: CapacityPolicy,
    on_step: Callable[[ServerPoint, int, RateStep, str], None],
) -> Callable[[float], RateStep]:
    """The search's step function: each rate measured once, what it gave kept."""
    measured: dict[float, RateStep] = {}

    def measure(rate: float) -> RateStep:
        if rate not in measured:
            measured[rate] = probe.rate_step(batch_size, rate, policy.load)
            on_step(point, batch_size, measured[rate], holds(measured[rate], policy.budget_ms))
        return measured[rate]

    return measure


@dataclass
class Confirmed:
    """A config's side-by-side stages.

    Attributes:
        found: its search.
        rate: the rate of its last stage (the search's, or lower after a step down).
        rounds: each round's step of that stage.
        tries: each stage's rate, median p99 and why it did not hold ("" where it did).
    """

    found: Found
    rate: float = 0.0
    rounds: list[RateStep] = field(default_factory=list)
    tries: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rate = self.rate or self.found.rate

    @property
    def offered_samples_per_s(self) -> float:
        """The last stage's rate times the batch size."""
        return self.rate * self.found.batch_size

    @property
    def p99_ms(self) -> float:
        return statistics.median(step.p99_ms for step in self.rounds) if self.rounds else float("nan")

    @property
    def p50_ms(self) -> float:
        return statistics.median(step.p50_ms for step in self.rounds) if self.rounds else float("nan")

    @property
    def samples_per_s(self) -> float:
        """The samples/s answered, median of the rounds."""
        return statistics.median(step.samples_per_s for step in self.rounds) if self.rounds else 0.0

    def why_not(self, budget_ms: float) -> str:
        """Why it did not hold side by side ("" where it did)."""
        failed = sum(step.errors + step.unfinished for step in self.rounds)
        if failed:
            return f"{failed} requests failed or unfinished over the rounds"
        if not self.p99_ms <= budget_ms:
            return f"median p99 {self.p99_ms:.2f} ms over the budget"
        return ""

    def as_dict(self, budget_ms: float) -> dict[str, Any]:
        return {
            **self.found.as_dict(),
            "search_rate": self.found.rate,
            "rate": self.rate,
            "samples_per_s": self.offered_samples_per_s,
            "tries": self.tries,
            "confirmed_p50_ms": self.p50_ms,
            "confirmed_p99_ms": self.p99_ms,
            "confirmed_samples_per_s": self.samples_per_s,
            "held": not self.why_not(budget_ms),
            "why_not": self.why_not(budget_ms),
            "rounds": [step.as_dict() for step in self.rounds],
        }


def confirm_capacities(
    probe: RateProbe,
    finalists: Sequence[Found],
    policy: CapacityPolicy,
    on_step: Callable[[ServerPoint, int, RateStep, str], None] = lambda *_: None,
) -> list[Confirmed]:
    """Each of ``finalists`` (those with a rate) at its rate, ``policy.rounds`` rounds of
    alternating order, a new arrival seed each round; then, while one is over the budget and
    ``policy.step_downs`` allow, another stage of as many rounds, every config beside the others,
    each over the budget at :data:`STEP_DOWN` of its last rate."""
    confirmed = [Confirmed(found) for found in finalists if found.rate > 0]
    for stage in range(policy.step_downs + 1):
        for entry in confirmed:
            entry.rounds = []
        for index in range(policy.rounds):
            order = confirmed if index % 2 == 0 else confirmed[::-1]
            load = replace(policy.load, seed=policy.load.seed + stage * policy.rounds + index + 1)
            for entry in order:
                probe.load(entry.found.server)
                step = probe.rate_step(entry.found.batch_size, entry.rate, load)
                entry.rounds.append(step)
                on_step(entry.found.server, entry.found.batch_size, step, holds(step, policy.budget_ms))
        over = []
        for entry in confirmed:
            why = entry.why_not(policy.budget_ms)
            entry.tries.append({"rate": entry.rate, "p99_ms": entry.p99_ms, "why_not": why})
            if why:
                over.append(entry)
        if not over or stage == policy.step_downs:
            break
        for entry in over:
            entry.rate = round(entry.rate * STEP_DOWN, 1)
    return confirmed


def finalists_of(found: Sequence[Found], default: ServerPoint, count: int) -> list[Found]:
    """The ``count`` configs with the most samples/s (each config once, at its best batch size),
    and the default's best, the default first."""
    best: dict[ServerPoint, Found] = {}
    for entry in found:
        known = best.get(entry.server)
        if entry.rate > 0 and (known is None or entry.samples_per_s > known.samples_per_s):
            best[entry.server] = entry
    ranked = sorted((f for s, f in best.items() if s != default), key=lambda f: -f.samples_per_s)[:count]
    return ([best[default]] if default in best else []) + ranked


def run_capacity_tune(
    options: TuneOptions,
    policy: CapacityPolicy,
    probe_of: Callable[[dict[int, PayloadPool]], AbstractContextManager[RateProbe]],
    command: str,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Search, confirm, and return the JSON-ready result: the space, the default and the checks
    are the closed-loop tune's (:func:`~loadtest.tune.search.plan`); ``probe_of(pools)`` opens the
    probe on the request pools by batch size.

    Raises:
        ConfigError: see :func:`~loadtest.tune.search.plan`.
    """
    space, shipped, bases, points = plan(options)
    record = RunRecord.begin(command)
    pools = request_pools(space.batch_sizes, options.data)

    def on_step(point: ServerPoint, batch_size: int, step: RateStep, verdict: str) -> None:
        progress(
            f"{point.label} B={batch_size} {step.request_rate:g}/s: p99 {step.p99_ms:.2f} ms, "
            f"{verdict or 'holds the budget'}"
        )

    with probe_of(pools) as probe:
        found = search_capacities(probe, points, space.batch_sizes, policy, on_step)
        finalists = finalists_of(found, shipped, policy.finalists)
        confirmed = confirm_capacities(probe, finalists, policy, on_step)
    held = [c for c in confirmed if not c.why_not(policy.budget_ms)]
    winner = max(held, key=lambda c: c.offered_samples_per_s, default=None)
    default = next((c for c in confirmed if c.found.server == shipped), None)
    default_config = candidate_config(bases[shipped.variant], shipped)

    def described(entry: Confirmed | None) -> dict[str, Any] | None:
        if entry is None:
            return None
        point = entry.found.server
        config = candidate_config(bases[point.variant], point)
        return {
            **entry.as_dict(policy.budget_ms),
            "model": model_name(space.family, point.variant),
            "config": config_text(config),
            "diff": config_diff(default_config, config),
        }

    return {
        **record.finish().to_json(),
        "objective": "capacity",
        "family": space.family,
        "budget_ms": policy.budget_ms,
        "policy": {
            "start_rate": policy.start_rate,
            "resolution": policy.resolution,
            "max_rate": policy.max_rate,
            "rounds": policy.rounds,
            "finalists": policy.finalists,
            "step_downs": policy.step_downs,
            "per_step": f"{policy.load.per_step()}, Poisson arrivals",
        },
        "space": {"server_points": len(points), "batch_sizes": list(space.batch_sizes)},
        "default": {"server": shipped.as_dict(), "label": shipped.label, "confirmed": described(default)},
        "winner": described(winner),
        "finalists": [described(c) for c in confirmed],
        "searched": [f.as_dict() for f in found],
        "steps_measured": sum(len(f.capacity.steps) for f in found) + sum(len(c.rounds) for c in confirmed),
    }


def report_lines(document: dict[str, Any]) -> list[str]:
    """``capacity.md``: the winner against the default, the finalists side by side, every search."""
    budget, policy = document["budget_ms"], document["policy"]
    winner, default = document["winner"], document["default"]["confirmed"]
    lines = [f"# Tune by capacity: {document['family']}, p99 {budget:g} ms", ""]
    lines += [
        *RunRecord.from_json(document).lines(),
        f"- per step: {policy['per_step']}; search from {policy['start_rate']:g}/s, "
        f"resolution {policy['resolution']:.0%}; side by side: {policy['rounds']} rounds a stage, a config "
        f"over the budget again at {STEP_DOWN:g} of its rate, {policy.get('step_downs', 0)} times at most",
        f"- measured: {document['space']['server_points']} server configs x "
        f"{len(document['space']['batch_sizes'])} batch sizes, {document['steps_measured']} rate steps",
        "",
        section_start(SECTION_WINNER),
    ]
    if winner is None:
        lines.append(f"No configuration held a p99 of {budget:g} ms side by side.")
    else:
        lines.append(
            f"Winner: **{winner['server_label']}** at B={winner['batch_size']}: {winner['rate']:g} "
            f"requests/s, {winner['samples_per_s']:,.0f} samples/s, "
            f"median p99 {winner['confirmed_p99_ms']:.2f} ms"
            + (
                f" ({winner['samples_per_s'] / default['samples_per_s']:.2f}x the default's capacity)."
                if default is not None and default["samples_per_s"] > 0
                else "."
            )
        )
    default_label = document["default"]["label"]
    lines += ["", *_finalists_table(document["finalists"], default_label), section_end(SECTION_WINNER), ""]
    if winner is not None and winner["diff"]:
        diff = winner["diff"].rstrip()
        lines += ["The winner's config.pbtxt against the default:", "", "```diff", diff, "```", ""]
    lines += ["## Every search", ""]
    rows = [
        [f["server_label"], f["batch_size"], f"{f['rate']:g}", f"{f['samples_per_s']:,.0f}",
         len(f["capacity"]["steps"]), f["outcome"]]
        for f in document["searched"]
    ]  # fmt: skip
    header = ["server config", "batch", "capacity requests/s", "samples/s", "steps", "outcome"]
    lines += table(header, rows, "lrrrrl")
    lines += ["", "![p99 against the offered samples/s](capacity.png)"]
    return lines


def _finalists_table(finalists: Sequence[dict[str, Any] | None], default_label: str) -> list[str]:
    rows = [
        [f["server_label"] + (" (default)" if f["server_label"] == default_label else ""), f["batch_size"],
         " → ".join(f"{t['rate']:g}" for t in f.get("tries") or [{"rate": f["rate"]}]),
         f"{f['samples_per_s']:,.0f}", f"{f['confirmed_p50_ms']:.2f}", f"{f['confirmed_p99_ms']:.2f}",
         "yes" if f["held"] else f["why_not"]]
        for f in finalists
        if f is not None
    ]  # fmt: skip
    header = ["server config", "batch", "rates tried /s", "samples/s", "p50 ms (median)", "p99 ms (median)"]
    header.append("held")
    return table(header, rows, "lrrrrrl")


def plot_capacity(path: Path, document: dict[str, Any]) -> Path:
    """Every searched config's steps: p99 against the samples/s offered, with the budget."""
    series = []
    top = 0.0
    for entry in document["searched"]:
        steps = sorted(entry["capacity"]["steps"], key=lambda step: step["request_rate"])
        if len(steps) < 2:
            continue
        x = [step["request_rate"] * entry["batch_size"] for step in steps]
        label = f"{entry['server_label']} B={entry['batch_size']}"
        series.append(Series(label, x, [step["p99_ms"] for step in steps]))
        top = max(top, *x)
    budget = document["budget_ms"]
    series.append(Series(f"budget {budget:g} ms", [0.0, top or 1.0], [budget, budget], style="--"))
    panel = Panel("p99 from the scheduled time", "samples/s offered (Poisson)", "p99 ms", series, ylog=True)
    return plot(path, f"Tune by capacity: {document['family']}", [panel])


def write_capacity_tune(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write ``capacity.json``, ``capacity.md`` and ``capacity.png`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return {
        "json": write_json(out / "capacity.json", document),
        "png": plot_capacity(out / "capacity.png", document),
        "markdown": write_markdown(out / "capacity.md", report_lines(document)),
    }
