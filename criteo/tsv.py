"""Reader for the Criteo TSV format, streamed in chunks.

A line holds a label, 13 integer counts and 26 categorical ids written in
hex, separated by tabs (the unlabeled test format omits the label). An empty
field is missing; counts can be negative; the rules are :mod:`criteo.rows`. Files larger than memory
stream through :func:`iter_batches` chunk by chunk.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

import numpy as np

from bundle.errors import DataError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, RAW_ROWS_INPUT
from criteo.preprocess import preprocess_counts, preprocess_ids
from criteo.rows import RowError, parse_rows
from criteo.schema import NUM_FIELDS


@dataclass(frozen=True)
class RawBatch:
    """Parsed but not yet preprocessed rows.

    Attributes:
        labels: ``B`` float32 labels, or None for an unlabeled file.
        counts: ``B x 13`` int64 counts; missing fields are -1 and flagged in ``count_missing``.
        count_missing: ``B x 13`` bool.
        ids: ``B x 26`` int64 categorical ids parsed from hex; missing fields are
            :data:`criteo.schema.MISSING_ID`.
        first_line: 1-based line number of the first row in its file.
    """

    labels: np.ndarray | None
    counts: np.ndarray
    count_missing: np.ndarray
    ids: np.ndarray
    first_line: int

    def __len__(self) -> int:
        return int(self.counts.shape[0])


@dataclass(frozen=True)
class Batch:
    """Model-ready rows: the tensors of :mod:`bundle.schema`.

    Attributes:
        dense: ``B x 13`` float32, log1p of the clamped counts.
        categorical: ``B x 26`` int64 raw ids (the model reduces them into its tables).
        labels: ``B`` float32, or None for an unlabeled file.
    """

    dense: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray | None

    def __len__(self) -> int:
        return int(self.dense.shape[0])

    def inputs(self) -> dict[str, np.ndarray]:
        """The model inputs keyed by tensor name."""
        return {DENSE_INPUT: self.dense, CATEGORICAL_INPUT: self.categorical}

    def slice(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop`` as a new batch (views, no copy)."""
        labels = None if self.labels is None else self.labels[start:stop]
        return Batch(self.dense[start:stop], self.categorical[start:stop], labels)

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """Concatenate batches row-wise; all must agree on having labels."""
        if not batches:
            raise DataError("no rows to concatenate")
        has_labels = {b.labels is not None for b in batches}
        if len(has_labels) != 1:
            raise DataError("cannot mix labeled and unlabeled rows")
        labels = (
            np.concatenate([b.labels for b in batches if b.labels is not None])
            if has_labels == {True}
            else None
        )
        return Batch(
            np.concatenate([b.dense for b in batches]),
            np.concatenate([b.categorical for b in batches]),
            labels,
        )


def open_text(path: Path) -> IO[str]:
    """A Criteo text file (``.gz`` too) for reading lines."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="ascii", newline="\n")
    return open(path, encoding="ascii", newline="\n")


def _open_bytes(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")


def parse_lines(
    lines: list[str], first_line: int = 1, path: str = "<lines>", fields: int | None = None
) -> RawBatch:
    """Parse Criteo TSV lines (all labeled, or all unlabeled) by the rules of :mod:`criteo.rows`.

    Args:
        lines: text lines, with or without the trailing newline.
        first_line: line number of ``lines[0]``, for error messages.
        path: file name for error messages.
        fields: the field count every line must have (40 labeled, 39 unlabeled);
            None takes it from the first line (labeled unless it has 39).

    Returns:
        The parsed rows.

    Raises:
        DataError: a row with the wrong field count or a field that does not parse,
            naming its file, line number and field.
    """
    text = "".join(lines)
    if text.count("\n") != len(lines) - (not text.endswith("\n")):
        text = "\n".join(line.rstrip("\r\n") for line in lines)
    labeled = None if fields is None else fields == NUM_FIELDS
    try:
        rows = parse_rows(text.encode("ascii"), labeled=labeled, rows=len(lines))
    except RowError as exc:
        raise DataError(f"{path}:{first_line + exc.row}: {exc.detail}") from None
    except UnicodeEncodeError as exc:
        raise DataError(f"{path}: not an ASCII Criteo TSV line ({exc.reason})") from None
    return RawBatch(rows.labels, rows.counts, rows.missing, rows.ids, first_line)


def to_batch(raw: RawBatch) -> Batch:
    """Preprocess parsed rows into model inputs."""
    return Batch(preprocess_counts(raw.counts, raw.count_missing), preprocess_ids(raw.ids), raw.labels)


def iter_raw(path: Path | str, chunk_rows: int = 65536) -> Iterator[RawBatch]:
    """Stream a Criteo TSV file (optionally ``.gz``) as parsed chunks.

    Args:
        path: the file.
        chunk_rows: rows per chunk; memory use is bounded by it, not by the file.

    Yields:
        Chunks of at most ``chunk_rows`` rows, in file order.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    if chunk_rows <= 0:
        raise DataError(f"chunk_rows must be positive, got {chunk_rows}")
    line_no = 1
    fields: int | None = None
    try:
        with open_text(path) as handle:
            while True:
                lines = []
                for line in handle:
                    if line.strip():
                        lines.append(line)
                        if len(lines) == chunk_rows:
                            break
                    else:
                        raise DataError(f"{path}:{line_no + len(lines)}: empty line")
                if not lines:
                    return
                raw = parse_lines(lines, line_no, str(path), fields)
                # Every later chunk must have the first row's format (labeled or not).
                fields = NUM_FIELDS if raw.labels is not None else NUM_FIELDS - 1
                yield raw
                line_no += len(lines)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not an ASCII Criteo TSV file ({exc.reason} at byte {exc.start})") from None


