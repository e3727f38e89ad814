"""Hot rows across tables, and how much of a held-out file's traffic they serve.

- :class:`HotRanking`: every profiled row of every table, hottest first: the order
  in which the hot/cold export keeps rows hot under a byte budget
  (``export.tables.hot_rows.choose_hot_rows``), and the ranks with which
  :func:`measure_coverage` scores a held-out file against several budgets in one pass.
- ``python -m criteo coverage`` (:func:`measure_coverage`, :func:`write_coverage`):
  the held-out hit rate per budget, as JSON, markdown and a PNG curve.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.plots import TITLE_SIZE, figure
from bundle.schema import NUM_CATEGORICAL
from bundle.snippets import section_end, section_start
from criteo.preprocess import hash_ids
from criteo.profile import AccessProfile, rows_at
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import check_table_sizes
from criteo.tsv import iter_raw

log = logging.getLogger(__name__)

#: What ``python -m criteo coverage`` writes.
RESULT_JSON = "result.json"
RESULT_MD = "result.md"
HIT_RATE_PNG = "hit_rate.png"
#: Hot budgets (fractions of the table bytes) that ``python -m criteo coverage`` measures by
#: default: the points of its hit-rate curve.
DEFAULT_FRACTIONS: tuple[float, ...] = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
#: The report's named section (:mod:`bundle.snippets`) that the documentation includes: all of it
#: below the title but the chart.
SECTION_RESULTS = "results"


class HotRanking:
    """Every profiled row of every table, hottest first: the order in which rows are kept hot.

    Hot rows are chosen greedily across tables by measured lookups: the globally
    most-looked-up (table, id) first; ties go to the lower table, then the lower id.
    Under a byte budget the hot set is the longest prefix of this order whose rows fit
    (:meth:`rows_within`), so a larger budget keeps a superset of a smaller one's rows,
    and one held-out pass scores every budget (:meth:`ranks_of`). Ids never profiled
    are never hot.

    Attributes:
        tables: ``N`` int64 table index (0 = C1) of each row, hottest first.
        ids: ``N`` int64 id of each row within its table.
        counts: ``N`` int64 profiled lookups of each row.
        lookups: profiled lookups in all (the denominator of expected hit rates).
        table_sizes: the tables' sizes, or None when the profile counted raw ids.
    """

    def __init__(self, profile: AccessProfile) -> None:
        tables = np.concatenate(
            [np.full(t.distinct, i, dtype=np.int64) for i, t in enumerate(profile.tables)]
        )
        ids = np.concatenate([t.ids for t in profile.tables])
        counts = np.concatenate([t.counts for t in profile.tables])
        order = np.lexsort((ids, tables, -counts))
        self.tables, self.ids, self.counts = tables[order], ids[order], counts[order]
        self.lookups = int(counts.sum())
        self.table_sizes = profile.table_sizes
        # Per table: its ids ascending and their global ranks, to rank held-out ids.
        by_table = np.argsort(self.tables, kind="stable")
        bounds = np.searchsorted(self.tables[by_table], np.arange(NUM_CATEGORICAL + 1))
        self._sorted_ids: list[np.ndarray] = []
        self._ranks: list[np.ndarray] = []
        for t in range(NUM_CATEGORICAL):
            ranks = by_table[bounds[t] : bounds[t + 1]]
            table_ids = self.ids[ranks]
            order_t = np.argsort(table_ids, kind="stable")
            self._sorted_ids.append(table_ids[order_t])
            self._ranks.append(ranks[order_t])

    def __len__(self) -> int:
        return int(self.ids.size)

    def rows_within(self, row_bytes: Sequence[int], budget_bytes: int) -> int:
        """How many rows of the order fit: the longest prefix whose bytes stay within the budget.

        Args:
            row_bytes: bytes of one row of each of the 26 tables.
            budget_bytes: the byte budget (>= 0).
        """
        cost = np.cumsum(np.asarray(check_row_bytes(row_bytes), dtype=np.int64)[self.tables])
        return int(np.searchsorted(cost, int(budget_bytes), side="right"))

    def split(self, kept: int) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """The first ``kept`` rows by table: 26 id arrays and 26 count arrays, hottest first."""
        tables, ids, counts = self.tables[:kept], self.ids[:kept], self.counts[:kept]
        masks = [tables == t for t in range(NUM_CATEGORICAL)]
        return tuple(ids[m] for m in masks), tuple(counts[m] for m in masks)

    def ranks_of(self, ids: np.ndarray) -> np.ndarray:
        """Global rank of each lookup's row (``len(self)`` for a row never profiled).

        Args:
            ids: ``B x 26`` int64 ids, already reduced into the tables when the profile was.

        Returns:
            ``B x 26`` int64: a lookup hits a hot set of the first ``k`` rows iff its rank < ``k``.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[1] != NUM_CATEGORICAL:
            raise DataError(f"ids must be B x {NUM_CATEGORICAL}, got shape {ids.shape}")
        ranks = np.full(ids.shape, len(self), dtype=np.int64)
        for t in range(NUM_CATEGORICAL):
            known = self._sorted_ids[t]
            if known.size == 0:
                continue
            pos = np.minimum(np.searchsorted(known, ids[:, t]), known.size - 1)
            found = known[pos] == ids[:, t]
            ranks[found, t] = self._ranks[t][pos[found]]
        return ranks


