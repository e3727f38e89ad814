"""FP16 and INT8 variants of a hot/cold model: their own dense model and ensemble over the one stage.

A hot/cold export (:mod:`export.tables.placement`) serves ``<family>_onnx`` as the
ensemble of ``<family>_embedding`` and ``<family>_dense`` (FP32). Each variant is
made from that FP32 dense model the way the in-graph variants are made from the
in-graph graph, and served under the in-graph variant's usual name, so clients and
load tests pick a precision by model name as before:

- ``<family>_onnx_fp16``: ``<family>_embedding`` -> ``<family>_dense_fp16``, the dense
  model converted to FP16 inside (:func:`export.graphs.fp16.convert_to_fp16`; its inputs and
  output stay FP32, the cold rows are cast on entry). Its hot rows become FP16 constants:
  half the memory of the FP32 dense model's.
- ``<family>_onnx_int8``: ``<family>_embedding`` -> ``<family>_dense_int8``, the MLP
  layers quantized (:func:`export.graphs.quantize.quantize_int8`); the hot rows and the lookups
  stay FP32. The static method calibrates on the check pipeline's own feeds: the
  calibration rows run through the stage in-process (:func:`hot_cold_feeds`).

The stage is shared: its hot slots index the hot table of every dense model built
from the same hot set, so each ensemble names the same version of the stage as of its
dense model, and a new hot set (:mod:`export.tables.rollout`) rebuilds every variant with the
recipe its report keeps (:class:`VariantRecipe`) and switches all ensembles together.

Each variant is gated like its in-graph counterpart: its two stages in-process against
the FP32 pair on the check rows, AUC within the variant's tolerance.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bundle.errors import ConfigError, ExportError
from bundle.repository import MODEL_FILE, ServingConfig, clear_model, version_dir, write_report
from criteo.tsv import Batch
from export.graphs.fp16 import convert_to_fp16
from export.graphs.ids import graph_hotness
from export.graphs.onnx_io import save_model
from export.graphs.parity import ParityResult, compare
from export.graphs.quantize import QuantizeOptions, quantize_int8
from export.tables.ensemble import (
    HOT_SET_FILE,
    VARIANTS,
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    stage_store_path,
    variant_models,
    write_dense_config,
    write_ensemble,
)
from export.tables.hot_cold_graph import PREFIX
from export.tables.hot_rows import HotSet
from export.tables.placement import CHECK_CHUNK, hot_cold_feeds, run_hot_cold
from export.tables.row_store import RowStore

log = logging.getLogger(__name__)

#: Each variant's label in messages.
LABELS = {"fp16": "FP16", "int8": "INT8"}


@dataclass(frozen=True)
class VariantRecipe:
    """How a variant's dense model is made from the FP32 dense model.

    Kept in the variant's ``export_report.json`` (``recipe``), so a rollout makes
    the next version's variant exactly as the export made the first.

    Args:
        precision: ``fp16`` or ``int8``.
        keep_fp32: nodes that stay FP32 (FP16: the exporter's islands and the sigmoid;
            INT8: matrix products the quantizer must leave alone).
        quantize: the INT8 method and weights (INT8 only).
        auc_tolerance: max |AUC(variant pair) - AUC(FP32 pair)|.
    """

    precision: str
    keep_fp32: tuple[str, ...]
    auc_tolerance: float
    quantize: QuantizeOptions | None = None

    def __post_init__(self) -> None:
        if self.precision not in VARIANTS:
            raise ConfigError(f"a hot/cold variant is one of {VARIANTS}, got {self.precision!r}")
        if (self.precision == "int8") != (self.quantize is not None):
            raise ConfigError("an INT8 recipe needs its quantize options, and only an INT8 recipe has them")
        if not self.auc_tolerance >= 0:
            raise ConfigError(f"the AUC tolerance must be >= 0, got {self.auc_tolerance}")

    @property
    def label(self) -> str:
        return LABELS[self.precision]

    def to_report(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "precision": self.precision,
            "keep_fp32": list(self.keep_fp32),
            "auc_tolerance": self.auc_tolerance,
        }
        if self.quantize is not None:
            fields["quantize"] = asdict(self.quantize)
        return fields

    @classmethod
    def from_report(cls, report: dict[str, Any], where: str) -> VariantRecipe:
        """The recipe a variant's report keeps.

        Raises:
            ConfigError: the report has none (a variant of another bundle version), or a damaged one.
        """
        fields = report.get("recipe")
        if not isinstance(fields, dict):
            raise ConfigError(f"{where} keeps no recipe (exported by an earlier bundle): export it again")
        try:
            quantize = fields.get("quantize")
            return cls(
                str(fields["precision"]),
                tuple(str(name) for name in fields["keep_fp32"]),
                float(fields["auc_tolerance"]),
                QuantizeOptions(**quantize) if isinstance(quantize, dict) else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: its recipe is damaged ({exc})") from None


def remove_variant(repository: Path, family: str, precision: str) -> None:
    """Remove a variant's ensemble and dense model (the stage and FP32 models stay)."""
    for name in variant_models(family, precision):
        clear_model(repository, name)


