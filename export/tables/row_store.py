"""A memory-mapped row store: every row of the 26 embedding tables in one file.

A Criteo Terabyte DLRM has 187,767,399 embedding rows, 96 GB in FP32 at dimension
128: more than the memory of the machine that serves it. A hot/cold
model keeps the hottest rows inside the served graph and reads every other
row from this store, which the serving side maps read-only and gathers from with
numpy alone (this module imports nothing heavier, so a Triton python-backend
model can import it).

On disk a store is one folder:

- ``rows.bin``: the 26 tables stacked in C1..C26 order, row-major
  ``[rows, width]``, little-endian ``float32`` or ``float16``; table ``t``
  starts at global row ``table_offsets(table_sizes)[t]``, the layout of the
  bundle's fused ``nn.Embedding`` (:mod:`models.dlrm`) and of Wide & Deep's
  ``deep_table``/``wide_table`` (:mod:`models.wide_deep`). An ``int8`` store
  holds each row quantized row-wise instead: ``width`` uint8 codes, then a
  float32 scale and bias per column (FBGEMM's 8-bit row-wise tables, defined in
  the serving stage: :func:`~export.stage.hot_cold_lookup.quantize_rows`);
  at D 128 a row takes 136 bytes against 256 in ``float16``. Reads return its
  values dequantized, as float32.
- ``store.json``: the format version, the :class:`RowStoreSpec`, the file size,
  a SHA-256 of the whole of ``rows.bin`` and one of a fixed sample of its rows,
  a CRC-32 of each 64 MiB chunk of ``rows.bin`` (``checksums``) and the store's
  ``fingerprint`` (a SHA-256 of the spec and those CRCs).
  :meth:`RowStore.open` checks the size and the sample (a truncated or swapped
  ``rows.bin`` fails there, in one line); :func:`verify_checksums` reads
  everything and checks each chunk, in parallel threads (what the serving stage
  runs at every load, see ``export/stage/hot_cold_lookup.py``);
  :meth:`RowStore.verify` checks the full SHA-256, slower, on one thread.

The checksums and the fingerprint are computed by the serving stage's own
functions (:class:`~export.stage.hot_cold_lookup.ChunkChecksums`,
:func:`~export.stage.hot_cold_lookup.store_fingerprint`), so the
writer and the reader cannot disagree. A store written before them (format
version 1 without ``checksums``) still opens; the stage checks its SHA-256
instead.

A row holds named column ranges (:attr:`RowStoreSpec.columns`): DLRM's rows are
its embeddings, ``{"embedding": (0, D)}``; Wide & Deep's add the wide weight of
the same (table, id) as one more column, ``{"embedding": (0, D), "wide": (D, D + 1)}``,
so one gather serves both parts.

Writing (:class:`RowStoreWriter`, :func:`write_arrays`, :func:`from_stacked`,
:func:`random_store`) streams: memory holds one chunk, whatever the store's size.
``rows.bin`` is written under a temporary name and ``store.json`` last, so a
half-written store is never opened as complete, and a store being replaced stays
readable (processes that mapped the old file keep it) until the new one is done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import mmap
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from bundle.errors import ConfigError, DataError, ExportError
from bundle.schema import NUM_CATEGORICAL
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import check_table_sizes, table_offsets
from export.stage import hot_cold_lookup as stage_format

logger = logging.getLogger(__name__)

#: The stacked rows of the 26 tables.
ROWS_FILE = "rows.bin"
#: The store's description, written last.
META_FILE = "store.json"
#: ``rows.bin`` while it is being written.
PARTIAL_SUFFIX = ".partial"
FORMAT = "criteo-row-store"
FORMAT_VERSION = 1
#: Value types a store may hold (always little-endian on disk): ``int8`` is row-wise quantized.
DTYPES: tuple[str, ...] = stage_format.STORE_DTYPES
#: The row-wise quantized value type.
INT8 = stage_format.STORE_INT8
#: Column of the embedding vector (DLRM; Wide & Deep's deep part).
EMBEDDING_COLUMN = "embedding"
#: Column of Wide & Deep's wide weight, one value per (table, id).
WIDE_COLUMN = "wide"
#: Initialisations :func:`random_store` knows: DLRM's uniform(-sqrt(1/n), sqrt(1/n)) for a
#: table of n rows, or Keras Wide & Deep's uniform(-0.05, 0.05) (see :mod:`models.wide_deep`).
INITS: tuple[str, ...] = ("dlrm", "wide_deep")
#: Standard deviation of the random wide column. The trained model starts from zeros, but a
#: store of zeros would hide a wrong wide lookup in a benchmark or a test.
WIDE_STD = 0.01
#: Rows generated from one random stream: the values of a random store depend on
#: (seed, table, row), never on the chunk size it was written with.
RANDOM_BLOCK_ROWS = 4096
#: Bytes per write when converting in-memory arrays or generating random rows.
CHUNK_BYTES = 64 << 20
#: Rows of a store sampled into ``store.json``'s ``sample_sha256`` besides each table's first and last.
SAMPLED_ROWS = 64
#: Read size of the full-digest pass.
_HASH_READ_BYTES = 16 << 20
#: Write ranges kept before merging (so tracking stays small for any write pattern).
_MAX_RANGES = 4096

Init = Literal["dlrm", "wide_deep"]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RowStoreSpec:
    """What a row store holds: its tables, row width, value type and named columns.

    Args:
        table_sizes: rows of C1..C26 (26 ints >= 1).
        width: values per row.
        dtype: ``"float32"``, ``"float16"`` or ``"int8"`` (row-wise quantized).
        columns: name -> ``(start, stop)`` value range within a row; non-empty,
            non-overlapping, within ``[0, width)`` (for ``int8``: tiling it, each column
            quantized on its own). Default: ``{"embedding": (0, width)}``.

    Raises:
        ConfigError: any of the above violated.
    """

    table_sizes: tuple[int, ...]
    width: int
    dtype: str = "float32"
    columns: Mapping[str, tuple[int, int]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table_sizes", check_table_sizes(self.table_sizes))
        if not isinstance(self.width, int | np.integer) or isinstance(self.width, bool) or self.width < 1:
            raise ConfigError(f"row store width must be an int >= 1, got {self.width!r}")
        object.__setattr__(self, "width", int(self.width))
        if self.dtype not in DTYPES:
            raise ConfigError(f"row store dtype must be {' or '.join(DTYPES)}, got {self.dtype!r}")
        columns = {EMBEDDING_COLUMN: (0, self.width)} if not self.columns else dict(self.columns)
        checked: dict[str, tuple[int, int]] = {}
        for name, bounds in sorted(columns.items(), key=lambda item: tuple(item[1])):
            try:
                start, stop = (int(value) for value in bounds)
            except (TypeError, ValueError):
                raise ConfigError(f"row store column {name!r} needs (start, stop), got {bounds!r}") from None
            if not name or not 0 <= start < stop <= self.width:
                raise ConfigError(
                    f"row store column {name!r} = ({start}, {stop}) must be a non-empty range "
                    f"within 0..{self.width}"
                )
            overlap = [other for other, (a, b) in checked.items() if start < b and a < stop]
            if overlap:
                raise ConfigError(f"row store columns {overlap[0]!r} and {name!r} overlap")
            checked[name] = (start, stop)
        if self.dtype == INT8:
            try:
                stage_format.store_columns({"columns": {n: list(b) for n, b in checked.items()}}, self.width)
            except stage_format.StageError as exc:
                raise ConfigError(f"an int8 row store's columns must tile its rows: {exc}") from None
        object.__setattr__(self, "columns", MappingProxyType(checked))

    @classmethod
    def for_dlrm(cls, table_sizes: Sequence[int], dim: int, dtype: str = "float32") -> RowStoreSpec:
        """Rows of DLRM embeddings: ``{"embedding": (0, dim)}``."""
        return cls(tuple(table_sizes), dim, dtype, {EMBEDDING_COLUMN: (0, dim)})

    @classmethod
    def for_wide_deep(cls, table_sizes: Sequence[int], dim: int, dtype: str = "float32") -> RowStoreSpec:
        """Rows of Wide & Deep: the deep embedding, then the wide weight (width ``dim + 1``)."""
        return cls(
            tuple(table_sizes), dim + 1, dtype, {EMBEDDING_COLUMN: (0, dim), WIDE_COLUMN: (dim, dim + 1)}
        )

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The on-disk item, little-endian: ``<f4``, ``<f2``, or ``uint8`` for an int8 store's bytes."""
        return np.dtype({"float32": "<f4", "float16": "<f2"}.get(self.dtype, "u1"))

    @property
    def value_dtype(self) -> np.dtype[Any]:
        """The values written and read: the on-disk type, or float32 for an int8 store."""
        return np.dtype("<f4") if self.dtype == INT8 else self.numpy_dtype

    @property
    def quantized(self) -> bool:
        """Rows are stored row-wise quantized (``int8``)."""
        return self.dtype == INT8

    @property
    def ordered_columns(self) -> tuple[tuple[int, int], ...]:
        """The columns' ``(start, stop)`` in row order."""
        return tuple(sorted(self.columns.values()))

    @property
    def rows(self) -> int:
        """Rows of all 26 tables together."""
        return sum(self.table_sizes)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row."""
        if self.quantized:
            return stage_format.int8_row_bytes(self.width, len(self.columns))
        return self.width * self.numpy_dtype.itemsize

    @property
    def total_bytes(self) -> int:
        """Bytes of ``rows.bin``."""
        return self.rows * self.row_bytes

    @property
    def offsets(self) -> tuple[int, ...]:
        """Global row of each table's first row."""
        return table_offsets(self.table_sizes)

    def column_slice(self, name: str) -> slice:
        """The values of column ``name`` within a row, for ``rows[:, spec.column_slice(name)]``.

        Raises:
            ConfigError: no such column.
        """
        if name not in self.columns:
            raise ConfigError(f"row store has no column {name!r}; it has {', '.join(self.columns)}")
        start, stop = self.columns[name]
        return slice(start, stop)

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON-ready values."""
        return {
            "table_sizes": list(self.table_sizes),
            "width": self.width,
            "dtype": self.dtype,
            "columns": {name: list(bounds) for name, bounds in self.columns.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RowStoreSpec:
        """The spec :meth:`to_json` wrote.

        Raises:
            ConfigError: a field missing or invalid.
        """
        try:
            named = dict(data.get("columns") or {})
            columns = {str(name): (int(a), int(b)) for name, (a, b) in named.items()}
            return cls(tuple(data["table_sizes"]), int(data["width"]), str(data["dtype"]), columns)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"invalid row store spec ({type(exc).__name__}: {exc})") from None


def format_bytes(count: int) -> str:
    """``count`` bytes in binary units, the units sizes are given in (``--hot-budget 8M`` is
    8 MiB and prints as ``8.0 MiB``): ``44.8 GiB``, ``512.0 KiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _table_and_row(spec: RowStoreSpec, global_row: int) -> tuple[int, int]:
    """The table and in-table row of a global row."""
    table = int(np.searchsorted(np.asarray(spec.offsets), global_row, side="right")) - 1
    return table, global_row - spec.offsets[table]


