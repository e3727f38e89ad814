"""Multi-hot inputs: a bag of ids per table, of a fixed size per table (its *hotness*) or of any size.

DLRM-DCNv2 as MLPerf's ``dlrm-v2`` runs it looks up a bag of ids in each table and
sums their rows. With a fixed hotness ``h_t`` per table, a sample's ids are one
``B x H`` int64 tensor, ``H = h_1 + .. + h_26``: C1's ``h_1`` ids first, then C2's,
and so on (the form NVIDIA's MLPerf harness feeds). :func:`expand` makes such rows
from single-hot Criteo rows the way MLPerf's ``materialize_synthetic_multihot_dataset.py``
does with ``--multi_hot_distribution_type uniform``: a bag's first id is the row's
own id, each other id that id plus an offset drawn uniformly, so a bag keeps the
row's signal and adds rows of the same table.

Bags of any size (``--hotness variable``) travel as values and lengths
(:class:`BagBatch`, the tensors of :data:`bundle.schema.BAG_INPUTS`);
:func:`draw_bags` makes them from single-hot rows, empty bags included.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bundle.errors import ConfigError, DataError
from bundle.schema import (
    DENSE_INPUT,
    LENGTHS_INPUT,
    NUM_CATEGORICAL,
    NUM_DENSE,
    VALUES_INPUT,
    VARIABLE_HOTNESS,
)
from criteo.preprocess import preprocess_counts
from criteo.tables import table_offsets
from criteo.tsv import Batch, open_text

#: MLPerf's ``dlrm-v2`` hotness of C1..C26 (214 ids per sample; mlcommons/training
#: ``recommendation_v2/torchrec_dlrm``, ``--multi_hot_sizes``).
MLPERF_HOTNESS: tuple[int, ...] = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
#: One id per table: the 2019 DLRM's input.
SINGLE_HOT: tuple[int, ...] = (1,) * NUM_CATEGORICAL
#: Offsets of a bag's other ids are drawn from [1, OFFSET_RANGE).
OFFSET_RANGE = 1 << 31


def parse_hotness(text: str) -> tuple[int, ...]:
    """Parse ``--hotness``: ``mlperf``, one count for all 26 tables, or 26 comma-separated counts.

    Raises:
        ConfigError: anything else, or a count below 1.
    """
    text = text.strip()
    if text.lower() == "mlperf":
        return MLPERF_HOTNESS
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--hotness must be mlperf, one count, or {NUM_CATEGORICAL} comma-separated counts; got {text!r}"
        ) from None
    if len(values) == 1:
        values = values * NUM_CATEGORICAL
    return check_hotness(values)


def check_hotness(values: Sequence[int]) -> tuple[int, ...]:
    """``values`` as 26 counts, each >= 1.

    Raises:
        ConfigError: not 26 counts, or one below 1.
    """
    counts = tuple(int(v) for v in values)
    if len(counts) != NUM_CATEGORICAL:
        raise ConfigError(f"hotness needs {NUM_CATEGORICAL} counts (C1..C26), got {len(counts)}")
    if min(counts) < 1:
        raise ConfigError(f"every table's hotness must be >= 1, got {min(counts)}")
    return counts


def is_single_hot(hotness: Sequence[int]) -> bool:
    """One id per table."""
    return all(h == 1 for h in hotness)


def bag_starts(hotness: Sequence[int]) -> tuple[int, ...]:
    """Column of each table's first id in a ``B x H`` row: ``0, h_1, h_1 + h_2, ..``
    (the running sum that also places stacked tables, :func:`criteo.tables.table_offsets`)."""
    return table_offsets(hotness)


def expand(ids: np.ndarray, hotness: Sequence[int], seed: int = 0) -> np.ndarray:
    """Multi-hot rows from single-hot ones: ``B x 26`` int64 -> ``B x H``.

    Each table's bag starts with the row's own id; its other ids add an offset drawn
    uniformly from ``[1, 2^31)`` (int64 arithmetic wraps, and the model reduces any
    int64 id into its table). The same ``seed`` gives the same bags.
    """
    counts = check_hotness(hotness)
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2 or ids.shape[1] != NUM_CATEGORICAL:
        raise ConfigError(f"expected B x {NUM_CATEGORICAL} ids to expand, got {ids.shape}")
    rng = np.random.default_rng(seed)
    columns = np.repeat(np.arange(NUM_CATEGORICAL), counts)
    out = ids[:, columns].copy()
    first = np.zeros(out.shape[1], dtype=bool)
    first[list(bag_starts(counts))] = True
    offsets = rng.integers(1, OFFSET_RANGE, size=(ids.shape[0], int((~first).sum())), dtype=np.int64)
    with np.errstate(over="ignore"):
        out[:, ~first] += offsets
    return out


def parse_bags(text: str) -> tuple[int, ...] | str:
    """``--hotness``: :data:`bundle.schema.VARIABLE_HOTNESS` (bags of any size) as it is, else
    :func:`parse_hotness`'s counts."""
    if text.strip().lower() == VARIABLE_HOTNESS:
        return VARIABLE_HOTNESS
    return parse_hotness(text)


