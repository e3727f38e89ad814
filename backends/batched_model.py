"""What every Python-based backend of the local server shares: one model file run on whole batches.

The wheel's tritonserver has only the python backend; ``backends/<name>/model.py``
makes ``backend: "<name>"`` (or the platform Triton maps to it) load locally, and
the same config serves unchanged in the NGC container, where the real C++
backend takes it. :class:`BatchedModel` is the part that does not depend on the
framework: it reads the config, checks each request on its own, concatenates
the good ones along the batch axis (``B = sum(B_i)``), runs the subclass's model
once and splits the outputs back; a bad request gets an error response of its
own and never costs the others theirs. The python backend does not batch for
you: ``execute`` gets the list of requests the dynamic batcher gathered.

Config ``parameters`` read here (string values): ``allow_non_finite_inputs``
(``"true"``/``"false"``, default false), the bundle's own; and ``hotness``: ``variable``
marks a model of bags of any size (``bundle.schema``'s values and lengths), whose
requests are checked here before the model runs: a negative length (named by row and
table), lengths that do not add up to the values, or rows that disagree between the
dense features and the lengths get one INVALID_ARGUMENT line. (The exported graph
refuses such inputs too, with ONNX Runtime's index error, where this check does not
run: in the NGC container.)

Ragged batching, as Triton's C++ backends do it. An input with ``allow_ragged_batch`` may
differ in shape from request to request: the model gets every request's values
concatenated and flattened (1-D), and each ``batch_input`` of the config (its kinds:
element counts, accumulated counts with or without a leading zero, the largest count as a
shape, each request's shape or those shapes flattened) is computed here from its source
input. A ``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE`` is cut back into the
requests by their source input's shape (each ``-1`` of the output's dims takes the
source's dim at that place). Unlike Triton, a request whose ragged input holds no value is
refused here: the NGC image's backends copy the inputs of a batch only up to such a
request, so its batch-mates would be answered from values never written. A ranking model
(config parameter ``user_features``) also needs its ragged inputs to agree on their
candidates (their first dim after the batch).

Non-finite inputs. A floating-point input holding NaN or +-Inf is refused with
INVALID_ARGUMENT naming the input, row and column, and the other requests of
the batch are answered as usual. Through a CTR model such a value turns the
row's probability into NaN, and one NaN among the scores of a ranking request
breaks the sort of the whole list; a refusal is the answer a caller can act on.
``allow_non_finite_inputs: "true"`` passes them to the model (for models that
use NaN as "missing"). The NGC container's C++ backends have no such check:
there that row's answer is NaN.

Error codes. A request that does not fit the model (missing or unexpected
input, wrong dtype or shape, non-finite values) gets INVALID_ARGUMENT (HTTP
400); a failure inside the framework gets INTERNAL (HTTP 500).

The server's backend directory gets a copy of this file in each backend's
folder, beside its ``model.py`` (the python backend puts that folder on
``sys.path``). It runs inside ``triton_python_backend_stub``, not in the bundle:
``triton_python_backend_utils`` exists only there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

#: Names of a variable-bag model's tensors, as ``bundle.schema`` names them (the stub cannot
#: import the bundle in every image; ``tests/unit/test_onnxruntime_backend.py`` checks they agree).
BAG_DENSE, BAG_VALUES, BAG_LENGTHS = "dense_features", "categorical_values", "categorical_lengths"
#: The ``hotness`` parameter of such a model.
VARIABLE_HOTNESS = "variable"


class RequestError(Exception):
    """A request this model cannot answer; becomes that request's error response.

    Args:
        message: the error text the client sees.
        invalid_argument: the request itself is wrong (INVALID_ARGUMENT), as
            opposed to a failure while running it (INTERNAL).
    """

    def __init__(self, message: str, invalid_argument: bool = True) -> None:
        super().__init__(message)
        self.invalid_argument = invalid_argument


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as config.pbtxt declares it.

    Args:
        name: the tensor's name, shared by config.pbtxt and the model file.
        triton_type: the config's data type, e.g. ``TYPE_FP32``.
        dtype: the numpy dtype of that type.
        dims: the shape without the batch dimension (``-1`` = any size).
    """

    name: str
    triton_type: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    ragged: bool = False

    @classmethod
    def from_config(cls, entry: dict[str, Any], backend: str) -> TensorSpec:
        """Read one ``input``/``output`` entry of the model config JSON (``backend`` names this one)."""
        if "reshape" in entry:
            raise pb_utils.TritonModelException(
                f"tensor '{entry['name']}': 'reshape' is not supported by the local {backend} backend"
            )
        triton_type = str(entry["data_type"])
        if triton_type in ("TYPE_STRING", "TYPE_BF16"):
            raise pb_utils.TritonModelException(
                f"tensor '{entry['name']}': {triton_type} is not supported by the local {backend} backend"
            )
        return cls(
            name=str(entry["name"]),
            triton_type=triton_type,
            dtype=np.dtype(pb_utils.triton_string_to_numpy(triton_type)),
            dims=tuple(int(dim) for dim in entry["dims"]),
            ragged=bool(entry.get("allow_ragged_batch", False)),
        )

    def full_shape(self, batched: bool) -> tuple[int, ...]:
        """The shape including the batch dimension (``-1``) when batching."""
        return (-1, *self.dims) if batched else self.dims

    def check(self, array: np.ndarray[Any, Any], batched: bool, may_be_empty: bool = False) -> None:
        """Raise RequestError unless ``array`` has this tensor's dtype and shape (a ragged input
        holds a value unless ``may_be_empty``)."""
        if array.dtype != self.dtype:
            raise RequestError(
                f"input '{self.name}' has data type {array.dtype}, expected {self.triton_type} ({self.dtype})"
            )
        expected = self.full_shape(batched)
        matches = len(array.shape) == len(expected) and all(
            want in (-1, got) for want, got in zip(expected, array.shape, strict=True)
        )
        if not matches:
            raise RequestError(
                f"input '{self.name}' has shape {list(array.shape)}, expected {list(expected)}"
            )
        if batched and array.shape[0] < 1:
            raise RequestError(f"input '{self.name}' is an empty batch (shape {list(array.shape)})")
        if self.ragged and array.size == 0 and not may_be_empty:
            raise RequestError(f"input '{self.name}' holds no values (shape {list(array.shape)})")

    def check_finite(self, array: np.ndarray[Any, Any]) -> None:
        """Raise RequestError naming the first NaN or +-Inf of a floating-point input."""
        if array.dtype.kind != "f":
            return
        finite = np.isfinite(array)
        if finite.all():
            return
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        count = int(finite.size - np.count_nonzero(finite))
        raise RequestError(
            f"input '{self.name}' holds {count} non-finite value(s) (NaN or Inf), the first "
            f"{array[first]} at index {list(first)}; send finite values, or set the model's "
            f'config parameter allow_non_finite_inputs to "true"'
        )


