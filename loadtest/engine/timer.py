"""The in-process timer: calls timed back to back in repeats, several candidates taking turns.

Every in-process number of the bundle comes from here: the ONNX Runtime
baseline that served numbers are divided by (:mod:`loadtest.engine.baseline`), the
roofline's sgemm ceiling and GEMM probes (:mod:`loadtest.roofline`), the
precision variants and the graph optimization levels of the CPU benchmarks.

A repeat calls one candidate until ``seconds`` have passed and at least
``min_calls`` calls ran, and gives its rate: ``calls x units / elapsed``
(``units`` per call: rows for samples/s, FLOPs / 1e9 for GFLOP/s). With
several candidates each round gives every one of them one repeat, in turn, so
a burst of background load on a shared machine hits them alike; the median
repeat is the candidate's figure. Every timed call's latency goes into one
:class:`~loadtest.engine.latency.LatencyHistogram`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bundle.errors import ConfigError
from loadtest.engine.latency import LatencyHistogram

#: One call of a timed candidate; its argument counts the calls (to pick a batch from a pool).
Call = Callable[[int], object]


@dataclass(frozen=True)
class TimerConfig:
    """How long and how often to time.

    Args:
        repeats: timed repeats (rounds) per candidate; the median is reported.
        seconds: length of one repeat (0: exactly ``min_calls`` calls).
        warmup_calls: untimed calls of each candidate before the first repeat.
        min_calls: calls a repeat makes at least, however long they take.
    """

    repeats: int = 5
    seconds: float = 1.0
    warmup_calls: int = 3
    min_calls: int = 3

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"repeats must be >= 1, got {self.repeats}")
        if self.seconds < 0:
            raise ConfigError(f"seconds must be >= 0, got {self.seconds}")
        if self.warmup_calls < 0:
            raise ConfigError(f"warmup_calls must be >= 0, got {self.warmup_calls}")
        if self.min_calls < 1:
            raise ConfigError(f"min_calls must be >= 1, got {self.min_calls}")


@dataclass
class Timing:
    """One candidate's repeats.

    Attributes:
        rates: each repeat's ``units`` per second.
        histogram: the latency of every timed call, ms.
    """

    rates: list[float] = field(default_factory=list)
    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)

    @property
    def median(self) -> float:
        """The median repeat's rate."""
        return statistics.median(self.rates)

    @property
    def calls(self) -> int:
        return self.histogram.count

    def percentile_ms(self, q: float) -> float:
        return self.histogram.percentile(q)


def _repeat(call: Call, units: float, config: TimerConfig, timing: Timing, first: int) -> int:
    """One repeat of ``call``; its rate and latencies go into ``timing``; returns the next call index."""
    histogram = timing.histogram
    calls = 0
    started = time.perf_counter()
    deadline = started + config.seconds
    while True:
        before = time.perf_counter()
        call(first + calls)
        after = time.perf_counter()
        histogram.record((after - before) * 1000.0)
        calls += 1
        if after >= deadline and calls >= config.min_calls:
            break
    timing.rates.append(calls * units / (after - started))
    return first + calls


def time_calls(
    calls: Mapping[str, Call], units: float | Mapping[str, float], config: TimerConfig
) -> dict[str, Timing]:
    """Time every candidate of ``calls``, in turns (see the module doc).

    Args:
        calls: candidates by name; each is called with a running call index.
        units: work of one call (the same for all, or per name).
        config: repeats, seconds, warm-up and minimum calls.

    Returns:
        Each candidate's :class:`Timing`, in the order of ``calls``.
    """
    if not calls:
        raise ConfigError("nothing to time")
    work = {name: units[name] if isinstance(units, Mapping) else units for name in calls}
    if any(not value > 0 for value in work.values()):
        raise ConfigError(f"units per call must be > 0, got {work}")
    index = dict.fromkeys(calls, 0)
    for name, call in calls.items():
        for _ in range(config.warmup_calls):
            call(index[name])
            index[name] += 1
    timings = {name: Timing() for name in calls}
    for _ in range(config.repeats):
        for name, call in calls.items():
            index[name] = _repeat(call, work[name], config, timings[name], index[name])
    return timings


def time_call(call: Call, units: float, config: TimerConfig) -> Timing:
    """Time one candidate (:func:`time_calls` with one entry)."""
    return time_calls({"": call}, units, config)[""]