#: Largest bag :func:`draw_bags` makes per table: twice MLPerf's hotness, so bags average
#: MLPerf's sizes (214 ids a row) and every table has empty bags.
DRAWN_MAX_LENGTHS: tuple[int, ...] = tuple(2 * h for h in MLPERF_HOTNESS)


@dataclass(frozen=True)
class BagBatch(Batch):
    """Rows whose tables each look up a bag of any size: values and lengths.

    Attributes:
        dense: ``B x 13`` float32.
        categorical: the values, ``N`` int64: row after row, C1's bag first within a row.
        labels: ``B`` float32, or None.
        lengths: ``B x 26`` int64, each bag's size (0: empty); they add up to ``N``.
    """

    lengths: np.ndarray

    def __post_init__(self) -> None:
        lengths = np.asarray(self.lengths)
        if lengths.ndim != 2 or lengths.shape != (len(self.dense), NUM_CATEGORICAL):
            raise DataError(f"bag lengths must be B x {NUM_CATEGORICAL}, got {lengths.shape}")
        if (lengths < 0).any() or int(lengths.sum()) != int(np.asarray(self.categorical).size):
            total, held = int(lengths.sum()), int(np.asarray(self.categorical).size)
            raise DataError(f"bag lengths add up to {total}, the values hold {held}")

    @property
    def values(self) -> np.ndarray:
        """Every id, ``N`` int64."""
        return self.categorical

    def row_starts(self) -> np.ndarray:
        """Index of each row's first value, and ``N`` last: ``B + 1`` int64."""
        return np.concatenate(([0], np.cumsum(self.lengths.sum(axis=1)))).astype(np.int64)

    def inputs(self) -> dict[str, np.ndarray]:
        """The model inputs keyed by tensor name (:data:`bundle.schema.BAG_INPUTS`)."""
        return {DENSE_INPUT: self.dense, VALUES_INPUT: self.categorical, LENGTHS_INPUT: self.lengths}

    def slice(self, start: int, stop: int) -> BagBatch:
        """Rows ``start:stop`` (views)."""
        starts = self.row_starts()
        rows = range(len(self))[start:stop]
        first, last = (starts[rows.start], starts[rows.stop]) if len(rows) else (0, 0)
        labels = None if self.labels is None else self.labels[start:stop]
        values = self.categorical[first:last]
        return BagBatch(self.dense[start:stop], values, labels, self.lengths[start:stop])

    def with_values(self, values: np.ndarray) -> BagBatch:
        """The same bags holding other ids (``N`` int64)."""
        return BagBatch(self.dense, np.asarray(values, dtype=np.int64), self.labels, self.lengths)

    def value_columns(self) -> np.ndarray:
        """The column (0 = C1) of each value: ``N`` int64."""
        return np.repeat(np.tile(np.arange(NUM_CATEGORICAL), len(self)), self.lengths.reshape(-1))

    def per_table(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each table's ids, bag after bag (row order), and its bags' lengths: the layout of
        TorchRec's ``KeyedJaggedTensor`` (one key per table, C1..C26)."""
        column = self.value_columns()
        values = [self.categorical[column == c] for c in range(NUM_CATEGORICAL)]
        return values, [self.lengths[:, c].copy() for c in range(NUM_CATEGORICAL)]


def draw_bags(batch: Batch, max_lengths: Sequence[int] = DRAWN_MAX_LENGTHS, seed: int = 0) -> BagBatch:
    """Bags of any size from single-hot rows: table ``t``'s bag has a size drawn uniformly
    from ``0 .. max_lengths[t]`` (empty bags included), its first id the row's own id and
    the others that id plus an offset, as :func:`expand` makes them. The same ``seed`` gives
    the same bags.
    """
    ids = np.asarray(batch.categorical, dtype=np.int64)
    if ids.ndim != 2 or ids.shape[1] != NUM_CATEGORICAL:
        raise ConfigError(f"expected B x {NUM_CATEGORICAL} ids to draw bags from, got {ids.shape}")
    limits = np.asarray(max_lengths, dtype=np.int64)
    if limits.shape != (NUM_CATEGORICAL,) or (limits < 0).any():
        raise ConfigError(f"bag size limits need {NUM_CATEGORICAL} counts >= 0, got {list(max_lengths)}")
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, limits + 1, size=ids.shape, dtype=np.int64)
    flat = lengths.reshape(-1)
    owner = np.repeat(ids.reshape(-1), flat)
    # Position of each value within its bag: 0 for the bag's first id.
    starts = np.repeat(np.cumsum(flat) - flat, flat)
    within = np.arange(owner.size, dtype=np.int64) - starts
    offsets = rng.integers(1, OFFSET_RANGE, size=owner.size, dtype=np.int64)
    with np.errstate(over="ignore"):
        values = np.where(within == 0, owner, owner + offsets)
    return BagBatch(batch.dense, values, batch.labels, lengths)


