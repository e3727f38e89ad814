"""Any TensorFlow SavedModel or ``.keras`` file, found, loaded, and its inputs matched to the served tensors.

What ``python -m export wide-deep --saved-model PATH`` was given is detected from the path
(:func:`detect_format`):

- a folder with ``config.json`` (the output of ``models train wide-deep``, or its
  ``saved_model/`` folder): :class:`export.importers.onnx_wide_deep.WideDeepExporter`,
  which re-traces the bundle's own model (see there for why);
- any other SavedModel folder (``tf.saved_model.save``, Keras ``model.export()``):
  its ``serving_default`` signature, or its only signature;
- a ``.keras`` file: the model ``keras.saving.load_model`` rebuilds.

The user's own graph is converted (:class:`export.importers.onnx_keras.KerasSourceExporter`),
not a re-trace of the bundle's model. Its inputs are matched by name, never by
position (:func:`export.importers.keras_inputs.map_inputs`): the served
``dense_features`` (``B x 13`` float32) and ``categorical_ids`` (``B x 26`` int64)
feed inputs of those names, one input per feature (``I1..I13``, ``C1..C26``), or
the names ``--input-map`` gives.
"""

from __future__ import annotations

import logging
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bundle.errors import ExportError
from export.framework import FrameworkExporter
from export.importers.keras_inputs import ModelInput, UserModel, map_inputs, one_line
from export.importers.sources import SourceOptions

logger = logging.getLogger(__name__)

#: The signature used when a SavedModel has several.
DEFAULT_SIGNATURE = "serving_default"
#: What ``--saved-model`` accepts, for error messages.
EXPECTED_FORMS = (
    "a TensorFlow SavedModel folder (saved_model.pb: tf.saved_model.save or Keras model.export()), "
    "a .keras file (Keras model.save), or the output folder of `models train wide-deep` (config.json)"
)


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
    from bundle.native import quiet_native_stderr

    with quiet_native_stderr():
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
        :class:`export.importers.onnx_wide_deep.WideDeepExporter` for the bundle's own
        training output, else a :class:`KerasSourceExporter`.

    Raises:
        ExportError: not a model, a model that does not load, or one whose inputs
            or output cannot be mapped onto the served tensors (one line each).
    """
    path = Path(saved_model)
    kind = detect_format(path)
    if kind == "bundle":
        from export.importers.onnx_wide_deep import WideDeepExporter

        if options.input_map or options.logits:
            logger.warning(
                "%s is the bundle's own training output: --input-map and --logits do not apply", path
            )
        return WideDeepExporter(path)
    user = load_saved_model(path) if kind == "savedmodel" else load_keras(path)
    from export.importers.onnx_keras import KerasSourceExporter

    return KerasSourceExporter(user, map_inputs(user.inputs, options, user.what), options)
