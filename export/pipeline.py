"""The export pipeline shared by both frameworks.

framework model -> FP32 ONNX (checked against the framework, including ids far
outside every table) -> FP16 ONNX and, in the cpu profile, INT8 ONNX (each
checked against FP32 on AUC; a variant that fails is not written) -> Triton
model repository entries with their configs and export reports. The gpu
profile also writes each family's TensorRT model config (``<family>_trt``);
its plan is built from the FP16 ONNX by ``python -m export tensorrt``
(:mod:`export.engines.trt_build`), on the serving GPU's own TensorRT. A PyTorch family
gets, in the gpu profile, ``<family>_torch``: TorchScript in FP16 for Triton's
PyTorch backend (:mod:`export.engines.torchscript`), and ``<family>_aoti``: an
AOTInductor package in FP32 (:mod:`export.engines.aoti`) inside an ensemble with the
schema's tensors, each checked against the framework.

Where a GPU is visible, the reduced-precision checks run there too: the FP16
ONNX on ONNX Runtime's CUDA provider (with onnxruntime-gpu) and the TorchScript
on CUDA; each report's ``cuda_check`` holds the result and the largest
CUDA-vs-CPU difference, or why the check was skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bundle.errors import ConfigError, ExportError
from bundle.memory import PeakMemory
from bundle.repository import (
    AOTI_FILE,
    MODEL_FILE,
    TORCHSCRIPT_FILE,
    add_aoti_model,
    add_model,
    add_torch_model,
    add_trt_model,
    aoti_model_name,
    aoti_package_name,
    clear_model,
    read_report,
    torch_model_name,
    trt_model_name,
    version_dir,
    write_report,
)
from bundle.schema import ranking_model_name, raw_model_name
from bundle.staging import RepositoryWrite
from criteo.multihot import fixed_bags, read_bags
from criteo.tsv import Batch, read_batch
from export.framework import FrameworkExporter, StreamedTables, TorchSource
from export.graphs.fp16 import convert_to_fp16
from export.graphs.onnx_io import DataFile, external_tensors, save_model
from export.graphs.parity import (
    ParityResult,
    check_rows,
    compare,
    extreme_id_rows,
    onnx_cuda_session,
    run_onnx,
    run_session,
)
from export.graphs.quantize import quantize_int8
from export.options import ExportOptions
from export.ranking.variants import write_ranking_variant
from export.raw_rows import STAGE_MODEL, write_raw_models
from export.tables.ensemble import PRECISIONS, dense_model_name, embedding_model_name, ensemble_model_name
from export.tables.placement import place_embeddings, place_streamed

log = logging.getLogger(__name__)

#: Seed of synthetic calibration rows (the synthetic check rows use another).
CALIBRATION_SEED = 20261123
#: Rows per ONNX Runtime call in the checks (as :func:`export.graphs.parity.run_onnx` runs them).
CHECK_CHUNK = 4096
#: Batch sizes the INT8 check runs its rows at. Dynamically quantized layers take
#: their activation scales from the whole batch, so a row's answer depends on the
#: rows batched with it: the AUC must hold from single rows to large batches, and
#: the worst counts. (Statically quantized answers are the same at every size.)
INT8_GATE_BATCHES = (1, 64, CHECK_CHUNK)
#: Max |TorchScript - framework| per probability, out-of-range ids included: the TensorRT
#: engines' default bound (``python -m export tensorrt --max-abs-tolerance``). It leaves room
#: above what the FP16 and BF16 variants differ by on the ``small`` preset (BF16 the more, with
#: its 8-bit mantissa), whose AUC stays well inside the gate; each export's report records the
#: difference its own model reached (``parity.max_abs_diff``).
TORCH_MAX_ABS_DIFF = 0.02
#: Max |AOTInductor package - framework| per probability, out-of-range ids and single rows
#: included. The package computes in FP32 as the framework does, so only the order in which
#: Inductor's fused kernels add up differs: the bound is the FP32 ONNX graph's default
#: (``fp32_tolerance``), far tighter than the reduced-precision variants'. Each export's report
#: records the difference its own package reached (``parity.max_abs_diff``).
AOTI_MAX_ABS_DIFF = 1e-5
#: Rows the AOTInductor check also runs one at a time: the smallest batch of the package's
#: dynamic range must run and agree as the large ones do.
AOTI_SINGLE_ROWS = 8


@dataclass(frozen=True)
class ExportedModel:
    """One model written to the repository and the result of its check."""

    name: str
    path: Path
    reference: str
    parity: ParityResult
    seconds: float
    #: One line the CLI prints after its table ("" for none).
    summary: str = ""


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
    """Export ``exporter``'s model as ``<family>_onnx`` (and ``<family>_onnx_fp16``,
    ``<family>_onnx_int8`` as ``options`` ask), all or nothing.

    The models are written and checked in a staging repository beside
    ``options.repository`` (:class:`bundle.staging.RepositoryWrite`), then moved in, one
    rename per model folder, under a journal that finishes the moves if this process
    dies among them. So an export that fails, is interrupted or runs out of space leaves
    the repository as it was, and a server reading it never sees a half-written model.
    Afterwards the family's models in the repository are exactly this export's: a model
    of the family that it did not write (an INT8 variant that failed its gate, a
    TorchScript or hot/cold model of an earlier export) is removed in the same commit.
    Each ``export_report.json`` records the run that wrote it (``run``), so variants of
    one family from two runs are told apart.

    Disk: the earlier models stay until the commit, so the repository's filesystem holds
    both for the length of the export.

    In the gpu profile, also write the config of ``<family>_trt`` (its plan is
    built later by ``python -m export tensorrt``); in the cpu profile, remove a
    ``<family>_trt`` left from an earlier gpu export, which a CPU server could
    not load and which would no longer match the new ONNX.

    For a PyTorch family, ``options.writes_torch`` adds ``<family>_torch``
    (TorchScript, :func:`_export_torch`) and ``options.aoti`` adds ``<family>_aoti``
    with ``<family>_aoti_package`` (AOTInductor, :func:`_export_aoti`); those of an
    earlier export are removed otherwise.

    When ``options.placement`` places the tables hot/cold, ``<family>_onnx`` becomes
    the ensemble of ``<family>_embedding`` and ``<family>_dense``, checked against the
    all-in-graph FP32 graph (:func:`export.tables.placement.place_embeddings`); the FP16 and
    INT8 variants are then ensembles of the same stage and their own dense model
    (:mod:`export.tables.hot_cold_variants`), and no TorchScript, AOTInductor or TensorRT variant
    is written.

    Returns:
        The ONNX models written, each with its parity result.

    Raises:
        ExportError: a conversion failed or a check exceeded its tolerance; the
            failing model is not left in the repository.
    """
    if options.torch and not isinstance(exporter, TorchSource):
        raise ConfigError(
            f"--torch: {exporter.family} is not a PyTorch model; the TorchScript variant is for PyTorch DLRMs"
        )
    if options.aoti and not isinstance(exporter, TorchSource):
        raise ConfigError(
            f"--aoti: {exporter.family} is not a PyTorch model; the AOTInductor variant is for PyTorch DLRMs"
        )
    hotness = getattr(exporter, "hotness", None)
    variable_bags = bool(getattr(exporter, "variable_bags", False))
    if options.aoti and variable_bags:
        raise ConfigError(
            "--aoti: an AOTInductor package takes categorical_ids; a model of bags of any size is served "
            "by the ONNX models: drop --aoti"
        )
    if hotness is not None or variable_bags:
        if options.placement.may_split and variable_bags:
            raise ConfigError(
                "a model of bags of any size is not placed hot/cold yet: give a fixed --hotness, or drop "
                "--hot-budget"
            )
        if options.raw_rows:
            log.info("a multi-hot model takes bags of ids, not Criteo rows: no raw-row models written")
        serving = dataclasses.replace(
            options.serving,
            hotness=None if hotness is None else tuple(hotness),
            variable_bags=variable_bags,
        )
        options = dataclasses.replace(options, serving=serving, raw_rows=False)
    repository = Path(options.repository)
    family = exporter.family
    with RepositoryWrite(repository, f"export {family}") as write:
        staged = dataclasses.replace(options, repository=write.staged)
        rows = _check_batch(exporter, staged)
        results = _export_family(exporter, staged, rows)
        results += _export_ranking(family, staged, rows)
        if options.raw_rows:
            served = [name for name in served_models(family) if (write.staged / name).is_dir()]
            # The family's own raw-row model feeds the first of these: INT8, else FP32, ...
            default = sorted(served, key=lambda name: name != ensemble_model_name(family, "int8"))
            write_raw_models(write.staged, default, family)
            write.put(write.staged / STAGE_MODEL, repository / STAGE_MODEL)
        run = {"id": write.run_id, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        for name in family_models(family):
            if (write.staged / name).is_dir():
                report = read_report(write.staged, name)
                if report:
                    write_report(write.staged, name, {**report, "run": run})
                write.put(write.staged / name, repository / name)
            elif (repository / name).exists():
                write.remove(repository / name)
        write.commit()
    return [dataclasses.replace(r, path=repository / r.path.relative_to(write.staged)) for r in results]


def served_models(family: str) -> tuple[str, ...]:
    """The models of ``family`` a client calls (each may have a raw-row model)."""
    return (
        *(ensemble_model_name(family, precision) for precision in PRECISIONS),
        trt_model_name(family),
        torch_model_name(family),
        aoti_model_name(family),
    )


def family_models(family: str) -> tuple[str, ...]:
    """Every model name an export of ``family`` may write: an export owns them all (the raw-row
    stage, ``criteo_rows``, serves every family and is not one of them)."""
    return (
        *served_models(family),
        *(dense_model_name(family, precision) for precision in PRECISIONS),
        embedding_model_name(family),
        aoti_package_name(family),
        *(raw_model_name(name) for name in served_models(family)),
        raw_model_name(family),
        *(ranking_model_name(ensemble_model_name(family, precision)) for precision in PRECISIONS),
    )


def read_rows(exporter: FrameworkExporter | None, path: Path, max_rows: int) -> Batch:
    """Up to ``max_rows`` rows of ``path`` as the model takes them: a model of bags (a fixed
    hotness, or bags of any size) reads the multi-hot text format (:mod:`criteo.multihot`),
    every other model Criteo's."""
    hotness = getattr(exporter, "hotness", None)
    if bool(getattr(exporter, "variable_bags", False)):
        return read_bags(path, max_rows)
    if hotness is not None:
        return fixed_bags(read_bags(path, max_rows), hotness)
    return read_batch(path, max_rows)


