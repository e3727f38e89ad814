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
and the field; nothing is guessed. The file reader (:mod:`criteo.tsv`) and the
clients parse with :func:`parse_rows`; the server's raw-row stage, compiled
(``backends/raw_rows/parse.cc``), applies the same rules, and a differential
test holds it to this module on a fuzz corpus, answers and errors alike
(:func:`request_inputs` is what the stage answers for a request's rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

NUM_DENSE = 13
NUM_CATEGORICAL = 26
#: Fields of an unlabeled row; a labeled one has the label first.
NUM_FEATURES = NUM_DENSE + NUM_CATEGORICAL
#: The id a missing categorical field maps to before the model's modulo.
MISSING_ID = 0
#: Digits of a count at most (its value then fits an int64), and hex digits of an id.
MAX_COUNT_DIGITS = 18
MAX_ID_DIGITS = 16
#: Bytes of a bad field an error quotes at most: an error names the field without carrying a
#: whole megabyte row back (gRPC clients refuse messages past 16 KiB of metadata by default).
QUOTED_BYTES = 64
DENSE_COLUMNS = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_COLUMNS = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))

_TAB, _NEWLINE, _RETURN, _MINUS = 9, 10, 13, 45
#: Digits read at once (a window of bytes), and the zero bytes put before the rows so that the
#: windows of a field's longest digits never start before them.
_WINDOW = 8
_PAD = 3 * _WINDOW
_ALL_BYTES = np.uint64(2**64 - 1)


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
    windows = sliding_window_view(np.concatenate([np.zeros(_PAD, dtype=np.uint8), buffer]), _WINDOW)
    counts, missing, bad_counts = _counts(
        windows, buffer, starts[:, first : first + NUM_DENSE], ends[:, first : first + NUM_DENSE]
    )
    ids, bad_ids = _ids(windows, starts[:, first + NUM_DENSE :], ends[:, first + NUM_DENSE :])
    bad = np.concatenate([bad_counts, bad_ids], axis=1)
    if bad.any():
        row, field = divmod(int(np.argmax(bad.ravel())), NUM_FEATURES)
        start, end = int(starts[row, first + field]), int(ends[row, first + field])
        value = quoted(bytes(buffer[start:end]))
        if field < NUM_DENSE:
            digits = MAX_COUNT_DIGITS
            detail = f"{DENSE_COLUMNS[field]}: count {value} is not an integer of 1 to {digits} digits"
            raise RowError(row, DENSE_COLUMNS[field], detail)
        column = CATEGORICAL_COLUMNS[field - NUM_DENSE]
        raise RowError(
            row, column, f"{column}: categorical id {value} is not 1 to {MAX_ID_DIGITS} hex digits"
        )
    return Rows(counts, missing, ids, labels)


def quoted(field: bytes) -> str:
    """A bad field as an error quotes it: Python's repr of its first :data:`QUOTED_BYTES` bytes
    (as Latin-1), and its length where it is longer."""
    text = repr(field[:QUOTED_BYTES].decode("latin-1"))
    return text if len(field) <= QUOTED_BYTES else f"{text}... ({len(field)} bytes)"


