"""Any TensorFlow SavedModel or ``.keras`` file, found, loaded, and its inputs matched to the served tensors.

What ``python -m export wide-deep --saved-model PATH`` was given is detected from the path
(:func:`detect_format`):

- a folder with ``config.json`` (the output of ``models train wide-deep``, or its
  ``saved_model/`` folder): :class:`export.onnx_wide_deep.WideDeepExporter`,
  which re-traces the bundle's own model (see there for why);
- any other SavedModel folder (``tf.saved_model.save``, Keras ``model.export()``):
  its ``serving_default`` signature, or its only signature;
- a ``.keras`` file: the model ``keras.saving.load_model`` rebuilds.

The user's own graph is converted (:class:`export.onnx_keras.KerasSourceExporter`),
not a re-trace of the bundle's model. Its inputs are matched by name, never by
position (:func:`map_inputs`): the served ``dense_features`` (``B x 13`` float32)
and ``categorical_ids`` (``B x 26`` int64) feed inputs of those names, one input
per feature (``I1..I13``, ``C1..C26``), or the names ``--input-map`` gives.
"""

from __future__ import annotations

import logging
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ExportError
from criteo.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE
from export.framework import FrameworkExporter
from export.sources import DEFAULT_FEATURE_NAMES, MAPPED_TENSORS, SourceOptions

logger = logging.getLogger(__name__)

#: The signature used when a SavedModel has several.
DEFAULT_SIGNATURE = "serving_default"
#: Model input dtypes the wrapper can feed (by casting the served tensors).
FEEDABLE_DTYPES = frozenset({"int32", "int64", "float16", "bfloat16", "float32", "float64"})
#: What ``--saved-model`` accepts, for error messages.
EXPECTED_FORMS = (
    "a TensorFlow SavedModel folder (saved_model.pb: tf.saved_model.save or Keras model.export()), "
    "a .keras file (Keras model.save), or the output folder of `models train wide-deep` (config.json)"
)
_INPUT_MAP_EXAMPLE = f"--input-map {DENSE_INPUT}=int_0..int_12 --input-map {CATEGORICAL_INPUT}=cat_0..cat_25"


@dataclass(frozen=True)
class ModelInput:
    """One input of the user's model, as its signature declares it.

    Attributes:
        name: the input's name (the signature's keyword, or the Keras ``Input`` name).
        dtype: numpy-style dtype name: ``float32``, ``int64``, ...
        shape: dimensions with the batch first (None: any size), or None when
            even the rank is unknown.
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...] | None

    def describe(self) -> str:
        """``name dtype [None, 1]``, as error messages list it."""
        dims = "?" if self.shape is None else ", ".join(str(d) for d in self.shape)
        return f"{self.name} {self.dtype} [{dims}]"


@dataclass(frozen=True)
class InputBinding:
    """Which part of a served tensor feeds one input of the user's model.

    Attributes:
        input: the model's input.
        tensor: the served tensor, :data:`DENSE_INPUT` or :data:`CATEGORICAL_INPUT`.
        column: the feature's column (``B`` or ``B x 1`` input), or None for the
            whole ``B x 13`` / ``B x 26`` tensor.
    """

    input: ModelInput
    tensor: str
    column: int | None

    @property
    def per_row_shape(self) -> tuple[int, ...]:
        """What the model takes per row: ``()`` (shape ``B``), ``(1,)`` or ``(width,)``."""
        shape = self.input.shape
        if self.column is None:
            return (MAPPED_TENSORS[self.tensor],)
        return () if shape is not None and len(shape) == 1 else (1,)

    def describe(self) -> str:
        """Where the input's values come from: ``dense_features[:, 3]`` or ``categorical_ids``."""
        return self.tensor if self.column is None else f"{self.tensor}[:, {self.column}]"


