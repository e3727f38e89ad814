"""The in-process timer: repeats, warm-up, turns between candidates, rates and latencies."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from bundle.errors import ConfigError
from loadtest.engine.timer import TimerConfig, time_call, time_calls


def test_each_repeat_runs_for_its_seconds_and_gives_a_rate_of_units_per_second() -> None:
    calls: list[int] = []

    def call(index: int) -> None:
        calls.append(index)
        time.sleep(0.002)

    timing = time_call(call, units=64, config=TimerConfig(repeats=3, seconds=0.05, warmup_calls=2))

    # Call indexes run on from the warm-up; only timed calls are in the histogram.
    assert calls == list(range(len(calls))) and timing.calls == len(calls) - 2
    assert len(timing.rates) == 3
    # About 2 ms a call: at most 64 / 0.002 = 32,000 units/s, and well above zero.
    assert all(2_000 < rate <= 32_000 for rate in timing.rates)
    assert timing.median == sorted(timing.rates)[1]
    assert 2.0 <= timing.percentile_ms(50) <= timing.percentile_ms(99)


def test_seconds_zero_times_exactly_min_calls_per_repeat() -> None:
    calls: list[int] = []
    timing = time_call(calls.append, 1.0, TimerConfig(repeats=4, seconds=0.0, warmup_calls=1, min_calls=1))
    assert len(calls) == 5 and timing.calls == 4 and len(timing.rates) == 4


def test_candidates_take_turns_round_by_round_after_all_warm_up() -> None:
    order: list[str] = []

    def candidate(name: str) -> Callable[[int], None]:
        return lambda index: order.append(f"{name}{index}")

    config = TimerConfig(repeats=2, seconds=0.0, warmup_calls=1, min_calls=2)
    timings = time_calls({"a": candidate("a"), "b": candidate("b")}, {"a": 1.0, "b": 2.0}, config)

    # Warm-up of each, then round 1 (a, b), then round 2 (a, b); each counts its own calls.
    assert order == ["a0", "b0", "a1", "a2", "b1", "b2", "a3", "a4", "b3", "b4"]
    assert list(timings) == ["a", "b"] and all(t.calls == 4 for t in timings.values())
    assert all(len(t.rates) == 2 for t in timings.values())


def test_bad_settings_fail_where_they_are_set() -> None:
    with pytest.raises(ConfigError, match="repeats"):
        TimerConfig(repeats=0)
    with pytest.raises(ConfigError, match="seconds"):
        TimerConfig(seconds=-1.0)
    with pytest.raises(ConfigError, match="min_calls"):
        TimerConfig(min_calls=0)
    with pytest.raises(ConfigError, match="nothing to time"):
        time_calls({}, 1.0, TimerConfig())
    with pytest.raises(ConfigError, match="units per call"):
        time_call(lambda index: None, 0.0, TimerConfig())