@dataclass(frozen=True)
class RowText:
    """Rows as their text, for a raw-row model (``<model>_raw``), which parses them in the server.

    Attributes:
        rows: ``B x 1`` object array of ``bytes``: each row's 39 unlabeled fields as written,
            tab-separated, without its line end.
        first_line: 1-based line number of the first row in its file.
        path: the file's name, for messages.
        labels: ``B`` float32 labels of a labeled file (cut from the text), else None.
    """

    rows: np.ndarray
    first_line: int
    path: str = "<rows>"
    labels: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def inputs(self) -> dict[str, np.ndarray]:
        """The raw-row model's input: ``{raw_rows: B x 1 BYTES}``."""
        return {RAW_ROWS_INPUT: self.rows}

    def slice(self, start: int, stop: int) -> RowText:
        """Rows ``start:stop`` (views, no copy)."""
        labels = None if self.labels is None else self.labels[start:stop]
        return RowText(self.rows[start:stop], self.first_line + start, self.path, labels)

    def line_of(self, row: int) -> int:
        """The file line of row ``row`` (0-based) of this chunk."""
        return self.first_line + row


def iter_row_text(path: Path | str, chunk_rows: int = 65536) -> Iterator[RowText]:
    """Stream a Criteo TSV file (optionally ``.gz``) as its rows' text, unparsed.

    The text is sent as it is, so the server, not the client, applies the rules: a labeled
    file (its first line has 40 fields) loses each line's first field, the label (kept as
    :attr:`RowText.labels`, which must be 0 or 1), and nothing else is changed or checked here.

    Args:
        path: the file.
        chunk_rows: rows per chunk.

    Raises:
        DataError: the file is missing, or has an empty line.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no such file: {path}")
    if chunk_rows <= 0:
        raise DataError(f"chunk_rows must be positive, got {chunk_rows}")
    labeled: bool | None = None
    line_no = 1
    with _open_bytes(path) as handle:
        while True:
            lines: list[bytes] = []
            labels: list[bytes] = []
            for line in handle:
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    raise DataError(f"{path}:{line_no + len(lines)}: empty line")
                if labeled is None:
                    labeled = line.count(b"\t") == NUM_FIELDS - 1
                if labeled:
                    label, _, line = line.partition(b"\t")
                    labels.append(label)
                lines.append(line)
                if len(lines) == chunk_rows:
                    break
            if not lines:
                return
            rows = np.empty((len(lines), 1), dtype=np.object_)
            rows[:, 0] = lines
            yield RowText(rows, line_no, str(path), _labels_of(labels, line_no, path) if labeled else None)
            line_no += len(lines)


def _labels_of(labels: list[bytes], first_line: int, path: Path) -> np.ndarray:
    """Labels cut from row text: each must be ``0`` or ``1``."""
    values = np.asarray(labels, dtype=np.bytes_)
    good = (values == b"0") | (values == b"1")
    if not good.all():
        row = int(np.argmin(good))
        raise DataError(f"{path}:{first_line + row}: label: label must be 0 or 1, got {labels[row]!r}")
    return (values == b"1").astype(np.float32)


def iter_batches(path: Path | str, chunk_rows: int = 65536) -> Iterator[Batch]:
    """Stream a Criteo TSV file as preprocessed, model-ready chunks."""
    for raw in iter_raw(path, chunk_rows):
        yield to_batch(raw)


def read_batch(path: Path | str, max_rows: int | None = None) -> Batch:
    """Read (up to ``max_rows`` rows of) a file into one preprocessed batch."""
    batches: list[Batch] = []
    total = 0
    for batch in iter_batches(path):
        if max_rows is not None and total + len(batch) >= max_rows:
            batches.append(batch.slice(0, max_rows - total))
            break
        batches.append(batch)
        total += len(batch)
    if not batches:
        raise DataError(f"{path}: no rows")
    return Batch.concat(batches)
