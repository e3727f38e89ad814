"""A Python-based Triton backend named ``onnxruntime``, for the local server.

The wheel's tritonserver has only the python backend. Copied to
``<backend-dir>/onnxruntime/model.py`` (with ``batched_model.py`` beside it),
this file serves every model whose config.pbtxt says ``backend: "onnxruntime"``,
so the same repository serves unchanged in the NGC container, where the real
C++ onnxruntime backend takes it. It runs
``<repository>/<model>/<version>/<default_model_filename>`` (``model.onnx``
unless the config names another file) with ONNX Runtime: on the CPU for a
KIND_CPU instance, on CUDA for a KIND_GPU one (which needs onnxruntime-gpu).

Requests are checked, batched and answered by :class:`batched_model.BatchedModel`
(one bad request never costs the others theirs; NaN/Inf inputs are refused
unless ``allow_non_finite_inputs: "true"``; INVALID_ARGUMENT for a request that
does not fit, INTERNAL for a failure inside ONNX Runtime).

Config ``parameters`` read, as the C++ backend names them (string values):
``intra_op_thread_count`` and ``inter_op_thread_count`` (0 or absent: ONNX
Runtime's default); and ONNX Runtime's own session key
``session.intra_op.allow_spinning`` (``"0"``: idle intra-op threads sleep
instead of spin-waiting; absent: ONNX Runtime's default, spinning), which the
bundle's repository writer sets (see ``bundle/repository.py``,
``ORT_SPINNING_KEY``). The C++ backend of the NGC image does not read that key.

This module is loaded by ``triton_python_backend_stub`` inside tritonserver,
not imported by the bundle: ``triton_python_backend_utils`` exists only there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from batched_model import BatchedModel, RequestError, flag_parameter, int_parameter

#: Config parameter = ONNX Runtime session config key: may idle intra-op threads spin-wait.
SPINNING_KEY = "session.intra_op.allow_spinning"

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


class TritonPythonModel(BatchedModel):
    """Runs one ONNX model with ONNX Runtime for one Triton model instance.

    Inputs and outputs are mapped by name between config.pbtxt and the ONNX graph.
    """

    BACKEND = "onnxruntime"
    DEFAULT_FILE = "model.onnx"

    def _load(self, path: Path, args: dict[str, str], parameters: dict[str, Any]) -> str:
        """Open an ONNX Runtime session of ``path`` and check it against the config."""
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = int_parameter(parameters, "intra_op_thread_count")
        options.inter_op_num_threads = int_parameter(parameters, "inter_op_thread_count")
        spinning = flag_parameter(parameters, SPINNING_KEY, default=True)
        options.add_session_config_entry(SPINNING_KEY, "1" if spinning else "0")
        providers = _providers(args)
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        # ONNX Runtime's own exceptions derive from Exception directly.
        except Exception as exc:
            raise pb_utils.TritonModelException(
                f"model '{self._name}': onnxruntime could not load {path}: {exc}"
            ) from exc
        self._check_graph()
        return (
            f"on {self._session.get_providers()[0]}, "
            f"intra_op_num_threads={options.intra_op_num_threads or 'default'}, "
            f"intra-op spinning {'on' if spinning else 'off'}"
        )

    def _check_graph(self) -> None:
        """Fail the load when config and ONNX graph disagree on names or types."""
        graph_inputs = {node.name: node for node in self._session.get_inputs()}
        graph_outputs = {node.name: node for node in self._session.get_outputs()}
        config_inputs = {spec.name for spec in self._inputs}
        batch_inputs = {target for spec in self._batch_inputs for target in spec.targets}
        problems = []
        missing = sorted(set(graph_inputs) - config_inputs - batch_inputs)
        if missing:
            problems.append(f"graph inputs {missing} are not in config.pbtxt")
        absent = sorted(batch_inputs - set(graph_inputs))
        if absent:
            problems.append(f"batch inputs {absent} are not inputs of the graph")
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
                if spec.ragged:  # the batch's values concatenated, as Triton's backends take them
                    if graph_rank != 1:
                        problems.append(
                            f"ragged input '{spec.name}' has shape {node.shape} in the graph; "
                            "a ragged input is 1-D there"
                        )
                    continue
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

    def _infer(self, feeds: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        """Run the session; outputs in config order.

        Raises:
            RequestError: ONNX Runtime failed.
        """
        try:
            return list(self._session.run(self._output_names, feeds))
        # ONNX Runtime's own exceptions derive from Exception directly.
        except Exception as exc:
            raise RequestError(
                f"onnxruntime failed on model '{self._name}': {exc}", invalid_argument=False
            ) from exc

    def finalize(self) -> None:
        """Release the ONNX Runtime session when the model unloads."""
        self._session = None
