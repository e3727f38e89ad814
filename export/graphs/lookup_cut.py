"""Taking a graph's embedding lookups out, and putting them back.

A recommender's graph is mostly its tables, and a tool that rewrites the rest of it
(ONNX Runtime's quantizer) loads the whole graph, tables included, more than once.
:func:`cut_lookups` takes each large table's ``Gather`` out of a graph: the lookup's
output becomes a graph input, and the table leaves the graph without being read (an
external tensor stays on disk). The graph left is the MLPs and the interaction, a few
megabytes. :func:`put_back_lookups` returns the lookups and their tables to the
rewritten graph, and :func:`lookup_outputs` runs the whole graph to give the cut one's
new inputs real values (what a calibration needs).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx
from onnx import helper

from bundle.errors import ExportError
from export.graphs.onnx_io import tensor_bytes

Message = TypeVar("Message", onnx.NodeProto, onnx.ValueInfoProto)
#: Tables of at least this many bytes are cut out (smaller constants, shape vectors among them, stay).
CUT_TABLE_BYTES = 1 << 20


@dataclass
class CutLookups:
    """The lookups :func:`cut_lookups` took out of a graph.

    Attributes:
        nodes: the ``Gather`` nodes, in graph order.
        tables: their tables (an external one is a reference to its file, not its bytes).
        outputs: the lookups' outputs, now inputs of the cut graph, with their types.
    """

    nodes: list[onnx.NodeProto] = field(default_factory=list)
    tables: list[onnx.TensorProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)

    @property
    def output_names(self) -> list[str]:
        """Names of :attr:`outputs`."""
        return [value.name for value in self.outputs]


def _gather_axis(node: onnx.NodeProto) -> int:
    return next((int(a.i) for a in node.attribute if a.name == "axis"), 0)


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Every name the node's subgraphs (``If``, ``Loop``, ``Scan`` bodies) read."""
    names: set[str] = set()
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.update(inner.input)
                names.update(_subgraph_inputs(inner))
    return names


def cut_lookups(model: onnx.ModelProto, min_bytes: int | None = None) -> CutLookups:
    """Take out of ``model``, in place, every ``Gather`` (axis 0) of a table initializer of at least
    ``min_bytes`` (default :data:`CUT_TABLE_BYTES`).

    Each lookup's output becomes a graph input of the table's type (its shape where the graph's
    value infos give it). A table leaves the initializers once no node reads it any more (one read
    by a subgraph, as torch writes ``EmbeddingBag`` with offsets, stays). The tables' bytes are
    never read: an external table is moved as a reference.

    Returns:
        What was taken, for :func:`put_back_lookups`.
    """
    least = CUT_TABLE_BYTES if min_bytes is None else min_bytes
    tables = {t.name: t for t in model.graph.initializer if tensor_bytes(t) >= least}
    infos = {value.name: value for value in model.graph.value_info}
    cut = CutLookups()
    kept: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[0] in tables and _gather_axis(node) == 0:
            cut.nodes.append(node)
        else:
            kept.append(node)
    if not cut.nodes:
        return cut
    read = {name for node in kept for name in [*node.input, *_subgraph_inputs(node)]}
    read.update(output.name for output in model.graph.output)
    gone = {node.input[0] for node in cut.nodes} - read
    for node in cut.nodes:
        name = node.output[0]
        info = onnx.ValueInfoProto()
        if name in infos:
            info.CopyFrom(infos[name])
        else:
            info = helper.make_tensor_value_info(name, tables[node.input[0]].data_type, None)
        cut.outputs.append(info)
    cut.nodes = _copies(cut.nodes)
    kept = _copies(kept)
    cut.tables = _take_initializers(model, gone)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    outputs = set(cut.output_names)
    values = _copies([value for value in model.graph.value_info if value.name not in outputs])
    del model.graph.value_info[:]
    model.graph.value_info.extend(values)
    model.graph.input.extend(cut.outputs)
    return cut


def _copies(messages: list[Message]) -> list[Message]:
    """Messages detached from their graph (one taken from a repeated field is a view of it)."""
    copies = [type(message)() for message in messages]
    for copy, message in zip(copies, messages, strict=True):
        copy.CopyFrom(message)
    return copies


