"""A pool of pre-built request batches in the real input format, made once per load test.

Rows come from a Criteo TSV file or from the synthetic generator, go through
the data contract's preprocessing once (:mod:`criteo.tsv`), and are kept as
the model's two input arrays, and as the rows' text for a raw-row model
(``<model>_raw``, which parses the rows in the server). Load generators then
only pick a batch; no row is parsed, generated or preprocessed while requests
are timed. The sweep writes the pool to one ``.npz`` file that every locust
process loads.

A pool that knows a ranking model's split of the features (:class:`bundle.schema.FeatureSplit`)
holds users: each batch of ``B`` rows is one user and its ``B`` candidates, the user's features
those of the batch's first row. A ranking model gets the batch as one request of that user
(:meth:`PayloadPool.batch` with ``form="ranking"``), a flat model the same candidates as the tiled
rows, so that both kinds of request stand for the same work and the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.schema import (
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    INPUTS,
    LENGTHS_INPUT,
    NUM_CATEGORICAL,
    RAW_ROWS_INPUT,
    VALUES_INPUT,
    VARIABLE_HOTNESS,
    FeatureSplit,
    is_ranking_model,
    is_raw_model,
)
from clients.verify import sample_rows_with_text

#: Ids per table of a multi-hot model: 26 counts, ``variable`` (bags of any size), or None (one id).
Hotness = tuple[int, ...] | str | None
#: Distinct batches a pool holds, at most (fewer when that would exceed MAX_POOL_ROWS).
DEFAULT_POOL_BATCHES = 64
#: Rows a pool holds, at most: enough variety, little memory (about 2.6 MB per 10,000 rows).
MAX_POOL_ROWS = 32_768
#: Rows a stream holds, at most (about 520 MB): a file's rows sent in order, each once.
STREAM_MAX_ROWS = 2_000_000
#: How a model takes a batch: the schema's tensors (``rows``), the rows' text (``text``, a
#: raw-row model), or one user and its candidates (``ranking``, a ranking model).
RequestForm = Literal["rows", "text", "ranking"]


def request_form(model: str) -> RequestForm:
    """The form of request served model ``model`` takes, by the repository's names."""
    if is_raw_model(model):
        return "text"
    return "ranking" if is_ranking_model(model) else "rows"


