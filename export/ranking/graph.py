"""A flat model's ranking variant, at the ONNX level.

A flat graph takes ``B`` independent rows (``dense_features`` ``B x 13``,
``categorical_ids`` ``B x H``). Its ranking variant takes a batch of ``U`` users,
each with its own number of candidates, ``N`` candidates in all, as Triton hands
a batch of ranking requests to a model (:mod:`bundle.schema`'s ranking tensors):

- ``user_dense_features`` ``U x Du`` and ``user_categorical_ids`` ``U x Hu``: one
  row per user, batched as usual;
- ``candidate_dense_features`` and ``candidate_categorical_ids``: ragged inputs,
  every user's candidates concatenated and flattened (``N*Dc`` and ``N*Hc`` values:
  how Triton's backends give a ragged input to a model);
- ``candidate_shape`` ``U x 2`` int32: each user's ``(C, width)`` of its candidate
  ids (its dense part where it has no ids), which Triton computes for the batch
  (a ``batch_input`` of kind ``BATCH_ITEM_SHAPE``);
- out: ``click_probability`` ``N x 1``, which Triton scatters back to the users
  (a ``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE``).

In front of the flat graph, the variant maps each candidate to its user (a
running sum of marks at each user's first candidate) and builds the flat rows:
the user's columns gathered by that map beside the candidate's, in the data
contract's order. Every embedding lookup of a user's table is then moved in
front of that map: it reads the user's ids once per user (the ids' own
reduction cloned onto the ``U`` rows) and its rows are gathered to the
candidates; a stacked table read with all columns at once is split into the
user's positions (once per user) and the candidates'. The MLPs and the
interaction run on the ``N`` rows as before, so each candidate's answer is the
flat model's on its tiled row: the same values through the same ops.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from bundle.errors import ExportError
from bundle.schema import (
    CANDIDATE_CATEGORICAL_INPUT,
    CANDIDATE_DENSE_INPUT,
    CANDIDATE_DENSE_SHAPE_INPUT,
    CANDIDATE_SHAPE_INPUT,
    CATEGORICAL_INPUT,
    DENSE_INPUT,
    NUM_DENSE,
    USER_CATEGORICAL_INPUT,
    USER_DENSE_INPUT,
    FeatureSplit,
)
from export.graphs.builder import GraphBuilder, default_opset, taken_names
from export.graphs.ids import graph_hotness
from export.graphs.onnx_io import inputs_of, prune
from export.tables.lookups import Lookup, find_lookups

log = logging.getLogger(__name__)

#: Names the variant adds start with this.
PREFIX = "ranking"
#: Lowest opset the variant is written for (its reductions take their axes as inputs from 13).
MIN_OPSET = 13
#: From this opset on, the candidates' users come from one scatter of marks (``ScatterElements``
#: with ``reduction="add"``); below it, from a comparison of every candidate with every user's end.
SCATTER_ADD_OPSET = 16


@dataclass(frozen=True)
class RankingGraph:
    """What :func:`ranking_graph` made.

    Attributes:
        model: the ranking variant (the flat graph's tables, external ones still referenced).
        lookups: the flat graph's embedding lookups.
        once: lookups that now read the user's ids once per user (some of their positions
            at least: a stacked table split between user and candidates counts here).
        tiled: lookups of a user's table left reading the tiled ids (their ids' path could not
            be cloned), with why.
    """

    model: onnx.ModelProto
    lookups: int
    once: int
    tiled: tuple[str, ...]


def _counts(b: GraphBuilder, shapes: str, hint: str) -> str:
    """``U`` int32: each user's candidates, from a ``U x 2`` batch input of shapes."""
    return b.op("Gather", [shapes, b.scalar(0)], hint, axis=1)


