"""Make an exported graph safe for any int64 id: probe it, and reduce ids into their tables.

A served model receives whatever ids its clients send. The bundle's own models
reduce each id into its table inside the graph; a model a user brings often
does not (its training pipeline mapped ids into range before the model saw
them), and then an id past its table makes ONNX Runtime fail the whole batch
(TensorRT silently returns zeros). This module checks that by running the
written ONNX file on ids at the int64 limits, negative and far past any table,
and where the graph fails it puts one floor-modulo (``Mod`` with ``fmod=0``,
whose remainder takes the divisor's sign) by each column's table size right
after the ``categorical_ids`` input. The sizes come from the user
(``--table-sizes``) or from the graph itself: each embedding lookup is a
``Gather`` on a weight initializer, whose first dimension is the table's size,
and its indices are traced back to the input column they were sliced from.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from bundle.errors import ExportError
from bundle.onnx_session import FATAL_ONLY
from bundle.schema import (
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    HOTNESS_METADATA,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
    hotness_counts,
)
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import check_table_sizes

log = logging.getLogger(__name__)

#: Ids no table holds: the int64 limits, negative ids, and ids far past any table.
PROBE_IDS: tuple[int, ...] = (
    np.iinfo(np.int64).min,
    np.iinfo(np.int64).max,
    -1,
    -(10**12) - 7,
    10**12,
    2**62 + 5,
)
#: Name of the reduced ids tensor the export inserts.
REDUCED_IDS = f"{CATEGORICAL_INPUT}_reduced"
#: Name of the initializer holding the 26 table sizes of the inserted ``Mod``.
TABLE_SIZES_INITIALIZER = f"{CATEGORICAL_INPUT}_table_sizes"
#: Ops an id passes through unchanged on its way from the input to a lookup.
_PASS_THROUGH = frozenset({"Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Expand"})


@dataclass(frozen=True)
class IdReduction:
    """How the exported graph keeps ids inside their tables.

    Attributes:
        table_sizes: the 26 sizes ids are reduced into (None: the graph reduces
            ids its own way and the sizes could not be read from it).
        added: the export inserted the ``Mod``; the user's own model does not reduce ids.
        origin: where ``table_sizes`` came from, for the export report.
    """

    table_sizes: tuple[int, ...] | None
    added: bool
    origin: str

    def reduce(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` as the graph's lookups see them: reduced when the export added the reduction."""
        if not self.added or self.table_sizes is None:
            return ids
        return np.mod(ids, np.asarray(self.table_sizes, dtype=np.int64)[None, :])


def probe_rows() -> dict[str, np.ndarray]:
    """Inputs of the probe: one row per id of :data:`PROBE_IDS` in every column, and one mixed row."""
    ids = np.array([[value] * NUM_CATEGORICAL for value in PROBE_IDS], dtype=np.int64)
    mixed = np.resize(np.array(PROBE_IDS, dtype=np.int64), NUM_CATEGORICAL)[None, :]
    ids = np.concatenate([ids, mixed])
    dense = np.zeros((len(ids), NUM_DENSE), dtype=np.float32)
    return {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}


def probe(path: Path) -> str | None:
    """Run the ONNX file at ``path`` on :func:`probe_rows` with ONNX Runtime (CPU).

    Returns:
        None when it gives a finite probability for every row; else what went
        wrong, in one line.

    Raises:
        ExportError: ONNX Runtime cannot load the file at all.
    """
    import onnxruntime as ort

    from export.graphs.parity import onnx_session

    # The out-of-bounds Gather expected here is not worth a red log line.
    session = onnx_session(path, quiet=True)
    try:
        quiet = ort.RunOptions()
        quiet.log_severity_level = FATAL_ONLY
        (output,) = session.run([OUTPUT], probe_rows(), quiet)
    except Exception as exc:  # an out-of-bounds Gather raises onnxruntime's own Fail/InvalidArgument
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not np.all(np.isfinite(output)):
        return "non-finite outputs"
    return None