def model_rows(exporter: FrameworkExporter, batch: Batch) -> Batch:
    """``batch`` as ``exporter``'s model takes it: a multi-hot model's exporter makes each
    table's bag from the row's id (``model_rows``); every other model takes the rows as they are."""
    adapt = getattr(exporter, "model_rows", None)
    return adapt(batch) if adapt is not None else batch


def _check_batch(exporter: FrameworkExporter, options: ExportOptions) -> Batch:
    """The rows every check of the export runs on: the check data's first ``check_rows``, or
    synthetic rows."""
    if options.check_data is not None:
        rows = read_rows(exporter, options.check_data, options.check_rows)
        if len(rows) < options.check_rows:
            raise ExportError(
                f"{options.check_data} has {len(rows)} rows; the checks need {options.check_rows}"
            )
        return rows
    return model_rows(exporter, check_rows(None, options.check_rows))


def _export_ranking(family: str, options: ExportOptions, rows: Batch) -> list[ExportedModel]:
    """``<model>_ranking`` beside each ONNX model of the family in ``options.repository`` (the
    staging repository), as ``options.user_features`` splits the features."""
    split = options.user_features
    if split is None:
        return []
    if options.serving.variable_bags:
        log.info("no ranking variants: a model of bags of any size takes no fixed user part")
        return []
    written = []
    for precision in PRECISIONS:
        name = ensemble_model_name(family, precision)
        if not (version_dir(options.repository, name, 1) / MODEL_FILE).is_file():
            if (options.repository / name).is_dir():
                log.info("no ranking variant of %s: it is an ensemble (hot/cold tables)", name)
            continue
        report = {"source": name, "opset": options.opset}
        made = write_ranking_variant(
            options.repository, name, split, options.serving, rows, report, fp16=precision == "fp16"
        )
        parity = made.parity
        summary = f"{made.name}: {made.once} of {made.lookups} lookups once per user"
        written.append(ExportedModel(made.name, made.path, f"{name} (tiled)", parity, made.seconds, summary))
    return written


