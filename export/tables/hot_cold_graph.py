"""Hot/cold embedding tables behind one served model, at the ONNX level.

A model whose tables outgrow memory is served as two stages: an embedding stage
reduces each id into its table, maps it to a hot slot, and reads only the cold
rows from a memory-mapped row store (:mod:`export.tables.row_store`); the dense model is
the exported graph with its embedding lookups replaced, holding only the hot rows.
Between them (:mod:`bundle.schema` names, ``B`` rows, ``N`` cold lookups):

- ``hot_slots`` ``B x 26`` int64: 0 where lookup ``(b, t)`` is cold, ``s >= 1``
  where it is hot: row ``s - 1`` of table ``t``'s hot rows (``HotSet.ids[t]`` order).
- ``cold_positions`` ``N`` int64: ``b * 26 + t`` of each cold lookup, ascending.
- ``cold_rows`` ``N x W`` float32: the store's whole row of each cold lookup.

A multi-hot graph (its ``categorical_ids`` ``B x H``, the bags' sizes recorded in its
metadata: :func:`export.graphs.ids.graph_hotness`) is split the same way with ``H`` for
26: ``hot_slots`` is ``B x H`` and a cold position ``b * H + j``; each column's hot rows
are in the hot table once, whatever the size of its bag, and the dense model sums the
bags after the lookup as the graph did.

Everything works on the ONNX graph (lookups found by :func:`export.tables.lookups.find_lookups`),
so every exporter's model qualifies. :func:`write_store` writes every row from the
graph's own tables, :func:`split_lookups` writes the dense model, and
:func:`stage_reference` runs the served embedding stage's own code in-process, so
the export's checks feed the dense model exactly what Triton's stage will.

In the dense model each lookup becomes a ``Gather`` on a small hot table (row 0
zeros, then the hot rows of the columns it serves, copied from the original
table) indexed by the slots, then a ``ScatterND`` that writes the cold rows over
the cold positions. Hot values are the table's own and cold values the store's,
so in FP32 the dense model computes what the all-in-graph model computes.

A model too large to exist as one graph (the Criteo Terabyte preset: 96 GB of FP32
tables) takes another way in: a graph with placeholder tables (a few rows each,
its own ``Mod`` reducing into them) and a row store written without the graph
(:func:`export.tables.row_store.random_store`). ``split_lookups(..., rows=store)`` then
takes the hot rows from the store, for the store's real ``table_sizes``; the
placeholder tables and their reduction are dropped with the old lookups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper
from onnx.external_data_helper import load_external_data_for_tensor

from bundle.errors import ConfigError, DataError, ExportError
from bundle.schema import CATEGORICAL_INPUT, COLD_POSITIONS, COLD_ROWS, HOT_SLOTS, NUM_CATEGORICAL
from criteo.tables import check_table_sizes
from export.graphs.builder import GraphBuilder, default_opset
from export.graphs.ids import input_columns
from export.graphs.onnx_io import EXTERNAL_DATA_THRESHOLD, inputs_of, prune, weights_bytes
from export.tables.hot_rows import HotSet
from export.tables.lookups import Lookup, check_sizes, find_lookups, load_graph, store_spec, table_values
from export.tables.row_store import CHUNK_BYTES, RowStore, RowStoreSpec, RowStoreWriter

__all__ = [
    "COLD_DIM",
    "MIN_OPSET",
    "PREFIX",
    "Lookup",
    "find_lookups",
    "lookup_graph",
    "split_lookups",
    "stage_reference",
    "write_store",
]

log = logging.getLogger(__name__)

#: The first opset with ``ScatterND``, which writes the cold rows.
MIN_OPSET = 11
#: Prefix of the names of every node and initializer the split adds. Dense models of earlier
#: versions used another prefix; no reader depends on it: a rollout's
#: :func:`export.tables.hot_cold_variants.keep_quantization` takes only names the new model has.
PREFIX = "hot_cold"
#: Name of the dimension of ``cold_positions`` and ``cold_rows``.
COLD_DIM = "cold_lookups"


def write_store(
    model: onnx.ModelProto | Path | str,
    path: Path,
    dtype: str,
    table_sizes: Sequence[int],
    *,
    base_dir: Path | None = None,
    metadata: Mapping[str, Any] | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> RowStore:
    """Write the row store of every row of the graph's tables: what the all-in-graph model looks up.

    Row (table ``t``, in-table id ``i``) holds, per store column, row
    ``row_offsets + i`` of the table that serves column ``t`` (DLRM: its embedding;
    Wide & Deep: deep row, then wide weight). Tables are read in chunks of about
    :data:`export.tables.row_store.CHUNK_BYTES` (external data memory-mapped), so memory
    holds one chunk whatever the model's size.

    Args:
        model: the graph, or the path of an ``.onnx`` file (external data beside it).
        path: the store's folder.
        dtype: ``"float32"``, ``"float16"`` or ``"int8"``.
        table_sizes: rows of C1..C26 (the graph's own reduction, where it has one).
        base_dir: the folder of the graph's external data (default: the file's folder).
        metadata: kept in ``store.json``.
        on_rows: called with the rows written after each chunk.

    Returns:
        The store, opened.

    Raises:
        ExportError: see :func:`find_lookups` and :func:`check_sizes`.
    """
    source, folder = load_graph(model, base_dir)
    lookups = find_lookups(source)
    sizes = check_sizes(lookups, table_sizes)
    spec = store_spec(lookups, sizes, dtype)
    tensors = {t.name: t for t in source.graph.initializer}
    values = {lookup.table: table_values(tensors[lookup.table], folder) for lookup in lookups}
    sources: dict[str, dict[int, tuple[Lookup, int]]] = {}
    for lookup in lookups:
        for j, column in enumerate(lookup.columns):
            sources.setdefault(lookup.store_column, {}).setdefault(column, (lookup, j))

    def read_rows(table: int, start: int, stop: int) -> np.ndarray:
        chunk = np.empty((stop - start, spec.width), dtype=spec.value_dtype)
        for name, (first, last) in spec.columns.items():
            lookup, j = sources[name][table]
            row = lookup.row_offsets[j]
            part = np.asarray(values[lookup.table][row + start : row + stop])
            chunk[:, first:last] = part.reshape(stop - start, last - first)
        return chunk

    described = {"source": "onnx", "tables": sorted(values), **dict(metadata or {})}
    store = write_table_store(read_rows, spec, Path(path), metadata=described, on_rows=on_rows)
    log.info("row store %s: %d rows of %s from %d lookups", path, spec.rows, dict(spec.columns), len(lookups))
    return store


def write_table_store(
    read_rows: Callable[[int, int, int], np.ndarray],
    spec: RowStoreSpec,
    path: Path,
    *,
    metadata: Mapping[str, Any] | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> RowStore:
    """Write the row store ``read_rows`` gives, a chunk at a time (:data:`CHUNK_BYTES`).

    Memory holds one chunk at a time whatever the tables' size: ``read_rows(table,
    start, stop)`` may read the graph's tables (:func:`write_store`) or a memory-mapped
    checkpoint, whose pages stay page cache (``--stream-tables``).

    Args:
        read_rows: rows ``start:stop`` of the table behind C<table + 1>, ``n x width`` (the
            store's columns side by side).
        spec: the store (its table sizes, width and dtype).
        path: the store's folder.
        metadata: kept in ``store.json``.
        on_rows: called with the rows written after each chunk.

    Raises:
        ExportError: rows of another shape.
    """
    step = max(1, CHUNK_BYTES // spec.row_bytes)
    with RowStoreWriter(Path(path), spec, metadata=dict(metadata or {})) as writer:
        for table, size in enumerate(spec.table_sizes):
            for start in range(0, size, step):
                stop = min(size, start + step)
                rows = np.asarray(read_rows(table, start, stop))
                if rows.shape != (stop - start, spec.width):
                    raise ExportError(
                        f"table C{table + 1} rows {start}..{stop - 1}: got shape {rows.shape}, "
                        f"expected {(stop - start, spec.width)}"
                    )
                writer.write(table, start, rows)
                if on_rows is not None:
                    on_rows(stop - start)
    return RowStore.open(Path(path))


def stage_reference(
    ids: npt.ArrayLike,
    hot: HotSet,
    table_sizes: Sequence[int],
    store: RowStore,
    hotness: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The embedding stage in-process: raw ids -> ``hot_slots``, ``cold_positions``, ``cold_rows``.

    Runs the stage's definition in Python (``export/stage/hot_cold_lookup.py``,
    to which the differential tests hold the compiled ``<family>_embedding``), so the
    export's checks verify the split that will serve: each id reduced into its table (``np.mod``, the
    divisor's sign as ONNX ``Mod(fmod=0)``), looked up among its table's hot ids,
    and each cold lookup's row read from the store.

    Args:
        ids: ``B x 26`` int64 raw ids, any value (``B x H`` bags with ``hotness``).
        hot: the hot rows.
        table_sizes: rows of C1..C26 (those of ``hot`` and ``store``).
        store: the row store.
        hotness: a multi-hot model's ids per bag of C1..C26 (None: one id each).

    Returns:
        ``hot_slots`` ``B x 26`` (``B x H``) int64, ``cold_positions`` ``N`` int64 ascending,
        ``cold_rows`` ``N x W`` float32.

    Raises:
        ConfigError: ``hot`` or ``store`` made for other table sizes.
        DataError: ``ids`` not ``B x 26`` (``B x H``).
    """
    from export.stage.hot_cold_lookup import HotColdLookup

    sizes = check_table_sizes(table_sizes)
    if hot.table_sizes != sizes or store.spec.table_sizes != sizes:
        raise ConfigError("the hot set, the row store and table_sizes must describe the same 26 tables")
    values = np.asarray(ids)
    positions = NUM_CATEGORICAL if hotness is None else sum(hotness)
    if values.ndim != 2 or values.shape[1] != positions or not np.issubdtype(values.dtype, np.integer):
        raise DataError(f"ids must be B x {positions} integers, got {values.dtype} {values.shape}")
    lookup = HotColdLookup(sizes, hot.ids, store.data, store.cold_reads(), hotness)
    split = lookup.place(values.astype(np.int64, copy=False))
    return split.hot_slots, split.cold_positions, split.cold_rows


class _Builder(GraphBuilder):
    """The nodes and initializers the split adds, named uniquely under :data:`PREFIX`."""

    def __init__(
        self, graph: onnx.GraphProto, taken: set[str], opset: int, width: int, columns: tuple[int, ...]
    ) -> None:
        super().__init__(graph, taken, PREFIX)
        self.width = width
        #: The input column at each position of ``categorical_ids`` (and of ``hot_slots``).
        self.columns = columns
        # ScatterND's reduction attribute exists from opset 16; "none" is also the earlier behaviour.
        self.scatter: dict[str, Any] = {"reduction": "none"} if opset >= 16 else {}

    def cold_batch(self) -> str:
        """``cold_positions // 26`` (``// H``): the row of each cold lookup."""
        divisor = self.scalar(len(self.columns))
        return self.once(("batch",), lambda: self.op("Div", [COLD_POSITIONS, divisor], "cold/batch"))

    def cold_column(self) -> str:
        """``cold_positions % 26`` (``% H``): the input position of each cold lookup (its column,
        one id per table)."""
        divisor = self.scalar(len(self.columns))
        return self.once(("column",), lambda: self.op("Mod", [COLD_POSITIONS, divisor], "cold/column"))


def _cold_values(b: _Builder, lookup: Lookup) -> str:
    """``N x width`` cold values of this lookup's store column, in its table's type."""
    start, stop = lookup.store_range

    def make() -> str:
        values = COLD_ROWS
        if (start, stop) != (0, b.width):
            bounds = [b.ints(start), b.ints(stop), b.ints(1)]
            values = b.op("Slice", [COLD_ROWS, *bounds], f"cold/{lookup.store_column}")
        if lookup.data_type != TensorProto.FLOAT:
            values = b.op("Cast", [values], f"cold/{lookup.store_column}", to=lookup.data_type)
        return values

    return b.once(("cold", lookup.store_range, lookup.data_type), make)


def _store_hot_rows(store: RowStore, lookup: Lookup, column: int, ids: np.ndarray, out: np.ndarray) -> None:
    """Rows ``ids`` of table ``column`` from the store's column of ``lookup`` into ``out`` (N x row dims)."""
    # Read in file order (neighbouring rows share pages of a store larger than memory), then put back.
    order = np.argsort(ids, kind="stable")
    found = store.rows(np.int64(column), ids[order], column=lookup.store_column)
    out[order] = found.reshape(ids.size, *lookup.row_dims)


def _hot_table(
    b: _Builder, lookup: Lookup, values: np.ndarray | None, hot: HotSet, store: RowStore | None = None
) -> tuple[str, list[int]]:
    """The hot table (row 0 zeros, then each column's hot rows) and each position's first hot row - 1.

    A column read at several positions (a multi-hot graph's bag) has its hot rows once. The hot
    rows come from the graph's table ``values``, or from ``store`` when given.
    """
    dtype = values.dtype if values is not None else helper.tensor_dtype_to_np_dtype(lookup.data_type)
    first: dict[int, int] = {}  # each column's first position
    for j, column in enumerate(lookup.columns):
        first.setdefault(column, j)
    counts = {column: int(hot.ids[column].size) for column in first}
    # Filled in place: a hot table of gigabytes is held once, not as parts and their concatenation.
    table = np.zeros((1 + sum(counts.values()), *lookup.row_dims), dtype=dtype)
    base, rows = {}, 0
    for column, j in first.items():
        base[column] = rows
        target = table[1 + rows : 1 + rows + counts[column]]
        if store is not None:
            _store_hot_rows(store, lookup, column, hot.ids[column], target)
        elif values is not None:
            target[...] = values[lookup.row_offsets[j] + hot.ids[column]]
        else:
            raise ExportError(f"{lookup.table}: neither its values nor a row store to take hot rows from")
        rows += counts[column]
    return b.constant(f"{lookup.table}/hot", table, share=False), [base[c] for c in lookup.columns]


def _replace_fused(
    b: _Builder, lookup: Lookup, values: np.ndarray | None, hot: HotSet, store: RowStore | None = None
) -> None:
    """A stacked table read with ``B x 26`` (``B x H``) ids: one Gather of the hot rows, one ScatterND
    of the cold."""
    table, bases = _hot_table(b, lookup, values, hot, store)
    dims = lookup.row_dims
    positions_count = len(b.columns)
    # The input position each of the lookup's positions reads: a column's own (one id per table),
    # or the k-th id of its column's bag at the k-th position that reads that column.
    bag_start = {column: b.columns.index(column) for column in set(b.columns)}
    seen: dict[int, int] = {}
    reads = []
    for column in lookup.columns:
        reads.append(bag_start[column] + seen.get(column, 0))
        seen[column] = seen.get(column, 0) + 1
    identity = reads == list(range(positions_count))

    def make_index() -> str:
        slots = HOT_SLOTS
        if not identity:  # the graph reads the columns permuted: read the slots the same way
            order = b.constant("order", np.asarray(reads, dtype=np.int64))
            slots = b.op("Gather", [HOT_SLOTS, order], "slots", axis=1)
        shifted = b.op("Add", [slots, b.constant("bases", np.asarray([bases], dtype=np.int64))], "index")
        is_hot = b.op("Greater", [slots, b.scalar(0)], "index")
        return b.op("Where", [is_hot, shifted, b.scalar(0)], "index")

    # Wide & Deep reads its deep and wide tables with the same rows: one index for both.
    index = b.once(("index", lookup.columns, tuple(bases)), make_index)
    gathered = b.op("Gather", [table, index], f"{lookup.table}/hot_rows")
    flat = b.op("Reshape", [gathered, b.ints(-1, *dims)], f"{lookup.table}/flat")
    positions = COLD_POSITIONS
    if not identity:  # input position p sits at position inverse[p] of this lookup's rows
        inverse = np.argsort(np.asarray(reads)).astype(np.int64)
        moved = b.op("Gather", [b.constant("inverse", inverse), b.cold_column()], "cold/permuted")
        start = b.op("Mul", [b.cold_batch(), b.scalar(positions_count)], "cold/permuted")
        positions = b.op("Add", [start, moved], "cold/permuted")
    index_nd = b.once(("nd", positions), lambda: b.op("Reshape", [positions, b.ints(-1, 1)], "cold/index"))
    updates = b.op("Reshape", [_cold_values(b, lookup), b.ints(-1, *dims)], f"{lookup.table}/cold_rows")
    scattered = b.op("ScatterND", [flat, index_nd, updates], f"{lookup.table}/rows", **b.scatter)
    b.op("Reshape", [scattered, b.ints(-1, positions_count, *dims)], lookup.table, output=lookup.output)


def _replace_column(
    b: _Builder,
    lookup: Lookup,
    values: np.ndarray | None,
    hot: HotSet,
    extra: tuple[int, ...],
    store: RowStore | None = None,
) -> None:
    """A per-column lookup of column ``k``: the slots' column ``k``, then the cold lookups of ``k``."""
    (column,) = lookup.columns
    table, _ = _hot_table(b, lookup, values, hot, store)
    dims = lookup.row_dims
    slot = b.op("Gather", [HOT_SLOTS, b.scalar(column)], f"slots/{column}", axis=1)
    gathered = b.op("Gather", [table, slot], f"{lookup.table}/hot_rows")

    # The cold lookups of this column (shared by its deep and wide lookups): where, and their rows.
    mask = b.once(
        ("mask", column), lambda: b.op("Equal", [b.cold_column(), b.scalar(column)], f"cold/{column}")
    )

    def rows_of_column() -> str:
        picked = b.op("Compress", [b.cold_batch(), mask], f"cold/{column}", axis=0)
        return b.op("Reshape", [picked, b.ints(-1, 1)], f"cold/{column}")

    index_nd = b.once(("rows", column), rows_of_column)
    cold = b.op("Compress", [_cold_values(b, lookup), mask], f"cold/{column}", axis=0)
    updates = b.op("Reshape", [cold, b.ints(-1, *dims)], f"{lookup.table}/cold_rows")
    if not extra:
        b.op("ScatterND", [gathered, index_nd, updates], lookup.table, output=lookup.output, **b.scatter)
        return
    scattered = b.op("ScatterND", [gathered, index_nd, updates], f"{lookup.table}/rows", **b.scatter)
    b.op("Reshape", [scattered, b.ints(-1, *extra, *dims)], lookup.table, output=lookup.output)


def _extra_dims(lookup: Lookup, positions: int = NUM_CATEGORICAL) -> tuple[int, ...]:
    """Dims of the lookup's ids after the batch (``()`` for ``B``, ``(1,)`` for ``B x 1``).

    Raises:
        ExportError: ids not shaped ``B x positions`` (stacked: 26, or ``H`` bags' ids) or ``B`` plus
            dims of one value (per column).
    """
    shape = lookup.id_shape
    expected = f"B x {positions}" if lookup.fused else "B, B x 1, ..."
    if shape is None or not shape or any(d is None for d in shape[1:]):
        raise ExportError(
            f"lookup {lookup.name}: the shape of its ids is not known statically (expected {expected})"
        )
    extra = tuple(int(d) for d in shape[1:] if d is not None)  # all known, checked above
    if (lookup.fused and extra != (positions,)) or (not lookup.fused and int(np.prod(extra)) != 1):
        raise ExportError(f"lookup {lookup.name} reads ids of shape {list(shape)}; expected {expected}")
    return extra


def _new_inputs(
    model: onnx.ModelProto, width: int, positions: int = NUM_CATEGORICAL
) -> list[onnx.ValueInfoProto]:
    """The dense model's inputs: the original ones with ``categorical_ids`` replaced by the stage's three."""
    inputs = list(model.graph.input)
    position = next((i for i, value in enumerate(inputs) if value.name == CATEGORICAL_INPUT), None)
    if position is None:
        raise ExportError(f"the graph has no input {CATEGORICAL_INPUT!r}")
    batch = inputs[position].type.tensor_type.shape.dim
    first: str | int = "batch"
    if batch and batch[0].HasField("dim_param"):
        first = batch[0].dim_param
    elif batch and batch[0].HasField("dim_value"):
        first = batch[0].dim_value
    stage = [
        helper.make_tensor_value_info(HOT_SLOTS, TensorProto.INT64, [first, positions]),
        helper.make_tensor_value_info(COLD_POSITIONS, TensorProto.INT64, [COLD_DIM]),
        helper.make_tensor_value_info(COLD_ROWS, TensorProto.FLOAT, [COLD_DIM, width]),
    ]
    return [*inputs[:position], *stage, *inputs[position + 1 :]]


def split_lookups(
    model: onnx.ModelProto | Path | str,
    hot: HotSet,
    table_sizes: Sequence[int],
    *,
    base_dir: Path | None = None,
    rows: RowStore | None = None,
) -> onnx.ModelProto:
    """The dense model: the graph with every embedding lookup served from hot rows and the stage's cold rows.

    Inputs become the original ones with ``categorical_ids`` replaced by
    ``hot_slots`` (``B x 26`` int64), ``cold_positions`` (``N`` int64) and
    ``cold_rows`` (``N x W`` float32); the output, opset and dynamic batch stay.
    A stacked table's lookup becomes ``Gather(hot_table, where(slot > 0,
    first_hot[t] + slot, 0))``, then ``ScatterND`` of the cold rows on the
    ``B*26 x D`` flattening; a column ``k``'s lookup reads ``hot_slots[:, k]``
    and scatters the cold rows whose ``position % 26 == k`` at row ``position //
    26``. Nodes that only served the old lookups, and the old tables, are gone.

    Args:
        model: the exported graph, or the path of its ``.onnx`` file.
        hot: the hot rows of each table.
        table_sizes: rows of C1..C26 (those of ``hot``).
        base_dir: the folder of the graph's external data (default: the file's folder).
        rows: take the hot rows from this row store (of ``table_sizes``, with the columns the
            graph's lookups serve) instead of the graph's own tables. The graph's tables and
            its reduction of the ids may then be placeholders of any size (a graph too large
            to build otherwise, see the module docstring); they are dropped either way.

    Returns:
        The dense model, every initializer held in memory (save it with
        :func:`export.graphs.onnx_io.save_model`).

    Raises:
        ConfigError: ``hot`` made for other table sizes; ``rows`` holding other table sizes.
        ExportError: no usable lookups (see :func:`export.tables.lookups.find_lookups`), an opset
            below :data:`MIN_OPSET`, ids of an unexpected shape, or ids or a table still
            read by something besides the lookups; ``rows`` without the lookups' store columns.
    """
    source, folder = load_graph(model, base_dir)
    lookups = find_lookups(source)
    sizes = check_sizes(lookups, table_sizes) if rows is None else _check_store(lookups, table_sizes, rows)
    if hot.table_sizes != sizes:
        raise ConfigError(f"the hot set was chosen for table sizes {hot.table_sizes}, not {sizes}")
    opset = default_opset(source)
    if opset < MIN_OPSET:
        raise ExportError(f"the hot/cold split needs opset >= {MIN_OPSET} (ScatterND); the graph has {opset}")
    columns = input_columns(source)
    extra = {lookup.output: _extra_dims(lookup, len(columns)) for lookup in lookups}
    tensors = {t.name: t for t in source.graph.initializer}
    taken = {name for node in source.graph.node for name in [*node.input, *node.output, node.name]}
    taken |= set(tensors) | {value.name for value in source.graph.input}
    width = store_spec(lookups, sizes).width
    replaced = {lookup.output for lookup in lookups}
    tables = {lookup.table for lookup in lookups}

    dense = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(dense, field, getattr(source, field))
    dense.opset_import.extend(source.opset_import)
    dense.metadata_props.extend(source.metadata_props)
    dense.functions.extend(source.functions)
    out = dense.graph
    out.name, out.doc_string = source.graph.name, source.graph.doc_string
    builder = _Builder(out, taken, opset, width, columns)
    for lookup in lookups:
        values = table_values(tensors[lookup.table], folder) if rows is None else None
        if lookup.fused:
            _replace_fused(builder, lookup, values, hot, rows)
        else:
            _replace_column(builder, lookup, values, hot, extra[lookup.output], rows)
    # The new nodes read only the new inputs and initializers: in front, the graph stays sorted.
    out.node.extend(builder.nodes)
    out.node.extend(n for n in source.graph.node if not (n.op_type == "Gather" and n.output[0] in replaced))
    out.initializer.extend(t for t in source.graph.initializer if t.name not in tables)
    out.input.extend(_new_inputs(source, width, len(columns)))
    out.output.extend(source.graph.output)
    out.value_info.extend(v for v in source.graph.value_info if v.name not in replaced)
    kept_inputs = {value.name for value in out.input if value.name not in tensors}
    prune(out, kept_inputs)
    _check_dense(out, tables)
    for tensor in out.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            _load_inline(tensor, folder)
    if weights_bytes(dense) <= EXTERNAL_DATA_THRESHOLD:
        try:
            onnx.checker.check_model(dense)
        except onnx.checker.ValidationError as exc:
            raise ExportError(f"the dense model fails the ONNX checker: {exc}") from None
    log.info(
        "dense model: %d lookups replaced, %d hot rows of %d, opset %d",
        len(lookups),
        hot.rows,
        sum(sizes),
        opset,
    )
    return dense


def _load_inline(tensor: onnx.TensorProto, folder: Path | None) -> None:
    """Read an initializer's external data into the proto (it no longer points at a file)."""
    if folder is None:
        raise ExportError(f"{tensor.name} is stored outside the graph: give the folder of its data file")
    load_external_data_for_tensor(tensor, str(folder))
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def lookup_graph(model: onnx.ModelProto | Path | str, *, base_dir: Path | None = None) -> onnx.ModelProto:
    """The graph with its embedding tables' values dropped: what :func:`split_lookups` needs with a store.

    A hot/cold model keeps this beside its dense model. A new hot set then
    builds the next dense model from it and the row store
    (``split_lookups(lookup_graph, hot, sizes, rows=store)``), long after the
    all-in-graph graph (as large as the tables) is gone. Each table keeps its
    name, type and dims, so :func:`export.tables.lookups.find_lookups` finds the same
    lookups; every other initializer is loaded into the proto.

    Args:
        model: the all-in-graph graph, or the path of its ``.onnx`` file.
        base_dir: the folder of its external data (default: the file's folder).

    Returns:
        A graph as large as its layers (the tables hold no values: not a runnable model).

    Raises:
        ExportError: see :func:`export.tables.lookups.find_lookups`; external data without its folder.
    """
    source, folder = load_graph(model, base_dir)
    graph = onnx.ModelProto()
    graph.CopyFrom(source)
    tables = {lookup.table for lookup in find_lookups(graph)}
    for tensor in graph.graph.initializer:
        if tensor.name in tables:
            tensor.ClearField("raw_data")
            for field in ("float_data", "double_data", "int32_data", "int64_data", "external_data"):
                tensor.ClearField(field)
            tensor.data_location = TensorProto.DEFAULT
            tensor.doc_string = "values dropped: the rows live in the row store"
        elif tensor.data_location == TensorProto.EXTERNAL:
            _load_inline(tensor, folder)
    return graph


def _check_dense(graph: onnx.GraphProto, tables: set[str]) -> None:
    """Nothing but the replaced lookups read ``categorical_ids`` or the old tables."""
    readers: dict[str, str] = {}
    for node in graph.node:
        for name in inputs_of(node) & (tables | {CATEGORICAL_INPUT}):
            readers.setdefault(name, node.name or node.op_type)
    if readers:
        detail = ", ".join(f"{name} by {node}" for name, node in sorted(readers.items()))
        raise ExportError(
            f"the graph reads more than its embedding lookups from the ids or tables ({detail})"
        )


def _check_store(lookups: Sequence[Lookup], table_sizes: Sequence[int], store: RowStore) -> tuple[int, ...]:
    """``table_sizes`` (26 ints), checked against the store the hot rows come from (not the graph's tables).

    Raises:
        ConfigError: the store holds other table sizes.
        ExportError: the store's row columns are not those the graph's lookups serve.
    """
    sizes = check_table_sizes(table_sizes)
    if store.spec.table_sizes != sizes:
        raise ConfigError(
            f"row store {store.path} holds tables of {list(store.spec.table_sizes)} rows, not {list(sizes)}"
        )
    needed = store_spec(lookups, sizes)
    if dict(store.spec.columns) != dict(needed.columns) or store.spec.width != needed.width:
        raise ExportError(
            f"row store {store.path} has rows of {dict(store.spec.columns)} (width {store.spec.width}); "
            f"the graph's lookups need {dict(needed.columns)} (width {needed.width})"
        )
    return sizes
