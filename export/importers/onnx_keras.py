"""A user's TensorFlow/Keras model -> ONNX with the bundle's served interface.

:class:`KerasSourceExporter` wraps a model that :mod:`export.importers.keras_sources`
loaded and whose inputs it matched by name: a ``tf.function`` takes the served
tensors (``dense_features`` ``B x 13`` float32, ``categorical_ids`` ``B x 26``
int64), splits them into the model's inputs (one ``Split`` per tensor, so that
:mod:`export.graphs.ids` can trace each column to its table), casts and reshapes each
to what the model declares, calls the model, and appends the sigmoid when the
model returns logits. tf2onnx converts that function with the weights kept out
of its optimizer passes (:mod:`export.importers.tf_convert`) and with TensorFlow's
``FloorMod`` as ONNX ``Mod(fmod=0)`` (as :mod:`export.importers.onnx_wide_deep` does), so a
model that reduces negative ids itself keeps doing so in ONNX. Then
:func:`export.graphs.ids.ensure_id_reduction` probes the written graph with ids at the
int64 limits and adds a modulo by each table's size where the model does not
reduce ids itself; :meth:`KerasSourceExporter.predict` feeds TensorFlow the ids
the graph's lookups then see.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bundle.errors import BundleError, ConfigError, ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from criteo.tsv import Batch
from export.graphs.ids import IdReduction, ensure_id_reduction
from export.graphs.parity import batch_arrays
from export.importers.keras_inputs import InputBinding, UserModel, one_line
from export.importers.sources import MAPPED_TENSORS, SourceOptions

logger = logging.getLogger(__name__)

#: Name of the ONNX batch dimension.
BATCH_DIM = "batch"
#: Rows per TensorFlow call in :meth:`KerasSourceExporter.predict`.
PREDICT_CHUNK_ROWS = 65536
#: The first ONNX opset with ``Mod``.
MIN_OPSET = 10


class KerasSourceExporter:
    """A user's TensorFlow/Keras model, wrapped to take and give the served tensors.

    Args:
        user: the loaded model.
        bindings: which served column feeds each of its inputs
            (:func:`export.importers.keras_inputs.map_inputs`).
        options: ``--table-sizes`` and ``--logits``.

    Raises:
        ExportError: the model's output is not ``[None]`` or ``[None, 1]`` float,
            or the model cannot be called on the mapped inputs.
    """

    family = "wide_deep"

    def __init__(self, user: UserModel, bindings: Sequence[InputBinding], options: SourceOptions) -> None:
        self.user = user
        self.bindings = tuple(bindings)
        self.options = options
        self._reduction: IdReduction | None = None  # known once to_onnx has run
        self._forward = self._build_forward()

    def _build_forward(self) -> Any:
        """The served interface as a ``tf.function``: ``B x 13`` float32 and ``B x 26`` int64
        in, ``{OUTPUT: B x 1 float32}`` out."""
        from models.wide_deep import quiet_tensorflow, serving_signature

        tf = quiet_tensorflow()
        bindings, user, logits = self.bindings, self.user, self.options.logits
        per_feature = {
            t for t in MAPPED_TENSORS if any(b.tensor == t and b.column is not None for b in bindings)
        }

        @tf.function(input_signature=serving_signature())
        def forward(dense: Any, ids: Any) -> dict[str, Any]:
            served = {DENSE_INPUT: dense, CATEGORICAL_INPUT: ids}
            # One Split per tensor: each feature a B x 1 column that export.graphs.ids can trace to its table.
            columns = {
                t: tf.split(served[t], MAPPED_TENSORS[t], axis=1, name=f"{t}_columns") for t in per_feature
            }
            feed = {}
            for b in bindings:
                value = served[b.tensor] if b.column is None else columns[b.tensor][b.column]
                if b.per_row_shape == ():
                    value = tf.reshape(value, [-1])
                if value.dtype.name != b.input.dtype:
                    value = tf.cast(value, b.input.dtype)
                feed[b.input.name] = value
            result = tf.convert_to_tensor(user.call(feed))
            if result.shape.rank not in (1, 2) or (
                result.shape.rank == 2 and result.shape[1] not in (None, 1)
            ):
                raise ExportError(
                    f"{user.what}: output {user.output} has shape {result.shape}; "
                    "expected [None] or [None, 1]"
                )
            if not result.dtype.is_floating:
                raise ExportError(f"{user.what}: output {user.output} is {result.dtype.name}, not a float")
            if result.shape.rank == 1 or result.shape[1] is None:
                result = tf.reshape(result, [-1, 1])
            if result.dtype != tf.float32:
                result = tf.cast(result, tf.float32)
            if logits:
                result = tf.math.sigmoid(result, name="probability")
            return {OUTPUT: result}

        try:
            forward.get_concrete_function()
        except BundleError:
            raise
        except Exception as exc:  # TensorFlow raises ValueError/TypeError/OpError while tracing
            raise ExportError(f"{user.what} cannot be called on its mapped inputs: {one_line(exc)}") from exc
        return forward

    @property
    def table_sizes(self) -> tuple[int, ...] | None:
        """The 26 sizes ids are reduced into (``--table-sizes`` until :meth:`to_onnx` has run)."""
        return self.options.table_sizes if self._reduction is None else self._reduction.table_sizes

    @property
    def source(self) -> dict[str, Any]:
        """The export report's record: format, path, signature, input mapping, output, table sizes."""
        reduction = self._reduction
        sizes = self.table_sizes
        return {
            "format": self.user.format,
            "path": str(self.user.path),
            "signature": self.user.signature,
            "inputs": {b.input.name: b.describe() for b in self.bindings},
            "output": self.user.output,
            "logits": self.options.logits,
            "table_sizes": None if sizes is None else list(sizes),
            "table_sizes_from": None if reduction is None else reduction.origin,
            "id_reduction_added": None if reduction is None else reduction.added,
        }

    def _command(self, out: Path, opset: int) -> str:
        """The CLI call that repeats this conversion, with debug logs."""
        parts = ["python", "-m", "export", "--verbose", "wide-deep", "--saved-model", str(self.user.path)]
        for tensor, names in self.options.input_map:
            parts += ["--input-map", f"{tensor}={','.join(names)}"]
        if self.options.table_sizes is not None:
            parts += ["--table-sizes", ",".join(map(str, self.options.table_sizes))]
        if self.options.logits:
            parts.append("--logits")
        repository = out.parents[2] if len(out.parents) > 2 else out.parent
        parts += ["--repository", str(repository), "--opset", str(opset)]
        return shlex.join(parts)

    def to_onnx(self, out: Path, opset: int) -> None:
        """Convert the wrapped model and write it to ``out``; then make it safe for any int64 id.

        The graph has inputs ``dense_features`` (``B x 13`` float32) and
        ``categorical_ids`` (``B x 26`` int64), output ``click_probability``
        (``B x 1`` float32), a dynamic batch dimension named ``batch``; weights
        over 2 GB go to ``<out>.data``.

        Raises:
            ConfigError: ``opset`` below 10 (the first with ``Mod``).
            ExportError: the conversion, the ONNX checker or the id reduction
                failed (the log shows the command that reproduces it).
        """
        from export.graphs.onnx_io import save_model
        from export.importers.onnx_wide_deep import floormod_as_onnx_mod
        from export.importers.tf_convert import convert_function

        if opset < MIN_OPSET:
            raise ConfigError(f"Wide & Deep needs ONNX opset >= {MIN_OPSET} (for Mod), got {opset}")
        out = Path(out)
        logger.info("converting %s to ONNX opset %d", self.user.what, opset)
        try:
            model = convert_function(self._forward, opset, {"FloorMod": (floormod_as_onnx_mod, [])})
            _complete_interface(model)
            files = save_model(model, out)
            del model
            # The path form of the checker reads external data and has no 2 GB limit.
            onnx.checker.check_model(str(out))
            self._reduction = ensure_id_reduction(out, self.options.table_sizes)
        except (BundleError, ValueError, TypeError, KeyError, onnx.checker.ValidationError) as exc:
            logger.error(
                "ONNX conversion of %s failed; reproduce with:\n  %s",
                self.user.what,
                self._command(out, opset),
            )
            if isinstance(exc, BundleError):
                raise
            raise ExportError(f"ONNX conversion of {self.user.what} failed: {one_line(exc)}") from exc
        logger.info(
            "wrote %s (ids: %s)",
            ", ".join(str(f) for f in files),
            "reduction added" if self._reduction.added else "the model's own handling",
        )

    def predict(self, batch: Batch) -> np.ndarray:
        """The user's model's own probabilities for ``batch`` (TensorFlow).

        Ids are reduced into the table sizes first when the export added that
        reduction (as the exported graph does); otherwise the model gets the
        raw ids and handles them its own way.

        Args:
            batch: ``dense`` ``B x 13`` float32 and ``categorical`` ``B x 26`` int64.

        Returns:
            ``B x 1`` float32.

        Raises:
            ExportError: wrong shapes; a non-finite answer; or, without
                ``--logits``, an answer outside ``[0, 1]`` (the model returns logits).
        """
        from bundle.native import import_tensorflow

        tf = import_tensorflow()
        dense, ids = batch_arrays(batch)
        if self._reduction is not None:
            ids = self._reduction.reduce(ids)
        elif self.options.table_sizes is not None:
            ids = np.mod(ids, np.asarray(self.options.table_sizes, dtype=np.int64)[None, :])
        outputs = [
            self._forward(
                tf.constant(dense[start : start + PREDICT_CHUNK_ROWS]),
                tf.constant(ids[start : start + PREDICT_CHUNK_ROWS]),
            )[OUTPUT].numpy()
            for start in range(0, len(dense), PREDICT_CHUNK_ROWS)
        ]
        if not outputs:
            return np.zeros((0, 1), dtype=np.float32)
        result = np.concatenate(outputs).astype(np.float32, copy=False).reshape(-1, 1)
        if not np.all(np.isfinite(result)):
            raise ExportError(
                f"{self.user.what} gives non-finite outputs for {int(np.sum(~np.isfinite(result)))} rows"
            )
        if not self.options.logits and np.any((result < 0) | (result > 1)):
            raise ExportError(
                f"{self.user.what} gives values outside [0, 1] (from {result.min():.3g} to "
                f"{result.max():.3g}): if it returns logits, export it with --logits"
            )
        return result

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """Nodes kept FP32 in the FP16 variant: the final ``Sigmoid`` and, when its input
        is the ``Add`` of two computed logits (wide + deep), that ``Add``; and every
        ``Cast`` to FP32 (see :func:`casts_to_fp32`).

        Returns:
            Their names; no ``Sigmoid`` when none produces the output (the graph
            then computes in FP16 up to its output).
        """
        return sigmoid_and_logit_sum(model) + casts_to_fp32(model)


