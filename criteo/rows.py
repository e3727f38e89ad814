"""Criteo rows to model inputs, vectorised with numpy alone: the one definition of the rules.

A row is a Criteo TSV line: (a label,) 13 integer counts ``I1..I13`` and 26
categorical ids ``C1..C26`` in hex, separated by tabs. The rules:

- a count is an optional ``-`` and 1 to 18 decimal digits; a missing (empty)
  count is 0, a negative one is clamped to 0, then ``log1p`` (float32);
- an id is 1 to 16 hex digits, either case; a missing id is :data:`MISSING_ID`;
  an id of 2^63 or more wraps to a negative int64 (its 64 bits as they are), which
  the models reduce into their tables with a non-negative modulo like any id;
- a label is ``0`` or ``1``.

A row that breaks a rule is refused with a :class:`RowError` naming the row
and the field; nothing is guessed. The file reader (:mod:`criteo.tsv`), the
clients and the server's raw-row stage all parse with :func:`parse_rows`, so
the paths cannot drift apart. This module imports numpy only: the export copies
it beside the raw-row stage, which also runs in the NGC tritonserver image.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NUM_DENSE = 13
NUM_CATEGORICAL = 26
#: Fields of an unlabeled row; a labeled one has the label first.
NUM_FEATURES = NUM_DENSE + NUM_CATEGORICAL
#: The id a missing categorical field maps to before the model's modulo.
MISSING_ID = 0
#: Digits of a count at most (its value then fits an int64), and hex digits of an id.
MAX_COUNT_DIGITS = 18
MAX_ID_DIGITS = 16
DENSE_COLUMNS = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_COLUMNS = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))

_TAB, _NEWLINE, _RETURN, _MINUS = 9, 10, 13, 45
#: Each byte's hex value, 255 for a byte that is no hex digit.
_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


class RowError(ValueError):
    """A row that breaks a rule: ``row`` (0-based, in what was parsed), ``column`` (``label``,
    ``I1``.. or ``C1``..; None for a wrong field count) and what is wrong (``detail``)."""

    def __init__(self, row: int, column: str | None, detail: str) -> None:
        self.row, self.column, self.detail = row, column, detail
        super().__init__(f"row {row}: {detail}")


@dataclass(frozen=True)
class Rows:
    """Parsed rows, not yet preprocessed.

    Attributes:
        counts: ``B x 13`` int64; a missing count is -1, flagged in ``missing``.
        missing: ``B x 13`` bool.
        ids: ``B x 26`` int64 (missing: :data:`MISSING_ID`).
        labels: ``B`` float32, or None for unlabeled rows.
    """

    counts: np.ndarray
    missing: np.ndarray
    ids: np.ndarray
    labels: np.ndarray | None

    def __len__(self) -> int:
        return int(self.counts.shape[0])


def preprocess_counts(counts: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
    """Clamp counts at 0 (missing -> 0) and apply ``log1p``: ``B x 13`` float32."""
    values = np.maximum(counts, 0).astype(np.float32)
    if missing is not None:
        values[missing] = 0.0
    return np.log1p(values)


def parse_rows(data: bytes, labeled: bool | None = False, rows: int | None = None) -> Rows:
    """Parse rows separated by line breaks (``\\n`` or ``\\r\\n``; one after the last row is optional).

    Args:
        data: the rows.
        labeled: whether each row starts with a label; None: as the first row's field count says.
        rows: how many rows ``data`` must hold (None: any).

    Raises:
        RowError: the first row, in order, that breaks a rule.
    """
    buffer = np.frombuffer(data, dtype=np.uint8)
    if buffer.size and buffer[-1] != _NEWLINE:
        buffer = np.append(buffer, np.uint8(_NEWLINE))
    delimiters = np.flatnonzero((buffer == _TAB) | (buffer == _NEWLINE))
    line_ends = buffer[delimiters] == _NEWLINE
    count = int(line_ends.sum())
    if rows is not None and count != rows:
        raise RowError(
            min(count, rows), None, f"expected {rows} rows, got {count} (a line break inside a row?)"
        )
    row_of = np.cumsum(line_ends) - line_ends
    fields = np.bincount(row_of, minlength=count)
    if labeled is None:
        labeled = bool(count) and int(fields[0]) == NUM_FEATURES + 1
    width = NUM_FEATURES + int(labeled)
    wrong = np.flatnonzero(fields != width)
    if wrong.size:
        row = int(wrong[0])
        raise RowError(row, None, f"expected {width} tab-separated fields, got {int(fields[row])}")
    ends = delimiters.copy()
    # A row that ends in "\r\n": its last field ends before the "\r".
    ends[line_ends & (buffer[np.maximum(delimiters - 1, 0)] == _RETURN) & (delimiters > 0)] -= 1
    starts = np.empty_like(delimiters)
    starts[:1] = 0
    starts[1:] = delimiters[:-1] + 1
    starts, ends = starts.reshape(count, width), ends.reshape(count, width)

    labels = None
    first = int(labeled)
    if labeled:
        labels = _labels(buffer, starts[:, 0], ends[:, 0])
    counts, missing, bad_counts = _counts(
        buffer, starts[:, first : first + NUM_DENSE], ends[:, first : first + NUM_DENSE]
    )
    ids, bad_ids = _ids(buffer, starts[:, first + NUM_DENSE :], ends[:, first + NUM_DENSE :])
    bad = np.concatenate([bad_counts, bad_ids], axis=1)
    if bad.any():
        row, field = divmod(int(np.argmax(bad.ravel())), NUM_FEATURES)
        start, end = int(starts[row, first + field]), int(ends[row, first + field])
        value = bytes(buffer[start:end]).decode("latin-1")
        if field < NUM_DENSE:
            detail = (
                f"{DENSE_COLUMNS[field]}: count {value!r} is not an integer of 1 to {MAX_COUNT_DIGITS} digits"
            )
            raise RowError(row, DENSE_COLUMNS[field], detail)
        column = CATEGORICAL_COLUMNS[field - NUM_DENSE]
        raise RowError(
            row, column, f"{column}: categorical id {value!r} is not 1 to {MAX_ID_DIGITS} hex digits"
        )
    return Rows(counts, missing, ids, labels)


def _labels(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    first = buffer[np.minimum(starts, buffer.size - 1)]
    good = (ends - starts == 1) & ((first == ord("0")) | (first == ord("1")))
    if not good.all():
        row = int(np.argmin(good))
        value = bytes(buffer[starts[row] : ends[row]]).decode("latin-1")
        raise RowError(row, "label", f"label must be 0 or 1, got {value!r}")
    return (first == ord("1")).astype(np.float32)


def _digit(
    buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray, k: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Byte ``k`` of each field right-aligned in ``width`` bytes, and whether it is the field's own."""
    positions = ends - (width - k)
    own = positions >= starts
    return buffer[np.where(own, positions, 0)], own