def _user_of(b: GraphBuilder, opset: int, dense_shapes: bool) -> str:
    """``N`` int64: the user (``0..U-1``) of each candidate, from ``candidate_shape``.

    It fails the run where a user has no candidate (in Triton's C++ backends, a batch holding
    such a request gets its batch-mates' ragged inputs only up to it), or, with
    ``dense_shapes``, where a user's dense part holds another number of candidates than its ids:
    a one-value tensor read at place ``1 - holds``, so that the error (an index out of bounds)
    names the node ``ranking/every_user_needs_candidates_its_two_parts_agree_on``.
    """
    raw = _counts(b, CANDIDATE_SHAPE_INPUT, "counts")
    counts = b.op("Cast", [raw], "counts", to=TensorProto.INT64)
    holds = b.op("Min", [b.op("ReduceMin", [counts], "fewest", keepdims=1), b.ints(1)], "holds")
    if dense_shapes:
        same = b.op("Equal", [_counts(b, CANDIDATE_DENSE_SHAPE_INPUT, "dense_counts"), raw], "agree")
        agree = b.op("ReduceMin", [b.op("Cast", [same], "agree", to=TensorProto.INT64)], "agree", keepdims=1)
        holds = b.op("Min", [holds, agree], "holds")
    hint = "every_user_needs_candidates_its_two_parts_agree_on"
    guard = b.op("Gather", [b.ints(0), b.op("Sub", [b.ints(1), holds], hint)], hint)
    ends = b.op("CumSum", [counts, b.scalar(0)], "ends")
    total = b.op("ReduceSum", [counts], "total", keepdims=1)  # [N]
    if opset >= SCATTER_ADD_OPSET:
        # A mark where each user's candidates end (users of no candidate add theirs to the same
        # place; the last one's falls on the extra place N): up to a candidate, as many marks
        # as users that ended at or before it.
        places = b.op("Add", [total, b.ints(1)], "places")
        zeros = b.op(
            "ConstantOfShape", [places], "marks", value=helper.make_tensor("", TensorProto.INT64, [1], [0])
        )
        ones = b.op("ConstantOfShape", [b.op("Shape", [ends], "ones")], "ones",
                    value=helper.make_tensor("", TensorProto.INT64, [1], [1]))  # fmt: skip
        marks = b.op("ScatterElements", [zeros, ends, ones], "marks", axis=0, reduction="add")
        running = b.op("CumSum", [marks, b.scalar(0)], "running")
        user_of = b.op("Slice", [running, b.ints(0), total, b.ints(0)], "user_of")
    else:
        user_of = _compared_user_of(b, counts, ends, total)
    return b.op("Add", [user_of, guard], "user_of")


def _compared_user_of(b: GraphBuilder, counts: str, ends: str, total: str) -> str:
    """:func:`_user_of`'s map before opset 16: a candidate's user is the number of users that end
    at or before it."""
    scalar_total = b.op("Squeeze", [total, b.ints(0)], "total")
    positions = b.op("Range", [b.scalar(0), scalar_total, b.scalar(1)], "positions")
    column = b.op("Unsqueeze", [positions, b.ints(1)], "positions")
    row = b.op("Unsqueeze", [ends, b.ints(0)], "ends")
    after = b.op("Cast", [b.op("Greater", [row, column], "after")], "after", to=TensorProto.INT64)
    users = b.op("Shape", [counts], "users")
    later = b.op("ReduceSum", [after, b.ints(1)], "later", keepdims=0)
    return b.op("Sub", [b.op("Squeeze", [users, b.ints(0)], "users"), later], "user_of")


def _flat(
    b: GraphBuilder,
    user: str | None,
    user_columns: Sequence[int],
    candidate: str | None,
    candidate_columns: Sequence[int],
    user_of: str,
    output: str,
) -> None:
    """``output`` (``N x width``): a user's columns gathered to its candidates beside the candidates'
    own, in the contract's column order."""
    parts = []
    if user is not None:
        parts.append(b.op("Gather", [user, user_of], f"{output}/user", axis=0))
    if candidate is not None:
        parts.append(b.op("Reshape", [candidate, b.ints(-1, len(candidate_columns))], f"{output}/candidates"))
    order = np.argsort(np.asarray([*user_columns, *candidate_columns])).astype(np.int64)
    identity = bool((order == np.arange(order.size)).all())
    joined = parts[0] if len(parts) == 1 else b.op("Concat", parts, f"{output}/joined", axis=1)
    if identity:
        b.op("Identity", [joined], output, output=output)
    else:
        b.op("Gather", [joined, b.constant("order", order)], output, output=output, axis=1)


