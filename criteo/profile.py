"""Access skew of the embedding tables: which ids take the lookups, measured from a Criteo file.

A few ids of each table take most of its lookups. :func:`profile_file` counts every
table's lookups per id over a Criteo TSV file (streamed chunk by chunk, so the file
may be larger than memory; memory grows with the distinct ids, not with the rows)
into an :class:`AccessProfile`. With ``table_sizes`` the ids are first reduced into
their tables (``id mod size``, what the exported graphs do), so the counts are per
embedding row; without, they are counted by raw value. A missing field is
:data:`criteo.schema.MISSING_ID` and counts like any id.

From a profile, :func:`coverage` gives the share of a table's lookups that its
hottest rows serve; :mod:`criteo.coverage` ranks rows across tables and scores a
held-out file against hot-row budgets.

Files (:meth:`AccessProfile.save`): ``counts.npz`` (the per-id counts),
``profile.json`` (per-table summary and the overall coverage curve) and
``coverage.png`` (share of lookups served against the fraction of rows kept hot).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.plots import TITLE_SIZE, figure
from bundle.schema import NUM_CATEGORICAL
from criteo.preprocess import hash_ids
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import check_table_sizes
from criteo.tsv import iter_raw

log = logging.getLogger(__name__)

PROFILE_JSON = "profile.json"
COUNTS_FILE = "counts.npz"
COVERAGE_PNG = "coverage.png"

#: Fractions of a table's rows whose share of lookups ``profile.json`` reports per table.
SUMMARY_FRACTIONS: tuple[float, ...] = (0.001, 0.01, 0.1)
#: Points of the overall coverage curve in ``profile.json``: 1-2-5 steps from 1e-6 to 1.
CURVE_FRACTIONS: tuple[float, ...] = (
    *(round(m * 10.0**e, 12) for e in range(-6, 0) for m in (1, 2, 5)),
    1.0,
)
#: Pending per-chunk counts are merged once they hold this many entries (or more than the total).
_MERGE_ENTRIES = 1 << 21


def rows_at(fraction: float, rows: int) -> int:
    """``floor(fraction * rows)``, immune to float noise such as ``0.29 * 100 = 28.999...``."""
    return math.floor(round(fraction * rows, 6))


def coverage(counts: np.ndarray, fractions: Sequence[float], rows: int | None = None) -> np.ndarray:
    """Share of lookups served by the hottest ``floor(f * rows)`` rows of a table, for each ``f``.

    Args:
        counts: ``N`` lookups of each distinct id (any order); ids never looked up may be left out.
        fractions: fractions of the table's rows kept hot, each in [0, 1].
        rows: rows of the table (its size); None: ``N``, the distinct ids seen.

    Returns:
        ``len(fractions)`` float64 shares in [0, 1] (all 0 when there are no lookups).

    Raises:
        ConfigError: a fraction outside [0, 1], or ``rows`` below ``N``.
    """
    values = np.sort(np.asarray(counts, dtype=np.int64))[::-1]
    rows = values.size if rows is None else int(rows)
    if rows < values.size:
        raise ConfigError(f"a table of {rows} rows cannot hold {values.size} distinct ids")
    bad = [f for f in fractions if not 0.0 <= f <= 1.0]
    if bad:
        raise ConfigError(f"fractions must be in [0, 1], got {bad}")
    total = int(values.sum())
    if total == 0:
        return np.zeros(len(fractions))
    served = np.concatenate(([0], np.cumsum(values)))
    kept = np.array([min(rows_at(f, rows), values.size) for f in fractions], dtype=np.int64)
    return served[kept] / total


@dataclass(frozen=True, eq=False)
class TableCounts:
    """Lookups per id of one table.

    Attributes:
        ids: ``N`` int64 distinct ids, hottest first (ties: lower id first).
        counts: ``N`` int64 lookups of each id, non-increasing, each >= 1.
    """

    ids: np.ndarray
    counts: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", np.ascontiguousarray(self.ids, dtype=np.int64))
        object.__setattr__(self, "counts", np.ascontiguousarray(self.counts, dtype=np.int64))
        if self.ids.ndim != 1 or self.ids.shape != self.counts.shape:
            raise DataError(
                f"ids {self.ids.shape} and counts {self.counts.shape} must be two equal 1-D arrays"
            )
        if self.counts.size and (self.counts[-1] < 1 or np.any(np.diff(self.counts) > 0)):
            raise DataError("counts must be >= 1 and sorted hottest first")

    @classmethod
    def from_unsorted(cls, ids: np.ndarray, counts: np.ndarray) -> TableCounts:
        """Sort distinct ``ids`` and their ``counts`` hottest first (ties: lower id first); drop zeros."""
        ids = np.asarray(ids, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        keep = counts > 0
        ids, counts = ids[keep], counts[keep]
        order = np.lexsort((ids, -counts))
        return cls(ids[order], counts[order])

    @property
    def lookups(self) -> int:
        """Lookups of the table."""
        return int(self.counts.sum())

    @property
    def distinct(self) -> int:
        """Distinct ids looked up."""
        return int(self.ids.size)


def _merge(ids: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum the counts of equal ids over several (ids, counts) pairs: ascending distinct ids and sums."""
    all_ids = np.concatenate(ids)
    all_counts = np.concatenate(counts)
    if all_ids.size == 0:
        return all_ids, all_counts
    order = np.argsort(all_ids, kind="stable")
    all_ids, all_counts = all_ids[order], all_counts[order]
    starts = np.flatnonzero(np.concatenate(([True], all_ids[1:] != all_ids[:-1])))
    return all_ids[starts], np.add.reduceat(all_counts, starts)


