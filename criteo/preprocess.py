"""Preprocessing as in DLRM practice.

Counts: missing or negative -> 0, then ``log1p``. Categorical ids: the hex
value as an integer, a missing id -> :data:`criteo.schema.MISSING_ID`; each
model reduces ids into its table with a modulo (:func:`hash_ids` is the same
operation, for code that wants table indices outside a model).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from criteo.rows import preprocess_counts

__all__ = ["hash_ids", "preprocess_counts", "preprocess_ids"]


def preprocess_ids(ids: np.ndarray) -> np.ndarray:
    """Categorical ids as int64 (the model does the hashing into its tables)."""
    return np.ascontiguousarray(ids, dtype=np.int64)


def hash_ids(ids: np.ndarray, table_sizes: Sequence[int]) -> np.ndarray:
    """Reduce ids into each table: ``ids[:, t] mod table_sizes[t]`` (non-negative).

    This is the exact operation the exported graphs apply, so an id of any
    int64 value lands inside its table.

    Args:
        ids: ``B x 26`` int64.
        table_sizes: rows of each of the 26 tables.

    Returns:
        ``B x 26`` int64 in ``[0, table_sizes[t])``.
    """
    sizes = np.asarray(table_sizes, dtype=np.int64)
    return np.mod(ids, sizes[None, :])
