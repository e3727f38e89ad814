"""Which embedding rows stay in the served graph: the hot set under a byte budget.

A hot/cold model keeps the most looked-up rows of all tables in the
served graph and fetches the rest from a memory-mapped row store. Which rows are
hot comes from a measured :class:`criteo.profile.AccessProfile`:
:func:`choose_hot_rows` takes rows greedily across all tables by profiled lookups
(the globally most-looked-up (table, id) first, ties to the lower table, then the
lower id) until the next row no longer fits the budget. ``python -m criteo coverage``
scores the same choice on held-out data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.schema import NUM_CATEGORICAL
from criteo.coverage import HotRanking, check_row_bytes
from criteo.profile import AccessProfile
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import check_table_sizes
from criteo.tsv import Batch

_SIZE = re.compile(r"([0-9]+)([KMGT]?)", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """A byte count: a plain integer, or one with a K, M, G or T suffix (binary: ``512M`` = 512 * 2**20).

    Raises:
        ConfigError: anything else (decimals, negative values, other units).
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ConfigError(
            f"a size must be an integer of bytes, optionally with K, M, G or T (512M), got {text!r}"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


@dataclass(frozen=True, eq=False)
class HotSet:
    """The rows kept hot in each of the 26 tables.

    Attributes:
        table_sizes: rows of each table.
        row_bytes: bytes of one row of each table (DLRM: ``D * 4`` in FP32;
            Wide & Deep: ``D * 4 + 4`` with its wide weight).
        budget_bytes: the budget the rows were chosen under.
        ids: 26 int64 arrays, the hot ids of each table in ``[0, size)``, hottest first.
        counts: 26 int64 arrays, the profiled lookups of each hot id.
        profiled_lookups: lookups of the profile the set was chosen from.
    """

    table_sizes: tuple[int, ...]
    row_bytes: tuple[int, ...]
    budget_bytes: int
    ids: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]
    profiled_lookups: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", check_table_sizes(self.table_sizes))
        object.__setattr__(self, "row_bytes", check_row_bytes(self.row_bytes))
        if len(self.ids) != NUM_CATEGORICAL or len(self.counts) != NUM_CATEGORICAL:
            raise DataError(f"a hot set needs ids and counts for {NUM_CATEGORICAL} tables")
        object.__setattr__(self, "ids", tuple(np.asarray(a, dtype=np.int64) for a in self.ids))
        object.__setattr__(self, "counts", tuple(np.asarray(a, dtype=np.int64) for a in self.counts))
        for name, size, ids, counts in zip(
            CATEGORICAL_COLUMNS, self.table_sizes, self.ids, self.counts, strict=True
        ):
            if ids.ndim != 1 or ids.shape != counts.shape:
                raise DataError(f"{name}: hot ids and counts must be two equal 1-D arrays")
            if ids.size and (ids.min() < 0 or ids.max() >= size or np.unique(ids).size != ids.size):
                raise DataError(f"{name}: hot ids must be distinct and lie in [0, {size})")
        if self.budget_bytes < 0 or self.bytes_used > self.budget_bytes:
            raise DataError(f"hot rows take {self.bytes_used} bytes, over the budget of {self.budget_bytes}")

    @cached_property
    def _sorted_ids(self) -> tuple[np.ndarray, ...]:
        """Each table's hot ids ascending, for membership tests (``ids`` stay hottest first)."""
        return tuple(np.sort(ids) for ids in self.ids)

    @property
    def table_rows(self) -> tuple[int, ...]:
        """Hot rows of each table."""
        return tuple(int(ids.size) for ids in self.ids)

    @property
    def rows(self) -> int:
        """Hot rows of all tables."""
        return sum(self.table_rows)

    @property
    def bytes_used(self) -> int:
        """Bytes of the hot rows."""
        return sum(n * b for n, b in zip(self.table_rows, self.row_bytes, strict=True))

    @property
    def expected_hit_rate(self) -> float:
        """Share of the profiled lookups that the hot rows serve."""
        if self.profiled_lookups == 0:
            return 0.0
        return sum(int(c.sum()) for c in self.counts) / self.profiled_lookups

    def hits(self, ids: Batch | np.ndarray, hotness: Sequence[int] | None = None) -> np.ndarray:
        """Lookups of each table that a hot row serves.

        Args:
            ids: a :class:`criteo.tsv.Batch`, or ``B x 26`` int64 raw ids (reduced into the
                tables here, as the served graph does); ``B x H`` bags with ``hotness``.
            hotness: a multi-hot model's ids per bag of each table (None: one id each).

        Returns:
            ``26`` int64 hit counts, of ``B`` lookups each (``B x hotness[t]`` with bags).
        """
        values = ids.categorical if isinstance(ids, Batch) else np.asarray(ids, dtype=np.int64)
        counts = (1,) * NUM_CATEGORICAL if hotness is None else tuple(int(count) for count in hotness)
        if values.ndim != 2 or values.shape[1] != sum(counts):
            raise DataError(f"ids must be B x {sum(counts)}, got shape {values.shape}")
        columns = np.repeat(np.arange(NUM_CATEGORICAL), counts)
        reduced = np.mod(values, np.asarray(self.table_sizes, dtype=np.int64)[columns])
        hot = self._sorted_ids
        return np.array(
            [np.isin(reduced[:, columns == t], hot[t]).sum() for t in range(NUM_CATEGORICAL)], dtype=np.int64
        )

    def hit_rate(self, ids: Batch | np.ndarray, hotness: Sequence[int] | None = None) -> float:
        """Share of the lookups of ``ids`` (a batch or ``B x 26`` raw ids; ``B x H`` bags with
        ``hotness``) that hot rows serve."""
        values = ids.categorical if isinstance(ids, Batch) else np.asarray(ids)
        lookups = values.shape[0] * values.shape[1] if values.ndim == 2 else 0
        return float(self.hits(ids, hotness).sum()) / lookups if lookups else 0.0

    def save(self, path: Path | str) -> Path:
        """Write the set to one ``.npz`` file (parents created); returns its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {
            "table_sizes": np.array(self.table_sizes, dtype=np.int64),
            "row_bytes": np.array(self.row_bytes, dtype=np.int64),
            "budget_bytes": np.array(self.budget_bytes, dtype=np.int64),
            "profiled_lookups": np.array(self.profiled_lookups, dtype=np.int64),
        }
        for name, ids, counts in zip(CATEGORICAL_COLUMNS, self.ids, self.counts, strict=True):
            arrays[f"ids_{name}"] = ids
            arrays[f"counts_{name}"] = counts
        with open(path, "wb") as handle:  # a file handle, so numpy adds no .npz suffix of its own
            np.savez(handle, **arrays)
        return path

    @classmethod
    def load(cls, path: Path | str) -> HotSet:
        """Read a set that :meth:`save` wrote.

        Raises:
            DataError: the file is missing or not a hot set.
        """
        path = Path(path)
        if not path.is_file():
            raise DataError(f"no hot-row file: {path}")
        try:
            with np.load(path, allow_pickle=False) as data:
                return cls(
                    table_sizes=tuple(int(s) for s in data["table_sizes"]),
                    row_bytes=tuple(int(b) for b in data["row_bytes"]),
                    budget_bytes=int(data["budget_bytes"]),
                    ids=tuple(data[f"ids_{name}"] for name in CATEGORICAL_COLUMNS),
                    counts=tuple(data[f"counts_{name}"] for name in CATEGORICAL_COLUMNS),
                    profiled_lookups=int(data["profiled_lookups"]),
                )
        except (KeyError, ValueError, OSError) as exc:
            raise DataError(f"{path}: not a hot-row file ({exc})") from None


def choose_hot_rows(
    profile: AccessProfile,
    table_sizes: Sequence[int],
    row_bytes: int | Sequence[int],
    budget_bytes: int,
) -> HotSet:
    """Keep the most looked-up rows of all tables hot until the byte budget is full.

    Rows are taken greedily across tables by profiled lookups (ties: lower table,
    then lower id) until the next row does not fit; ids never profiled are never hot.

    Args:
        profile: measured lookups; raw ids are reduced into ``table_sizes`` here.
        table_sizes: rows of each of the 26 tables.
        row_bytes: bytes of one row, for all tables or each of the 26.
        budget_bytes: bytes the hot rows may take (see :func:`parse_size`).

    Returns:
        The hot set.

    Raises:
        ConfigError: a negative budget, bad sizes, or a profile reduced into other sizes.
    """
    if budget_bytes < 0:
        raise ConfigError(f"the hot-row budget must be >= 0 bytes, got {budget_bytes}")
    sizes = check_table_sizes(table_sizes)
    per_table = check_row_bytes(row_bytes)
    ranking = HotRanking(profile.reduced(sizes))
    ids, counts = ranking.split(ranking.rows_within(per_table, budget_bytes))
    return HotSet(sizes, per_table, int(budget_bytes), ids, counts, ranking.lookups)
