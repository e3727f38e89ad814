"""``tune --objective capacity`` over a synthetic server whose p99 climbs near each config's edge:
the default is searched in full, a config that cannot hold the incumbent's samples/s is dropped
after one step, a better one is searched upward, the side-by-side rounds decide the winner, and
the report and ``--apply`` read what the search wrote."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bundle.errors import ConfigError
from loadtest.sweeps.rates import RateLoad, RateStep
from loadtest.tune.capacity import (
    SECTION_WINNER,
    STEP_DOWN,
    CapacityPolicy,
    confirm_capacities,
    finalists_of,
    report_lines,
    search_capacities,
    write_capacity_tune,
)
from loadtest.tune.search import _server_of
from loadtest.tune.space import ServerPoint

DEFAULT = ServerPoint("int8", 1, 0, 100)
FASTER = ServerPoint("int8", 2, 1, 100)
SLOWER = ServerPoint("fp32", 1, 0, 100)
#: Each config's edge in samples/s: the p99 holds 10 ms up to 0.8 of it.
EDGES = {DEFAULT: 6400.0, FASTER: 12800.0, SLOWER: 3200.0}


def _step(rate: float, batch_size: int, p99_ms: float) -> RateStep:
    return RateStep(
        label="triton", model="m", protocol="grpc", batch_size=batch_size, arrival="poisson",
        request_rate=rate, scheduled_rate=rate, achieved_rate=rate, answered_per_s=rate,
        samples_per_s=batch_size * rate, connections=64, seconds=10.0, requests=int(10 * rate), errors=0,
        late=0, unfinished=0, in_flight_mean=1.0, in_flight_max=3, p50_ms=p99_ms / 3, p90_ms=p99_ms / 2,
        p99_ms=p99_ms, p999_ms=p99_ms * 1.5, max_ms=p99_ms * 2, service_p99_ms=p99_ms, send_lag_p99_ms=0.1,
        flag="",
    )  # fmt: skip


class _Server:
    """The probe: p99 = 2 / (1 - load) ms, load = samples/s over the loaded config's edge; a
    config in ``worse_side_by_side`` answers ``factor`` times slower in the confirmation rounds."""

    def __init__(self, worse_side_by_side: frozenset[ServerPoint] = frozenset(), factor: float = 3.0) -> None:
        self.loaded: ServerPoint | None = None
        self.loads: list[ServerPoint] = []
        self.steps: list[tuple[ServerPoint, int, float]] = []
        self.confirming = False
        self.worse = worse_side_by_side
        self.factor = factor

    def load(self, point: ServerPoint) -> None:
        self.loaded = point
        self.loads.append(point)

    def rate_step(self, batch_size: int, rate: float, load: RateLoad) -> RateStep:
        assert self.loaded is not None
        self.steps.append((self.loaded, batch_size, rate))
        busy = rate * batch_size / EDGES[self.loaded]
        p99 = 2.0 / (1.0 - busy) if busy < 1.0 else 1000.0
        if self.confirming and self.loaded in self.worse:
            p99 *= self.factor
        return _step(rate, batch_size, p99)


POLICY = CapacityPolicy(10.0, RateLoad(duration_s=1.0, warmup_s=0.0), start_rate=20.0, resolution=0.05)


def test_the_default_is_searched_a_slower_config_dropped_and_a_faster_one_searched_upward() -> None:
    server = _Server()
    found = search_capacities(server, [DEFAULT, SLOWER, FASTER], [64], POLICY)
    by_server = {entry.server: entry for entry in found}
    # Each edge found within the resolution: 0.8 of the edge holds 10 ms.
    default = by_server[DEFAULT]
    assert default.dominated_at is None
    assert default.samples_per_s <= 0.8 * EDGES[DEFAULT] < default.samples_per_s * 1.05 + 64
    # The slower config is measured once, at the rate that equals the default's samples/s.
    slower = by_server[SLOWER]
    assert slower.dominated_at == pytest.approx(default.samples_per_s / 64, abs=0.05)
    assert [s for s in server.steps if s[0] == SLOWER] == [(SLOWER, 64, slower.dominated_at)]
    assert slower.rate == 0 and slower.outcome().startswith("dominated: did not hold")
    # The faster one starts where the default ended and climbs to its own edge.
    faster = by_server[FASTER]
    rates = [rate for point, _, rate in server.steps if point == FASTER]
    assert rates[0] == slower.dominated_at and max(rates) > rates[0]
    assert faster.samples_per_s <= 0.8 * EDGES[FASTER] < faster.samples_per_s * 1.05 + 64
    assert server.loads == [DEFAULT, SLOWER, FASTER]  # one load per config
    assert len({(p, b, r) for p, b, r in server.steps}) == len(server.steps)  # no rate measured twice


def test_a_batch_size_that_cannot_reach_the_incumbent_below_the_highest_rate_is_not_measured() -> None:
    server = _Server()
    policy = replace(POLICY, max_rate=100.0)
    found = search_capacities(server, [DEFAULT], [64, 1], policy)
    # Batch 1 would need the default's samples/s (over 5,000) as requests/s: above --max-rate.
    (one,) = (entry for entry in found if entry.batch_size == 1)
    assert one.dominated_at is not None and one.dominated_at > 100 and not one.capacity.steps
    assert all(batch == 64 for _, batch, _ in server.steps)


def test_side_by_side_rounds_decide_the_winner() -> None:
    # The faster config answers 3x slower side by side: over the budget even two steps down.
    server = _Server(worse_side_by_side=frozenset({FASTER}), factor=3.0)
    found = search_capacities(server, [DEFAULT, SLOWER, FASTER], [64], POLICY)
    searched = len(server.steps)
    finalists = finalists_of(found, DEFAULT, 3)
    assert [f.server for f in finalists] == [DEFAULT, FASTER]  # the default first; none with no rate
    server.confirming = True
    confirmed = confirm_capacities(server, finalists, POLICY)
    # Each stage: three rounds, alternating order, every config beside the other.
    stage = server.steps[searched : searched + 6]
    assert [point for point, _, _ in stage] == [DEFAULT, FASTER, FASTER, DEFAULT, DEFAULT, FASTER]
    assert len(server.steps) == searched + 3 * 6  # the first stage and two step downs
    default, faster = confirmed
    assert default.why_not(10.0) == "" and default.rate == default.found.rate
    assert faster.why_not(10.0).startswith("median p99 ") and "over the budget" in faster.why_not(10.0)
    rates = [t["rate"] for t in faster.tries]
    assert rates == [faster.found.rate, round(faster.found.rate * STEP_DOWN, 1), faster.rate]
    assert faster.rate == round(rates[1] * STEP_DOWN, 1)


def test_a_config_over_the_budget_side_by_side_steps_down_to_a_rate_that_holds() -> None:
    # 1.5x slower side by side: over the budget at its edge, within it a step down.
    server = _Server(worse_side_by_side=frozenset({FASTER}), factor=1.5)
    found = search_capacities(server, [DEFAULT, FASTER], [64], POLICY)
    server.confirming = True
    default, faster = confirm_capacities(server, finalists_of(found, DEFAULT, 3), POLICY)
    assert [t["why_not"] == "" for t in faster.tries] == [False, True]
    assert faster.why_not(10.0) == "" and faster.rate == round(faster.found.rate * STEP_DOWN, 1)
    assert faster.offered_samples_per_s > default.offered_samples_per_s  # still the winner
    assert faster.as_dict(10.0)["search_rate"] == faster.found.rate


def test_the_report_and_apply_read_what_the_search_wrote(tmp_path: Path) -> None:
    server = _Server()
    found = search_capacities(server, [DEFAULT, SLOWER, FASTER], [64], POLICY)
    server.confirming = True
    confirmed = confirm_capacities(server, finalists_of(found, DEFAULT, 3), POLICY)
    winner = max(confirmed, key=lambda c: c.found.samples_per_s)
    document = {
        "command": "python -m loadtest tune --objective capacity",
        "started": "2026-11-28T00:00:00Z",
        "finished": "2026-11-28T00:01:00Z",
        "machine": {"cpu": "test", "python": "3.11"},
        "load_start": [0.0, 0.0, 0.0],
        "objective": "capacity",
        "family": "dlrm",
        "budget_ms": 10.0,
        "policy": {
            "start_rate": 20.0,
            "resolution": 0.05,
            "max_rate": 1e5,
            "rounds": 3,
            "finalists": 3,
            "per_step": "1 s measured",
        },
        "space": {"server_points": 3, "batch_sizes": [64]},
        "default": {
            "server": DEFAULT.as_dict(),
            "label": DEFAULT.label,
            "confirmed": {**confirmed[0].as_dict(10.0), "diff": ""},
        },
        "winner": {**winner.as_dict(10.0), "model": "dlrm_onnx_int8", "diff": "-  count: 1\n+  count: 2\n"},
        "finalists": [c.as_dict(10.0) for c in confirmed],
        "searched": [f.as_dict() for f in found],
        "steps_measured": len(server.steps),
    }
    assert _server_of(document["winner"]["server"]) == FASTER  # what --apply writes
    paths = write_capacity_tune(document, tmp_path)
    markdown = paths["markdown"].read_text()
    assert f"--8<-- [start:{SECTION_WINNER}]" in markdown
    assert f"Winner: **{FASTER.label}** at B=64" in markdown and "x the default's capacity" in markdown
    assert "dominated: did not hold" in markdown and "```diff" in markdown
    assert paths["png"].stat().st_size > 0 and paths["json"].is_file()
    document["winner"] = None
    assert any("No configuration held a p99 of 10 ms" in line for line in report_lines(document))


def test_the_policy_refuses_what_cannot_be_searched() -> None:
    with pytest.raises(ConfigError, match="Poisson"):
        CapacityPolicy(10.0, RateLoad(arrival="constant"))
    with pytest.raises(ConfigError, match="--p99-budget-ms"):
        CapacityPolicy(0.0)
    with pytest.raises(ConfigError, match="rounds and finalists"):
        CapacityPolicy(10.0, rounds=0)
    with pytest.raises(ConfigError, match="step_downs >= 0"):
        CapacityPolicy(10.0, step_downs=-1)
