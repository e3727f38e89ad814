"""A user's TensorFlow/Keras model as loaded, and its inputs matched by name to the served tensors.

:mod:`export.importers.keras_sources` finds and loads the model (a :class:`UserModel`);
:func:`map_inputs` binds each of its inputs to a served tensor or one column of it,
never by position: the served ``dense_features`` (``B x 13`` float32) and
``categorical_ids`` (``B x 26`` int64) feed inputs of those names, one input per
feature (``I1..I13``, ``C1..C26``), or the names ``--input-map`` gives;
:class:`export.importers.onnx_keras.KerasSourceExporter` then wraps the model around
those bindings. Both import these types from here, so neither imports the other's module
for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bundle.errors import ExportError
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE
from export.importers.sources import DEFAULT_FEATURE_NAMES, MAPPED_TENSORS, SourceOptions

logger = logging.getLogger(__name__)

#: Model input dtypes the wrapper can feed (by casting the served tensors).
FEEDABLE_DTYPES = frozenset({"int32", "int64", "float16", "bfloat16", "float32", "float64"})
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