# The multi-hot text format: Criteo's TSV (a label, 13 counts, 26 categorical fields, tab
# separated; the unlabeled form without the label) whose categorical fields each hold a bag
# of hex ids separated by commas; an empty field is an empty bag. A Criteo file is one of
# fixed hotness 1 where no id is missing. ``python -m criteo synth --hotness`` writes it.
BAG_SEPARATOR = ","


def parse_bag_lines(lines: Sequence[str], path: str = "<rows>", first_line: int = 1) -> BagBatch:
    """Rows of the multi-hot text format as a :class:`BagBatch` (labels when each row has 40 fields).

    Raises:
        DataError: a row with another number of fields, a count or id that is not a number,
            naming the file, line and column.
    """
    rows = len(lines)
    counts = np.zeros((rows, NUM_DENSE), dtype=np.int64)
    missing = np.zeros((rows, NUM_DENSE), dtype=bool)
    lengths = np.zeros((rows, NUM_CATEGORICAL), dtype=np.int64)
    labels = np.zeros(rows, dtype=np.float32)
    labeled: bool | None = None
    ids: list[str] = []
    for row, line in enumerate(lines):
        where = f"{path}:{first_line + row}"
        fields = line.rstrip("\r\n").split("\t")
        has_label = len(fields) == 1 + NUM_DENSE + NUM_CATEGORICAL
        if not has_label and len(fields) != NUM_DENSE + NUM_CATEGORICAL:
            raise DataError(f"{where}: {len(fields)} fields, expected 40 (labeled) or 39")
        if labeled is None:
            labeled = has_label
        elif labeled != has_label:
            raise DataError(f"{where}: {len(fields)} fields where the rows before had {39 + int(labeled)}")
        if has_label:
            try:
                labels[row] = float(fields[0])
            except ValueError:
                raise DataError(f"{where}: label {fields[0]!r} is not a number") from None
            fields = fields[1:]
        for column, text in enumerate(fields[:NUM_DENSE]):
            if text == "":
                missing[row, column] = True
                continue
            try:
                counts[row, column] = int(text)
            except ValueError:
                raise DataError(f"{where}: I{column + 1} {text!r} is not an integer") from None
        for table, text in enumerate(fields[NUM_DENSE:]):
            if text == "":
                continue
            bag = text.split(BAG_SEPARATOR)
            lengths[row, table] = len(bag)
            ids.extend(bag)
    try:
        values = np.array([int(text, 16) for text in ids], dtype=np.uint64).astype(np.int64)
    except (ValueError, OverflowError):
        bad = next(text for text in ids if not _is_hex(text))
        raise DataError(f"{path}: id {bad!r} is not a hex number of at most 64 bits") from None
    dense = preprocess_counts(counts, missing)
    return BagBatch(dense, values, labels if labeled else None, lengths)


