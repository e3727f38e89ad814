"""Flat rows sent to a ranking model: each run of rows that share a user's features is one request.

A ranking model (its config's ``user_features`` parameter: :class:`bundle.schema.FeatureSplit`)
takes one user and its candidates a request. A client holding flat rows (a Criteo file,
``dense_features`` and ``categorical_ids``) where each user's candidates follow one another
gets one request per run of consecutive rows whose user features are equal: the user's part
from the run's first row, each row of the run a candidate. The answers, one per candidate,
come back in the rows' order, as a flat model's would (``B x 1``). A user split across two
batches of a file is two requests, with the same answers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bundle.errors import ClientError
from bundle.schema import (
    CANDIDATE_CATEGORICAL_INPUT,
    CANDIDATE_DENSE_INPUT,
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    FeatureSplit,
)


def is_flat(inputs: Mapping[str, np.ndarray]) -> bool:
    """Whether ``inputs`` are a flat model's rows (the schema's two tensors), not a ranking request."""
    return set(inputs) == {DENSE_INPUT, CATEGORICAL_INPUT}


def user_runs(
    split: FeatureSplit, hotness: tuple[int, ...] | None, dense: np.ndarray, ids: np.ndarray
) -> list[tuple[int, int]]:
    """``(start, stop)`` of each run of consecutive rows whose user features are equal."""
    rows = int(dense.shape[0])
    if rows == 0:
        return []
    user_positions, _ = split.positions(hotness)
    new = np.zeros(rows, dtype=bool)
    new[0] = True
    if split.user_dense:
        part = dense[:, list(split.user_dense)]
        # Bitwise: a NaN equals itself here, and -0.0 is not 0.0 (the model may tell them apart).
        bits = part.view(np.int32) if part.dtype == np.float32 else part
        new[1:] |= np.any(bits[1:] != bits[:-1], axis=1)
    if user_positions:
        part = ids[:, list(user_positions)]
        new[1:] |= np.any(part[1:] != part[:-1], axis=1)
    starts = np.flatnonzero(new).tolist()
    return list(zip(starts, [*starts[1:], rows], strict=True))


def user_requests(
    split: FeatureSplit, hotness: tuple[int, ...] | None, inputs: Mapping[str, np.ndarray]
) -> list[dict[str, np.ndarray]]:
    """One ranking request per run of :func:`user_runs` of flat ``inputs``.

    Raises:
        ClientError: the rows are not ``B x 13`` float32 and ``B x H`` int64 (``H`` the model's).
    """
    dense, ids = np.asarray(inputs[DENSE_INPUT]), np.asarray(inputs[CATEGORICAL_INPUT])
    width = sum(len(positions) for positions in split.positions(hotness))
    if dense.ndim != 2 or ids.ndim != 2 or dense.shape[0] != ids.shape[0] or ids.shape[1] != width:
        raise ClientError(
            f"rows for a ranking model must be B x 13 {DENSE_INPUT} and B x {width} {CATEGORICAL_INPUT}, "
            f"got {list(dense.shape)} and {list(ids.shape)}"
        )
    if dense.shape[0] == 0:
        raise ClientError("empty batch (0 rows)")
    return [split.split(dense[a:b], ids[a:b], hotness) for a, b in user_runs(split, hotness, dense, ids)]


def check_request(prefix: str, inputs: Mapping[str, np.ndarray]) -> None:
    """A ranking request's candidates: at least one, and as many in each candidate part.

    Raises:
        ClientError: an empty candidate part, or parts that disagree.
    """
    counts = {
        name: int(np.shape(inputs[name])[1])
        for name in (CANDIDATE_DENSE_INPUT, CANDIDATE_CATEGORICAL_INPUT)
        if name in inputs and np.ndim(inputs[name]) == 3
    }
    empty = [name for name, count in counts.items() if count == 0]
    if empty:
        raise ClientError(
            f"{prefix}: input {empty[0]!r} holds no candidates; a ranking request needs one or more"
        )
    if len(set(counts.values())) > 1:
        raise ClientError(f"{prefix}: the candidate inputs disagree on the number of candidates: {counts}")


def answers(parts: list[np.ndarray]) -> np.ndarray:
    """The answers of a run of ranking requests (each ``1 x C x 1``) as one flat ``B x 1``."""
    return np.concatenate([np.asarray(part).reshape(-1, 1) for part in parts])