class _Counter:
    """Counts ids of one column chunk by chunk; each chunk's ``np.unique`` waits, then merges in bulk."""

    def __init__(self) -> None:
        self.ids = np.empty(0, dtype=np.int64)
        self.counts = np.empty(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_entries = 0

    def add(self, values: np.ndarray) -> None:
        ids, counts = np.unique(values, return_counts=True)
        self._pending.append((ids, counts.astype(np.int64)))
        self._pending_entries += ids.size
        # Merging only when the pending entries outgrow the merged ones keeps the cost O(n log n).
        if self._pending_entries >= max(_MERGE_ENTRIES, self.ids.size):
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            ids = [self.ids, *(p[0] for p in self._pending)]
            counts = [self.counts, *(p[1] for p in self._pending)]
            self.ids, self.counts = _merge(ids, counts)
            self._pending, self._pending_entries = [], 0

    def result(self) -> TableCounts:
        self._flush()
        return TableCounts.from_unsorted(self.ids, self.counts)


@dataclass(frozen=True, eq=False)
class AccessProfile:
    """Measured lookups per id of the 26 tables (C1..C26).

    Attributes:
        tables: the 26 tables' counts, C1 first.
        rows: rows profiled (each row looks up one id per table).
        table_sizes: the sizes the ids were reduced into (``id mod size``), or None
            when ids were counted by their raw value.
        source: the profiled file, for the record.
    """

    tables: tuple[TableCounts, ...]
    rows: int
    table_sizes: tuple[int, ...] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.tables) != NUM_CATEGORICAL:
            raise DataError(f"a profile needs {NUM_CATEGORICAL} tables, got {len(self.tables)}")
        if self.rows < 0:
            raise DataError(f"rows must be >= 0, got {self.rows}")
        if self.table_sizes is not None:
            sizes = check_table_sizes(self.table_sizes)
            object.__setattr__(self, "table_sizes", sizes)
            for name, size, table in zip(CATEGORICAL_COLUMNS, sizes, self.tables, strict=True):
                if table.distinct and (table.ids.min() < 0 or table.ids.max() >= size):
                    raise DataError(f"{name}: ids must lie in [0, {size}) once reduced into the table")

    @property
    def lookups(self) -> int:
        """Lookups of all tables."""
        return sum(t.lookups for t in self.tables)

    @property
    def distinct(self) -> int:
        """Distinct (table, id) pairs looked up."""
        return sum(t.distinct for t in self.tables)

    @property
    def rows_are(self) -> str:
        """What a table's rows are: ``table sizes`` or ``distinct ids seen``."""
        return "table sizes" if self.table_sizes is not None else "distinct ids seen"

    def table_rows(self) -> tuple[int, ...]:
        """Rows of each table: its size when known, else the distinct ids seen."""
        if self.table_sizes is not None:
            return self.table_sizes
        return tuple(t.distinct for t in self.tables)

    def reduced(self, table_sizes: Sequence[int]) -> AccessProfile:
        """The profile with ids reduced into ``table_sizes`` (counts of ids that collide are summed).

        Raises:
            ConfigError: the profile was already reduced into other sizes.
        """
        sizes = check_table_sizes(table_sizes)
        if self.table_sizes == sizes:
            return self
        if self.table_sizes is not None:
            t = next(i for i, (a, b) in enumerate(zip(self.table_sizes, sizes, strict=True)) if a != b)
            raise ConfigError(
                f"the profile counted ids reduced into other table sizes than asked "
                f"({CATEGORICAL_COLUMNS[t]}: {self.table_sizes[t]} rows, not {sizes[t]}); "
                "profile again with these sizes, or without sizes"
            )
        tables = []
        for size, table in zip(sizes, self.tables, strict=True):
            ids, counts = _merge([np.mod(table.ids, size)], [table.counts])
            tables.append(TableCounts.from_unsorted(ids, counts))
        return AccessProfile(tuple(tables), self.rows, sizes, self.source)

    def table_coverage(self, fractions: Sequence[float]) -> np.ndarray:
        """``26 x F`` share of each table's lookups served by its hottest ``f`` of rows (:func:`coverage`)."""
        rows = self.table_rows()
        return np.stack([coverage(t.counts, fractions, r) for t, r in zip(self.tables, rows, strict=True)])

    def overall_coverage(self, fractions: Sequence[float]) -> np.ndarray:
        """Share of all lookups served by the hottest ``f`` of all rows, chosen greedily across tables.

        Rows cost the same here, so greedy by count across tables is the best choice of that many rows.
        """
        counts = np.concatenate([t.counts for t in self.tables])
        return coverage(counts, fractions, sum(self.table_rows()))

    def summary(self) -> dict[str, Any]:
        """What ``profile.json`` holds: per-table lookups, distinct ids, size and top shares; the curve."""
        rows = self.table_rows()
        shares = self.table_coverage(SUMMARY_FRACTIONS)
        tables = []
        for t, (name, table) in enumerate(zip(CATEGORICAL_COLUMNS, self.tables, strict=True)):
            tables.append(
                {
                    "name": name,
                    "lookups": table.lookups,
                    "distinct_ids": table.distinct,
                    "table_size": None if self.table_sizes is None else self.table_sizes[t],
                    "hottest_id": int(table.ids[0]) if table.distinct else None,
                    "hottest_id_share": table.counts[0] / table.lookups if table.distinct else 0.0,
                    "top_share": {
                        f"{f:g}": float(s) for f, s in zip(SUMMARY_FRACTIONS, shares[t], strict=True)
                    },
                }
            )
        total_rows = sum(rows)
        shares_all = self.overall_coverage(CURVE_FRACTIONS + SUMMARY_FRACTIONS)
        curve, top = shares_all[: len(CURVE_FRACTIONS)], shares_all[len(CURVE_FRACTIONS) :]
        return {
            "source": self.source,
            "rows": self.rows,
            "lookups": self.lookups,
            "distinct_ids": self.distinct,
            "table_sizes": None if self.table_sizes is None else list(self.table_sizes),
            "rows_are": self.rows_are,
            "table_rows": total_rows,
            "top_share": {f"{f:g}": float(s) for f, s in zip(SUMMARY_FRACTIONS, top, strict=True)},
            "tables": tables,
            "overall_curve": [
                {"fraction": f, "rows": min(rows_at(f, total_rows), self.distinct), "share": float(s)}
                for f, s in zip(CURVE_FRACTIONS, curve, strict=True)
            ],
        }

    def save(self, out: Path | str) -> dict[str, Path]:
        """Write ``counts.npz``, ``profile.json`` and ``coverage.png`` into ``out`` (created).

        Returns:
            The written files by kind (``counts``, ``profile``, ``plot``).
        """
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {"rows": np.array(self.rows, dtype=np.int64)}
        if self.table_sizes is not None:
            arrays["table_sizes"] = np.array(self.table_sizes, dtype=np.int64)
        for name, table in zip(CATEGORICAL_COLUMNS, self.tables, strict=True):
            arrays[f"ids_{name}"] = table.ids
            # Counts never exceed the rows: 4 bytes each for any file below 4 billion rows.
            arrays[f"counts_{name}"] = table.counts.astype(np.uint32 if self.rows < 2**32 else np.int64)
        counts_path = out / COUNTS_FILE
        np.savez(counts_path, **arrays)
        profile_path = out / PROFILE_JSON
        profile_path.write_text(json.dumps(self.summary(), indent=1) + "\n")
        plot_path = plot_profile(self, out / COVERAGE_PNG)
        return {"counts": counts_path, "profile": profile_path, "plot": plot_path}

    @classmethod
    def load(cls, directory: Path | str) -> AccessProfile:
        """Read a profile that :meth:`save` wrote.

        Raises:
            DataError: ``counts.npz`` is missing or not a profile.
        """
        directory = Path(directory)
        path = directory / COUNTS_FILE
        if not path.is_file():
            raise DataError(f"no access profile in {directory} (missing {COUNTS_FILE})")
        source = ""
        summary_path = directory / PROFILE_JSON
        if summary_path.is_file():
            source = str(json.loads(summary_path.read_text()).get("source", ""))
        try:
            with np.load(path, allow_pickle=False) as data:
                tables = tuple(
                    TableCounts(data[f"ids_{name}"], data[f"counts_{name}"]) for name in CATEGORICAL_COLUMNS
                )
                sizes = tuple(int(s) for s in data["table_sizes"]) if "table_sizes" in data else None
                rows = int(data["rows"])
        except (KeyError, ValueError, OSError) as exc:
            raise DataError(f"{path}: not an access profile ({exc})") from None
        return cls(tables, rows, sizes, source)