def _export_family(exporter: FrameworkExporter, options: ExportOptions, rows: Batch) -> list[ExportedModel]:
    """:func:`export_family` into ``options.repository`` (the staging repository)."""
    if options.placement.stream_tables:  # no all-in-graph graph: the tables may not fit in memory
        streamed = place_streamed(exporter, rows, options)
        ensemble = ExportedModel(
            streamed.name, streamed.path, "framework", streamed.parity, streamed.seconds, streamed.summary
        )
        return [ensemble, *_export_placed_variants(exporter, rows, options)]
    _suggest_streaming(exporter, options)
    fp32_name = f"{exporter.family}_onnx"
    fp32_path = version_dir(options.repository, fp32_name, 1) / MODEL_FILE
    clear_model(options.repository, fp32_name)
    results: list[ExportedModel] = []
    try:
        start = time.perf_counter()
        log.info("exporting %s to %s", fp32_name, fp32_path)
        fp32_path.parent.mkdir(parents=True, exist_ok=True)
        with PeakMemory() as peak:
            exporter.to_onnx(fp32_path, options.opset)
            parity = _check_fp32(exporter, fp32_path, rows, options)
        fp32 = ExportedModel(fp32_name, fp32_path, "framework", parity, time.perf_counter() - start)
        report = _report(fp32, options, {"source": exporter.source, "peak_memory": peak.report()})
        add_model(options.repository, fp32_name, options.serving, report=report)
        results.append(fp32)
    except BaseException:
        clear_model(options.repository, fp32_name)
        raise
    torch_name = torch_model_name(exporter.family)
    aoti_name = aoti_model_name(exporter.family)
    for name in (torch_name, aoti_name, aoti_package_name(exporter.family)):
        clear_model(options.repository, name)
    placed = place_embeddings(exporter, fp32_path, fp32.parity, rows, options)
    if placed is not None:
        reference = "onnx_fp32 (in-graph)"
        ensemble = ExportedModel(
            placed.name, placed.path, reference, placed.parity, placed.seconds, placed.summary
        )
        return [ensemble, *_export_placed_variants(exporter, rows, options)]
    if options.fp16:
        results.append(_export_fp16(exporter, fp32_path, rows, options))
    int8_name = f"{exporter.family}_onnx_int8"
    clear_model(options.repository, int8_name)
    if options.writes_int8:
        try:
            results.append(_export_int8(exporter, fp32_path, rows, options))
        except ExportError as exc:
            if options.int8:
                raise
            log.warning(
                "%s not written (the cpu profile serves the other models): %s. "
                "--int8 makes this an error, --no-int8 skips INT8, --int8-method picks another method",
                int8_name, exc,
            )  # fmt: skip
    if options.writes_torch and isinstance(exporter, TorchSource):
        try:
            results.append(_export_torch(exporter, exporter, rows, options))
        except ExportError as exc:
            if options.torch:
                raise
            log.warning(
                "%s not written (the ONNX models serve): %s. --torch makes it an error, --no-torch skips it",
                torch_name, exc,
            )  # fmt: skip
    if options.aoti and isinstance(exporter, TorchSource):  # bags of any size: refused by export_family
        results.append(_export_aoti(exporter, exporter, rows, options))
    trt_name = trt_model_name(exporter.family)
    clear_model(options.repository, trt_name)
    if options.serving.profile == "gpu" and options.serving.variable_bags:
        log.info("no %s: its TensorRT plan is built for categorical_ids, not bags of any size", trt_name)
    elif options.serving.profile == "gpu":
        path = add_trt_model(options.repository, trt_name, options.serving)
        log.info("wrote %s; build its plan with `python -m export tensorrt`", path)
    return results


