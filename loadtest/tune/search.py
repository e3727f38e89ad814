"""``python -m loadtest tune``: the fastest serving configuration whose p99 stays under a budget.

It searches, through the real local tritonserver, the variant (FP32 / FP16 /
INT8), instances, ONNX Runtime threads, the batcher's max queue delay and
preferred batch sizes (:mod:`loadtest.tune.space`), and per loaded config the
client's batch size and concurrency. Every step runs on the bundle's one
closed-loop driver (:class:`loadtest.engine.driver.Driver`, windows of
:meth:`~loadtest.engine.driver.Driver.measure`).

The search, and why it beats the grid:

1. Server configs are loaded one at a time into one tritonserver under
   explicit model control, in a scratch repository whose version folders
   link to the user's (a reload takes seconds; a restart, tens). The default
   (what the cpu profile exports) goes first, so an incumbent exists early.
2. Every config after the first is first measured at the incumbent's client load; when its
   whole throughput interval there lies below the incumbent's, it is dominated and dropped
   (configs rank alike at neighbouring loads; a config that loses where the incumbent is best
   would need another load to win, and the ladder of the incumbent's own config already
   explored those). Otherwise, per batch size, the concurrency is a ladder, climbed from the
   lowest level. Latency grows with requests in flight in a closed loop, so
   once a step is over the budget every higher one is too: the ladder stops.
   It also stops once one more level adds less than ``min_gain`` throughput
   (saturated: by Little's law the extra requests only queue). When the
   lowest level of a batch size is over the budget, larger batches are
   skipped (a larger batch is never faster to answer).
3. Each step measures windows until its verdict is decided
   (:mod:`loadtest.tune.stats`): after ``min_windows``, it stops when the p99
   interval lies wholly above the budget (infeasible), when its throughput
   interval lies wholly below the incumbent's lower bound (dominated: it
   cannot be the winner, whatever its p99), or when its p99 interval lies
   wholly under the budget less a margin (``p99_margin``) and its throughput
   interval is narrower than ``precision``. Only undecided steps run
   ``max_windows``; a feasible one whose p99 interval reaches within the
   margin of the budget ends as ``near budget``. The margin is there because
   the interval only covers the noise inside the step's own seconds, not the
   drift of a shared machine between the search and the side-by-side rounds:
   steps decided well under the budget in the search came near it or crossed it
   side by side (the search's p99 of each finalist beside its side-by-side p99:
   benchmarks/tune/dlrm-50ms/report.md). Steps far
   from the budget still stop after ``min_windows``, where the saving is.
4. The best feasible step (its p99 within the budget; its interval may reach
   over it) of each of the ``finalists`` fastest configs and of the default
   are then measured again side by side, in alternating
   rounds (:func:`confirm`): the search's own figures were taken minutes
   apart on a shared machine, and a step near the budget can cross it. A
   config whose median p99 there is over the budget (or that failed
   requests) steps its client load down (:func:`step_down`: the next lower
   concurrency of the space, then the next lower batch size) and is measured
   again, in new rounds beside every config still in, at most ``step_downs``
   times; the default follows the same rule, so winner and default are
   compared at the same budget, in the same rounds. The winner is the
   fastest config whose median p99 holds the budget at the load it ended at
   (:func:`pick_winner`); none may.

Measured time is accounted window by window (warm-up included). The brute
force it is compared with measures every grid point (server x client) for
``2 x warmup_s + max_windows x window_s`` (a steady step's warm-up and every
window), what the search spends at most on one steady step: ``grid points x
that``. ``--brute-force`` runs exactly that search (no early stop, no
pruning), to check that both find the same winner.
"""

from __future__ import annotations

import logging
import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import Progress

from bundle.errors import ConfigError
from bundle.records import RunRecord
from bundle.repository import CONFIG_NAME, MODEL_FILE, read_config, version_dir, write_config
from bundle.schema import raw_model_name
from loadtest.engine.driver import Driver
from loadtest.engine.latency import Tally, merged_tallies
from loadtest.engine.payload import MAX_POOL_ROWS, PayloadPool, build_pool
from loadtest.engine.served import triton_requests
from loadtest.sweeps.rates import RateLoad, RateStep, rate_step
from loadtest.sweeps.steps import Target
from loadtest.tune.space import (
    ClientPoint,
    ServerPoint,
    Space,
    base_configs,
    candidate_config,
    config_diff,
    config_text,
    default_point,
    model_name,
)
from loadtest.tune.stats import StepEstimate, estimate

logger = logging.getLogger(__name__)
console = Console(stderr=True, soft_wrap=True)

#: Measures one window of ``seconds`` of the load that is running; returns its tally.
Measure = Callable[[float], Tally]


class Probe(Protocol):
    """Where steps are measured: loads a server point, then runs client loads against it."""

    def load(self, point: ServerPoint) -> None:
        """Serve ``point`` (write its config, (re)load its model)."""

    def run(self, client: ClientPoint) -> AbstractContextManager[Measure]:
        """Start ``client``'s load on the loaded point; yields a window function; stops on exit."""