def _sample_rows(spec: RowStoreSpec) -> list[int]:
    """Global rows hashed into ``sample_sha256``: each table's first and last, and evenly spread ones."""
    rows = {offset for offset in spec.offsets}
    rows |= {offset + size - 1 for offset, size in zip(spec.offsets, spec.table_sizes, strict=True)}
    rows |= {int(row) for row in np.linspace(0, spec.rows - 1, SAMPLED_ROWS)}
    return sorted(rows)


def _sample_digest(fd: int, spec: RowStoreSpec) -> str:
    """SHA-256 of the sampled rows of the open file ``fd``."""
    digest = hashlib.sha256()
    for row in _sample_rows(spec):
        digest.update(os.pread(fd, spec.row_bytes, row * spec.row_bytes))
    return digest.hexdigest()


def _pieces(fd: int, size: int, what: str) -> Iterator[bytes]:
    """The first ``size`` bytes of the open file ``fd``, read in pieces of :data:`_HASH_READ_BYTES`."""
    offset = 0
    while offset < size:
        piece = os.pread(fd, min(_HASH_READ_BYTES, size - offset), offset)
        if not piece:
            raise ExportError(f"file ended at byte {offset} of {size} while {what}")
        yield piece
        offset += len(piece)


def _file_digest(fd: int, size: int, on_bytes: Callable[[int], None] | None = None) -> str:
    """SHA-256 of the first ``size`` bytes of the open file ``fd``, read in pieces."""
    digest = hashlib.sha256()
    for piece in _pieces(fd, size, "hashing"):
        digest.update(piece)
        if on_bytes is not None:
            on_bytes(len(piece))
    return digest.hexdigest()


