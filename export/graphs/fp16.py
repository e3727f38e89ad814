"""FP32 ONNX graph -> FP16 graph with FP32 inputs and outputs.

Precision lives in the graph (TensorRT 11 has no FP16 builder flag): weights
and most activations become FP16, while the inputs, the output and the nodes
a framework exporter names (DLRM's interaction, the final sigmoid) stay FP32.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import onnx

from bundle.errors import ExportError
from export.graphs.onnx_io import (
    EXTERNAL_DATA_THRESHOLD,
    DataFile,
    external_tensors,
    read_external,
    weights_bytes,
)

log = logging.getLogger(__name__)

#: The converter's clipping of FP32 weights into FP16 (onnxconverter-common's defaults, passed
#: explicitly so that the tensors converted here in chunks are clipped the same way).
MIN_POSITIVE = 1e-7
MAX_FINITE = 1e4


def convert_to_fp16(
    model: onnx.ModelProto, keep_fp32: list[str], source: Path | None = None, data: DataFile | None = None
) -> onnx.ModelProto:
    """Convert ``model`` to FP16 inside, keeping I/O types and ``keep_fp32`` nodes in FP32.

    The converter runs ONNX shape inference on the serialized model, which
    protobuf limits to 2 GB: for larger models (the Criteo Kaggle DLRM has
    2.2 GB of tables) the shapes are inferred from the file at ``source``
    instead, where the weights are external data.

    A model loaded without its external data (``load_external_data=False``) keeps
    it out of memory: each external FP32 weight the converter would convert is
    converted here, 64 MiB at a time, from ``source``'s data file into ``data``
    (the FP16 model's data file); the rest stay external, for
    :func:`export.graphs.onnx_io.save_model` to copy.

    Args:
        model: the FP32 graph (weights loaded, or external in ``source``'s folder).
        keep_fp32: names of nodes that must compute in FP32.
        source: the file ``model`` was loaded from (needed over 2 GB of weights).
        data: the FP16 model's data file (needed when ``model`` has external weights).

    Returns:
        A new model; Cast nodes join the FP16 and FP32 regions.

    Raises:
        ExportError: a node name is not in the graph, or the converter failed.
    """
    from onnxconverter_common import float16

    names = {node.name for node in model.graph.node}
    unknown = sorted(set(keep_fp32) - names)
    if unknown:
        raise ExportError(f"FP16 block list names nodes not in the graph: {unknown[:5]}")
    log.debug("keeping %d nodes in FP32: %s", len(keep_fp32), keep_fp32)
    large = weights_bytes(model) > EXTERNAL_DATA_THRESHOLD
    if large:
        _infer_shapes_from_file(model, source)
    streamed = _convert_external(model, set(keep_fp32), source, data)
    _unshare_kept_constants(model, set(keep_fp32))
    # Read before converting: without its own shape inference the converter changes ``model`` in place.
    own_casts = {node.name for node in model.graph.node if node.op_type == "Cast"} - set(keep_fp32)
    fp32_outputs = {
        o.name for o in model.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    try:
        with warnings.catch_warnings():
            # The converter warns for every weight it clips to the FP16 range.
            warnings.simplefilter("ignore", UserWarning)
            converted = float16.convert_float_to_float16(
                model,
                min_positive_val=MIN_POSITIVE,
                max_finite_val=MAX_FINITE,
                keep_io_types=True,
                node_block_list=list(keep_fp32),
                disable_shape_infer=large,
            )
    except Exception as exc:  # the converter raises bare Exceptions and ValueErrors alike
        raise ExportError(f"FP16 conversion failed: {exc}") from exc
    left = [
        t.name
        for t in converted.graph.initializer
        if t.name in streamed and t.data_type != onnx.TensorProto.FLOAT16
    ]
    if left:
        raise ExportError(f"FP16 conversion left weights converted in chunks typed FP32: {left[:5]}")
    _retype_casts_to_float(converted, own_casts)
    _restore_fp32_outputs(converted, fp32_outputs)
    if not large and not external_tensors(converted):
        onnx.checker.check_model(converted)  # else checked by its file once saved (ONNX Runtime loads it)
    return converted


def _convert_external(
    model: onnx.ModelProto, keep: set[str], source: Path | None, data: DataFile | None
) -> set[str]:
    """Write the external FP32 weights the converter converts (those that no kept node and no op
    of its block list reads) to ``data`` in FP16, in chunks, and point them there.

    They stay typed FLOAT: the converter then types them FLOAT16 itself, as it converts a
    loaded weight, with the same shape inference (an FP16 weight beforehand would change the
    types it infers, and make it refuse the graph as converted already).

    Returns:
        The names of the weights converted.
    """
    from onnxconverter_common import float16

    external = [tensor for tensor in external_tensors(model) if tensor.data_type == onnx.TensorProto.FLOAT]
    if not external:
        return set()
    if source is None or data is None:
        raise ExportError("FP16 conversion of weights not loaded needs their file and the FP16 data file")
    blocked = {
        name
        for node in model.graph.node
        if node.name in keep or node.op_type in float16.DEFAULT_OP_BLOCK_LIST
        for name in node.input
    }
    converted = set()
    for tensor in external:
        if tensor.name in blocked:
            continue
        log.debug("converting %s (%s) to FP16 in chunks", tensor.name, list(tensor.dims))
        data.put(tensor, (_to_fp16(chunk) for chunk in read_external(tensor, source.parent)))
        converted.add(tensor.name)
    return converted


def _to_fp16(chunk: bytes) -> bytes:
    """FP32 bytes as FP16 bytes, clipped as the converter clips (without its warning per value)."""
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        values: np.ndarray = float16.convert_np_to_float16(
            np.frombuffer(chunk, dtype=np.float32), MIN_POSITIVE, MAX_FINITE
        )
    return values.tobytes()


def _unshare_kept_constants(model: onnx.ModelProto, keep: set[str]) -> None:
    """Give each FP32 node its own copy of a weight that torch.onnx shared through an ``Identity``.

    torch.onnx writes equal weights once and passes the copies through ``Identity`` nodes
    outside the module's scope (a TorchRec cross net's zero-initialised biases are equal).
    The converter then makes the ``Identity`` FP16, and the FP32 node it feeds gets an FP16
    input that ONNX Runtime refuses. Each such ``Identity`` of an inline weight that feeds a
    kept node is replaced by a copy of the weight under its output's name, in place.
    """
    weights = {init.name: init for init in model.graph.initializer}
    kept_inputs = {name for node in model.graph.node if node.name in keep for name in node.input}
    for node in list(model.graph.node):
        source = weights.get(node.input[0]) if node.op_type == "Identity" and node.input else None
        if (
            source is None
            or node.output[0] not in kept_inputs
            or source.data_location == onnx.TensorProto.EXTERNAL
        ):
            continue
        copy = onnx.TensorProto()
        copy.CopyFrom(source)
        copy.name = node.output[0]
        model.graph.initializer.append(copy)
        model.graph.node.remove(node)


def _infer_shapes_from_file(model: onnx.ModelProto, source: Path | None) -> None:
    """Put the value infos that shape inference finds for the file at ``source`` into ``model``."""
    if source is None:
        raise ExportError("FP16 conversion of a graph over 2 GB needs the path of its file")
    inferred = source.with_name(source.name + ".shapes")
    try:
        onnx.shape_inference.infer_shapes_path(str(source), str(inferred))
        shapes = onnx.load(str(inferred), load_external_data=False)
    except (onnx.shape_inference.InferenceError, OSError) as exc:
        raise ExportError(f"shape inference of {source} failed: {exc}") from exc
    finally:
        inferred.unlink(missing_ok=True)
    del model.graph.value_info[:]
    model.graph.value_info.extend(shapes.graph.value_info)


def _retype_casts_to_float(converted: onnx.ModelProto, own: set[str]) -> None:
    """Make the graph's own ``Cast(to=FLOAT)`` nodes in the FP16 region cast to FLOAT16.

    onnxconverter-common 1.16 types the outputs of converted nodes FP16 but
    leaves a ``Cast``'s ``to`` attribute at FLOAT, so ONNX Runtime refuses the
    model (a user's graph casts ids or flags to float: tf2onnx writes Keras'
    Concatenate of int inputs, TorchScript ``.float()`` calls that way). The
    casts the converter inserts itself join the FP32 and FP16 regions and have
    names of their own, so only nodes of the original graph are retyped.
    """
    for node in converted.graph.node:
        if node.op_type != "Cast" or node.name not in own:
            continue
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == onnx.TensorProto.FLOAT:
                attribute.i = onnx.TensorProto.FLOAT16


def _restore_fp32_outputs(converted: onnx.ModelProto, fp32_outputs: set[str]) -> None:
    """Make every graph output FP32 again where the original's was.

    onnxconverter-common 1.16 with ``keep_io_types=True`` still ends a graph
    with a Cast to FP16 when the output's producer (our sigmoid) is in the
    block list, and retypes the output. Turning that Cast into a Cast to FP32
    is right whatever precision its input has (a no-op on an FP32 sigmoid).
    """
    producers = {out: node for node in converted.graph.node for out in node.output}
    for value in converted.graph.output:
        if value.name not in fp32_outputs or value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            continue
        cast = producers.get(value.name)
        if cast is None or cast.op_type != "Cast":
            raise ExportError(f"FP16 conversion left output {value.name!r} in FP16 with no Cast to fix")
        for attribute in cast.attribute:
            if attribute.name == "to":
                attribute.i = onnx.TensorProto.FLOAT
        value.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
