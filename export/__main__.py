"""``python -m export``: trained models -> ONNX (FP32, FP16, INT8) -> Triton model repository;
``python -m export tensorrt``: FP16 TensorRT plans for a gpu-profile repository."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from bundle.cli import VerboseOption, new_app, run, set_verbose, shared_options
from bundle.errors import ConfigError
from bundle.memory import PeakMemory
from bundle.ngc import PINNED_RELEASE, check_release
from bundle.ngc import release as ngc_release
from bundle.options import (
    AdminKey,
    MaxBatchSize,
    MaxQueueDelay,
    Model,
    OrtThreads,
    Repository,
    RepositoryOut,
    UserFeatures,
)
from bundle.repository import CONFIG_NAME, ORT_TRT_CACHE_DIR, QUEUE_DELAY_US, ServingConfig, trt_model_name
from bundle.schema import FeatureSplit
from criteo.multihot import parse_bags
from criteo.options import Hotness, TableSizes
from criteo.tables import parse_table_sizes
from export.cli_options import (
    DlrmCheckpoint,
    HotBudget,
    Instances,
    Opset,
    ProfileData,
    StageInstances,
    StoreDtype,
)
from export.engines.trt_build import EngineResult, TensorRTOptions, build_engines
from export.framework import FrameworkExporter
from export.graphs.quantize import DEFAULT_METHOD, INT8_METHODS, QuantizeOptions
from export.importers.sources import SourceOptions, parse_feature_order, parse_input_map
from export.options import (
    INT8_BY_DEFAULT,
    PLACEMENTS,
    TORCH_BY_DEFAULT,
    TORCH_DTYPES,
    ExportOptions,
    PlacementOptions,
    current_placement,
)
from export.pipeline import ExportedModel, export_family
from export.publish_cli import fetch, publish
from export.tables.hot_rows import parse_size
from export.tables.row_store import format_bytes
from export.tables.row_store_cli import app as row_store_app
from export.tables.synthetic_model_cli import synthetic_hot_cold
from models.options import Dlrmv3Checkpoint, Dlrmv3ConfigFile

log = logging.getLogger(__name__)

app = new_app("Export trained DLRM and Wide & Deep models into a Triton model repository.")
app.add_typer(row_store_app, name="row-store")
app.command("synthetic-hot-cold")(synthetic_hot_cold)
app.command()(publish)
app.command()(fetch)

_T = TypeVar("_T")

ProfileOpt = Annotated[
    str,
    typer.Option(
        help="Serving profile: cpu, or gpu (KIND_GPU instances plus a <family>_trt model); it gives the "
        "dynamic batcher's max queue delay unless --max-queue-delay-us does: "
        + ", ".join(f"{delay} us ({profile})" for profile, delay in QUEUE_DELAY_US.items())
        + "."
    ),
]
Fp16 = Annotated[bool, typer.Option("--fp16/--no-fp16", help="Also write the FP16 variant.")]
Fp16Islands = Annotated[
    bool | None,
    typer.Option(
        "--fp16-islands/--no-fp16-islands",
        help="FP16 variant: keep the exporter's FP32 islands (DLRM's interaction); --no-fp16-islands "
        "keeps only the output's sigmoid in FP32 (no casts inside the graph). Default: islands in the "
        "cpu profile, none in the gpu profile (where the casts cost more than the interaction).",
        show_default=False,
    ),
]
CheckData = Annotated[
    _T,
    typer.Option(
        "--check-data",
        help="Labeled Criteo TSV whose rows check the written models (where optional: synthetic rows).",
    ),
]
CheckRows = Annotated[
    int, typer.Option("--check-rows", help="Rows of the check data compared with the reference.")
]
# ``--url`` of the load tests and clients is the endpoint they send requests to.
RolloutUrl = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="HTTP endpoint of a server in --model-control-mode explicit: it switches to the new "
        "version under load, with no failed request. Without it only the files are written.",
    ),
]
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
AucTarget = Annotated[
    float | None,
    typer.Option(
        help="MLPerf's accuracy rule in place of the AUC tolerances: FP16, INT8, TorchScript and "
        "AOTInductor variants pass when their AUC on the check rows is at least this percent of FP32's "
        "(99 or 99.9, MLPerf's two targets)."
    ),
]
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


Logits = Annotated[
    bool, typer.Option("--logits", help="Your model returns logits: the export appends the sigmoid.")
]
Embeddings = Annotated[
    str,
    typer.Option(
        help=f"Where the embedding tables go: {', '.join(PLACEMENTS)}. hot-cold: <family>_onnx is an "
        "ensemble of an embedding stage (cold rows from a memory-mapped row store) and a dense model that "
        "keeps the hottest rows within --hot-budget; auto: hot-cold when the tables take more than "
        "--hot-budget, else in-graph."
    ),
]
StreamTables = Annotated[
    bool,
    typer.Option(
        help="Split the tables hot/cold without building the all-in-graph graph: the row store is written "
        "straight from the checkpoint's tables (memory-mapped), for tables larger than memory. DLRM "
        "checkpoints (the bundle's, facebookresearch/dlrm, TorchRec); needs --hot-budget."
    ),
]
Torch = Annotated[
    bool | None,
    typer.Option(
        "--torch/--no-torch",
        help="PyTorch DLRMs: also write <family>_torch, TorchScript for Triton's PyTorch backend (FP16 "
        "weights, FP32 interaction and output; a failed check is an error). Instances follow --profile. "
        "Default: "
        + ", ".join(
            f"{'written when it passes its check' if on else 'off'} ({profile})"
            for profile, on in TORCH_BY_DEFAULT.items()
        )
        + ".",
    ),
]
TorchDtype = Annotated[str, typer.Option(help=f"Precision of <family>_torch: {' or '.join(TORCH_DTYPES)}.")]
Aoti = Annotated[
    bool,
    typer.Option(
        "--aoti/--no-aoti",
        help="PyTorch DLRMs: also write <family>_aoti, an AOTInductor package (model.pt2, FP32) for the "
        "pytorch backend of NGC 26.03 and later, in an ensemble with the schema's tensors; compiled for "
        "CUDA (KIND_GPU) in the gpu profile where torch sees a GPU, else for the CPU (KIND_CPU); a failed "
        "check is an error. Off unless asked: a package loads only under the PyTorch that compiled it, "
        "so export it with the serving image's torch.",
    ),
]
RawRows = Annotated[
    bool,
    typer.Option(
        "--raw-rows/--no-raw-rows",
        help="Also write <model>_raw for each model: an ensemble that takes raw Criteo TSV rows "
        "(raw_rows, one BYTES element per row) and preprocesses them in the server (criteo_rows).",
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


def _export_options(
    repository: RepositoryOut = Path("model_repository"),
    profile: ProfileOpt = "cpu",
    opset: Opset = 17,
    fp16: Fp16 = True,
    check_data: CheckData[Path | None] = None,
    check_rows: CheckRows = 4096,
    fp16_auc_tolerance: AucTolerance = 1e-3,
    fp16_islands: Fp16Islands = None,
    max_batch_size: MaxBatchSize = 4096,
    instances: Instances = 0,
    max_queue_delay_us: MaxQueueDelay[int | None] = None,
    threads: OrtThreads = 0,
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
    auc_target: AucTarget = None,
    table_sizes: TableSizes[str | None] = None,
    logits: Logits = False,
    embeddings: Embeddings = "auto",
    hot_budget: HotBudget[str | None] = None,
    profile_data: ProfileData[Path | None] = None,
    store_dtype: StoreDtype = "float32",
    stage_instances: StageInstances = 1,
    stream_tables: StreamTables = False,
    torch: Torch = None,
    torch_dtype: TorchDtype = "float16",
    aoti: Aoti = False,
    raw_rows: RawRows = True,
    user_features: UserFeatures[str | None] = None,
    verbose: VerboseOption = False,
) -> tuple[ExportOptions, SourceOptions]:
    """The options every export command shares, declared once (see :func:`bundle.cli.shared_options`)."""
    set_verbose(verbose)
    mode = current_placement(embeddings)
    if mode != embeddings:  # an earlier version's name, still taken so that scripts keep working
        log.warning("--embeddings %s was renamed to %s: give --embeddings %s", embeddings, mode, mode)
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
    quantize = QuantizeOptions(
        method=int8_method,  # type: ignore[arg-type]  # validated by QuantizeOptions
        per_channel=int8_per_channel,
        reduce_range=int8_reduce_range,
        calibration_rows=calibration_rows,
    )
    options = ExportOptions(
        repository=repository,
        serving=serving,
        opset=opset,
        fp16=fp16,
        check_data=check_data,
        check_rows=check_rows,
        fp16_auc_tolerance=fp16_auc_tolerance,
        fp16_islands=fp16_islands,
        int8=int8,
        quantize=quantize,
        int8_auc_tolerance=int8_auc_tolerance,
        auc_target=auc_target,
        calibration_data=calibration_data,
        placement=PlacementOptions(
            mode=mode,
            hot_budget=None if hot_budget is None else parse_size(hot_budget),
            profile_data=profile_data,
            store_dtype=store_dtype,
            stage_instances=stage_instances,
            stream_tables=stream_tables,
        ),
        torch=torch,
        torch_dtype=torch_dtype,
        aoti=aoti,
        raw_rows=raw_rows,
        user_features=None if user_features is None else FeatureSplit.parse(user_features),
    )
    sizes = None if table_sizes is None else parse_table_sizes(table_sizes)
    return options, SourceOptions(table_sizes=sizes, logits=logits)


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
    for r in results:
        if r.summary:
            print(r.summary)


def _print_next_step(options: ExportOptions, family: str) -> None:
    if (options.repository / trt_model_name(family) / CONFIG_NAME).is_file():
        print(
            "TensorRT model config written; build its FP16 plan on the serving GPU: "
            f"python -m export tensorrt --repository {options.repository} "
            "(or `docker compose run --rm trt-build`)"
        )
        # A gpu-profile repository is for the NGC image: say now what its release cannot read.
        for problem in check_release(options.repository, ngc_release(PINNED_RELEASE)):
            log.warning("%s (python -m export check-release)", problem)


def _export(exporter: FrameworkExporter, options: ExportOptions) -> None:
    with PeakMemory() as peak:
        results = export_family(exporter, options)
    _print(results)
    if peak.available:
        print(
            f"peak memory: {format_bytes(peak.anon_bytes)} anonymous, {format_bytes(peak.file_bytes)} of "
            "mapped files (memory-mapped checkpoints and row stores: page cache the kernel reclaims)"
        )
    _print_next_step(options, exporter.family)


@app.command()
@shared_options(shared=_export_options)
def dlrm(
    shared: tuple[ExportOptions, SourceOptions],
    checkpoint: DlrmCheckpoint[Path | None] = None,
    factory: Annotated[
        str | None,
        typer.Option(
            help="package.module:function returning your nn.Module with weights loaded (called with the "
            "--checkpoint path if given); its forward takes (dense_features B x 13 float32, "
            "categorical_ids B x 26 int64)."
        ),
    ] = None,
    feature_order: Annotated[
        str | None,
        typer.Option(
            help="TorchRec: the 26 table names in C1..C26 order, comma-separated or a range "
            "(t_cat_0..t_cat_25); default: the state dict's order."
        ),
    ] = None,
    hotness: Hotness = "1",
) -> None:
    """Export a PyTorch DLRM (torch.onnx) as dlrm_onnx, dlrm_onnx_fp16 and, in the cpu profile,
    dlrm_onnx_int8 (in the gpu profile: dlrm_torch, TorchScript FP16, dlrm_aoti, an AOTInductor
    package, and the config of dlrm_trt instead).

    --hotness is that of a multi-hot model (TorchRec or facebookresearch state dicts); --table-sizes
    is needed only when the model does not reduce ids into its tables itself and its graph does not
    show the sizes. --user-features also writes <model>_ranking beside each ONNX model: one user and
    its candidates a request, the user's features sent once and looked up once, users batched by
    Triton; checked against the model on the tiled rows."""
    options, source = shared
    if checkpoint is None and factory is None:
        raise ConfigError(
            "give --checkpoint PATH, or --factory package.module:function (with --checkpoint PATH, "
            "the function receives that path)"
        )
    bags = parse_bags(hotness)
    source = replace(
        source,
        factory=factory,
        feature_order=parse_feature_order(feature_order),
        hotness=None if isinstance(bags, str) else bags,
        variable_bags=isinstance(bags, str),
    )
    from export.importers.dlrm_sources import open_dlrm_source

    _export(open_dlrm_source(checkpoint, source), options)


@app.command()
def dlrmv3(
    checkpoint: Dlrmv3Checkpoint,
    config: Dlrmv3ConfigFile,
    repository: RepositoryOut = Path("model_repository"),
    max_queue_delay_us: MaxQueueDelay[int] = QUEUE_DELAY_US["cpu"],
    threads: OrtThreads = 0,
    verbose: VerboseOption = False,
) -> None:
    """Export a DLRMv3 (HSTU) checkpoint as dlrmv3: ONNX FP32, one user a request, users batched by
    Triton's ragged batching; checked under ONNX Runtime against the bundle's eager model (single
    users: an empty history, the longest kept and past it, the most candidates; and a batch) before
    it moves into the repository."""
    set_verbose(verbose)
    from export.dlrmv3 import export_dlrmv3

    serving = ServingConfig(max_queue_delay_us=max_queue_delay_us, intra_op_threads=threads)
    report = export_dlrmv3(checkpoint, config, repository, serving)
    onnx = report["variants"]["onnx_fp32"]
    Console().print(
        f"dlrmv3: ONNX FP32 (opset {onnx['opset']}), within {onnx['max_abs_diff']:.2g} of the eager model "
        f"(at most {onnx['tolerance']:g}); tasks {', '.join(report['tasks'])}; "
        f"histories kept to {report['max_uih_len']} items, at most "
        f"{report['max_num_candidates_inference']} candidates a user; {repository / 'dlrmv3'}",
        highlight=False,
    )


@app.command("wide-deep")
@shared_options(shared=_export_options)
def wide_deep(
    shared: tuple[ExportOptions, SourceOptions],
    saved_model: Annotated[
        Path,
        typer.Option(
            help="What to export: a TensorFlow SavedModel directory (tf.saved_model.save, Keras "
            "model.export(), or the output of `models train wide-deep`) or a .keras file."
        ),
    ],
    input_map: Annotated[
        list[str] | None,
        typer.Option(
            help="TENSOR=NAMES (repeatable): which of your model's inputs hold dense_features or "
            "categorical_ids: one name, or one per feature as a list or range "
            "(dense_features=int_0..int_12). Default: inputs named dense_features/categorical_ids, "
            "or I1..I13 and C1..C26."
        ),
    ] = None,
) -> None:
    """Export a TensorFlow/Keras Wide & Deep (tf2onnx) as wide_deep_onnx, wide_deep_onnx_fp16 and,
    in the cpu profile, wide_deep_onnx_int8 (in the gpu profile: the config of wide_deep_trt instead).
    --user-features also writes <model>_ranking beside each ONNX model (one user and its candidates a
    request), checked against the model on the tiled rows."""
    options, source = shared
    source = replace(source, input_map=parse_input_map(input_map or []))
    from export.importers.keras_sources import open_wide_deep_source

    _export(open_wide_deep_source(saved_model, source), options)


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
    repository: Repository[Path] = Path("model_repository_gpu"),
    model: Model[list[str] | None] = None,
    min_batch: Annotated[int, typer.Option(help="Smallest batch of the engine's profile.")] = 1,
    opt_batch: Annotated[int, typer.Option(help="Batch TensorRT tunes for (0: min(1024, max)).")] = 0,
    max_batch: Annotated[int, typer.Option(help="Largest batch (0: the config's max_batch_size).")] = 0,
    workspace_mib: Annotated[int, typer.Option(help="Builder workspace limit in MiB (0: TensorRT's).")] = 0,
    check_data: CheckData[Path | None] = None,
    check_rows: CheckRows = 4096,
    auc_tolerance: Annotated[float, typer.Option(help="Max |AUC(engine) - AUC(ONNX FP32)|.")] = 1e-3,
    max_abs_tolerance: Annotated[
        float, typer.Option(help="Max |engine - ONNX FP32| per probability (out-of-range ids included).")
    ] = 0.02,
    force: Annotated[bool, typer.Option("--force", help="Rebuild plans that are current.")] = False,
) -> None:
    """Build FP16 TensorRT plans for the *_trt models (all of a repository written with --profile gpu,
    or those --model names) from their FP16 ONNX and check them against ONNX Runtime FP32 (needs
    TensorRT >= 10 and a GPU: run it in the trt-build service)."""
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


@app.command("check-release")
def check_release_command(
    repository: Repository[Path] = Path("model_repository_gpu"),
    release: Annotated[
        str, typer.Option(envvar="NGC_RELEASE", help="NGC release of the serving image (YY.MM).")
    ] = PINNED_RELEASE,
) -> None:
    """Check that an NGC release's backends can read every ONNX, TorchScript and AOTInductor
    file of a repository (opset, IR version, TorchScript format, the torch that wrote or compiled
    it); exit 1 with one line per file they cannot. Where a release's version of a backend is
    not known, a file is judged against what it carries at least, and a package that needs the
    exact PyTorch is refused."""
    if not repository.is_dir():
        raise ConfigError(f"{repository} is not a model repository (no such folder)")
    try:
        target = ngc_release(release)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    problems = check_release(repository, target)
    for missing in target.not_found:
        print(f"NGC {target.name}, not found in any source read: {missing}")
    for problem in problems:
        print(problem)
    if problems:
        raise ConfigError(f"{len(problems)} file(s) of {repository} cannot be served by NGC {target.name}")
    print(
        f"every model file of {repository} fits NGC {target.name} ({target.runtime}: "
        f"opset <= {target.onnx_opset}, IR <= {target.onnx_ir}; {target.torch})"
    )


@app.command("rollout-hot-set")
def rollout_hot_set(
    profile_data: ProfileData[Path],
    check_data: CheckData[Path],
    repository: Repository[Path] = Path("model_repository"),
    family: Annotated[str, typer.Option(help="Model family: the served model is <family>_onnx.")] = "dlrm",
    hot_budget: HotBudget[str | None] = None,
    check_rows: CheckRows = 2048,
    row_store: Annotated[
        Path | None,
        typer.Option(help="The row store's folder here, when the stage's config names a container path."),
    ] = None,
    url: RolloutUrl = None,
    admin_key: AdminKey = None,
) -> None:
    """Roll out a new hot set of a hot/cold model as its next version (stage and dense model
    together), checked against the serving version first."""
    from export.tables.rollout import RolloutOptions, roll_out, serving_state
    from export.tables.synthetic_model_cli import load_profile

    options = RolloutOptions(
        repository=repository,
        family=family,
        check_data=check_data,
        hot_budget=parse_size(hot_budget) if hot_budget is not None else None,
        check_rows=check_rows,
        row_store=row_store,
        url=url,
        admin_key=admin_key,
    )
    if not profile_data.exists():
        raise ConfigError(f"profile data {profile_data} does not exist")
    serving = serving_state(repository, family, row_store)
    profile = load_profile(profile_data, serving.store.spec.table_sizes)
    print(roll_out(options, profile, serving).summary())


if __name__ == "__main__":
    run(app)