def read_profile(
    path: Path | str,
    table_sizes: Sequence[int] | None = None,
    on_rows: Callable[[int], None] | None = None,
    bags: bool = False,
) -> AccessProfile:
    """The access profile at ``path``: a folder :meth:`AccessProfile.save` wrote (or its
    ``counts.npz``), else a Criteo TSV profiled here (:func:`profile_file`, ids reduced into
    ``table_sizes``; ``on_rows`` and ``bags`` as there).

    Raises:
        DataError: see :meth:`AccessProfile.load` and :func:`profile_file`.
    """
    path = Path(path)
    if path.is_dir() or path.name == COUNTS_FILE:
        return AccessProfile.load(path if path.is_dir() else path.parent)
    return profile_file(path, table_sizes, on_rows=on_rows, bags=bags)


def profile_file(
    path: Path | str,
    table_sizes: Sequence[int] | None = None,
    max_rows: int | None = None,
    on_rows: Callable[[int], None] | None = None,
    chunk_rows: int = 65536,
    bags: bool = False,
) -> AccessProfile:
    """Count each table's lookups per id over a Criteo TSV file, streamed chunk by chunk.

    Args:
        path: the file (labeled or not, optionally ``.gz``).
        table_sizes: 26 sizes to reduce ids into (``id mod size``) before counting;
            None counts raw ids.
        max_rows: profile only the first rows; None: the whole file.
        on_rows: called with the rows of each chunk (progress).
        chunk_rows: rows parsed per chunk.
        bags: the file is of the multi-hot text format (:mod:`criteo.multihot`): every id of
            every bag is a lookup of its table.

    Returns:
        The profile.

    Raises:
        ConfigError: a bad ``max_rows`` or ``table_sizes``.
        DataError: the file is missing, malformed or empty.
    """
    if max_rows is not None and max_rows <= 0:
        raise ConfigError(f"max_rows must be positive, got {max_rows}")
    sizes = None if table_sizes is None else check_table_sizes(table_sizes)
    counters = [_Counter() for _ in range(NUM_CATEGORICAL)]
    if bags:
        return _profile_bags(Path(path), sizes, counters, max_rows, on_rows, chunk_rows)
    rows = 0
    for raw in iter_raw(path, chunk_rows):
        ids = raw.ids
        if max_rows is not None and rows + len(raw) > max_rows:
            ids = ids[: max_rows - rows]
        if sizes is not None:
            ids = hash_ids(ids, sizes)
        for t, counter in enumerate(counters):
            counter.add(ids[:, t])
        rows += ids.shape[0]
        if on_rows is not None:
            on_rows(ids.shape[0])
        if max_rows is not None and rows >= max_rows:
            break
    if rows == 0:
        raise DataError(f"{path}: no rows")
    log.debug("profiled %d rows of %s", rows, path)
    return AccessProfile(tuple(c.result() for c in counters), rows, sizes, str(path))


