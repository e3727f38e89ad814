"""The embedding stage's numpy core: split each lookup into hot (a slot) or cold (a row).

A hierarchical model keeps the most looked-up rows of its 26 tables inside its
dense ONNX model and the rest in a memory-mapped row store. For a request's
``B x 26`` raw ids this module computes what the dense model needs:

- ``hot_slots``      ``B x 26`` int64: 0 where lookup ``(b, t)`` is cold, ``s >= 1``
  where it is hot: row ``s - 1`` of table ``t``'s hot rows (the hot set's order);
- ``cold_positions`` ``N`` int64: ``b * 26 + t`` of each cold lookup, ascending;
- ``cold_rows``      ``N x W`` float32: the store's row of each cold lookup, in that
  order (an FP16 store is cast to FP32).

Only the cold rows leave the stage: an ensemble that passes whole ``B x 26 x D``
blocks between its steps loses most of its throughput to the copies.

This file runs inside tritonserver's python stub, beside the stage's
``model.py`` in the model's version folder, in the local server and in the NGC
image (whose Python is 3.10). It imports only numpy and the standard library;
``export.row_store`` and ``export.hot_rows`` import the bundle's other packages,
which the serving image does not have, so the two file formats are read here
on their own (``tests/unit/test_ensemble.py`` checks that both readers agree).
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The row store's files and format, as :mod:`export.row_store` writes them.
STORE_ROWS_FILE = "rows.bin"
STORE_META_FILE = "store.json"
STORE_FORMAT = "criteo-row-store"
STORE_FORMAT_VERSION = 1
_STORE_DTYPES: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}

#: The stage's config parameters (string values), as ``export.ensemble`` writes them.
#: The row store folder: absolute, or relative to the model's version folder.
PARAM_ROW_STORE = "row_store"
#: The hot-set ``.npz``: absolute, or relative to the model's version folder.
PARAM_HOT_SET = "hot_set"
#: The rows of each table, comma-separated.
PARAM_TABLE_SIZES = "table_sizes"


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


@dataclass(frozen=True)
class StoreRows:
    """A row store mapped read-only.

    Attributes:
        path: the store's folder.
        table_sizes: rows of each table.
        width: values per row.
        data: ``rows x width`` read-only array over ``rows.bin`` (float32 or float16).
    """

    path: Path
    table_sizes: tuple[int, ...]
    width: int
    data: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        """Global row of each table's first row (int64)."""
        sizes = np.asarray(self.table_sizes, dtype=np.int64)
        return np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)


