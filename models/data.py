"""Training data: a Criteo file read once and split into train and validation rows."""

from __future__ import annotations

from pathlib import Path

from bundle.errors import DataError
from criteo.tsv import Batch, read_batch
from models.config import TrainConfig


def _read(path: Path, max_rows: int | None, hotness: tuple[int, ...] | None) -> Batch:
    """A Criteo file's rows, or, for a multi-hot model, a multi-hot text file's (``B x H`` bags)."""
    if hotness is None:
        return read_batch(path, max_rows)
    from criteo.multihot import fixed_bags, read_bags

    return fixed_bags(read_bags(path, max_rows), hotness)


def load_split(
    data: Path, valid: Path | None, train: TrainConfig, hotness: tuple[int, ...] | None = None
) -> tuple[Batch, Batch]:
    """Read the training rows and the validation rows.

    Args:
        data: labeled Criteo TSV file.
        valid: a separate labeled file for validation, or None to hold out the
            last ``train.valid_fraction`` of ``data`` (click logs are in time order).
        train: training options (``max_rows``, ``valid_fraction``).
        hotness: a multi-hot model's ids per table: the files are then in the multi-hot text
            format (:mod:`criteo.multihot`), every bag of its table's size.

    Returns:
        ``(train_rows, valid_rows)``, both labeled.
    """
    rows = _read(data, train.max_rows, hotness)
    if rows.labels is None:
        raise DataError(f"{data}: training needs labeled rows (40 fields per line)")
    if valid is not None:
        valid_rows = _read(valid, None, hotness)
        if valid_rows.labels is None:
            raise DataError(f"{valid}: validation needs labeled rows")
        return rows, valid_rows
    cut = int(len(rows) * (1.0 - train.valid_fraction))
    if cut == 0 or cut == len(rows):
        raise DataError(f"{data}: {len(rows)} rows are too few to split for validation")
    return rows.slice(0, cut), rows.slice(cut, len(rows))