def sigmoid_and_logit_sum(model: onnx.ModelProto) -> list[str]:
    """The ``Sigmoid`` producing :data:`OUTPUT` (through shape-only nodes) and its ``Add`` of two
    computed logits, if it has one; ``[]`` without such a ``Sigmoid``."""
    producers = {output: node for node in model.graph.node for output in node.output}
    constants = {t.name for t in model.graph.initializer}
    constants |= {node.output[0] for node in model.graph.node if node.op_type == "Constant"}
    node = producers.get(OUTPUT)
    while node is not None and node.op_type in ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"):
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Sigmoid":
        logger.info("no Sigmoid produces %s: the FP16 variant keeps no node in FP32", OUTPUT)
        return []
    nodes = [node.name]
    logit = producers.get(node.input[0])
    if logit is not None and logit.op_type == "Add" and not any(i in constants for i in logit.input):
        nodes.insert(0, logit.name)
    return nodes


def casts_to_fp32(model: onnx.ModelProto) -> list[str]:
    """The ``Cast`` nodes to FP32 (tf2onnx casts ids to float to compare them, Keras casts inputs).

    The FP16 converter retypes every FP32 tensor but leaves a ``Cast``'s ``to``
    attribute, so such a node would output FP32 where the graph now declares FP16
    (ONNX Runtime refuses the model). Kept FP32, each gets a ``Cast`` to FP16 after it.
    """
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "Cast"
        and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in node.attribute)
    ]