@dataclass(frozen=True)
class PayloadPool:
    """``batches`` request batches of ``batch_size`` rows each, as model inputs.

    Attributes:
        dense: ``(batches * batch_size) x 13`` float32.
        categorical: ``(batches * batch_size) x 26`` int64 (``x H`` for a multi-hot model: its bags);
            for a model of bags of any size, every row's ids, ``N`` int64 (:attr:`lengths` says
            how many each bag takes).
        batch_size: rows per request ``B``.
        source: where the rows came from (a file name, or ``synthetic``).
        text: the same rows as their unlabeled TSV text, 1-D ``bytes``, for a raw-row model;
            None when the pool was made without it (a streamed file's).
        lengths: for a model of bags of any size, each bag's size, ``(batches * batch_size) x 26``
            int64 (0: empty); None otherwise.
        split: a ranking model's split of the features: each batch is then one user (see the
            module's notes); None: rows as they are.
        hotness: the ids per table of :attr:`categorical`'s rows where ``split`` is set and the
            model is multi-hot (26 counts); None: one id each.
    """

    dense: np.ndarray
    categorical: np.ndarray
    batch_size: int
    source: str
    text: np.ndarray | None = None
    lengths: np.ndarray | None = None
    split: FeatureSplit | None = None
    hotness: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        rows = self.dense.shape[0]
        held = self.categorical.shape[0] if self.lengths is None else self.lengths.shape[0]
        if rows == 0 or rows % self.batch_size or held != rows:
            raise DataError(
                f"a payload pool needs a whole number of batches of {self.batch_size} rows, "
                f"got {rows} dense and {held} categorical rows"
            )
        if self.text is not None and (self.text.dtype.kind != "S" or self.text.shape != (rows,)):
            raise DataError(
                f"payload row text is {self.text.dtype} {list(self.text.shape)}, expected bytes [{rows}]"
            )
        if self.lengths is not None:
            if self.split is not None:
                raise ConfigError("a ranking model takes bags of a fixed size, not bags of any size")
            self._check_bags(self.lengths)
            return
        if self.split is not None and self.categorical.ndim == 2:
            width = sum(self.hotness) if self.hotness is not None else NUM_CATEGORICAL
            if len(self.hotness or ()) not in (0, NUM_CATEGORICAL) or self.categorical.shape[1] != width:
                raise DataError(
                    f"payload ids are {list(self.categorical.shape)}, the split's hotness "
                    f"{list(self.hotness or [])} needs {width} a row"
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

    def _check_bags(self, lengths: np.ndarray) -> None:
        values = self.categorical
        dense = INPUTS[0]
        if self.dense.dtype != dense.dtype or self.dense.shape[1:] != dense.shape:
            raise DataError(f"payload input {dense.name!r} is {self.dense.dtype} {list(self.dense.shape)}")
        if lengths.dtype != np.int64 or lengths.shape[1:] != (NUM_CATEGORICAL,) or (lengths < 0).any():
            raise DataError(
                f"payload bag lengths are {lengths.dtype} {list(lengths.shape)}, expected int64 [N, 26] >= 0"
            )
        if values.dtype != np.int64 or values.ndim != 1 or values.size != int(lengths.sum()):
            total = int(lengths.sum())
            raise DataError(
                f"payload bag values are {values.dtype} {list(values.shape)}; the lengths add up to {total}"
            )
        if self.text is not None:
            raise DataError("a payload of bags of any size holds no row text")

    @cached_property
    def _row_starts(self) -> np.ndarray:
        """Each row's first value, and ``N`` last (bags of any size): a request's values are one slice."""
        lengths = self.lengths if self.lengths is not None else np.zeros((0, NUM_CATEGORICAL), np.int64)
        return np.concatenate(([0], np.cumsum(lengths.sum(axis=1)))).astype(np.int64)

    @property
    def variable_bags(self) -> bool:
        """The rows are bags of any size (values and lengths)."""
        return self.lengths is not None

    def __len__(self) -> int:
        """The number of batches."""
        return int(self.dense.shape[0]) // self.batch_size

    def rows(self, start: int, stop: int, form: RequestForm = "rows") -> dict[str, np.ndarray]:
        """Rows ``start:stop`` as the model's inputs, ``{tensor name: array}`` contiguous views;
        with a split (:attr:`split`), one user's: its request (``form="ranking"``) or the tiled
        rows it stands for (``rows``)."""
        if self.split is not None:
            request = self.split.split(self.dense[start:stop], self.categorical[start:stop], self.hotness)
            if form == "ranking":
                return request
            dense, ids = self.split.tile(request, self.hotness)
            return {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}
        if form == "ranking":
            raise DataError(
                f"the payload from {self.source} knows no split of the features: a ranking model's "
                "requests are built from its config (its user_features)"
            )
        if self.lengths is None:
            return {DENSE_INPUT: self.dense[start:stop], CATEGORICAL_INPUT: self.categorical[start:stop]}
        starts = self._row_starts
        return {
            DENSE_INPUT: self.dense[start:stop],
            VALUES_INPUT: self.categorical[int(starts[start]) : int(starts[min(stop, len(starts) - 1)])],
            LENGTHS_INPUT: self.lengths[start:stop],
        }

    def batch(self, index: int, form: RequestForm = "rows") -> dict[str, np.ndarray]:
        """Batch ``index`` (modulo the pool's length) as ``{tensor name: B x ...}`` contiguous views
        (:meth:`rows`), as a raw-row model's input (``form="text"``: ``{raw_rows: B x 1 bytes
        objects}``), or as one user's ranking request (``ranking``: :meth:`rows`).

        Raises:
            DataError: ``text`` from a pool made without the rows' text, ``ranking`` from one
                without a split.
        """
        start = (index % len(self)) * self.batch_size
        stop = start + self.batch_size
        if form == "text":
            if self.text is None:
                raise DataError(f"the payload from {self.source} holds no row text for a raw-row model")
            return {RAW_ROWS_INPUT: self.text[start:stop].astype(np.object_).reshape(-1, 1)}
        return self.rows(start, stop, form)

    def batches(self, form: RequestForm = "rows") -> list[dict[str, np.ndarray]]:
        """Every batch, in order (``form``: see :meth:`batch`)."""
        return [self.batch(i, form) for i in range(len(self))]

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
                **({} if self.lengths is None else {"lengths": self.lengths}),
                **({} if self.split is None else {"split": np.array(self.split.text)}),
                **({} if self.hotness is None else {"hotness": np.asarray(self.hotness, np.int64)}),
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
                    np.ascontiguousarray(data["lengths"]) if "lengths" in data.files else None,
                    FeatureSplit.parse(str(data["split"])) if "split" in data.files else None,
                    tuple(int(n) for n in data["hotness"]) if "hotness" in data.files else None,
                )
        except (OSError, KeyError, ValueError) as exc:
            raise DataError(f"cannot read payload pool {path}: {exc}") from None

    def multi_hot(self, hotness: Hotness) -> PayloadPool:
        """The same rows for a model of ``hotness`` ids per table (None: as they are), each table's
        bag made from the row's id (:func:`criteo.multihot.expand`), or for ``variable`` of a size
        drawn for each bag (:func:`criteo.multihot.draw_bags`); no row text (a raw-row model takes
        one id per table)."""
        if hotness is None:
            return self
        if self.lengths is not None or self.split is not None:
            raise ConfigError("the payload holds bags already")
        if hotness == VARIABLE_HOTNESS:
            from criteo.multihot import draw_bags
            from criteo.tsv import Batch

            bags = draw_bags(Batch(self.dense, self.categorical, None))
            return PayloadPool(
                self.dense, bags.categorical, self.batch_size, self.source, lengths=bags.lengths
            )
        if isinstance(hotness, str):
            raise ConfigError(f"hotness must be 26 counts or {VARIABLE_HOTNESS!r}, got {hotness!r}")
        from criteo.multihot import expand

        return PayloadPool(self.dense, expand(self.categorical, hotness), self.batch_size, self.source)

    def rebatched(self, batch_size: int) -> PayloadPool:
        """The same rows cut into batches of ``batch_size`` (rows beyond a whole batch are dropped;
        rows repeat when the pool holds fewer than one batch)."""
        rows = self.dense.shape[0]
        dense, categorical, text, lengths = self.dense, self.categorical, self.text, self.lengths
        if rows < batch_size:
            repeat = -(-batch_size // rows)
            dense = np.tile(dense, (repeat, 1))
            categorical = np.tile(categorical, (repeat,) + (1,) * (categorical.ndim - 1))
            text = None if text is None else np.tile(text, repeat)
            lengths = None if lengths is None else np.tile(lengths, (repeat, 1))
        keep = (dense.shape[0] // batch_size) * batch_size
        values = categorical[:keep] if lengths is None else categorical[: int(lengths[:keep].sum())]
        return PayloadPool(
            np.ascontiguousarray(dense[:keep]),
            np.ascontiguousarray(values),
            batch_size,
            self.source,
            None if text is None else np.ascontiguousarray(text[:keep]),
            None if lengths is None else np.ascontiguousarray(lengths[:keep]),
            self.split,
            self.hotness,
        )

    def ranked(self, split: FeatureSplit | None, hotness: Hotness = None) -> PayloadPool:
        """The same rows as users of a ranking model's ``split`` (None: as they are), the rows'
        ids ``hotness`` per table (26 counts, or None for one each; bags of any size have no
        ranking variant): each batch one user and its candidates (see the module's notes).

        Raises:
            ConfigError: bags of any size.
        """
        if split is None:
            return self
        if isinstance(hotness, str) or self.lengths is not None:
            raise ConfigError("a ranking model takes bags of a fixed size, not bags of any size")
        return replace(self, split=split, hotness=hotness)


def saved_bags(path: Path) -> bool:
    """Whether the pool saved at ``path`` (:meth:`PayloadPool.save`) holds bags of any size, read
    without loading it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return "lengths" in data.files
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read payload pool {path}: {exc}") from None


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


def build_bag_pool(data: Path, hotness: Hotness, rows: int) -> PayloadPool:
    """The first ``rows`` rows of a file of the multi-hot text format (:mod:`criteo.multihot`), in
    its order, as one-row batches for a model of ``hotness``: values and lengths for ``variable``,
    ``B x H`` ids for 26 counts.

    Raises:
        DataError: a malformed row, or a bag of another size than ``hotness`` says (its row and
            table).
    """
    from criteo.multihot import fixed_bags, read_bags

    bags = read_bags(data, rows)
    dense = np.ascontiguousarray(bags.dense, dtype=np.float32)
    if hotness == VARIABLE_HOTNESS:
        return PayloadPool(dense, np.ascontiguousarray(bags.values), 1, str(data), lengths=bags.lengths)
    if hotness is None or isinstance(hotness, str):
        raise ConfigError(f"{data} holds bags; the model takes one id per table")
    return PayloadPool(dense, np.ascontiguousarray(fixed_bags(bags, hotness).categorical), 1, str(data))
