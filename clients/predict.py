"""Predictions for a whole file through the server: stream, infer, write in input order.

``python -m clients infer`` is :func:`predict_file`; ``clients evaluate`` uses
:func:`run_file` with a sink that keeps labels and probabilities. The file is
read batch by batch (never whole), sent over the sync client (one request in
flight) or the asyncio client (up to ``max_in_flight``), and every answer
reaches the sink in input order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Literal

import numpy as np

from bundle.errors import ClientError, ConfigError
from bundle.schema import OUTPUT
from clients.aio import AsyncTritonClient
from clients.batching import Rows, bag_file_batches, file_batches, row_text_batches
from clients.options import ClientOptions
from clients.triton import TritonClient
from clients.validation import ModelSpec

logger = logging.getLogger(__name__)

Mode = Literal["sync", "async"]
MODES: tuple[str, ...] = ("sync", "async")

#: Receives each batch with its ``B x 1`` probabilities, in input order.
Sink = Callable[[Rows, np.ndarray], None]


@dataclass(frozen=True)
class PredictOptions:
    """How a file is sent.

    Args:
        batch_size: rows per request (at most the model's ``max_batch_size``).
        mode: ``sync`` (one request in flight) or ``async`` (asyncio client).
        max_in_flight: requests pending at once in ``async`` mode.
        max_rows: stop after this many rows (the whole file when None).
        raw: send each row's text as it is (to a raw-row model, ``<model>_raw``, which parses
            it in the server), not the tensors the client makes of it.
    """

    batch_size: int = 1024
    mode: Mode = "sync"
    max_in_flight: int = 4
    max_rows: int | None = None
    raw: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be sync or async, got {self.mode!r}")
        if not isinstance(self.max_in_flight, int) or self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be an integer >= 1, got {self.max_in_flight!r}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigError(f"max_rows must be >= 1, got {self.max_rows!r}")


@dataclass(frozen=True)
class RunSummary:
    """What one pass over a file did.

    Attributes:
        model: model name.
        rows: rows inferred.
        batches: requests sent.
        seconds: wall time of the pass (reading and preprocessing included).
    """

    model: str
    rows: int
    batches: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def run_file(
    client: ClientOptions, model: str, path: Path | str, options: PredictOptions, sink: Sink
) -> RunSummary:
    """Send every row of ``path`` to ``model``; hand each answer to ``sink`` in input order.

    Args:
        client: the server endpoint and connection options.
        model: model name.
        path: a Criteo TSV file (labeled or not); for a model of bags (its config's ``hotness``),
            a file of the multi-hot text format (:mod:`criteo.multihot`).
        options: batch size, sync/async, requests in flight, row limit.
        sink: called with ``(batch, B x 1 probabilities)`` per batch, in file order.

    Raises:
        ClientError: server down, unknown or not-ready model, a rejected request.
        DataError: a malformed row (with its file:line).
    """
    started = time.perf_counter()
    batches: Iterable[Rows]
    if options.raw:
        batches = row_text_batches(path, options.batch_size, options.max_rows)
    elif (spec := _bag_model(client, model)) is not None:
        batches = bag_file_batches(path, options.batch_size, options.max_rows, spec.hotness)
    else:
        batches = file_batches(path, options.batch_size, options.max_rows)
    if options.mode == "sync":
        rows = count = 0
        with TritonClient.from_options(client) as sync_client:
            for batch, probabilities in sync_client.infer_batches(model, batches):
                sink(batch, probabilities)
                rows += len(batch)
                count += 1
    else:
        rows, count = asyncio.run(_run_async(client, model, batches, options.max_in_flight, sink))
    return RunSummary(model, rows, count, time.perf_counter() - started)


def _bag_model(client: ClientOptions, model: str) -> ModelSpec | None:
    """``model``'s spec when it takes bags (a fixed hotness, or any size): its rows are then read in
    the multi-hot text format. None for a model of one id per table."""
    with TritonClient.from_options(client) as probe:
        spec = probe.model_spec(model)
    return spec if spec.hotness is not None or spec.variable_bags else None


async def _run_async(
    client: ClientOptions, model: str, batches: Iterable[Rows], max_in_flight: int, sink: Sink
) -> tuple[int, int]:
    rows = count = 0
    async with AsyncTritonClient.from_options(client) as async_client:
        async for batch, probabilities in async_client.infer_batches(model, batches, max_in_flight):
            sink(batch, probabilities)
            rows += len(batch)
            count += 1
    return rows, count


class ProbabilityWriter:
    """Writes one probability per row as CSV (header ``click_probability``).

    Into a file: written to a temporary file beside it and renamed on success,
    so a failed run leaves no half-written output. ``None``: standard output.

    Args:
        path: the CSV file, or None for standard output.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._temp: Path | None = None
        self._handle: IO[str]
        if path is None:
            self._handle = sys.stdout
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
            self._temp = Path(name)
            self._handle = os.fdopen(descriptor, "w", encoding="ascii", newline="\n")
        self.rows = 0

    def __call__(self, batch: Rows, probabilities: np.ndarray) -> None:
        """Append the ``B x 1`` probabilities of ``batch`` (9 significant digits: float32 round-trips)."""
        values = np.asarray(probabilities).reshape(len(batch), -1)
        if values.shape[1] != 1:
            raise ClientError(f"expected one probability per row, got shape {list(values.shape)}")
        if self.rows == 0:
            # The header waits for the first answer: a run that fails at once prints nothing.
            self._handle.write(f"{OUTPUT}\n")
        np.savetxt(self._handle, values, fmt="%.9g")
        self.rows += len(batch)

    def __enter__(self) -> ProbabilityWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._temp is None:
            self._handle.flush()
            return
        self._handle.close()
        if exc is None and self.path is not None:
            os.replace(self._temp, self.path)
        else:
            self._temp.unlink(missing_ok=True)


def predict_file(
    client: ClientOptions, model: str, path: Path | str, options: PredictOptions, output: Path | None
) -> RunSummary:
    """Write ``model``'s probability for every row of ``path`` to ``output`` (CSV), in input order.

    Args:
        client: the server endpoint and connection options.
        model: model name.
        path: a Criteo TSV file (labeled or not); for a model of bags (its config's ``hotness``),
            a file of the multi-hot text format (:mod:`criteo.multihot`).
        options: batch size, sync/async, requests in flight, row limit.
        output: the CSV file, or None for standard output.
    """
    with ProbabilityWriter(output) as writer:
        summary = run_file(client, model, path, options, writer)
    logger.debug("%s: %d rows in %d requests, %.2f s", model, summary.rows, summary.batches, summary.seconds)
    return summary