def build_dense_variant(
    recipe: VariantRecipe,
    source: Path,
    out: Path,
    hot: HotSet,
    store: RowStore,
    calibration: Batch | None = None,
    calibration_source: str = "",
) -> dict[str, Any]:
    """Write the variant of the FP32 dense model at ``source`` to ``out``.

    Args:
        recipe: what to make.
        source: the FP32 dense model.
        out: its ``model.onnx`` to write.
        hot: the hot set ``source`` holds, and ``store``: the row store; together they turn
            calibration rows into the dense model's inputs.
        calibration: rows for static INT8 (the stage runs on them in-process).
        calibration_source: where they came from, for the report.

    Returns:
        Report fields of the conversion.

    Raises:
        ExportError: the conversion failed (see :func:`export.graphs.fp16.convert_to_fp16`,
            :func:`export.graphs.quantize.quantize_int8`).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    hotness = graph_hotness(onnx.load(str(source), load_external_data=False))
    if recipe.quantize is None:
        log.info("converting %s to FP16 at %s", source, out)
        model = onnx.load(str(source))
        tables = _set_aside_hot_tables(model)
        converted = convert_to_fp16(model, list(recipe.keep_fp32), source=source)
        del model
        _put_back_hot_tables(converted, tables)
        save_model(converted, out)
        return {"fp32_nodes": list(recipe.keep_fp32)}
    log.info("quantizing %s to INT8 (%s) at %s", source, recipe.quantize.method, out)
    graph = quantize_int8(
        source,
        out,
        list(recipe.keep_fp32),
        recipe.quantize,
        calibration,
        calibration_source,
        feeds=lambda part: hot_cold_feeds(part, hot, store, hotness),
    )
    return {
        "quantization": graph.settings,
        "int8_nodes": graph.quantized_nodes,
        "fp32_matmul_nodes": graph.fp32_nodes,
    }


#: Hot tables over this many bytes skip the FP16 converter (see :func:`_set_aside_hot_tables`).
SET_ASIDE_BYTES = 1 << 20


def _set_aside_hot_tables(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Take the dense model's large hot tables out of ``model``, leaving one-row stand-ins of their names.

    The FP16 converter copies every initializer it converts, several times over; a hot
    table is most of the dense model's bytes, and numpy converts it in one copy instead
    (:func:`_put_back_hot_tables`). The stand-ins keep the graph as it was for the converter,
    which types each lookup from its table.
    """
    tables = {}
    for tensor in model.graph.initializer:
        if not tensor.name.startswith(f"{PREFIX}/") or tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        if tensor.dims and np.prod(tensor.dims) * 4 > SET_ASIDE_BYTES:
            tables[tensor.name] = numpy_helper.to_array(tensor)
            stand_in = numpy_helper.from_array(np.zeros((1, *tensor.dims[1:]), dtype=np.float32), tensor.name)
            tensor.CopyFrom(stand_in)
    return tables


def _put_back_hot_tables(model: onnx.ModelProto, tables: dict[str, np.ndarray]) -> None:
    """Put the set-aside tables back, in the type the converter gave their stand-ins (FP16, or FP32
    where a kept node reads them).

    numpy rounds each value to the nearest FP16; the converter would also have raised magnitudes
    below 1e-7 to 1e-7, a difference that stays far below the FP16 variant's own error (the
    answers agree with the converter's to within a rounding step).
    """
    for tensor in model.graph.initializer:
        values = tables.pop(tensor.name, None)
        if values is None:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        del tensor.dims[:]
        tensor.dims.extend(values.shape)
        for field in ("float_data", "int32_data"):  # where the converter may have put the stand-in
            tensor.ClearField(field)
        tensor.raw_data = values.astype(dtype).tobytes()
        del values
    if tables:
        raise ExportError(f"the FP16 conversion dropped hot tables {sorted(tables)}")


def check_variant(
    recipe: VariantRecipe,
    candidate: Path,
    reference: Path,
    reference_hot: HotSet,
    hot: HotSet,
    store: RowStore,
    rows: Batch,
    what: str,
) -> ParityResult:
    """The pair (stage with ``hot``, ``candidate``) against (stage with ``reference_hot``, ``reference``).

    Raises:
        ExportError: unlabeled rows, or the AUC moved more than the recipe's tolerance.
    """
    if rows.labels is None:
        raise ExportError(f"{what}: the {recipe.label} check needs labeled rows")
    hotness = graph_hotness(onnx.load(str(reference), load_external_data=False))
    parity = compare(
        run_hot_cold(candidate, hot, store, rows, CHECK_CHUNK, hotness),
        run_hot_cold(reference, reference_hot, store, rows, CHECK_CHUNK, hotness),
        rows.labels,
    )
    delta = parity.auc_delta if parity.auc_delta is not None else float("nan")
    if not abs(delta) <= recipe.auc_tolerance:
        raise ExportError(
            f"{what}: {recipe.label} AUC differs by {delta:.3g} (tolerance {recipe.auc_tolerance:g}; "
            f"max abs diff {parity.max_abs_diff:.3g})"
        )
    return parity


