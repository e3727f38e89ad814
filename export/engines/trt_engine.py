"""TensorRT engines: build a plan from an ONNX file, and run one on the GPU.

Only this module imports ``tensorrt``, inside its functions, so the rest of
the bundle (and ``--help``) works where TensorRT is absent; TensorRT does not
install from the package registries, and a plan must be built by the same
TensorRT as the serving image's, so this runs in the compose ``trt-build``
service (``nvcr.io/nvidia/tensorrt`` of the tritonserver image's release).

Precision lives in the graph: the network is built strongly typed from the
FP16 ONNX (FP16 weights and activations, FP32 inputs, output, DLRM
interaction and sigmoid), with no FP16 builder flag, which TensorRT 10
deprecates and TensorRT 11 removed.

Categorical ids stay INT64 end to end. TensorRT >= 10 has INT64 tensors: its
ONNX parser imports ``Mod`` (``fmod=0``) on INT64 as ``a - b * floor_div(a, b)``
and ``Gather`` takes INT64 indices, so the graph's modulo keeps every lookup
in its table (TensorRT would silently return zeros out of range). TensorRT 8
cast INT64 down to INT32 with clamping, which changed ids past 2**31; hence
the >= 10 requirement, and no INT32 cast in the graph.

Device memory comes from the CUDA runtime through ctypes, so the build
container needs nothing beyond its own TensorRT and CUDA.
"""

from __future__ import annotations

import ctypes
import glob
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bundle.errors import ExportError
from bundle.repository import BatchProfile
from bundle.schema import INPUTS, OUTPUTS
from criteo.tsv import Batch

log = logging.getLogger(__name__)

#: The oldest TensorRT with INT64 tensors and strongly typed networks.
MIN_TENSORRT_MAJOR = 10

_H2D = 1  # cudaMemcpyHostToDevice
_D2H = 2  # cudaMemcpyDeviceToHost
_ATTR_CC_MAJOR = 75  # cudaDevAttrComputeCapabilityMajor
_ATTR_CC_MINOR = 76  # cudaDevAttrComputeCapabilityMinor


def load_tensorrt() -> ModuleType:
    """Import ``tensorrt`` (>= 10), or raise ExportError saying where engines are built."""
    try:
        import tensorrt
    except ImportError as exc:
        raise ExportError(
            f"TensorRT is not installed here ({exc}). Engines must be built by the serving image's "
            "own TensorRT: run `docker compose run --rm trt-build` on the GPU host "
            "(see docs/serving/compose.md)."
        ) from None
    major = int(str(tensorrt.__version__).split(".")[0])
    if major < MIN_TENSORRT_MAJOR:
        raise ExportError(
            f"TensorRT {tensorrt.__version__} is too old: INT64 ids and strongly typed networks "
            f"need TensorRT >= {MIN_TENSORRT_MAJOR}"
        )
    return tensorrt