class _Cloner:
    """Clones the nodes between ``categorical_ids`` and a lookup's ids onto the users' ids."""

    def __init__(self, b: GraphBuilder, graph: onnx.GraphProto, user_ids: str) -> None:
        self.b = b
        self.user_ids = user_ids
        self.producer = {name: node for node in graph.node for name in node.output if name}
        self.depends: dict[str, bool] = {}
        self.cloned: dict[str, str] = {}

    def _depends(self, name: str) -> bool:
        if name == CATEGORICAL_INPUT:
            return True
        if name not in self.depends:
            node = self.producer.get(name)
            self.depends[name] = False  # a cycle cannot occur in a valid graph; this bounds the walk
            self.depends[name] = node is not None and any(self._depends(i) for i in inputs_of(node))
        return self.depends[name]

    def clone(self, name: str) -> str:
        """The users' version of tensor ``name`` (``name`` itself where it does not read the ids).

        Raises:
            ExportError: the path holds a node with subgraphs (it is not cloned).
        """
        if name == CATEGORICAL_INPUT:
            return self.user_ids
        if not self._depends(name):
            return name
        if name in self.cloned:
            return self.cloned[name]
        node = self.producer[name]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            raise ExportError(f"its ids pass through {node.op_type} {node.name!r}, which holds subgraphs")
        inputs = [self.clone(i) if i else i for i in node.input]
        outputs = [self.b.fresh(f"user/{o}") if o else o for o in node.output]
        for old, new in zip(node.output, outputs, strict=True):
            if old:
                self.cloned[old] = new
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.input[:]
        del copy.output[:]
        copy.input.extend(inputs)
        copy.output.extend(outputs)
        copy.name = self.b.fresh(f"user/{node.name or node.op_type}")
        self.b.nodes.append(copy)
        return self.cloned[name]


def _user_ids(b: GraphBuilder, split: FeatureSplit, hotness: tuple[int, ...] | None) -> str:
    """``U x H`` int64: each user's ids at its positions, 0 at the candidates' (the flat ids' layout)."""
    user, candidate = split.positions(hotness)
    if not candidate:
        return USER_CATEGORICAL_INPUT
    users = b.op(
        "Slice", [b.op("Shape", [USER_CATEGORICAL_INPUT], "user_ids"), b.ints(0), b.ints(1)], "user_ids"
    )
    shape = b.op("Concat", [users, b.ints(len(candidate))], "user_ids", axis=0)
    zeros = b.op(
        "ConstantOfShape", [shape], "user_ids", value=helper.make_tensor("", TensorProto.INT64, [1], [0])
    )
    joined = b.op("Concat", [USER_CATEGORICAL_INPUT, zeros], "user_ids", axis=1)
    order = np.argsort(np.asarray([*user, *candidate])).astype(np.int64)
    return b.op("Gather", [joined, b.constant("order", order)], "user_ids", axis=1)