def _counts(
    buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts (missing: -1), which are missing, and which break the rule, each ``B x 13``."""
    missing = ends == starts
    negative = ~missing & (buffer[starts] == _MINUS)
    first = starts + negative
    digits = ends - first
    bad = ~missing & ((digits < 1) | (digits > MAX_COUNT_DIGITS))
    total = np.zeros(starts.shape, dtype=np.int64)
    for k in range(MAX_COUNT_DIGITS):
        chars, own = _digit(buffer, first, ends, k, MAX_COUNT_DIGITS)
        values = chars - np.uint8(ord("0"))  # a byte that is no digit wraps above 9
        bad |= own & (values > 9)
        total = np.where(own, total * 10 + values, total)
    total = np.where(negative, -total, total)
    total[missing] = -1
    return total, missing, bad


def _ids(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids as int64 (the 64 bits of the hex value; missing: :data:`MISSING_ID`), and which break
    the rule, each ``B x 26``."""
    bad = ends - starts > MAX_ID_DIGITS
    total = np.zeros(starts.shape, dtype=np.uint64)
    for k in range(MAX_ID_DIGITS):
        chars, own = _digit(buffer, starts, ends, k, MAX_ID_DIGITS)
        values = _HEX[chars]
        bad |= own & (values > 15)
        total = np.where(own, (total << np.uint64(4)) | values.astype(np.uint64), total)
    ids = total.view(np.int64)
    ids[ends == starts] = MISSING_ID
    return ids, bad


def model_inputs(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """The model's inputs of parsed rows: ``B x 13`` float32 dense features, ``B x 26`` int64 ids."""
    return preprocess_counts(rows.counts, rows.missing), np.ascontiguousarray(rows.ids, dtype=np.int64)
