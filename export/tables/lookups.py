"""A graph's embedding lookups: which table serves which column, at which rows, and their values.

Works on any exporter's ONNX graph: the bundle's stacked tables (one ``Gather``
reading a ``B x 26`` index tensor, rows ``Mod(ids, sizes) + offsets``; Wide & Deep
reads its deep and wide tables with the same rows), rebuilt facebookresearch /
TorchRec DLRMs (the columns possibly permuted first), and per-column graphs from
Keras or TorchScript (one ``Gather`` per column and table). Lookups are traced to
the ids by :func:`export.graphs.ids.traced_lookups`; this module places each in a
row-store column (:mod:`export.tables.row_store`) and reads table values without
loading a whole model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from bundle.errors import ExportError
from bundle.schema import CATEGORICAL_INPUT, NUM_CATEGORICAL
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import check_table_sizes
from export.graphs.ids import TracedLookup, traced_lookups
from export.tables.row_store import EMBEDDING_COLUMN, WIDE_COLUMN, RowStoreSpec

#: Element types a table may have (the hot table keeps it; cold rows are cast to it).
FLOAT_TYPES: frozenset[int] = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE})


@dataclass(frozen=True)
class Lookup:
    """One embedding lookup of a graph: a ``Gather`` (axis 0) on a table initializer.

    Attributes:
        name: the Gather's node name (its output's when unnamed), for messages.
        table: the table initializer.
        indices: the Gather's index input.
        output: the Gather's output.
        columns: the input column (0 = C1) at each position of the indices' last axis:
            26 for a stacked table read with a ``B x 26`` index tensor (``H``, a column
            once per id of its bag, for a multi-hot graph's ``B x H``: see
            :func:`export.graphs.ids.graph_hotness`), else the one column of a per-column lookup.
        row_offsets: per position, the table row of the column's id 0: row
            ``row_offsets[j] + id`` holds (``columns[j]``, in-table ``id``).
        divisors: per position, the size the graph itself reduces ids into (None: no ``Mod``).
        table_shape: the table's dims, ``rows`` or ``rows x D``.
        data_type: the table's ONNX element type.
        store_column: the row-store column of its rows, ``"embedding"`` or ``"wide"``.
        store_range: that column's ``(start, stop)`` within a store row.
        id_shape: the shape of its ids as shape inference sees them (None for a dynamic
            dim, e.g. ``(None, 26)`` or ``(None, 1)``); None when not inferred.
    """

    name: str
    table: str
    indices: str
    output: str
    columns: tuple[int, ...]
    row_offsets: tuple[int, ...]
    divisors: tuple[int | None, ...]
    table_shape: tuple[int, ...]
    data_type: int
    store_column: str
    store_range: tuple[int, int]
    id_shape: tuple[int | None, ...] | None = None

    @property
    def fused(self) -> bool:
        """It reads every column at once (a stacked table; a multi-hot graph's every bag)."""
        return len(self.columns) > 1

    @property
    def row_dims(self) -> tuple[int, ...]:
        """Dims of one table row: ``(D,)``, ``(1,)``, or ``()`` for a 1-D table."""
        return self.table_shape[1:]

    @property
    def width(self) -> int:
        """Values in one table row."""
        return int(np.prod(self.row_dims, dtype=np.int64))


def _names(columns: Sequence[int]) -> str:
    """``C1, C2, C3`` (the first eight, then a count)."""
    names = [CATEGORICAL_COLUMNS[c] for c in sorted(columns)]
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _per_position(value: np.ndarray | None, columns: tuple[int, ...]) -> tuple[int, ...] | None:
    """A traced constant as one int per position (None: none, or not of one value per position)."""
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size == 1:
        return (int(flat[0]),) * len(columns)
    if flat.size == len(columns) > 1:  # one per position of a stacked table (26, or H bags' ids)
        return tuple(int(v) for v in flat)
    if flat.size == NUM_CATEGORICAL and len(columns) == 1:  # a Mod of the whole input, then one column
        return (int(flat[columns[0]]),)
    return None


def _lookup(trace: TracedLookup, tensor: onnx.TensorProto) -> Lookup:
    """The lookup of ``trace``, its store column still to be placed (``""``)."""
    node = trace.node
    name = node.name or node.output[0]
    if tensor.data_type not in FLOAT_TYPES:
        kind = TensorProto.DataType.Name(tensor.data_type)
        raise ExportError(
            f"lookup {name} reads table {tensor.name} of type {kind}; only float tables can be placed"
        )
    columns = trace.order if trace.column is None else (trace.column,)
    offsets = (0,) * len(columns)
    if trace.offset:
        added = _per_position(trace.added, columns)
        if added is None:
            raise ExportError(
                f"lookup {name} adds to the ids a value that is not one constant per column; "
                f"cannot tell which rows of {tensor.name} belong to which column"
            )
        offsets = added
    divisors = _per_position(trace.divisor, columns) or (None,) * len(columns)
    return Lookup(
        name=name,
        table=tensor.name,
        indices=node.input[1],
        output=node.output[0],
        columns=tuple(columns),
        row_offsets=offsets,
        divisors=tuple(divisors),
        table_shape=tuple(int(d) for d in tensor.dims),
        data_type=int(tensor.data_type),
        store_column="",
        store_range=(0, 0),
    )


def _inferred_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Inferred shapes of the graph's tensors (None for a dynamic dim), on a copy without the table values."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    inputs = {value.name for value in model.graph.input}
    for tensor in model.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL and len(tensor.raw_data) <= 1 << 16:
            graph.initializer.append(tensor)
        elif tensor.name not in inputs:  # only its shape matters: an input of that shape
            graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
    try:
        inferred = onnx.shape_inference.infer_shapes(light)
    except (onnx.shape_inference.InferenceError, ValueError):
        return {}  # shapes unknown: what needs them says so
    shapes = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    return shapes


def find_lookups(model: onnx.ModelProto) -> list[Lookup]:
    """The graph's embedding lookups, each placed in a row-store column.

    The widest tables are the embeddings (``"embedding"``, DLRM; Wide & Deep's deep
    part), tables of one value per row (1-D, or width 1) the wide weights
    (``"wide"``); when every table has width 1 they are the embeddings.

    Args:
        model: the exported graph (external data need not be loaded).

    Returns:
        The lookups in graph order.

    Raises:
        ExportError: no lookup found; a table width that is neither; a non-float
            table; or columns not all served by the same store columns (the message
            says what was found).
    """
    traced = traced_lookups(model)
    if not traced:
        raise ExportError(
            "no embedding lookups in the graph: expected Gather (axis 0) ops on weight initializers "
            f"whose indices come from {CATEGORICAL_INPUT} (through Mod, Add, casts and column slices)"
        )
    tensors = {t.name: t for t in model.graph.initializer}
    found = [_lookup(trace, tensors[trace.node.input[0]]) for trace in traced]
    widths = sorted({lookup.width for lookup in found})
    widest = widths[-1]
    odd = [w for w in widths if w not in (1, widest)]
    if odd:
        raise ExportError(
            f"embedding tables of widths {widths}: the widest ({widest}) are embeddings and width 1 "
            f"wide weights; tables of width {', '.join(map(str, odd))} are neither"
        )
    ranges = {EMBEDDING_COLUMN: (0, widest)}
    if widest > 1 and 1 in widths:
        ranges[WIDE_COLUMN] = (widest, widest + 1)
    shapes = _inferred_shapes(model)
    placed = []
    for lookup in found:
        column = EMBEDDING_COLUMN if lookup.width == widest else WIDE_COLUMN
        shape = shapes.get(lookup.indices)
        placed.append(replace(lookup, store_column=column, store_range=ranges[column], id_shape=shape))
    _check_coverage(placed, ranges)
    return placed


def _check_coverage(lookups: Sequence[Lookup], ranges: Mapping[str, tuple[int, int]]) -> None:
    """Every column is served by one table per store column, else one ExportError line."""
    problems, summary = [], []
    for name, (start, stop) in ranges.items():
        sources: dict[int, set[tuple[str, int]]] = {}
        for lookup in lookups:
            if lookup.store_column == name:
                for j, column in enumerate(lookup.columns):
                    sources.setdefault(column, set()).add((lookup.table, lookup.row_offsets[j]))
        summary.append(f"{name} (width {stop - start}) for {len(sources)} columns")
        missing = [c for c in range(NUM_CATEGORICAL) if c not in sources]
        if missing:
            problems.append(f"no {name} lookup for {_names(missing)}")
        several = [c for c, tables in sources.items() if len(tables) > 1]
        if several:
            problems.append(f"{_names(several)} read {name} rows from more than one table")
    if problems:
        raise ExportError(
            f"the graph's lookups must serve every column C1..C26 with the same store columns; found "
            f"{', '.join(summary)}: {'; '.join(problems)}"
        )


def store_spec(lookups: Sequence[Lookup], table_sizes: Sequence[int], dtype: str = "float32") -> RowStoreSpec:
    """The row store of ``lookups``: their store columns, one row per (table, in-table id)."""
    ranges = {lookup.store_column: lookup.store_range for lookup in lookups}
    width = max(stop for _, stop in ranges.values())
    return RowStoreSpec(check_table_sizes(table_sizes), width, dtype, ranges)


def check_sizes(lookups: Sequence[Lookup], table_sizes: Sequence[int]) -> tuple[int, ...]:
    """``table_sizes`` (26 ints), checked against the graph.

    Raises:
        ConfigError: not 26 sizes >= 1.
        ExportError: the graph reduces a column's ids into another size, or a
            column's rows would run past its table.
    """
    sizes = check_table_sizes(table_sizes)
    problems: dict[str, None] = {}
    for lookup in lookups:
        rows = lookup.table_shape[0]
        for j, column in enumerate(lookup.columns):
            size, first, name = sizes[column], lookup.row_offsets[j], CATEGORICAL_COLUMNS[column]
            divisor = lookup.divisors[j]
            if divisor is not None and divisor != size:
                problems[f"the graph reduces {name} into {divisor} rows, table_sizes says {size}"] = None
            if first < 0 or first + size > rows:
                problems[
                    f"{name}'s rows {first}..{first + size - 1} run past {lookup.table} ({rows} rows)"
                ] = None
    if problems:
        listed = list(problems)
        more = f" (and {len(listed) - 4} more)" if len(listed) > 4 else ""
        raise ExportError(f"table_sizes do not fit the graph: {'; '.join(listed[:4])}{more}")
    return sizes


def load_graph(
    model: onnx.ModelProto | Path | str, base_dir: Path | None = None
) -> tuple[onnx.ModelProto, Path | None]:
    """``model`` and the folder of its external data: a path is loaded without its external data."""
    if isinstance(model, onnx.ModelProto):
        return model, base_dir
    path = Path(model)
    try:
        loaded = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError) as exc:
        raise ExportError(f"cannot read the ONNX graph {path}: {exc}") from None
    return loaded, base_dir if base_dir is not None else path.parent


def table_values(tensor: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """A read-only array over an initializer's values, without copying them.

    External data is memory-mapped (reading a few rows of a stacked table reads
    just those pages; loading it whole would need memory for all 26 tables).

    Raises:
        ExportError: external data without ``base_dir``, or a file shorter than the tensor.
    """
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
    shape = tuple(int(d) for d in tensor.dims)
    if tensor.data_location == TensorProto.EXTERNAL:
        info = {entry.key: entry.value for entry in tensor.external_data}
        if base_dir is None:
            raise ExportError(f"{tensor.name} is stored outside the graph: give the folder of its data file")
        path = Path(base_dir) / info["location"]
        offset = int(info.get("offset", 0))
        needed = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not path.is_file() or path.stat().st_size < needed:
            raise ExportError(
                f"{tensor.name}: its external data {path} is missing or shorter than {needed} bytes"
            )
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
    if tensor.raw_data:
        return np.frombuffer(tensor.raw_data, dtype=dtype).reshape(shape)
    return numpy_helper.to_array(tensor)
