"""FP32 ONNX graph -> FP16 graph with FP32 inputs and outputs.

Precision lives in the graph (TensorRT 11 has no FP16 builder flag): weights
and most activations become FP16, while the inputs, the output and the nodes
a framework exporter names (DLRM's interaction, the final sigmoid) stay FP32.
"""

from __future__ import annotations

import logging
import warnings

import onnx

from bundle.errors import ExportError

log = logging.getLogger(__name__)


def convert_to_fp16(model: onnx.ModelProto, keep_fp32: list[str]) -> onnx.ModelProto:
    """Convert ``model`` to FP16 inside, keeping I/O types and ``keep_fp32`` nodes in FP32.

    Args:
        model: the FP32 graph (weights loaded).
        keep_fp32: names of nodes that must compute in FP32.

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
    try:
        with warnings.catch_warnings():
            # The converter warns for every weight it clips to the FP16 range.
            warnings.simplefilter("ignore", UserWarning)
            converted = float16.convert_float_to_float16(
                model, keep_io_types=True, node_block_list=list(keep_fp32)
            )
    except Exception as exc:  # the converter raises bare Exceptions and ValueErrors alike
        raise ExportError(f"FP16 conversion failed: {exc}") from exc
    onnx.checker.check_model(converted)
    return converted
