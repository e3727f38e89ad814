"""Streaming a Criteo TSV file into request batches, and answers back in input order.

:func:`file_batches` reads a file of any size chunk by chunk (memory bounded
by the batch size, never the file). :func:`ordered` runs an asyncio call per
item with at most ``max_in_flight`` calls pending and yields the answers in
the items' order, however the calls finish.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from bundle.errors import ConfigError
from criteo.tsv import Batch, iter_batches

Item = TypeVar("Item")
Result = TypeVar("Result")


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
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if max_rows is not None and max_rows < 1:
        raise ConfigError(f"max_rows must be >= 1, got {max_rows}")
    seen = 0
    for batch in iter_batches(path, chunk_rows=batch_size):
        if max_rows is not None and seen + len(batch) >= max_rows:
            yield batch.slice(0, max_rows - seen)
            return
        seen += len(batch)
        yield batch


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