#: How each ``batch_input`` kind of Triton's model config is computed from its source input's
#: request tensors (each with its batch dimension), as Triton's C++ backends give it to a model.
BATCH_INPUT_KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)
#: The one ``batch_output`` kind.
SCATTER_KIND = "BATCH_SCATTER_WITH_INPUT_SHAPE"
#: The config parameter of a ranking model (its user's features); its ragged inputs must agree.
USER_FEATURES_PARAMETER = "user_features"
#: Config parameters that check a request's ragged inputs (a DLRMv3 user's history and candidates):
#: inputs that may hold no value (``a,b``); groups whose element counts must agree (``a,b;c,d``);
#: the most values an input may hold (``c:2048``); inputs whose values must be >= 0 (``a``).
EMPTY_RAGGED_PARAMETER = "ragged_may_be_empty"
AGREE_PARAMETER = "ragged_agree"
MAX_ELEMENTS_PARAMETER = "ragged_max_elements"
NON_NEGATIVE_PARAMETER = "non_negative_inputs"


def _names(parameters: dict[str, Any], key: str) -> list[str]:
    text = str(parameters.get(key, {}).get("string_value", ""))
    return [name.strip() for name in text.split(",") if name.strip()]


@dataclass(frozen=True)
class RaggedChecks:
    """What a model's config asks of each request's ragged inputs beyond their dtype and shape."""

    may_be_empty: frozenset[str] = frozenset()
    agree: tuple[tuple[str, ...], ...] = ()
    max_elements: tuple[tuple[str, int], ...] = ()
    non_negative: tuple[str, ...] = ()

    @classmethod
    def from_parameters(
        cls, parameters: dict[str, Any], inputs: list[TensorSpec], model: str
    ) -> RaggedChecks:
        known = {spec.name for spec in inputs}
        groups = tuple(
            tuple(name.strip() for name in group.split(",") if name.strip())
            for group in str(parameters.get(AGREE_PARAMETER, {}).get("string_value", "")).split(";")
            if group.strip()
        )
        limits = []
        for entry in _names(parameters, MAX_ELEMENTS_PARAMETER):
            name, _, count = entry.partition(":")
            if not count.strip().isdigit():
                raise pb_utils.TritonModelException(
                    f"model '{model}': {MAX_ELEMENTS_PARAMETER} entries are input:count, got {entry!r}"
                )
            limits.append((name.strip(), int(count)))
        checks = cls(
            frozenset(_names(parameters, EMPTY_RAGGED_PARAMETER)),
            groups,
            tuple(limits),
            tuple(_names(parameters, NON_NEGATIVE_PARAMETER)),
        )
        named = set(checks.may_be_empty) | {n for g in groups for n in g} | {n for n, _ in limits}
        unknown = sorted((named | set(checks.non_negative)) - known)
        if unknown:
            raise pb_utils.TritonModelException(
                f"model '{model}': ragged checks name unknown inputs {unknown}"
            )
        return checks

    def check(self, feeds: dict[str, np.ndarray[Any, Any]]) -> None:
        """Raise RequestError where a request's inputs break one of the checks."""
        for group in self.agree:
            counts = {name: int(feeds[name].size) for name in group}
            if len(set(counts.values())) > 1:
                raise RequestError(f"inputs disagree on their number of values: {counts}")
        for name, most in self.max_elements:
            if feeds[name].size > most:
                raise RequestError(
                    f"input '{name}' holds {feeds[name].size} values; the model takes at most {most}"
                )
        for name in self.non_negative:
            negative = np.flatnonzero(feeds[name].reshape(-1) < 0)
            if negative.size:
                first = int(negative[0])
                value = feeds[name].reshape(-1)[first]
                raise RequestError(f"input '{name}' holds a negative value, {value} at index {first}")