def open_store(path: Path) -> StoreRows:
    """Map the row store at ``path`` after checking its description and file size.

    ``export`` opened the store with :meth:`export.row_store.RowStore.open` (which
    also checks a sample of rows) when it wrote the stage; this checks that the
    store found at serving time is still a complete store of the same format.

    Raises:
        StageError: no finished store there, another format version, or a
            ``rows.bin`` whose size differs from its description.
    """
    meta_path, rows_path = path / STORE_META_FILE, path / STORE_ROWS_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise StageError(f"no row store at {path}: {STORE_META_FILE} is missing") from None
    except (OSError, ValueError) as exc:
        raise StageError(f"cannot read {meta_path}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
        raise StageError(f"{meta_path} is not a row store description")
    if meta.get("version") != STORE_FORMAT_VERSION:
        raise StageError(
            f"{meta_path} has row store format version {meta.get('version')!r}; "
            f"this stage reads version {STORE_FORMAT_VERSION}"
        )
    try:
        spec = meta["spec"]
        table_sizes = tuple(int(size) for size in spec["table_sizes"])
        width = int(spec["width"])
        dtype = _STORE_DTYPES[str(spec["dtype"])]
    except (KeyError, TypeError, ValueError) as exc:
        raise StageError(f"{meta_path}: invalid row store spec ({type(exc).__name__}: {exc})") from None
    expected = sum(table_sizes) * width * dtype.itemsize
    try:
        fd = os.open(rows_path, os.O_RDONLY)
    except OSError as exc:
        raise StageError(f"cannot open {rows_path}: {exc.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        if size != expected or meta.get("file_bytes") != expected:
            raise StageError(
                f"{rows_path} has {size} bytes, {STORE_META_FILE} says {meta.get('file_bytes')} and its "
                f"spec needs {expected} (truncated, or from another store)"
            )
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    # A cold lookup then reads one page, not the kernel's read-ahead window.
    if hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    data = np.frombuffer(mapped, dtype=dtype).reshape(sum(table_sizes), width)
    return StoreRows(path, table_sizes, width, data)


def read_hot_ids(path: Path, num_tables: int) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]]:
    """The table sizes and each table's hot ids (hottest first) of a hot-set ``.npz``.

    Reads the file :meth:`export.hot_rows.HotSet.save` writes: ``table_sizes`` and
    ``ids_C1`` .. ``ids_C<num_tables>``.

    Raises:
        StageError: the file is missing or not a hot set of ``num_tables`` tables.
    """
    if not path.is_file():
        raise StageError(f"no hot-set file: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            sizes = tuple(int(size) for size in data["table_sizes"])
            ids = tuple(np.asarray(data[f"ids_C{t + 1}"], dtype=np.int64) for t in range(num_tables))
    except (KeyError, ValueError, OSError) as exc:
        raise StageError(f"{path}: not a hot-set file ({exc})") from None
    if len(sizes) != num_tables:
        raise StageError(f"{path}: a hot set of {len(sizes)} tables, the stage has {num_tables}")
    return sizes, ids


@dataclass(frozen=True)
class Placement:
    """Where one request's lookups are served from (see the module docstring for shapes)."""

    hot_slots: np.ndarray
    cold_positions: np.ndarray
    cold_rows: np.ndarray

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
    else with one ``searchsorted`` over the sorted keys of all tables (measured on
    the Terabyte-size benchmark's 3.8M hot rows: 7.8 ms per 1,024-row request
    against 0.65 ms for the map). A key found is hot, its slot is 1 + the id's
    index in its table's hot rows; anything else is cold and its row is gathered
    from the store.

    Args:
        table_sizes: rows of each of the ``T`` tables.
        hot_ids: ``T`` int64 arrays, each table's hot ids in ``[0, size)``, in the
            order of the dense model's hot rows (slot ``s`` is ``hot_ids[t][s - 1]``).
        rows: ``sum(table_sizes) x W`` store rows (float32 or float16), tables stacked.

    Raises:
        StageError: sizes, hot ids or rows that do not fit together.
    """

    def __init__(self, table_sizes: Sequence[int], hot_ids: Sequence[np.ndarray], rows: np.ndarray) -> None:
        sizes = np.asarray(table_sizes, dtype=np.int64)
        if sizes.ndim != 1 or sizes.size == 0 or (sizes < 1).any():
            raise StageError(f"table sizes must be one or more ints >= 1, got {list(table_sizes)}")
        if len(hot_ids) != sizes.size:
            raise StageError(f"hot ids for {len(hot_ids)} tables, the stage has {sizes.size}")
        if rows.ndim != 2 or rows.shape[0] != int(sizes.sum()):
            raise StageError(f"the store has {rows.shape} rows, the tables need {int(sizes.sum())} x W")
        self._sizes = sizes
        self._offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        self._rows = rows
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
        self._slot_map: np.ndarray | None = None
        if int(sizes.sum()) * 4 <= SLOT_MAP_MAX_BYTES and self._slots.size and self._slots.max() < 2**32:
            self._slot_map = np.zeros(int(sizes.sum()), dtype=np.uint32)
            self._slot_map[self._keys] = self._slots

    @classmethod
    def open(cls, store_dir: Path, hot_set: Path, table_sizes: Sequence[int]) -> HotColdLookup:
        """The lookup over a row store folder and a hot-set file, checked against ``table_sizes``.

        Raises:
            StageError: a file missing or invalid, or table sizes that differ between
                the parameters, the store and the hot set.
        """
        sizes = tuple(int(size) for size in table_sizes)
        store = open_store(store_dir)
        if store.table_sizes != sizes:
            raise StageError(
                f"row store {store_dir} has table sizes {list(store.table_sizes)}, not {list(sizes)}"
            )
        hot_sizes, hot_ids = read_hot_ids(hot_set, len(sizes))
        if hot_sizes != sizes:
            raise StageError(f"hot set {hot_set} has table sizes {list(hot_sizes)}, not {list(sizes)}")
        return cls(sizes, hot_ids, store.data)

    @property
    def num_tables(self) -> int:
        """Tables ``T`` (26 for Criteo)."""
        return int(self._sizes.size)

    @property
    def width(self) -> int:
        """Values per store row ``W``."""
        return int(self._rows.shape[1])

    @property
    def hot_rows(self) -> int:
        """Hot rows of all tables."""
        return int(self._keys.size)

    def check_ids(self, ids: Any, name: str) -> np.ndarray:
        """``ids`` as a ``B x T`` int64 array, ``B >= 1``.

        Raises:
            RequestError: another dtype or shape, naming the input ``name``.
        """
        array = np.asarray(ids)
        if array.dtype != np.int64:
            raise RequestError(f"input '{name}' has data type {array.dtype}, expected INT64 (int64)")
        if array.ndim != 2 or array.shape[1] != self.num_tables:
            raise RequestError(
                f"input '{name}' has shape {list(array.shape)}, expected [-1, {self.num_tables}]"
            )
        if array.shape[0] < 1:
            raise RequestError(f"input '{name}' is an empty batch (shape {list(array.shape)})")
        return array

    def place(self, ids: np.ndarray) -> Placement:
        """Hot slots, cold positions and cold rows of ``B x T`` int64 raw ids (any value).

        Each id is reduced into its table first (``id mod size``, non-negative, as the
        exported graphs do), so no id is out of range.
        """
        reduced = np.mod(ids, self._sizes)
        keys = (reduced + self._offsets).reshape(-1)
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
        cold_rows = self._rows.take(keys[cold_positions], axis=0).astype(np.float32, copy=False)
        return Placement(
            hot_slots=slots.reshape(ids.shape),
            cold_positions=cold_positions,
            cold_rows=np.ascontiguousarray(cold_rows),
        )