def _once(
    b: GraphBuilder,
    cloner: _Cloner,
    lookup: Lookup,
    node: onnx.NodeProto,
    user: set[int],
    user_of: str,
    splices: dict[str, list[str]],
) -> bool:
    """Rewrite ``lookup`` (its ``Gather`` ``node``) to read the user's positions once per user.

    Returns:
        Whether it was rewritten (False: it reads no user's column).
    """
    positions = range(len(lookup.columns))
    mine = [j for j in positions if lookup.columns[j] in user]
    if not mine:
        return False
    theirs = [j for j in positions if lookup.columns[j] not in user]
    table = node.input[0]
    ids = cloner.clone(node.input[1])
    hint = lookup.table
    if not theirs:
        rows = b.op("Gather", [table, ids], f"{hint}/user_rows")
        b.op("Gather", [rows, user_of], hint, output=lookup.output, axis=0)
        return True
    shape = lookup.id_shape
    if shape is None or len(shape) != 2 or shape[1] != len(lookup.columns):
        raise ExportError(f"its ids have shape {shape}, not rows x {len(lookup.columns)} positions")
    user_ids = b.op(
        "Gather", [ids, b.constant("positions", np.asarray(mine, np.int64))], f"{hint}/user_ids", axis=1
    )
    user_rows = b.op("Gather", [table, user_ids], f"{hint}/user_rows")
    spread = b.op("Gather", [user_rows, user_of], f"{hint}/user_rows", axis=0)
    their_ids = b.op(
        "Gather",
        [node.input[1], b.constant("positions", np.asarray(theirs, np.int64))],
        f"{hint}/ids",
        axis=1,
    )
    their_rows = b.op("Gather", [table, their_ids], f"{hint}/rows")
    order = np.argsort(np.asarray([*mine, *theirs])).astype(np.int64)
    if (order == np.arange(order.size)).all():  # the user's positions first: the concat is the rows
        b.op("Concat", [spread, their_rows], hint, output=lookup.output, axis=1)
        splices[lookup.output] = [spread, their_rows]
        return True
    joined = b.op("Concat", [spread, their_rows], f"{hint}/joined", axis=1)
    b.op("Gather", [joined, b.constant("order", order)], hint, output=lookup.output, axis=1)
    return True


def _splice(nodes: list[onnx.NodeProto], splices: dict[str, list[str]]) -> None:
    """A ``Concat`` on axis 1 that reads a split lookup's rows reads their two parts instead (DLRM's
    interaction joins the bottom MLP's output and the lookups so): one copy of the rows, not two."""
    if not splices:
        return
    for node in nodes:
        if node.op_type != "Concat" or not any(name in splices for name in node.input):
            continue
        if next((a.i for a in node.attribute if a.name == "axis"), None) != 1:
            continue
        inputs = [part for name in node.input for part in splices.get(name, [name])]
        del node.input[:]
        node.input.extend(inputs)


def _inputs(split: FeatureSplit, hotness: tuple[int, ...] | None) -> list[onnx.ValueInfoProto]:
    user, candidate = split.positions(hotness)
    values = []
    if split.user_dense:
        values.append(
            helper.make_tensor_value_info(
                USER_DENSE_INPUT, TensorProto.FLOAT, ["users", len(split.user_dense)]
            )
        )
    if user:
        values.append(
            helper.make_tensor_value_info(USER_CATEGORICAL_INPUT, TensorProto.INT64, ["users", len(user)])
        )
    if split.candidate_dense:
        values.append(
            helper.make_tensor_value_info(CANDIDATE_DENSE_INPUT, TensorProto.FLOAT, ["candidate_values"])
        )
    if candidate:
        values.append(
            helper.make_tensor_value_info(CANDIDATE_CATEGORICAL_INPUT, TensorProto.INT64, ["candidate_ids"])
        )
    values.append(helper.make_tensor_value_info(CANDIDATE_SHAPE_INPUT, TensorProto.INT32, ["users", 2]))
    if candidate and split.candidate_dense:
        values.append(
            helper.make_tensor_value_info(CANDIDATE_DENSE_SHAPE_INPUT, TensorProto.INT32, ["users", 2])
        )
    return values


