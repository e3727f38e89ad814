"""One way to open an ONNX Runtime session, for every stage that runs a model in this process.

The export's checks, the clients' in-process reference, the load test's baseline and its
benchmarks all open their sessions here, so a file that is not an ONNX model, or a GPU run
on an onnxruntime without CUDA, fails the same way everywhere: one line naming the file and
what to do. The defaults are those of the local Triton backend
(``backends/onnxruntime/model.py``, which builds its own session because it runs
inside the stub, where the bundle is not installed): all graph optimizations, ONNX
Runtime's own thread counts, the CPU execution provider.

onnxruntime is imported inside the functions: importing the bundle stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bundle.errors import BundleError, ConfigError, DataError

#: ONNX Runtime's execution providers for each device, in order of preference. The CPU provider
#: comes last on the GPU too: ONNX Runtime runs there the nodes CUDA has no kernel for.
PROVIDERS: dict[str, tuple[str, ...]] = {
    "cpu": ("CPUExecutionProvider",),
    "gpu": ("CUDAExecutionProvider", "CPUExecutionProvider"),
}

#: ONNX Runtime's graph optimization levels (``onnxruntime.GraphOptimizationLevel``), fewest first.
GRAPH_OPTIMIZATIONS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")

#: ONNX Runtime's log severity that shows fatal errors only.
FATAL_ONLY = 4


def missing_provider(device: str) -> str | None:
    """Why this onnxruntime cannot run a model on ``device`` (``cpu`` or ``gpu``), in one line.

    Returns:
        None when the device's first provider (:data:`PROVIDERS`) is in this build.

    Raises:
        ConfigError: ``device`` is neither ``cpu`` nor ``gpu``.
    """
    import onnxruntime as ort

    if device not in PROVIDERS:
        raise ConfigError(f"device must be one of {', '.join(PROVIDERS)}, got {device!r}")
    wanted = PROVIDERS[device][0]
    available = ort.get_available_providers()
    if wanted in available:
        return None
    return (
        f"onnxruntime {ort.__version__} has no {wanted} (it offers {', '.join(available)}): "
        "install onnxruntime-gpu in place of onnxruntime"
    )


def inference_session(
    model: Path | str | bytes,
    *,
    device: str = "cpu",
    intra_op_threads: int = 0,
    inter_op_threads: int = 0,
    graph_optimization: str = "ORT_ENABLE_ALL",
    cuda_graph: bool = False,
    profile_prefix: Path | None = None,
    quiet: bool = False,
    error: type[BundleError] = DataError,
) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``model`` on ``device``.

    Args:
        model: an ``.onnx`` file (external data beside it is found), or a serialized ModelProto.
        device: ``cpu``, or ``gpu`` (ONNX Runtime's CUDA provider, as a KIND_GPU instance runs it).
        intra_op_threads: threads inside one operator (0: ONNX Runtime's default, one per core).
        inter_op_threads: threads across operators (0: ONNX Runtime's default).
        graph_optimization: one of :data:`GRAPH_OPTIMIZATIONS`.
        cuda_graph: capture the model as one CUDA graph on its first run (``gpu`` only; the
            inputs and output must then stay at the same device addresses, through an IOBinding).
        profile_prefix: write ONNX Runtime's profile of every run to a JSON file whose name
            starts with this path (``session.end_profiling()`` returns it).
        quiet: log fatal errors only (e.g. for a model expected to fail on purpose).
        error: the error raised for a model ONNX Runtime cannot load, so that it is the
            caller's stage's (``ExportError`` in the export's checks, ``ClientError`` in a client).

    Returns:
        The session, its first provider ``device``'s.

    Raises:
        ConfigError: an option out of range, or an onnxruntime that has no provider for
            ``device`` or whose CUDA provider did not start (no usable GPU or CUDA libraries).
        BundleError: ``error``: the file is missing, is not an ONNX model, or ONNX Runtime
            cannot load it.
    """
    import onnxruntime as ort

    for name, value in (("intra_op_threads", intra_op_threads), ("inter_op_threads", inter_op_threads)):
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
    if graph_optimization not in GRAPH_OPTIMIZATIONS:
        raise ConfigError(
            f"graph_optimization must be one of {', '.join(GRAPH_OPTIMIZATIONS)}, got {graph_optimization!r}"
        )
    if cuda_graph and device != "gpu":
        raise ConfigError(f"a CUDA graph needs device gpu, got {device!r}")
    missing = missing_provider(device)
    if missing is not None:
        raise ConfigError(missing)
    if isinstance(model, bytes):
        what = f"an in-memory model of {len(model):,} bytes"
    else:
        what = str(model)
        if not Path(model).is_file():
            raise error(f"model file {model} does not exist")
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, graph_optimization)
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    if quiet:
        options.log_severity_level = FATAL_ONLY
    providers: list[str | tuple[str, dict[str, str]]] = list(PROVIDERS[device])
    if cuda_graph:
        providers[0] = (PROVIDERS[device][0], {"enable_cuda_graph": "1"})
    try:
        session = ort.InferenceSession(
            model if isinstance(model, bytes) else str(model), sess_options=options, providers=providers
        )
    # ONNX Runtime's own exceptions derive from Exception directly.
    except Exception as exc:
        reason = str(exc).strip()
        # onnxruntime's exception types live in its private pybind module: matched by name.
        if type(exc).__name__ == "InvalidProtobuf":
            raise error(f"{what} is not an ONNX model (onnxruntime: {reason})") from exc
        on = f" on {PROVIDERS[device][0]}" if device != "cpu" else ""
        raise error(f"onnxruntime cannot load {what}{on}: {reason}") from exc
    if session.get_providers()[0] != PROVIDERS[device][0]:
        # ONNX Runtime falls back to the CPU, with a log line only, when CUDA does not start.
        raise ConfigError(
            f"onnxruntime's {PROVIDERS[device][0]} did not start for {what} (no usable GPU or CUDA libraries)"
        )
    return session