@dataclass(frozen=True)
class Policy:
    """How each step is measured and when the search stops early.

    Args:
        budget_ms: the p99 latency budget.
        window_s: length of one measurement window.
        warmup_s: windows of this length run and thrown away at the start of each step, until
            two in a row agree within ``settle`` (at most ``max_warmups``): a step's first requests
            at a new batch size are slow, and a verdict is never taken on them.
        settle: the relative difference of two warm-up windows' rates that ends the warm-up.
        max_warmups: warm-up windows at most.
        min_requests: answered requests a step needs before it may be ruled over the budget: a
            p99 of fewer is one or two slow requests, so a noisy step is measured longer instead.
        min_windows: windows before a step may stop (3: a t interval with 2 degrees of freedom).
        max_windows: windows of an undecided step; every step of a brute force.
        precision: a feasible step stops once its throughput interval's half width is below this
            fraction of its mean.
        min_gain: a concurrency level must add this fraction of throughput, or the ladder stops.
        adaptive: False: the brute force (every point ``max_windows``, nothing pruned).
        p99_margin: a step stops as decided only when its p99 interval's upper bound is at most
            ``(1 - p99_margin) x budget_ms``; closer, it runs ``max_windows`` (see the module doc).
        confirm_rounds: rounds of the finalists' re-measurement (alternating order), per stage.
        confirm_windows: windows per step of that re-measurement.
        finalists: the best configs of the search re-measured beside the default; the winner is
            the fastest of them whose median p99 holds the budget there.
        step_downs: side-by-side stages after the first, each of ``confirm_rounds`` rounds, in
            which configs over the budget are measured again one load lower (0: never step down).
    """

    budget_ms: float
    window_s: float = 0.5
    warmup_s: float = 0.5
    settle: float = 0.10
    max_warmups: int = 6
    min_requests: int = 300
    min_windows: int = 3
    max_windows: int = 8
    precision: float = 0.10
    min_gain: float = 0.05
    adaptive: bool = True
    p99_margin: float = 0.20
    confirm_rounds: int = 3
    confirm_windows: int = 6
    finalists: int = 3
    step_downs: int = 2

    def __post_init__(self) -> None:
        if not self.budget_ms > 0:
            raise ConfigError(f"the p99 budget must be > 0 ms, got {self.budget_ms}")
        if not self.window_s > 0 or self.warmup_s < 0:
            raise ConfigError("window_s must be > 0 and warmup_s >= 0")
        if not 0 < self.settle < 1 or self.max_warmups < 1 or self.min_requests < 0:
            raise ConfigError("settle must be in (0, 1), max_warmups >= 1 and min_requests >= 0")
        if not 2 <= self.min_windows <= self.max_windows:
            raise ConfigError(
                f"need 2 <= min_windows <= max_windows, got {self.min_windows}, {self.max_windows}"
            )
        if not 0 < self.precision < 1 or self.min_gain < 0:
            raise ConfigError("precision must be in (0, 1) and min_gain >= 0")
        if not 0 <= self.p99_margin < 1:
            raise ConfigError(f"p99_margin must be in [0, 1), got {self.p99_margin}")
        if self.confirm_rounds < 1 or self.finalists < 1:
            raise ConfigError("confirm_rounds and finalists must be >= 1")
        if self.confirm_windows < 2:
            # A side-by-side step is a fixed-length step of this policy, which needs min_windows >= 2.
            raise ConfigError(f"confirm_windows must be >= 2, got {self.confirm_windows}")
        if self.step_downs < 0:
            raise ConfigError(f"step_downs must be >= 0, got {self.step_downs}")

    @property
    def point_seconds(self) -> float:
        """What the brute force spends on a grid point whose rate is steady from the start: two
        warm-up windows (the fewest that show it settled) plus ``max_windows`` windows."""
        return (2 * self.warmup_s if self.warmup_s > 0 else 0.0) + self.max_windows * self.window_s

    @property
    def decided_below_ms(self) -> float:
        """The highest p99 upper bound at which a step may stop early as decided."""
        return self.budget_ms * (1.0 - self.p99_margin)


@dataclass(frozen=True)
class Trial:
    """One measured step: a server point under one client load.

    Attributes:
        server: the server point measured.
        client: the client load it was measured under.
        samples_per_s: mean samples/s of the windows.
        rate_low: the low end of the samples/s' 95 % interval.
        rate_high: the high end of the samples/s' 95 % interval.
        p50_ms: median latency over every window.
        p99_ms: p99 latency over every window.
        p99_low: the low end of the p99's 95 % interval.
        p99_high: the high end of the p99's 95 % interval.
        windows: windows measured (warm-up excluded).
        requests: answered requests over the windows.
        errors: failed requests over the windows.
        measured_s: seconds of load, warm-up included.
        client_bound: the load generator, not the server, limited at least half of its windows
            (:mod:`loadtest.engine.client_cpu`): never a winner, never the server's best.
        client_cpu_us: the load generator's CPU per request (median of the windows).
        client_serial_us: its serial client time per request, from an answer's arrival to the
            next request's send (median of the windows).
        bound_reason: why it was client-bound, in words (empty: it was not).
        first_error: the most common error of its failed requests (None without errors).
        stop: why the step ended: ``over budget``, ``decided``, ``dominated``, ``near budget`` (every
            window: feasible, but its p99 interval reaches within ``p99_margin`` of the budget),
            ``max windows`` (every window: undecided, or a brute force), ``errors``.
        budget_ms: the budget it was judged against.
    """

    server: ServerPoint
    client: ClientPoint
    samples_per_s: float
    rate_low: float
    rate_high: float
    p50_ms: float
    p99_ms: float
    p99_low: float
    p99_high: float
    windows: int
    requests: int
    errors: int
    measured_s: float
    stop: str
    budget_ms: float
    client_bound: bool = False
    client_cpu_us: float = math.nan
    client_serial_us: float = math.nan
    bound_reason: str = ""
    first_error: str | None = None

    @property
    def feasible(self) -> bool:
        """Answered, without errors, with its p99 within the budget."""
        return self.requests > 0 and self.errors == 0 and self.p99_ms <= self.budget_ms

    @property
    def certified(self) -> bool:
        """Feasible with the whole p99 interval within the budget: what finalists are drawn from."""
        return self.feasible and self.p99_high <= self.budget_ms

    def as_dict(self) -> dict[str, Any]:
        values = asdict(self)
        values["server"] = self.server.as_dict()
        values["server_label"] = self.server.label
        values["feasible"] = self.feasible
        return values