def _one(entry: dict[str, Any], key: str, what: str) -> str:
    values = entry.get(key) or []
    if isinstance(values, str):
        values = [values]
    if len(values) != 1:
        raise pb_utils.TritonModelException(f"{what}: {key} must name one tensor, got {values}")
    return str(values[0])


@dataclass(frozen=True)
class BatchInputSpec:
    """One ``batch_input`` entry: an input of the model that no request sends, made for each batch.

    Args:
        kind: one of :data:`BATCH_INPUT_KINDS`.
        targets: the model inputs that get it.
        dtype: int32 or float32.
        source: the request input it describes.
    """

    kind: str
    targets: tuple[str, ...]
    dtype: np.dtype[Any]
    source: str

    @classmethod
    def from_config(cls, entry: dict[str, Any], inputs: list[TensorSpec], backend: str) -> BatchInputSpec:
        kind = str(entry.get("kind", BATCH_INPUT_KINDS[0]))
        targets = tuple(str(name) for name in entry.get("target_name", []))
        what = f"batch_input {list(targets)}"
        if kind not in BATCH_INPUT_KINDS:
            raise pb_utils.TritonModelException(
                f"{what}: kind {kind} is not supported by the local {backend} backend"
            )
        data_type = str(entry.get("data_type", "TYPE_INT32"))
        if data_type not in ("TYPE_INT32", "TYPE_FP32") or not targets:
            raise pb_utils.TritonModelException(
                f"{what}: needs a target name and data type TYPE_INT32 or TYPE_FP32, got {data_type}"
            )
        source = _one(entry, "source_input", what)
        if source not in {spec.name for spec in inputs}:
            raise pb_utils.TritonModelException(f"{what}: source input '{source}' is not an input")
        return cls(kind, targets, np.dtype(np.int32 if data_type == "TYPE_INT32" else np.float32), source)

    def value(self, arrays: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        """Its tensor for a batch whose requests hold ``arrays`` for the source input."""
        counts = np.asarray([array.size for array in arrays], dtype=np.int64)
        if self.kind == "BATCH_ELEMENT_COUNT":
            value = counts
        elif self.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
            value = np.cumsum(counts)
        elif self.kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
            value = np.concatenate([[0], np.cumsum(counts)])
        elif self.kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
            value = np.zeros(int(counts.max()), dtype=np.int64)
        else:
            # Each request's shape after its batch dimension, once per row of its batch.
            rows = [
                np.asarray(array.shape[1:], dtype=np.int64) for array in arrays for _ in range(array.shape[0])
            ]
            value = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.int64)
            if self.kind == "BATCH_ITEM_SHAPE_FLATTEN":
                value = value.reshape(-1)
        return value.astype(self.dtype)