def check_row_bytes(row_bytes: int | Sequence[int]) -> tuple[int, ...]:
    """Bytes of one row of each table: one int for all 26 tables, or 26 ints, each >= 1.

    Raises:
        ConfigError: not 1 or 26 values, or a value below 1.
    """
    values = (
        (int(row_bytes),) * NUM_CATEGORICAL
        if isinstance(row_bytes, int)
        else tuple(int(b) for b in row_bytes)
    )
    if len(values) != NUM_CATEGORICAL:
        raise ConfigError(f"row_bytes needs 1 or {NUM_CATEGORICAL} values (C1..C26), got {len(values)}")
    if min(values) < 1:
        raise ConfigError(f"row_bytes must be >= 1 byte per row, got {min(values)}")
    return values


def parse_row_bytes(text: str) -> tuple[int, ...]:
    """Parse ``--row-bytes``: one byte count for all tables, or 26 comma-separated ones."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--row-bytes must be one integer or {NUM_CATEGORICAL} comma-separated ones, got {text!r}"
        ) from None
    return check_row_bytes(values[0] if len(values) == 1 else values)


def parse_fractions(text: str) -> tuple[float, ...]:
    """Parse ``--fractions``: comma-separated fractions in (0, 1], or percentages (``10%``); sorted."""
    values = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part[:-1]) / 100.0 if part.endswith("%") else float(part)
        except ValueError:
            raise ConfigError(f"--fractions must be numbers like 0.1 or 10%, got {part!r}") from None
        if not 0.0 < value <= 1.0:
            raise ConfigError(f"--fractions must lie in (0, 1] (0% to 100%), got {part!r}")
        values.append(value)
    return tuple(sorted(set(values)))


@dataclass(frozen=True)
class CoverageConfig:
    """What :func:`measure_coverage` measures.

    Args:
        table_sizes: the 26 tables' sizes (ids are reduced into them).
        row_bytes: bytes of one row of each table (e.g. DLRM dimension 16 in FP32: 64).
        fractions: hot budgets as fractions of the table bytes, each in (0, 1].
        max_rows: score only the first rows of the held-out file; None: all.
        target_fraction: the table-byte fraction of the goal shown beside the results
            (90 % of lookups from 10 % of the table bytes).
        target_hit_rate: the held-out hit rate of that goal.
    """

    table_sizes: tuple[int, ...]
    row_bytes: tuple[int, ...]
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    max_rows: int | None = None
    target_fraction: float = 0.1
    target_hit_rate: float = 0.9

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", check_table_sizes(self.table_sizes))
        object.__setattr__(self, "row_bytes", check_row_bytes(self.row_bytes))
        if not self.fractions or any(not 0.0 < f <= 1.0 for f in self.fractions):
            raise ConfigError(f"fractions must be one or more values in (0, 1], got {self.fractions}")
        object.__setattr__(self, "fractions", tuple(sorted(set(self.fractions))))
        if self.max_rows is not None and self.max_rows <= 0:
            raise ConfigError(f"max_rows must be positive, got {self.max_rows}")
        if not 0.0 < self.target_fraction <= 1.0 or not 0.0 <= self.target_hit_rate <= 1.0:
            raise ConfigError("target_fraction must lie in (0, 1] and target_hit_rate in [0, 1]")

    @property
    def table_bytes(self) -> int:
        """Bytes of all rows of all tables."""
        return sum(s * b for s, b in zip(self.table_sizes, self.row_bytes, strict=True))


@dataclass(frozen=True)
class BudgetResult:
    """Hit rates of one hot budget.

    Attributes:
        reference: what the fraction is of: ``tables`` (all rows of the tables) or
            ``profiled`` (the rows the profile saw looked up at least once).
        fraction: the budget as that fraction of the reference's bytes.
        budget_bytes: the budget.
        hot_rows: rows kept hot; ``bytes_used`` their bytes.
        expected_hit_rate: share of the profiled lookups the hot rows serve.
        heldout_hit_rate: share of the held-out lookups they serve.
        heldout_table_hit_rate: the same for each of C1..C26.
    """

    reference: str
    fraction: float
    budget_bytes: int
    hot_rows: int
    bytes_used: int
    expected_hit_rate: float
    heldout_hit_rate: float
    heldout_table_hit_rate: tuple[float, ...]


@dataclass(frozen=True)
class CoverageResult:
    """Held-out hit rates of hot sets chosen from a profile, at several budgets.

    Attributes:
        config: what was measured.
        profile_source, profile_rows: the profiled (training) file and its rows.
        heldout_source, heldout_rows: the scored file and its rows.
        profiled_rows: distinct table rows the profile saw; ``profiled_bytes`` their bytes.
        heldout_seen_share: share of held-out lookups whose row the profile saw: the
            hit rate of an unlimited budget.
        results: one per (reference, fraction), ``tables`` first.
        command, created: how and when it was measured.
    """

    config: CoverageConfig
    profile_source: str
    profile_rows: int
    heldout_source: str
    heldout_rows: int
    profiled_rows: int
    profiled_bytes: int
    heldout_seen_share: float
    results: tuple[BudgetResult, ...]
    command: str = ""
    created: str = ""

    def result_at(self, reference: str, fraction: float) -> BudgetResult | None:
        """The result of one budget, or None if it was not measured."""
        for r in self.results:
            if r.reference == reference and math.isclose(r.fraction, fraction):
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        target = self.result_at("tables", self.config.target_fraction)
        return {
            "command": self.command,
            "created": self.created,
            "profile": {"source": self.profile_source, "rows": self.profile_rows},
            "heldout": {"source": self.heldout_source, "rows": self.heldout_rows},
            "table_sizes": list(self.config.table_sizes),
            "row_bytes": list(self.config.row_bytes),
            "table_rows": sum(self.config.table_sizes),
            "table_bytes": self.config.table_bytes,
            "profiled_rows": self.profiled_rows,
            "profiled_bytes": self.profiled_bytes,
            "heldout_seen_share": self.heldout_seen_share,
            "target": {
                "fraction_of_table_bytes": self.config.target_fraction,
                "hit_rate": self.config.target_hit_rate,
                "measured": None if target is None else target.heldout_hit_rate,
                "met": None if target is None else target.heldout_hit_rate >= self.config.target_hit_rate,
            },
            "results": [
                {
                    **r.__dict__,
                    "heldout_table_hit_rate": dict(
                        zip(CATEGORICAL_COLUMNS, r.heldout_table_hit_rate, strict=True)
                    ),
                }
                for r in self.results
            ],
        }

    def markdown(self) -> str:
        """The result as a short markdown report."""
        cfg = self.config
        table_rows = sum(cfg.table_sizes)
        lines = [
            "# Hot-row coverage on held-out lookups",
            "",
            section_start(SECTION_RESULTS),
            f"Created {self.created}. Command: `{self.command}`",
            "",
            f"- Profiled: {self.profile_rows:,} rows of `{self.profile_source}`; scored: "
            f"{self.heldout_rows:,} held-out rows of `{self.heldout_source}` "
            f"({self.heldout_rows * NUM_CATEGORICAL:,} lookups).",
            f"- Tables: {table_rows:,} rows, {cfg.table_bytes / 2**20:,.1f} MiB "
            f"(row bytes {_describe_row_bytes(cfg.row_bytes)}).",
            f"- The profile saw {self.profiled_rows:,} of those rows "
            f"({self.profiled_rows / table_rows:.2%} of the table rows, "
            f"{self.profiled_bytes / 2**20:,.1f} MiB); {self.heldout_seen_share:.2%} of the held-out "
            "lookups fall on them: no budget can serve more.",
            "- Hot rows are chosen greedily across tables by profiled lookups (`export.tables.hot_rows`).",
            "",
        ]
        target = self.result_at("tables", cfg.target_fraction)
        if target is not None:
            verdict = "met" if target.heldout_hit_rate >= cfg.target_hit_rate else "not met"
            lines += [
                f"**Target: >= {cfg.target_hit_rate:.0%} of held-out lookups from {cfg.target_fraction:.0%} "
                f"of the table bytes: {target.heldout_hit_rate:.2%} ({verdict}).**",
                "",
            ]
        for reference, title in (
            ("tables", "Budget as a fraction of the table bytes (all rows of --table-sizes)"),
            ("profiled", "Budget as a fraction of the profiled rows' bytes (rows looked up at least once)"),
        ):
            lines += [
                f"## {title}",
                "",
                "| fraction | budget | hot rows | profiled hit rate | held-out hit rate |",
                "|---:|---:|---:|---:|---:|",
            ]
            for r in self.results:
                if r.reference == reference:
                    every = " (all profiled)" if r.hot_rows == self.profiled_rows else ""
                    lines.append(
                        f"| {_percent(r.fraction)} | {_size(r.budget_bytes)} | {r.hot_rows:,}{every} | "
                        f"{r.expected_hit_rate:.2%} | {r.heldout_hit_rate:.2%} |"
                    )
            lines.append("")
        lines[-1] = section_end(SECTION_RESULTS)  # in place of the blank line after the last table
        lines += ["", f"![held-out hit rate]({HIT_RATE_PNG})", ""]
        return "\n".join(lines)


def _describe_row_bytes(row_bytes: tuple[int, ...]) -> str:
    return str(row_bytes[0]) if len(set(row_bytes)) == 1 else ", ".join(map(str, row_bytes))


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.4g} %"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def measure_coverage(
    profile: AccessProfile,
    heldout: Path | str,
    config: CoverageConfig,
    on_rows: Callable[[int], None] | None = None,
    command: str = "",
) -> CoverageResult:
    """Choose hot rows from ``profile`` at each budget and score them on a held-out file, in one pass.

    Each fraction gives two budgets: of the table bytes (``tables``: every row of
    ``config.table_sizes``) and of the profiled rows' bytes (``profiled``). The hot
    set of a budget is the same one ``export.tables.hot_rows.choose_hot_rows`` returns.

    Args:
        profile: the training file's profile (raw ids, or reduced into ``config.table_sizes``).
        heldout: a Criteo TSV file to score, e.g. written with another seed.
        config: sizes, row bytes, budgets.
        on_rows: called with the rows of each held-out chunk (progress).
        command: the command line, for the record.

    Returns:
        The hit rates.

    Raises:
        ConfigError: the profile was reduced into other table sizes.
        DataError: the held-out file is missing, malformed or empty.
    """
    profile = profile.reduced(config.table_sizes)
    ranking = HotRanking(profile)
    row_bytes = np.asarray(config.row_bytes, dtype=np.int64)
    profiled_bytes = int(sum(t.distinct * b for t, b in zip(profile.tables, config.row_bytes, strict=True)))
    budgets: list[tuple[str, float, int]] = []
    for reference, total in (("tables", config.table_bytes), ("profiled", profiled_bytes)):
        budgets += [(reference, f, rows_at(f, total)) for f in config.fractions]
    kept = np.array([ranking.rows_within(config.row_bytes, b) for _, _, b in budgets], dtype=np.int64)
    # Hits of a budget keeping k rows: lookups of rank < k. Bucket each lookup by how many
    # budgets' k are <= its rank; a budget's hits are then the lookups of buckets <= its sorted place.
    order = np.argsort(kept, kind="stable")
    sorted_kept = kept[order]
    buckets = np.zeros((NUM_CATEGORICAL, len(budgets) + 1), dtype=np.int64)
    heldout_rows = seen_lookups = 0
    for raw in iter_raw(heldout):
        ids = raw.ids
        if config.max_rows is not None and heldout_rows + len(raw) > config.max_rows:
            ids = ids[: config.max_rows - heldout_rows]
        ranks = ranking.ranks_of(hash_ids(ids, config.table_sizes))
        seen_lookups += int(np.count_nonzero(ranks < len(ranking)))
        place = np.searchsorted(sorted_kept, ranks, side="right")
        for t in range(NUM_CATEGORICAL):
            buckets[t] += np.bincount(place[:, t], minlength=len(budgets) + 1)
        heldout_rows += ids.shape[0]
        if on_rows is not None:
            on_rows(ids.shape[0])
        if config.max_rows is not None and heldout_rows >= config.max_rows:
            break
    if heldout_rows == 0:
        raise DataError(f"{heldout}: no rows")
    hits_sorted = np.cumsum(buckets, axis=1)  # column j: lookups hit by the j-th smallest budget
    results = []
    for i, (reference, fraction, budget) in enumerate(budgets):
        j = int(np.flatnonzero(order == i)[0])
        hits = hits_sorted[:, j]
        k = int(kept[i])
        results.append(
            BudgetResult(
                reference=reference,
                fraction=fraction,
                budget_bytes=budget,
                hot_rows=k,
                bytes_used=int(row_bytes[ranking.tables[:k]].sum()),
                expected_hit_rate=float(ranking.counts[:k].sum()) / ranking.lookups,
                heldout_hit_rate=float(hits.sum()) / (heldout_rows * NUM_CATEGORICAL),
                heldout_table_hit_rate=tuple(float(h) / heldout_rows for h in hits),
            )
        )
    return CoverageResult(
        config=config,
        profile_source=profile.source,
        profile_rows=profile.rows,
        heldout_source=str(heldout),
        heldout_rows=heldout_rows,
        profiled_rows=len(ranking),
        profiled_bytes=profiled_bytes,
        heldout_seen_share=seen_lookups / (heldout_rows * NUM_CATEGORICAL),
        results=tuple(results),
        command=command,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def plot_coverage(result: CoverageResult, path: Path) -> Path:
    """Draw held-out (solid) and profiled (dashed) hit rate against the hot budget, log-scaled x.

    Returns:
        ``path``.
    """
    from matplotlib.ticker import NullFormatter, PercentFormatter

    with figure(path) as (ax,):
        for reference, color, label in (
            ("tables", "tab:blue", "of the table bytes"),
            ("profiled", "tab:orange", "of the profiled rows' bytes"),
        ):
            rows = [r for r in result.results if r.reference == reference]
            x = [r.fraction for r in rows]
            ax.plot(
                x, [r.heldout_hit_rate for r in rows], "o-", color=color, label=f"held-out, budget {label}"
            )
            ax.plot(
                x,
                [r.expected_hit_rate for r in rows],
                "--",
                color=color,
                alpha=0.6,
                label=f"profiled, budget {label}",
            )
        cfg = result.config
        ax.axhline(cfg.target_hit_rate, color="gray", linewidth=0.8, linestyle=":")
        ax.axvline(cfg.target_fraction, color="gray", linewidth=0.8, linestyle=":")
        ax.axhline(result.heldout_seen_share, color="tab:green", linewidth=0.8, alpha=0.7,
                   label="held-out lookups on profiled rows (any budget's limit)")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xticks(cfg.fractions, [_percent(f) for f in cfg.fractions])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel("hot budget (fraction of bytes)")
        ax.set_ylabel("share of lookups served by hot rows")
        ax.set_title(f"hot-row hit rate: {result.heldout_rows:,} held-out rows", fontsize=TITLE_SIZE)
        ax.legend(fontsize=8, loc="lower right")
    return path


def write_coverage(result: CoverageResult, out: Path | str) -> dict[str, Path]:
    """Write ``result.json``, ``result.md`` and ``hit_rate.png`` into ``out`` (created).

    Returns:
        The written files by kind (``json``, ``markdown``, ``plot``).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / RESULT_JSON
    json_path.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    md_path = out / RESULT_MD
    md_path.write_text(result.markdown())
    return {"json": json_path, "markdown": md_path, "plot": plot_coverage(result, out / HIT_RATE_PNG)}