def _read_back(fd: int, size: int, digest: bool) -> tuple[str | None, dict[str, Any]]:
    """The SHA-256 (when ``digest``) and the chunk checksums of ``fd``'s first ``size`` bytes, in one read."""
    sha = hashlib.sha256() if digest else None
    checksums = stage_format.ChunkChecksums()
    for piece in _pieces(fd, size, "computing its checksums"):
        if sha is not None:
            sha.update(piece)
        checksums.update(piece)
    return (sha.hexdigest() if sha is not None else None), checksums.to_json()


def verify_checksums(
    path: Path, threads: int | None = None, on_bytes: Callable[[int], None] | None = None
) -> float:
    """Read all of the store at ``path`` and check each chunk against ``store.json``'s checksums.

    The check the serving stage runs at every load (same code), in threads: from the
    page cache it runs at the rate of all the cores together, faster than
    :meth:`RowStore.verify`'s SHA-256 on one thread (see
    ``export/stage/hot_cold_lookup.py``).

    Args:
        path: the store's folder.
        threads: threads reading at once (default: the usable CPUs, at most 8).
        on_bytes: called with the bytes checked after each chunk (for a progress bar).

    Returns:
        Seconds the check took.

    Raises:
        ExportError: no finished store there, a store written without checksums, or a
            chunk that differs (the message names ``rows.bin`` and the bytes).
    """
    store = RowStore.open(path)
    checksums = store.description.get(stage_format.STORE_CHECKSUMS_KEY)
    if not isinstance(checksums, dict):
        raise ExportError(
            f"row store {store.path} was written without chunk checksums (an older bundle); "
            "RowStore.verify() checks its SHA-256"
        )
    try:
        return stage_format.verify_checksums(
            store.path / ROWS_FILE, checksums, store.spec.total_bytes, threads, on_bytes
        )
    except stage_format.StageError as exc:
        raise ExportError(str(exc)) from None