def _verdict(step: StepEstimate, policy: Policy, incumbent_low: float) -> str | None:
    """Why the step may stop now, or None to measure on (see the module doc, point 3)."""
    if step.errors:
        return "errors"
    if step.p99.low > policy.budget_ms and step.requests >= policy.min_requests:
        return "over budget"
    if step.rate.high < incumbent_low:
        # Slower than the incumbent whatever its p99: more windows cannot make it the winner.
        return "dominated"
    if step.p99.high <= policy.decided_below_ms and step.rate.relative_half_width <= policy.precision:
        return "decided"
    return None


def _near_budget(step: StepEstimate, policy: Policy) -> bool:
    """Answered within the budget, but with a p99 interval that reaches the margin below it."""
    return not step.errors and step.p99.value <= policy.budget_ms and step.p99.high > policy.decided_below_ms


def _warm_up(measure: Measure, policy: Policy) -> float:
    """Run warm-up windows until two in a row agree within ``policy.settle`` (at most
    ``policy.max_warmups``); the seconds they took."""
    if policy.warmup_s <= 0:
        return 0.0
    seconds, previous = 0.0, math.nan
    for _ in range(policy.max_warmups):
        window = measure(policy.warmup_s)
        seconds += window.seconds
        rate = window.samples_per_s
        if rate > 0 and abs(rate - previous) <= policy.settle * rate:
            break
        previous = rate
    return seconds


def run_trial(
    measure: Measure, server: ServerPoint, client: ClientPoint, policy: Policy, incumbent_low: float = 0.0
) -> Trial:
    """Measure one step: warm-up windows until its rate settles, then windows until decided
    (adaptive) or ``max_windows``."""
    measured = _warm_up(measure, policy)
    windows: list[Tally] = []
    stop = "max windows"
    while len(windows) < policy.max_windows:
        window = measure(policy.window_s)
        windows.append(window)
        measured += window.seconds
        if policy.adaptive and len(windows) >= policy.min_windows:
            verdict = _verdict(estimate(windows), policy, incumbent_low)
            if verdict is not None:
                stop = verdict
                break
    step = estimate(windows)
    if stop == "max windows" and policy.adaptive and _near_budget(step, policy):
        stop = "near budget"
    clients = [w.client for w in windows if w.client is not None]
    # The client's CPU or its serial time per request limited at least half of the windows: such
    # a step's rate is the client's, and it never wins on it.
    bound = bool(clients) and 2 * sum(c.bound for c in clients) >= len(clients)
    return Trial(
        server=server,
        client=client,
        samples_per_s=step.rate.value,
        rate_low=step.rate.low,
        rate_high=step.rate.high,
        p50_ms=step.p50_ms,
        p99_ms=step.p99.value,
        p99_low=step.p99.low,
        p99_high=step.p99.high,
        windows=step.windows,
        requests=step.requests,
        errors=step.errors,
        measured_s=measured,
        stop="errors" if step.errors else stop,
        budget_ms=policy.budget_ms,
        client_bound=bound,
        client_cpu_us=statistics.median(c.per_request_us for c in clients) if clients else math.nan,
        client_serial_us=statistics.median(c.serial_us for c in clients) if clients else math.nan,
        bound_reason=next((c.reason() for c in clients if c.bound), "") if bound else "",
        first_error=_most_common_error(windows),
    )


def _most_common_error(windows: Sequence[Tally]) -> str | None:
    """The most common error of a step's windows (None without errors): why its requests failed."""
    kinds = merged_tallies(windows).error_kinds
    return kinds.most_common(1)[0][0] if kinds else None


