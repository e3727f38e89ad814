"""``python -m export``: trained models -> ONNX (FP32, FP16, INT8) -> Triton model repository;
``python -m export tensorrt``: FP16 TensorRT plans for a gpu-profile repository."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bundle.cli import new_app, run
from bundle.errors import ConfigError
from export.pipeline import INT8_BY_DEFAULT, ExportedModel, ExportOptions, export_family
from export.quantize import DEFAULT_METHOD, INT8_METHODS, QuantizeOptions
from export.repository import ORT_TRT_CACHE_DIR, QUEUE_DELAY_US, ServingConfig
from export.trt_build import EngineResult, TensorRTOptions, build_engines

app = new_app("Export trained DLRM and Wide & Deep models into a Triton model repository.")

Repository = Annotated[Path, typer.Option(help="Triton model repository to write into.")]
ProfileOpt = Annotated[
    str, typer.Option(help="Serving profile: cpu, or gpu (KIND_GPU instances plus a <family>_trt model).")
]
Opset = Annotated[int, typer.Option(help="ONNX opset.")]
Fp16 = Annotated[bool, typer.Option("--fp16/--no-fp16", help="Also write the FP16 variant.")]
CheckData = Annotated[
    Path | None, typer.Option(help="Labeled Criteo TSV for the checks (default: synthetic rows).")
]
CheckRows = Annotated[int, typer.Option(help="Rows compared against the framework (>= 1024).")]
AucTolerance = Annotated[float, typer.Option(help="Max |AUC(FP16) - AUC(FP32)|.")]
Int8 = Annotated[
    bool | None,
    typer.Option(
        "--int8/--no-int8",
        help="Write the INT8 variant <family>_onnx_int8 (MLP layers quantized by ONNX Runtime; "
        "a failed accuracy check is an error). Default: "
        + ", ".join(
            f"{'written when it passes its check' if on else 'off'} ({profile})"
            for profile, on in INT8_BY_DEFAULT.items()
        )
        + ".",
    ),
]
Int8Method = Annotated[
    str,
    typer.Option(
        help=f"INT8 quantization: {' or '.join(INT8_METHODS)} (static: activation ranges calibrated on "
        "--calibration-data; dynamic: per batch at run time)."
    ),
]
Int8PerChannel = Annotated[
    bool,
    typer.Option(
        "--int8-per-channel/--int8-per-tensor", help="INT8 weight scales per output column or per layer."
    ),
]
Int8ReduceRange = Annotated[
    bool,
    typer.Option(
        "--int8-reduce-range/--int8-full-range",
        help="7-bit INT8 weights, for CPUs without AVX512-VNNI/AVX-VNNI, where u8 x s8 products can "
        "saturate (not needed with VNNI or AMX).",
    ),
]
CalibrationData = Annotated[
    Path | None,
    typer.Option(
        help="Criteo TSV (e.g. training data) whose first rows calibrate static INT8 "
        "(default: the check data, after the check rows)."
    ),
]
CalibrationRows = Annotated[int, typer.Option(help="Rows that calibrate static INT8.")]
Int8AucTolerance = Annotated[float, typer.Option(help="Max |AUC(INT8) - AUC(FP32)|.")]
MaxBatch = Annotated[int, typer.Option(help="max_batch_size in config.pbtxt.")]
Instances = Annotated[int, typer.Option(help="Model instances per model.")]
QueueDelay = Annotated[
    int | None,
    typer.Option(
        help="Dynamic batcher max queue delay (us); default "
        + ", ".join(f"{delay} ({profile})" for profile, delay in QUEUE_DELAY_US.items())
        + "."
    ),
]
Threads = Annotated[int, typer.Option(help="ONNX Runtime intra-op threads per instance (0: default).")]
OrtTrt = Annotated[
    bool,
    typer.Option(
        "--ort-trt/--no-ort-trt",
        help="gpu: run the ONNX models through ONNX Runtime's TensorRT accelerator "
        "(engine cache on a volume).",
    ),
]
TrtCache = Annotated[
    str, typer.Option(help="gpu: engine cache folder of --ort-trt inside the server container.")
]
OptBatchSize = Annotated[
    int, typer.Option(help="gpu: opt batch of the --ort-trt profile (0: min(1024, max)).")
]
GraphSizes = Annotated[
    str | None,
    typer.Option(
        help="gpu: comma-separated batch sizes the *_trt models capture CUDA graphs for "
        "(default: 1,2,4,...,128 up to the max batch; 'none': no graphs)."
    ),
]


def _graph_sizes(text: str | None) -> tuple[int, ...] | None:
    """Parse ``--cuda-graph-batch-sizes``: None keeps the default, ``none`` disables graphs."""
    if text is None:
        return None
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(
            f"--cuda-graph-batch-sizes must be comma-separated integers, got {text!r}"
        ) from None


def _options(
    repository: Path,
    profile: str,
    opset: int,
    fp16: bool,
    check_data: Path | None,
    check_rows: int,
    fp16_auc_tolerance: float,
    max_batch_size: int,
    instances: int,
    max_queue_delay_us: int | None,
    threads: int,
    ort_trt: bool,
    trt_cache_dir: str,
    opt_batch_size: int,
    cuda_graph_batch_sizes: str | None,
    int8: bool | None,
    quantize: QuantizeOptions,
    int8_auc_tolerance: float,
    calibration_data: Path | None,
) -> ExportOptions:
    delay = QUEUE_DELAY_US.get(profile, 0) if max_queue_delay_us is None else max_queue_delay_us
    serving = ServingConfig(
        profile=profile,  # type: ignore[arg-type]  # validated by ServingConfig
        max_batch_size=max_batch_size,
        instances=instances,
        max_queue_delay_us=delay,
        intra_op_threads=threads,
        ort_trt=ort_trt,
        ort_trt_cache_dir=trt_cache_dir,
        opt_batch_size=opt_batch_size,
        cuda_graph_batch_sizes=_graph_sizes(cuda_graph_batch_sizes),
    )
    return ExportOptions(
        repository=repository,
        serving=serving,
        opset=opset,
        fp16=fp16,
        check_data=check_data,
        check_rows=check_rows,
        fp16_auc_tolerance=fp16_auc_tolerance,
        int8=int8,
        quantize=quantize,
        int8_auc_tolerance=int8_auc_tolerance,
        calibration_data=calibration_data,
    )


def _quantize(method: str, per_channel: bool, reduce_range: bool, calibration_rows: int) -> QuantizeOptions:
    return QuantizeOptions(
        method=method,  # type: ignore[arg-type]  # validated by QuantizeOptions
        per_channel=per_channel,
        reduce_range=reduce_range,
        calibration_rows=calibration_rows,
    )


def _print(results: list[ExportedModel]) -> None:
    table = Table(title="exported models")
    for column in ("model", "checked against", "rows", "max abs diff", "AUC", "AUC delta", "seconds"):
        table.add_column(column)
    for r in results:
        p = r.parity
        table.add_row(
            r.name,
            r.reference,
            str(p.rows),
            f"{p.max_abs_diff:.2e}",
            "-" if p.auc is None else f"{p.auc:.4f}",
            "-" if p.auc_delta is None else f"{p.auc_delta:+.1e}",
            f"{r.seconds:.1f}",
        )
    Console(width=max(Console().width, 120)).print(table)


def _print_next_step(options: ExportOptions) -> None:
    if options.serving.profile == "gpu":
        print(
            "TensorRT model config written; build its FP16 plan on the serving GPU: "
            f"python -m export tensorrt --repository {options.repository} "
            "(or `docker compose run --rm trt-build`)"
        )


@app.command()
def dlrm(
    checkpoint: Annotated[Path, typer.Option(help="Directory written by `models train dlrm`.")],
    repository: Repository = Path("model_repository"),
    profile: ProfileOpt = "cpu",
    opset: Opset = 17,
    fp16: Fp16 = True,
    check_data: CheckData = None,
    check_rows: CheckRows = 4096,
    fp16_auc_tolerance: AucTolerance = 1e-3,
    max_batch_size: MaxBatch = 4096,
    instances: Instances = 1,
    max_queue_delay_us: QueueDelay = None,
    threads: Threads = 0,
    ort_trt: OrtTrt = False,
    trt_cache_dir: TrtCache = ORT_TRT_CACHE_DIR,
    opt_batch_size: OptBatchSize = 0,
    cuda_graph_batch_sizes: GraphSizes = None,
    int8: Int8 = None,
    int8_method: Int8Method = DEFAULT_METHOD,
    int8_per_channel: Int8PerChannel = True,
    int8_reduce_range: Int8ReduceRange = False,
    calibration_data: CalibrationData = None,
    calibration_rows: CalibrationRows = 2048,
    int8_auc_tolerance: Int8AucTolerance = 1e-3,
) -> None:
    """Export a PyTorch DLRM checkpoint (torch.onnx) as dlrm_onnx, dlrm_onnx_fp16 and, in the
    cpu profile, dlrm_onnx_int8 (in the gpu profile: the config of dlrm_trt instead)."""
    options = _options(
        repository, profile, opset, fp16, check_data, check_rows,
        fp16_auc_tolerance, max_batch_size, instances, max_queue_delay_us, threads,
        ort_trt, trt_cache_dir, opt_batch_size, cuda_graph_batch_sizes,
        int8, _quantize(int8_method, int8_per_channel, int8_reduce_range, calibration_rows),
        int8_auc_tolerance, calibration_data,
    )  # fmt: skip
    from export.onnx_dlrm import DLRMExporter

    _print(export_family(DLRMExporter(checkpoint), options))
    _print_next_step(options)


@app.command("wide-deep")
def wide_deep(
    saved_model: Annotated[Path, typer.Option(help="Directory written by `models train wide-deep`.")],
    repository: Repository = Path("model_repository"),
    profile: ProfileOpt = "cpu",
    opset: Opset = 17,
    fp16: Fp16 = True,
    check_data: CheckData = None,
    check_rows: CheckRows = 4096,
    fp16_auc_tolerance: AucTolerance = 1e-3,
    max_batch_size: MaxBatch = 4096,
    instances: Instances = 1,
    max_queue_delay_us: QueueDelay = None,
    threads: Threads = 0,
    ort_trt: OrtTrt = False,
    trt_cache_dir: TrtCache = ORT_TRT_CACHE_DIR,
    opt_batch_size: OptBatchSize = 0,
    cuda_graph_batch_sizes: GraphSizes = None,
    int8: Int8 = None,
    int8_method: Int8Method = DEFAULT_METHOD,
    int8_per_channel: Int8PerChannel = True,
    int8_reduce_range: Int8ReduceRange = False,
    calibration_data: CalibrationData = None,
    calibration_rows: CalibrationRows = 2048,
    int8_auc_tolerance: Int8AucTolerance = 1e-3,
) -> None:
    """Export a Keras Wide & Deep SavedModel (tf2onnx) as wide_deep_onnx, wide_deep_onnx_fp16 and,
    in the cpu profile, wide_deep_onnx_int8 (in the gpu profile: the config of wide_deep_trt instead)."""
    options = _options(
        repository, profile, opset, fp16, check_data, check_rows,
        fp16_auc_tolerance, max_batch_size, instances, max_queue_delay_us, threads,
        ort_trt, trt_cache_dir, opt_batch_size, cuda_graph_batch_sizes,
        int8, _quantize(int8_method, int8_per_channel, int8_reduce_range, calibration_rows),
        int8_auc_tolerance, calibration_data,
    )  # fmt: skip
    from export.onnx_wide_deep import WideDeepExporter

    _print(export_family(WideDeepExporter(saved_model), options))
    _print_next_step(options)


def _print_engines(results: list[EngineResult]) -> None:
    table = Table(title="TensorRT engines (vs ONNX Runtime FP32)")
    columns = (
        "model",
        "profile min/opt/max",
        "rows",
        "max abs diff",
        "AUC delta",
        "out-of-range ids",
        "seconds",
    )
    for column in columns:
        table.add_column(column)
    for r in results:
        p = r.parity
        table.add_row(
            r.name + (" (kept)" if r.skipped else ""),
            f"{r.profile.min_batch}/{r.profile.opt_batch}/{r.profile.max_batch}",
            str(p.rows),
            f"{p.max_abs_diff:.2e}",
            "-" if p.auc_delta is None else f"{p.auc_delta:+.1e}",
            f"{r.extreme_max_abs_diff:.2e}",
            f"{r.seconds:.1f}",
        )
    Console(width=max(Console().width, 120)).print(table)


@app.command()
def tensorrt(
    repository: Annotated[Path, typer.Option(help="Model repository written with --profile gpu.")] = Path(
        "model_repository_gpu"
    ),
    model: Annotated[
        list[str] | None, typer.Option(help="A *_trt model to build (repeatable; default: all).")
    ] = None,
    min_batch: Annotated[int, typer.Option(help="Smallest batch of the engine's profile.")] = 1,
    opt_batch: Annotated[int, typer.Option(help="Batch TensorRT tunes for (0: min(1024, max)).")] = 0,
    max_batch: Annotated[int, typer.Option(help="Largest batch (0: the config's max_batch_size).")] = 0,
    workspace_mib: Annotated[int, typer.Option(help="Builder workspace limit in MiB (0: TensorRT's).")] = 0,
    check_data: CheckData = None,
    check_rows: Annotated[
        int, typer.Option(help="Rows compared against ONNX Runtime FP32 (>= 1024).")
    ] = 4096,
    auc_tolerance: Annotated[float, typer.Option(help="Max |AUC(engine) - AUC(ONNX FP32)|.")] = 1e-3,
    max_abs_tolerance: Annotated[
        float, typer.Option(help="Max |engine - ONNX FP32| per probability (out-of-range ids included).")
    ] = 0.02,
    force: Annotated[bool, typer.Option("--force", help="Rebuild plans that are current.")] = False,
) -> None:
    """Build FP16 TensorRT plans for the *_trt models from their FP16 ONNX and check them
    against ONNX Runtime FP32 (needs TensorRT >= 10 and a GPU: run it in the trt-build service)."""
    options = TensorRTOptions(
        repository=repository,
        models=tuple(model or ()),
        min_batch=min_batch,
        opt_batch=opt_batch,
        max_batch=max_batch,
        workspace_mib=workspace_mib,
        check_data=check_data,
        check_rows=check_rows,
        auc_tolerance=auc_tolerance,
        max_abs_tolerance=max_abs_tolerance,
        force=force,
    )
    _print_engines(build_engines(options))


if __name__ == "__main__":
    run(app)
