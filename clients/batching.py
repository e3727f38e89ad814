"""Streaming a Criteo TSV file into request batches, and answers back in input order.

:func:`file_batches` reads a file of any size chunk by chunk (memory bounded
by the batch size, never the file). :func:`ordered` runs an asyncio call per
item with at most ``max_in_flight`` calls pending and yields the answers in
the items' order, however the calls finish.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar, cast

import numpy as np

from bundle.errors import ClientError, ConfigError
from criteo.multihot import fixed_bags, iter_bag_batches
from criteo.tsv import Batch, RowText, iter_batches, iter_row_text

Item = TypeVar("Item")
Result = TypeVar("Result")


class Rows(Protocol):
    """What one request is built from: some rows, as the model's inputs (and their labels, from
    a labeled file)."""

    @property
    def labels(self) -> np.ndarray | None: ...

    def __len__(self) -> int: ...

    def inputs(self) -> dict[str, np.ndarray]: ...


RowsT = TypeVar("RowsT", bound=Rows)

#: How a raw-row model names a bad row: ``row 3: C7: ...`` (0-based within the request).
_BAD_ROW = re.compile(r"\brow (\d+): ")


class _Chunk(Rows, Protocol):
    def slice(self, start: int, stop: int) -> _Chunk: ...


ChunkT = TypeVar("ChunkT", bound=_Chunk)


def _first_rows(
    chunks: Callable[[], Iterator[ChunkT]], batch_size: int, max_rows: int | None
) -> Iterator[ChunkT]:
    """The chunks (of ``batch_size`` rows) up to ``max_rows`` rows in all (every one when None)."""
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if max_rows is not None and max_rows < 1:
        raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
    seen = 0
    for chunk in chunks():
        if max_rows is not None and seen + len(chunk) >= max_rows:
            yield cast(ChunkT, chunk.slice(0, max_rows - seen))
            return
        seen += len(chunk)
        yield chunk


def file_batches(path: Path | str, batch_size: int, max_rows: int | None = None) -> Iterator[Batch]:
    """Preprocessed batches of ``batch_size`` rows (the last may be smaller), in file order.

    Args:
        path: a Criteo TSV file (labeled or not, optionally ``.gz``).
        batch_size: rows per batch.
        max_rows: stop after this many rows (all when None).

    Yields:
        :class:`~criteo.tsv.Batch` objects: ``B x 13`` dense, ``B x 26`` ids, labels if any.

    Raises:
        DataError: the file is missing or a row is malformed (with its file:line).
    """
    return _first_rows(lambda: iter_batches(path, chunk_rows=batch_size), batch_size, max_rows)


def bag_file_batches(
    path: Path | str, batch_size: int, max_rows: int | None = None, hotness: tuple[int, ...] | None = None
) -> Iterator[Batch]:
    """Batches of a file in the multi-hot text format (:mod:`criteo.multihot`), for a model of bags:
    ``B x H`` ``categorical_ids`` for one of fixed ``hotness``, values and lengths for bags of any
    size (``hotness`` None).

    Raises:
        DataError: the file is missing, a row is malformed (its file:line), or a bag's size is not
            the model's hotness (its row and table).
    """

    def chunks() -> Iterator[Batch]:
        row = 0
        for bags in iter_bag_batches(path, chunk_rows=batch_size):
            yield bags if hotness is None else fixed_bags(bags, hotness, first_row=row)
            row += len(bags)

    return _first_rows(chunks, batch_size, max_rows)


def row_text_batches(path: Path | str, batch_size: int, max_rows: int | None = None) -> Iterator[RowText]:
    """The file's rows as text, ``batch_size`` per request, for a raw-row model (see
    :func:`criteo.tsv.iter_row_text`: nothing is parsed here, a labeled file's labels are cut)."""
    return _first_rows(lambda: iter_row_text(path, chunk_rows=batch_size), batch_size, max_rows)


def located(rows: Rows, error: ClientError) -> ClientError:
    """``error`` pointed at the file line it is about, when the server named a bad row of a
    request made of a file's row text (else ``error`` itself)."""
    found = _BAD_ROW.search(str(error))
    if not isinstance(rows, RowText) or found is None or int(found.group(1)) >= len(rows):
        return error
    message, line = str(error), rows.line_of(int(found.group(1)))
    said = message[: found.start()].rstrip(" ,:")
    return ClientError(f"{rows.path}:{line}: {message[found.end() :]} ({said})")


async def ordered(
    items: Iterable[Item], call: Callable[[Item], Awaitable[Result]], max_in_flight: int
) -> AsyncGenerator[tuple[Item, Result], None]:
    """Run ``call(item)`` for every item, at most ``max_in_flight`` at a time; yield in item order.

    The window holds the ``max_in_flight`` oldest calls not yet yielded: a new
    call starts only when the oldest one has been yielded, so memory stays
    bounded and the output needs no reordering buffer. Items are drawn from
    ``items`` lazily (a file is read as the window moves).

    Args:
        items: what to call on, in order.
        call: a coroutine function of one item.
        max_in_flight: calls started but not yet yielded, at most.

    Yields:
        ``(item, result)`` in the order of ``items``.

    Raises:
        Exception: whatever a call raised, for the first failing call in item order; the
            calls still pending are cancelled (also when the consumer stops early).
    """
    if max_in_flight < 1:
        raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
    window: deque[tuple[Item, asyncio.Task[Result]]] = deque()

    async def run(item: Item) -> Result:
        return await call(item)

    try:
        for item in items:
            if len(window) >= max_in_flight:
                oldest, task = window.popleft()
                yield oldest, await task
            window.append((item, asyncio.create_task(run(item))))
        while window:
            oldest, task = window.popleft()
            yield oldest, await task
    finally:
        pending = [task for _, task in window]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
