"""Multi-hot inputs: a bag of ids per table, of a fixed size per table (its *hotness*).

DLRM-DCNv2 as MLPerf's ``dlrm-v2`` runs it looks up a bag of ids in each table and
sums their rows. With a fixed hotness ``h_t`` per table, a sample's ids are one
``B x H`` int64 tensor, ``H = h_1 + .. + h_26``: C1's ``h_1`` ids first, then C2's,
and so on (the form NVIDIA's MLPerf harness feeds). :func:`expand` makes such rows
from single-hot Criteo rows the way MLPerf's ``materialize_synthetic_multihot_dataset.py``
does with ``--multi_hot_distribution_type uniform``: a bag's first id is the row's
own id, each other id that id plus an offset drawn uniformly, so a bag keeps the
row's signal and adds rows of the same table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL
from criteo.tables import table_offsets

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
