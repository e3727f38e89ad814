"""Per-table sizes: the rows of each of the 26 embedding tables, and the published ones.

Real Criteo models have a different size per table: the Kaggle data set (Display
Advertising Challenge) has from 3 to about 10 million distinct ids per column, and
DLRM practice caps the Terabyte data set's columns at 40 million rows
(facebookresearch/dlrm ``--max-ind-range=40000000``, the MLPerf DLRM benchmark).
Each model config keeps 26 sizes; ``--table-size N`` still means "all 26 = N".
"""

from __future__ import annotations

from collections.abc import Sequence

from bundle.errors import ConfigError
from bundle.schema import NUM_CATEGORICAL
from criteo.schema import CATEGORICAL_COLUMNS

#: Distinct ids of C1..C26 in the Criteo Kaggle data set, as facebookresearch/dlrm's
#: preprocessing counts them (33,762,577 rows in all).
CRITEO_KAGGLE: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
#: Rows of C1..C26 for Criteo Terabyte with ids capped at 40 million, as facebookresearch/dlrm's
#: ``--max-ind-range=40000000`` and the MLPerf DLRM benchmark size them (187,767,399 rows in all).
CRITEO_TERABYTE: tuple[int, ...] = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)  # fmt: skip
#: Rows of the 26 tables of MLPerf's DLRM-DCNv2 (``dlrm-v2``: Criteo 1TB, ids capped at 40 million
#: rows, as mlcommons/inference ``recommendation/dlrm_v2`` and mlcommons/training
#: ``recommendation_v2/torchrec_dlrm`` size them; 204,184,588 rows in all).
MLPERF_DCNV2: tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
#: Published per-table sizes by name (``--table-sizes criteo-kaggle``).
TABLE_SIZE_PRESETS: dict[str, tuple[int, ...]] = {
    "criteo-kaggle": CRITEO_KAGGLE,
    "criteo-terabyte": CRITEO_TERABYTE,
    "mlperf-dcnv2": MLPERF_DCNV2,
}


def check_table_sizes(sizes: Sequence[int], what: str = "table_sizes") -> tuple[int, ...]:
    """``sizes`` as a tuple of 26 ints, each >= 1.

    Raises:
        ConfigError: not 26 sizes, or a size below 1.
    """
    values = tuple(int(size) for size in sizes)
    if len(values) != NUM_CATEGORICAL:
        raise ConfigError(f"{what} needs {NUM_CATEGORICAL} sizes (C1..C26), got {len(values)}")
    small = [f"{CATEGORICAL_COLUMNS[i]}={size}" for i, size in enumerate(values) if size < 1]
    if small:
        raise ConfigError(f"{what}: every table needs at least 1 row, got {', '.join(small)}")
    return values


def uniform_table_sizes(size: int) -> tuple[int, ...]:
    """26 tables of ``size`` rows each (what ``--table-size N`` means)."""
    return check_table_sizes([size] * NUM_CATEGORICAL, "table_size")


def parse_table_sizes(text: str) -> tuple[int, ...]:
    """Parse ``--table-sizes``: a preset name, one size for all 26 tables, or 26 comma-separated sizes.

    Examples: ``criteo-kaggle``, ``100000``, ``1460,583,10131227,...``.

    Raises:
        ConfigError: anything else, with what was expected.
    """
    text = text.strip()
    if text.lower() in TABLE_SIZE_PRESETS:
        return TABLE_SIZE_PRESETS[text.lower()]
    try:
        values = [int(part.replace("_", "")) for part in text.split(",")]
    except ValueError:
        raise ConfigError(
            f"--table-sizes must be {' or '.join(TABLE_SIZE_PRESETS)}, one size, or {NUM_CATEGORICAL} "
            f"comma-separated sizes; got {text!r}"
        ) from None
    if len(values) == 1:
        return uniform_table_sizes(values[0])
    return check_table_sizes(values, "--table-sizes")


def table_offsets(sizes: Sequence[int]) -> tuple[int, ...]:
    """First row of each table when the 26 tables are stacked into one: ``0, s_1, s_1 + s_2, ...``."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += int(size)
    return tuple(offsets)