def _suggest_streaming(exporter: FrameworkExporter, options: ExportOptions) -> None:
    """Warn, before the all-in-graph graph is built, when a checkpoint's tables exceed the memory
    available now and ``--stream-tables`` would place them hot/cold without building it."""
    import psutil

    sizes = exporter.table_sizes
    if not options.placement.may_split or not isinstance(exporter, StreamedTables) or sizes is None:
        return
    table_bytes = sum(sizes) * exporter.embedding_dim * 4
    available = int(psutil.virtual_memory().available)
    if table_bytes > available:
        log.warning(
            "the tables take %.1f GB and %.1f GB of memory is available: the all-in-graph graph holds "
            "them all while it is built; --stream-tables writes the row store straight from the "
            "checkpoint instead",
            table_bytes / 1e9, available / 1e9,
        )  # fmt: skip


def _gate_parity(
    path: Path, fp32_path: Path, rows: Batch, batch_sizes: tuple[int, ...]
) -> tuple[ParityResult, dict[str, Any]]:
    """Compare the variant at ``path`` with FP32 on ``rows``, run in batches of each of ``batch_sizes``.

    Returns:
        The worst comparison (largest |AUC delta|; max abs difference over all
        batch sizes), and report fields: each batch size's comparison and, with
        more than one, how far one row's answer moves between batch sizes.
    """
    reference = run_onnx(fp32_path, rows)
    outputs = {size: run_onnx(path, rows, chunk=size) for size in batch_sizes}
    checks = {size: compare(output, reference, rows.labels) for size, output in outputs.items()}
    worst = max(checks.values(), key=lambda p: abs(p.auc_delta) if p.auc_delta is not None else float("inf"))
    largest = max(p.max_abs_diff for p in checks.values())
    parity = ParityResult(worst.rows, largest, worst.auc, worst.auc_delta)
    extra: dict[str, Any] = {}
    if len(batch_sizes) > 1:
        extra["parity_by_batch_size"] = {str(size): asdict(p) for size, p in checks.items()}
        first = outputs[batch_sizes[0]].astype(np.float64)
        extra["max_abs_diff_between_batch_sizes"] = max(
            float(np.max(np.abs(output - first))) for output in outputs.values()
        )
    return parity, extra


def _export_variant(
    name: str,
    label: str,
    fp32_path: Path,
    rows: Batch,
    options: ExportOptions,
    tolerance: float,
    build: Callable[[Path], dict[str, Any]],
    fp16: bool = False,
    gate_batches: tuple[int, ...] = (CHECK_CHUNK,),
    cuda: bool = False,
) -> ExportedModel:
    """Write variant ``name`` with ``build(path)``, gate it on AUC against the FP32 graph, add it.

    Args:
        name: the model name (``dlrm_onnx_fp16``, ``dlrm_onnx_int8``).
        label: precision for messages (``FP16``, ``INT8``).
        fp32_path: the checked FP32 graph.
        rows: labeled check rows.
        options: the export options.
        tolerance: max |AUC(variant) - AUC(FP32)|, at every batch size of ``gate_batches``.
        build: writes the variant's ``model.onnx`` to the path given; returns extra report fields.
        fp16: the variant is the FP16 graph (for the config's accelerator settings).
        gate_batches: batch sizes the check rows run at.
        cuda: also gate the variant on ONNX Runtime's CUDA provider where one runs
            here (:func:`_onnx_cuda_check`); the report's ``cuda_check`` says how it went.

    Raises:
        ExportError: the conversion failed or the AUC moved more than ``tolerance``;
            the variant is then not left in the repository.
    """
    path = version_dir(options.repository, name, 1) / MODEL_FILE
    clear_model(options.repository, name)
    try:
        start = time.perf_counter()
        with PeakMemory() as peak:
            extra = build(path)
            if rows.labels is None:
                raise ExportError(f"the {label} check needs labeled rows")
            parity, gate_extra = _gate_parity(path, fp32_path, rows, gate_batches)
        gate_extra["peak_memory"] = peak.report()
        delta = parity.auc_delta if parity.auc_delta is not None else float("nan")
        passes, rule = options.auc_gate(parity.auc, parity.auc_delta, tolerance)
        if not passes:
            at = f" at batch sizes {', '.join(map(str, gate_batches))}" if len(gate_batches) > 1 else ""
            raise ExportError(
                f"{path}: {label} AUC differs from FP32 by {delta:.3g}{at} "
                f"({rule}; max abs diff {parity.max_abs_diff:.3g})"
            )
        gate_extra["auc_gate"] = rule
        if cuda:
            gate_extra["cuda_check"] = _onnx_cuda_check(path, fp32_path, rows, label, tolerance)
        exported = ExportedModel(name, path, "onnx_fp32", parity, time.perf_counter() - start)
        report = _report(exported, options, {"auc_tolerance": tolerance, **extra, **gate_extra})
        add_model(options.repository, name, options.serving, report=report, fp16=fp16)
        return exported
    except BaseException:
        clear_model(options.repository, name)
        raise


