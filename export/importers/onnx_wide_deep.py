"""Keras Wide & Deep SavedModel -> ONNX, with TensorFlow's own predictions for parity.

Implements :class:`export.framework.FrameworkExporter` for the SavedModel that
:mod:`models.train_wide_deep` writes.

How the graph is converted, and why:

- ``tf2onnx.convert.from_function`` traces :func:`models.wide_deep.wide_deep_logit`
  (the function the Keras layer itself calls) with named input specs, so the
  ONNX inputs and output carry the schema's tensor names; the parameters are
  extra function inputs, and become ONNX initializers after conversion with
  the values of the SavedModel's variables. Converting the SavedModel signature
  directly freezes the weights into constants, and tf2onnx rewrites every
  constant's protobuf once per optimizer pass; with the upb protobuf runtime
  each rewrite leaves a copy in the message's arena: the peak grows to many
  times the weights' size (the ``reference`` preset was OOM-killed on a machine
  whose memory held its weights many times over). With weights as inputs the
  conversion's memory does not grow with the model's size, and models over 2 GB
  work: their weights go to ``model.onnx.data``.
- tf2onnx converts an integer ``FloorMod`` into ``x - (x / y) * y`` with ONNX's
  truncating integer ``Div``, which gives a negative remainder for a negative id
  (a different row than TensorFlow's). ``FloorMod`` is mapped onto ONNX ``Mod``
  with ``fmod=0`` instead (the remainder takes the divisor's sign, as in
  ``floormod``), so every id lands in ``[0, table_sizes[t])``.
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bundle.errors import BundleError, ConfigError, ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, OUTPUT
from criteo.tsv import Batch
from export.framework import own_model_source
from export.graphs.onnx_io import save_model
from export.graphs.parity import batch_arrays
from models.config import CONFIG_FILE, WideDeepConfig, load_config

logger = logging.getLogger(__name__)

#: Folder of the SavedModel inside a training output directory.
SAVED_MODEL_DIR = "saved_model"
#: Name of the ONNX batch dimension.
BATCH_DIM = "batch"
#: Rows per TensorFlow call in :meth:`WideDeepExporter.predict`.
PREDICT_CHUNK_ROWS = 65536
#: The first ONNX opset with ``Mod``.
MIN_OPSET = 10


def resolve_saved_model(directory: Path) -> tuple[Path, Path]:
    """Find the SavedModel and the folder holding its ``config.json``.

    Args:
        directory: a training output folder (``config.json`` and ``saved_model/``)
            or the ``saved_model/`` folder itself (``config.json`` in its parent).

    Returns:
        ``(saved_model_dir, config_dir)``.

    Raises:
        ExportError: no SavedModel at or under ``directory``.
        ConfigError: no ``config.json`` beside it.
    """
    directory = Path(directory)
    if (directory / SAVED_MODEL_DIR / "saved_model.pb").is_file():
        saved_model, config_dir = directory / SAVED_MODEL_DIR, directory
    elif (directory / "saved_model.pb").is_file():
        saved_model, config_dir = directory, directory.parent
    else:
        raise ExportError(
            f"no TensorFlow SavedModel in {directory}: expected {directory / SAVED_MODEL_DIR}"
            "/saved_model.pb (the output folder of Wide & Deep training) or saved_model.pb itself"
        )
    if not (config_dir / CONFIG_FILE).is_file():
        raise ConfigError(
            f"{config_dir / CONFIG_FILE} not found: the SavedModel {saved_model} needs the "
            "config.json that training writes beside it"
        )
    return saved_model, config_dir


def floormod_as_onnx_mod(ctx: Any, node: Any, name: str, args: list[Any]) -> Any:
    """tf2onnx handler: TF ``FloorMod`` -> ONNX ``Mod(fmod=0)`` (floor semantics for ints)."""
    node.type = "Mod"
    node.set_attr("fmod", 0)
    return node


def _reproduce_command(saved_model: Path, out: Path, opset: int) -> str:
    code = (
        "import logging; logging.basicConfig(level=logging.DEBUG); from pathlib import Path; "
        "from export.importers.onnx_wide_deep import WideDeepExporter; "
        f"WideDeepExporter(Path({str(saved_model)!r})).to_onnx(Path({str(out)!r}), {opset})"
    )
    return f"PYTHONPATH=. {shlex.quote(sys.executable)} -c {shlex.quote(code)}"


class WideDeepExporter:
    """A trained Wide & Deep SavedModel, loaded for conversion to ONNX.

    Args:
        saved_model: the training output folder (holding ``config.json`` and
            ``saved_model/``) or the ``saved_model/`` folder itself.

    Attributes:
        family: ``"wide_deep"``.
        config: the architecture from ``config.json``.
        saved_model_dir: the SavedModel folder that was loaded.

    Raises:
        ExportError: no SavedModel, one without a ``serving_default`` signature
            taking ``dense_features`` and ``categorical_ids``, or one whose
            variables do not match ``config.json``.
        ConfigError: no ``config.json``, or one for another model kind.
    """

    family = "wide_deep"

    def __init__(self, saved_model: Path) -> None:
        from models.wide_deep import parameter_shapes, quiet_tensorflow

        tf = quiet_tensorflow()
        self.saved_model_dir, config_dir = resolve_saved_model(Path(saved_model))
        config = load_config(config_dir)
        if not isinstance(config, WideDeepConfig):
            raise ConfigError(
                f"{config_dir / CONFIG_FILE} describes a {config.kind!r} model, not wide_deep: "
                "export it with its own exporter"
            )
        self.config: WideDeepConfig = config
        try:
            loaded = tf.saved_model.load(str(self.saved_model_dir))
        except (OSError, ValueError, tf.errors.OpError) as exc:
            raise ExportError(f"cannot load SavedModel {self.saved_model_dir}: {exc}") from exc
        signature = getattr(loaded, "signatures", {}).get("serving_default")
        if signature is None:
            raise ExportError(f"{self.saved_model_dir} has no 'serving_default' signature")
        _, inputs = signature.structured_input_signature
        if set(inputs) != {DENSE_INPUT, CATEGORICAL_INPUT} or OUTPUT not in signature.structured_outputs:
            raise ExportError(
                f"{self.saved_model_dir}: serving_default takes {sorted(inputs)} and returns "
                f"{sorted(signature.structured_outputs)}; expected inputs "
                f"{[DENSE_INPUT, CATEGORICAL_INPUT]} and output {OUTPUT!r}"
            )
        # Variables are named "<layer>/<parameter>:0"; keep them by parameter name.
        variables = {v.name.rsplit("/", 1)[-1].split(":")[0]: v for v in signature.variables}
        found = {name: tuple(v.shape.as_list()) for name, v in variables.items()}
        expected = parameter_shapes(config)
        if found != expected:
            raise ExportError(
                f"the variables of {self.saved_model_dir} do not match "
                f"{config_dir / CONFIG_FILE}: found {found}, expected {expected}"
            )
        self._loaded = loaded
        self._signature = signature
        self._variables = variables

    @property
    def table_sizes(self) -> tuple[int, ...]:
        """Rows of the 26 tables; the model reduces ids into them itself."""
        return self.config.table_sizes

    @property
    def source(self) -> dict[str, Any]:
        """The export report's record of what was exported."""
        return own_model_source(
            "bundle Wide & Deep SavedModel (config.json + saved_model/)",
            self.saved_model_dir,
            self.table_sizes,
        )

    def weight_bytes(self) -> int:
        """Bytes of the model's parameters."""
        return sum(int(v.shape.num_elements()) * v.dtype.size for v in self._variables.values())

    def to_onnx(self, out: Path, opset: int) -> None:
        """Convert the model to ONNX and write it to ``out``.

        The graph has inputs ``dense_features`` (``B x 13`` float32) and
        ``categorical_ids`` (``B x 26`` int64), output ``click_probability``
        (``B x 1`` float32) and a dynamic batch dimension named ``batch``; ids go
        through ``Mod(fmod=0)`` before the two ``Gather`` lookups. Weights over
        2 GB go to ``<out>.data`` beside the graph.

        Args:
            out: the ``.onnx`` file to write.
            opset: ONNX opset (>= 10, the first with ``Mod``).

        Raises:
            ConfigError: ``opset`` below 10.
            ExportError: the conversion or the ONNX checker failed (the log shows
                the command that reproduces it).
        """
        import tf2onnx

        from models.wide_deep import (
            parameter_shapes,
            quiet_tensorflow,
            serving_signature,
            wide_deep_logit,
        )

        tf = quiet_tensorflow()
        if opset < MIN_OPSET:
            raise ConfigError(f"Wide & Deep needs ONNX opset >= {MIN_OPSET} (for Mod), got {opset}")
        out = Path(out)
        config = self.config
        shapes = parameter_shapes(config)
        names = list(shapes)
        # The parameters are inputs of the traced function, not captured variables
        # (see the module docstring); they become initializers afterwards.
        specs = serving_signature() + [tf.TensorSpec(shapes[name], tf.float32, name=name) for name in names]

        @tf.function(input_signature=specs)
        def forward(*tensors: Any) -> dict[str, Any]:
            dense, ids, *params = tensors
            logit = wide_deep_logit(dict(zip(names, params, strict=True)), dense, ids, config)
            return {OUTPUT: tf.math.sigmoid(logit, name="probability")}

        logger.info(
            "converting %s to ONNX opset %d (%.1f MB of weights)",
            self.saved_model_dir,
            opset,
            self.weight_bytes() / 1e6,
        )
        if logger.getEffectiveLevel() > logging.DEBUG:
            logging.getLogger("tf2onnx").setLevel(logging.WARNING)
        try:
            model, _ = tf2onnx.convert.from_function(
                forward,
                input_signature=specs,
                opset=opset,
                custom_op_handlers={"FloorMod": (floormod_as_onnx_mod, [])},
            )
            self._attach_parameters(model, names)
            _check_interface(model)
            _name_batch_dim(model)
            files = save_model(model, out)
            del model
            # The path form of the checker reads external data and has no 2 GB limit.
            onnx.checker.check_model(str(out))
        except (BundleError, ValueError, TypeError, KeyError, onnx.checker.ValidationError) as exc:
            logger.error(
                "ONNX conversion of %s failed; reproduce with:\n  %s",
                self.saved_model_dir,
                _reproduce_command(self.saved_model_dir, out, opset),
            )
            if isinstance(exc, BundleError):
                raise
            raise ExportError(f"ONNX conversion of {self.saved_model_dir} failed: {exc}") from exc
        logger.info("wrote %s", ", ".join(str(f) for f in files))

    def _attach_parameters(self, model: onnx.ModelProto, names: list[str]) -> None:
        """Turn the parameter inputs of the converted graph into initializers holding
        the SavedModel's values (written in place: copying a tensor over 2 GB into a
        protobuf message fails)."""
        inputs = {value.name: value for value in model.graph.input}
        for name in names:
            if name not in inputs:
                raise ExportError(f"converted graph lost the parameter input {name!r}")
            model.graph.input.remove(inputs[name])
            values = np.ascontiguousarray(self._variables[name].numpy(), dtype="<f4")
            tensor = model.graph.initializer.add()
            tensor.name = name
            tensor.data_type = onnx.TensorProto.FLOAT
            tensor.dims.extend(values.shape)
            tensor.raw_data = values.tobytes()

    def predict(self, batch: Batch) -> np.ndarray:
        """TensorFlow's probabilities for ``batch``, from the SavedModel's signature.

        Args:
            batch: ``dense`` ``B x 13`` float32 and ``categorical`` ``B x 26`` int64.

        Returns:
            ``B x 1`` float32.

        Raises:
            ExportError: the batch's tensors have the wrong shapes.
        """
        from models.wide_deep import quiet_tensorflow

        tf = quiet_tensorflow()
        dense, ids = batch_arrays(batch)
        outputs = [
            self._signature(
                **{
                    DENSE_INPUT: tf.constant(dense[start : start + PREDICT_CHUNK_ROWS]),
                    CATEGORICAL_INPUT: tf.constant(ids[start : start + PREDICT_CHUNK_ROWS]),
                }
            )[OUTPUT].numpy()
            for start in range(0, len(dense), PREDICT_CHUNK_ROWS)
        ]
        if not outputs:
            return np.zeros((0, 1), dtype=np.float32)
        return np.concatenate(outputs).astype(np.float32, copy=False).reshape(-1, 1)

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """Nodes kept FP32 in the FP16 variant: the ``Add`` of the wide and deep
        logits and the final ``Sigmoid``.

        In FP16 a sigmoid flushes probabilities below about 6e-8 to 0 and keeps
        only 10 bits of those below 6e-5; in FP32 the output keeps its relative
        precision. Keeping more (the wide part, the last deep layer) measured no
        gain: the error comes from the FP16 embeddings and MLP.

        Args:
            model: the FP32 graph written by :meth:`to_onnx`.

        Raises:
            ExportError: the graph has no ``Sigmoid`` producing ``click_probability``.
        """
        producers = {output: node for node in model.graph.node for output in node.output}
        sigmoid = producers.get(OUTPUT)
        # tf2onnx may leave an Identity between the sigmoid and the graph output.
        while sigmoid is not None and sigmoid.op_type == "Identity":
            sigmoid = producers.get(sigmoid.input[0])
        if sigmoid is None or sigmoid.op_type != "Sigmoid":
            raise ExportError(f"no Sigmoid producing {OUTPUT!r} in the ONNX graph")
        nodes = [sigmoid.name]
        logit = producers.get(sigmoid.input[0])
        if logit is not None and logit.op_type == "Add":
            nodes.insert(0, logit.name)
        return nodes