def _shape_problem(binding: InputBinding) -> str | None:
    """Why ``binding``'s input cannot take its slice of the served tensor (None: it can)."""
    model_input, shape = binding.input, binding.input.shape
    if model_input.dtype not in FEEDABLE_DTYPES:
        return f"{model_input.name} is {model_input.dtype} (feedable: {', '.join(sorted(FEEDABLE_DTYPES))})"
    if shape is None:
        return None
    if shape and shape[0] is not None:
        return f"{model_input.name} has a fixed batch size {shape[0]} (export it with a None batch dimension)"
    if binding.column is None:
        width = MAPPED_TENSORS[binding.tensor]
        if len(shape) != 2 or shape[1] not in (None, width):
            return f"{model_input.name} has shape {list(shape)}, not [None, {width}] for {binding.tensor}"
    elif len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] not in (None, 1)):
        return f"{model_input.name} has shape {list(shape)}, not [None] or [None, 1] for one feature"
    return None


def map_inputs(inputs: Sequence[ModelInput], options: SourceOptions, what: str) -> tuple[InputBinding, ...]:
    """Match the model's inputs, by name, to the served tensors.

    Each served tensor feeds the names ``options.input_map`` gives for it; else
    an input of its own name (``B x 13`` / ``B x 26``); else one input per
    feature named ``I1..I13`` / ``C1..C26``. Every input of the model must be
    fed, by exactly one feature or tensor.

    Args:
        inputs: the model's inputs.
        options: the user's ``--input-map``.
        what: the model, for messages (``the SavedModel /path``).

    Returns:
        One binding per model input, in the served order (dense columns, then ids).

    Raises:
        ExportError: one line listing the model's inputs, what was expected and
            what did not fit (an unfed input, a mapped name the model lacks, a
            dtype or shape that cannot be fed).
    """
    by_name = {i.name: i for i in inputs}
    problems: list[str] = []
    bound: dict[str, InputBinding] = {}
    for tensor in MAPPED_TENSORS:
        names = options.mapped(tensor)
        defaults = DEFAULT_FEATURE_NAMES[tensor]
        if names is None:
            if tensor in by_name:
                names = (tensor,)
            elif any(name in by_name for name in defaults):
                names = defaults
            else:
                problems.append(f"no input named {tensor} or {defaults[0]}..{defaults[-1]}")
                continue
        lacking = [name for name in names if name not in by_name]
        if lacking:
            named = f"named by --input-map for {tensor}" if options.mapped(tensor) else f"for {tensor}"
            problems.append(f"the model has no input {', '.join(lacking)} ({named})")
        for i, name in enumerate(names):
            if name in bound:
                problems.append(f"{name} is fed twice ({bound[name].describe()} and {tensor})")
            elif name in by_name:
                bound[name] = InputBinding(by_name[name], tensor, None if len(names) == 1 else i)
    unfed = [i.name for i in inputs if i.name not in bound]
    if unfed:
        problems.append(f"nothing feeds {', '.join(unfed)}")
    problems += [p for p in (_shape_problem(b) for b in bound.values()) if p is not None]
    if problems:
        raise ExportError(
            f"{what} has inputs that cannot be mapped: {'; '.join(problems)}. It takes "
            f"{', '.join(i.describe() for i in inputs) or 'no inputs'}; expected {DENSE_INPUT} "
            f"[None, {NUM_DENSE}] or I1..I13, and {CATEGORICAL_INPUT} [None, {NUM_CATEGORICAL}] or "
            f"C1..C26 (each [None] or [None, 1]), or other names given with {_INPUT_MAP_EXAMPLE}"
        )
    for binding in bound.values():
        if binding.tensor == DENSE_INPUT and binding.input.dtype.startswith("int"):
            logger.warning(
                "%s is %s: the served dense features (log1p of the counts) are truncated to integers",
                binding.input.name, binding.input.dtype,
            )  # fmt: skip
    order = {tensor: i for i, tensor in enumerate(MAPPED_TENSORS)}
    return tuple(sorted(bound.values(), key=lambda b: (order[b.tensor], b.column or 0)))