def output_nodes(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """Those of ``names`` whose node writes a graph output (the final sigmoid)."""
    outputs = {output.name for output in model.graph.output}
    return [node.name for node in model.graph.node if node.name in names and outputs & set(node.output)]


def _fp16_keep(
    exporter: FrameworkExporter, model: onnx.ModelProto, options: ExportOptions
) -> tuple[list[str], bool]:
    """The nodes the FP16 variant keeps in FP32, and whether they include the exporter's islands
    (``--fp16-islands``; default: in the cpu profile, not in the gpu one)."""
    keep = exporter.fp32_nodes(model)
    islands = options.fp16_islands if options.fp16_islands is not None else options.serving.profile != "gpu"
    return (keep if islands else output_nodes(model, keep)), islands


def _export_fp16(
    exporter: FrameworkExporter, fp32_path: Path, rows: Batch, options: ExportOptions
) -> ExportedModel:
    def build(path: Path) -> dict[str, Any]:
        log.info("converting %s to FP16 at %s", fp32_path, path)
        # Weights in a data file stay there: converted or copied in chunks, never loaded whole.
        model = onnx.load(str(fp32_path), load_external_data=False)
        keep, islands = _fp16_keep(exporter, model, options)
        with DataFile(path) if external_tensors(model) else contextlib.nullcontext() as data:
            converted = convert_to_fp16(model, keep, source=fp32_path, data=data)
            save_model(converted, path, source_dir=fp32_path.parent, data=data)
        return {"source": exporter.source, "fp32_nodes": keep, "fp16_islands": islands}

    name = f"{exporter.family}_onnx_fp16"
    return _export_variant(
        name, "FP16", fp32_path, rows, options, options.fp16_auc_tolerance, build, fp16=True, cuda=True
    )


def _cuda_skipped(reason: str) -> dict[str, Any]:
    """A report's ``cuda_check`` where no GPU check ran."""
    log.info("CUDA check skipped: %s", reason)
    return {"status": "skipped", "reason": reason}


def _onnx_cuda_check(
    path: Path, fp32_path: Path, rows: Batch, label: str, tolerance: float
) -> dict[str, Any]:
    """Gate the variant at ``path`` on ONNX Runtime's CUDA provider as on the CPU, where CUDA runs here.

    The reference stays the FP32 graph on the CPU, so the AUC gate means the same on
    both; the CUDA-vs-CPU difference of the variant itself is reported beside it.

    Returns:
        The report's ``cuda_check``: ``status`` ``passed`` with the parity and
        ``max_abs_diff_vs_cpu``, or ``skipped`` with the ``reason``.

    Raises:
        ExportError: the variant's AUC on CUDA moved more than ``tolerance``.
    """
    session, why_not = onnx_cuda_session(path)
    if session is None:
        return _cuda_skipped(why_not)
    on_cuda = run_session(session, rows, CHECK_CHUNK)
    on_cpu = run_onnx(path, rows, CHECK_CHUNK)
    parity = compare(on_cuda, run_onnx(fp32_path, rows, CHECK_CHUNK), rows.labels)
    delta = parity.auc_delta if parity.auc_delta is not None else float("nan")
    if not abs(delta) <= tolerance:
        raise ExportError(
            f"{path}: {label} on ONNX Runtime's CUDA provider: AUC differs from FP32 by {delta:.3g} "
            f"(tolerance {tolerance:g}; max abs diff {parity.max_abs_diff:.3g})"
        )
    vs_cpu = float(np.max(np.abs(on_cuda.astype(np.float64) - on_cpu.astype(np.float64))))
    log.info("%s on CUDA: AUC delta %+.1e, max abs diff vs its CPU run %.2e", path, delta, vs_cpu)
    return {
        "status": "passed",
        "provider": "CUDAExecutionProvider",
        "parity": asdict(parity),
        "max_abs_diff_vs_cpu": vs_cpu,
    }


@dataclass(frozen=True)
class _Gated:
    """The parts of a compiled model's check, each compared with the framework's outputs.

    Attributes:
        parts: each part's parity, in the order run; the first is the check rows (their AUC).
        output: the first part's outputs.
        worst: the largest probability difference over the parts.
        passes: the AUC rule held.
        rule: the AUC rule, in words.
    """

    parts: list[ParityResult]
    output: np.ndarray
    worst: float
    passes: bool
    rule: str

    @property
    def delta(self) -> float:
        """The check rows' AUC change (NaN without labels)."""
        first = self.parts[0]
        return first.auc_delta if first.auc_delta is not None else float("nan")

    def parity(self) -> ParityResult:
        """Every part's rows together, the worst difference, the check rows' AUC."""
        first = self.parts[0]
        return ParityResult(sum(part.rows for part in self.parts), self.worst, first.auc, first.auc_delta)


def _gate(
    path: Path,
    device: str,
    runs: list[tuple[Callable[[], np.ndarray], np.ndarray, np.ndarray | None]],
    options: ExportOptions,
) -> _Gated:
    """Run each part of a check (its run, the framework's outputs, labels or None; the check rows
    first) and compare; a part that fails to run or gives an invalid probability raises
    :class:`ExportError` naming ``path`` and ``device``. The AUC rule is
    ``options.fp16_auc_tolerance``'s, on the first part."""
    parts: list[ParityResult] = []
    outputs: list[np.ndarray] = []
    try:
        for run, reference, labels in runs:
            outputs.append(run())
            parts.append(compare(outputs[-1], reference, labels))
    except ExportError as exc:
        raise ExportError(f"{path} on {device}: {exc}") from None
    passes, rule = options.auc_gate(parts[0].auc, parts[0].auc_delta, options.fp16_auc_tolerance)
    return _Gated(parts, outputs[0], max(part.max_abs_diff for part in parts), passes, rule)


def _torch_gate(
    path: Path,
    device: str,
    rows: Batch,
    reference: np.ndarray,
    extreme: Batch,
    extreme_reference: np.ndarray,
    options: ExportOptions,
) -> tuple[ParityResult, np.ndarray]:
    """Run the TorchScript at ``path`` on ``device`` and gate it against the framework's outputs.

    Returns:
        The parity (rows and out-of-range-id rows together; AUC on ``rows``) and the
        outputs on ``rows``.

    Raises:
        ExportError: an invalid probability, the AUC moved more than
            ``options.fp16_auc_tolerance``, or a probability more than :data:`TORCH_MAX_ABS_DIFF`.
    """
    from export.engines.torchscript import run_torchscript

    gated = _gate(
        path,
        device,
        [
            (lambda: run_torchscript(path, rows, device), reference, rows.labels),
            (lambda: run_torchscript(path, extreme, device), extreme_reference, None),
        ],
        options,
    )
    if not gated.passes or gated.worst > TORCH_MAX_ABS_DIFF:
        raise ExportError(
            f"{path} ({options.torch_dtype}) on {device} differs from the framework: AUC by "
            f"{gated.delta:.3g} ({gated.rule}), probabilities by up to {gated.worst:.3g} "
            f"(tolerance {TORCH_MAX_ABS_DIFF:g}; out-of-range ids: {gated.parts[1].max_abs_diff:.3g})"
        )
    return gated.parity(), gated.output


def _export_torch(
    exporter: FrameworkExporter, source: TorchSource, rows: Batch, options: ExportOptions
) -> ExportedModel:
    """Write ``<family>_torch``: the model as TorchScript in ``options.torch_dtype``.

    Checked against the framework's own output on the check rows and on ids at the
    int64 limits, negative and past every table (:func:`_torch_gate`), on the CPU
    and, where torch sees one, on a CUDA device (its CUDA-vs-CPU difference in the
    report's ``cuda_check``).

    Args:
        exporter: the model's exporter (``predict`` is the reference).
        source: the same exporter, as the source of its module.
        rows: labeled check rows.
        options: the export options.

    Raises:
        ExportError: tracing failed or a check failed; the model is then not left in the repository.
    """
    from export.engines.torchscript import cuda_device_name, torch_cuda_unavailable, write_torchscript

    name = torch_model_name(exporter.family)
    path = version_dir(options.repository, name, 1) / TORCHSCRIPT_FILE
    clear_model(options.repository, name)
    try:
        start = time.perf_counter()
        log.info("tracing %s as TorchScript (%s) at %s", exporter.family, options.torch_dtype, path)
        with PeakMemory() as peak:
            built = write_torchscript(source.torch_serving(), options.torch_dtype, path)
            if rows.labels is None:
                raise ExportError("the TorchScript check needs labeled rows")
            extreme = extreme_id_rows(rows)
            reference, extreme_reference = exporter.predict(rows), exporter.predict(extreme)
            parity, on_cpu = _torch_gate(path, "cpu", rows, reference, extreme, extreme_reference, options)
            why_not = torch_cuda_unavailable()
            if why_not is not None:
                cuda = _cuda_skipped(why_not)
            else:
                cuda_parity, on_cuda = _torch_gate(
                    path, "cuda", rows, reference, extreme, extreme_reference, options
                )
                cuda = {
                    "status": "passed",
                    "device": cuda_device_name(),
                    "parity": asdict(cuda_parity),
                    "max_abs_diff_vs_cpu": float(np.max(np.abs(on_cuda.astype(np.float64) - on_cpu))),
                }
        exported = ExportedModel(name, path, "framework", parity, time.perf_counter() - start)
        extra = {"source": exporter.source, "torchscript": built, "peak_memory": peak.report()}
        report = _report(exported, options, extra)
        del report["opset"]  # no ONNX here
        report.update(
            auc_tolerance=options.fp16_auc_tolerance, max_abs_tolerance=TORCH_MAX_ABS_DIFF, cuda_check=cuda
        )
        add_torch_model(options.repository, name, options.serving, report=report)
        return exported
    except BaseException:
        clear_model(options.repository, name)
        raise


def _aoti_gate(
    path: Path,
    device: str,
    rows: Batch,
    reference: np.ndarray,
    extreme: Batch,
    extreme_reference: np.ndarray,
    options: ExportOptions,
) -> tuple[ParityResult, dict[str, Any]]:
    """Run the AOTInductor package at ``path`` on ``device`` and gate it against the framework's outputs.

    The check rows run in batches of up to ``max_batch_size`` (the top of the package's dynamic
    batch), and their first :data:`AOTI_SINGLE_ROWS` rows once more one at a time (its bottom).

    Returns:
        The parity (rows, out-of-range-id rows and single rows together; AUC on ``rows``) and
        report fields: each part's max abs difference and the batch sizes run.

    Raises:
        ExportError: the package failed on the rows, gave an invalid probability, the AUC moved more
            than ``options.fp16_auc_tolerance``, or a probability more than :data:`AOTI_MAX_ABS_DIFF`.
    """
    from export.engines.aoti import run_aoti

    chunk = min(CHECK_CHUNK, options.serving.max_batch_size)
    single = rows.slice(0, AOTI_SINGLE_ROWS)
    gated = _gate(
        path,
        device,
        [
            (lambda: run_aoti(path, rows, device, chunk=chunk), reference, rows.labels),
            (lambda: run_aoti(path, extreme, device, chunk=chunk), extreme_reference, None),
            (lambda: run_aoti(path, single, device, chunk=1), reference[: len(single)], None),
        ],
        options,
    )
    _, extreme_parity, single_parity = gated.parts
    if not gated.passes or gated.worst > AOTI_MAX_ABS_DIFF:
        raise ExportError(
            f"{path} on {device} differs from the framework: AUC by {gated.delta:.3g} ({gated.rule}), "
            f"probabilities by up to {gated.worst:.3g} (tolerance {AOTI_MAX_ABS_DIFF:g}; out-of-range ids: "
            f"{extreme_parity.max_abs_diff:.3g}, one row at a time: {single_parity.max_abs_diff:.3g})"
        )
    extra = {
        "auc_gate": gated.rule,
        "max_abs_diff_out_of_range_ids": extreme_parity.max_abs_diff,
        "max_abs_diff_one_row_at_a_time": single_parity.max_abs_diff,
        "check_batch_sizes": sorted({1, min(chunk, len(rows))}),
    }
    return gated.parity(), extra


def _export_aoti(
    exporter: FrameworkExporter, source: TorchSource, rows: Batch, options: ExportOptions
) -> ExportedModel:
    """Write ``<family>_aoti``: the model as an AOTInductor package in FP32, in an ensemble.

    The package (``<family>_aoti_package/1/model.pt2``, compiled for the device
    :func:`export.engines.aoti.compile_device` picks for the profile, and served on instances
    of that device's kind) is checked against the framework's own output on the check rows,
    on ids at the int64 limits, negative and past every table, and one row at a time
    (:func:`_aoti_gate`), on the device it is compiled for; then its config and the
    ensemble's are written (:func:`bundle.repository.add_aoti_model`).

    Args:
        exporter: the model's exporter (``predict`` is the reference).
        source: the same exporter, as the source of its module.
        rows: labeled check rows.
        options: the export options.

    Raises:
        ExportError: export, compilation or a check failed; neither model is then left in the repository.
    """
    from export.engines.aoti import compile_device, write_aoti

    name, package = aoti_model_name(exporter.family), aoti_package_name(exporter.family)
    path = version_dir(options.repository, package, 1) / AOTI_FILE
    for model in (name, package):
        clear_model(options.repository, model)
    try:
        start = time.perf_counter()
        device, device_note = compile_device(options.serving.profile)
        log.info("compiling %s with AOTInductor (FP32, %s) at %s", exporter.family, device, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with PeakMemory() as peak:
            built = write_aoti(source.torch_serving(), path, options.serving.max_batch_size, device)
            if rows.labels is None:
                raise ExportError("the AOTInductor check needs labeled rows")
            extreme = extreme_id_rows(rows)
            reference, extreme_reference = exporter.predict(rows), exporter.predict(extreme)
            parity, gate = _aoti_gate(path, device, rows, reference, extreme, extreme_reference, options)
        exported = ExportedModel(name, path, "framework", parity, time.perf_counter() - start)
        report = _report(exported, options, {"source": exporter.source, "package_model": package, **built})
        del report["opset"]  # no ONNX here
        report.update(
            device_note=device_note,
            auc_tolerance=options.fp16_auc_tolerance,
            max_abs_tolerance=AOTI_MAX_ABS_DIFF,
            **gate,
            peak_memory=peak.report(),
        )
        add_aoti_model(options.repository, name, package, options.serving, report=report, device=device)
        return exported
    except BaseException:
        for model in (name, package):
            clear_model(options.repository, model)
        raise


def calibration_rows(options: ExportOptions, exporter: FrameworkExporter | None = None) -> tuple[Batch, str]:
    """Rows that calibrate the static INT8 variant, and where they came from.

    ``options.calibration_data`` when given (its first rows); else the check
    data's rows after the check rows (or its first rows, shared with the
    check, when the file is too short); else synthetic rows of a seed other
    than the check rows'.
    """
    wanted = options.quantize.calibration_rows
    if options.calibration_data is not None:
        batch = read_rows(exporter, options.calibration_data, wanted)
        if len(batch) == 0:
            raise ExportError(f"calibration data {options.calibration_data} has no rows")
        return batch, f"{options.calibration_data}: rows 1-{len(batch)}"
    if options.check_data is not None:
        batch = read_rows(exporter, options.check_data, options.check_rows + wanted)
        if len(batch) >= options.check_rows + wanted:
            first, last = options.check_rows, options.check_rows + wanted
            return batch.slice(first, last), f"{options.check_data}: rows {first + 1}-{last}"
        log.warning(
            "%s has %d rows, fewer than the %d check rows + %d calibration rows: "
            "calibrating on its first rows, which the INT8 check also uses",
            options.check_data, len(batch), options.check_rows, wanted,
        )  # fmt: skip
        part = batch.slice(0, wanted)
        return part, f"{options.check_data}: rows 1-{len(part)} (shared with the check)"
    return check_rows(None, wanted, seed=CALIBRATION_SEED), f"synthetic rows (seed {CALIBRATION_SEED})"


def _export_int8(
    exporter: FrameworkExporter, fp32_path: Path, rows: Batch, options: ExportOptions
) -> ExportedModel:
    def build(path: Path) -> dict[str, Any]:
        calibration: Batch | None = None
        source = ""
        if options.quantize.method == "static":
            calibration, source = calibration_rows(options, exporter)
            calibration = model_rows(exporter, calibration)
        log.info("quantizing %s to INT8 (%s) at %s", fp32_path, options.quantize.method, path)
        keep = exporter.fp32_nodes(onnx.load(str(fp32_path), load_external_data=False))
        graph = quantize_int8(fp32_path, path, keep, options.quantize, calibration, source)
        return {
            "source": exporter.source,
            "quantization": graph.settings,
            "int8_nodes": graph.quantized_nodes,
            "fp32_matmul_nodes": graph.fp32_nodes,
        }

    name = f"{exporter.family}_onnx_int8"
    return _export_variant(
        name,
        "INT8",
        fp32_path,
        rows,
        options,
        options.int8_auc_tolerance,
        build,
        gate_batches=INT8_GATE_BATCHES,
    )


def _export_placed_variants(
    exporter: FrameworkExporter, rows: Batch, options: ExportOptions
) -> list[ExportedModel]:
    """A hot/cold model's FP16 and INT8 variants, as ``options`` ask (:mod:`export.tables.hot_cold_variants`).

    As for an in-graph model, an INT8 variant that fails its gate is an error only with ``--int8``.
    """
    from export.tables.ensemble import dense_model_name
    from export.tables.hot_cold_variants import VariantRecipe, export_variant

    family, repository = exporter.family, options.repository
    dense = onnx.load(
        str(version_dir(repository, dense_model_name(family), 1) / MODEL_FILE), load_external_data=False
    )
    written = []
    if options.fp16:
        keep, islands = _fp16_keep(exporter, dense, options)
        recipe = VariantRecipe("fp16", tuple(keep), options.fp16_auc_tolerance)
        extra = {"source": exporter.source, "fp16_islands": islands, "opset": options.opset}
        written.append(export_variant(repository, family, recipe, rows, options.serving, report=extra))
    if options.writes_int8:
        recipe = VariantRecipe(
            "int8", tuple(exporter.fp32_nodes(dense)), options.int8_auc_tolerance, options.quantize
        )
        calibration, source = calibration_rows(options) if options.quantize.method == "static" else (None, "")
        extra = {"source": exporter.source, "opset": options.opset}
        try:
            written.append(
                export_variant(repository, family, recipe, rows, options.serving, calibration, source, extra)
            )
        except ExportError as exc:
            if options.int8:
                raise
            log.warning(
                "%s_onnx_int8 not written (the other models serve): %s. --int8 makes this an error",
                family, exc,
            )  # fmt: skip
    reference = "hot/cold FP32 (same stage)"
    return [ExportedModel(w.name, w.config, reference, w.parity, w.seconds, w.summary) for w in written]