def _check_interface(model: onnx.ModelProto) -> None:
    inputs = [value.name for value in model.graph.input]
    outputs = [value.name for value in model.graph.output]
    if sorted(inputs) != sorted([DENSE_INPUT, CATEGORICAL_INPUT]) or outputs != [OUTPUT]:
        raise ExportError(
            f"converted graph has inputs {inputs} and outputs {outputs}; expected "
            f"{[DENSE_INPUT, CATEGORICAL_INPUT]} and {[OUTPUT]}"
        )
    mods = [node for node in model.graph.node if node.op_type == "Mod"]
    if len(mods) != 1 or any(a.name == "fmod" and a.i != 0 for a in mods[0].attribute):
        raise ExportError(
            "converted graph must reduce ids with one Mod(fmod=0), found "
            f"{[(n.name, [(a.name, a.i) for a in n.attribute]) for n in mods]}"
        )


def _name_batch_dim(model: onnx.ModelProto) -> None:
    """Give the dynamic leading dimension of every input and output one name."""
    for value in [*model.graph.input, *model.graph.output]:
        dim = value.type.tensor_type.shape.dim[0]
        if dim.HasField("dim_value"):
            raise ExportError(f"{value.name} has a fixed batch dimension {dim.dim_value}")
        dim.dim_param = BATCH_DIM
