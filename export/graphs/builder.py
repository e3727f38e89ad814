"""Adding nodes and constants to an ONNX graph under fresh names (the graph rewrites share it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from bundle.errors import ExportError


def default_opset(model: onnx.ModelProto) -> int:
    """The graph's default-domain opset.

    Raises:
        ExportError: it imports none.
    """
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ExportError("the graph imports no default-domain opset")


def taken_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name ``graph`` uses (its nodes', initializers' and inputs')."""
    taken = {name for node in graph.node for name in [*node.input, *node.output, node.name]}
    return taken | {t.name for t in graph.initializer} | {v.name for v in graph.input}


class GraphBuilder:
    """The nodes and initializers a rewrite adds to ``graph``, named uniquely under ``prefix``.

    Nodes collect in :attr:`nodes` (the caller places them); initializers go into ``graph``.
    """

    def __init__(self, graph: onnx.GraphProto, taken: set[str], prefix: str) -> None:
        self.graph = graph
        self.taken = taken
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.shared: dict[tuple[Any, ...], str] = {}

    def fresh(self, hint: str) -> str:
        base = f"{self.prefix}/{hint}"
        name, count = base, 0
        while name in self.taken:
            count += 1
            name = f"{base}_{count}"
        self.taken.add(name)
        return name

    def constant(self, hint: str, value: np.ndarray, share: bool = True) -> str:
        """An initializer of ``value``; small ones (``share``) made once per value."""
        key = ("constant", value.dtype.str, value.shape, value.tobytes()) if share else None
        if key is None or key not in self.shared:
            # Written in place: copying a tensor message over 2 GB (a big hot table) fails.
            tensor = self.graph.initializer.add()
            tensor.name = self.fresh(hint)
            tensor.data_type = helper.np_dtype_to_tensor_dtype(value.dtype)
            tensor.dims.extend(value.shape)
            tensor.raw_data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
            if key is None:
                return tensor.name
            self.shared[key] = tensor.name
        return self.shared[key]

    def ints(self, *values: int) -> str:
        """A 1-D int64 constant."""
        return self.constant("ints", np.asarray(values, dtype=np.int64))

    def scalar(self, value: int) -> str:
        return self.constant("scalar", np.asarray(value, dtype=np.int64))

    def op(
        self, op_type: str, inputs: Sequence[str], hint: str, output: str | None = None, **attrs: Any
    ) -> str:
        out = output or self.fresh(hint)
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [out], name=self.fresh(f"{hint}/{op_type}"), **attrs)
        )
        return out

    def once(self, key: tuple[Any, ...], make: Callable[[], str]) -> str:
        """The value of ``key``, made on first use (intermediates several lookups share)."""
        if key not in self.shared:
            self.shared[key] = make()
        return self.shared[key]