class RowStoreWriter:
    """Writes a row store chunk by chunk, in any order; memory holds one chunk.

    Use as a context manager: leaving the block normally finishes the store
    (:meth:`close`), leaving it by an exception removes the partial file.
    Writes go to ``rows.bin.partial`` with ``pwrite``; :meth:`close` refuses to
    finish while any row is missing, then renames it to ``rows.bin`` and writes
    ``store.json`` last. A row written twice keeps its last value.

    The full SHA-256 and the chunk checksums are computed as the rows are written
    while the writes come in file order (each starting where the last ended, as
    :func:`random_store` and :func:`from_stacked` write); otherwise :meth:`close`
    reads the file back once.

    Args:
        path: the store's folder (created; an existing store there is replaced at close).
        spec: what the store holds.
        digest: compute the full SHA-256 (``False`` skips it; :meth:`RowStore.verify` then
            cannot check the content).
        metadata: JSON-ready values kept in ``store.json`` (e.g. the source model).

    Raises:
        ExportError: not enough free disk for the store.
    """

    def __init__(
        self,
        path: Path,
        spec: RowStoreSpec,
        digest: bool = True,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.spec = spec
        self.metadata = dict(metadata or {})
        try:
            json.dumps(self.metadata)
        except (TypeError, ValueError) as exc:
            raise ExportError(f"row store metadata must be JSON values: {exc}") from None
        self.path.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.path).free
        self._partial = self.path / (ROWS_FILE + PARTIAL_SUFFIX)
        if self._partial.exists():
            free += self._partial.stat().st_size
        if free < spec.total_bytes:
            raise ExportError(
                f"row store {self.path} needs {format_bytes(spec.total_bytes)}, "
                f"only {format_bytes(free)} free there"
            )
        self._fd: int | None = os.open(self._partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self._fd, spec.total_bytes)
        self._ranges: list[tuple[int, int]] = []
        self._hash = hashlib.sha256() if digest else None
        self._checksums = stage_format.ChunkChecksums()
        self._hashed_rows = 0
        self._in_order = True

    def __enter__(self) -> RowStoreWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, table: int, first_row: int, rows: npt.ArrayLike) -> None:
        """Write rows ``first_row .. first_row + n - 1`` of table ``table`` (0 = C1).

        Args:
            table: table index 0..25.
            first_row: the in-table row of ``rows[0]``.
            rows: ``n x width`` values, cast to the store's dtype.

        Raises:
            ExportError: a table, row range or shape that does not fit the store.
        """
        if not 0 <= table < NUM_CATEGORICAL:
            raise ExportError(f"row store table index must be 0..{NUM_CATEGORICAL - 1}, got {table}")
        size = self.spec.table_sizes[table]
        count = np.shape(rows)[0] if np.ndim(rows) else 0
        if first_row < 0 or first_row + count > size:
            raise ExportError(
                f"rows {first_row}..{first_row + count - 1} are outside {CATEGORICAL_COLUMNS[table]} "
                f"(0..{size - 1})"
            )
        self.write_global(self.spec.offsets[table] + first_row, rows)

    def write_global(self, first_row: int, rows: npt.ArrayLike) -> None:
        """Write rows at global rows ``first_row ..`` of the stacked tables (may span tables).

        Args:
            first_row: the global row of ``rows[0]``.
            rows: ``n x width`` values, cast to the store's dtype (quantized row-wise for ``int8``).

        Raises:
            ExportError: the writer is closed, a row range or shape that does not fit the
                store, or a value that is not finite in rows to quantize.
        """
        if self._fd is None:
            raise ExportError(f"row store writer for {self.path} is closed")
        values = np.ascontiguousarray(rows, dtype=self.spec.value_dtype)
        if values.ndim != 2 or values.shape[1] != self.spec.width:
            raise ExportError(f"rows to write must be n x {self.spec.width}, got {values.shape}")
        count = values.shape[0]
        if first_row < 0 or first_row + count > self.spec.rows:
            raise ExportError(
                f"global rows {first_row}..{first_row + count - 1} are outside the store "
                f"(0..{self.spec.rows - 1})"
            )
        if count == 0:
            return
        if self.spec.quantized:
            if not np.isfinite(values).all():
                bad = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
                raise ExportError(
                    f"global row {first_row + bad} holds a value that is not finite: cannot quantize it"
                )
            values = stage_format.quantize_rows(values, self.spec.ordered_columns)
        data = values.reshape(-1).view(np.uint8).data
        offset = first_row * self.spec.row_bytes
        while data:
            written = os.pwrite(self._fd, data, offset)
            data, offset = data[written:], offset + written
        if self._in_order and first_row == self._hashed_rows:
            written_bytes = values.reshape(-1).view(np.uint8).data
            if self._hash is not None:
                self._hash.update(written_bytes)
            self._checksums.update(written_bytes)
            self._hashed_rows += count
        else:
            self._in_order = False
        self._add_range(first_row, first_row + count)

    def _add_range(self, start: int, stop: int) -> None:
        """Record rows ``start .. stop - 1`` as written; merge adjacent ranges now and then."""
        if self._ranges and self._ranges[-1][1] == start:
            self._ranges[-1] = (self._ranges[-1][0], stop)
        else:
            self._ranges.append((start, stop))
        if len(self._ranges) > _MAX_RANGES:
            self._ranges = self._merged()

    def _merged(self) -> list[tuple[int, int]]:
        """The written ranges, sorted and merged."""
        merged: list[tuple[int, int]] = []
        for start, stop in sorted(self._ranges):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        return merged

    def missing(self) -> list[tuple[int, int]]:
        """Global row ranges ``[start, stop)`` not written yet."""
        gaps, cursor = [], 0
        for start, stop in self._merged():
            if start > cursor:
                gaps.append((cursor, start))
            cursor = max(cursor, stop)
        if cursor < self.spec.rows:
            gaps.append((cursor, self.spec.rows))
        return gaps

    def close(self) -> None:
        """Finish the store: check every row was written, then rename ``rows.bin`` and write ``store.json``.

        Raises:
            ExportError: rows never written (the partial file is removed).
        """
        if self._fd is None:
            return
        gaps = self.missing()
        if gaps:
            missing = sum(stop - start for start, stop in gaps)
            table, row = _table_and_row(self.spec, gaps[0][0])
            self.abort()
            raise ExportError(
                f"row store {self.path}: {missing} of {self.spec.rows} rows never written "
                f"(first at {CATEGORICAL_COLUMNS[table]} row {row}); nothing was saved"
            )
        fd = self._fd
        full: str | None = None
        if self._in_order and self._hashed_rows == self.spec.rows:
            full = self._hash.hexdigest() if self._hash is not None else None
            checksums = self._checksums.to_json()
        else:
            logger.info("reading %s back for its checksums (rows were written out of order)", self._partial)
            full, checksums = _read_back(fd, self.spec.total_bytes, self._hash is not None)
        spec_json = self.spec.to_json()
        meta = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "spec": spec_json,
            "rows": self.spec.rows,
            "row_bytes": self.spec.row_bytes,
            "file_bytes": self.spec.total_bytes,
            "byte_order": "little",
            "sha256": full,
            "sample_sha256": _sample_digest(fd, self.spec),
            stage_format.STORE_CHECKSUMS_KEY: checksums,
            stage_format.STORE_FINGERPRINT_KEY: stage_format.store_fingerprint(spec_json, checksums),
            "metadata": self.metadata,
        }
        text = json.dumps(meta, indent=1) + "\n"
        # Durable before store.json names it: after a crash, store.json implies complete rows.
        os.fsync(fd)
        os.close(fd)
        self._fd = None
        meta_path = self.path / META_FILE
        meta_path.unlink(missing_ok=True)
        os.replace(self._partial, self.path / ROWS_FILE)
        temporary = meta_path.with_name(META_FILE + PARTIAL_SUFFIX)
        with temporary.open("w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, meta_path)
        logger.info(
            "wrote row store %s: %d rows, %s", self.path, self.spec.rows, format_bytes(self.spec.total_bytes)
        )

    def abort(self) -> None:
        """Stop without saving: close and remove the partial file (an existing store stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._partial.unlink(missing_ok=True)


class RowStore:
    """A finished row store, memory-mapped read-only.

    Args:
        path: the store's folder.
        spec: what it holds.
        data: ``rows x width`` read-only array over ``rows.bin``.
        description: ``store.json`` as read (the writer's ``metadata`` under ``"metadata"``).

    Use :meth:`open`; lookups are :meth:`rows` (by table and in-table id) and
    :meth:`rows_at` (by global row). Values come back in the store's dtype, or as
    float32 for an int8 store (dequantized; :attr:`data` then holds its bytes).
    """

    def __init__(
        self, path: Path, spec: RowStoreSpec, data: np.ndarray, description: Mapping[str, Any]
    ) -> None:
        self.path = path
        self.spec = spec
        self.data = data
        self.description = dict(description)
        self._sizes = np.asarray(spec.table_sizes, dtype=np.int64)
        self._offsets = np.asarray(spec.offsets, dtype=np.int64)

    @classmethod
    def open(cls, path: Path, random_access: bool = True) -> RowStore:
        """Map the store at ``path`` after checking ``rows.bin`` against ``store.json``.

        Checks the description field by field (the stage's own reader,
        :func:`export.stage.hot_cold_lookup.read_store_meta`), the file size and a sample of
        rows (cheap at any size; :meth:`verify` checks every byte).

        Args:
            path: the store's folder.
            random_access: advise the kernel that reads are random (no read-ahead:
                a cold lookup then reads one page from disk, not 128 KiB).

        Raises:
            ExportError: no finished store there, or ``rows.bin`` does not match ``store.json``.
        """
        try:
            described = stage_format.read_store_meta(Path(path))
        except stage_format.StageError as exc:
            raise ExportError(str(exc)) from None
        path, meta, rows_path = described.path, described.meta, described.rows_path
        try:
            spec = RowStoreSpec.from_json(meta["spec"])
        except ConfigError as exc:
            raise ExportError(f"{described.meta_path}: {exc}") from None
        try:
            fd = os.open(rows_path, os.O_RDONLY)
        except OSError as exc:
            raise ExportError(f"cannot open {rows_path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size != spec.total_bytes:
                raise ExportError(
                    f"{rows_path} has {size} bytes, {META_FILE} says {spec.total_bytes} "
                    "(truncated, or from another store)"
                )
            if _sample_digest(fd, spec) != meta.get("sample_sha256"):
                raise ExportError(
                    f"{rows_path} does not match {META_FILE} (sampled rows differ: rewritten or corrupted)"
                )
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        if random_access and hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)
        items = spec.row_bytes // spec.numpy_dtype.itemsize
        data = np.frombuffer(mapped, dtype=spec.numpy_dtype).reshape(spec.rows, items)
        return cls(path, spec, data, meta)

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """Rows gathered from :attr:`data` as values: unchanged, or dequantized (``int8``) to float32."""
        if self.spec.quantized:
            return stage_format.dequantize_rows(raw, self.spec.width, self.spec.ordered_columns)
        return raw

    def cold_reads(self) -> stage_format.ColdReads:
        """The serving stage's reads over this store (a plain gather, decoded as the stage decodes)."""
        return stage_format.ColdReads(
            self.data,
            stage_format.COLD_READ_FAULT,
            decode=lambda raw: self.decode(raw).astype(np.float32, copy=False),
            width=self.spec.width,
        )

    def global_rows(self, tables: npt.ArrayLike, ids: npt.ArrayLike) -> IntArray:
        """Global rows ``offset[table] + id`` of lookups, after checking them.

        Args:
            tables: table index 0..25 of each lookup (any shape that broadcasts with ``ids``).
            ids: in-table row of each lookup, already in ``[0, size)`` of its table.

        Returns:
            int64 global rows, of the broadcast shape.

        Raises:
            DataError: a non-integer index, a table outside 0..25 or an id outside its table.
        """
        table_array, id_array = np.asarray(tables), np.asarray(ids)
        for name, array in (("table indices", table_array), ("ids", id_array)):
            if array.dtype.kind not in "iu":
                raise DataError(f"row store {name} must be integers, got {array.dtype}")
        try:
            shape = np.broadcast_shapes(table_array.shape, id_array.shape)
        except ValueError:
            raise DataError(
                f"row store table indices {table_array.shape} and ids {id_array.shape} do not broadcast"
            ) from None
        # Per-table values are looked up at the tables' own shape (often just 26), then broadcast.
        table_array = table_array.astype(np.int64, copy=False)
        id_array = id_array.astype(np.int64, copy=False)
        if table_array.size and (table_array.min() < 0 or table_array.max() >= NUM_CATEGORICAL):
            bad = int(table_array[(table_array < 0) | (table_array >= NUM_CATEGORICAL)].flat[0])
            raise DataError(f"row store table index must be 0..{NUM_CATEGORICAL - 1}, got {bad}")
        # One comparison: a negative id seen as unsigned is above every table size.
        outside = id_array.view(np.uint64) >= self._sizes[table_array].view(np.uint64)
        if outside.any():
            where = np.flatnonzero(np.broadcast_to(outside, shape))
            first = int(where[0])
            table = int(np.broadcast_to(table_array, shape).flat[first])
            raise DataError(
                f"{where.size} row store ids outside their table, first "
                f"{int(np.broadcast_to(id_array, shape).flat[first])} for {CATEGORICAL_COLUMNS[table]} "
                f"(0..{self.spec.table_sizes[table] - 1})"
            )
        rows = self._offsets[table_array] + id_array
        return rows if rows.shape == shape else np.broadcast_to(rows, shape)

    def rows(self, tables: npt.ArrayLike, ids: npt.ArrayLike, column: str | None = None) -> np.ndarray:
        """The rows of lookups by table and in-table id, in the caller's order.

        Args:
            tables: table index 0..25 of each lookup, e.g. ``N`` ints, or ``arange(26)``
                against ``B x 26`` ids.
            ids: in-table row of each lookup (any shape broadcasting with ``tables``);
                each in ``[0, size)`` of its table: reduce raw ids first.
            column: only this column's values (default: whole rows).

        Returns:
            ``shape x width`` (or ``shape x column width``) values in the store's dtype,
            where ``shape`` is the broadcast shape of ``tables`` and ``ids`` (``N x width`` for
            1-D lookups). Repeated lookups each get their row.

        Raises:
            DataError: an index outside its table (see :meth:`global_rows`).
            ConfigError: no such column.
        """
        return self.rows_at(self.global_rows(tables, ids), column)

    def rows_at(self, global_rows: npt.ArrayLike, column: str | None = None) -> np.ndarray:
        """The rows at global rows (``offset[table] + id``), unchecked beyond numpy's bounds.

        One gather from the mapped file in the caller's order.

        Args:
            global_rows: int global rows of any shape.
            column: only this column's values (default: whole rows).

        Returns:
            ``shape x width`` (or ``shape x column width``) values in the store's dtype
            (float32 for an int8 store).

        Raises:
            ConfigError: no such column.
        """
        index = np.asarray(global_rows, dtype=np.int64)
        if self.spec.quantized:
            values = self.decode(self.data.take(index.reshape(-1), axis=0))
            if column is not None:
                values = values[:, self.spec.column_slice(column)]
            return values.reshape(*index.shape, values.shape[1])
        source = self.data if column is None else self.data[:, self.spec.column_slice(column)]
        gathered = source.take(index.reshape(-1), axis=0)
        return gathered.reshape(*index.shape, source.shape[1])

    def table(self, table: int) -> np.ndarray:
        """Table ``table``'s rows (0 = C1): a read-only ``size x width`` view of the file
        (for an int8 store, its values dequantized: a copy in memory).

        Raises:
            ConfigError: a table index outside 0..25.
        """
        if not 0 <= table < NUM_CATEGORICAL:
            raise ConfigError(f"row store table index must be 0..{NUM_CATEGORICAL - 1}, got {table}")
        start = self.spec.offsets[table]
        return self.decode(self.data[start : start + self.spec.table_sizes[table]])

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` of every row: a read-only ``rows x column width`` strided view of the file
        (for an int8 store, its values dequantized: a copy in memory).

        Raises:
            ConfigError: no such column.
        """
        columns = self.spec.column_slice(name)
        if self.spec.quantized:
            return self.decode(self.data)[:, columns]
        return self.data[:, columns]

    def verify(self, on_bytes: Callable[[int], None] | None = None) -> None:
        """Read all of ``rows.bin`` and check it against the SHA-256 in ``store.json``.

        Args:
            on_bytes: called with the bytes read after each piece (for a progress bar).

        Raises:
            ExportError: the digest differs, or the store was written without one.
        """
        expected = self.description.get("sha256")
        if not expected:
            raise ExportError(f"row store {self.path} was written without a digest; nothing to verify")
        fd = os.open(self.path / ROWS_FILE, os.O_RDONLY)
        try:
            actual = _file_digest(fd, self.spec.total_bytes, on_bytes)
        finally:
            os.close(fd)
        if actual != expected:
            raise ExportError(f"{self.path / ROWS_FILE} does not match the SHA-256 in {META_FILE}")


def _chunk_rows(spec: RowStoreSpec, chunk_rows: int | None) -> int:
    """Rows per chunk: ``chunk_rows``, or about :data:`CHUNK_BYTES` of rows."""
    if chunk_rows is None:
        return max(1, CHUNK_BYTES // spec.row_bytes)
    if chunk_rows < 1:
        raise ConfigError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return int(chunk_rows)


def write_arrays(
    path: Path,
    spec: RowStoreSpec,
    tables: Sequence[npt.ArrayLike],
    metadata: Mapping[str, Any] | None = None,
) -> RowStore:
    """Write a store from 26 in-memory tables (tests, tiny models).

    Args:
        path: the store's folder.
        spec: what it holds.
        tables: C1..C26, table ``t`` of shape ``table_sizes[t] x width``.
        metadata: kept in ``store.json``.

    Returns:
        The finished store, opened.

    Raises:
        ExportError: not 26 tables, or a table of the wrong shape.
    """
    if len(tables) != NUM_CATEGORICAL:
        raise ExportError(f"a row store needs {NUM_CATEGORICAL} tables (C1..C26), got {len(tables)}")
    with RowStoreWriter(path, spec, metadata=metadata) as writer:
        for table, values in enumerate(tables):
            shape = np.shape(values)
            if shape != (spec.table_sizes[table], spec.width):
                expected = f"{spec.table_sizes[table]} x {spec.width}"
                raise ExportError(f"{CATEGORICAL_COLUMNS[table]} must be {expected}, got {shape}")
            writer.write(table, 0, values)
    return RowStore.open(path)


def from_stacked(
    path: Path,
    spec: RowStoreSpec,
    stacked: npt.ArrayLike | Mapping[str, npt.ArrayLike],
    chunk_rows: int | None = None,
    on_rows: Callable[[int], None] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> RowStore:
    """Write a store from the bundle's stacked layout, one chunk of rows at a time.

    Args:
        path: the store's folder.
        spec: what it holds.
        stacked: ``sum(table_sizes) x width`` rows (e.g. DLRM's embedding weight as numpy),
            or column name -> ``sum(table_sizes) x column width`` (``sum(table_sizes)`` for a
            one-value column), e.g. ``{"embedding": deep_table, "wide": wide_table}`` for
            Wide & Deep, which avoids concatenating the tables first. Anything numpy can read
            row slices of works (numpy arrays, memmaps); values between columns are zeros.
        chunk_rows: rows per write (default: about 64 MB).
        on_rows: called with the rows written after each chunk.
        metadata: kept in ``store.json``.

    Returns:
        The finished store, opened.

    Raises:
        ExportError: an array of the wrong shape, or columns that differ from the spec's.
    """
    step = _chunk_rows(spec, chunk_rows)
    if isinstance(stacked, Mapping):
        parts = dict(stacked)
        if set(parts) != set(spec.columns):
            raise ExportError(
                f"stacked columns {sorted(parts)} differ from the row store's {sorted(spec.columns)}"
            )
    else:
        parts = {"": stacked}
    for name, values in parts.items():
        width = spec.width if not name else spec.columns[name][1] - spec.columns[name][0]
        shape = tuple(np.shape(values))
        if shape not in {(spec.rows, width), *([(spec.rows,)] if width == 1 else [])}:
            label = f"column {name!r}" if name else "stacked rows"
            raise ExportError(f"{label} must be {spec.rows} x {width}, got {shape}")
    buffer = np.zeros((min(step, spec.rows), spec.width), dtype=spec.value_dtype)
    with RowStoreWriter(path, spec, metadata=metadata) as writer:
        for start in range(0, spec.rows, step):
            stop = min(start + step, spec.rows)
            chunk = buffer[: stop - start]
            for name, values in parts.items():
                piece = np.asarray(cast(Any, values)[start:stop])
                columns = slice(0, spec.width) if not name else spec.column_slice(name)
                chunk[:, columns] = piece.reshape(stop - start, -1)
            writer.write_global(start, chunk)
            if on_rows is not None:
                on_rows(stop - start)
    return RowStore.open(path)


def _init_bound(init: str, table_rows: int) -> float:
    """Half-width of the uniform init of an embedding table of ``table_rows`` rows."""
    return math.sqrt(1.0 / table_rows) if init == "dlrm" else 0.05


def random_rows(
    spec: RowStoreSpec, table: int, first_row: int, count: int, seed: int = 0, init: str = "dlrm"
) -> np.ndarray:
    """Rows ``first_row .. first_row + count - 1`` of table ``table`` of :func:`random_store`'s store.

    Each block of :data:`RANDOM_BLOCK_ROWS` rows comes from its own stream seeded by
    ``(seed, table, block)``, so a row's values depend on neither the chunk size nor the
    rows asked for together: any rows can be regenerated without the store.

    Values: every column but ``"wide"`` uniform in ``[-b, b)``, ``b = sqrt(1/n)`` for a table
    of ``n`` rows (``init="dlrm"``, the reference DLRM's init) or ``b = 0.05``
    (``init="wide_deep"``, the Keras embedding default); the ``"wide"`` column normal with
    standard deviation :data:`WIDE_STD`. Drawn in float32, then cast to the store's dtype
    (an int8 store quantizes them when they are written).

    Returns:
        ``count x width`` values in the store's dtype (float32 for an int8 store).

    Raises:
        ConfigError: an unknown init, or rows outside the table.
    """
    if init not in INITS:
        raise ConfigError(f"row store init must be {' or '.join(INITS)}, got {init!r}")
    if not 0 <= table < NUM_CATEGORICAL:
        raise ConfigError(f"row store table index must be 0..{NUM_CATEGORICAL - 1}, got {table}")
    size = spec.table_sizes[table]
    if first_row < 0 or count < 0 or first_row + count > size:
        last = first_row + count - 1
        raise ConfigError(f"rows {first_row}..{last} outside {CATEGORICAL_COLUMNS[table]} (0..{size - 1})")
    out = np.zeros((count, spec.width), dtype=spec.value_dtype)
    bound = _init_bound(init, size)
    first_block = first_row // RANDOM_BLOCK_ROWS
    last_block = (first_row + count - 1) // RANDOM_BLOCK_ROWS
    for block in range(first_block, last_block + 1):
        block_start = block * RANDOM_BLOCK_ROWS
        block_rows = min(RANDOM_BLOCK_ROWS, size - block_start)
        # Rows of this block inside the request, relative to the block and to `out`.
        low = max(first_row, block_start) - block_start
        high = min(first_row + count, block_start + block_rows) - block_start
        target = slice(block_start + low - first_row, block_start + high - first_row)
        generator = np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, table, block])))
        for name, (start, stop) in spec.columns.items():
            shape = (block_rows, stop - start)
            if name == WIDE_COLUMN:
                values = generator.standard_normal(shape, dtype=np.float32)
                values *= WIDE_STD
            else:
                values = generator.random(shape, dtype=np.float32)
                values *= 2 * bound
                values -= bound
            out[target, start:stop] = values[low:high]
    return out


def _finish(write: Future[None], count: int, on_rows: Callable[[int], None] | None) -> None:
    """Wait for a chunk's write (re-raising its error), then report its rows."""
    write.result()
    if on_rows is not None:
        on_rows(count)


def random_store(
    path: Path,
    spec: RowStoreSpec,
    seed: int = 0,
    init: str = "dlrm",
    on_rows: Callable[[int], None] | None = None,
    chunk_rows: int | None = None,
) -> RowStore:
    """Write a store of random tables without training (for benchmarks at full size).

    The values are :func:`random_rows`' (deterministic per seed, table and row). Each
    table is generated chunk by chunk while a second thread writes the previous chunk,
    so memory holds two chunks (about 64 MB each by default) whatever the store's size,
    and generating overlaps the disk. The Criteo Terabyte preset at dimension 128 in
    float16 is 48 GB::

        spec = RowStoreSpec.for_dlrm(CRITEO_TERABYTE, 128, "float16")
        random_store(Path("/data/terabyte-rows"), spec, seed=0)

    (``python -m export row-store random --table-sizes criteo-terabyte --dim 128 --dtype float16
    --out DIR`` does the same with a progress bar.)

    Args:
        path: the store's folder.
        spec: what it holds.
        seed: the random seed.
        init: ``"dlrm"`` or ``"wide_deep"`` (see :func:`random_rows`).
        on_rows: called with the rows written after each chunk.
        chunk_rows: rows per chunk (default: about 64 MB; chunks never span tables). Below
            :data:`RANDOM_BLOCK_ROWS` a block is generated once per chunk it touches (slower,
            same values).

    Returns:
        The finished store, opened.

    Raises:
        ConfigError: an unknown init.
        ExportError: not enough free disk.
    """
    from concurrent.futures import ThreadPoolExecutor

    if init not in INITS:
        raise ConfigError(f"row store init must be {' or '.join(INITS)}, got {init!r}")
    step = _chunk_rows(spec, chunk_rows)
    metadata = {"source": "random", "seed": seed, "init": init}
    with (
        RowStoreWriter(path, spec, metadata=metadata) as writer,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="row-store-writer") as pool,
    ):
        pending: tuple[Future[None], int] | None = None
        for table, size in enumerate(spec.table_sizes):
            for start in range(0, size, step):
                count = min(step, size - start)
                chunk = random_rows(spec, table, start, count, seed, init)
                if pending is not None:
                    _finish(*pending, on_rows)
                pending = (pool.submit(writer.write, table, start, chunk), count)
        if pending is not None:
            _finish(*pending, on_rows)
    return RowStore.open(path)
