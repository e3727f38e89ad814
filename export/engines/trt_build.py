"""``python -m export tensorrt``: FP16 TensorRT plans for the ``*_trt`` models of a gpu repository.

For each ``<family>_trt`` model (written by ``python -m export <family>
--profile gpu``) this builds ``<family>_trt/1/model.plan`` from
``<family>_onnx_fp16/1/model.onnx`` and checks the engine against ONNX Runtime
FP32 (``<family>_onnx``) on labeled rows (max abs difference, AUC delta) and
on rows of ids at the int64 limits; the result goes to
``<family>_trt/export_report.json``. A plan whose check fails is removed.

The optimization profile must cover what the model's config.pbtxt makes
Triton send: ``max`` >= ``max_batch_size``, and ``min`` <= every warmup and
CUDA graph batch size. The build is skipped when the plan in place was built
from the same ONNX bytes, TensorRT version, GPU and profile (``--force``
rebuilds), so ``docker compose up`` does not rebuild on every start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError, ExportError
from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    PLAN_FILE,
    TRT_PLATFORM,
    TRT_SUFFIX,
    BatchProfile,
    config_hotness,
    read_config,
    version_dir,
    write_report,
)
from bundle.schema import inputs_for
from criteo.tsv import Batch
from export.graphs.onnx_io import model_files
from export.graphs.parity import ParityResult, check_rows, compare, extreme_id_rows, run_onnx

if TYPE_CHECKING:
    from export.engines.trt_engine import EngineRunner

log = logging.getLogger(__name__)

REPORT_FILE = "export_report.json"


@dataclass(frozen=True)
class TensorRTOptions:
    """Options of one engine build run.

    Args:
        repository: a model repository written with ``--profile gpu``.
        models: the ``*_trt`` models to build (empty: every one in the repository).
        min_batch: the profile's smallest batch.
        opt_batch: the batch TensorRT tunes for (0: ``DEFAULT_OPT_BATCH`` capped at max).
        max_batch: the profile's largest batch (0: the model config's ``max_batch_size``).
        workspace_mib: builder workspace limit (0: TensorRT's default).
        check_data: labeled Criteo TSV for the check (None: synthetic rows).
        check_rows: rows compared against ONNX Runtime FP32 (>= 1024).
        auc_tolerance: max |AUC(engine) - AUC(ONNX FP32)|.
        max_abs_tolerance: max |engine - ONNX FP32| on any probability, the
            rows of out-of-range ids included.
        force: rebuild even when the plan in place is current.
    """

    repository: Path
    models: tuple[str, ...] = ()
    min_batch: int = 1
    opt_batch: int = 0
    max_batch: int = 0
    workspace_mib: int = 0
    check_data: Path | None = None
    check_rows: int = 4096
    auc_tolerance: float = 1e-3
    max_abs_tolerance: float = 0.02
    force: bool = False

    def __post_init__(self) -> None:
        if self.min_batch < 1 or self.opt_batch < 0 or self.max_batch < 0 or self.workspace_mib < 0:
            raise ConfigError("--min-batch must be >= 1; --opt-batch, --max-batch, --workspace-mib >= 0")
        if self.check_rows < 1024:
            raise ConfigError(f"check_rows must be >= 1024, got {self.check_rows}")
        if self.auc_tolerance <= 0 or self.max_abs_tolerance <= 0:
            raise ConfigError("tolerances must be positive")
        for name in self.models:
            if not name.endswith(TRT_SUFFIX):
                raise ConfigError(f"{name!r} is not a TensorRT model name (<family>{TRT_SUFFIX})")

    def command(self) -> str:
        """The ``python -m export tensorrt`` command line of these options, for logs."""
        args = ["python", "-m", "export", "tensorrt", "--repository", str(self.repository)]
        for name in self.models:
            args += ["--model", name]
        args += ["--min-batch", str(self.min_batch), "--opt-batch", str(self.opt_batch)]
        args += ["--max-batch", str(self.max_batch)]
        if self.check_data is not None:
            args += ["--check-data", str(self.check_data)]
        if self.force:
            args.append("--force")
        return shlex.join(args)


@dataclass(frozen=True)
class EngineResult:
    """One ``*_trt`` model after a run.

    Attributes:
        name: the model name.
        plan: the plan path.
        profile: the optimization profile of the plan.
        parity: engine vs ONNX Runtime FP32 on the labeled check rows.
        extreme_max_abs_diff: the same on rows of ids at the int64 limits.
        seconds: build and check time (0 when skipped).
        skipped: the plan in place was current and was kept.
    """

    name: str
    plan: Path
    profile: BatchProfile
    parity: ParityResult
    extreme_max_abs_diff: float
    seconds: float
    skipped: bool


def find_trt_models(repository: Path) -> list[str]:
    """Names of the models in ``repository`` whose config says ``platform: "tensorrt_plan"``."""
    if not repository.is_dir():
        raise ConfigError(f"{repository} is not a model repository folder")
    return sorted(
        path.parent.name
        for path in repository.glob(f"*/{CONFIG_NAME}")
        if read_config(path).platform == TRT_PLATFORM
    )


def source_models(name: str) -> tuple[str, str]:
    """``(FP16 ONNX model, FP32 ONNX model)`` a TensorRT model is built from and checked against."""
    family = name.removesuffix(TRT_SUFFIX)
    return f"{family}_onnx_fp16", f"{family}_onnx"


def _smallest_batch(config: mc.ModelConfig) -> int:
    """The smallest batch this config makes Triton run: warmups and CUDA graphs."""
    sizes = [warmup.batch_size for warmup in config.model_warmup]
    for spec in config.optimization.cuda.graph_spec:
        sizes += [spec.batch_size, spec.graph_lower_bound.batch_size or spec.batch_size]
    return min(sizes, default=1)


def resolve_profile(config: mc.ModelConfig, options: TensorRTOptions) -> BatchProfile:
    """The engine's profile for ``config``, checked against what Triton will send it.

    Raises:
        ConfigError: ``max`` below ``max_batch_size`` (Triton refuses the plan),
            or ``min`` above a warmup or CUDA graph batch (the load would fail).
    """
    max_batch = options.max_batch or config.max_batch_size
    if max_batch < config.max_batch_size:
        raise ConfigError(
            f"{config.name}: --max-batch {max_batch} is below the config's max_batch_size "
            f"{config.max_batch_size}; Triton would refuse the plan. Build with --max-batch >= "
            f"{config.max_batch_size} or re-export with a smaller --max-batch-size"
        )
    smallest = _smallest_batch(config)
    if options.min_batch > smallest:
        raise ConfigError(
            f"{config.name}: --min-batch {options.min_batch} is above batch {smallest}, which the "
            "config's warmup or CUDA graphs run at load"
        )
    if options.min_batch > 1:
        log.warning(
            "%s: requests of fewer than %d rows will fail (the dynamic batcher may send them alone)",
            config.name,
            options.min_batch,
        )
    # A multi-hot model's categorical_ids is B x H: its config's hotness says H.
    inputs = inputs_for(config_hotness(config))
    return BatchProfile.for_max(max_batch, options.opt_batch, options.min_batch, inputs)


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def build_key(
    onnx_path: Path, tensorrt_version: str, device: dict[str, Any], profile: BatchProfile
) -> dict[str, Any]:
    """What a plan depends on: a plan with the same key need not be rebuilt."""
    return {
        "onnx_sha256": _sha256(model_files(onnx_path)),
        "tensorrt": tensorrt_version,
        "gpu": device["name"],
        "compute_capability": device["compute_capability"],
        "profile": profile.key(),
        "strongly_typed": True,
    }


def plan_is_current(model_dir: Path, key: dict[str, Any]) -> bool:
    """Whether ``model_dir`` holds a plan whose report records ``key``."""
    plan = model_dir / "1" / PLAN_FILE
    report = model_dir / REPORT_FILE
    if not (plan.is_file() and report.is_file()):
        return False
    try:
        return bool(json.loads(report.read_text()).get("build_key") == key)
    except (OSError, ValueError):
        return False


def _check_engine(
    runner: EngineRunner, reference: Path, options: TensorRTOptions, hotness: tuple[int, ...] | None = None
) -> tuple[ParityResult, float]:
    """Compare the engine with ONNX Runtime FP32 on labeled and on out-of-range-id rows (a multi-hot
    model's bags made from each row's ids, as its export checked it)."""
    rows = check_rows(options.check_data, options.check_rows)
    if hotness is not None:
        from criteo.multihot import expand

        rows = Batch(rows.dense, expand(rows.categorical, hotness), rows.labels)
    if rows.labels is None:
        raise ExportError("the engine check needs labeled rows")
    parity = compare(runner.run(rows), run_onnx(reference, rows), rows.labels)
    extreme = extreme_id_rows(rows)
    extreme_parity = compare(runner.run(extreme), run_onnx(reference, extreme), None)
    delta = parity.auc_delta if parity.auc_delta is not None else float("nan")
    worst = max(parity.max_abs_diff, extreme_parity.max_abs_diff)
    if not abs(delta) <= options.auc_tolerance or worst > options.max_abs_tolerance:
        raise ExportError(
            f"the engine differs from ONNX Runtime FP32: AUC delta {delta:.3g} (tolerance "
            f"{options.auc_tolerance:g}), max abs diff {parity.max_abs_diff:.3g}, on out-of-range ids "
            f"{extreme_parity.max_abs_diff:.3g} (tolerance {options.max_abs_tolerance:g})"
        )
    return parity, extreme_parity.max_abs_diff


def _build_one(
    name: str, options: TensorRTOptions, tensorrt_version: str, device: dict[str, Any]
) -> EngineResult:
    from export.engines.trt_engine import EngineRunner, build_plan, trtexec_command

    repository = options.repository
    config = read_config(repository / name / CONFIG_NAME)
    fp16_name, fp32_name = source_models(name)
    source = version_dir(repository, fp16_name) / MODEL_FILE
    reference = version_dir(repository, fp32_name) / MODEL_FILE
    for path in (source, reference):
        if not path.is_file():
            raise ConfigError(f"{path} is missing: export the family with --profile gpu first")
    profile = resolve_profile(config, options)
    plan_path = version_dir(repository, name) / PLAN_FILE
    key = build_key(source, tensorrt_version, device, profile)
    if not options.force and plan_is_current(repository / name, key):
        log.info("%s: the plan in place is current (same ONNX, TensorRT, GPU, profile); kept", name)
        report = json.loads((repository / name / REPORT_FILE).read_text())
        parity = ParityResult(**report["parity"])
        return EngineResult(name, plan_path, profile, parity, report["extreme_max_abs_diff"], 0.0, True)

    trtexec = trtexec_command(source, plan_path, profile)
    start = time.perf_counter()
    try:
        plan = build_plan(source, profile, options.workspace_mib)
        plan_path.parent.mkdir(parents=True, exist_ok=True)
        partial = plan_path.with_name(PLAN_FILE + ".partial")
        partial.write_bytes(plan)
        partial.replace(plan_path)
        with EngineRunner(plan) as runner:
            parity, extreme = _check_engine(runner, reference, options, config_hotness(config))
    except BaseException:
        # Neither a plan that failed its check nor the report of an older one stays.
        plan_path.unlink(missing_ok=True)
        (repository / name / REPORT_FILE).unlink(missing_ok=True)
        log.error("building %s failed; to reproduce: %s\n  (the same engine with trtexec: %s)",
                  name, options.command(), trtexec)  # fmt: skip
        raise
    seconds = time.perf_counter() - start
    write_report(
        repository,
        name,
        {
            "model": name,
            "built_from": fp16_name,
            "checked_against": fp32_name,
            "parity": asdict(parity),
            "extreme_max_abs_diff": extreme,
            "build_key": key,
            "trtexec_equivalent": trtexec,
            "seconds": round(seconds, 3),
        },
    )
    return EngineResult(name, plan_path, profile, parity, extreme, seconds, False)


def build_engines(options: TensorRTOptions) -> list[EngineResult]:
    """Build and check the plan of every requested ``*_trt`` model.

    Returns:
        One result per model, in name order.

    Raises:
        ConfigError: no ``*_trt`` model, a requested one is missing, a source
            ONNX is missing, or the profile does not fit a config.
        ExportError: TensorRT or a GPU is missing, a build failed, or an engine
            failed its check (its plan is then removed).
    """
    available = find_trt_models(options.repository)
    if not available:
        raise ConfigError(
            f"{options.repository} holds no TensorRT model: export the families with --profile gpu first"
        )
    missing = sorted(set(options.models) - set(available))
    if missing:
        raise ConfigError(f"{missing} not in {options.repository} (it holds {available})")
    names = [name for name in available if not options.models or name in options.models]

    from export.engines.trt_engine import CudaRuntime, load_tensorrt

    trt = load_tensorrt()
    cuda = CudaRuntime()
    if cuda.device_count() < 1:
        raise ExportError("no GPU visible to this process: engines are built on the serving GPU")
    device = cuda.device(0)
    log.info("TensorRT %s on %s (compute capability %s)", trt.__version__, device["name"],
             device["compute_capability"])  # fmt: skip
    return [_build_one(name, options, str(trt.__version__), device) for name in names]