def _take_initializers(model: onnx.ModelProto, names: set[str]) -> list[onnx.TensorProto]:
    """Remove the initializers ``names`` from ``model`` and return them, without copying their
    bytes (a repeated field's ``pop`` hands back the message itself)."""
    taken: list[onnx.TensorProto] = []
    index = 0
    initializers = model.graph.initializer
    while index < len(initializers):
        if initializers[index].name in names:
            taken.append(initializers.pop(index))
        else:
            index += 1
    return taken


def topological_order(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` ordered so each comes after the producers of its inputs, otherwise as given.

    Args:
        nodes: the graph's nodes.
        available: names known before any node runs (graph inputs, initializers).

    Raises:
        ExportError: a node reads a name nothing produces, or the nodes form a cycle.
    """
    produced_by = {name: index for index, node in enumerate(nodes) for name in node.output if name}
    waiting: list[set[int]] = []
    readers: dict[int, list[int]] = {index: [] for index in range(len(nodes))}
    for index, node in enumerate(nodes):
        needs = {produced_by[name] for name in [*node.input, *_subgraph_inputs(node)] if name in produced_by}
        missing = [n for n in node.input if n and n not in produced_by and n not in available]
        if missing:
            raise ExportError(f"node {node.name!r} reads {missing[0]!r}, which nothing produces")
        waiting.append(needs - {index})
        for producer in needs - {index}:
            readers[producer].append(index)
    ready = [index for index, needs in enumerate(waiting) if not needs]
    order: list[int] = []
    heapq.heapify(ready)
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for reader in readers[index]:
            waiting[reader].discard(index)
            if not waiting[reader]:
                heapq.heappush(ready, reader)
    if len(order) != len(nodes):
        raise ExportError("the graph's nodes form a cycle")
    return [nodes[index] for index in order]


def put_back_lookups(model: onnx.ModelProto, cut: CutLookups) -> None:
    """Return the lookups :func:`cut_lookups` took to ``model`` (the cut graph, rewritten), in place:
    their outputs stop being graph inputs, the tables are initializers again (moved, not copied:
    ``cut`` is left empty) and the nodes take their places in topological order."""
    if not cut.nodes:
        return
    outputs = set(cut.output_names)
    inputs = _copies([value for value in model.graph.input if value.name not in outputs])
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    present = {t.name for t in model.graph.initializer}
    for table in cut.tables:
        if table.name not in present:
            model.graph.initializer.append(table)
    cut.tables = []
    available = {value.name for value in model.graph.input} | {t.name for t in model.graph.initializer}
    nodes = [*model.graph.node, *cut.nodes]
    ordered = _copies(topological_order(nodes, available))
    del model.graph.node[:]
    model.graph.node.extend(ordered)


@contextmanager
def lookup_outputs(
    model_path: Path, names: list[str]
) -> Iterator[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]:
    """The whole graph at ``model_path``, run by ONNX Runtime on the CPU for the tensors ``names``.

    Yields a function ``feeds -> {name: value}``. The graph, with ``names`` added to its outputs,
    goes to ONNX Runtime as bytes, its external data files read from beside ``model_path``:
    ONNX Runtime maps page-aligned tables from them (page cache, not memory of this process).

    Raises:
        ExportError: ONNX Runtime cannot load the graph.
    """
    import onnxruntime as ort

    model = onnx.load(str(model_path), load_external_data=False)
    present = {output.name for output in model.graph.output}
    infos = {value.name: value for value in [*model.graph.value_info, *model.graph.input]}
    for name in names:
        if name not in present:
            model.graph.output.append(infos[name] if name in infos else onnx.ValueInfoProto(name=name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # A graph given as bytes finds its external data files in this folder.
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(model_path.parent)
    )
    graph = model.SerializeToString()
    del model
    try:
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        raise ExportError(f"{model_path}: ONNX Runtime cannot load the graph: {exc}") from exc
    del graph

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feeds), strict=True))

    yield run
