"""A Python-based Triton backend named ``onnxruntime``, for the local server.

The wheel's tritonserver has only the python backend. Copied to
``<backend-dir>/onnxruntime/model.py``, this file serves every model whose
config.pbtxt says ``backend: "onnxruntime"``, so the same repository serves
unchanged in the NGC container, where the real C++ onnxruntime backend takes
it. It runs ``<repository>/<model>/<version>/<default_model_filename>``
(``model.onnx`` unless the config names another file) with ONNX Runtime on
CPU.

The python backend does not batch: ``execute`` gets the list of requests the
dynamic batcher gathered. Each request is checked on its own, the good ones
are concatenated along the batch axis (``B = sum(B_i)``), run once, and the
outputs are split back; a bad request gets an error response of its own and
never costs the others theirs.

Config ``parameters`` read, as the C++ backend names them (string values):
``intra_op_thread_count`` and ``inter_op_thread_count`` (0 or absent: ONNX
Runtime's default). One of this backend's own: ``allow_non_finite_inputs``
(``"true"``/``"false"``, default false).

Non-finite inputs. A floating-point input holding NaN or +-Inf is refused with
INVALID_ARGUMENT naming the input, row and column, and the other requests of
the batch are answered as usual. Through a CTR model such a value turns the
row's probability into NaN, and one NaN among the scores of a ranking request
breaks the sort of the whole list; a refusal is the answer a caller can act on.
``allow_non_finite_inputs: "true"`` passes them to the graph (for models that
use NaN as "missing"). The NGC container's C++ onnxruntime backend has no such
check: there that row's answer is NaN.

Error codes. A request that does not fit the model (missing or unexpected
input, wrong dtype or shape, non-finite values) gets INVALID_ARGUMENT (HTTP
400); a failure inside ONNX Runtime gets INTERNAL (HTTP 500).

This module is loaded by ``triton_python_backend_stub`` inside tritonserver,
not imported by the bundle: ``triton_python_backend_utils`` exists only there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# ONNX Runtime's type strings for the tensor types a CTR model uses.
_ORT_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(bool)": np.dtype(np.bool_),
}


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
        name: the tensor's name, shared by config.pbtxt and the ONNX graph.
        triton_type: the config's data type, e.g. ``TYPE_FP32``.
        dtype: the numpy dtype of that type.
        dims: the shape without the batch dimension (``-1`` = any size).
    """

    name: str
    triton_type: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> TensorSpec:
        """Read one ``input``/``output`` entry of the model config JSON."""
        if "reshape" in entry:
            raise pb_utils.TritonModelException(
                f"tensor '{entry['name']}': 'reshape' is not supported by the local onnxruntime backend"
            )
        triton_type = str(entry["data_type"])
        if triton_type in ("TYPE_STRING", "TYPE_BF16"):
            raise pb_utils.TritonModelException(
                f"tensor '{entry['name']}': {triton_type} is not supported by the local onnxruntime backend"
            )
        return cls(
            name=str(entry["name"]),
            triton_type=triton_type,
            dtype=np.dtype(pb_utils.triton_string_to_numpy(triton_type)),
            dims=tuple(int(dim) for dim in entry["dims"]),
        )

    def full_shape(self, batched: bool) -> tuple[int, ...]:
        """The shape including the batch dimension (``-1``) when batching."""
        return (-1, *self.dims) if batched else self.dims

    def check(self, array: np.ndarray[Any, Any], batched: bool) -> None:
        """Raise RequestError unless ``array`` has this tensor's dtype and shape."""
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


def _error_response(error: RequestError) -> Any:
    code = pb_utils.TritonError.INVALID_ARG if error.invalid_argument else pb_utils.TritonError.INTERNAL
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(error), code))


def _thread_count(parameters: dict[str, Any], key: str) -> int:
    """An integer config parameter (``{"string_value": "2"}``); 0 when absent."""
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


