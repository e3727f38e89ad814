"""The embedding stage's numpy core: split each lookup into hot (a slot) or cold (a row).

A hot/cold model keeps the most looked-up rows of its 26 tables inside its
dense ONNX model and the rest in a memory-mapped row store. For a request's
``B x 26`` raw ids this module computes what the dense model needs:

- ``hot_slots``      ``B x 26`` int64: 0 where lookup ``(b, t)`` is cold, ``s >= 1``
  where it is hot: row ``s - 1`` of table ``t``'s hot rows (the hot set's order);
- ``cold_positions`` ``N`` int64: ``b * 26 + t`` of each cold lookup, ascending;
- ``cold_rows``      ``N x W`` float32: the store's row of each cold lookup, in that
  order (an FP16 store is cast to FP32, an int8 store dequantized: :func:`dequantize_rows`).

Only the cold rows leave the stage: an ensemble that passes whole ``B x 26 x D``
blocks between its steps loses most of its throughput to the copies.

The served stage is compiled (the Triton C++ backend ``embedding``: ``lookup.cc``,
``store.cc``, ``cold_reads.cc`` beside this file) and does the same; this module is its
definition in Python, run in process: the export checks a hot/cold model with it
(:func:`export.tables.hot_cold_graph.stage_reference`), ``python -m lab cold-reads`` times its
ways of reading cold rows, and the differential tests hold the compiled stage to it, answers
and the store's load errors alike. It imports only numpy and the standard library, and reads
the two file formats on its own: :func:`read_store_meta` is the one reader of ``store.json`` in
Python (:meth:`export.tables.row_store.RowStore.open` starts from it too), and
:func:`read_hot_ids` reads a hot set as ``numpy.savez`` writes it, as the compiled stage does.

The store's checksums are defined here, once: :mod:`export.tables.row_store` writes them
with these functions and the stage verifies them when it loads
(:func:`open_store`). ``store.json`` records a CRC-32 (``zlib.crc32``) of each
64 MiB chunk of ``rows.bin`` and a fingerprint of the store (a SHA-256 over its
spec and those CRCs). A flipped bit or a truncated file fails the load naming
``rows.bin``; a store replaced by another of the same shape fails against the
fingerprint in the stage's config (``row_store_fingerprint``), where the export
wrote one.

Why CRC-32 per chunk: it catches every single-bit flip and every burst up to
32 bits, ``zlib`` is in every Python (the NGC image's too) and releases the GIL,
so chunks verify in parallel threads, each one faster than the whole-file SHA-256
of :meth:`export.tables.row_store.RowStore.verify`, which runs on one thread. A
store in the page cache thus verifies at the rate of all the cores together; read
from disk, the disk's rate bounds it instead. The rate of a machine is measured
on a store written by ``python -m export row-store random --table-sizes 300000
--dim 128 --dtype float16 --out /tmp/bench-store`` and checked by ``python -c
"from pathlib import Path; from export.tables.row_store import verify_checksums
as v; print(v(Path('/tmp/bench-store'), threads=2))"`` (seconds). Each stage
instance verifies at its own load.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
import threading
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .uring import Ring, RingUnavailable

#: The row store's files and format, as :mod:`export.tables.row_store` writes them.
STORE_ROWS_FILE = "rows.bin"
STORE_META_FILE = "store.json"
STORE_FORMAT = "criteo-row-store"
STORE_FORMAT_VERSION = 1
_FLOAT_DTYPES: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}
#: A store of rows quantized row-wise to 8 bits (see :func:`quantize_rows`).
STORE_INT8 = "int8"
#: The value types a store may hold.
STORE_DTYPES: tuple[str, ...] = ("float32", "float16", STORE_INT8)
#: Bytes of one column's scale and bias in an int8 row (two little-endian float32).
INT8_PARAM_BYTES = 8
#: Codes of an int8 row: 0 .. 255.
INT8_LEVELS = 255
#: ``store.json``'s key of the chunk checksums: ``{"kind", "chunk_bytes", "values"}``.
STORE_CHECKSUMS_KEY = "checksums"
#: ``store.json``'s key of the store's fingerprint (see :func:`store_fingerprint`).
STORE_FINGERPRINT_KEY = "fingerprint"
#: The checksum of each chunk of ``rows.bin``.
CHECKSUM_KIND = "crc32"
#: Bytes per checksummed chunk: 750 checksums for a 48 GB store, and a chunk
#: large enough that zlib runs at full speed between the GIL releases.
CHECKSUM_CHUNK_BYTES = 64 << 20
#: Read size of the SHA-256 pass over a store written before the chunk checksums.
_SHA256_READ_BYTES = 16 << 20
#: Read size of the checksum pass: small enough that the bytes read are still in cache when hashed.
_CHECK_READ_BYTES = 1 << 20

#: The stage's config parameters (string values), as ``export.tables.ensemble`` writes them.
#: The row store folder: absolute, or relative to the model's version folder.
PARAM_ROW_STORE = "row_store"
#: The hot-set ``.npz``: absolute, or relative to the model's version folder.
PARAM_HOT_SET = "hot_set"
#: The rows of each table, comma-separated.
PARAM_TABLE_SIZES = "table_sizes"
#: The fingerprint of the store the stage's hot set was exported against (optional):
#: a store of another content under the same path fails the load.
PARAM_ROW_STORE_FINGERPRINT = "row_store_fingerprint"
#: How the stage reads its cold rows (optional): one of :data:`COLD_READS`.
PARAM_COLD_READS = "cold_reads"
#: Threads of the ``threads`` way of reading (optional; default :data:`DEFAULT_COLD_READ_THREADS`).
PARAM_COLD_READ_THREADS = "cold_read_threads"
#: The ``io_uring`` way's read-ahead hints: requests with at most this many distinct cold rows
#: hint each run of pages first (optional; default :data:`DEFAULT_COLD_READ_HINT_ROWS`; 0: never).
PARAM_COLD_READ_HINT_ROWS = "cold_read_hint_rows"
#: Bytes of the stage's memory tier of cold rows, which every instance of the model shares
#: (optional; absent: the whole store where it fits in a quarter of the memory the server may use,
#: else that quarter; 0: none, the page cache keeps what was read). With it, a warm cold row is a
#: copy in memory, no system call, and the rows it misses are read with O_DIRECT by the
#: ``io_uring`` way; the ``fault`` way takes none (its mapping is its own cache). The compiled
#: stage's alone: the answers are the same with or without it.
PARAM_COLD_CACHE_BYTES = "cold_cache_bytes"
#: Threads that copy a request of many lookups out of a memory tier that holds the whole store
#: (optional; default :data:`DEFAULT_TIER_COPY_THREADS`, the instance's own among them; 1: its
#: alone). The compiled stage's alone: the answers are the same with any number.
PARAM_TIER_COPY_THREADS = "tier_copy_threads"
#: The compiled stage's default of :data:`PARAM_TIER_COPY_THREADS`.
DEFAULT_TIER_COPY_THREADS = 2
#: Config parameter: ids per bag of each table, C1's first (26 comma-separated counts; absent:
#: one id per table), as the dense models' configs write it.
PARAM_HOTNESS = "hotness"

#: The ways of reading a request's cold rows (see :class:`ColdReads`).
COLD_READ_URING = "io_uring"
COLD_READ_PREFETCH = "prefetch"
COLD_READ_THREADS = "threads"
COLD_READ_FAULT = "fault"
COLD_READS = (COLD_READ_URING, COLD_READ_PREFETCH, COLD_READ_THREADS, COLD_READ_FAULT)
#: The stage's way when its config names none.
DEFAULT_COLD_READS = COLD_READ_URING
DEFAULT_COLD_READ_THREADS = 8
#: Measured by ``python -m lab cold-reads`` (benchmarks/cold_tier/cold_reads.md, io_uring
#: against io_uring-no-hints): with the hints, a request of a few dozen cold rows takes less
#: time; from a few hundred rows on, the hints' CPU (one system call per run of pages)
#: outweighs the time they save.
DEFAULT_COLD_READ_HINT_ROWS = 256
#: The kernel's page: the unit a cold row is read from disk in.
PAGE_BYTES = mmap.PAGESIZE


class StageError(Exception):
    """The stage cannot load: a missing or inconsistent store, hot-set file or parameter."""


class RequestError(Exception):
    """A request the stage cannot answer; it becomes that request's error response.

    Args:
        message: the error text the client sees.
        invalid_argument: the request itself is wrong (INVALID_ARGUMENT), as opposed
            to a failure while answering it (INTERNAL).
    """

    def __init__(self, message: str, invalid_argument: bool = True) -> None:
        super().__init__(message)
        self.invalid_argument = invalid_argument


def int8_row_bytes(width: int, columns: int) -> int:
    """Bytes of one int8 row: ``width`` codes, then a scale and a bias per column."""
    return width + INT8_PARAM_BYTES * columns


def quantize_rows(values: np.ndarray, columns: Sequence[tuple[int, int]]) -> np.ndarray:
    """``n x W`` float values as int8 rows: ``n x (W + 8 * len(columns))`` bytes.

    FBGEMM's 8-bit row-wise layout, with a scale and a bias per column of the row
    rather than per row (a Wide & Deep row keeps its one wide weight exact): for each
    column ``[a, b)`` of a row, ``bias = min``, ``scale = (max - min) / 255`` and
    ``code = round((value - bias) / scale)``; the row's codes come first, then each
    column's scale and bias as little-endian float32, in column order. A column whose
    values are all equal has scale 0 and is stored exactly (its bias).
    :func:`dequantize_rows` reads them back within ``scale / 2`` of each value.

    Args:
        values: finite float values, ``n x W``.
        columns: ``(start, stop)`` of each column, in row order, tiling ``[0, W)``.
    """
    values = np.asarray(values, dtype=np.float32)
    count, width = values.shape
    out = np.zeros((count, int8_row_bytes(width, len(columns))), dtype=np.uint8)
    params = np.empty((count, len(columns), 2), dtype="<f4")
    for index, (start, stop) in enumerate(columns):
        part = values[:, start:stop]
        low = part.min(axis=1) if count else np.zeros(0, dtype=np.float32)
        high = part.max(axis=1) if count else np.zeros(0, dtype=np.float32)
        scale = (high - low) / np.float32(INT8_LEVELS)
        step = np.where(scale > 0, scale, np.float32(1.0))
        codes = np.rint((part - low[:, None]) / step[:, None])
        np.clip(codes, 0, INT8_LEVELS, out=codes)
        out[:, start:stop] = codes.astype(np.uint8)
        params[:, index, 0] = scale
        params[:, index, 1] = low
    out[:, width:] = params.reshape(count, 2 * len(columns)).view(np.uint8)
    return out


def dequantize_rows(raw: np.ndarray, width: int, columns: Sequence[tuple[int, int]]) -> np.ndarray:
    """Int8 rows (:func:`quantize_rows`), ``n x row bytes``, as ``n x width`` float32:
    ``code * scale + bias``."""
    count = raw.shape[0]
    values = raw[:, :width].astype(np.float32)
    params = np.ascontiguousarray(raw[:, width:]).view("<f4").reshape(count, len(columns), 2)
    for index, (start, stop) in enumerate(columns):
        values[:, start:stop] *= params[:, index, 0:1]
        values[:, start:stop] += params[:, index, 1:2]
    return values


#: The most characters of a ``store.json`` value an error line shows (its compact JSON), "..." after.
_SHOWN_CHARS = 60
#: A field ``store.json`` does not have, as an error line names it.
_ABSENT: Any = object()
#: Integers in ``store.json`` are 64-bit signed, as the compiled stage reads them.
_INT64 = 2**63


def shown_json(value: Any) -> str:
    """A ``store.json`` value as an error line shows it: compact JSON (keys sorted, ASCII only),
    at most 60 characters; ``nothing`` for a field that is absent. The compiled stage writes the
    same text of the same value."""
    if value is _ABSENT:
        return "nothing"
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _is_int(value: Any, minimum: int = -_INT64, maximum: int = _INT64 - 1) -> bool:
    """Whether ``value`` is a JSON integer (not a bool, not a float) in ``[minimum, maximum]``."""
    return type(value) is int and minimum <= value <= maximum


def _field(meta_path: Path, name: str, value: Any, expected: str) -> StageError:
    """The error of a ``store.json`` field that is not what the format says."""
    return StageError(f"{meta_path}: {name} must be {expected}, got {shown_json(value)}")


def store_columns(spec: dict[str, Any], width: int) -> tuple[tuple[int, int], ...]:
    """The columns of a store's spec (``store.json``), in row order; they must tile ``[0, width)``.

    ``spec["columns"]`` is absent, null or an object of ``[start, stop]`` pairs of integers
    (one column, the whole row, where it names none).

    Raises:
        StageError: columns of another form, or that overlap, leave a gap or pass the row's end
            (without the file's name: :func:`read_store_meta` puts it in front).
    """
    named = spec.get("columns", _ABSENT)
    if named is _ABSENT or named is None:
        return ((0, width),)
    if not isinstance(named, dict) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(_is_int(bound) for bound in pair)
        for pair in named.values()
    ):
        raise StageError(
            f"spec.columns must be an object of [start, stop] pairs of integers, got {shown_json(named)}"
        )
    columns = sorted((int(a), int(b)) for a, b in named.values())
    if not columns:
        return ((0, width),)
    edges = [0] + [b for _, b in columns]
    if [a for a, _ in columns] != edges[:-1] or edges[-1] != width or any(a >= b for a, b in columns):
        listed = shown_json([list(column) for column in columns])
        raise StageError(f"spec.columns {listed} do not tile a row of {width} values")
    return tuple(columns)


@dataclass(frozen=True)
class StoreMeta:
    """A row store's ``store.json``, read and checked (:func:`read_store_meta`).

    Attributes:
        path: the store's folder.
        meta_path, rows_path: its ``store.json`` and ``rows.bin``.
        meta: the whole description, as JSON values.
        table_sizes: rows of each table (each at least 1).
        width: values per row.
        dtype: one of :data:`STORE_DTYPES`.
        columns: each column's ``(start, stop)``, in row order, tiling ``[0, width)``.
        row_bytes: bytes of one row in ``rows.bin``.
        file_bytes: bytes of ``rows.bin`` (what its spec needs, and ``store.json`` says).
    """

    path: Path
    meta_path: Path
    rows_path: Path
    meta: dict[str, Any]
    table_sizes: tuple[int, ...]
    width: int
    dtype: str
    columns: tuple[tuple[int, int], ...]
    row_bytes: int
    file_bytes: int


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_store_meta(path: Path) -> StoreMeta:
    """Read the row store description at ``path`` (``store.json``) and check it field by field:
    the one reader of the format in Python (:func:`open_store` and
    :meth:`export.tables.row_store.RowStore.open` both start here; the compiled stage's
    ``store.cc`` is the one in C++ and says the same lines).

    Raises:
        StageError: one line that names the file, the field, the value found (its compact
            JSON) and what the format expects.
    """
    path = Path(path)
    meta_path, rows_path = path / STORE_META_FILE, path / STORE_ROWS_FILE
    try:
        raw = meta_path.read_bytes()
    except FileNotFoundError:
        raise StageError(f"no row store at {path}: {STORE_META_FILE} is missing") from None
    except OSError as exc:
        raise StageError(f"cannot read {meta_path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StageError(f"cannot read {meta_path}: not UTF-8 text") from None
    try:
        meta = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise StageError(f"cannot read {meta_path}: not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
        raise StageError(f"{meta_path} is not a row store description")
    version = meta.get("version", _ABSENT)
    if not _is_int(version) or version != STORE_FORMAT_VERSION:
        raise StageError(
            f"{meta_path} has row store format version {shown_json(version)}; "
            f"this stage reads version {STORE_FORMAT_VERSION}"
        )
    spec = meta.get("spec", _ABSENT)
    if not isinstance(spec, dict):
        raise _field(meta_path, "spec", spec, "an object")
    sizes = spec.get("table_sizes", _ABSENT)
    if not isinstance(sizes, list) or not sizes or not all(_is_int(size, 1) for size in sizes):
        raise _field(meta_path, "spec.table_sizes", sizes, "a list of integers >= 1")
    width = spec.get("width", _ABSENT)
    if not _is_int(width, 1):
        raise _field(meta_path, "spec.width", width, "an integer >= 1")
    dtype = spec.get("dtype", _ABSENT)
    if dtype not in STORE_DTYPES or not isinstance(dtype, str):
        raise _field(meta_path, "spec.dtype", dtype, f"one of {', '.join(STORE_DTYPES)}")
    try:
        columns = store_columns(spec, width)
    except StageError as exc:
        raise StageError(f"{meta_path}: {exc}") from None
    if dtype == STORE_INT8:
        row_bytes = int8_row_bytes(width, len(columns))
    else:
        row_bytes = width * _FLOAT_DTYPES[dtype].itemsize
    needed = sum(sizes) * row_bytes
    if needed >= _INT64:
        shown = "more than 2**128" if needed >= 2**128 else str(needed)
        raise StageError(f"{meta_path}: its spec needs {shown} bytes, more than a file can hold")
    file_bytes = meta.get("file_bytes", _ABSENT)
    if not _is_int(file_bytes) or file_bytes != needed:
        raise StageError(f"{meta_path}: file_bytes is {shown_json(file_bytes)}, its spec needs {needed}")
    return StoreMeta(path, meta_path, rows_path, meta, tuple(sizes), width, dtype, columns, row_bytes, needed)


@dataclass(frozen=True)
class StoreRows:
    """A row store mapped read-only.

    Attributes:
        path: the store's folder.
        table_sizes: rows of each table.
        width: values per row.
        data: read-only array over ``rows.bin``: ``rows x width`` float32 or float16 values,
            or, for an int8 store, ``rows x row bytes`` uint8 (see :meth:`decode`).
        fingerprint: ``store.json``'s fingerprint ("" for a store written without checksums).
        verified: every byte of ``rows.bin`` was checked against ``store.json``.
        check: how the content was checked, in words (for the stage's load line).
        mapping: the mapping ``data`` lies in (for read-ahead hints and eviction).
    """

    path: Path
    table_sizes: tuple[int, ...]
    width: int
    data: np.ndarray
    fingerprint: str = ""
    verified: bool = False
    check: str = "not checked"
    mapping: mmap.mmap | None = None
    dtype: str = "float32"
    columns: tuple[tuple[int, int], ...] = ()

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """Rows gathered from :attr:`data` as ``n x width`` float32 values."""
        if self.dtype == STORE_INT8:
            return dequantize_rows(raw, self.width, self.columns)
        return _as_float32(raw)

    @property
    def offsets(self) -> np.ndarray:
        """Global row of each table's first row (int64)."""
        sizes = np.asarray(self.table_sizes, dtype=np.int64)
        return np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)


class ChunkChecksums:
    """CRC-32 of each :data:`CHECKSUM_CHUNK_BYTES` chunk of a byte stream fed in order.

    Feed the bytes of ``rows.bin`` from its start with :meth:`update`, in pieces of
    any size; :meth:`values` then gives one CRC per chunk (the last chunk may be short).

    Args:
        chunk_bytes: bytes per chunk (default: :data:`CHECKSUM_CHUNK_BYTES`).
    """

    def __init__(self, chunk_bytes: int | None = None) -> None:
        chunk_bytes = CHECKSUM_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self._done: list[int] = []
        self._crc = 0
        self._filled = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        """Feed the next bytes of the stream."""
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.chunk_bytes - self._filled)
            self._crc = zlib.crc32(view[:take], self._crc)
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk_bytes:
                self._done.append(self._crc)
                self._crc, self._filled = 0, 0

    def values(self) -> list[int]:
        """The CRC of every chunk fed so far, the partial last one included."""
        return self._done + ([self._crc] if self._filled else [])

    def to_json(self) -> dict[str, Any]:
        """The ``store.json`` entry: ``{"kind": "crc32", "chunk_bytes": ..., "values": [...]}``."""
        return {"kind": CHECKSUM_KIND, "chunk_bytes": self.chunk_bytes, "values": self.values()}