def _complete_interface(model: onnx.ModelProto) -> None:
    """Check the converted graph's inputs and output, add back a served input the model
    ignores (tf2onnx drops unused inputs), and name the batch dimension (in place).

    Raises:
        ExportError: an unexpected input or output.
    """
    from onnx import TensorProto, helper

    graph = model.graph
    expected = {
        DENSE_INPUT: (TensorProto.FLOAT, NUM_DENSE),
        CATEGORICAL_INPUT: (TensorProto.INT64, NUM_CATEGORICAL),
    }
    inputs = [value.name for value in graph.input]
    outputs = [value.name for value in graph.output]
    if set(inputs) - set(expected) or outputs != [OUTPUT]:
        raise ExportError(
            f"converted graph has inputs {inputs} and outputs {outputs}; expected "
            f"{list(expected)} and {[OUTPUT]}"
        )
    if len(inputs) < len(expected):
        ordered = []
        for name, (dtype, width) in expected.items():
            value = next((v for v in graph.input if v.name == name), None)
            if value is None:
                logger.warning("the model does not use %s; the served model still takes it", name)
                value = helper.make_tensor_value_info(name, dtype, [BATCH_DIM, width])
            ordered.append(onnx.ValueInfoProto.FromString(value.SerializeToString()))
        del graph.input[:]
        graph.input.extend(ordered)
    for value in [*graph.input, *graph.output]:
        shape = value.type.tensor_type.shape
        if len(shape.dim) == 0:
            shape.dim.add()
            shape.dim.add().dim_value = 1
        dim = shape.dim[0]
        if dim.HasField("dim_value"):
            raise ExportError(f"{value.name} has a fixed batch dimension {dim.dim_value}")
        dim.dim_param = BATCH_DIM
