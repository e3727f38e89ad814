"""Raw request latencies in a mergeable log-bucket histogram, and their percentiles.

locust rounds the response times it keeps to whole milliseconds (and coarser
above 100 ms), too coarse for a sub-millisecond round trip. Every locust
process records each request's exact latency here instead: a bucket's width
is 0.2 % of its value from 1 us to about 8 minutes, so a percentile read
back is within 0.1 % of the true sample, whatever the run's length, in a
fixed 10,000-bucket array that processes add up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import DataError

#: The smallest latency told apart from zero (anything faster lands in bucket 0).
MIN_MS = 1e-3
#: Relative width of one bucket.
GROWTH = 1.002
BUCKETS = 10_000
#: Percentiles every report shows.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)

_LOG_GROWTH = math.log(GROWTH)


def bucket_of(latency_ms: float) -> int:
    """The bucket index of one latency (clamped into the histogram's range)."""
    if latency_ms <= MIN_MS:
        return 0
    return min(int(math.log(latency_ms / MIN_MS) / _LOG_GROWTH) + 1, BUCKETS - 1)


def bucket_value(index: int) -> float:
    """The value a bucket stands for: the geometric middle of its bounds, in ms."""
    if index <= 0:
        return MIN_MS
    return MIN_MS * GROWTH ** (index - 0.5)


class LatencyHistogram:
    """Counts of request latencies in log-spaced buckets, plus exact count, sum, min and max.

    Percentiles come back as bucket values clamped to ``[min, max]``, so they
    are ordered (``p50 <= p90 <= p95 <= p99``) and within half a bucket
    (0.1 %) of the exact sample percentile.
    """

    def __init__(self) -> None:
        self.counts = np.zeros(BUCKETS, dtype=np.int64)
        self.count = 0
        self.sum_ms = 0.0
        self.min_ms = math.inf
        self.max_ms = 0.0

    def record(self, latency_ms: float) -> None:
        """Add one latency in milliseconds."""
        self.counts[bucket_of(latency_ms)] += 1
        self.count += 1
        self.sum_ms += latency_ms
        self.min_ms = min(self.min_ms, latency_ms)
        self.max_ms = max(self.max_ms, latency_ms)

    def record_many(self, latencies_ms: Iterable[float]) -> None:
        """Add several latencies."""
        for latency in latencies_ms:
            self.record(latency)

    def merge(self, other: LatencyHistogram) -> None:
        """Add every count of ``other`` to this histogram."""
        self.counts += other.counts
        self.count += other.count
        self.sum_ms += other.sum_ms
        self.min_ms = min(self.min_ms, other.min_ms)
        self.max_ms = max(self.max_ms, other.max_ms)

    @property
    def mean_ms(self) -> float:
        return self.sum_ms / self.count if self.count else math.nan

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100) in ms: the smallest bucket holding at least q % of
        the latencies (nearest-rank); NaN when empty."""
        if not 0.0 <= q <= 100.0:
            raise DataError(f"percentile must be in [0, 100], got {q}")
        if self.count == 0:
            return math.nan
        rank = max(1, math.ceil(q / 100.0 * self.count))
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        return min(max(bucket_value(index), self.min_ms), self.max_ms)

    def percentiles(self, qs: Sequence[float] = PERCENTILES) -> dict[float, float]:
        """Several percentiles at once, keyed by ``q``."""
        return {q: self.percentile(q) for q in qs}

    # ------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form; only non-empty buckets are listed."""
        nonzero = np.flatnonzero(self.counts)
        return {
            "min_ms": MIN_MS,
            "growth": GROWTH,
            "buckets": BUCKETS,
            "count": self.count,
            "sum_ms": self.sum_ms,
            "min": None if self.count == 0 else self.min_ms,
            "max": self.max_ms,
            "nonzero": {str(int(i)): int(self.counts[i]) for i in nonzero},
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> LatencyHistogram:
        """Read what :meth:`to_json` wrote (with the same bucket layout)."""
        layout = (document.get("min_ms"), document.get("growth"), document.get("buckets"))
        if layout != (MIN_MS, GROWTH, BUCKETS):
            raise DataError(
                f"latency histogram has bucket layout {layout}, expected {(MIN_MS, GROWTH, BUCKETS)}"
            )
        histogram = cls()
        for index, count in document.get("nonzero", {}).items():
            histogram.counts[int(index)] = int(count)
        histogram.count = int(document["count"])
        histogram.sum_ms = float(document["sum_ms"])
        histogram.min_ms = math.inf if document.get("min") is None else float(document["min"])
        histogram.max_ms = float(document["max"])
        if int(histogram.counts.sum()) != histogram.count:
            raise DataError("latency histogram is inconsistent: bucket counts do not add up to its count")
        return histogram

    def save(self, path: Path) -> None:
        """Write the histogram as JSON."""
        path.write_text(json.dumps(self.to_json()))

    @classmethod
    def load(cls, path: Path) -> LatencyHistogram:
        """Read a histogram written by :meth:`save`."""
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"cannot read latency histogram {path}: {exc}") from None
        return cls.from_json(document)


def merged(histograms: Iterable[LatencyHistogram]) -> LatencyHistogram:
    """One histogram holding every count of ``histograms``."""
    total = LatencyHistogram()
    for histogram in histograms:
        total.merge(histogram)
    return total