def store_fingerprint(spec: dict[str, Any], checksums: dict[str, Any]) -> str:
    """The store's fingerprint: SHA-256 (hex) of its spec and chunk checksums as canonical JSON.

    Two stores of the same content have the same fingerprint, whoever wrote them; a
    store of another content (or shape) almost surely not.

    Args:
        spec: ``store.json``'s ``spec``.
        checksums: ``store.json``'s ``checksums`` (see :meth:`ChunkChecksums.to_json`).
    """
    text = json.dumps({"spec": spec, "checksums": checksums}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def verify_checksums(
    rows_path: Path,
    checksums: dict[str, Any],
    size: int,
    threads: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> float:
    """Read ``rows_path`` and check each chunk against ``checksums`` (``store.json``'s entry).

    Chunks are checked by ``threads`` threads at once (zlib releases the GIL), each
    reading its chunk in 1 MiB pieces into a buffer of its own that stays in the CPU's
    cache (measured: faster than hashing a mapping of the file, which faults in each page).

    Args:
        rows_path: the store's ``rows.bin``.
        checksums: ``{"kind": "crc32", "chunk_bytes": n, "values": [...]}``.
        size: bytes of ``rows.bin`` the description says.
        threads: threads reading at once (default: the CPUs this process may use, at most 8).
        on_bytes: called with the bytes checked after each chunk (for a progress bar).

    Returns:
        Seconds the check took.

    Raises:
        StageError: an unknown checksum kind, a chunk count that does not fit ``size``,
            or a chunk that differs or that the file ends before (the first one is named,
            by byte range).
    """
    meta_path = rows_path.parent / STORE_META_FILE
    kind = checksums.get("kind", _ABSENT)
    if kind != CHECKSUM_KIND:
        raise _field(meta_path, "checksums.kind", kind, shown_json(CHECKSUM_KIND))
    chunk_bytes = checksums.get("chunk_bytes", _ABSENT)
    if not _is_int(chunk_bytes, 1):
        raise _field(meta_path, "checksums.chunk_bytes", chunk_bytes, "an integer >= 1")
    expected = checksums.get("values", _ABSENT)
    if not isinstance(expected, list) or not all(_is_int(value, 0, 0xFFFFFFFF) for value in expected):
        raise _field(meta_path, "checksums.values", expected, "a list of CRC-32s (integers 0 to 4294967295)")
    chunks = -(-size // chunk_bytes)
    if len(expected) != chunks:
        raise StageError(
            f"{rows_path}: {len(expected)} checksums recorded, {size} bytes need {chunks} "
            f"(chunks of {chunk_bytes} bytes)"
        )
    if threads is None:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = min(8, usable or 1)
    started = time.perf_counter()
    fd = os.open(rows_path, os.O_RDONLY)
    buffers = threading.local()

    def chunk_crc(span: tuple[int, int]) -> int:
        """CRC-32 of one chunk, read in pieces into this thread's buffer (-1: the file ends first)."""
        buffer = getattr(buffers, "view", None)
        if buffer is None:
            buffer = buffers.view = memoryview(bytearray(_CHECK_READ_BYTES))
        start, length = span
        crc, done = 0, 0
        while done < length:
            got = os.preadv(fd, [buffer[: min(_CHECK_READ_BYTES, length - done)]], start + done)
            if got == 0:
                return -1
            crc = zlib.crc32(buffer[:got], crc)
            done += got
        return crc

    spans = [(start, min(chunk_bytes, size - start)) for start in range(0, size, chunk_bytes)]
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="row-store-check")
    try:
        for index, (crc, (start, length)) in enumerate(zip(pool.map(chunk_crc, spans), spans, strict=True)):
            if crc != expected[index]:
                why = "the file ends before it" if crc < 0 else "their CRC-32 differs"
                raise StageError(
                    f"{rows_path} is damaged: bytes {start}..{start + length - 1} (chunk {index + 1} "
                    f"of {chunks}) do not match {STORE_META_FILE} ({why})"
                )
            if on_bytes is not None:
                on_bytes(length)
    finally:
        # The first bad chunk settles it: the chunks not started yet are dropped.
        pool.shutdown(wait=True, cancel_futures=True)
        os.close(fd)
    return time.perf_counter() - started


def _verify_sha256(rows_path: Path, expected: str, size: int) -> float:
    """Check ``rows_path`` against the whole-file SHA-256 of a store written before the checksums."""
    started = time.perf_counter()
    digest = hashlib.sha256()
    fd = os.open(rows_path, os.O_RDONLY)
    try:
        offset = 0
        while offset < size:
            piece = os.pread(fd, min(_SHA256_READ_BYTES, size - offset), offset)
            if not piece:
                break
            digest.update(piece)
            offset += len(piece)
    finally:
        os.close(fd)
    if digest.hexdigest() != expected:
        raise StageError(f"{rows_path} is damaged: it does not match the SHA-256 in {STORE_META_FILE}")
    return time.perf_counter() - started


def _rate(size: int, seconds: float) -> str:
    return f"{size / 1e9:.2f} GB in {seconds:.2f} s" + (
        f", {size / seconds / 1e9:.1f} GB/s" if seconds > 0 else ""
    )


def _verify_content(described: StoreMeta) -> tuple[str, bool, str]:
    """Check ``rows.bin``'s every byte as its description allows: ``(fingerprint, verified, how)``.

    A store with chunk checksums is checked against them; a store written by an older
    bundle (no checksums) against its whole-file SHA-256, on one thread; a store with
    neither (written with ``digest=False`` by an older bundle) is loaded unverified.
    """
    meta, meta_path, rows_path, size = (
        described.meta, described.meta_path, described.rows_path, described.file_bytes
    )  # fmt: skip
    checksums = meta.get(STORE_CHECKSUMS_KEY)
    if checksums is not None:
        if not isinstance(checksums, dict):
            raise _field(meta_path, STORE_CHECKSUMS_KEY, checksums, "an object")
        fingerprint = store_fingerprint(meta["spec"], checksums)
        recorded = meta.get(STORE_FINGERPRINT_KEY)
        if recorded is not None and recorded != fingerprint:
            raise StageError(
                f"{meta_path}: its fingerprint does not match its own spec and checksums (edited by hand?)"
            )
        seconds = verify_checksums(rows_path, checksums, size)
        return (
            fingerprint,
            True,
            f"CRC-32 of {len(checksums['values'])} chunk(s) verified ({_rate(size, seconds)})",
        )
    sha256 = meta.get("sha256")
    if sha256 is not None and not isinstance(sha256, str):
        raise _field(meta_path, "sha256", sha256, "a string")
    if sha256:
        seconds = _verify_sha256(rows_path, sha256, size)
        return "", True, f"SHA-256 verified, no chunk checksums (older store; {_rate(size, seconds)})"
    return (
        "",
        False,
        (
            f"UNVERIFIED: {STORE_META_FILE} has no checksums (written by an older bundle without a digest); "
            "a damaged rows.bin would be served: rewrite the store"
        ),
    )


def open_store(path: Path, verify: bool = True) -> StoreRows:
    """Map the row store at ``path`` after checking its description, file size and content.

    ``export`` opened the store with :meth:`export.tables.row_store.RowStore.open` when it
    wrote the stage; this checks that the store found at serving time is still a
    complete, undamaged store of the same format: its description field by field
    (:func:`read_store_meta`), then every byte against the chunk checksums of
    ``store.json`` (see :func:`_verify_content` for older stores).

    Args:
        path: the store's folder.
        verify: check the content (``False``: description and size only).

    Raises:
        StageError: in one line: no finished store there, a field of its description that is not
            what the format says, a ``rows.bin`` whose size differs from its description, or
            whose content differs from its checksums (the message names ``rows.bin``).
    """
    described = read_store_meta(path)
    rows_path = described.rows_path
    try:
        fd = os.open(rows_path, os.O_RDONLY)
    except OSError as exc:
        raise StageError(f"cannot open {rows_path}: {exc.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        if size != described.file_bytes:
            raise StageError(
                f"{rows_path} has {size} bytes, {STORE_META_FILE} says {described.file_bytes} "
                "(truncated, or from another store)"
            )
        fingerprint, verified, check = "", False, "content not checked"
        if verify:
            fingerprint, verified, check = _verify_content(described)
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    # A cold lookup then reads one page, not the kernel's read-ahead window.
    if hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    dtype = np.dtype(np.uint8) if described.dtype == STORE_INT8 else _FLOAT_DTYPES[described.dtype]
    rows = sum(described.table_sizes)
    data = np.frombuffer(mapped, dtype=dtype).reshape(rows, described.row_bytes // dtype.itemsize)
    return StoreRows(
        described.path, described.table_sizes, described.width, data, fingerprint, verified, check,
        mapped, described.dtype, described.columns,
    )  # fmt: skip


#: The integer dtypes a hot set's arrays may have (what numpy writes for ids).
_HOT_SET_KINDS = "iu"
#: What zipfile and numpy raise of a file that is no archive numpy.savez wrote, or a damaged one.
_UNREADABLE = (ValueError, OSError, EOFError, KeyError, RuntimeError, NotImplementedError, zipfile.BadZipFile)


def read_hot_ids(path: Path, num_tables: int) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]]:
    """The table sizes and each table's hot ids (hottest first) of a hot-set ``.npz``.

    Reads the file :meth:`export.tables.hot_rows.HotSet.save` writes with ``numpy.savez``:
    ``table_sizes`` and ``ids_C1`` .. ``ids_C<num_tables>``, each a 1-D array of integers, the
    archive's members stored, not compressed. The compiled stage (``npz.cc``) reads no other
    form either.

    Raises:
        StageError: the file is missing or not such a hot set of ``num_tables`` tables, in one
            line that names the file and the member.
    """
    path = Path(path)
    if not path.is_file():
        raise StageError(f"no hot-set file: {path}" + (" is not a file" if path.exists() else ""))

    def refused(reason: str) -> StageError:
        return StageError(f"{path}: not a hot-set file ({reason})")

    try:
        with zipfile.ZipFile(path) as archive:
            stored = {info.filename: info.compress_type == zipfile.ZIP_STORED for info in archive.infolist()}
    except _UNREADABLE as exc:
        raise refused(f"no ZIP archive numpy.savez writes: {_first_line(exc)}") from None

    def member(data: Any, name: str) -> np.ndarray:
        entry = f"{name}.npy" if f"{name}.npy" in stored else name
        if entry not in stored:
            raise refused(f"no member {name}.npy")
        if not stored[entry]:
            raise refused(
                f"member {entry} is compressed: save the hot set with numpy.savez, not savez_compressed"
            )
        try:
            values = np.asarray(data[name])
        except _UNREADABLE as exc:
            raise refused(f"member {entry}: {_first_line(exc)}") from None
        if values.dtype.kind not in _HOT_SET_KINDS:
            raise refused(
                f"member {entry}: dtype '{values.dtype.str}', expected integers (a numpy int or uint dtype)"
            )
        if values.ndim != 1:
            raise refused(f"member {entry}: shape {values.shape}, expected one dimension")
        if values.dtype.kind == "u" and values.size and int(values.max()) >= _INT64:
            position = int(np.argmax(values >= _INT64))
            raise refused(
                f"member {entry}: value {int(values[position])} at position {position} does not fit an int64"
            )
        return values.astype(np.int64)

    try:
        with np.load(path, allow_pickle=False) as data:
            sizes = tuple(int(size) for size in member(data, "table_sizes"))
            if len(sizes) != num_tables:
                raise StageError(f"{path}: a hot set of {len(sizes)} tables, the stage has {num_tables}")
            ids = tuple(member(data, f"ids_C{t + 1}") for t in range(num_tables))
    except _UNREADABLE as exc:
        raise refused(_first_line(exc)) from None
    return sizes, ids


def _first_line(exc: BaseException) -> str:
    """An exception's text in one line (its type's name where it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: Every float16 bit pattern's float32 value (256 KiB, built on first use): a gather from
#: it casts a float16 row faster than ``astype`` (numpy 1.26 converts one value at a time),
#: bit for bit the same, NaN payloads included.
_HALF_VALUES: np.ndarray | None = None


def _half_values() -> np.ndarray:
    global _HALF_VALUES
    if _HALF_VALUES is None:
        _HALF_VALUES = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    return _HALF_VALUES


def _as_float32(rows: np.ndarray) -> np.ndarray:
    if rows.dtype == np.float16:
        return _half_values()[rows.view(np.uint16)]
    return rows.astype(np.float32, copy=False)


def page_runs(
    rows: np.ndarray, row_bytes: int, page_bytes: int = PAGE_BYTES
) -> tuple[np.ndarray, np.ndarray]:
    """Byte offset and length of each run of whole pages that the rows ``rows`` lie on.

    Args:
        rows: distinct row numbers of the store, ascending.
        row_bytes: bytes per row.
        page_bytes: bytes per page.

    Returns:
        ``(offsets, lengths)``, int64, in file order: a row that spans a page boundary
        takes both pages, and rows on the same or on adjacent pages share one run.
    """
    if rows.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    starts = rows.astype(np.int64, copy=False) * row_bytes
    first = starts // page_bytes
    last = (starts + (row_bytes - 1)) // page_bytes
    opens = np.empty(rows.size, dtype=bool)
    opens[0] = True
    np.greater(first[1:], last[:-1] + 1, out=opens[1:])
    begins = np.flatnonzero(opens)
    ends = np.append(begins[1:], rows.size) - 1
    # Rows ascend, so each run's last page is its last row's.
    return first[begins] * page_bytes, (last[ends] - first[begins] + 1) * page_bytes


@dataclass
class PendingRows:
    """The cold rows of one request, being read (:meth:`ColdReads.start`); :meth:`result` waits.

    Attributes:
        distinct: distinct store rows the request reads, ascending.
        row_bytes: bytes per store row.
        reads: system calls issued: read-ahead hints and ``pread`` calls, read-ahead hints and
            ``io_uring_enter`` calls (one per :attr:`uring.Ring.entries` reads), or 0 for
            ``fault``, whose page faults do the reading.
    """

    distinct: np.ndarray
    row_bytes: int
    reads: int
    _finish: Callable[[], np.ndarray]

    @property
    def rows(self) -> int:
        """Distinct store rows the request reads."""
        return int(self.distinct.size)

    @property
    def pages(self) -> int:
        """Pages those rows lie on (what a cold store reads from disk); counted when asked,
        as only the benchmarks ask."""
        return int(page_runs(self.distinct, self.row_bytes)[1].sum()) // PAGE_BYTES

    def result(self) -> np.ndarray:
        """The ``N x W`` float32 rows, in the order of the keys the read started with."""
        return self._finish()


class ColdReads:
    """Reads the store rows of a request's cold lookups, the only bytes that come from disk.

    Four ways, named by the stage's config parameter ``cold_reads``; measured by
    ``python -m lab cold-reads`` (docs: "Tables larger than memory"):

    - ``io_uring`` (the default): the request's distinct rows, in file order, become spans
      of adjacent rows, one read each, and all the reads go to the kernel in one
      ``io_uring_enter`` (:class:`uring.Ring`), which returns when all are done: the cached
      ones copied at once, the others read by the disk in parallel. One system call per
      request, where ``prefetch`` makes two per row. A request with at most ``hint_rows``
      distinct rows first gives the kernel a read-ahead hint per run of pages, as ``prefetch``
      does: the ring's reads of uncached pages then find their disk reads already queued
      together, and a small request's rows come back sooner; for more rows the hints' system
      calls cost more CPU than they save. Where the kernel offers no
      ``io_uring`` (before Linux 5.6, ``kernel.io_uring_disabled``, or a container's
      seccomp profile, Docker's default among them), it reads the ``prefetch`` way and
      :attr:`fallback` says why.
    - ``prefetch``: the request's distinct rows, in file order, become runs
      of pages, and one read-ahead hint per run (``posix_fadvise(WILLNEED)``) starts all
      their reads at once, so the disk serves them in parallel; the rows are then copied
      with ``pread`` in file order (adjacent rows in one call), each waiting only as long
      as its page's read still runs. ``pread`` copies from the page cache without mapping
      the page into the process: a gather from the mapping would take a page fault for
      every page it touches first, cached or not, and a stage sees ever new pages.
    - ``threads``: the distinct rows, in file order, are read with ``pread`` by
      ``threads`` threads, each a contiguous share (adjacent rows in one call).
    - ``fault``: one gather from the mapping in request order. Every cold row on a page
      not in memory is a synchronous page fault, one after another: the disk serves one
      read at a time (kept to compare with).

    All give the same bytes: the rows of the keys, in the keys' order, as float32
    (a float16 store is cast). A row read twice in one request is read from disk once.

    Args:
        rows: the store's rows as they lie in ``rows.bin`` (``rows x W`` float32 or float16,
            or an int8 store's bytes); a mapping of the file or any array.
        how: one of :data:`COLD_READS`.
        threads: threads of the ``threads`` way.
        rows_path: ``rows.bin``, which ``io_uring``, ``prefetch`` and ``threads`` read
            (``io_uring`` and ``prefetch`` without it gather from ``rows``: rows in memory
            need no reads).
        decode: gathered rows -> ``N x W`` float32 (default: a cast; :meth:`StoreRows.decode`
            for an int8 store).
        width: values per row ``W`` (default: ``rows.shape[1]``).
        hint_rows: the ``io_uring`` way hints the pages of requests with at most this many
            distinct rows (0: never).

    Raises:
        StageError: an unknown way, fewer than one thread, a negative ``hint_rows``, or
            ``threads`` without the file.
    """

    def __init__(
        self,
        rows: np.ndarray,
        how: str = DEFAULT_COLD_READS,
        threads: int = DEFAULT_COLD_READ_THREADS,
        rows_path: Path | None = None,
        decode: Callable[[np.ndarray], np.ndarray] | None = None,
        width: int | None = None,
        hint_rows: int = DEFAULT_COLD_READ_HINT_ROWS,
    ) -> None:
        if how not in COLD_READS:
            raise StageError(f"cold reads must be one of {', '.join(COLD_READS)}; got {how!r}")
        if threads < 1:
            raise StageError(f"cold read threads must be >= 1, got {threads}")
        if hint_rows < 0:
            raise StageError(f"cold read hint rows must be >= 0, got {hint_rows}")
        if how == COLD_READ_THREADS and rows_path is None:
            raise StageError("cold reads 'threads' read the store's file: give its path")
        self.how = how
        self.threads = threads
        self.hint_rows = hint_rows
        self._rows = rows
        self._row_bytes = int(rows.shape[1]) * rows.dtype.itemsize if rows.ndim == 2 else 0
        self._decode = decode if decode is not None else _as_float32
        #: Values per row that :meth:`read` returns.
        self.width = int(width if width is not None else (rows.shape[1] if rows.ndim == 2 else 0))
        self._fd = -1
        self._pool: ThreadPoolExecutor | None = None
        self._ring: Ring | None = None
        #: Why ``io_uring`` reads the ``prefetch`` way here ("" : it does not).
        self.fallback = ""
        if how == COLD_READ_URING and rows_path is not None:
            try:
                self._ring = Ring()
            except RingUnavailable as exc:
                self.fallback = f"{exc.strerror}; cold rows are read the '{COLD_READ_PREFETCH}' way"
        if how != COLD_READ_FAULT and rows_path is not None:
            try:
                self._fd = os.open(rows_path, os.O_RDONLY)
            except OSError as exc:
                raise StageError(f"cannot open {rows_path}: {exc.strerror}") from None
            # A read that finds its page uncached (its hint not yet acted on) reads that
            # page, not the kernel's read-ahead window around it.
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        if how == COLD_READ_THREADS:
            self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cold-reads")

    @classmethod
    def of_store(
        cls,
        store: StoreRows,
        how: str = DEFAULT_COLD_READS,
        threads: int = DEFAULT_COLD_READ_THREADS,
        hint_rows: int = DEFAULT_COLD_READ_HINT_ROWS,
    ) -> ColdReads:
        """The reads of an opened store (:func:`open_store`)."""
        path = store.path / STORE_ROWS_FILE
        return cls(store.data, how, threads, path, store.decode, store.width, hint_rows)

    def start(self, keys: np.ndarray) -> PendingRows:
        """Start reading the rows ``keys`` (int64 store rows, any order, repeats allowed)."""
        if keys.size == 0:
            return PendingRows(keys, self._row_bytes, 0, lambda: self._gather(keys))
        distinct, inverse = np.unique(keys, return_inverse=True)
        if self.how == COLD_READ_FAULT or self._fd < 0:
            # Rows in memory (no file to read): one gather.
            return PendingRows(distinct, self._row_bytes, 0, lambda: self._gather(keys))
        if self.how == COLD_READ_THREADS:
            return self._read_threads(distinct, inverse.reshape(-1))
        if self._ring is not None:
            return self._read_ring(distinct, inverse.reshape(-1))
        hints = self._hint(distinct)
        out, spans = self._spans(distinct)

        def finish() -> np.ndarray:
            self._read_spans(out, spans)
            return np.ascontiguousarray(self._decode(out[inverse.reshape(-1)]))

        return PendingRows(distinct, self._row_bytes, hints + len(spans), finish)

    def _hint(self, distinct: np.ndarray) -> int:
        """A read-ahead hint (``posix_fadvise(WILLNEED)``) for each run of pages of the rows
        ``distinct`` (ascending), in file order; how many."""
        fd, willneed = self._fd, os.POSIX_FADV_WILLNEED
        offsets, lengths = page_runs(distinct, self._row_bytes)
        for offset, length in zip(offsets.tolist(), lengths.tolist(), strict=True):
            os.posix_fadvise(fd, offset, length, willneed)
        return int(offsets.size)

    def read(self, keys: np.ndarray) -> np.ndarray:
        """The rows ``keys`` as ``N x W`` float32, read the chosen way."""
        return self.start(keys).result()

    def _gather(self, keys: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(self._decode(self._rows.take(keys, axis=0)))

    def _spans(self, distinct: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        """A buffer for the distinct rows (ascending), and its spans of adjacent rows.

        Each span ``(index, offset, count)`` is ``count`` rows that lie one after another
        at byte ``offset`` of the file and go to the buffer's rows from ``index``: one read.
        """
        out = np.empty((distinct.size, self._rows.shape[1]), dtype=self._rows.dtype)
        offsets, lengths = page_runs(distinct, self._row_bytes, self._row_bytes)
        counts = lengths // self._row_bytes
        begins = np.concatenate(([0], np.cumsum(counts)[:-1]))
        return out, list(zip(begins.tolist(), offsets.tolist(), counts.tolist(), strict=True))

    def _read_spans(self, out: np.ndarray, spans: Sequence[tuple[int, int, int]]) -> None:
        """``pread`` each span into its rows of ``out``, one call each, in the order given."""
        row_bytes, fd = self._row_bytes, self._fd
        view = out.reshape(-1).view(np.uint8).data
        for index, offset, count in spans:
            want = count * row_bytes
            got = os.preadv(fd, [view[index * row_bytes : index * row_bytes + want]], offset)
            if got != want:
                raise OSError(f"short read of the row store: {got} of {want} bytes at offset {offset}")

    def _read_ring(self, distinct: np.ndarray, inverse: np.ndarray) -> PendingRows:
        """The distinct rows (ascending), one read each, all in one ``io_uring_enter``.

        Adjacent rows are not merged: a read in the ring costs the kernel alike whatever its
        length, and cold rows of a large store are seldom adjacent.
        """
        assert self._ring is not None
        ring, fd, row_bytes = self._ring, self._fd, self._row_bytes
        hints = self._hint(distinct) if distinct.size <= self.hint_rows else 0
        out = np.empty((distinct.size, self._rows.shape[1]), dtype=self._rows.dtype)
        offsets = distinct * row_bytes
        addresses = np.arange(out.ctypes.data, out.ctypes.data + distinct.size * row_bytes, row_bytes)

        def finish() -> np.ndarray:
            ring.read(fd, offsets, addresses, row_bytes)
            return np.ascontiguousarray(self._decode(out[inverse]))

        return PendingRows(distinct, row_bytes, hints - (-offsets.size // ring.entries), finish)

    def _read_threads(self, distinct: np.ndarray, inverse: np.ndarray) -> PendingRows:
        """``pread`` the distinct rows (ascending) in ``threads`` contiguous shares."""
        assert self._pool is not None
        out, spans = self._spans(distinct)
        bounds = np.linspace(0, len(spans), min(self.threads, len(spans)) + 1).astype(int).tolist()
        futures = [
            self._pool.submit(self._read_spans, out, spans[lo:hi]) for lo, hi in itertools.pairwise(bounds)
        ]

        def finish() -> np.ndarray:
            for future in futures:
                future.result()
            return np.ascontiguousarray(self._decode(out[inverse]))

        return PendingRows(distinct, self._row_bytes, len(spans), finish)

    def close(self) -> None:
        """Stop the threads, close the ring and the file."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class Placement:
    """Where one request's lookups are served from (see the module docstring for shapes)."""

    hot_slots: np.ndarray
    cold_positions: np.ndarray
    cold_rows: np.ndarray
    #: The cold rows' reads (distinct rows, read calls made; None: nothing was read).
    pending: PendingRows | None = None

    @property
    def cold_distinct_rows(self) -> int:
        """Distinct store rows the cold lookups read."""
        return self.pending.rows if self.pending is not None else 0

    @property
    def cold_pages(self) -> int:
        """Pages those rows lie on."""
        return self.pending.pages if self.pending is not None else 0

    @property
    def cold_reads(self) -> int:
        """Read calls made (see :attr:`PendingRows.reads`)."""
        return self.pending.reads if self.pending is not None else 0

    @property
    def cold_lookups(self) -> int:
        """Lookups served from the row store (``N``)."""
        return int(self.cold_positions.size)

    @property
    def hot_lookups(self) -> int:
        """Lookups served by hot rows inside the dense model."""
        return int(self.hot_slots.size) - self.cold_lookups


#: Largest slot map (4 bytes per row of all tables) a stage builds in memory; above it, searchsorted.
SLOT_MAP_MAX_BYTES = 1 << 30


class HotColdLookup:
    """Splits ``B x T`` raw ids into hot slots and cold rows.

    Every table's hot ids are keyed by their global row (table offset + id). When a
    slot map of all rows fits in :data:`SLOT_MAP_MAX_BYTES` (4 bytes a row: 751 MB
    for Criteo Terabyte's 188M rows), a request is placed with one index into it;
    else with one ``searchsorted`` over the sorted keys of all tables (a binary search
    per lookup instead of one index: far slower with the millions of hot rows of the
    Terabyte-size benchmark). A key found is hot, its slot is 1 + the id's
    index in its table's hot rows; anything else is cold and its row is gathered
    from the store.

    Args:
        table_sizes: rows of each of the ``T`` tables.
        hot_ids: ``T`` int64 arrays, each table's hot ids in ``[0, size)``, in the
            order of the dense model's hot rows (slot ``s`` is ``hot_ids[t][s - 1]``).
        rows: the store's rows, tables stacked: ``sum(table_sizes) x W`` float32 or float16
            (or an int8 store's bytes, with ``reads`` that decode them).
        reads: how the cold rows are read (default: a plain gather from ``rows``, cast to float32).
        hotness: ids per bag of each table (None: one id each). The ids are then ``B x H``
            (``H = sum(hotness)``), table 0's bag first, and each position is placed in its
            bag's table; positions and slots are per position, as for one id per table.

    Raises:
        StageError: sizes, hot ids, rows or hotness that do not fit together.
    """

    def __init__(
        self,
        table_sizes: Sequence[int],
        hot_ids: Sequence[np.ndarray],
        rows: np.ndarray,
        reads: ColdReads | None = None,
        hotness: Sequence[int] | None = None,
    ) -> None:
        sizes = np.asarray(table_sizes, dtype=np.int64)
        if sizes.ndim != 1 or sizes.size == 0 or (sizes < 1).any():
            raise StageError(f"table sizes must be one or more ints >= 1, got {list(table_sizes)}")
        if len(hot_ids) != sizes.size:
            raise StageError(f"hot ids for {len(hot_ids)} tables, the stage has {sizes.size}")
        if rows.ndim != 2 or rows.shape[0] != int(sizes.sum()):
            raise StageError(f"the store has {rows.shape} rows, the tables need {int(sizes.sum())} rows")
        self._sizes = sizes
        self._offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        counts = (
            np.ones(sizes.size, dtype=np.int64) if hotness is None else np.asarray(hotness, dtype=np.int64)
        )
        if counts.shape != sizes.shape or (counts < 1).any():
            raise StageError(f"hotness must be {sizes.size} counts >= 1, got {counts.tolist()}")
        #: Ids per bag of each table (all 1 for one id per table).
        self.hotness = tuple(int(count) for count in counts)
        # Each id position's table: its size and its first row in the store.
        tables = np.repeat(np.arange(sizes.size), counts)
        self._position_sizes = sizes[tables]
        self._position_offsets = self._offsets[tables]
        self._rows = rows
        self.reads = reads if reads is not None else ColdReads(rows, COLD_READ_FAULT)
        keys, slots = [], []
        for table, ids in enumerate(hot_ids):
            ids = np.asarray(ids, dtype=np.int64)
            if ids.ndim != 1:
                raise StageError(f"table {table}: hot ids must be 1-D, got shape {ids.shape}")
            if ids.size and (ids.min() < 0 or ids.max() >= sizes[table] or np.unique(ids).size != ids.size):
                raise StageError(f"table {table}: hot ids must be distinct and lie in [0, {sizes[table]})")
            order = np.argsort(ids, kind="stable")
            keys.append(self._offsets[table] + ids[order])
            slots.append(order.astype(np.int64) + 1)
        # Each table's keys are ascending and tables are stacked in order: all keys ascend.
        self._keys = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        self._slots = np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64)
        #: The store as opened by :meth:`open` (how it was checked); None when built from rows.
        self.store: StoreRows | None = None
        self._slot_map: np.ndarray | None = None
        if int(sizes.sum()) * 4 <= SLOT_MAP_MAX_BYTES and self._slots.size and self._slots.max() < 2**32:
            self._slot_map = np.zeros(int(sizes.sum()), dtype=np.uint32)
            self._slot_map[self._keys] = self._slots

    @classmethod
    def open(
        cls,
        store_dir: Path,
        hot_set: Path,
        table_sizes: Sequence[int],
        fingerprint: str = "",
        cold_reads: str = DEFAULT_COLD_READS,
        threads: int = DEFAULT_COLD_READ_THREADS,
        hotness: Sequence[int] | None = None,
        hint_rows: int = DEFAULT_COLD_READ_HINT_ROWS,
    ) -> HotColdLookup:
        """The lookup over a row store folder and a hot-set file, checked against ``table_sizes``.

        The store's content is verified (:func:`open_store`); :attr:`store` tells how.

        Args:
            store_dir: the row store's folder.
            hot_set: the hot-set ``.npz``.
            table_sizes: the rows of each table, as the config says.
            fingerprint: the store's fingerprint as the export recorded it beside the
                hot set ("" : not compared).
            cold_reads: how cold rows are read (:class:`ColdReads`).
            threads: threads of the ``threads`` way.
            hotness: ids per bag of each table (None: one id each).
            hint_rows: the ``io_uring`` way's read-ahead hints (:class:`ColdReads`).

        Raises:
            StageError: a file missing, invalid or damaged, table sizes that differ
                between the parameters, the store and the hot set, or a store whose
                fingerprint is not ``fingerprint``.
        """
        sizes = tuple(int(size) for size in table_sizes)
        store = open_store(store_dir)
        if store.table_sizes != sizes:
            raise StageError(
                f"row store {store_dir / STORE_ROWS_FILE} has table sizes {list(store.table_sizes)}, "
                f"not {list(sizes)}"
            )
        if fingerprint and store.fingerprint != fingerprint:
            found = store.fingerprint[:16] or "none (no checksums)"
            raise StageError(
                f"row store {store_dir / STORE_ROWS_FILE} does not match this stage's hot set: its "
                f"fingerprint is {found}, the stage was exported against {fingerprint[:16]} (another "
                "store under the same path?)"
            )
        hot_sizes, hot_ids = read_hot_ids(hot_set, len(sizes))
        if hot_sizes != sizes:
            raise StageError(f"hot set {hot_set} has table sizes {list(hot_sizes)}, not {list(sizes)}")
        lookup = cls(
            sizes, hot_ids, store.data, ColdReads.of_store(store, cold_reads, threads, hint_rows), hotness
        )
        lookup.store = store
        return lookup

    @property
    def num_tables(self) -> int:
        """Tables ``T`` (26 for Criteo)."""
        return int(self._sizes.size)

    @property
    def width(self) -> int:
        """Values per store row ``W`` (what ``cold_rows`` holds per lookup)."""
        return self.reads.width

    @property
    def hot_rows(self) -> int:
        """Hot rows of all tables."""
        return int(self._keys.size)

    @property
    def positions(self) -> int:
        """Ids per request row: ``T``, or ``H = sum(hotness)`` for bags."""
        return int(self._position_sizes.size)

    def check_ids(self, ids: Any, name: str) -> np.ndarray:
        """``ids`` as a ``B x T`` (``B x H`` for bags) int64 array, ``B >= 1``.

        Raises:
            RequestError: another dtype or shape, naming the input ``name``.
        """
        array = np.asarray(ids)
        if array.dtype != np.int64:
            raise RequestError(f"input '{name}' has data type {array.dtype}, expected INT64 (int64)")
        if array.ndim != 2 or array.shape[1] != self.positions:
            raise RequestError(
                f"input '{name}' has shape {list(array.shape)}, expected [-1, {self.positions}]"
            )
        if array.shape[0] < 1:
            raise RequestError(f"input '{name}' is an empty batch (shape {list(array.shape)})")
        return array

    def place(self, ids: np.ndarray) -> Placement:
        """Hot slots, cold positions and cold rows of ``B x T`` (``B x H``) int64 raw ids (any value).

        Each id is reduced into its table first (``id mod size``, non-negative, as the
        exported graphs do), so no id is out of range.
        """
        reduced = np.mod(ids, self._position_sizes)
        keys = (reduced + self._position_offsets).reshape(-1)
        if self._slot_map is not None:
            slots = self._slot_map[keys].astype(np.int64)
            hot = slots > 0
        elif self._keys.size:
            index = np.searchsorted(self._keys, keys)
            np.minimum(index, self._keys.size - 1, out=index)
            hot = self._keys[index] == keys
            slots = np.where(hot, self._slots[index], 0)
        else:
            hot = np.zeros(keys.shape, dtype=bool)
            slots = np.zeros(keys.shape, dtype=np.int64)
        cold_positions = np.flatnonzero(~hot).astype(np.int64, copy=False)
        # The cold reads start first and run while the hot slots are finished.
        pending = self.reads.start(keys[cold_positions])
        hot_slots = np.ascontiguousarray(slots.reshape(ids.shape))
        return Placement(
            hot_slots=hot_slots,
            cold_positions=cold_positions,
            cold_rows=pending.result(),
            pending=pending,
        )

    def close(self) -> None:
        """Release the cold reads' threads and file."""
        self.reads.close()