def keep_quantization(path: Path, serving: Path) -> int:
    """Give the INT8 dense model at ``path`` the quantization parameters of ``serving``, in place.

    A new hot set changes only the hot-row lookup (the nodes and initializers under
    :data:`export.tables.hot_cold_graph.PREFIX`); the MLP layers and their inputs are the same, so
    the serving version's activation scales, zero points and quantized biases still fit,
    and with them a row gets the same answer from both versions (a new calibration would
    move it by up to the INT8 error). Only initializers of the same name, type and shape
    are taken.

    Returns:
        How many initializers were taken from ``serving``.
    """
    model = onnx.load(str(path))
    old = {
        t.name: t for t in onnx.load(str(serving)).graph.initializer if not t.name.startswith(f"{PREFIX}/")
    }
    taken = 0
    for tensor in model.graph.initializer:
        source = old.get(tensor.name)
        if source is None or source.data_type != tensor.data_type or list(source.dims) != list(tensor.dims):
            continue
        if source.SerializeToString() != tensor.SerializeToString():
            tensor.CopyFrom(source)
            taken += 1
    save_model(model, path)
    return taken


@dataclass(frozen=True)
class WrittenVariant:
    """A variant the export wrote: its ensemble's name and config, its check, seconds taken."""

    name: str
    config: Path
    parity: ParityResult
    seconds: float
    summary: str


def export_variant(
    repository: Path,
    family: str,
    recipe: VariantRecipe,
    rows: Batch,
    serving: ServingConfig,
    calibration: Batch | None = None,
    calibration_source: str = "",
    report: dict[str, Any] | None = None,
) -> WrittenVariant:
    """Write version 1 of a variant from the FP32 dense model the hot/cold export wrote, gate it,
    and write its dense config, ensemble and report.

    Args:
        repository: the model repository, holding ``<family>_embedding`` and ``<family>_dense``.
        family: ``dlrm``, ``wide_deep``, ...
        recipe: the variant.
        rows: labeled check rows.
        serving: how Triton serves the dense model.
        calibration: static INT8's calibration rows.
        calibration_source: where those rows come from (for the report).
        report: fields for the variant's report (the source, the export's settings).

    Raises:
        ExportError: the conversion failed or the gate refused it; neither of the variant's
            models is then left in the repository.
    """
    name, dense = variant_models(family, recipe.precision)
    stage = embedding_model_name(family)
    remove_variant(repository, family, recipe.precision)
    start = time.perf_counter()
    try:
        hot, store = _stage_files(repository, stage, 1)
        fp32_dense = version_dir(repository, dense_model_name(family), 1) / MODEL_FILE
        out = version_dir(repository, dense, 1) / MODEL_FILE
        extra = build_dense_variant(recipe, fp32_dense, out, hot, store, calibration, calibration_source)
        parity = check_variant(recipe, out, fp32_dense, hot, hot, store, rows, f"{name} vs {family}_onnx")
        write_dense_config(repository, family, store.spec.width, serving, precision=recipe.precision)
        config = write_ensemble(repository, family, precision=recipe.precision, hotness=serving.hotness)
        seconds = time.perf_counter() - start
        fields = {
            "model": name,
            "placement": "hot-cold",
            "models": {"embedding_stage": stage, "dense": dense},
            "checked_against": f"{ensemble_model_name(family)} (the FP32 dense model, same stage)",
            "parity": asdict(parity),
            "recipe": recipe.to_report(),
            **extra,
            **(report or {}),
            "seconds": round(seconds, 3),
        }
        write_report(repository, name, fields)
    except BaseException:
        remove_variant(repository, family, recipe.precision)
        raise
    summary = (
        f"{name}: {recipe.label} dense model over {stage}; AUC delta vs the FP32 pair "
        f"{parity.auc_delta:+.2e}, max abs diff {parity.max_abs_diff:.2e}"
    )
    log.info("%s", summary)
    return WrittenVariant(name, config, parity, seconds, summary)


def _stage_files(repository: Path, stage: str, version: int) -> tuple[HotSet, RowStore]:
    """The hot set and row store of ``version`` of the stage, as its config names them."""
    store = RowStore.open(stage_store_path(repository, stage, version))
    return HotSet.load(version_dir(repository, stage, version) / HOT_SET_FILE), store