def detect_format(path: Path) -> str:
    """What ``path`` holds: ``bundle`` (training output), ``savedmodel`` or ``keras``.

    Raises:
        ExportError: nothing there, or nothing of :data:`EXPECTED_FORMS` (one line
            naming what was found).
    """
    from models.config import CONFIG_FILE

    path = Path(path)
    if path.is_dir():
        if (path / CONFIG_FILE).is_file():
            return "bundle"
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            if path.name == "saved_model" and (path.parent / CONFIG_FILE).is_file():
                return "bundle"
            return "savedmodel"
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        inner = sorted(str(p.parent) for p in path.glob("*/saved_model.pb"))
        found = f"a folder holding {', '.join(entries[:8])}{' ...' if len(entries) > 8 else ''}"
        hint = f" (a SavedModel is in {inner[0]}: pass that)" if inner else ""
        raise ExportError(
            f"{path} is {found if entries else 'an empty folder'}, not a model{hint}; "
            f"expected {EXPECTED_FORMS}"
        )
    if path.is_file():
        size = path.stat().st_size
        if path.suffix == ".keras":
            if zipfile.is_zipfile(path):
                return "keras"
            found = f"a .keras file that is not a Keras archive (not a zip; {size} bytes)"
        elif path.suffix in (".h5", ".hdf5"):
            found = "a legacy Keras HDF5 file (save it again with model.save('model.keras'))"
        elif path.name in ("saved_model.pb", "saved_model.pbtxt"):
            found = f"the graph file of a SavedModel (pass its folder {path.parent})"
        else:
            found = f"a file of {size} bytes"
        raise ExportError(f"{path} is {found}, not a model; expected {EXPECTED_FORMS}")
    raise ExportError(f"{path} does not exist; expected {EXPECTED_FORMS}")


@dataclass(frozen=True)
class UserModel:
    """The user's model, loaded, with its calling convention.

    Attributes:
        format: ``savedmodel`` or ``keras``.
        path: where it was loaded from.
        signature: the SavedModel signature used (None for a ``.keras`` file).
        inputs: the model's inputs.
        output: the name of its single output.
        call: ``call({input name: tensor}) -> output tensor``.
        owner: the loaded object, kept alive with its variables.
    """

    format: str
    path: Path
    signature: str | None
    inputs: tuple[ModelInput, ...]
    output: str
    call: Callable[[dict[str, Any]], Any]
    owner: Any

    @property
    def what(self) -> str:
        """The model, for messages: ``the SavedModel /path``."""
        return f"the {'SavedModel' if self.format == 'savedmodel' else 'Keras model'} {self.path}"


def one_line(exc: BaseException) -> str:
    """An exception's message on one line, at most 300 characters."""
    text = " ".join(str(exc).split())
    return text[:300] + (" ..." if len(text) > 300 else "") if text else type(exc).__name__


def _one_output(names: Sequence[str], what: str) -> str:
    if len(names) != 1:
        raise ExportError(
            f"{what} has {len(names)} outputs ({', '.join(names) or 'none'}); the served model needs "
            f"one: the click probability (or its logit, with --logits), [None] or [None, 1]"
        )
    return names[0]


def load_saved_model(path: Path) -> UserModel:
    """Load a SavedModel folder and pick its signature.

    Raises:
        ExportError: it does not load; it has no signature, or several and none
            named ``serving_default``; its signature has more than one output.
    """
    from models.wide_deep import quiet_tensorflow

    tf = quiet_tensorflow()
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:  # the loader raises many types (OSError, ValueError, OpError, ...)
        raise ExportError(f"cannot load the SavedModel {path}: {one_line(exc)}") from exc
    signatures = dict(getattr(loaded, "signatures", {}))
    if DEFAULT_SIGNATURE in signatures:
        name = DEFAULT_SIGNATURE
    elif len(signatures) == 1:
        name = next(iter(signatures))
    elif not signatures:
        raise ExportError(
            f"the SavedModel {path} has no signature: save it with tf.saved_model.save(module, DIR, "
            "signatures={'serving_default': function}) or with Keras model.export(DIR)"
        )
    else:
        raise ExportError(
            f"the SavedModel {path} has signatures {', '.join(sorted(signatures))} and none named "
            f"{DEFAULT_SIGNATURE!r}: save the one to serve as {DEFAULT_SIGNATURE!r}"
        )
    function = signatures[name]
    _, specs = function.structured_input_signature
    inputs = tuple(
        ModelInput(
            key,
            spec.dtype.name,
            None if spec.shape.rank is None else tuple(spec.shape.as_list()),
        )
        for key, spec in specs.items()
    )
    output = _one_output(sorted(function.structured_outputs), f"the SavedModel {path} ({name})")

    def call(feed: dict[str, Any]) -> Any:
        return function(**feed)[output]

    return UserModel("savedmodel", path, name, inputs, output, call, loaded)