def _profile_bags(
    path: Path,
    sizes: tuple[int, ...] | None,
    counters: list[_Counter],
    max_rows: int | None,
    on_rows: Callable[[int], None] | None,
    chunk_rows: int,
) -> AccessProfile:
    """:func:`profile_file` over a file of the multi-hot text format."""
    from criteo.multihot import iter_bag_batches

    rows = 0
    for batch in iter_bag_batches(path, chunk_rows):
        if max_rows is not None and rows + len(batch) > max_rows:
            batch = batch.slice(0, max_rows - rows)
        values, _ = batch.per_table()
        for t, counter in enumerate(counters):
            ids = values[t]
            counter.add(ids if sizes is None else np.mod(ids, sizes[t]))
        rows += len(batch)
        if on_rows is not None:
            on_rows(len(batch))
        if max_rows is not None and rows >= max_rows:
            break
    if rows == 0:
        raise DataError(f"{path}: no rows")
    return AccessProfile(tuple(c.result() for c in counters), rows, sizes, str(path))


def _curve_points(counts: np.ndarray, rows: int, points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Fraction of rows kept hot (``k / rows``) and share served, at about ``points`` log-spaced ``k``."""
    if counts.size == 0:
        return np.array([1.0]), np.array([0.0])
    sorted_counts = np.sort(counts)[::-1]
    served = np.cumsum(sorted_counts) / sorted_counts.sum()
    kept = np.unique(np.round(np.logspace(0, np.log10(counts.size), points)).astype(np.int64))
    x = np.concatenate((kept / rows, [1.0]))
    y = np.concatenate((served[kept - 1], [1.0]))
    return x, y


def plot_profile(profile: AccessProfile, path: Path) -> Path:
    """Draw share of lookups served against fraction of rows kept hot: each table faint, all tables bold.

    Args:
        profile: the measured profile.
        path: the PNG to write.

    Returns:
        ``path``.
    """
    rows = profile.table_rows()
    with figure(path) as (ax,):
        for t, (name, table) in enumerate(zip(CATEGORICAL_COLUMNS, profile.tables, strict=True)):
            x, y = _curve_points(table.counts, rows[t])
            ax.plot(
                x,
                y,
                "-",
                color="tab:blue",
                alpha=0.25,
                linewidth=1,
                label="one table (C1..C26)" if t == 0 else None,
            )
            if table.distinct > 1:
                ax.annotate(
                    name, (x[0], y[0]), fontsize=6, alpha=0.5, textcoords="offset points", xytext=(2, 0)
                )
        counts = np.concatenate([t.counts for t in profile.tables])
        x, y = _curve_points(counts, sum(rows), points=400)
        ax.plot(
            x, y, "-", color="black", linewidth=2.5, label="all tables, hottest rows chosen across tables"
        )
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"fraction of rows kept hot (rows: {profile.rows_are})")
        ax.set_ylabel("share of lookups served")
        source = Path(profile.source).name or "data"
        ax.set_title(f"embedding access skew: {profile.rows:,} rows of {source}", fontsize=TITLE_SIZE)
        ax.legend(fontsize=8, loc="upper left")
    return path