def _labels(buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    first = buffer[np.minimum(starts, buffer.size - 1)]
    good = (ends - starts == 1) & ((first == ord("0")) | (first == ord("1")))
    if not good.all():
        row = int(np.argmin(good))
        value = quoted(bytes(buffer[starts[row] : ends[row]]))
        raise RowError(row, "label", f"label must be 0 or 1, got {value}")
    return (first == ord("1")).astype(np.float32)


def _window_values(lanes: np.ndarray, hexadecimal: bool) -> np.ndarray:
    """Windows of 8 digit values (one per byte of a little-endian uint64, 0 to the base - 1,
    the most significant first) as the numbers they write: adjacent digits, then pairs, then
    quads combined with shifts and multiplies on every window at once (SWAR)."""
    if hexadecimal:
        lanes = ((lanes << np.uint64(4)) | (lanes >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
        lanes = ((lanes << np.uint64(8)) | (lanes >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
        return ((lanes << np.uint64(16)) | (lanes >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    lanes = (lanes * np.uint64(10) & np.uint64(0x00FF00FF00FF00FF)) + (
        (lanes >> np.uint64(8)) & np.uint64(0x00FF00FF00FF00FF)
    )
    lanes = (lanes * np.uint64(100) & np.uint64(0x0000FFFF0000FFFF)) + (
        (lanes >> np.uint64(16)) & np.uint64(0x0000FFFF0000FFFF)
    )
    return (lanes * np.uint64(10000) & np.uint64(0xFFFFFFFF)) + (lanes >> np.uint64(32))


def _values(
    windows: np.ndarray, starts: np.ndarray, ends: np.ndarray, longest: int, hexadecimal: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Each field's digits as one number: ``(values, bad)``, ``values`` as uint64 (their low 64
    bits), ``bad`` where a byte of the field is no digit (decimal, or hex in either case).

    ``windows``: the rows' bytes as overlapping :data:`_WINDOW`-byte windows, the ``i``-th
    starting at byte ``i - _PAD``; ``longest``: the most digits of any field. The fields are
    read :data:`_WINDOW` digits at a time from their right end: each window in one gather,
    checked byte by byte, then one uint64 per window.
    """
    base = 16 if hexadecimal else 10
    lengths = (ends - starts).ravel()
    total = np.zeros(lengths.size, dtype=np.uint64)
    bad = np.zeros(lengths.size, dtype=bool)
    for chunk in range(-(-longest // _WINDOW)):
        raw = windows[ends.ravel() + (_PAD - _WINDOW * (chunk + 1))]
        digits = raw - np.uint8(ord("0"))
        ok = digits < 10
        if hexadecimal:
            ok |= (raw | np.uint8(0x20)) - np.uint8(ord("a")) < 6
            # "0"-"9" are 0x30-0x39, "A"-"F" 0x41-0x46 and "a"-"f" 0x61-0x66: the low four bits,
            # plus 9 for a letter (bit 6).
            digits = (raw & np.uint8(0x0F)) + np.uint8(9) * (raw >> np.uint8(6))
        # The field's own bytes of this window: its last ones (the high bytes, little-endian);
        # the window's first bytes lie before the field when it has fewer digits left.
        own = np.clip(lengths - _WINDOW * chunk, 0, _WINDOW).astype(np.uint64)
        mask = np.where(own > 0, _ALL_BYTES << (np.uint64(8) * (np.uint64(_WINDOW) - own) % np.uint64(64)), 0)
        mask = mask.astype(np.uint64)
        bad |= ((~ok).view("<u8").ravel() & mask) != 0
        lanes = digits.view("<u8").ravel() & mask
        total += _window_values(lanes, hexadecimal) * np.uint64(base ** (_WINDOW * chunk) % 2**64)
    return total.reshape(starts.shape), bad.reshape(starts.shape)


def _counts(
    windows: np.ndarray, buffer: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Counts (missing: -1), which are missing, and which break the rule, each ``B x 13``."""
    missing = ends == starts
    negative = ~missing & (buffer[starts] == _MINUS)
    first = starts + negative
    digits = ends - first
    bad = ~missing & ((digits < 1) | (digits > MAX_COUNT_DIGITS))
    longest = min(int(digits.max(initial=0)), MAX_COUNT_DIGITS)
    values, no_digit = _values(windows, first, ends, longest, hexadecimal=False)
    bad |= no_digit
    total = values.view(np.int64)
    total = np.where(negative, -total, total)
    total[missing] = -1
    return total, missing, bad


def _ids(windows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids as int64 (the 64 bits of the hex value; missing: :data:`MISSING_ID`), and which break
    the rule, each ``B x 26``."""
    lengths = ends - starts
    bad = lengths > MAX_ID_DIGITS
    longest = min(int(lengths.max(initial=0)), MAX_ID_DIGITS)
    values, no_digit = _values(windows, starts, ends, longest, hexadecimal=True)
    bad |= no_digit
    ids = values.view(np.int64)
    ids[ends == starts] = MISSING_ID
    return ids, bad


def model_inputs(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """The model's inputs of parsed rows: ``B x 13`` float32 dense features, ``B x 26`` int64 ids."""
    return preprocess_counts(rows.counts, rows.missing), np.ascontiguousarray(rows.ids, dtype=np.int64)


def join_rows(rows: Sequence[bytes]) -> bytes:
    """A request's rows (one per element of the raw-row stage's ``B x 1`` input) one per line.

    A row may come with its own line end: where any row holds a line break, each loses a
    trailing ``\\r\\n``, or its trailing ``\\n`` s, first, so that a line break left inside a row
    splits it (and :func:`parse_rows` refuses it, counting rows). The compiled stage joins them
    the same way (``backends/raw_rows/parse.cc``).
    """
    data = b"\n".join(rows)
    if data.count(b"\n") != len(rows) - 1:
        data = b"\n".join(row[:-2] if row.endswith(b"\r\n") else row.rstrip(b"\n") for row in rows)
    return data


def request_inputs(rows: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """What the raw-row stage answers for a request's rows: :func:`model_inputs` of the joined rows.

    Raises:
        RowError: a row breaks a rule (the request's error, naming the row and the field).
    """
    return model_inputs(parse_rows(join_rows(rows), labeled=False, rows=len(rows)))
