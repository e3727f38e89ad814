"""A ``tf.function`` -> ONNX with its weights as initializers, in memory that does not grow with their size.

tf2onnx's ``from_function`` freezes the function's variables into ``Const`` nodes,
runs grappler over them, and then rewrites every constant's protobuf once per
optimizer pass; with the upb protobuf runtime each rewrite leaves a copy in the
message's arena. On a SavedModel of 26 small tables, ``from_function`` peaked
at many times the tables' own size above the loaded model, and with
``large_model=True`` still well above it (the constants go back into the ONNX
graph before the optimizers run).

:func:`convert_function` keeps the weights out of the conversion instead: it
freezes the function without grappler (tf2onnx's large-model freeze), turns
every constant over :data:`LIFT_BYTES` into a ``Placeholder``, converts that
graph (the weights are graph inputs, as :mod:`export.importers.onnx_wide_deep` converts
the bundle's own model), and puts the values back as initializers, written in
place. The same model converts with a small fraction of that peak, and
faster. Large constants become initializers either way, so ONNX
Runtime, the FP16 conversion and INT8 quantization see the same graph.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from bundle.errors import ExportError

logger = logging.getLogger(__name__)

#: Constants larger than this (bytes) leave the graph during conversion and come back as
#: initializers; smaller ones (shapes, axes, slice bounds) stay, as tf2onnx needs their values.
LIFT_BYTES = 1024
#: TensorFlow dtypes (``DataType`` enum names) of constants that are lifted, and their ONNX types.
_LIFTED_DTYPES: dict[str, int] = {
    "DT_FLOAT": onnx.TensorProto.FLOAT,
    "DT_HALF": onnx.TensorProto.FLOAT16,
    "DT_DOUBLE": onnx.TensorProto.DOUBLE,
    "DT_INT8": onnx.TensorProto.INT8,
    "DT_UINT8": onnx.TensorProto.UINT8,
    "DT_INT32": onnx.TensorProto.INT32,
    "DT_INT64": onnx.TensorProto.INT64,
}

#: A tf2onnx op handler: ``handler(ctx, node, name, args) -> node``.
OpHandler = tuple[Callable[..., Any], list[Any]]


def _lift_constants(graph_def: Any) -> dict[str, onnx.TensorProto]:
    """Turn each large top-level ``Const`` of ``graph_def`` into a ``Placeholder``, in place.

    Args:
        graph_def: a frozen ``tf.compat.v1.GraphDef``.

    Returns:
        Placeholder tensor name (``<node>:0``) -> the ONNX initializer holding its value.
    """
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    lifted: dict[str, onnx.TensorProto] = {}
    for node in graph_def.node:
        if node.op != "Const":
            continue
        dtype = node.attr["dtype"].type
        onnx_type = _LIFTED_DTYPES.get(types_pb2.DataType.Name(dtype))
        proto = node.attr["value"].tensor
        shape = [int(d.size) for d in proto.tensor_shape.dim]
        if onnx_type is None or int(np.prod(shape)) * tf.dtypes.as_dtype(dtype).size <= LIFT_BYTES:
            continue
        values = tf.make_ndarray(proto)
        tensor = onnx.TensorProto()
        tensor.name = f"{node.name}:0"
        tensor.data_type = onnx_type
        tensor.dims.extend(values.shape)
        tensor.raw_data = np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()
        del values
        lifted[tensor.name] = tensor
        node.op = "Placeholder"
        node.attr.clear()
        node.attr["dtype"].type = dtype
        for size in shape:
            node.attr["shape"].shape.dim.add(size=size)
    return lifted


def _attach(model: onnx.ModelProto, lifted: dict[str, onnx.TensorProto]) -> None:
    """Move the lifted weights from the graph's inputs into its initializers (in place)."""
    graph = model.graph
    for value in [v for v in graph.input if v.name in lifted]:
        graph.input.remove(value)
        tensor = graph.initializer.add()
        tensor.CopyFrom(lifted.pop(value.name))
    # A weight tf2onnx found unused (pruned with its branch) is simply not attached.
    if lifted:
        logger.debug("weights not used by the converted graph: %s", sorted(lifted))


def convert_function(
    function: Any,
    opset: int,
    custom_op_handlers: dict[str, OpHandler] | None = None,
) -> onnx.ModelProto:
    """Convert ``function`` to ONNX, its weights as initializers (see the module docstring).

    Args:
        function: a ``tf.function`` with an ``input_signature`` of named
            ``tf.TensorSpec`` s and a dict of named outputs; the ONNX inputs and
            outputs take those names.
        opset: ONNX opset.
        custom_op_handlers: tf2onnx handlers by TensorFlow op type.

    Returns:
        The ONNX model; its initializers hold the weights in place (``raw_data``),
        so a model over 2 GB must be saved with :func:`export.graphs.onnx_io.save_model`.

    Raises:
        ExportError: tf2onnx could not convert the graph.
    """
    import tensorflow as tf
    import tf2onnx
    from tf2onnx import tf_loader

    concrete = function.get_concrete_function()
    arguments = len(tf.nest.flatten(concrete.structured_input_signature))
    inputs = [tensor.name for tensor in concrete.inputs[:arguments]]
    outputs = [tensor.name for tensor in concrete.outputs]
    renames = tf2onnx.convert.tensor_names_from_structed(concrete, inputs, outputs)
    if logger.getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("tf2onnx").setLevel(logging.WARNING)
    with tf.device("/cpu:0"):
        graph_def = tf_loader.convert_variables_to_constants_large_model(concrete)
        graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
        lifted = _lift_constants(graph_def)
        logger.debug(
            "lifted %d constants (%.1f MB) out of the frozen graph",
            len(lifted),
            sum(len(t.raw_data) for t in lifted.values()) / 1e6,
        )
        try:
            model, _ = tf2onnx.convert.from_graph_def(
                graph_def,
                name=concrete.name,
                input_names=inputs + list(lifted),
                output_names=outputs,
                opset=opset,
                custom_op_handlers=custom_op_handlers,
                tensors_to_rename=renames,
            )
        except (ValueError, TypeError, KeyError, RuntimeError) as exc:
            raise ExportError(f"tf2onnx could not convert the model: {exc}") from exc
    _attach(model, lifted)
    return model