#: Lines :func:`holds_bags` reads.
SNIFF_LINES = 1000


def holds_bags(path: Path | str, lines: int = SNIFF_LINES) -> bool:
    """Whether the file's first ``lines`` rows hold a bag of more than one id (a comma in a
    categorical field): a file of the multi-hot text format, not a Criteo file.

    Raises:
        DataError: the file is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with open_text(path) as handle:
        for line in itertools.islice(handle, lines):
            fields = line.rstrip("\r\n").split("\t")
            if any(BAG_SEPARATOR in field for field in fields[-NUM_CATEGORICAL:]):
                return True
    return False


def _is_hex(text: str) -> bool:
    try:
        return 0 <= int(text, 16) < 2**64
    except ValueError:
        return False


def iter_bag_batches(path: Path | str, chunk_rows: int = 65536) -> Iterator[BagBatch]:
    """Stream a file of the multi-hot text format as :class:`BagBatch` chunks."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with open_text(path) as handle:
        first = 1
        while True:
            lines = list(itertools.islice(handle, chunk_rows))
            if not lines:
                return
            yield parse_bag_lines(lines, str(path), first)
            first += len(lines)


def fixed_bags(bags: BagBatch, hotness: Sequence[int], first_row: int = 0) -> Batch:
    """Bags of a fixed size per table as ``categorical_ids`` ``B x H`` (C1's bag first).

    Raises:
        DataError: a row whose bag has another size than ``hotness`` says, naming the row and table.
    """
    counts = np.asarray(check_hotness(hotness), dtype=np.int64)
    wrong = np.argwhere(bags.lengths != counts[None, :])
    if wrong.size:
        row, table = (int(v) for v in wrong[0])
        raise DataError(
            f"row {first_row + row + 1}, table C{table + 1}: {int(bags.lengths[row, table])} ids, "
            f"the model's bags hold {int(counts[table])}"
        )
    return Batch(bags.dense, bags.values.reshape(len(bags), int(counts.sum())), bags.labels)


def read_bags(path: Path | str, max_rows: int | None = None) -> BagBatch:
    """(Up to ``max_rows`` rows of) a file of the multi-hot text format, as one :class:`BagBatch`."""
    parts: list[BagBatch] = []
    total = 0
    for bags in iter_bag_batches(path):
        if max_rows is not None and total + len(bags) >= max_rows:
            parts.append(bags.slice(0, max_rows - total))
            break
        parts.append(bags)
        total += len(bags)
    if not parts:
        raise DataError(f"{path}: no rows")
    labels = None if parts[0].labels is None else np.concatenate([p.labels for p in parts])
    return BagBatch(
        np.concatenate([p.dense for p in parts]),
        np.concatenate([p.values for p in parts]),
        labels,
        np.concatenate([p.lengths for p in parts]),
    )
