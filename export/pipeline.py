"""The export pipeline shared by both frameworks.

framework model -> FP32 ONNX (checked against the framework, including ids far
outside every table) -> FP16 ONNX (checked against FP32 on AUC) -> Triton
model repository entries with their configs and export reports. The gpu
profile also writes each family's TensorRT model config (``<family>_trt``);
its plan is built from the FP16 ONNX by ``python -m export tensorrt``
(:mod:`export.trt_build`), on the serving GPU's own TensorRT.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx

from bundle.errors import ConfigError, ExportError
from criteo.tsv import Batch
from export.fp16 import convert_to_fp16
from export.framework import FrameworkExporter
from export.onnx_io import save_model
from export.parity import ParityResult, check_rows, compare, extreme_id_rows, run_onnx
from export.repository import (
    MODEL_FILE,
    ServingConfig,
    add_model,
    add_trt_model,
    clear_model,
    trt_model_name,
    version_dir,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportOptions:
    """Options of one export run.

    Args:
        repository: the Triton model repository to write into.
        serving: how Triton serves the exported models.
        opset: ONNX opset of the exported graphs.
        fp16: also write the FP16 variant.
        check_data: labeled Criteo TSV for the checks (None: synthetic rows).
        check_rows: rows compared against the framework (>= 1024).
        fp32_tolerance: max abs difference of FP32 ONNX vs framework probabilities.
        fp16_auc_tolerance: max |AUC(FP16) - AUC(FP32)| on the check rows.
    """

    repository: Path
    serving: ServingConfig = field(default_factory=ServingConfig)
    opset: int = 17
    fp16: bool = True
    check_data: Path | None = None
    check_rows: int = 4096
    fp32_tolerance: float = 1e-5
    fp16_auc_tolerance: float = 1e-3

    def __post_init__(self) -> None:
        if not 13 <= self.opset <= 23:
            raise ConfigError(f"opset must be in 13..23, got {self.opset}")
        if self.check_rows < 1024:
            raise ConfigError(f"check_rows must be >= 1024, got {self.check_rows}")
        if self.fp32_tolerance <= 0 or self.fp16_auc_tolerance <= 0:
            raise ConfigError("tolerances must be positive")
        if self.serving.profile == "gpu" and not self.fp16:
            raise ConfigError("the gpu profile builds its TensorRT models from the FP16 ONNX: drop --no-fp16")


@dataclass(frozen=True)
class ExportedModel:
    """One model written to the repository and the result of its check."""

    name: str
    path: Path
    reference: str
    parity: ParityResult
    seconds: float


def _report(exported: ExportedModel, options: ExportOptions, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": exported.name,
        "checked_against": exported.reference,
        "parity": asdict(exported.parity),
        "opset": options.opset,
        "seconds": round(exported.seconds, 3),
        **extra,
    }


def _check_fp32(exporter: FrameworkExporter, path: Path, rows: Batch, options: ExportOptions) -> ParityResult:
    extreme = extreme_id_rows(rows)
    framework = exporter.predict(rows)
    parity = compare(run_onnx(path, rows), framework, rows.labels)
    extreme_parity = compare(run_onnx(path, extreme), exporter.predict(extreme), None)
    worst = max(parity.max_abs_diff, extreme_parity.max_abs_diff)
    if worst > options.fp32_tolerance:
        raise ExportError(
            f"{path}: FP32 ONNX differs from the framework by {worst:.3g} "
            f"(tolerance {options.fp32_tolerance:g}; out-of-range ids: {extreme_parity.max_abs_diff:.3g})"
        )
    return ParityResult(parity.rows + extreme_parity.rows, worst, parity.auc, parity.auc_delta)


def export_family(exporter: FrameworkExporter, options: ExportOptions) -> list[ExportedModel]:
    """Export ``exporter``'s model as ``<family>_onnx`` (and ``<family>_onnx_fp16``).

    In the gpu profile, also write the config of ``<family>_trt`` (its plan is
    built later by ``python -m export tensorrt``); in the cpu profile, remove a
    ``<family>_trt`` left from an earlier gpu export, which a CPU server could
    not load and which would no longer match the new ONNX.

    Returns:
        The ONNX models written, each with its parity result.

    Raises:
        ExportError: a conversion failed or a check exceeded its tolerance; the
            failing model is not left in the repository.
    """
    rows = check_rows(options.check_data, options.check_rows)
    fp32_name = f"{exporter.family}_onnx"
    fp32_path = version_dir(options.repository, fp32_name, 1) / MODEL_FILE
    clear_model(options.repository, fp32_name)
    results: list[ExportedModel] = []
    try:
        start = time.perf_counter()
        log.info("exporting %s to %s", fp32_name, fp32_path)
        fp32_path.parent.mkdir(parents=True, exist_ok=True)
        exporter.to_onnx(fp32_path, options.opset)
        parity = _check_fp32(exporter, fp32_path, rows, options)
        fp32 = ExportedModel(fp32_name, fp32_path, "framework", parity, time.perf_counter() - start)
        add_model(options.repository, fp32_name, options.serving, report=_report(fp32, options, {}))
        results.append(fp32)
    except BaseException:
        clear_model(options.repository, fp32_name)
        raise
    if options.fp16:
        results.append(_export_fp16(exporter, fp32_path, rows, options))
    trt_name = trt_model_name(exporter.family)
    clear_model(options.repository, trt_name)
    if options.serving.profile == "gpu":
        path = add_trt_model(options.repository, trt_name, options.serving)
        log.info("wrote %s; build its plan with `python -m export tensorrt`", path)
    return results


def _export_fp16(
    exporter: FrameworkExporter, fp32_path: Path, rows: Batch, options: ExportOptions
) -> ExportedModel:
    name = f"{exporter.family}_onnx_fp16"
    path = version_dir(options.repository, name, 1) / MODEL_FILE
    clear_model(options.repository, name)
    try:
        start = time.perf_counter()
        log.info("converting %s to FP16 at %s", fp32_path, path)
        model = onnx.load(str(fp32_path))
        keep = exporter.fp32_nodes(model)
        save_model(convert_to_fp16(model, keep), path)
        if rows.labels is None:
            raise ExportError("the FP16 check needs labeled rows")
        parity = compare(run_onnx(path, rows), run_onnx(fp32_path, rows), rows.labels)
        delta = parity.auc_delta if parity.auc_delta is not None else float("nan")
        if not abs(delta) <= options.fp16_auc_tolerance:
            raise ExportError(
                f"{path}: FP16 AUC differs from FP32 by {delta:.3g} "
                f"(tolerance {options.fp16_auc_tolerance:g}; max abs diff {parity.max_abs_diff:.3g})"
            )
        fp16 = ExportedModel(name, path, "onnx_fp32", parity, time.perf_counter() - start)
        add_model(
            options.repository,
            name,
            options.serving,
            report=_report(fp16, options, {"fp32_nodes": keep}),
            fp16=True,
        )
        return fp16
    except BaseException:
        clear_model(options.repository, name)
        raise