def _constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Values of the graph's initializers (shapes only for external ones) and Constant nodes."""
    values: dict[str, np.ndarray] = {}
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type == 0:
            continue
        if np.prod(tensor.dims) <= 1024:  # only small tensors are needed as values
            values[tensor.name] = numpy_helper.to_array(tensor)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def graph_hotness(model: onnx.ModelProto) -> tuple[int, ...] | None:
    """The ids per bag of C1..C26 a multi-hot graph records (None: one id per table).

    Raises:
        ExportError: the record is not 26 counts >= 1.
    """
    return recorded_hotness({entry.key: entry.value for entry in model.metadata_props})


def recorded_hotness(metadata: Mapping[str, str]) -> tuple[int, ...] | None:
    """The bag sizes among a graph's metadata (``metadata_props``, or ONNX Runtime's
    ``custom_metadata_map``; None: no record, one id per table).

    Raises:
        ExportError: the record is not 26 counts >= 1.
    """
    text = metadata.get(HOTNESS_METADATA)
    if text is None:
        return None
    counts = hotness_counts(text)
    if counts is None:
        raise ExportError(f"the graph's {HOTNESS_METADATA} record {text!r} is not 26 counts >= 1")
    return counts


def set_graph_hotness(model: onnx.ModelProto, hotness: Sequence[int] | None) -> None:
    """Record ``hotness`` in the graph (:data:`HOTNESS_METADATA`; None: remove the record)."""
    for index in reversed(range(len(model.metadata_props))):
        if model.metadata_props[index].key == HOTNESS_METADATA:
            del model.metadata_props[index]
    if hotness is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = HOTNESS_METADATA, ",".join(str(int(count)) for count in hotness)


def input_columns(model: onnx.ModelProto) -> tuple[int, ...]:
    """The input column (0 = C1) of each position of ``categorical_ids``' last axis."""
    hotness = graph_hotness(model)
    if hotness is None:
        return tuple(range(NUM_CATEGORICAL))
    return tuple(column for column, count in enumerate(hotness) for _ in range(count))


def _is_permutation(value: np.ndarray, width: int = NUM_CATEGORICAL) -> bool:
    """``value`` is a 1-D list of all ``width`` positions (``ids.index_select(1, columns)``)."""
    if value.ndim != 1:
        return False
    return sorted(int(i) % width for i in value) == list(range(width))


def _single_index(value: np.ndarray | None) -> int | None:
    if value is None or value.size != 1:
        return None
    return int(value.reshape(-1)[0])


@dataclass(frozen=True)
class _Trace:
    """Where a tensor of ids came from.

    Attributes:
        column: the input column it holds (None: all 26 columns, the input itself).
        divisor: the divisor of the last ``Mod`` by a constant on the way (None: none).
        offset: a constant was added after that (rows of a stacked table: the
            table's own size is then not the column's).
        added: the sum of the constants added since the last ``Mod`` (a stacked
            table's row offsets); None when nothing was added or a value is not known.
        order: with ``column`` None, the input column at each position of the last
            axis (a constant ``Gather`` on axis 1 permuted them); None: C1..C26 in order.
    """

    column: int | None
    divisor: np.ndarray | None
    offset: bool
    added: np.ndarray | None = None
    order: tuple[int, ...] | None = None


