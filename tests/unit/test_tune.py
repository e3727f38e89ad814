"""The tune search's logic: intervals, early stops, ladder and batch pruning, frontier, time accounting,
candidate configs and --apply. A fake probe stands in for the served measurement here only; the
integration test (tests/integration/test_tune_served.py) runs the same search through tritonserver."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bundle.errors import ConfigError
from export.repository import ServingConfig, build_config, read_config, write_config
from loadtest.latency import Tally
from loadtest.tune import (
    Measure,
    Policy,
    Trial,
    apply_winner,
    pareto_frontier,
    pick_winner,
    run_trial,
    search,
    top_configs,
)
from loadtest.tune_space import (
    ClientPoint,
    ServerPoint,
    Space,
    candidate_config,
    config_diff,
    default_point,
    parse_preferred,
)
from loadtest.tune_stats import quantile_interval, rate_interval, t95


class FakeProbe:
    """A closed-loop queue: ``capacity`` samples/s per server point, reached at ``instances`` requests
    in flight; each request's latency is ``rows in flight / throughput`` (Little's law), with
    ``jitter`` relative noise. Records what it was asked to measure."""

    def __init__(self, capacity: dict[str, float], jitter: float = 0.01, seed: int = 0) -> None:
        self.capacity = capacity
        self.jitter = jitter
        self.rng = np.random.default_rng(seed)
        self.loaded: ServerPoint | None = None
        self.loads: list[ServerPoint] = []
        self.windows: list[tuple[ServerPoint, ClientPoint, float]] = []

    def load(self, point: ServerPoint) -> None:
        self.loaded = point
        self.loads.append(point)

    @contextmanager
    def run(self, client: ClientPoint) -> Iterator[Measure]:
        point = self.loaded
        assert point is not None

        def measure(seconds: float) -> Tally:
            self.windows.append((point, client, seconds))
            throughput = self.capacity[point.variant] * min(1.0, client.concurrency / point.instances)
            latency_ms = client.concurrency * client.batch_size / throughput * 1000.0
            tally = Tally(seconds=seconds)
            for _ in range(max(1, round(throughput * seconds / client.batch_size))):
                tally.answer(latency_ms * (1 + self.jitter * self.rng.standard_normal()), client.batch_size)
            return tally

        yield measure


def constant(seconds: float, latency_ms: float, requests: int, rows: int = 1) -> Tally:
    tally = Tally(seconds=seconds)
    for _ in range(requests):
        tally.answer(latency_ms, rows)
    return tally


POINT = ServerPoint("int8", 1, 0, 100)
CLIENT = ClientPoint(64, 1)


# ------------------------------------------------------------------ intervals
def test_the_rate_interval_is_a_t_interval_and_shrinks_with_agreement() -> None:
    assert t95(2) == pytest.approx(4.303)
    assert t95(100) == pytest.approx(1.96, abs=1e-3)
    interval = rate_interval([90.0, 100.0, 110.0])
    assert interval.value == pytest.approx(100.0)
    assert interval.high - interval.value == pytest.approx(4.303 * 10.0 / math.sqrt(3), rel=1e-3)
    assert rate_interval([100.0, 100.0, 100.0]).relative_half_width == 0.0
    assert math.isinf(rate_interval([100.0]).high)


def test_the_p99_interval_brackets_the_percentile_and_falls_back_to_the_max_for_few_samples() -> None:
    tally = Tally(seconds=1.0)
    for latency in range(1, 2001):
        tally.answer(float(latency))
    interval = quantile_interval(tally)
    assert interval.low < interval.value < interval.high
    assert interval.value == pytest.approx(1980, rel=0.01)
    assert interval.low > 1960 and interval.high < 2000
    few = Tally(seconds=1.0)
    for latency in (1.0, 2.0, 3.0, 50.0):
        few.answer(latency)
    assert quantile_interval(few).high == pytest.approx(50.0, rel=1e-3)


# ------------------------------------------------------------------ one step
def test_a_clear_step_stops_after_min_windows_and_accounts_every_window() -> None:
    policy = Policy(budget_ms=10.0, window_s=0.5, warmup_s=0.25, min_windows=3, max_windows=8)
    trial = run_trial(lambda s: constant(s, 2.0, 500, 64), POINT, CLIENT, policy)
    assert (trial.stop, trial.windows, trial.feasible) == ("decided", 3, True)
    assert trial.measured_s == pytest.approx(0.25 + 3 * 0.5)


def test_a_step_over_budget_stops_early_and_is_infeasible() -> None:
    trial = run_trial(lambda s: constant(s, 30.0, 500), POINT, CLIENT, Policy(budget_ms=10.0))
    assert (trial.stop, trial.windows, trial.feasible) == ("over budget", 3, False)


def test_a_step_below_the_incumbent_stops_as_dominated_even_when_noisy() -> None:
    rates = iter([100, 140, 90, 130, 95, 150, 100, 120])

    def measure(seconds: float) -> Tally:
        return constant(seconds, 1.0, next(rates, 100) * 4)

    trial = run_trial(measure, POINT, CLIENT, Policy(budget_ms=10.0, warmup_s=0.0), incumbent_low=10_000.0)
    assert trial.stop == "dominated" and trial.windows == 3


def test_a_step_whose_p99_straddles_the_budget_runs_every_window() -> None:
    def measure(seconds: float) -> Tally:
        tally = constant(seconds, 5.0, 300)
        for _ in range(3):  # 1 % of requests at 50 ms: the p99 interval spans the 10 ms budget
            tally.answer(50.0)
        return tally

    trial = run_trial(measure, POINT, CLIENT, Policy(budget_ms=10.0, max_windows=6))
    assert (trial.stop, trial.windows) == ("max windows", 6)


def test_errors_make_a_step_infeasible() -> None:
    def measure(seconds: float) -> Tally:
        tally = constant(seconds, 1.0, 100)
        tally.error("refused")
        return tally

    trial = run_trial(measure, POINT, CLIENT, Policy(budget_ms=10.0))
    assert (trial.stop, trial.feasible) == ("errors", False)


def test_the_brute_force_never_stops_a_step_early() -> None:
    policy = Policy(budget_ms=10.0, adaptive=False, max_windows=5)
    trial = run_trial(lambda s: constant(s, 30.0, 500), POINT, CLIENT, policy)
    assert (trial.stop, trial.windows) == ("max windows", 5)


# ------------------------------------------------------------------ the search
SPACE = Space(
    family="dlrm",
    variants=("fp32", "int8"),
    instances=(1, 2),
    threads=(0, 1),
    queue_delays_us=(100, 2000),
    batch_sizes=(64, 256, 1024),
    concurrency=(1, 2, 4, 8),
)
CAPACITY = {"fp32": 20_000.0, "int8": 50_000.0}


def test_the_ladder_stops_over_budget_and_when_saturated_and_larger_batches_are_skipped() -> None:
    probe = FakeProbe(CAPACITY)
    point = ServerPoint("fp32", 1, 0, 100)
    result = search(probe, [point], (64, 256, 1024), (1, 2, 4, 8), Policy(budget_ms=10.0))
    measured = [t.client for t in result.trials]
    # B=64: 3.2 ms at c=1, saturated at c=2 (one instance); B=256: 12.8 ms at c=1, over budget:
    # B=1024 is never measured.
    assert measured == [ClientPoint(64, 1), ClientPoint(64, 2), ClientPoint(256, 1)]
    reasons = {reason for _, _, reason in result.skipped}
    assert any("saturated" in r for r in reasons) and any("larger batch" in r for r in reasons)
    assert len(result.skipped) + len(result.trials) == 12


def test_the_smart_search_finds_the_brute_force_winner_in_under_a_third_of_its_time() -> None:
    points = [default_point(SPACE.variants), *SPACE.server_points()]
    points = list(dict.fromkeys(points))
    smart_policy = Policy(budget_ms=50.0)
    smart = search(FakeProbe(CAPACITY), points, SPACE.batch_sizes, SPACE.concurrency, smart_policy)
    brute_policy = Policy(budget_ms=50.0, adaptive=False)
    brute = search(FakeProbe(CAPACITY), points, SPACE.batch_sizes, SPACE.concurrency, brute_policy)
    # The cpu profile's default is searched beside the space's points (it may lie outside it).
    grid = len(points) * len(SPACE.batch_sizes) * len(SPACE.concurrency)
    assert len(brute.trials) == grid
    assert brute.measured_s == pytest.approx(grid * brute_policy.point_seconds, rel=0.01)
    smart_best, brute_best = smart.best(), brute.best()
    assert smart_best is not None and brute_best is not None
    assert (smart_best.server.variant, smart_best.client) == (brute_best.server.variant, brute_best.client)
    assert smart_best.samples_per_s == pytest.approx(brute_best.samples_per_s, rel=0.05)
    assert smart.measured_s <= brute.measured_s / 3
    assert smart.loads == brute.loads == len(points)


def test_a_config_slower_at_the_incumbents_load_is_dropped_after_one_step() -> None:
    probe = FakeProbe(CAPACITY)
    fast, slow = ServerPoint("int8", 1, 0, 100), ServerPoint("fp32", 1, 0, 100)
    result = search(probe, [fast, slow], (64, 256), (1, 2, 4), Policy(budget_ms=50.0))
    incumbent = result.best()
    assert incumbent is not None and incumbent.server == fast
    slow_trials = [t for t in result.trials if t.server == slow]
    assert [t.client for t in slow_trials] == [incumbent.client]
    assert slow_trials[0].stop == "dominated"
    dropped = [s for s in result.skipped if s[0] == slow.label]
    assert len(dropped) == 5 and all("config dominated" in reason for _, _, reason in dropped)


def test_finalists_are_drawn_from_steps_whose_whole_p99_interval_holds_the_budget() -> None:
    result = search(FakeProbe(CAPACITY), [POINT], (64,), (1,), Policy(budget_ms=10.0))
    edge = replace(trial(9.0, 99_999), server=POINT, p99_high=12.0)
    result.trials.append(edge)
    assert result.best() is edge and not edge.certified
    certified = result.best(POINT, certified=True)
    assert certified is not None and certified is not edge and certified.certified
    assert top_configs(result, 1, certified=True) == [certified]


def test_no_feasible_step_means_no_winner() -> None:
    result = search(FakeProbe(CAPACITY), [POINT], (1024,), (1, 2), Policy(budget_ms=1.0))
    assert result.best() is None and top_configs(result, 3) == []


# ------------------------------------------------------------------ frontier
def trial(p99: float, rate: float, label: int = 1, errors: int = 0) -> Trial:
    return Trial(
        ServerPoint("fp32", label, 0, 100), CLIENT, rate, rate, rate, p99 / 2, p99, p99, p99,
        3, 100, errors, 1.0, "decided", 10.0,
    )  # fmt: skip


def test_the_frontier_keeps_only_steps_no_other_beats_on_both_axes() -> None:
    steps = [
        trial(1.0, 100),
        trial(2.0, 90),
        trial(2.0, 300),
        trial(5.0, 250),
        trial(8.0, 400),
        trial(3, 999, errors=1),
    ]
    frontier = pareto_frontier(steps)
    assert [(t.p99_ms, t.samples_per_s) for t in frontier] == [(1.0, 100), (2.0, 300), (8.0, 400)]


def test_the_side_by_side_rounds_pick_the_winner_and_drop_finalists_over_budget() -> None:
    default, fast_edge, steady = trial(8.0, 1000, 1), trial(9.9, 1500, 2), trial(7.0, 1200, 3)
    rounds = [
        [trial(8.0, 1000, 1)] * 3,
        [trial(12.0, 1600, 2), trial(11.0, 1500, 2), trial(9.0, 1400, 2)],  # median p99 11 ms: over
        [trial(7.0, 1150, 3), trial(7.5, 1250, 3), trial(6.0, 1200, 3)],
    ]
    assert pick_winner([default, fast_edge, steady], rounds, 10.0) == 2
    assert pick_winner([default], [[trial(20.0, 1000)] * 3], 10.0) is None


# ------------------------------------------------------------------ configs
def test_candidate_configs_change_only_the_searched_fields_and_parse_back(tmp_path: Path) -> None:
    base = build_config("dlrm_onnx_int8", ServingConfig())
    point = ServerPoint("int8", 2, 1, 2000, (2048,))
    candidate = candidate_config(base, point)
    diff = config_diff(base, candidate)
    assert "+  count: 2" in diff and "max_queue_delay_microseconds: 2000" in diff and "2048" in diff
    assert "intra_op_thread_count" in diff
    assert config_diff(base, candidate_config(base, default_point(("fp32", "int8")))) == ""
    path = write_config(tmp_path / "dlrm_onnx_int8", candidate)
    assert read_config(path) == candidate
    with pytest.raises(ConfigError):
        candidate_config(base, ServerPoint("int8", 1, 0, 100, (8192,)))


def test_preferred_sets_parse() -> None:
    assert parse_preferred("none;2048;1024,2048") == ((), (2048,), (1024, 2048))
    with pytest.raises(ConfigError):
        parse_preferred("x")


def test_apply_writes_the_winner_as_a_model_config(tmp_path: Path) -> None:
    write_config(tmp_path / "dlrm_onnx", build_config("dlrm_onnx", ServingConfig()))
    winner = ServerPoint("fp32", 2, 1, 2000)
    document = {"family": "dlrm", "budget_ms": 10.0, "winner": {"server": winner.as_dict()}}
    path, diff = apply_winner(tmp_path, document)
    written = read_config(path)
    assert written.instance_group[0].count == 2
    assert written.dynamic_batching.max_queue_delay_microseconds == 2000
    assert "+  count: 2" in diff
    with pytest.raises(ConfigError, match="nothing to apply"):
        apply_winner(tmp_path, {"family": "dlrm", "budget_ms": 10.0, "winner": None})