def load_keras(path: Path) -> UserModel:
    """Rebuild the model of a ``.keras`` file.

    Raises:
        ExportError: it cannot be rebuilt here (custom layers not importable,
            ``Lambda`` layers refused in safe mode), it has no known inputs
            (a subclassed model), or it has more than one output.
    """
    import keras

    from models.wide_deep import check_backend

    check_backend()
    try:
        model = keras.saving.load_model(str(path), compile=False)
    except Exception as exc:  # deserialization raises TypeError, ValueError, KeyError, ...
        missing = re.search(r"Could not locate (?:class|function) '([^']+)'", str(exc))
        reason = f"custom object {missing[1]!r} is not defined here" if missing else one_line(exc)
        raise ExportError(
            f"cannot rebuild the Keras model {path} ({reason}): a model with custom layers or Lambda "
            "layers loads only where its code is; there, write a SavedModel with model.export(DIR) "
            "and pass DIR"
        ) from exc
    try:
        structure = model.input
    except (AttributeError, ValueError) as exc:
        raise ExportError(
            f"the Keras model {path} has no known inputs (a subclassed model?): write a SavedModel "
            "with model.export(DIR) and pass DIR"
        ) from exc
    if isinstance(structure, dict):
        named = list(structure.items())
    elif isinstance(structure, list | tuple):
        named = [(tensor.name, tensor) for tensor in structure]
    else:
        named = [(structure.name, structure)]
    inputs = tuple(ModelInput(name, str(t.dtype), tuple(t.shape)) for name, t in named)
    output = _one_output(list(getattr(model, "output_names", [])), f"the Keras model {path}")

    def call(feed: dict[str, Any]) -> Any:
        if isinstance(structure, dict):
            arguments: Any = {name: feed[name] for name in structure}
        elif isinstance(structure, list | tuple):
            arguments = [feed[name] for name, _ in named]
        else:
            arguments = feed[named[0][0]]
        result = model(arguments, training=False)
        if isinstance(result, dict):
            return next(iter(result.values()))
        return result[0] if isinstance(result, list | tuple) else result

    return UserModel("keras", path, None, inputs, output, call, model)


def open_wide_deep_source(saved_model: Path, options: SourceOptions) -> FrameworkExporter:
    """Open what ``--saved-model`` names, as the exporter of its kind.

    Args:
        saved_model: a SavedModel folder, a ``.keras`` file, or the bundle's
            training output (see the module docstring).
        options: ``--input-map``, ``--table-sizes``, ``--logits``.

    Returns:
        :class:`export.onnx_wide_deep.WideDeepExporter` for the bundle's own
        training output, else a :class:`KerasSourceExporter`.

    Raises:
        ExportError: not a model, a model that does not load, or one whose inputs
            or output cannot be mapped onto the served tensors (one line each).
    """
    path = Path(saved_model)
    kind = detect_format(path)
    if kind == "bundle":
        from export.onnx_wide_deep import WideDeepExporter

        if options.input_map or options.logits:
            logger.warning(
                "%s is the bundle's own training output: --input-map and --logits do not apply", path
            )
        return WideDeepExporter(path)
    user = load_saved_model(path) if kind == "savedmodel" else load_keras(path)
    from export.onnx_keras import KerasSourceExporter

    return KerasSourceExporter(user, map_inputs(user.inputs, options, user.what), options)