class _Tracer:
    """Traces tensors of a graph back to the ``categorical_ids`` input (memoised: graphs share
    subexpressions, e.g. Keras' fix-up of negative indices uses the ids three times)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.producers = {output: node for node in model.graph.node for output in node.output}
        self.constants = _constant_values(model)
        self.fixed = set(self.constants) | {t.name for t in model.graph.initializer}
        self.memo: dict[str, _Trace | None] = {}
        # A multi-hot graph's input positions map to their bags' columns from the start.
        columns = input_columns(model)
        self.width = len(columns)
        self.input_order = None if self.width == NUM_CATEGORICAL else columns

    def trace(self, name: str, depth: int = 0) -> _Trace | None:
        """The trace of ``name``; None when it does not come from the ids alone."""
        if name == CATEGORICAL_INPUT:
            return _Trace(None, None, False, order=self.input_order)
        if name not in self.memo:
            self.memo[name] = None if depth > 200 else self._trace_node(name, depth)
        return self.memo[name]

    def _column(self, node: onnx.NodeProto, column: int, depth: int) -> _Trace | None:
        """A column taken out of the whole input."""
        upstream = self.trace(node.input[0], depth + 1)
        if upstream is None or upstream.column is not None:
            return None
        position = column % self.width

        def at_position(value: np.ndarray | None) -> np.ndarray | None:
            if value is None or value.size != self.width:
                return value
            return value.reshape(-1)[position : position + 1]

        if upstream.order is None:
            return _Trace(position, upstream.divisor, upstream.offset, at_position(upstream.added))
        # Per-position constants of a permuted input: keep the one of this position.
        return _Trace(
            upstream.order[position],
            at_position(upstream.divisor),
            upstream.offset,
            at_position(upstream.added),
        )

    def _permuted(self, node: onnx.NodeProto, index: np.ndarray, depth: int) -> _Trace | None:
        """The whole input with its columns reordered (``ids.index_select(1, columns)``)."""
        upstream = self.trace(node.input[0], depth + 1)
        if upstream is None or upstream.column is not None:
            return None
        positions = [int(i) % self.width for i in index]
        before = upstream.order or tuple(range(self.width))

        def permute(value: np.ndarray | None) -> np.ndarray | None:
            if value is None or value.size != self.width:
                return value
            return value.reshape(-1)[positions].reshape(value.shape)

        order = tuple(before[p] for p in positions)
        return _Trace(None, permute(upstream.divisor), upstream.offset, permute(upstream.added), order)

    def _trace_node(self, name: str, depth: int) -> _Trace | None:
        node = self.producers.get(name)
        if node is None or node.op_type in ("Shape", "Size"):
            return None
        op = node.op_type
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if op in _PASS_THROUGH:
            return self.trace(node.input[0], depth + 1)
        if op == "Mod" and node.input[1] in self.constants:
            upstream = self.trace(node.input[0], depth + 1)
            if upstream is None:
                return None
            return _Trace(upstream.column, self.constants[node.input[1]], False, order=upstream.order)
        if op == "Gather" and int(attrs.get("axis", 0)) in (1, -1):
            value = self.constants.get(node.input[1])
            index = _single_index(value)
            if index is None and value is not None and _is_permutation(value, self.width):  # reordered
                return self._permuted(node, value, depth)
            return None if index is None else self._column(node, index, depth)
        if op == "Slice":
            starts, ends = self.constants.get(node.input[1]), self.constants.get(node.input[2])
            axes = self.constants.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
            if starts is None or ends is None or starts.size != 1:
                return None
            axis = int(axes.reshape(-1)[0]) if axes is not None else 0
            start = int(starts.reshape(-1)[0])
            if axis not in (1, -1) or int(ends.reshape(-1)[0]) != start + 1:
                return None
            return self._column(node, start, depth)
        if op == "Split":
            if int(attrs.get("axis", 0)) not in (1, -1):
                return None
            split = self.constants.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
            if split is not None and np.any(split != 1):
                return None
            return self._column(node, list(node.output).index(name), depth)
        variable = [i for i in node.input if i and i not in self.fixed]
        if op == "Add" and len(variable) == 1:
            upstream = self.trace(variable[0], depth + 1)
            if upstream is None:
                return None
            value = next((self.constants.get(i) for i in node.input if i and i != variable[0]), None)
            if value is None or (upstream.offset and upstream.added is None):
                added = None
            else:
                added = value if upstream.added is None else upstream.added + value
            return replace(upstream, offset=True, added=added)
        # Any other op whose every non-constant input comes from one and the same column
        # (Keras' fix-up of negative indices: Less, Not, Cast, Mul, Add of the column).
        traces = [self.trace(i, depth + 1) for i in variable]
        if not traces or any(t is None for t in traces):
            return None
        found = [t for t in traces if t is not None]
        if len({t.column for t in found}) != 1 or len({t.order for t in found}) != 1:
            return None
        divisor = next((t.divisor for t in found if t.divisor is not None), None)
        return _Trace(found[0].column, divisor, all(t.offset for t in found), order=found[0].order)


@dataclass(frozen=True)
class TracedLookup:
    """One embedding lookup of a graph and where its ids come from.

    Attributes:
        node: the ``Gather`` (axis 0) whose data is a weight initializer (the table).
        column: the input column its ids are (0 = C1); None: all 26 columns, a
            ``B x 26`` index tensor (a stacked table's lookup).
        order: with ``column`` None, the input column at each position of the
            indices' last axis (C1..C26 unless the graph permuted them).
        divisor: the last ``Mod`` by a constant on the way (None: none); per position
            when it has 26 values.
        offset: a constant was added after that ``Mod``.
        added: the constants added since that ``Mod``, summed (a stacked table's row
            offsets, per position when 26 values); None when nothing was added or a
            value is not known.
    """

    node: onnx.NodeProto
    column: int | None
    order: tuple[int, ...]
    divisor: np.ndarray | None
    offset: bool
    added: np.ndarray | None


def traced_lookups(model: onnx.ModelProto) -> list[TracedLookup]:
    """Every ``Gather`` (axis 0) on an initializer whose indices trace back to ``categorical_ids``.

    Args:
        model: the graph (external data need not be loaded: only shapes and small constants are read).

    Returns:
        The lookups in graph order.
    """
    tracer = _Tracer(model)
    tables = {t.name for t in model.graph.initializer if len(t.dims) >= 1}
    found = []
    for node in model.graph.node:
        if node.op_type != "Gather" or node.input[0] not in tables:
            continue
        if any(a.name == "axis" and a.i != 0 for a in node.attribute):
            continue
        trace = tracer.trace(node.input[1])
        if trace is None:
            continue
        order = trace.order or tuple(range(NUM_CATEGORICAL))
        found.append(TracedLookup(node, trace.column, order, trace.divisor, trace.offset, trace.added))
    return found


def read_table_sizes(model: onnx.ModelProto) -> dict[int, int]:
    """Table sizes per input column, read from the graph's lookups.

    A lookup is a ``Gather`` (axis 0) whose data is an initializer (the table,
    ``rows x D`` or ``rows``) and whose indices trace back to one column of
    ``categorical_ids`` through casts, reshapes and column slices. A ``Mod`` by
    a constant on the way gives the column's size directly.

    Args:
        model: the graph (external data need not be loaded: only shapes are read).

    Returns:
        Column index (0 = C1) -> rows; columns not traced are absent.

    Raises:
        ExportError: one column indexes tables of different sizes.
    """
    tables = {t.name: int(t.dims[0]) for t in model.graph.initializer if len(t.dims) >= 1}
    sizes: dict[int, set[int]] = {}
    for trace in traced_lookups(model):
        node = trace.node
        divisor = trace.divisor
        if trace.column is None:
            if divisor is not None and divisor.size == len(trace.order):
                # One Mod by every position's size in front of a stacked table (the bundle's own layout).
                for i, size in enumerate(divisor.reshape(-1)):
                    sizes.setdefault(trace.order[i], set()).add(int(size))
            continue
        if divisor is not None and divisor.size in (1, NUM_CATEGORICAL):
            size = int(divisor.reshape(-1)[trace.column if divisor.size > 1 else 0])
        elif trace.offset:
            continue
        else:
            size = tables[node.input[0]]
        sizes.setdefault(trace.column, set()).add(size)
    conflicts = {c: s for c, s in sizes.items() if len(s) > 1}
    if conflicts:
        detail = ", ".join(f"{CATEGORICAL_COLUMNS[c]}: {sorted(s)}" for c, s in sorted(conflicts.items()))
        raise ExportError(f"ids of one column index tables of different sizes ({detail}): pass --table-sizes")
    return {column: next(iter(s)) for column, s in sizes.items()}


def add_id_reduction(model: onnx.ModelProto, sizes: Sequence[int]) -> None:
    """Insert ``Mod(categorical_ids, sizes)`` (``fmod=0``) in front of every use of the input, in place.

    Args:
        model: a graph whose input ``categorical_ids`` is ``B x 26`` int64.
        sizes: rows of the 26 tables.
    """
    sizes = check_table_sizes(sizes)
    graph = model.graph
    if CATEGORICAL_INPUT not in {i.name for i in graph.input}:
        raise ExportError(f"the graph has no input {CATEGORICAL_INPUT!r}")

    def rename(g: onnx.GraphProto) -> None:
        for node in g.node:
            for i, name in enumerate(node.input):
                if name == CATEGORICAL_INPUT:
                    node.input[i] = REDUCED_IDS
            for attribute in node.attribute:  # subgraphs (Loop, If, Scan) see outer names
                if attribute.type == onnx.AttributeProto.GRAPH:
                    rename(attribute.g)
                for sub in attribute.graphs:
                    rename(sub)
        for output in g.output:
            if output.name == CATEGORICAL_INPUT:
                raise ExportError(f"{CATEGORICAL_INPUT} is also a graph output; cannot reduce it")

    rename(graph)
    graph.initializer.append(
        numpy_helper.from_array(np.asarray([sizes], dtype=np.int64), TABLE_SIZES_INITIALIZER)
    )
    mod = onnx.helper.make_node(
        "Mod", [CATEGORICAL_INPUT, TABLE_SIZES_INITIALIZER], [REDUCED_IDS], name="/id_reduction/Mod", fmod=0
    )
    graph.node.insert(0, mod)


def _save_graph(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` back to ``path``; external data stays where it is (same folder)."""
    onnx.save_model(model, str(path))


def ensure_id_reduction(path: Path, table_sizes: Sequence[int] | None = None) -> IdReduction:
    """Make the ONNX file at ``path`` give a valid answer for any int64 id (rewritten in place).

    Args:
        path: an exported graph with the bundle's input and output names.
        table_sizes: the 26 table sizes (``--table-sizes``); None: read them
            from the graph when it needs the reduction.

    Returns:
        How the graph keeps ids in range.

    Raises:
        ExportError: the graph fails on out-of-range ids and the sizes of some
            columns cannot be read from it (the message names them), or it still
            fails after the reduction.
    """
    path = Path(path)
    given = check_table_sizes(table_sizes, "--table-sizes") if table_sizes is not None else None
    problem = probe(path)
    model = onnx.load(str(path), load_external_data=False)
    if problem is None:
        if given is not None:
            return IdReduction(given, False, "--table-sizes (the model reduces ids itself)")
        read = read_table_sizes(model)
        if len(read) == NUM_CATEGORICAL:
            sizes = tuple(read[c] for c in range(NUM_CATEGORICAL))
            return IdReduction(sizes, False, "the model's own reduction")
        return IdReduction(None, False, "the model reduces ids itself; sizes not readable from its graph")
    log.info("the graph fails on out-of-range ids (%s): adding a modulo by each table's size", problem)
    if given is not None:
        sizes, origin = given, "--table-sizes"
    else:
        read = read_table_sizes(model)
        missing = [CATEGORICAL_COLUMNS[c] for c in range(NUM_CATEGORICAL) if c not in read]
        if missing:
            raise ExportError(
                f"the model fails on ids outside its tables ({problem}) and the sizes of "
                f"{', '.join(missing)} cannot be read from its graph: pass --table-sizes "
                "(26 comma-separated sizes, C1..C26)"
            )
        sizes, origin = tuple(read[c] for c in range(NUM_CATEGORICAL)), "the graph's embedding tables"
    add_id_reduction(model, sizes)
    _save_graph(model, path)
    after = probe(path)
    if after is not None:
        raise ExportError(
            f"{path} still fails on out-of-range ids after reducing them into their tables: {after}"
        )
    return IdReduction(sizes, True, origin)
