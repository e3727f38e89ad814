"""Served and in-process samples/s of every variant of a (gpu-profile) repository, side by side.

What a GPU run measures, in one command (``python -m lab gpu``),
and what ``benchmarks/gpu/run.sh`` runs three times (the gpu profile, the cpu
profile's INT8 on the same host, the hot/cold model):

1. per model (every model with a ``model.onnx`` or ``model.pt``, or those
   named, an ensemble among them: a hot/cold model, served only): its in-process
   samples/s at each batch size, on the device its config serves it on (ONNX
   Runtime CUDA for an ONNX KIND_GPU model, torch on ``cuda:0`` for a TorchScript
   one), numpy in and out as the backend runs it;
2. then the same model loaded alone in the local tritonserver and driven at
   each step ``B x C`` (rows per request x requests in flight) from several
   client processes (:func:`loadtest.engine.served.served_throughput_processes`),
   with the inputs in system shared memory by default: at the rates a GPU
   serves, the payload must not travel inside gRPC messages, whose copies would
   then set the server's own ceiling;
3. the server's own split of each step's time (queue, compute) from its
   statistics;
4. per ONNX model, what its graph is made of (casts, the dtypes of the
   gathers and of the matrix products) and on which execution provider ONNX
   Runtime placed each node, from a profiled session: the evidence for why
   one precision is or is not faster than another.

Each model's accuracy comes from its ``export_report.json`` (the export's
gate). The report names the GPU and the verdicts a GPU run is judged by:
served/in-process at the largest batch, the fastest served DLRM and the fastest
served model of any family that pass the AUC gate (with the p99 of that step), FP16
against FP32, and each model's batch-1 p50 where a step of batch 1 was measured.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.onnx_session import inference_session
from bundle.records import RunRecord
from bundle.repository import CONFIG_NAME, MODEL_FILE, TORCHSCRIPT_FILE, read_config, read_report, version_dir
from bundle.snippets import section_end, section_start
from loadtest.engine.baseline import BaselineConfig, in_process_model, load_torchscript
from loadtest.engine.payload import MAX_POOL_ROWS, PayloadPool, build_pool
from loadtest.engine.served import served_throughput_processes
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown

logger = logging.getLogger(__name__)

#: The models measured so far, rewritten after each one and removed when the run completes.
PARTIAL_FILE = "partial.json"
#: Steps measured by default: batch 1024 and 8192 at concurrency 1, 4 and 16.
DEFAULT_STEPS: tuple[tuple[int, int], ...] = tuple((b, c) for b in (1024, 8192) for c in (1, 4, 16))
#: Served/in-process at the largest batch: the target a GPU run is judged by.
RATIO_TARGET = 0.9
#: The export's AUC gate (``--fp16-auc-tolerance``'s default), for reports that state none.
AUC_GATE = 1e-3
#: Served samples/s of the fastest DLRM passing the AUC gate: the target on one H100.
DLRM_TARGET = 10_000_000.0
#: Served samples/s of the fastest model of any family passing the AUC gate, in the gpu profile as
#: shipped: the target on one H100.
SERVED_TARGET = 15_000_000.0


@dataclass(frozen=True)
class GpuOptions:
    """What ``python -m lab gpu`` measures.

    Args:
        repository: the exported repository (gpu profile; a cpu one runs too, on the CPU).
        out: folder for ``result.json``, ``result.md`` and ``result.png``.
        models: models to measure (default: every model with a model file, by name).
        data: Criteo TSV for the request rows (default: synthetic rows).
        steps: ``(batch size, concurrency)`` pairs.
        shared_memory: ``system`` (inputs and outputs in POSIX shared memory) or ``none``.
        protocol: ``grpc`` or ``http``.
        max_processes: client processes per step at most (concurrency is spread over them).
        seconds: the length of each step's windows.
        repeats: windows per step (the median is reported).
        warmup_s: each step's warm-up before its windows.
        in_process_repeats: the in-process timer's repeats.
        in_process_seconds: the length of each of the in-process timer's repeats.
        profile_calls: calls of each ONNX model's profiled session (0: no profile).
        log_file: tritonserver's log.
    """

    repository: Path
    out: Path
    models: tuple[str, ...] = ()
    data: Path | None = None
    steps: tuple[tuple[int, int], ...] = DEFAULT_STEPS
    shared_memory: str = "system"
    protocol: str = "grpc"
    max_processes: int = 8
    seconds: float = 2.0
    repeats: int = 3
    warmup_s: float = 1.5
    in_process_repeats: int = 3
    in_process_seconds: float = 1.0
    profile_calls: int = 20
    log_file: Path = field(default_factory=lambda: Path("logs/loadtest-gpu-tritonserver.log"))

    def __post_init__(self) -> None:
        if not self.steps or any(b < 1 or c < 1 for b, c in self.steps):
            raise ConfigError(f"steps must be BATCHxCONCURRENCY pairs of positive integers, got {self.steps}")
        if self.shared_memory not in ("none", "system"):
            raise ConfigError(f"shared memory must be none or system, got {self.shared_memory!r}")
        if self.protocol not in ("grpc", "http"):
            raise ConfigError(f"protocol must be grpc or http, got {self.protocol!r}")
        if self.max_processes < 1 or self.repeats < 1 or self.in_process_repeats < 1:
            raise ConfigError("max processes and repeats must be >= 1")
        if self.seconds <= 0 or self.in_process_seconds <= 0 or self.warmup_s < 0 or self.profile_calls < 0:
            raise ConfigError("seconds must be > 0, warm-up and profile calls >= 0")

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({b for b, _ in self.steps}))


def model_file(repository: Path, name: str) -> Path | None:
    """The model file of ``name`` (``model.onnx`` or ``model.pt`` in its version 1), if any."""
    for filename in (MODEL_FILE, TORCHSCRIPT_FILE):
        path = version_dir(repository, name) / filename
        if path.is_file():
            return path
    return None


def is_ensemble(repository: Path, name: str) -> bool:
    """Whether ``name`` is an ensemble in ``repository`` (a hot/cold model: stage + dense model)."""
    path = repository / name / CONFIG_NAME
    return path.is_file() and read_config(path).platform == "ensemble"


def discover(repository: Path) -> tuple[str, ...]:
    """Every model of ``repository`` with a model file (ensembles and stages have none)."""
    if not repository.is_dir():
        raise ConfigError(f"model repository {repository} does not exist")
    return tuple(
        sorted(entry.name for entry in repository.iterdir() if model_file(repository, entry.name) is not None)
    )


def describe_gpu() -> dict[str, Any]:
    """The GPU of this machine as nvidia-smi names it (``{"name": None}`` where there is none)."""
    if shutil.which("nvidia-smi") is None:
        return {"name": None, "note": "no nvidia-smi: no NVIDIA GPU on this machine"}
    fields = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        line = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return {"name": None, "note": f"nvidia-smi failed: {exc}"}
    values = [value.strip() for value in line.split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def _precision(repository: Path, name: str) -> str:
    """FP32, FP16, BF16 or INT8, from the model's export report (or its name)."""
    report = read_report(repository, name)
    torchscript = report.get("torchscript") or {}
    if torchscript.get("dtype"):
        return {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32"}.get(torchscript["dtype"], "?")
    if report.get("quantization") or "int8" in name:
        return "INT8"
    return "FP16" if "fp16" in name else "FP32"


def gate(repository: Path, name: str) -> dict[str, Any]:
    """The export's accuracy check of ``name``, and whether it passes the AUC gate."""
    report = read_report(repository, name)
    parity = report.get("parity") or {}
    # An FP32 model is checked against its framework with no AUC tolerance of its own: the gate's.
    delta, tolerance = parity.get("auc_delta"), report.get("auc_tolerance", AUC_GATE)
    passes = None if delta is None else abs(delta) <= tolerance
    return {
        "checked_against": report.get("checked_against"),
        "rows": parity.get("rows"),
        "auc": parity.get("auc"),
        "auc_delta": delta,
        "auc_tolerance": tolerance,
        "max_abs_diff": parity.get("max_abs_diff"),
        "passes": passes,
        "cuda_check": report.get("cuda_check"),
    }


def serving(repository: Path, name: str) -> dict[str, Any]:
    """Instance kind and count, max batch size and batcher delay from the model's config.pbtxt."""
    config = read_config(repository / name / CONFIG_NAME)
    groups = list(config.instance_group)
    kinds = {1: "KIND_GPU", 2: "KIND_CPU"}
    return {
        "backend": config.backend or config.platform,
        "kind": kinds.get(groups[0].kind, str(groups[0].kind)) if groups else "default",
        "instances": sum(group.count or 1 for group in groups) or 1,
        "max_batch_size": int(config.max_batch_size),
        "queue_delay_us": int(config.dynamic_batching.max_queue_delay_microseconds),
    }


# ------------------------------------------------------------------ the ONNX graph and its placement
def graph_summary(path: Path) -> dict[str, Any]:
    """What an ONNX graph is made of: node counts by op type, the dtypes the Gathers read
    and the dtypes of the matrix products' weights."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    dtypes = {
        init.name: onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name for init in graph.initializer
    }
    ops = Counter(node.op_type for node in graph.node)
    gathers = Counter(
        dtypes.get(node.input[0], "computed") for node in graph.node if node.op_type == "Gather"
    )
    matmuls = Counter(
        dtypes.get(node.input[1], "computed") for node in graph.node if node.op_type in ("MatMul", "Gemm")
    )
    return {
        "nodes": sum(ops.values()),
        "ops": dict(ops.most_common()),
        "casts": ops.get("Cast", 0),
        "gather_tables": dict(gathers),
        "matmul_weights": dict(matmuls),
    }


def ort_profile(path: Path, device: str, batch: dict[str, Any], calls: int) -> dict[str, Any]:
    """Run ``calls`` profiled calls of ``path`` on ``device`` and summarize ONNX Runtime's profile:
    nodes per execution provider (a node on the CPU provider inside a CUDA graph is a fallback,
    with copies around it), host-side time by op type, and the median run.

    On the CUDA provider a node's time is host time (the kernel launch, not the kernel), so the
    run's total against the sum of its nodes shows how much waits on the device.
    """
    with tempfile.TemporaryDirectory() as scratch:
        session = inference_session(path, device=device, profile_prefix=Path(scratch) / "profile")
        for _ in range(calls):
            session.run(None, batch)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted(e["dur"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
    by_provider: Counter[str] = Counter()
    by_op: Counter[str] = Counter()
    for event in nodes:
        args = event.get("args", {})
        by_provider[f"{args.get('op_name', '?')} on {args.get('provider', '?')}"] += 1
        by_op[str(args.get("op_name", "?"))] += int(event.get("dur", 0))
    per_run = max(1, len(runs))
    return {
        "calls": calls,
        "providers": session.get_providers(),
        "median_run_ms": runs[len(runs) // 2] / 1000 if runs else math.nan,
        "node_host_ms_per_run": sum(by_op.values()) / per_run / 1000,
        "nodes_by_provider": dict(Counter({k: v // per_run for k, v in by_provider.items()}).most_common()),
        "host_ms_by_op": {op: round(us / per_run / 1000, 4) for op, us in by_op.most_common(12)},
    }


def device_resident_ms(path: Path, device: str, batch: dict[str, Any], calls: int) -> dict[str, Any]:
    """Median ms of one call with the inputs already on the device and the output left there,
    against one call with numpy in and out (what the backend does): the difference is the
    copies between host and device, the rest is the model's own time.

    ONNX models run with ONNX Runtime's IOBinding; TorchScript ones with torch tensors on
    ``cuda:0``. On the CPU both times are the same work.
    """
    from loadtest.engine.timer import TimerConfig, time_call

    config = TimerConfig(repeats=1, seconds=0.0, warmup_calls=3, min_calls=max(1, calls))

    def median_ms(run: Any) -> float:
        """The median of ``calls`` timed calls (the bundle's one in-process timer)."""
        return time_call(lambda _: run(), 1, config).percentile_ms(50)

    if path.suffix == ".pt":
        import torch

        target = torch.device("cuda", 0) if device == "gpu" else torch.device("cpu")
        module, order = load_torchscript(path, target)
        host = [torch.from_numpy(batch[name]) for name in order]
        resident = [tensor.to(target) for tensor in host]
        sync = torch.cuda.synchronize if target.type == "cuda" else (lambda: None)

        def on_device() -> None:
            with torch.inference_mode():
                module(*resident)
            sync()

        def from_host() -> None:
            with torch.inference_mode():
                module(*[tensor.to(target) for tensor in host]).cpu()

        found: dict[str, Any] = {
            "resident_ms": median_ms(on_device),
            "numpy_ms": median_ms(from_host),
            "calls": calls,
        }
        if target.type == "cuda":
            found["cuda_graph_ms"] = _torch_graph_ms(module, resident, median_ms)
        return found
    from bundle.schema import OUTPUT
    from loadtest.engine.session import device_binding

    session = inference_session(path, device=device)
    binding = device_binding(session, batch, "cuda" if device == "gpu" else "cpu")

    def bound() -> None:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    timings: dict[str, Any] = {
        "resident_ms": median_ms(bound),
        "numpy_ms": median_ms(lambda: session.run([OUTPUT], batch)),
        "calls": calls,
    }
    if device == "gpu":
        timings["cuda_graph_ms"] = _ort_graph_ms(path, batch, median_ms)
    return timings


def _ort_graph_ms(path: Path, batch: dict[str, Any], median_ms: Any) -> float | str:
    """Median ms of one replay of the model captured as a CUDA graph by ONNX Runtime
    (``enable_cuda_graph``; inputs and output bound on the device): the GPU's own time with no
    kernel launches from the host. The error's first line when the graph cannot be captured."""
    from loadtest.engine.session import device_binding

    try:
        session = inference_session(path, device="gpu", cuda_graph=True)
        binding = device_binding(session, batch)

        def replay() -> None:
            session.run_with_iobinding(binding)
            binding.synchronize_outputs()

        return float(median_ms(replay))
    except Exception as exc:  # ONNX Runtime raises its own exception types; reported, not fatal
        return f"not captured: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"


def _torch_graph_ms(module: Any, inputs: list[Any], median_ms: Any) -> float | str:
    """Median ms of one replay of ``module`` on ``inputs`` captured as a CUDA graph (torch.cuda.graph):
    the GPU's own time with no kernel launches from the host; the error's first line when it
    cannot be captured."""
    import torch

    try:
        with torch.inference_mode():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    module(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                module(*inputs)

        def replay() -> None:
            graph.replay()
            torch.cuda.synchronize()

        return float(median_ms(replay))
    except Exception as exc:  # torch raises RuntimeError and others; reported, not fatal
        return f"not captured: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"


# ------------------------------------------------------------------ the run
def _server_stats(url: str, protocol: str, model: str) -> dict[str, int]:
    from clients.triton import TritonClient

    with TritonClient(url, protocol) as client:  # type: ignore[arg-type]
        entries = client.statistics(model)
    keys = ("success_count", "execution_count", "inference_count", "queue_ns", "compute_infer_ns")
    return {key: sum(int(getattr(entry, key)) for entry in entries) for key in keys}


def _split(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Per request: ms queued and ms of compute; rows per model execution (the batcher's batches)."""
    delta = {key: after[key] - before[key] for key in before}
    requests, executions = max(1, delta["success_count"]), max(1, delta["execution_count"])
    return {
        "queue_ms": delta["queue_ns"] / requests / 1e6,
        "compute_ms": delta["compute_infer_ns"] / requests / 1e6,
        "rows_per_execution": delta["inference_count"] / executions,
    }


def _measure_in_process(options: GpuOptions, path: Path, rows: PayloadPool) -> dict[str, Any]:
    config = BaselineConfig(
        path,
        options.batch_sizes,
        repeats=options.in_process_repeats,
        seconds=options.in_process_seconds,
    )
    runner = in_process_model(config)
    results = {str(b): runner.measure(b, rows).as_dict() for b in options.batch_sizes}
    del runner
    return results


def _measure_model(
    options: GpuOptions, server: Any, name: str, rows: PayloadPool, workdir: Path
) -> dict[str, Any]:
    from loadtest.engine.session import serving_device

    path = model_file(options.repository, name)
    in_process: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    if path is None:
        # An ensemble (a hot/cold model): its stage and dense model run only inside the server.
        if not is_ensemble(options.repository, name):
            raise ConfigError(
                f"model {name} has no {MODEL_FILE} or {TORCHSCRIPT_FILE} in {options.repository}"
            )
    else:
        logger.info("%s: in-process", name)
        in_process = _measure_in_process(options, path, rows)
        device = serving_device(path)
        batch = rows.rebatched(max(options.batch_sizes)).batch(0)
        if options.profile_calls:
            profile["device_resident"] = device_resident_ms(path, device, batch, options.profile_calls)
        if path.suffix == ".onnx":
            profile["graph"] = graph_summary(path)
            if options.profile_calls:
                profile["ort"] = ort_profile(path, device, batch, options.profile_calls)
    url = server.grpc_url if options.protocol == "grpc" else server.http_url
    server.load_model(name, timeout=900)
    served = []
    try:
        for batch_size, concurrency in options.steps:
            logger.info("%s: served, batch %d x concurrency %d", name, batch_size, concurrency)
            before = _server_stats(url, options.protocol, name)
            result = served_throughput_processes(
                url,
                name,
                rows.rebatched(batch_size),
                concurrency,
                workdir,
                protocol=options.protocol,
                shared_memory=options.shared_memory,  # type: ignore[arg-type]
                max_processes=options.max_processes,
                seconds=options.seconds,
                repeats=options.repeats,
                warmup_s=options.warmup_s,
            )
            served.append(
                {**asdict(result), "server": _split(before, _server_stats(url, options.protocol, name))}
            )
    finally:
        server.unload_model(name)
    return {
        "model": name,
        "family": "wide_deep" if name.startswith("wide_deep") else name.split("_")[0],
        "file": path.name if path is not None else "ensemble",
        "precision": _precision(options.repository, name),
        "serving": serving(options.repository, name),
        "gate": gate(options.repository, name),
        "in_process": in_process,
        "served": served,
        "profile": profile,
    }


def run_gpu_bench(options: GpuOptions, command: str) -> dict[str, Any]:
    """Measure every model of ``options`` (see the module doc) and return the result document."""
    from server import LocalServer, ServerConfig

    names = options.models or discover(options.repository)
    if not names:
        raise ConfigError(f"{options.repository} has no model with a {MODEL_FILE} or {TORCHSCRIPT_FILE}")
    missing = [
        name
        for name in names
        if model_file(options.repository, name) is None and not is_ensemble(options.repository, name)
    ]
    if missing:
        raise ConfigError(f"no model file (and no ensemble) for {', '.join(missing)} in {options.repository}")
    max_batch = {name: serving(options.repository, name)["max_batch_size"] for name in names}
    # An ensemble's max_batch_size is 0: its tensors carry the batch dimension, its models check it.
    too_large = {name: size for name, size in max_batch.items() if 0 < size < max(options.batch_sizes)}
    if too_large:
        raise ConfigError(
            f"batch {max(options.batch_sizes)} exceeds max_batch_size of {too_large}: export with "
            f"--max-batch-size {max(options.batch_sizes)} or more"
        )
    record = RunRecord.begin(command)
    rows = build_pool(1, data=options.data, batches=MAX_POOL_ROWS)
    results = []
    config = ServerConfig.with_free_ports(
        options.repository, model_control_mode="explicit", log_file=options.log_file
    )
    with tempfile.TemporaryDirectory(prefix="loadtest-gpu-") as scratch, LocalServer(config) as server:
        for name in names:
            results.append(_measure_model(options, server, name, rows, Path(scratch)))
            # What is measured so far survives a run cut short (a lent machine's time running out).
            write_json(options.out / PARTIAL_FILE, {**record.to_json(), "results": results})
    (options.out / PARTIAL_FILE).unlink(missing_ok=True)
    return {
        **record.finish().to_json(),
        "gpu": describe_gpu(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "results": results,
        "verdicts": verdicts(results, max(options.batch_sizes)),
    }


# ------------------------------------------------------------------ verdicts and the report
def best_served(result: dict[str, Any], batch_size: int) -> dict[str, Any] | None:
    """The step of ``result`` at ``batch_size`` with the most samples/s (None if not measured)."""
    steps = [s for s in result["served"] if s["batch_size"] == batch_size]
    return max(steps, key=lambda s: s["samples_per_s"]) if steps else None


def verdicts(results: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """The GPU run's verdicts, from ``results`` at the largest batch ``batch_size``.

    The questions: does each model's best served samples/s reach :data:`RATIO_TARGET` of its
    in-process samples/s; which is the fastest served DLRM that passes its AUC gate, and does
    it reach :data:`DLRM_TARGET`; which is the fastest served model of any family that passes,
    and does it reach :data:`SERVED_TARGET` (with that step's p99); how much faster each FP16
    (or BF16) variant serves and runs in process than its FP32 model; and each model's p50 at
    batch 1 and concurrency 1, where that step was measured.
    """
    ratios = {}
    for r in results:
        best = best_served(r, batch_size)
        local = r["in_process"].get(str(batch_size))
        if best and local:
            ratios[r["model"]] = best["samples_per_s"] / local["samples_per_s"]
    passing = [
        (best["samples_per_s"], r["model"])
        for r in results
        if r["family"] == "dlrm" and r["gate"]["passes"] and (best := best_served(r, batch_size))
    ]
    fastest = max(passing) if passing else None
    overall = [
        (best["samples_per_s"], r["model"], best["p99_ms"])
        for r in results
        if r["gate"]["passes"] and (best := best_served(r, batch_size))
    ]
    fastest_any = max(overall) if overall else None
    batch1_p50 = {
        r["model"]: step["p50_ms"]
        for r in results
        for step in r["served"]
        if step["batch_size"] == 1 and step["concurrency"] == 1 and "p50_ms" in step
    }
    fp16_vs_fp32: dict[str, Any] = {}
    by_name = {r["model"]: r for r in results}
    for r in results:
        if r["precision"] not in ("FP16", "BF16") or not r["model"].endswith("_fp16"):
            continue
        reference = by_name.get(r["model"].removesuffix("_fp16"))
        if reference is None:
            continue
        fast, slow = best_served(r, batch_size), best_served(reference, batch_size)
        if fast and slow and reference["in_process"] and r["in_process"]:
            fp16_vs_fp32[r["model"]] = {
                "against": reference["model"],
                "served": fast["samples_per_s"] / slow["samples_per_s"],
                "in_process": r["in_process"][str(batch_size)]["samples_per_s"]
                / reference["in_process"][str(batch_size)]["samples_per_s"],
            }
    return {
        "batch_size": batch_size,
        "served_over_in_process": ratios,
        "ratio_target": RATIO_TARGET,
        "ratio_met": {name: value >= RATIO_TARGET for name, value in ratios.items()},
        "fastest_dlrm_passing_gate": (
            {
                "model": fastest[1],
                "samples_per_s": fastest[0],
                "target": DLRM_TARGET,
                "met": fastest[0] >= DLRM_TARGET,
            }
            if fastest
            else None
        ),
        "fastest_passing_gate": (
            {
                "model": fastest_any[1],
                "samples_per_s": fastest_any[0],
                "p99_ms": fastest_any[2],
                "target": SERVED_TARGET,
                "met": fastest_any[0] >= SERVED_TARGET,
            }
            if fastest_any
            else None
        ),
        "fp16_over_fp32": fp16_vs_fp32,
        "batch1_p50_ms": batch1_p50,
    }


def _graph_cell(value: float | str | None) -> str:
    if value is None:
        return "- (CPU)"
    return f"{value:.3f}" if isinstance(value, float) else value


def _fallbacks(ort: dict[str, Any]) -> str:
    """The nodes a CUDA session left on the CPU provider ("-" for a CPU session)."""
    if not ort or ort["providers"][0] != "CUDAExecutionProvider":
        return "- (CPU session)"
    cpu = [f"{k} x{n}" for k, n in ort["nodes_by_provider"].items() if k.endswith("on CPUExecutionProvider")]
    return ", ".join(cpu) or "none"


def _m(value: float) -> str:
    return f"{value / 1e6:.2f}M" if value >= 1e5 else f"{value:,.0f}"


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes:
#: everything below the title but the chart, and the served / in-process table with its setting.
SECTION_RESULTS = "results"
SECTION_SERVED = "served"


def write_gpu_report(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write ``result.json``, ``result.md`` and ``result.png`` into ``out``."""
    options = result["options"]
    steps = [tuple(step) for step in options["steps"]]
    batches = sorted({b for b, _ in steps})
    concurrencies = sorted({c for _, c in steps})
    gpu = result["gpu"]
    lines = [
        f"# Served and in-process samples/s on {gpu.get('name') or 'no GPU (CPU run)'}",
        "",
        section_start(SECTION_RESULTS),
        *RunRecord.from_json(result).lines(),
        f"- GPU: {', '.join(f'{k} {v}' for k, v in gpu.items())}",
        "",
        section_start(SECTION_SERVED),
        f"Served: the local tritonserver, {options['protocol']}, inputs and outputs in "
        f"{'system shared memory' if options['shared_memory'] == 'system' else 'the messages'}, "
        f"from up to {options['max_processes']} client processes; each step the median of "
        f"{options['repeats']} windows of {options['seconds']:g} s "
        f"after {options['warmup_s']:g} s of warm-up. "
        "In-process: the same file in one process on the served device, numpy in and out, one call at a time "
        f"(median of {options['in_process_repeats']} repeats of {options['in_process_seconds']:g} s). "
        "Each model was loaded alone.",
        "",
    ]
    header = [
        "model",
        "precision",
        "instances",
        "batch",
        *[f"served c{c}" for c in concurrencies],
        "in-process",
        "best served / in-process",
        "p99 ms at best",
        "queue / compute ms at best",
        "AUC delta (gate)",
    ]
    cells = []
    for r in result["results"]:
        for b in batches:
            by_c = {s["concurrency"]: s for s in r["served"] if s["batch_size"] == b}
            best = best_served(r, b)
            local = (r["in_process"].get(str(b)) or {}).get("samples_per_s")
            g = r["gate"]
            cells.append(
                [
                    f"`{r['model']}`",
                    r["precision"],
                    str(r["serving"]["instances"]),
                    str(b),
                    *[_m(by_c[c]["samples_per_s"]) if c in by_c else "-" for c in concurrencies],
                    _m(local) if local else "- (ensemble)",
                    f"{best['samples_per_s'] / local:.2f}" if best and local else "-",
                    f"{best['p99_ms']:.1f}" if best else "-",
                    f"{best['server']['queue_ms']:.2f} / {best['server']['compute_ms']:.2f}" if best else "-",
                    "-"
                    if g["auc_delta"] is None
                    else f"{g['auc_delta']:+.1e} ({'pass' if g['passes'] else 'FAIL'})",
                ]
            )
    lines += table(header, cells)
    lines.append(section_end(SECTION_SERVED))
    v = result["verdicts"]
    lines += ["", f"## Verdicts at batch {v['batch_size']}", ""]
    for name, ratio in v["served_over_in_process"].items():
        lines.append(
            f"- `{name}`: served / in-process **{ratio:.2f}** "
            f"({'meets' if ratio >= v['ratio_target'] else 'below'} {v['ratio_target']})"
        )
    fastest = v["fastest_dlrm_passing_gate"]
    if fastest:
        lines.append(
            f"- fastest served DLRM that passes the AUC gate: `{fastest['model']}`, "
            f"**{_m(fastest['samples_per_s'])} samples/s** (target {_m(fastest['target'])}: "
            f"{'met' if fastest['met'] else 'not met'})"
        )
    fastest_any = v.get("fastest_passing_gate")
    if fastest_any:
        lines.append(
            f"- fastest served model of any family that passes the AUC gate: `{fastest_any['model']}`, "
            f"**{_m(fastest_any['samples_per_s'])} samples/s**, p99 {fastest_any['p99_ms']:.1f} ms "
            f"(target {_m(fastest_any['target'])}: {'met' if fastest_any['met'] else 'not met'})"
        )
    for name, ratios in v["fp16_over_fp32"].items():
        lines.append(
            f"- `{name}` over `{ratios['against']}`: served **{ratios['served']:.2f}x**, "
            f"in-process {ratios['in_process']:.2f}x"
        )
    if v.get("batch1_p50_ms"):
        lines.append(
            "- p50 at batch 1, one request in flight: "
            + ", ".join(f"`{name}` {ms:.2f} ms" for name, ms in v["batch1_p50_ms"].items())
        )
    resident = [r for r in result["results"] if r["profile"].get("device_resident")]
    if resident:
        lines += [
            "",
            f"## One call at batch {max(batches)}: the model's own time and the copies",
            "",
            "Inputs already on the device and the output left there (ONNX Runtime IOBinding, torch "
            "tensors on the device) against numpy in and out, as the backend runs it; and the same "
            "call captured once as a CUDA graph and replayed (the GPU's own time, no kernel launches "
            "from the host); medians.",
            "",
        ]
        lines += table(
            ["model", "CUDA graph replay ms", "device-resident ms", "numpy in/out ms", "copies' share"],
            [
                [
                    f"`{r['model']}`",
                    _graph_cell(d.get("cuda_graph_ms")),
                    f"{d['resident_ms']:.3f}",
                    f"{d['numpy_ms']:.3f}",
                    f"{max(0.0, 1 - d['resident_ms'] / d['numpy_ms']):.0%}",
                ]
                for r in resident
                for d in [r["profile"]["device_resident"]]
            ],
        )
    profiled = [r for r in result["results"] if r["profile"].get("graph")]
    if profiled:
        lines += ["", "## ONNX graphs and where ONNX Runtime ran them", ""]
        rows = []
        for r in profiled:
            graph, ort = r["profile"].get("graph", {}), r["profile"].get("ort", {})
            rows.append(
                [
                    f"`{r['model']}`",
                    str(graph.get("nodes", "-")),
                    str(graph.get("casts", "-")),
                    ", ".join(f"{k} {n}" for k, n in graph.get("gather_tables", {}).items()) or "-",
                    ", ".join(f"{k} {n}" for k, n in graph.get("matmul_weights", {}).items()) or "-",
                    f"{ort['median_run_ms']:.3f}" if ort else "-",
                    f"{ort['node_host_ms_per_run']:.3f}" if ort else "-",
                    _fallbacks(ort),
                ]
            )
        lines += table(
            [
                "model",
                "nodes",
                "Casts",
                "Gather tables",
                "MatMul/Gemm weights",
                f"run ms (batch {max(batches)})",
                "host ms in nodes",
                "nodes on the CPU provider",
            ],
            rows,
        )
    png = out / "result.png"
    panels = [
        Panel(
            title=f"batch {b}",
            xlabel="requests in flight",
            ylabel="samples/s",
            xlog2=True,
            xticks=concurrencies,
            series=[
                *[
                    Series(
                        r["model"],
                        [s["concurrency"] for s in r["served"] if s["batch_size"] == b],
                        [s["samples_per_s"] for s in r["served"] if s["batch_size"] == b],
                        color_key=r["model"],
                    )
                    for r in result["results"]
                ],
                *[
                    Series(
                        f"{r['model']} in-process",
                        [min(concurrencies), max(concurrencies)],
                        [r["in_process"][str(b)]["samples_per_s"]] * 2,
                        style="--",
                        color_key=r["model"],
                    )
                    for r in result["results"]
                    if str(b) in r["in_process"]  # an ensemble is served only
                ],
            ],
        )
        for b in batches
    ]
    lines += [section_end(SECTION_RESULTS), "", f"![served samples/s against requests in flight]({png.name})"]
    return {
        "json": write_json(out / "result.json", result),
        "markdown": write_markdown(out / "result.md", lines),
        "png": plot(
            png, f"Served (solid) and in-process (dashed) samples/s, {gpu.get('name') or 'CPU'}", panels
        ),
    }