def _flag(parameters: dict[str, Any], key: str) -> bool:
    """A boolean config parameter (``"true"``/``"false"``, any case); False when absent."""
    raw = parameters.get(key, {}).get("string_value", "").strip().lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise pb_utils.TritonModelException(f"parameter {key} must be true or false, got {raw!r}")


def _providers(args: dict[str, str]) -> list[Any]:
    """ONNX Runtime providers for this instance: CUDA on its device for a KIND_GPU
    instance (which needs the onnxruntime-gpu build), else the CPU."""
    if args.get("model_instance_kind", "CPU") != "GPU":
        return ["CPUExecutionProvider"]
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise pb_utils.TritonModelException(
            f"model '{args['model_name']}': a KIND_GPU instance needs onnxruntime-gpu with CUDA; "
            f"this onnxruntime offers {available}"
        )
    device = int(args.get("model_instance_device_id", "0"))
    return [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]


class TritonPythonModel:
    """Runs one ONNX model with ONNX Runtime for one Triton model instance.

    Inputs and outputs are mapped by name between config.pbtxt and the ONNX
    graph; with ``max_batch_size > 0`` every tensor is ``B x dims`` and the
    requests of one ``execute`` call are run as a single batch.
    """

    def initialize(self, args: dict[str, str]) -> None:
        """Load the ONNX file and check it against the model config.

        Args:
            args: from the python backend: ``model_config`` (JSON),
                ``model_repository`` (this model's folder), ``model_version``,
                ``model_name``, ``model_instance_name``.

        Raises:
            TritonModelException: missing or unreadable model file, or a
                config that disagrees with the graph; fails this model's load.
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
        self._inputs = [TensorSpec.from_config(entry) for entry in config.get("input", [])]
        self._outputs = [TensorSpec.from_config(entry) for entry in config.get("output", [])]

        filename = config.get("default_model_filename") or "model.onnx"
        path = Path(args["model_repository"]) / args["model_version"] / filename
        if not path.is_file():
            raise pb_utils.TritonModelException(f"model '{self._name}': model file {path} not found")

        parameters = config.get("parameters", {})
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = _thread_count(parameters, "intra_op_thread_count")
        options.inter_op_num_threads = _thread_count(parameters, "inter_op_thread_count")
        self._allow_non_finite = _flag(parameters, "allow_non_finite_inputs")
        providers = _providers(args)
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        # ONNX Runtime's own exceptions derive from Exception directly.
        except Exception as exc:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': onnxruntime could not load {path}: {exc}"
            ) from exc
        self._check_graph()
        self._output_names = [spec.name for spec in self._outputs]
        pb_utils.Logger.log_info(
            f"{args['model_instance_name']}: {path} on {self._session.get_providers()[0]}, "
            f"inputs {[spec.name for spec in self._inputs]}, outputs {self._output_names}, "
            f"intra_op_num_threads={options.intra_op_num_threads or 'default'}, "
            f"batching={'on' if self._batched else 'off'}, "
            f"non-finite inputs {'allowed' if self._allow_non_finite else 'refused'}"
        )

    def _check_graph(self) -> None:
        """Fail the load when config and ONNX graph disagree on names or types."""
        graph_inputs = {node.name: node for node in self._session.get_inputs()}
        graph_outputs = {node.name: node for node in self._session.get_outputs()}
        config_inputs = {spec.name for spec in self._inputs}
        problems = []
        missing = sorted(set(graph_inputs) - config_inputs)
        if missing:
            problems.append(f"graph inputs {missing} are not in config.pbtxt")
        for specs, nodes, kind in (
            (self._inputs, graph_inputs, "input"),
            (self._outputs, graph_outputs, "output"),
        ):
            for spec in specs:
                node = nodes.get(spec.name)
                if node is None:
                    problems.append(f"{kind} '{spec.name}' is not in the graph {sorted(nodes)}")
                    continue
                graph_dtype = _ORT_TYPES.get(node.type)
                if graph_dtype != spec.dtype:
                    problems.append(
                        f"{kind} '{spec.name}' is {spec.triton_type} in config.pbtxt but "
                        f"{node.type} in the graph"
                    )
                # Output shapes may be unknown to the graph; they are checked per run.
                if kind == "output" or node.shape is None:
                    continue
                graph_rank = len(node.shape)
                if graph_rank != len(spec.full_shape(self._batched)):
                    problems.append(
                        f"{kind} '{spec.name}' has rank {graph_rank} in the graph "
                        f"{node.shape} but config dims {list(spec.dims)} "
                        f"(batching {'on' if self._batched else 'off'})"
                    )
        if problems:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': config.pbtxt does not match the ONNX graph: " + "; ".join(problems)
            )

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
            spec.check(array, self._batched)
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
        return feeds

    def _run(self, feeds: dict[str, np.ndarray[Any, Any]]) -> list[np.ndarray[Any, Any]]:
        """Run the session; outputs in config order, cast to the config's dtypes.

        Raises:
            RequestError: ONNX Runtime failed, or an output has the wrong batch size.
        """
        try:
            results = self._session.run(self._output_names, feeds)
        # ONNX Runtime's own exceptions derive from Exception directly.
        except Exception as exc:
            raise RequestError(
                f"onnxruntime failed on model '{self._name}': {exc}", invalid_argument=False
            ) from exc
        outputs = [
            np.asarray(result).astype(spec.dtype, copy=False)
            for spec, result in zip(self._outputs, results, strict=True)
        ]
        if self._batched:
            batch = next(iter(feeds.values())).shape[0]
            for spec, output in zip(self._outputs, outputs, strict=True):
                if output.ndim == 0 or output.shape[0] != batch:
                    raise RequestError(
                        f"output '{spec.name}' of model '{self._name}' has shape "
                        f"{list(output.shape)} for a batch of {batch}",
                        invalid_argument=False,
                    )
        return outputs

    def _response(self, outputs: list[np.ndarray[Any, Any]]) -> Any:
        tensors = [
            pb_utils.Tensor(spec.name, np.ascontiguousarray(output))
            for spec, output in zip(self._outputs, outputs, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run_one(self, feeds: dict[str, np.ndarray[Any, Any]]) -> Any:
        try:
            return self._response(self._run(feeds))
        except RequestError as exc:
            pb_utils.Logger.log_warn(str(exc))
            return _error_response(exc)

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer one scheduler batch of requests, one response per request.

        Args:
            requests: ``pb_utils.InferenceRequest`` objects; with batching each
                input is ``B_i x dims``.

        Returns:
            ``pb_utils.InferenceResponse`` per request, in order: outputs
            ``B_i x dims``, or an error for that request alone.
        """
        responses: list[Any] = [None] * len(requests)
        valid: list[tuple[int, dict[str, np.ndarray[Any, Any]]]] = []
        for index, request in enumerate(requests):
            try:
                valid.append((index, self._read_request(request)))
            except RequestError as exc:
                responses[index] = _error_response(exc)

        if self._batched and len(valid) > 1:
            sizes = [next(iter(feeds.values())).shape[0] for _, feeds in valid]
            batch = {
                spec.name: np.concatenate([feeds[spec.name] for _, feeds in valid], axis=0)
                for spec in self._inputs
            }
            try:
                outputs = self._run(batch)
            except RequestError as exc:
                # One request may hold the value that made the whole batch fail:
                # run them one by one so only that one gets the error.
                pb_utils.Logger.log_warn(f"{exc}; retrying the {len(valid)} requests one by one")
                for index, feeds in valid:
                    responses[index] = self._run_one(feeds)
            else:
                bounds = np.cumsum(sizes)[:-1]
                per_output = [np.split(output, bounds, axis=0) for output in outputs]
                for position, (index, _) in enumerate(valid):
                    responses[index] = self._response([parts[position] for parts in per_output])
        else:
            for index, feeds in valid:
                responses[index] = self._run_one(feeds)
        return responses

    def finalize(self) -> None:
        """Release the ONNX Runtime session when the model unloads."""
        self._session = None
