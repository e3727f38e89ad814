"""Confidence intervals that decide a tuning step early: throughput from its windows, p99 from its latencies.

One step of :mod:`loadtest.tune.search` is a run of consecutive measurement windows
of the closed-loop driver (:meth:`loadtest.engine.driver.Driver.measure`), each a
:class:`~loadtest.engine.latency.Tally`. Two intervals say whether more windows can
change the step's verdict:

- throughput: a Student-t interval over the per-window samples/s. Windows of
  one closed loop are close to independent once each holds many requests;
  the t interval (not a normal one) keeps three windows honest.
- p99: a distribution-free interval from order statistics of all the step's
  latencies (the rank of the 99th percentile is binomial, ``n q`` +- ``z
  sqrt(n q (1 - q))``), read from the step's merged histogram. Below about 300
  requests no order statistic bounds the p99 from above; the upper bound is
  then the largest latency seen (every request under the budget is the best
  evidence such a short step can give).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bundle.errors import ConfigError
from loadtest.engine.latency import Tally, merged_tallies

#: Two-sided 95 % Student-t quantiles by degrees of freedom (1..30); beyond 30 the normal 1.96
#: is within 4 %. A table, not scipy, which the bundle does not depend on.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z95 = 1.959964
#: The latency percentile a budget is stated for.
QUANTILE = 99.0


def t95(df: int) -> float:
    """The two-sided 95 % Student-t quantile for ``df`` degrees of freedom (>= 1)."""
    if df < 1:
        raise ConfigError(f"a t interval needs at least 2 windows (df >= 1), got df={df}")
    return _T95[df - 1] if df <= len(_T95) else Z95


@dataclass(frozen=True)
class Interval:
    """An estimate and its 95 % confidence interval ``[low, high]``."""

    value: float
    low: float
    high: float

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over the estimate (inf for a zero estimate)."""
        return (self.high - self.low) / 2 / self.value if self.value > 0 else math.inf


def rate_interval(rates: Sequence[float]) -> Interval:
    """Mean samples/s of the windows and its t interval (one window: an unbounded interval)."""
    if not rates:
        raise ConfigError("no windows to estimate a rate from")
    mean = statistics.fmean(rates)
    if len(rates) < 2:
        return Interval(mean, 0.0, math.inf)
    half = t95(len(rates) - 1) * statistics.stdev(rates) / math.sqrt(len(rates))
    return Interval(mean, max(0.0, mean - half), mean + half)


def quantile_interval(tally: Tally, q: float = QUANTILE) -> Interval:
    """The ``q``-th latency percentile (ms) of ``tally`` and its distribution-free 95 % interval.

    Ranks ``n q/100 -+ z sqrt(n p (1-p))`` of the sorted latencies bound the
    percentile; a lower rank below 1 gives the smallest latency, an upper rank
    above ``n`` the largest (see the module doc). No answers: NaN.
    """
    histogram = tally.histogram
    n = histogram.count
    if n == 0:
        return Interval(math.nan, math.nan, math.nan)
    p = q / 100.0
    spread = Z95 * math.sqrt(n * p * (1.0 - p))
    low_rank = math.floor(n * p - spread)
    high_rank = math.ceil(n * p + spread) + 1
    low = histogram.min_ms if low_rank < 1 else histogram.percentile(100.0 * low_rank / n)
    high = histogram.max_ms if high_rank > n else histogram.percentile(100.0 * high_rank / n)
    return Interval(histogram.percentile(q), low, high)


@dataclass(frozen=True)
class StepEstimate:
    """What a step's windows so far say.

    Attributes:
        rate: samples/s (mean of the windows) and its interval.
        p99: the 99th percentile latency (ms) over every window, and its interval.
        p50_ms: the median latency over every window.
        windows: windows measured.
        requests: answered requests over every window.
        errors: failed requests over every window.
    """

    rate: Interval
    p99: Interval
    p50_ms: float
    windows: int
    requests: int
    errors: int


def estimate(windows: Sequence[Tally]) -> StepEstimate:
    """The intervals of a step's windows."""
    tally = merged_tallies(windows)
    return StepEstimate(
        rate=rate_interval([w.samples_per_s for w in windows]),
        p99=quantile_interval(tally),
        p50_ms=tally.histogram.percentile(50.0) if tally.histogram.count else math.nan,
        windows=len(windows),
        requests=tally.answered,
        errors=tally.errors,
    )
