"""The embedding stage's contract computed one id at a time, with Python's % and a dict: nothing
shared with the stage's numpy code, for the tests that check it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def stage_contract(
    ids: np.ndarray,
    hot_ids: Sequence[np.ndarray],
    table_sizes: Sequence[int],
    tables: Sequence[np.ndarray],
    hotness: Sequence[int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hot slots (``B x H``), cold positions (``b * H + p``) and cold rows (float32) of ``B x H`` bags,
    table ``t``'s bag ``hotness[t]`` ids, C1's first."""
    table_of = [t for t, count in enumerate(hotness) for _ in range(count)]
    slot_of = [{int(i): s + 1 for s, i in enumerate(table)} for table in hot_ids]
    width = int(np.asarray(tables[0]).shape[1])
    slots, positions, rows = np.zeros(ids.shape, dtype=np.int64), [], []
    for b in range(ids.shape[0]):
        for p, t in enumerate(table_of):
            row = int(ids[b, p]) % table_sizes[t]
            slots[b, p] = slot_of[t].get(row, 0)
            if not slots[b, p]:
                positions.append(b * ids.shape[1] + p)
                rows.append(np.asarray(tables[t][row]).astype(np.float32))
    return slots, np.array(positions, dtype=np.int64), np.array(rows, dtype=np.float32).reshape(-1, width)
