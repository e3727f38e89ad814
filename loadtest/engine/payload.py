"""A pool of pre-built request batches in the real input format, made once per load test.

Rows come from a Criteo TSV file or from the synthetic generator, go through
the data contract's preprocessing once (:mod:`criteo.tsv`), and are kept as
the model's two input arrays, and as the rows' text for a raw-row model
(``<model>_raw``, which parses the rows in the server). Load generators then
only pick a batch; no row is parsed, generated or preprocessed while requests
are timed. The sweep writes the pool to one ``.npz`` file that every locust
process loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, INPUTS, RAW_ROWS_INPUT
from clients.verify import sample_rows_with_text

#: Distinct batches a pool holds, at most (fewer when that would exceed MAX_POOL_ROWS).
DEFAULT_POOL_BATCHES = 64
#: Rows a pool holds, at most: enough variety, little memory (about 2.6 MB per 10,000 rows).
MAX_POOL_ROWS = 32_768
#: Rows a stream holds, at most (about 520 MB): a file's rows sent in order, each once.
STREAM_MAX_ROWS = 2_000_000


@dataclass(frozen=True)
class PayloadPool:
    """``batches`` request batches of ``batch_size`` rows each, as model inputs.

    Attributes:
        dense: ``(batches * batch_size) x 13`` float32.
        categorical: ``(batches * batch_size) x 26`` int64 (``x H`` for a multi-hot model: its bags).
        batch_size: rows per request ``B``.
        source: where the rows came from (a file name, or ``synthetic``).
        text: the same rows as their unlabeled TSV text, 1-D ``bytes``, for a raw-row model;
            None when the pool was made without it (a streamed file's).
    """

    dense: np.ndarray
    categorical: np.ndarray
    batch_size: int
    source: str
    text: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        rows = self.dense.shape[0]
        if rows == 0 or rows % self.batch_size or self.categorical.shape[0] != rows:
            raise DataError(
                f"a payload pool needs a whole number of batches of {self.batch_size} rows, "
                f"got {rows} dense and {self.categorical.shape[0]} categorical rows"
            )
        if self.text is not None and (self.text.dtype.kind != "S" or self.text.shape != (rows,)):
            raise DataError(
                f"payload row text is {self.text.dtype} {list(self.text.shape)}, expected bytes [{rows}]"
            )
        # A multi-hot model's ids are N x H (its bags, C1's first): any width of at least 26.
        width = max(int(self.categorical.shape[1]), INPUTS[1].shape[0]) if self.categorical.ndim == 2 else 0
        for spec, shape, array in zip(
            INPUTS, (INPUTS[0].shape, (width,)), (self.dense, self.categorical), strict=True
        ):
            if array.dtype != spec.dtype or array.shape[1:] != shape:
                raise DataError(
                    f"payload input {spec.name!r} is {array.dtype} {list(array.shape)}, "
                    f"expected {np.dtype(spec.dtype)} [N, {', '.join(map(str, spec.shape))}]"
                )

    def __len__(self) -> int:
        """The number of batches."""
        return int(self.dense.shape[0]) // self.batch_size

    def batch(self, index: int, raw: bool = False) -> dict[str, np.ndarray]:
        """Batch ``index`` (modulo the pool's length) as ``{tensor name: B x ...}`` contiguous views,
        or with ``raw`` as a raw-row model's input, ``{raw_rows: B x 1 bytes objects}``.

        Raises:
            DataError: ``raw`` from a pool made without the rows' text.
        """
        start = (index % len(self)) * self.batch_size
        stop = start + self.batch_size
        if raw:
            if self.text is None:
                raise DataError(f"the payload from {self.source} holds no row text for a raw-row model")
            return {RAW_ROWS_INPUT: self.text[start:stop].astype(np.object_).reshape(-1, 1)}
        return {DENSE_INPUT: self.dense[start:stop], CATEGORICAL_INPUT: self.categorical[start:stop]}

    def batches(self, raw: bool = False) -> list[dict[str, np.ndarray]]:
        """Every batch, in order (``raw``: see :meth:`batch`)."""
        return [self.batch(i, raw) for i in range(len(self))]

    def save(self, path: Path) -> Path:
        """Write the pool as an uncompressed ``.npz`` file (loads in milliseconds)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            np.savez(
                handle,
                dense=self.dense,
                categorical=self.categorical,
                batch_size=np.int64(self.batch_size),
                source=np.array(self.source),
                **({} if self.text is None else {"text": self.text}),
            )
        return path

    @classmethod
    def load(cls, path: Path) -> PayloadPool:
        """Read a pool written by :meth:`save`."""
        try:
            with np.load(path, allow_pickle=False) as data:
                return cls(
                    np.ascontiguousarray(data["dense"]),
                    np.ascontiguousarray(data["categorical"]),
                    int(data["batch_size"]),
                    str(data["source"]),
                    data["text"] if "text" in data.files else None,
                )
        except (OSError, KeyError, ValueError) as exc:
            raise DataError(f"cannot read payload pool {path}: {exc}") from None

    def multi_hot(self, hotness: tuple[int, ...] | None) -> PayloadPool:
        """The same rows for a model of ``hotness`` ids per table (None: as they are): each table's
        bag made from the row's id (:func:`criteo.multihot.expand`); no row text (a raw-row model
        takes one id per table)."""
        if hotness is None:
            return self
        from criteo.multihot import expand

        return PayloadPool(self.dense, expand(self.categorical, hotness), self.batch_size, self.source)

    def rebatched(self, batch_size: int) -> PayloadPool:
        """The same rows cut into batches of ``batch_size`` (rows beyond a whole batch are dropped;
        rows repeat when the pool holds fewer than one batch)."""
        rows = self.dense.shape[0]
        dense, categorical, text = self.dense, self.categorical, self.text
        if rows < batch_size:
            repeat = -(-batch_size // rows)
            dense, categorical = np.tile(dense, (repeat, 1)), np.tile(categorical, (repeat, 1))
            text = None if text is None else np.tile(text, repeat)
        keep = (dense.shape[0] // batch_size) * batch_size
        return PayloadPool(
            np.ascontiguousarray(dense[:keep]),
            np.ascontiguousarray(categorical[:keep]),
            batch_size,
            self.source,
            None if text is None else np.ascontiguousarray(text[:keep]),
        )


def pool_rows(batch_size: int, batches: int = DEFAULT_POOL_BATCHES) -> int:
    """Rows of a pool of ``batches`` batches, capped at :data:`MAX_POOL_ROWS` (never below one batch)."""
    if batch_size < 1 or batches < 1:
        raise ConfigError(f"batch_size and batches must be >= 1, got {batch_size} and {batches}")
    fitting = max(1, min(batches, MAX_POOL_ROWS // batch_size))
    return fitting * batch_size


def build_pool(
    batch_size: int, data: Path | None = None, batches: int = DEFAULT_POOL_BATCHES, seed: int = 7
) -> PayloadPool:
    """A pool of request batches from ``data`` (a Criteo TSV file) or synthetic rows.

    Args:
        batch_size: rows per request ``B``.
        data: a labeled or unlabeled Criteo TSV file (``.gz`` too); synthetic rows when None.
            A file with fewer rows than the pool needs is repeated.
        batches: distinct batches wanted (capped so that the pool stays under
            :data:`MAX_POOL_ROWS` rows).
        seed: seed of the synthetic rows.

    Returns:
        The pool: ``len(pool)`` batches of ``B x 13`` dense and ``B x 26`` ids, and the rows' text.
    """
    rows = pool_rows(batch_size, batches)
    sample, text = sample_rows_with_text(data, rows, seed)
    pool = PayloadPool(
        np.ascontiguousarray(sample.dense, dtype=np.float32),
        np.ascontiguousarray(sample.categorical, dtype=np.int64),
        1,
        str(data) if data is not None else "synthetic",
        text,
    )
    return pool.rebatched(batch_size)


def build_stream(data: Path) -> PayloadPool:
    """Every row of ``data`` (at most :data:`STREAM_MAX_ROWS`), in the file's order, as one-row
    batches: the rows a streamed load sends each once, instead of cycling a pool."""
    from criteo.tsv import read_batch

    sample = read_batch(data, STREAM_MAX_ROWS)
    return PayloadPool(
        np.ascontiguousarray(sample.dense, dtype=np.float32),
        np.ascontiguousarray(sample.categorical, dtype=np.int64),
        1,
        str(data),
    )