class CudaRuntime:
    """The few CUDA runtime calls needed to feed an engine, through ctypes.

    Raises:
        ExportError: no CUDA runtime library, or a call failed (e.g. no GPU).
    """

    def __init__(self) -> None:
        self._lib = self._open()
        lib = self._lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]

    @staticmethod
    def _open() -> ctypes.CDLL:
        candidates = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
        candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*"), reverse=True)
        for name in candidates:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
        raise ExportError("no CUDA runtime library (libcudart.so) found: is this a CUDA container?")

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            message = self._lib.cudaGetErrorString(status).decode(errors="replace")
            raise ExportError(f"CUDA {call} failed: {message} (error {status})")

    def device_count(self) -> int:
        """GPUs visible to this process (0 when the driver sees none)."""
        count = ctypes.c_int(0)
        status = self._lib.cudaGetDeviceCount(ctypes.byref(count))
        return count.value if status == 0 else 0

    def device(self, index: int = 0) -> dict[str, Any]:
        """Name and compute capability of GPU ``index``: an engine is valid only there."""
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._check(self._lib.cudaDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, index), "attribute")
        self._check(self._lib.cudaDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, index), "attribute")
        # cudaDeviceProp begins with `char name[256]` in every CUDA version; the
        # buffer is larger than the whole struct of any of them.
        properties = ctypes.create_string_buffer(8192)
        get = getattr(self._lib, "cudaGetDeviceProperties_v2", None) or self._lib.cudaGetDeviceProperties
        self._check(get(properties, ctypes.c_int(index)), "cudaGetDeviceProperties")
        name = properties.raw[:256].split(b"\0", 1)[0].decode(errors="replace")
        return {"name": name, "compute_capability": f"{major.value}.{minor.value}"}

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self._check(self._lib.cudaMalloc(ctypes.byref(pointer), max(nbytes, 1)), "cudaMalloc")
        return int(pointer.value or 0)

    def free(self, pointer: int) -> None:
        self._check(self._lib.cudaFree(ctypes.c_void_p(pointer)), "cudaFree")

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._check(
            self._lib.cudaMemcpy(ctypes.c_void_p(pointer), array.ctypes.data, array.nbytes, _H2D),
            "cudaMemcpy",
        )

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self._check(
            self._lib.cudaMemcpy(array.ctypes.data, ctypes.c_void_p(pointer), array.nbytes, _D2H),
            "cudaMemcpy",
        )

    def stream(self) -> int:
        stream = ctypes.c_void_p()
        self._check(self._lib.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
        return int(stream.value or 0)

    def synchronize(self, stream: int) -> None:
        self._check(self._lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def destroy_stream(self, stream: int) -> None:
        self._check(self._lib.cudaStreamDestroy(ctypes.c_void_p(stream)), "cudaStreamDestroy")


def _numpy_dtype(trt: ModuleType, dtype: Any) -> np.dtype[Any]:
    """The numpy dtype of a TensorRT ``DataType`` (by name where ``trt.nptype`` lacks it)."""
    try:
        return np.dtype(trt.nptype(dtype))
    except (TypeError, KeyError):
        by_name = {"FLOAT": np.float32, "HALF": np.float16, "INT32": np.int32, "INT64": np.int64}
        name = str(dtype).rsplit(".", 1)[-1]
        if name not in by_name:
            raise ExportError(f"engine tensor type {dtype} has no numpy counterpart here") from None
        return np.dtype(by_name[name])


def _network_flags(trt: ModuleType) -> int:
    """Strongly typed: required on TensorRT 10, accepted (and the only mode) on 11."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def trtexec_command(onnx_path: Path, plan_path: Path, profile: BatchProfile) -> str:
    """The ``trtexec`` command that builds the same engine, for logs and reports."""

    def shapes(batch: int) -> str:
        return profile.ort_shapes(batch)

    return (
        f"trtexec --onnx={onnx_path} --saveEngine={plan_path} --stronglyTyped "
        f"--minShapes={shapes(profile.min_batch)} --optShapes={shapes(profile.opt_batch)} "
        f"--maxShapes={shapes(profile.max_batch)}"
    )


def build_plan(onnx_path: Path, profile: BatchProfile, workspace_mib: int = 0) -> bytes:
    """Build a serialized TensorRT engine from ``onnx_path`` for batches in ``profile``.

    Args:
        onnx_path: the FP16 ONNX graph (external data beside it is found by path).
        profile: the one optimization profile, over the batch dimension of every input.
        workspace_mib: builder workspace limit (0: TensorRT's default, the device's memory).

    Returns:
        The plan bytes.

    Raises:
        ExportError: TensorRT is missing, the parser rejected a node, or the build failed.
    """
    trt = load_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT's ONNX parser rejected {onnx_path}: {errors}")
    config = builder.create_builder_config()
    if workspace_mib:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    optimization = builder.create_optimization_profile()
    shapes = profile.shapes()
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        if tensor.name not in shapes:
            raise ExportError(f"{onnx_path}: input {tensor.name!r} is not in the schema {sorted(shapes)}")
        optimization.set_shape(tensor.name, *shapes[tensor.name])
    config.add_optimization_profile(optimization)
    log.info("building a TensorRT %s engine from %s (batch %s)", trt.__version__, onnx_path, profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(f"TensorRT could not build an engine from {onnx_path} (see its log above)")
    return bytes(serialized)


@dataclass
class _Binding:
    name: str
    dtype: np.dtype[Any]
    pointer: int = 0


class EngineRunner:
    """Runs a plan on GPU 0 for :class:`criteo.tsv.Batch` rows, as Triton would.

    Args:
        plan: the serialized engine.

    Raises:
        ExportError: the plan does not deserialize, or its tensors differ from
            the schema (names, dtypes), which Triton's config also states.
    """

    def __init__(self, plan: bytes) -> None:
        trt = load_tensorrt()
        self._cuda = CudaRuntime()
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan)
        if self._engine is None:
            raise ExportError("TensorRT could not deserialize the plan (built by another TensorRT or GPU?)")
        self._context = self._engine.create_execution_context()
        self._stream = self._cuda.stream()
        expected = {spec.name: np.dtype(spec.dtype) for spec in (*INPUTS, *OUTPUTS)}
        found: dict[str, np.dtype[Any]] = {}
        for index in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(index)
            found[name] = _numpy_dtype(trt, self._engine.get_tensor_dtype(name))
        if found != expected:
            raise ExportError(f"engine tensors {found} differ from the schema {expected}")
        self._inputs = [_Binding(spec.name, expected[spec.name]) for spec in INPUTS]
        self._outputs = [_Binding(spec.name, expected[spec.name]) for spec in OUTPUTS]
        first = INPUTS[0].name
        self.max_batch = int(self._engine.get_tensor_profile_shape(first, 0)[2][0])
        self.min_batch = int(self._engine.get_tensor_profile_shape(first, 0)[0][0])
        self._capacity = 0

    def _allocate(self, rows: int) -> None:
        """Device buffers for ``rows`` rows of every tensor (reused while large enough)."""
        if rows <= self._capacity:
            return
        self._release()
        for binding, spec in zip((*self._inputs, *self._outputs), (*INPUTS, *OUTPUTS), strict=True):
            binding.pointer = self._cuda.malloc(rows * int(np.prod(spec.shape)) * binding.dtype.itemsize)
            self._context.set_tensor_address(binding.name, binding.pointer)
        self._capacity = rows

    def _release(self) -> None:
        for binding in (*self._inputs, *self._outputs):
            if binding.pointer:
                self._cuda.free(binding.pointer)
                binding.pointer = 0
        self._capacity = 0

    def run(self, batch: Batch) -> np.ndarray:
        """Probabilities for ``batch``: ``B x 1`` float32, in chunks of at most the profile's max."""
        feeds = batch.inputs()
        outputs = []
        for start in range(0, len(batch), self.max_batch):
            stop = min(start + self.max_batch, len(batch))
            rows = stop - start
            if rows < self.min_batch:
                raise ExportError(f"a chunk of {rows} rows is below the engine's min batch {self.min_batch}")
            self._allocate(rows)
            for binding in self._inputs:
                part = np.ascontiguousarray(feeds[binding.name][start:stop], dtype=binding.dtype)
                self._context.set_input_shape(binding.name, part.shape)
                self._cuda.to_device(binding.pointer, part)
            if not self._context.execute_async_v3(self._stream):
                raise ExportError("TensorRT execute_async_v3 failed")
            self._cuda.synchronize(self._stream)
            output = self._outputs[0]
            result = np.empty((rows, *OUTPUTS[0].shape), dtype=output.dtype)
            self._cuda.to_host(result, output.pointer)
            outputs.append(result)
        return np.concatenate(outputs)

    def close(self) -> None:
        """Free the device buffers and the stream."""
        self._release()
        if self._stream:
            self._cuda.destroy_stream(self._stream)
            self._stream = 0

    def __enter__(self) -> EngineRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
