"""A bounded load loop: client threads that send known batches, check every answer, count outcomes.

Used by the soak (:mod:`benchmarks.soak.soak`) and by the fault tests
(``tests/integration/test_reliability.py``). Each worker thread owns one
:class:`clients.triton.TritonClient` (HTTP or gRPC, retries on UNAVAILABLE by
its :class:`~clients.retry.RetryPolicy`), draws a :class:`Case` at random,
infers it and compares the answer with every answer the case allows (e.g. the
old and the new version of a model during a reload): the label of the first
that matches is recorded; no match counts as *wrong*, an exception that
survived the retries as an *error*.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bundle.errors import BundleError, ConfigError
from clients.options import Protocol
from clients.retry import RetryPolicy
from clients.triton import TritonClient
from criteo.tsv import Batch

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Case:
    """One request the loop may send, with the answers it accepts.

    Args:
        model: model name.
        batch: the inputs (``B x 13`` dense, ``B x 26`` ids).
        answers: accepted ``B x 1`` outputs by label (e.g. ``{"v1": ..., "v2": ...}``).
        atol: largest absolute difference that still matches.
    """

    model: str
    batch: Batch
    answers: Mapping[str, np.ndarray]
    atol: float = 1e-6

    def __post_init__(self) -> None:
        if not self.answers:
            raise ConfigError(f"case for model {self.model!r} accepts no answer")
        for label, answer in self.answers.items():
            if answer.shape != (len(self.batch), 1):
                raise ConfigError(
                    f"answer {label!r} of model {self.model!r} has shape {answer.shape}, "
                    f"expected ({len(self.batch)}, 1)"
                )

    def label(self, output: np.ndarray) -> str | None:
        """The label of the accepted answer ``output`` matches, or None."""
        if output.shape != (len(self.batch), 1):
            return None
        for label, answer in self.answers.items():
            if np.all(np.abs(output - answer) <= self.atol):
                return label
        return None


@dataclass(frozen=True)
class Worker:
    """One client thread: where it sends and over which protocol."""

    url: str
    protocol: Protocol


@dataclass
class LoadStats:
    """What the loop saw, over all workers.

    Attributes:
        requests: requests sent (each counted once, however often it was retried).
        ok: answered with an accepted answer.
        wrong: answered, but with no accepted answer.
        errors: failed after the client's retries.
        error_kinds: error messages (first 160 characters) and how often each came.
        labels: accepted answers by label.
        latencies_s: wall time of every answered request, retries included.
        timelines: per worker, ``(time since start, label)`` of each accepted answer.
        first_error_s / last_error_s: when errors came, seconds since start.
    """

    requests: int = 0
    ok: int = 0
    wrong: int = 0
    errors: int = 0
    rows: int = 0
    error_kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    labels: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies_s: list[float] = field(default_factory=list)
    timelines: dict[int, list[tuple[float, str]]] = field(default_factory=dict)
    first_error_s: float | None = None
    last_error_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Counts and latency percentiles (ms), JSON-ready."""
        latencies = np.asarray(self.latencies_s) * 1e3
        percentiles = (
            {f"p{q}": round(float(np.percentile(latencies, q)), 3) for q in (50, 90, 99, 99.9)}
            if latencies.size
            else {}
        )
        return {
            "requests": self.requests,
            "ok": self.ok,
            "wrong": self.wrong,
            "errors": self.errors,
            "rows": self.rows,
            "error_kinds": dict(self.error_kinds.most_common(10)),
            "answers_by_label": dict(self.labels),
            "latency_ms": percentiles,
            "first_error_s": self.first_error_s,
            "last_error_s": self.last_error_s,
        }


class LoadLoop:
    """Worker threads sending :class:`Case` requests until :meth:`stop`.

    Args:
        workers: one thread per entry.
        cases: the requests to draw from (uniformly at random).
        rate: requests per second over all workers; 0 sends as fast as each
            worker's answers come back (closed loop).
        retry: each client's retry policy on UNAVAILABLE.
        timeout_s: each call's network timeout.
        seed: of the case draws.

    Use as a context manager, or ``start()`` / ``stop()``; ``stats`` is safe to
    read only after ``stop()``.
    """

    def __init__(
        self,
        workers: Sequence[Worker],
        cases: Sequence[Case],
        rate: float = 0.0,
        retry: RetryPolicy | None = None,
        timeout_s: float = 10.0,
        seed: int = 0,
    ) -> None:
        if not workers:
            raise ConfigError("the load loop needs at least one worker")
        if not cases:
            raise ConfigError("the load loop needs at least one case")
        if rate < 0:
            raise ConfigError(f"rate must be >= 0, got {rate!r}")
        self._workers = list(workers)
        self._cases = list(cases)
        self._interval_s = len(self._workers) / rate if rate > 0 else 0.0
        self._retry = retry or RetryPolicy()
        self._timeout_s = timeout_s
        self._seed = seed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = 0.0
        self._failures: list[BaseException] = []
        self.stats = LoadStats()

    def __enter__(self) -> LoadLoop:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def elapsed_s(self) -> float:
        """Seconds since :meth:`start`."""
        return time.monotonic() - self._started

    def start(self) -> LoadLoop:
        """Start every worker thread; returns at once."""
        self._started = time.monotonic()
        for index, worker in enumerate(self._workers):
            self.stats.timelines[index] = []
            thread = threading.Thread(
                target=self._run, args=(index, worker), name=f"load-{index}-{worker.protocol}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> LoadStats:
        """Ask the workers to finish their request in flight, wait for them, return the stats.

        Raises:
            RuntimeError: a worker thread died of something other than a failed
                request (a bug), or did not finish within ``timeout_s``.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        if alive:
            raise RuntimeError(f"load workers {alive} did not stop within {timeout_s} s")
        if self._failures:
            raise RuntimeError(f"a load worker failed: {self._failures[0]!r}") from self._failures[0]
        return self.stats

    def _run(self, index: int, worker: Worker) -> None:
        rng = np.random.default_rng(self._seed + index)
        try:
            client = TritonClient(worker.url, worker.protocol, self._timeout_s, retry=self._retry)
        except BaseException as exc:  # reported by stop(), never lost with the thread
            self._failures.append(exc)
            return
        next_send = time.monotonic() + rng.uniform(0, self._interval_s)
        try:
            while not self._stop.is_set():
                if self._interval_s:
                    delay = next_send - time.monotonic()
                    if delay > 0 and self._stop.wait(delay):
                        break
                    next_send = max(next_send + self._interval_s, time.monotonic() - self._interval_s)
                self._one(index, client, self._cases[int(rng.integers(len(self._cases)))])
        except BaseException as exc:  # reported by stop()
            self._failures.append(exc)
        finally:
            client.close()

    def _one(self, index: int, client: TritonClient, case: Case) -> None:
        sent = time.monotonic()
        try:
            output = client.infer(case.model, case.batch.inputs())
        except BundleError as exc:
            now = time.monotonic() - self._started
            with self._lock:
                self.stats.requests += 1
                self.stats.errors += 1
                self.stats.error_kinds[str(exc)[:160]] += 1
                self.stats.first_error_s = self.stats.first_error_s or now
                self.stats.last_error_s = now
            logger.debug("worker %d: %s", index, exc)
            return
        done = time.monotonic()
        label = case.label(output)
        with self._lock:
            self.stats.requests += 1
            self.stats.latencies_s.append(done - sent)
            if label is None:
                self.stats.wrong += 1
            else:
                self.stats.ok += 1
                self.stats.rows += len(case.batch)
                self.stats.labels[label] += 1
                self.stats.timelines[index].append((done - self._started, label))