def _sorted(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each reads only what is available or made before it (stable)."""
    produced = {name for node in nodes for name in node.output if name}
    ready = set(available)
    pending = list(nodes)
    ordered: list[onnx.NodeProto] = []
    while pending:
        left = []
        for node in pending:
            if all(name in ready or name not in produced for name in inputs_of(node)):
                ordered.append(node)
                ready.update(name for name in node.output if name)
            else:
                left.append(node)
        if len(left) == len(pending):
            raise ExportError(f"the ranking graph has a cycle through {left[0].op_type} {left[0].name!r}")
        pending = left
    return ordered


def ranking_graph(model: onnx.ModelProto, split: FeatureSplit) -> RankingGraph:
    """The ranking variant of flat graph ``model`` for features split by ``split``.

    Args:
        model: the flat graph (inputs ``dense_features`` and ``categorical_ids``; external
            data need not be loaded). It is not changed.
        split: which features are the user's.

    Returns:
        The variant and what was done to its lookups.

    Raises:
        ExportError: not a flat model of the schema's inputs, or an opset below :data:`MIN_OPSET`.
    """
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise ExportError(f"a ranking variant needs opset >= {MIN_OPSET}; the graph has {opset}")
    names = {value.name for value in model.graph.input}
    if not {DENSE_INPUT, CATEGORICAL_INPUT} <= names:
        raise ExportError(
            f"a ranking variant is made from a flat model of inputs {DENSE_INPUT} and {CATEGORICAL_INPUT}; "
            f"this graph takes {sorted(names)}"
        )
    hotness = graph_hotness(model)
    lookups = find_lookups(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    b = GraphBuilder(graph, taken_names(graph), PREFIX)
    user_positions, candidate_positions = split.positions(hotness)
    user_of = _user_of(b, opset, bool(candidate_positions and split.candidate_dense))
    _flat(
        b,
        USER_DENSE_INPUT if split.user_dense else None,
        split.user_dense,
        CANDIDATE_DENSE_INPUT if split.candidate_dense else None,
        split.candidate_dense,
        user_of,
        DENSE_INPUT,
    )
    _flat(
        b,
        USER_CATEGORICAL_INPUT if user_positions else None,
        user_positions,
        CANDIDATE_CATEGORICAL_INPUT if candidate_positions else None,
        candidate_positions,
        user_of,
        CATEGORICAL_INPUT,
    )
    assert len(split.user_dense) + len(split.candidate_dense) == NUM_DENSE
    once, tiled = 0, []
    replaced: set[str] = set()
    splices: dict[str, list[str]] = {}
    if user_positions:
        cloner = _Cloner(b, model.graph, _user_ids(b, split, hotness))
        gathers = {node.output[0]: node for node in model.graph.node if node.op_type == "Gather"}
        user_tables = set(split.user_categorical)
        for lookup in lookups:
            mark = len(b.nodes)
            try:
                if _once(b, cloner, lookup, gathers[lookup.output], user_tables, user_of, splices):
                    once += 1
                    replaced.add(lookup.output)
            except ExportError as exc:
                del b.nodes[mark:]
                cloner.cloned = {
                    k: v for k, v in cloner.cloned.items() if any(v in n.output for n in b.nodes)
                }
                tiled.append(f"{lookup.name}: {exc}")
    kept = [node for node in graph.node if not (node.op_type == "Gather" and node.output[0] in replaced)]
    _splice(kept, splices)
    inputs = [value for value in graph.input if value.name not in (DENSE_INPUT, CATEGORICAL_INPUT)]
    new_inputs = _inputs(split, hotness)
    del graph.input[:]
    graph.input.extend([*new_inputs, *inputs])
    available = {value.name for value in graph.input} | {t.name for t in graph.initializer}
    ordered = _sorted([*b.nodes, *kept], available)
    del graph.node[:]
    graph.node.extend(ordered)
    prune(graph, {value.name for value in new_inputs})
    # Shapes recorded for the old inputs' users stay true (the rows are N as before), but the
    # inputs are intermediate now.
    del graph.value_info[:]
    log.info(
        "ranking variant: %d of %d lookups read the user's ids once per user%s",
        once,
        len(lookups),
        f"; {len(tiled)} read them tiled ({'; '.join(tiled)})" if tiled else "",
    )
    return RankingGraph(out, len(lookups), once, tuple(tiled))
