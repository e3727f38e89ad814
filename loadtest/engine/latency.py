"""Raw request latencies in a mergeable log-bucket histogram, their percentiles, and the tally
of one measurement window (the histogram and the request counts every load generator keeps).

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
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import DataError
from loadtest.engine.client_cpu import ClientCpu

#: The smallest latency told apart from zero (anything faster lands in bucket 0).
MIN_MS = 1e-3
#: Relative width of one bucket.
GROWTH = 1.002
BUCKETS = 10_000
#: Percentiles every report shows.
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
#: Percentiles a tally's summary lists (the long runs of the soak reach 99.9).
SUMMARY_PERCENTILES: tuple[float, ...] = (*PERCENTILES, 99.9)
#: Error messages are counted by their first line, cut to this length.
ERROR_KIND_CHARS = 200

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


def error_kind(error: BaseException | str) -> str:
    """The first line of an error message (its type's name when empty), cut short: how errors are counted."""
    text = str(error)
    first = (text.splitlines() or [type(error).__name__ if isinstance(error, BaseException) else ""])[0]
    return first[:ERROR_KIND_CHARS]


@dataclass
class Tally:
    """What one measurement saw: the latency of every answered request in one histogram, and counts.

    The locust users (one per process, :mod:`loadtest.sweeps.recorder`) and the
    closed-loop driver (:mod:`loadtest.engine.driver`) both keep one per window;
    tallies of several processes or windows add up with :meth:`merge`.

    Attributes:
        histogram: latency (ms) of every answered request, accepted or wrong.
        answered: requests that got an answer.
        wrong: answers that matched none of the accepted ones (a load test that checks answers).
        errors: requests that failed.
        rows: rows of the accepted answers.
        labels: accepted answers by label (e.g. which model version answered).
        error_kinds: errors by :func:`error_kind`.
        seconds: how long the window was open.
        first_error_s, last_error_s: when errors came, in the clock of whoever records them.
        client: the load generator's CPU over the window, where its recorder measured it (the
            closed-loop driver does; a merged tally has none).
        serial_s, serial_count: the serial client time of the answered requests whose sender
            measured it (from its previous answer's arrival to this request's send), added up,
            and how many they were.
    """

    histogram: LatencyHistogram = field(default_factory=LatencyHistogram)
    answered: int = 0
    wrong: int = 0
    errors: int = 0
    rows: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    error_kinds: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    first_error_s: float | None = None
    last_error_s: float | None = None
    client: ClientCpu | None = None
    serial_s: float = 0.0
    serial_count: int = 0

    @property
    def requests(self) -> int:
        """Requests that completed, answered or failed."""
        return self.answered + self.errors

    @property
    def ok(self) -> int:
        """Requests answered with an accepted answer."""
        return self.answered - self.wrong

    def answer(self, latency_ms: float, rows: int = 1, label: str | None = "ok") -> None:
        """Count one answered request; ``label`` None: a wrong answer (its rows are not counted)."""
        self.histogram.record(latency_ms)
        self.answered += 1
        if label is None:
            self.wrong += 1
            return
        self.rows += rows
        self.labels[label] += 1

    def serial(self, seconds: float) -> None:
        """Count one request's serial client time (a NaN, not measured, is not counted)."""
        if seconds == seconds:
            self.serial_s += seconds
            self.serial_count += 1

    @property
    def serial_us(self) -> float:
        """The mean serial client time per request (us; NaN: none measured)."""
        return self.serial_s / self.serial_count * 1e6 if self.serial_count else math.nan

    def error(self, error: BaseException | str, at_s: float | None = None) -> None:
        """Count one failed request (``at_s``: when, for the first and last error times)."""
        self.errors += 1
        self.error_kinds[error_kind(error)] += 1
        if at_s is not None:
            self.first_error_s = at_s if self.first_error_s is None else self.first_error_s
            self.last_error_s = at_s

    def merge(self, other: Tally) -> None:
        """Add ``other``'s requests (its window's seconds too)."""
        self.histogram.merge(other.histogram)
        self.answered += other.answered
        self.wrong += other.wrong
        self.errors += other.errors
        self.rows += other.rows
        self.labels.update(other.labels)
        self.error_kinds.update(other.error_kinds)
        self.seconds += other.seconds
        self.serial_s += other.serial_s
        self.serial_count += other.serial_count
        firsts = [t for t in (self.first_error_s, other.first_error_s) if t is not None]
        lasts = [t for t in (self.last_error_s, other.last_error_s) if t is not None]
        self.first_error_s = min(firsts) if firsts else None
        self.last_error_s = max(lasts) if lasts else None

    @property
    def requests_per_s(self) -> float:
        """Accepted answers per second of the window (NaN before it has a length)."""
        return self.ok / self.seconds if self.seconds > 0 else math.nan

    @property
    def samples_per_s(self) -> float:
        """Rows of accepted answers per second of the window."""
        return self.rows / self.seconds if self.seconds > 0 else math.nan

    def latency_ms(self, qs: Sequence[float] = SUMMARY_PERCENTILES) -> dict[str, float]:
        """``p50``, ``p90``, ... (``p99.9``), ``mean`` and ``max`` in ms; empty when nothing was answered."""
        if not self.histogram.count:
            return {}
        values = {f"p{q:g}": round(v, 3) for q, v in self.histogram.percentiles(qs).items()}
        return {**values, "mean": round(self.histogram.mean_ms, 3), "max": round(self.histogram.max_ms, 3)}

    def summary(self) -> dict[str, Any]:
        """Counts, rates and latency percentiles, JSON-ready (the histogram itself left out)."""
        return {
            "requests": self.requests,
            "ok": self.ok,
            "wrong": self.wrong,
            "errors": self.errors,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "requests_per_s": self.requests_per_s,
            "samples_per_s": self.samples_per_s,
            "latency_ms": self.latency_ms(),
            "answers_by_label": dict(self.labels),
            "error_kinds": dict(self.error_kinds.most_common(10)),
            "first_error_s": self.first_error_s,
            "last_error_s": self.last_error_s,
        }

    def to_json(self) -> dict[str, Any]:
        """Everything, histogram included (what :meth:`from_json` reads back)."""
        return {
            "histogram": self.histogram.to_json(),
            "answered": self.answered,
            "wrong": self.wrong,
            "errors": self.errors,
            "rows": self.rows,
            "labels": dict(self.labels),
            "error_kinds": dict(self.error_kinds),
            "seconds": self.seconds,
            "first_error_s": self.first_error_s,
            "last_error_s": self.last_error_s,
            "serial_s": self.serial_s,
            "serial_count": self.serial_count,
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Tally:
        try:
            return cls(
                histogram=LatencyHistogram.from_json(document["histogram"]),
                answered=int(document["answered"]),
                wrong=int(document["wrong"]),
                errors=int(document["errors"]),
                rows=int(document["rows"]),
                labels=Counter({str(k): int(v) for k, v in document.get("labels", {}).items()}),
                error_kinds=Counter({str(k): int(v) for k, v in document.get("error_kinds", {}).items()}),
                seconds=float(document.get("seconds", 0.0)),
                first_error_s=document.get("first_error_s"),
                last_error_s=document.get("last_error_s"),
                serial_s=float(document.get("serial_s", 0.0)),
                serial_count=int(document.get("serial_count", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"not a tally: {exc}") from None


def merged_tallies(tallies: Iterable[Tally]) -> Tally:
    """One tally holding every request of ``tallies`` (their seconds added up)."""
    total = Tally()
    for tally in tallies:
        total.merge(tally)
    return total
