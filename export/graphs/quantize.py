"""FP32 ONNX graph -> INT8 graph: ONNX Runtime quantization of the MLP layers.

What is quantized: every ``MatMul``/``Gemm`` whose weight is a constant 2-D
initializer with more than one output column, i.e. the layers of the MLPs
(:func:`int8_nodes`). What stays FP32: the embedding ``Gather`` (a lookup,
not arithmetic: uint8 tables would save memory, not time, as ONNX Runtime
dequantizes each looked-up row; their speed is not measured here), DLRM's
interaction (its ``MatMul`` multiplies two activations) and every node a
framework exporter keeps in FP32 for the FP16 variant (the final ``Sigmoid``,
Wide & Deep's logit sum), the 1-column output layers (no speed to gain, and
their error lands on the logit unaveraged), and Wide & Deep's 13 x 1 wide
``MatMul``.

The quantizer never sees the tables: it gets the graph with each large table's lookup
cut out (:mod:`export.graphs.lookup_cut`), whose outputs become inputs that the whole
graph computes for the calibration rows, and the lookups go back into the quantized
graph. A DLRM with 4.4 GB of tables is thus quantized in a small fraction of that
memory (the quantizer loads the graph it is given more than once; the peak is measured
in benchmarks/in_graph_export/summary.md).

Two methods, both ONNX Runtime's own quantizer (``onnxruntime.quantization``),
writing only standard ONNX operators, so Triton's C++ onnxruntime backend in
the NGC image runs the same file:

- ``static``: activation ranges calibrated on labeled rows
  (:class:`BatchCalibrationReader`, MinMax), QDQ format, weights per output
  channel. ONNX Runtime fuses each ``DequantizeLinear -> Gemm/MatMul``
  group into ``QGemm``/``QLinearMatMul`` (u8 activations, s8 weights: the
  VNNI / AMX-INT8 kernels of MLAS), with a ``QuantizeLinear`` of each
  layer's input. Each row's answer depends only on that row.
- ``dynamic``: weights INT8, activation scales computed per batch at run time
  (``DynamicQuantizeLinear`` + ``MatMulInteger``, fused by ONNX Runtime into
  ``DynamicQuantizeMatMul``). No calibration, but a row's answer then depends
  on the other rows of its batch (the batch's min and max set the scale), so
  the same row can get a slightly different probability whenever the dynamic
  batcher groups it with other requests. ``Gemm`` layers are rewritten as
  ``MatMul`` + ``Add`` first: the dynamic quantizer only handles ``MatMul``.

Which method the export uses by default, and why, is measured in
``benchmarks/cpu/precision.md`` (see :data:`DEFAULT_METHOD`).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_model

from bundle.errors import ConfigError, ExportError
from criteo.tsv import Batch
from export.graphs.lookup_cut import cut_lookups, lookup_outputs, put_back_lookups
from export.graphs.onnx_io import EXTERNAL_DATA_THRESHOLD, save_model, weights_bytes

log = logging.getLogger(__name__)

Int8Method = Literal["static", "dynamic"]
#: A batch of rows -> the graph's inputs.
Feeds = Callable[[Batch], dict[str, np.ndarray]]
INT8_METHODS: tuple[str, ...] = ("static", "dynamic")
#: The method the export uses unless told otherwise: static. Measured on the reference DLRM and
#: Wide & Deep (benchmarks/cpu/precision.md), both methods pass the accuracy gate and both beat
#: the FP32 ceiling served; dynamic is faster, but its answer for a row moves with the rows the
#: dynamic batcher happens to group it with (the report's *row moves with batch* column). A
#: served CTR model must give one row one answer, so static is the default and dynamic is
#: opt-in (``--int8-method dynamic``).
DEFAULT_METHOD: Int8Method = "static"
#: Operators whose constant-weight instances are the MLP layers.
MLP_OPS = ("MatMul", "Gemm")
#: Operators a quantized graph computes its MLPs with (in the file, before ONNX Runtime's fusions).
QUANTIZED_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul", "QGemm"}
)


@dataclass(frozen=True)
class QuantizeOptions:
    """How to quantize the MLP layers.

    Args:
        method: ``static`` (calibrated activation ranges, QDQ) or ``dynamic``
            (activation scales per batch at run time).
        per_channel: one weight scale per output column (else one per layer).
        reduce_range: 7-bit weights, for CPUs without VNNI whose u8 x s8 products
            can saturate (not needed on AVX512-VNNI or AMX).
        calibration_rows: rows run through the FP32 graph to calibrate (static only).
        calibration_chunk: rows per calibration batch.
    """

    method: Int8Method = DEFAULT_METHOD
    per_channel: bool = True
    reduce_range: bool = False
    calibration_rows: int = 2048
    calibration_chunk: int = 512

    def __post_init__(self) -> None:
        if self.method not in INT8_METHODS:
            raise ConfigError(f"unknown INT8 method {self.method!r}; choose one of {', '.join(INT8_METHODS)}")
        if self.calibration_rows < 1 or self.calibration_chunk < 1:
            raise ConfigError(
                f"calibration_rows and calibration_chunk must be >= 1, got "
                f"{self.calibration_rows} and {self.calibration_chunk}"
            )


@dataclass(frozen=True)
class QuantizedGraph:
    """What :func:`quantize_int8` did, for the export report.

    Attributes:
        quantized_nodes: names (in the FP32 graph) of the layers now INT8.
        fp32_nodes: matrix products left in FP32 on purpose.
        settings: method, weight granularity, calibration rows and source, versions.
    """

    quantized_nodes: list[str]
    fp32_nodes: list[str]
    settings: dict[str, Any] = field(default_factory=dict)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {init.name: init for init in model.graph.initializer}


def int8_nodes(model: onnx.ModelProto, keep_fp32: list[str]) -> tuple[list[str], list[str]]:
    """Split the matrix products of ``model`` into INT8 and FP32 ones.

    A node is quantized when it is a ``MatMul`` or ``Gemm`` whose weight (second
    input) is a 2-D initializer with more than one column (``K x N``, ``N > 1``;
    for a ``Gemm`` with ``transB`` the stored ``N x K``) and it is not in
    ``keep_fp32``.

    Args:
        model: the FP32 graph (weights may be external; only their shapes are read).
        keep_fp32: node names that must stay FP32 (the exporter's ``fp32_nodes``).

    Returns:
        ``(quantized, kept)``: node names in graph order.
    """
    initializers = _initializers(model)
    keep = set(keep_fp32)
    quantized: list[str] = []
    kept: list[str] = []
    for node in model.graph.node:
        if node.op_type not in MLP_OPS:
            continue
        weight = initializers.get(node.input[1]) if len(node.input) > 1 else None
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        columns = (weight.dims[0] if trans_b else weight.dims[1]) if weight is not None else 0
        if weight is None or len(weight.dims) != 2 or columns <= 1 or node.name in keep:
            kept.append(node.name)
        else:
            quantized.append(node.name)
    return quantized, kept


def gemm_as_matmul(model: onnx.ModelProto, nodes: list[str]) -> dict[str, str]:
    """Rewrite each ``Gemm`` named in ``nodes`` as ``MatMul`` + ``Add``, in place.

    ``Y = A W^T + C`` (``transB=1``, as torch writes ``nn.Linear``) becomes
    ``MatMul(A, W_kn)`` then ``Add(., C)`` with ``W_kn`` the transposed weight
    (``K x N``), so ONNX Runtime's dynamic quantizer, which handles ``MatMul``
    only, can quantize the layer.

    Returns:
        ``{new MatMul name: Gemm name}`` for the rewritten nodes.

    Raises:
        ExportError: a ``Gemm`` with ``transA``, or ``alpha``/``beta`` other than 1.
    """
    initializers = _initializers(model)
    wanted = set(nodes)
    renamed: dict[str, str] = {}
    rewritten: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type != "Gemm" or node.name not in wanted:
            rewritten.append(node)
            continue
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("transA", 0) or attributes.get("alpha", 1.0) != 1.0:
            raise ExportError(f"{node.name}: cannot rewrite a Gemm with transA or alpha != 1 as MatMul")
        if len(node.input) > 2 and attributes.get("beta", 1.0) != 1.0:
            raise ExportError(f"{node.name}: cannot rewrite a Gemm with beta != 1 as MatMul + Add")
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if attributes.get("transB", 0):
            weight = weight.T
        weight_name = f"{node.input[1]}_kxn"
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), weight_name))
        matmul_name = f"{node.name}_MatMul"
        renamed[matmul_name] = node.name
        if len(node.input) > 2 and node.input[2]:
            product = f"{node.output[0]}_matmul"
            rewritten.append(helper.make_node("MatMul", [node.input[0], weight_name], [product], matmul_name))
            rewritten.append(
                helper.make_node("Add", [product, node.input[2]], [node.output[0]], f"{node.name}_Add")
            )
        else:
            rewritten.append(
                helper.make_node("MatMul", [node.input[0], weight_name], [node.output[0]], matmul_name)
            )
    del model.graph.node[:]
    model.graph.node.extend(rewritten)
    used = {name for node in model.graph.node for name in node.input}
    unused = [init for init in model.graph.initializer if init.name not in used]
    for init in unused:
        model.graph.initializer.remove(init)
    return renamed


def _dynamic_renames(model: onnx.ModelProto, nodes: list[str]) -> tuple[list[str], dict[str, str]]:
    """The node names the dynamic quantizer must see: Gemms rewritten as MatMul + Add."""
    kinds = {node.name: node.op_type for node in model.graph.node}
    renamed = gemm_as_matmul(model, [name for name in nodes if kinds[name] == "Gemm"])
    back = {gemm: matmul for matmul, gemm in renamed.items()}
    return [back.get(name, name) for name in nodes], renamed


def _inputs(batch: Batch) -> dict[str, np.ndarray]:
    """``batch.inputs()``, a subclass's own (bags of any size take values and lengths)."""
    return batch.inputs()


class BatchCalibrationReader:
    """Feeds labeled rows to ONNX Runtime's calibrator, ``chunk`` rows at a time.

    Duck-types ``onnxruntime.quantization.CalibrationDataReader`` (whose
    ``__subclasshook__`` accepts any class with ``get_next``): ``get_next``
    returns ``{input name: B x ...}`` until the rows run out, then None.

    Args:
        rows: the calibration rows (``dense_features`` ``N x 13``, ``categorical_ids`` ``N x 26``).
        chunk: rows per batch ``B``.
        feeds: a batch's inputs to the graph (default: the schema's tensors, ``Batch.inputs``;
            a hot/cold dense model takes the stage's answer instead).
        lookups: for a graph without its table lookups (:func:`export.graphs.lookup_cut.cut_lookups`):
            the whole graph's inputs -> the lookups' outputs, which the cut graph takes as inputs.
    """

    def __init__(
        self,
        rows: Batch,
        chunk: int,
        feeds: Feeds | None = None,
        lookups: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
    ) -> None:
        make = feeds or _inputs
        self._lookups = lookups
        self._batches: Iterator[dict[str, np.ndarray]] = (
            make(rows.slice(start, start + chunk)) for start in range(0, len(rows), chunk)
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        """The next batch of inputs, or None after the last."""
        inputs = next(self._batches, None)
        if inputs is None or self._lookups is None:
            return inputs
        return {**inputs, **self._lookups(inputs)}


def quantize_int8(
    fp32_path: Path,
    out: Path,
    keep_fp32: list[str],
    options: QuantizeOptions,
    calibration: Batch | None = None,
    calibration_source: str = "",
    feeds: Feeds | None = None,
) -> QuantizedGraph:
    """Write the INT8 variant of the FP32 graph at ``fp32_path`` to ``out``.

    Args:
        fp32_path: the FP32 ONNX file (external data beside it is found).
        out: the ``model.onnx`` to write (weights over 2 GB go to ``model.onnx.data``).
        keep_fp32: nodes that must stay FP32 (the exporter's ``fp32_nodes``).
        options: method and weight granularity.
        calibration: rows for the static method's activation ranges (>= 1 row).
        calibration_source: where the rows came from, for the report.
        feeds: how calibration rows become the graph's inputs (see :class:`BatchCalibrationReader`).

    Returns:
        The quantized and kept nodes and the settings used.

    Raises:
        ExportError: nothing to quantize, no calibration rows for the static
            method, or ONNX Runtime's quantizer failed.
    """
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    model = onnx.load(str(fp32_path), load_external_data=False)
    nodes, kept = int8_nodes(model, keep_fp32)
    if not nodes:
        raise ExportError(f"{fp32_path}: no MatMul/Gemm layer with a constant weight to quantize")
    settings: dict[str, Any] = {
        "method": options.method,
        "weights": "int8 " + ("per output channel" if options.per_channel else "per tensor"),
        "activations": "uint8 " + ("calibrated (MinMax), QDQ" if options.method == "static" else "per batch"),
        "reduce_range": options.reduce_range,
        "onnxruntime": metadata.version("onnxruntime"),
    }
    if options.method == "static" and (calibration is None or len(calibration) == 0):
        raise ExportError("static INT8 quantization needs calibration rows")
    # The quantizer sees the graph without its tables: they are never loaded here.
    cut = cut_lookups(model)
    load_external_data_for_model(model, str(fp32_path.parent))
    if cut.nodes:
        log.info("the quantizer sees the graph without its %d table lookups", len(cut.nodes))
    log.info("quantizing %d layers to INT8 (%s): %s", len(nodes), options.method, nodes)
    try:
        with tempfile.TemporaryDirectory(prefix="int8-") as tmp, _quiet_root_logger():
            source = Path(tmp) / "fp32.onnx"
            target = Path(tmp) / "int8.onnx"
            names = nodes
            if options.method == "dynamic":
                names, _ = _dynamic_renames(model, nodes)
            save_model(model, source)
            large = weights_bytes(model) > EXTERNAL_DATA_THRESHOLD
            del model
            if options.method == "dynamic":
                quantize_dynamic(
                    source,
                    target,
                    op_types_to_quantize=["MatMul"],
                    nodes_to_quantize=names,
                    per_channel=options.per_channel,
                    reduce_range=options.reduce_range,
                    weight_type=QuantType.QInt8,
                    use_external_data_format=large,
                    extra_options={"MatMulConstBOnly": True},
                )
            else:
                rows = cast(Batch, calibration)
                whole = lookup_outputs(fp32_path, cut.output_names) if cut.nodes else contextlib.nullcontext()
                with whole as lookups:
                    reader = BatchCalibrationReader(rows, options.calibration_chunk, feeds, lookups)
                    quantize_static(
                        source,
                        target,
                        reader,
                        quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(MLP_OPS),
                        nodes_to_quantize=names,
                        per_channel=options.per_channel,
                        reduce_range=options.reduce_range,
                        activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax,
                        use_external_data_format=large,
                    )
                settings["calibration_rows"] = len(rows)
                settings["calibration_data"] = calibration_source or "given rows"
            quantized = onnx.load(str(target))
            put_back_lookups(quantized, cut)
            files = save_model(quantized, out, source_dir=fp32_path.parent)
            del quantized
            # The checker takes the path so that graphs over 2 GB are checked too.
            onnx.checker.check_model(str(files[0]))
    except ExportError:
        raise
    except Exception as exc:  # onnxruntime's quantizer raises bare Exceptions, ValueErrors, ...
        raise ExportError(f"INT8 quantization of {fp32_path} ({options.method}) failed: {exc}") from exc
    return QuantizedGraph(nodes, kept, settings)


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """Silence ONNX Runtime's quantizer, which logs through the root logger: an INFO line per
    tensor it leaves alone, and a WARNING to run its shape pre-processing (which only matters
    for graphs with unknown shapes; the layers quantized here have constant weights)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def quantized_op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many of each quantization operator ``model`` holds (empty: not quantized)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZED_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