@dataclass
class SearchResult:
    """Every step of a search, in order, and what it cost.

    Attributes:
        trials: the measured steps.
        loads: server configs loaded.
        skipped: ``(server label, client label, reason)`` of each grid point not measured.
        wall_s: wall time of the search, loads included.
    """

    trials: list[Trial] = field(default_factory=list)
    loads: int = 0
    skipped: list[tuple[str, str, str]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def measured_s(self) -> float:
        return sum(trial.measured_s for trial in self.trials)

    def best(self, server: ServerPoint | None = None, certified: bool = False) -> Trial | None:
        """The feasible step with the most samples/s (of ``server`` only, when given);
        ``certified``: among the certified steps, else the feasible ones when none is certified.
        A client-bound step (its rate is the client's) is the best only where every feasible step
        was client-bound, and it says so (:attr:`Trial.client_bound`)."""
        feasible = [t for t in self.trials if t.feasible and (server is None or t.server == server)]
        feasible = [t for t in feasible if not t.client_bound] or feasible
        sure = [t for t in feasible if t.certified] if certified else []
        return max(sure or feasible, key=lambda t: t.samples_per_s, default=None)


def search(
    probe: Probe,
    points: Sequence[ServerPoint],
    batch_sizes: Sequence[int],
    concurrency: Sequence[int],
    policy: Policy,
    on_trial: Callable[[Trial], None] | None = None,
) -> SearchResult:
    """Search ``points`` x client loads through ``probe`` (see the module doc for the pruning).

    Args:
        probe: loads server points and measures client loads.
        points: server configs, in the order to load them (the default first).
        batch_sizes: request batch sizes (ascending).
        concurrency: the ladder of requests in flight (ascending).
        policy: budget, windows and early stopping (``adaptive=False``: brute force).
        on_trial: called after each step (progress).
    """
    started = time.monotonic()
    result = SearchResult()
    incumbent: Trial | None = None
    clients = [ClientPoint(b, c) for b in batch_sizes for c in concurrency]

    def step(point: ServerPoint, client: ClientPoint) -> Trial:
        nonlocal incumbent
        low = incumbent.rate_low if incumbent is not None and policy.adaptive else 0.0
        with probe.run(client) as measure:
            trial = run_trial(measure, point, client, policy, low)
        result.trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        if trial.feasible and (incumbent is None or trial.samples_per_s > incumbent.samples_per_s):
            incumbent = trial
        return trial

    for point in points:
        probe.load(point)
        result.loads += 1
        done: dict[ClientPoint, Trial] = {}
        leader = incumbent
        if policy.adaptive and leader is not None:
            # First the incumbent's own load: a config slower there (its whole interval below the
            # incumbent's) is dominated; its ladders are not climbed.
            done[leader.client] = probe_trial = step(point, leader.client)
            if probe_trial.rate_high < leader.rate_low:
                dropped = f"config dominated at the incumbent's load {leader.client.label}"
                result.skipped += [(point.label, c.label, dropped) for c in clients if c != leader.client]
                continue
        for b_index, batch in enumerate(batch_sizes):
            previous: Trial | None = None
            first: Trial | None = None
            for c_index, level in enumerate(concurrency):
                client = ClientPoint(batch, level)
                trial = done.pop(client, None) or step(point, client)
                first = first or trial
                if not policy.adaptive:
                    continue
                reason: str | None = None
                if not trial.feasible:
                    reason = "higher concurrency: the step below is over budget"
                elif previous is not None and trial.samples_per_s < previous.samples_per_s * (
                    1 + policy.min_gain
                ):
                    reason = "higher concurrency: throughput saturated"
                previous = trial
                if reason is not None:
                    result.skipped += [
                        (point.label, f"B={batch} c={c}", reason)
                        for c in concurrency[c_index + 1 :]
                        if ClientPoint(batch, c) not in done
                    ]
                    break
            if policy.adaptive and first is not None and not first.feasible:
                larger = f"larger batch: B={batch} at c={concurrency[0]} is over budget"
                result.skipped += [
                    (point.label, f"B={b} c={c}", larger)
                    for b in batch_sizes[b_index + 1 :]
                    for c in concurrency
                    if ClientPoint(b, c) not in done
                ]
                break
    result.wall_s = time.monotonic() - started
    return result


def step_down(
    client: ClientPoint, batch_sizes: Sequence[int], concurrency: Sequence[int]
) -> ClientPoint | None:
    """The next lower client load of the space: the next lower concurrency at the same batch size;
    at the lowest concurrency, the next lower batch size; None below both.

    In a closed loop, fewer requests in flight (or fewer rows per request) wait less in the queue:
    the nearest load that can bring an over-budget p99 back under the budget.
    """
    lower = [c for c in concurrency if c < client.concurrency]
    if lower:
        return ClientPoint(client.batch_size, max(lower))
    smaller = [b for b in batch_sizes if b < client.batch_size]
    return ClientPoint(max(smaller), client.concurrency) if smaller else None


@dataclass
class LoadTry:
    """One client load of a config in the side-by-side stage, and what its rounds said.

    Attributes:
        client: the load.
        rounds: its side-by-side rounds (every stage the config spent at this load).
        kept: its median p99 held the budget without failed requests: the config ended here.
        reason: why it was kept or dropped, and where the config went next.
    """

    client: ClientPoint
    rounds: list[Trial] = field(default_factory=list)
    kept: bool = False
    reason: str = "not measured"

    def as_dict(self) -> dict[str, Any]:
        return {
            "client": asdict(self.client),
            "label": self.client.label,
            "rounds": len(self.rounds),
            **_median_of(self.rounds),
            "kept": self.kept,
            "reason": self.reason,
        }


@dataclass
class Confirmation:
    """A finalist (or the default) through the side-by-side stage.

    Attributes:
        search: the search's step it was drawn from: its server config and the load it started at.
        tries: the loads measured, in order; the last is where it ended.
        live: still in the rounds (held so far, or stepped down and waiting for its next stage).
    """

    search: Trial
    tries: list[LoadTry]
    live: bool = True

    @property
    def server(self) -> ServerPoint:
        return self.search.server

    @property
    def current(self) -> LoadTry:
        """The load it is at (the last tried)."""
        return self.tries[-1]

    @property
    def held(self) -> bool:
        """Its last load held the budget side by side."""
        return self.current.kept

    def summary(self) -> dict[str, Any]:
        """Medians of the rounds at its last load, and that load."""
        return {"client": asdict(self.current.client), **_median_of(self.current.rounds)}


def confirm(
    probe: Probe,
    trials: Sequence[Trial],
    policy: Policy,
    batch_sizes: Sequence[int],
    concurrency: Sequence[int],
) -> list[Confirmation]:
    """Measure ``trials``' steps again side by side, stepping down the load of those over budget.

    A stage is ``confirm_rounds`` rounds in alternating order over every config still in, each step
    ``confirm_windows`` windows. After a stage, a config whose median p99 at its load (over every
    round there) is over the budget, or that failed requests, moves to :func:`step_down`'s load
    and stays in; the others keep their load and are measured again beside it, so the configs
    left are always compared in the same rounds. A config is out when no lower load is left or
    ``step_downs`` extra stages have run; the stages end once no config moved.

    Args:
        probe: loads server points and measures client loads.
        trials: the steps to confirm, one per server config (the default's first).
        policy: the budget, rounds, windows and ``step_downs``.
        batch_sizes: the space's request batch sizes (ascending): loads to step to.
        concurrency: the space's requests in flight (ascending): loads to step to.

    Returns:
        Per trial, its loads tried and their rounds.
    """
    fixed = replace(policy, adaptive=False, min_windows=2, max_windows=policy.confirm_windows)
    entries = [Confirmation(trial, [LoadTry(trial.client)]) for trial in trials]
    turn = 0
    for stage in range(policy.step_downs + 1):
        live = [entry for entry in entries if entry.live]
        if not live:
            break
        for _ in range(policy.confirm_rounds):
            for entry in live if turn % 2 == 0 else live[::-1]:
                load = entry.current
                probe.load(entry.server)
                with probe.run(load.client) as measure:
                    load.rounds.append(run_trial(measure, entry.server, load.client, fixed))
            turn += 1
        last = stage == policy.step_downs
        moved = [_judge(entry, policy, batch_sizes, concurrency, last) for entry in live]
        if not any(moved):
            break
    return entries


def _judge(
    entry: Confirmation, policy: Policy, batch_sizes: Sequence[int], concurrency: Sequence[int], last: bool
) -> bool:
    """Keep ``entry`` at its load, step it down, or drop it; True when it stepped down."""
    load = entry.current
    median = _median_of(load.rounds)
    budget = policy.budget_ms
    rounds = f"{len(load.rounds)} round{'s' if len(load.rounds) > 1 else ''}"
    if _holds(median, budget):
        load.kept = True
        load.reason = f"kept: median p99 {median['p99_ms']:.2f} ms within {budget:g} ms ({rounds})"
        return False
    load.kept = False
    why = (
        f"{median['errors']} failed requests"
        if median["errors"]
        else f"median p99 {median['p99_ms']:.2f} ms over {budget:g} ms"
    )
    lower = step_down(load.client, batch_sizes, concurrency)
    if lower is None:
        load.reason = f"dropped: {why} ({rounds}); no lower load in the space"
    elif last:
        load.reason = f"dropped: {why} ({rounds}); no step-down left (at most {policy.step_downs})"
    else:
        load.reason = f"dropped: {why} ({rounds}); stepped down to {lower.label}"
        entry.tries.append(LoadTry(lower))
        return True
    entry.live = False
    return False


def _median_of(rounds: Sequence[Trial]) -> dict[str, Any]:
    return {
        "samples_per_s": statistics.median(t.samples_per_s for t in rounds),
        "p99_ms": statistics.median(t.p99_ms for t in rounds),
        "rounds_samples_per_s": [t.samples_per_s for t in rounds],
        "rounds_p99_ms": [t.p99_ms for t in rounds],
        "errors": sum(t.errors for t in rounds),
        "measured_s": sum(t.measured_s for t in rounds),
        "client_bound": 2 * sum(t.client_bound for t in rounds) >= len(rounds),
    }


def _holds(median: dict[str, Any], budget_ms: float) -> bool:
    """Medians of rounds that failed no request and whose median p99 is within ``budget_ms``."""
    return not median["errors"] and median["p99_ms"] <= budget_ms


def pick_winner(
    finalists: Sequence[Trial], rounds: Sequence[Sequence[Trial]], budget_ms: float
) -> int | None:
    """Index of the finalist with the most median samples/s over its side-by-side rounds among
    those whose median p99 is within ``budget_ms`` and that failed no request; None if none held.

    ``rounds`` are each finalist's rounds at the load it ended at (:attr:`Confirmation.current`).
    The search ranks steps measured minutes apart; on a shared machine a step measured near the
    budget can cross it when measured again, so the side-by-side rounds decide. A client-bound
    finalist wins only where every finalist that held was client-bound.
    """
    if len(finalists) != len(rounds):
        raise ConfigError("one list of rounds per finalist")
    held = {i: _median_of(measured) for i, measured in enumerate(rounds) if measured}
    held = {i: median for i, median in held.items() if _holds(median, budget_ms)}
    # A finalist the client limited wins only where every finalist that held was client-bound.
    server_bound = {i: median for i, median in held.items() if not median["client_bound"]} or held
    return max(server_bound, key=lambda i: server_bound[i]["samples_per_s"], default=None)


def side_by_side(
    confirmations: Sequence[Confirmation], default: ServerPoint, budget_ms: float
) -> dict[str, Any]:
    """The JSON-ready outcome of :func:`confirm`.

    Args:
        confirmations: every confirmed config.
        default: the cpu profile's default config (confirmed where the search found it a step).
        budget_ms: the p99 budget.

    Returns:
        ``winner`` (None when no config held: else its server, the load it held at and the medians
        there as ``samples_per_s`` / ``p99_ms``, ``confirmed``, ``search`` and ``loads``),
        ``default`` (the default's ``confirmed``, ``held`` and ``loads``; None where not confirmed)
        and ``finalists`` (per config, its search step, ``held``, ``confirmed`` at the load it
        ended at, and ``loads``: each load tried, its rounds and why it was kept or dropped).
    """
    chosen = pick_winner(
        [c.search for c in confirmations], [c.current.rounds for c in confirmations], budget_ms
    )
    winner = None if chosen is None else confirmations[chosen]
    ours = next((c for c in confirmations if c.server == default), None)
    finalists = [
        {
            **c.search.as_dict(),
            "is_default": c is ours,
            "is_winner": c is winner,
            "held": c.held,
            "confirmed": c.summary(),
            "loads": [load.as_dict() for load in c.tries],
        }
        for c in confirmations
    ]
    won = None
    if winner is not None:
        summary = winner.summary()
        won = {
            "server": winner.server.as_dict(),
            "server_label": winner.server.label,
            "client": summary["client"],
            "samples_per_s": summary["samples_per_s"],
            "p99_ms": summary["p99_ms"],
            "budget_ms": budget_ms,
            "feasible": True,
            "confirmed": summary,
            "search": winner.search.as_dict(),
            "loads": [load.as_dict() for load in winner.tries],
        }
    return {
        "winner": won,
        "default": None
        if ours is None
        else {"confirmed": ours.summary(), "held": ours.held, "loads": [t.as_dict() for t in ours.tries]},
        "finalists": finalists,
    }


def pareto_frontier(trials: Sequence[Trial]) -> list[Trial]:
    """The steps no other step beats on both p99 (lower) and samples/s (higher), by p99 ascending.

    Steps with errors or no answers are left out.
    """
    usable = sorted(
        (t for t in trials if t.requests > 0 and t.errors == 0), key=lambda t: (t.p99_ms, -t.samples_per_s)
    )
    frontier: list[Trial] = []
    for trial in usable:
        if not frontier or trial.samples_per_s > frontier[-1].samples_per_s:
            frontier.append(trial)
    return frontier


def top_configs(result: SearchResult, count: int, certified: bool = False) -> list[Trial]:
    """The best feasible (``certified``: certified, see :meth:`SearchResult.best`) step of each
    server config, the ``count`` fastest."""
    best = [result.best(point, certified) for point in dict.fromkeys(t.server for t in result.trials)]
    ranked = sorted((t for t in best if t is not None), key=lambda t: t.samples_per_s, reverse=True)
    return ranked[:count]


def finalists_of(result: SearchResult, default: ServerPoint, policy: Policy) -> list[Trial]:
    """What :func:`confirm` measures: the default's best feasible step (where it has one), then
    those of the ``policy.finalists`` fastest configs, one step per config.

    Feasible, not certified: a step whose p99 interval reaches over the budget is often the one
    that holds it (a small Wide & Deep's best such step held its budget under perf_analyzer side
    by side, with far more samples/s than the best certified step); the side-by-side
    rounds decide, and a step that crosses the budget there steps its load down.
    """
    candidates = [result.best(default), *top_configs(result, policy.finalists)]
    return [t for t in dict.fromkeys(candidates) if t is not None]


# ---------------------------------------------------------------- the real probe
class ServedProbe:
    """A local tritonserver (explicit model control) on a scratch copy of the repository.

    The scratch repository holds, per variant, a folder whose version folders
    link to the user's and whose config.pbtxt is rewritten for each candidate;
    the user's repository is never written. One variant is loaded at a time:
    switching variants unloads the previous one, so it takes no core.

    With ``raw``, requests go to each variant's raw-row model (``<variant>_raw``: the rows as
    text, parsed in the server by its first step): the scratch repository also holds those
    ensembles and their other steps, as the user's has them, and the config searched is still
    the variant's.

    Args:
        repository: the exported repository.
        family: ``dlrm`` or ``wide_deep``.
        pools: request batches by batch size.
        log_file: tritonserver's log.
        raw: measure through the raw-row models.
    """

    def __init__(
        self, repository: Path, family: str, pools: dict[int, PayloadPool], log_file: Path, raw: bool = False
    ) -> None:
        self._repository = repository
        self._family = family
        self._pools = pools
        self._log_file = log_file
        self._raw = raw
        self._bases = base_configs(repository, family, tuple(model_name_variants(repository, family)))
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._server: Any = None
        self._loaded: str | None = None
        self._model = ""
        #: The models requests went to.
        self.sent_to: set[str] = set()
        self._rate_steps = 0

    def __enter__(self) -> ServedProbe:
        from server import LocalServer, ServerConfig

        self._scratch = tempfile.TemporaryDirectory(prefix="tune-")
        root = Path(self._scratch.name)
        for variant in self._bases:
            name = model_name(self._family, variant)
            _link_versions(self._repository / name, root / name)
            # The variants searched have theirs (run_tune checks); the others are never loaded.
            if self._raw and (self._repository / raw_model_name(name) / CONFIG_NAME).is_file():
                for other in raw_models(self._repository, name):
                    if not (root / other).exists():
                        _link_versions(self._repository / other, root / other)
                        shutil.copy2(self._repository / other / CONFIG_NAME, root / other / CONFIG_NAME)
        config = ServerConfig.with_free_ports(root, model_control_mode="explicit", log_file=self._log_file)
        self._server = LocalServer(config).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.stop()
        if self._scratch is not None:
            self._scratch.cleanup()

    def load(self, point: ServerPoint) -> None:
        if self._scratch is None:
            raise ConfigError("enter the probe before loading a config")
        name = model_name(self._family, point.variant)
        if self._loaded is not None and self._loaded != name:
            if self._raw:
                self._server.unload_model(raw_model_name(self._loaded))
            self._server.unload_model(self._loaded)
        write_config(Path(self._scratch.name) / name, candidate_config(self._bases[point.variant], point))
        self._server.load_model(name, timeout=600)
        self._loaded = self._model = name
        if self._raw:
            # Its other steps load with it; the variant, loaded above, keeps the candidate's config.
            self._model = raw_model_name(name)
            self._server.load_model(self._model, timeout=600)

    def rate_step(self, batch_size: int, rate: float, load: RateLoad) -> RateStep:
        """One open-loop step (:func:`loadtest.sweeps.rates.rate_step`) at ``rate`` requests/s of
        ``batch_size`` rows on the loaded config."""
        if self._scratch is None:
            raise ConfigError("enter the probe before measuring")
        root = Path(self._scratch.name)
        payload = root / f"payload-b{batch_size}.npz"
        if not payload.exists():
            self._pools[batch_size].save(payload)
        self.sent_to.add(self._model)
        self._rate_steps += 1
        target = Target(self._server.grpc_url, "grpc", "triton", engine="driver")
        folder = root / f"step-{self._rate_steps}"
        return rate_step(target, self._model, batch_size, rate, payload, folder, load)

    @contextmanager
    def run(self, client: ClientPoint) -> Iterator[Measure]:
        pool = self._pools[client.batch_size]
        self.sent_to.add(self._model)
        connect = triton_requests(self._server.grpc_url, "grpc", self._model, pool, client.concurrency)
        with Driver(connect, client.concurrency) as driver:
            yield driver.measure


def _link_versions(source: Path, target: Path) -> None:
    """``target``: a folder whose version folders link to ``source``'s."""
    target.mkdir()
    for folder in sorted(source.iterdir()):
        if folder.is_dir() and folder.name.isdigit():
            (target / folder.name).symlink_to(folder.resolve(), target_is_directory=True)


def raw_models(repository: Path, model: str) -> list[str]:
    """``model``'s raw-row model and its steps other than ``model`` (the raw-row stage), as
    ``repository`` has them.

    Raises:
        ConfigError: the repository has no raw-row model for ``model`` (exported with
            ``--no-raw-rows``), or it is not an ensemble over ``model``.
    """
    name = raw_model_name(model)
    path = repository / name / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(f"{repository} has no {name} (export without --no-raw-rows writes one)")
    steps = [step.model_name for step in read_config(path).ensemble_scheduling.step]
    if model not in steps:
        raise ConfigError(f"{path} is not an ensemble over {model} (its steps: {steps})")
    return [name, *(step for step in steps if step != model)]


def model_name_variants(repository: Path, family: str) -> list[str]:
    """The variants of ``family`` whose ``model.onnx`` is in ``repository``."""
    return [
        v
        for v in ("fp32", "fp16", "int8")
        if (version_dir(repository, model_name(family, v)) / MODEL_FILE).is_file()
    ]


# ---------------------------------------------------------------- the command
@dataclass(frozen=True)
class TuneOptions:
    """What ``python -m loadtest tune`` does.

    Args:
        repository: an exported cpu-profile repository.
        space: what is searched.
        policy: budget, windows, early stopping.
        data: Criteo TSV for the request rows (None: synthetic).
        top: configurations listed with their config.pbtxt diffs.
        log_file: tritonserver's log.
        raw: send the rows as text to each variant's raw-row model (see :class:`ServedProbe`).
    """

    repository: Path
    space: Space
    policy: Policy
    data: Path | None = None
    top: int = 5
    log_file: Path = Path("logs/tune-tritonserver.log")
    raw: bool = False

    def __post_init__(self) -> None:
        if self.top < 1:
            raise ConfigError(f"top must be >= 1, got {self.top}")
        if self.data is not None and not self.data.is_file():
            raise ConfigError(f"--data {self.data} is not a file")


def plan(options: TuneOptions) -> tuple[Space, ServerPoint, dict[str, Any], list[ServerPoint]]:
    """What a tune measures, checked before anything is: the space of the variants the repository
    holds, the shipped default, each variant's base config, and the server points, the default
    first (measured whatever variants are asked).

    Raises:
        ConfigError: the repository lacks the family, a batch size exceeds its max_batch_size, or a
            config (or, with ``raw``, a raw-row model) cannot be made.
    """
    space = options.space
    held = tuple(model_name_variants(options.repository, space.family))
    variants = tuple(v for v in space.variants if v in held)
    if not variants:
        raise ConfigError(f"{options.repository} holds no variant of {space.family} among {space.variants}")
    default = default_point(held)
    bases = base_configs(options.repository, space.family, tuple(dict.fromkeys((*variants, default.variant))))
    space = replace(space, variants=variants, extra=(default,))
    limit = min(config.max_batch_size for config in bases.values())
    if space.batch_sizes[-1] > limit:
        raise ConfigError(f"batch size {space.batch_sizes[-1]} exceeds the models' max_batch_size {limit}")
    points = [default, *[p for p in space.server_points() if p != default]]
    for point in points:  # fails before anything is measured
        candidate_config(bases[point.variant], point)
        if options.raw:
            raw_models(options.repository, model_name(space.family, point.variant))
    return space, default, bases, points


def request_pools(batch_sizes: Sequence[int], data: Path | None) -> dict[int, PayloadPool]:
    """The request rows (``data``, or synthetic) cut into batches of each size."""
    rows = build_pool(1, data=data, batches=MAX_POOL_ROWS)
    return {batch: rows.rebatched(batch) for batch in batch_sizes}


def run_tune(options: TuneOptions, command: str) -> dict[str, Any]:
    """Search, confirm the winner against the default, and return the JSON-ready result.

    Raises:
        ConfigError: the repository lacks the family, or a batch size exceeds its max_batch_size.
    """
    policy = options.policy
    space, default, bases, points = plan(options)
    record = RunRecord.begin(command)
    pools = request_pools(space.batch_sizes, options.data)
    # The progress starts first: starting tritonserver and loading the variants takes a while.
    with Progress(console=console, transient=True) as progress:
        trials = len(points) * len(space.client_points())
        task = progress.add_task("starting the local tritonserver and loading the models", total=trials)
        with ServedProbe(options.repository, space.family, pools, options.log_file, options.raw) as probe:
            progress.update(task, description="tuning")

            def on_trial(trial: Trial) -> None:
                progress.update(
                    task,
                    advance=1,
                    description=f"{trial.server.label} {trial.client.label}: {trial.samples_per_s:,.0f}/s "
                    f"p99 {trial.p99_ms:.1f} ms ({trial.stop})",
                )

            result = search(probe, points, space.batch_sizes, space.concurrency, policy, on_trial)
            finalists = finalists_of(result, default, policy)
            default_best = result.best(default)
            progress.update(task, description="finalists and the default, side by side")
            confirmed = confirm(probe, finalists, policy, space.batch_sizes, space.concurrency)
    document = _document(
        options, space, points, default, bases, result, default_best, confirmed, record.finish().to_json()
    )
    return {**document, "request_models": sorted(probe.sent_to)}


def _document(
    options: TuneOptions,
    space: Space,
    points: Sequence[ServerPoint],
    default: ServerPoint,
    bases: dict[str, Any],
    result: SearchResult,
    default_best: Trial | None,
    confirmed: Sequence[Confirmation],
    record: dict[str, Any],
) -> dict[str, Any]:
    policy = options.policy
    default_config = candidate_config(bases[default.variant], default)
    top = top_configs(result, options.top)
    outcome = side_by_side(confirmed, default, policy.budget_ms)
    winner = outcome["winner"]
    if winner is not None:
        point = _server_of(winner["server"])
        winner = {
            **winner,
            "model": model_name(space.family, point.variant),
            "config": config_text(candidate_config(bases[point.variant], point)),
        }
    rounds = [t for c in confirmed for load in c.tries for t in load.rounds]
    confirm_s = sum(t.measured_s for t in rounds)
    brute_s = len(points) * len(space.client_points()) * policy.point_seconds
    return {
        **record,
        "family": space.family,
        "raw": options.raw,
        "budget_ms": policy.budget_ms,
        "space": {
            "variants": list(space.variants),
            "instances": list(space.instances),
            "threads": list(space.threads),
            "queue_delays_us": list(space.queue_delays_us),
            "preferred": [list(p) for p in space.preferred],
            "batch_sizes": list(space.batch_sizes),
            "concurrency": list(space.concurrency),
            "server_points": len(points),
            "grid_points": len(points) * len(space.client_points()),
        },
        "policy": asdict(policy),
        "default": {
            "server": default.as_dict(),
            "label": default.label,
            "model": model_name(space.family, default.variant),
            "config": config_text(default_config),
            "best": default_best.as_dict() if default_best else None,
            "confirmed": None,
            "held": None,
            "loads": [],
            **(outcome["default"] or {}),
        },
        "winner": winner,
        "search_winner": None if result.best() is None else result.best().as_dict(),  # type: ignore[union-attr]
        "finalists": outcome["finalists"],
        "top": [
            {
                **t.as_dict(),
                "model": model_name(space.family, t.server.variant),
                "diff": config_diff(default_config, candidate_config(bases[t.server.variant], t.server)),
            }
            for t in top
        ],
        "frontier": [t.as_dict() for t in pareto_frontier(result.trials)],
        "trials": [t.as_dict() for t in result.trials],
        "skipped": [list(s) for s in result.skipped],
        "time": {
            "search_measured_s": result.measured_s,
            "confirm_measured_s": confirm_s,
            "brute_force_s": brute_s,
            "brute_force_rule": f"{len(points)} server configs x {len(space.client_points())} client loads "
            f"x {policy.point_seconds:g} s ({policy.warmup_s:g} s warm-up + {policy.max_windows} windows of "
            f"{policy.window_s:g} s)",
            "confirm_steps": len(rounds),
            "search_fraction": result.measured_s / brute_s,
            "total_fraction": (result.measured_s + confirm_s) / brute_s,
            "search_wall_s": result.wall_s,
            "steps_measured": len(result.trials),
            "loads": result.loads,
        },
        "adaptive": policy.adaptive,
    }


def apply_winner(repository: Path, document: dict[str, Any]) -> tuple[Path, str]:
    """Write the winner's config into ``repository`` (as a ModelConfig, through ``write_config``).

    Returns:
        The config's path and the diff against the config it replaced.

    Raises:
        ConfigError: the tune found no configuration within its budget.
    """
    winner = document.get("winner")
    if winner is None:
        raise ConfigError(
            f"no configuration met the p99 budget of {document['budget_ms']:g} ms: nothing to apply"
        )
    family = document["family"]
    point = _server_of(winner["server"])
    name = model_name(family, point.variant)
    before = base_configs(repository, family, (point.variant,))[point.variant]
    after = candidate_config(before, point)
    return write_config(repository / name, after), config_diff(before, after)


def _server_of(server: dict[str, Any]) -> ServerPoint:
    """A server point back from its :meth:`ServerPoint.as_dict`."""
    return ServerPoint(
        server["variant"],
        server["instances"],
        server["threads"],
        server["queue_delay_us"],
        tuple(server["preferred"]),
    )