@dataclass(frozen=True)
class BatchOutputSpec:
    """One ``batch_output`` entry: outputs cut into the requests by a ragged input's shapes."""

    targets: tuple[str, ...]
    source: str

    @classmethod
    def from_config(
        cls, entry: dict[str, Any], inputs: list[TensorSpec], outputs: list[TensorSpec]
    ) -> BatchOutputSpec:
        targets = tuple(str(name) for name in entry.get("target_name", []))
        what = f"batch_output {list(targets)}"
        kind = str(entry.get("kind", SCATTER_KIND))
        if kind != SCATTER_KIND:
            raise pb_utils.TritonModelException(f"{what}: kind must be {SCATTER_KIND}, got {kind}")
        unknown = sorted(set(targets) - {spec.name for spec in outputs})
        if not targets or unknown:
            raise pb_utils.TritonModelException(f"{what}: targets must be outputs; {unknown} are not")
        source = _one(entry, "source_input", what)
        if source not in {spec.name for spec in inputs}:
            raise pb_utils.TritonModelException(f"{what}: source input '{source}' is not an input")
        return cls(targets, source)

    @staticmethod
    def shape(output: TensorSpec, source_shape: tuple[int, ...]) -> tuple[int, ...]:
        """One request's shape of ``output``: each ``-1`` of its full dims (the batch first)
        takes the source input's dim at that place."""
        dims = (-1, *output.dims)
        return tuple(
            (source_shape[index] if index < len(source_shape) else 1) if dim == -1 else dim
            for index, dim in enumerate(dims)
        )


def check_bags(feeds: dict[str, np.ndarray[Any, Any]]) -> None:
    """A variable-bag request's lengths against its values and dense rows.

    Raises:
        RequestError: a negative length (its row and table), lengths that add up to another
            count than the values', or another number of rows than the dense features'.
    """
    lengths, values = feeds.get(BAG_LENGTHS), feeds.get(BAG_VALUES)
    if lengths is None or values is None:
        return
    negative = np.argwhere(lengths < 0)
    if negative.size:
        row, table = (int(v) for v in negative[0])
        raise RequestError(
            f"input '{BAG_LENGTHS}': row {row}, table C{table + 1} has a negative bag length "
            f"({int(lengths[row, table])})"
        )
    total = int(lengths.sum())
    if total != values.size:
        raise RequestError(
            f"input '{BAG_LENGTHS}' adds up to {total} ids, but '{BAG_VALUES}' holds {values.size}"
        )
    dense = feeds.get(BAG_DENSE)
    if dense is not None and dense.shape[0] != lengths.shape[0]:
        raise RequestError(
            f"input '{BAG_DENSE}' has {dense.shape[0]} rows, '{BAG_LENGTHS}' has {lengths.shape[0]}"
        )


def error_response(error: RequestError) -> Any:
    """The error response of one request."""
    code = pb_utils.TritonError.INVALID_ARG if error.invalid_argument else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(error), code))


def int_parameter(parameters: dict[str, Any], key: str) -> int:
    """A non-negative integer config parameter (``{"string_value": "2"}``); 0 when absent."""
    raw = parameters.get(key, {}).get("string_value", "")
    if raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        raise pb_utils.TritonModelException(f"parameter {key} must be an integer, got {raw!r}") from None
    if value < 0:
        raise pb_utils.TritonModelException(f"parameter {key} must be >= 0, got {value}")
    return value


def flag_parameter(parameters: dict[str, Any], key: str, default: bool = False) -> bool:
    """A boolean config parameter (``"true"``/``"false"``, any case); ``default`` when absent."""
    raw = parameters.get(key, {}).get("string_value", "").strip().lower()
    if raw == "":
        return default
    if raw in ("false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise pb_utils.TritonModelException(f"parameter {key} must be true or false, got {raw!r}")


class BatchedModel:
    """One model file of one Triton model instance, run on the requests of each ``execute`` call at once.

    Subclasses set :attr:`BACKEND` and :attr:`DEFAULT_FILE`, and implement
    :meth:`_load` and :meth:`_infer`. Inputs and outputs are those of config.pbtxt;
    with ``max_batch_size > 0`` every tensor is ``B x dims``.
    """

    #: The backend's name, for messages (``onnxruntime``, ``pytorch``).
    BACKEND = ""
    #: The model file when the config names none (``model.onnx``, ``model.pt``).
    DEFAULT_FILE = ""

    def initialize(self, args: dict[str, str]) -> None:
        """Read the config, then load the model file (:meth:`_load`).

        Args:
            args: from the python backend: ``model_config`` (JSON),
                ``model_repository`` (this model's folder), ``model_version``,
                ``model_name``, ``model_instance_name``, ``model_instance_kind``,
                ``model_instance_device_id``.

        Raises:
            TritonModelException: a missing or unreadable model file, or a config
                the model disagrees with; fails this model's load.
        """
        config = json.loads(args["model_config"])
        self._name = args["model_name"]
        if int(np.__version__.split(".")[0]) >= 2:
            # Seen with tritonserver 2.51's python backend (the nvidia-pytriton 0.7 wheel): under
            # numpy 2 every response left the stub with an empty output and no error anywhere.
            raise pb_utils.TritonModelException(
                f"model '{self._name}': the python backend stub's interpreter has numpy {np.__version__}; "
                "this backend needs numpy<2 (requirements.txt pins 1.26.4): under numpy 2 the "
                "responses of this tritonserver come back empty"
            )
        self._batched = int(config.get("max_batch_size", 0)) > 0
        self._inputs = [TensorSpec.from_config(entry, self.BACKEND) for entry in config.get("input", [])]
        self._outputs = [TensorSpec.from_config(entry, self.BACKEND) for entry in config.get("output", [])]
        self._output_names = [spec.name for spec in self._outputs]
        self._batch_inputs = [
            BatchInputSpec.from_config(entry, self._inputs, self.BACKEND)
            for entry in config.get("batch_input", [])
        ]
        self._scatter = {
            target: spec
            for spec in (
                BatchOutputSpec.from_config(entry, self._inputs, self._outputs)
                for entry in config.get("batch_output", [])
            )
            for target in spec.targets
        }
        self._ragged = [spec.name for spec in self._inputs if spec.ragged]
        if (self._ragged or self._scatter) and not self._batched:
            raise pb_utils.TritonModelException(
                f"model '{config.get('name', '')}': ragged inputs and batch outputs need max_batch_size > 0"
            )

        filename = config.get("default_model_filename") or self.DEFAULT_FILE
        path = Path(args["model_repository"]) / args["model_version"] / filename
        if not path.is_file():
            raise pb_utils.TritonModelException(f"model '{self._name}': model file {path} not found")

        parameters = config.get("parameters", {})
        self._allow_non_finite = flag_parameter(parameters, "allow_non_finite_inputs")
        hotness = str(parameters.get("hotness", {}).get("string_value", "")).strip()
        self._bags = hotness == VARIABLE_HOTNESS
        self._ranking = USER_FEATURES_PARAMETER in parameters
        self._ragged_checks = RaggedChecks.from_parameters(parameters, self._inputs, self._name)
        loaded = self._load(path, args, parameters)
        pb_utils.Logger.log_info(
            f"{args['model_instance_name']}: {path} {loaded}, "
            f"inputs {[spec.name for spec in self._inputs]}, outputs {self._output_names}, "
            f"batching={'on' if self._batched else 'off'}, "
            f"non-finite inputs {'allowed' if self._allow_non_finite else 'refused'}"
        )

    def _load(self, path: Path, args: dict[str, str], parameters: dict[str, Any]) -> str:
        """Load the model file at ``path`` and check it against the config.

        Returns:
            How it runs, for the load's log line (``on CPUExecutionProvider, ...``).

        Raises:
            TritonModelException: it does not load, or disagrees with the config.
        """
        raise NotImplementedError

    def _infer(self, feeds: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        """Run the model on ``feeds`` (by input name); its outputs in config order.

        Raises:
            RequestError: the framework failed (``invalid_argument=False``).
        """
        raise NotImplementedError

    def _read_request(self, request: Any) -> dict[str, np.ndarray[Any, Any]]:
        """The request's inputs by name, checked against the config.

        Raises:
            RequestError: an input is missing, unexpected, of the wrong dtype
                or shape, holds NaN or Inf (unless allowed), or the inputs
                disagree on the batch size.
        """
        feeds: dict[str, np.ndarray[Any, Any]] = {}
        for spec in self._inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is None:
                raise RequestError(
                    f"input '{spec.name}' is missing; model '{self._name}' expects "
                    f"{[s.name for s in self._inputs]}"
                )
            array = tensor.as_numpy()
            spec.check(array, self._batched, spec.name in self._ragged_checks.may_be_empty)
            if not self._allow_non_finite:
                spec.check_finite(array)
            feeds[spec.name] = array
        unexpected = sorted({t.name() for t in request.inputs()} - set(feeds))
        if unexpected:
            raise RequestError(f"unexpected inputs {unexpected} for model '{self._name}'")
        if self._batched:
            sizes = {name: array.shape[0] for name, array in feeds.items()}
            if len(set(sizes.values())) > 1:
                raise RequestError(f"inputs disagree on the batch size: {sizes}")
        if self._bags:
            check_bags(feeds)
        self._ragged_checks.check(feeds)
        if self._ranking and len(self._ragged) > 1:
            candidates = {name: feeds[name].shape[1] for name in self._ragged if feeds[name].ndim > 1}
            if len(set(candidates.values())) > 1:
                raise RequestError(f"the candidate inputs disagree on the number of candidates: {candidates}")
        return feeds

    def _model_feeds(
        self, requests: list[dict[str, np.ndarray[Any, Any]]]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """The model's inputs for these requests' inputs: batched ones concatenated along the
        batch, ragged ones flattened and concatenated, and the config's batch inputs."""
        feeds: dict[str, np.ndarray[Any, Any]] = {}
        for spec in self._inputs:
            parts = [request[spec.name] for request in requests]
            if spec.ragged:
                flat = [part.reshape(-1) for part in parts]
                feeds[spec.name] = flat[0] if len(flat) == 1 else np.concatenate(flat)
            else:
                feeds[spec.name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
        for batch_input in self._batch_inputs:
            value = batch_input.value([request[batch_input.source] for request in requests])
            for target in batch_input.targets:
                feeds[target] = value
        return feeds

    def _run(self, requests: list[dict[str, np.ndarray[Any, Any]]]) -> list[list[np.ndarray[Any, Any]]]:
        """:meth:`_infer` on these requests at once, its outputs checked (the config's dtypes, the
        batch's size) and cut back into each request's.

        Raises:
            RequestError: the framework failed, or an output has another dtype or size.
        """
        results = self._infer(self._model_feeds(requests))
        outputs = [np.asarray(result) for result in results]
        for spec, output in zip(self._outputs, outputs, strict=True):
            if output.dtype != spec.dtype:
                raise RequestError(
                    f"output '{spec.name}' of model '{self._name}' is {output.dtype}, "
                    f"but config.pbtxt says {spec.triton_type}",
                    invalid_argument=False,
                )
        answers: list[list[np.ndarray[Any, Any]]] = [[] for _ in requests]
        sizes = [next(iter(request.values())).shape[0] for request in requests] if self._batched else []
        for spec, output in zip(self._outputs, outputs, strict=True):
            scatter = self._scatter.get(spec.name)
            if scatter is not None:
                shapes = [scatter.shape(spec, request[scatter.source].shape) for request in requests]
                counts = [int(np.prod(shape)) for shape in shapes]
                if output.size != sum(counts):
                    raise RequestError(
                        f"output '{spec.name}' of model '{self._name}' holds {output.size} values; "
                        f"its requests' {scatter.source} need {sum(counts)}",
                        invalid_argument=False,
                    )
                parts = np.split(output.reshape(-1), np.cumsum(counts)[:-1])
                for answer, part, shape in zip(answers, parts, shapes, strict=True):
                    answer.append(part.reshape(shape))
            elif self._batched:
                if output.ndim == 0 or output.shape[0] != sum(sizes):
                    raise RequestError(
                        f"output '{spec.name}' of model '{self._name}' has shape "
                        f"{list(output.shape)} for a batch of {sum(sizes)}",
                        invalid_argument=False,
                    )
                for answer, part in zip(
                    answers, np.split(output, np.cumsum(sizes)[:-1], axis=0), strict=True
                ):
                    answer.append(part)
            else:
                answers[0].append(output)
        return answers

    def _response(self, outputs: list[np.ndarray[Any, Any]]) -> Any:
        tensors = [
            pb_utils.Tensor(spec.name, np.ascontiguousarray(output))
            for spec, output in zip(self._outputs, outputs, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run_one(self, feeds: dict[str, np.ndarray[Any, Any]]) -> Any:
        try:
            return self._response(self._run([feeds])[0])
        except RequestError as exc:
            pb_utils.Logger.log_warn(str(exc))
            return error_response(exc)

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer one scheduler batch of requests, one response per request.

        Args:
            requests: ``pb_utils.InferenceRequest`` objects; with batching each
                input is ``B_i x dims``.

        Returns:
            ``pb_utils.InferenceResponse`` per request, in order: outputs
            ``B_i x dims`` (a batch output: its source input's shape), or an error
            for that request alone.
        """
        responses: list[Any] = [None] * len(requests)
        valid: list[tuple[int, dict[str, np.ndarray[Any, Any]]]] = []
        for index, request in enumerate(requests):
            try:
                valid.append((index, self._read_request(request)))
            except RequestError as exc:
                responses[index] = error_response(exc)

        if self._batched and len(valid) > 1:
            try:
                answers = self._run([feeds for _, feeds in valid])
            except RequestError as exc:
                # One request may hold the value that made the whole batch fail:
                # run them one by one so only that one gets the error.
                pb_utils.Logger.log_warn(f"{exc}; retrying the {len(valid)} requests one by one")
                for index, feeds in valid:
                    responses[index] = self._run_one(feeds)
            else:
                for (index, _), answer in zip(valid, answers, strict=True):
                    responses[index] = self._response(answer)
        else:
            for index, feeds in valid:
                responses[index] = self._run_one(feeds)
        return responses
