"""Where a model's embedding tables live when it is served: in the graph, or hot/cold.

By default every table stays inside the exported ONNX graph (``in-graph``). With
a hot budget, a model whose tables take more bytes than the budget is served as
a Triton ensemble under its family's usual name instead (``hot-cold``, see
:mod:`export.tables.ensemble`): the dense model keeps the most looked-up rows inside
the graph, as many as fit the budget, and an embedding stage reads every other
row from a memory-mapped row store. ``auto`` picks hot/cold exactly when the
tables exceed the budget, and says so.

After the all-in-graph FP32 graph is written and checked against its framework
(:func:`export.pipeline.export_family`), :func:`place_embeddings`:

1. profiles the profile data's lookups per table row (:func:`criteo.profile.profile_file`)
   and chooses the hot rows under the budget (:func:`export.tables.hot_rows.choose_hot_rows`);
2. writes the row store from the graph's own tables (``<family>_embedding/rows/``, beside
   the version folders: every version of the stage reads it), the hot set, the dense model
   (``<family>_dense/1/model.onnx``) and its lookup graph (:func:`export.tables.ensemble.write_lookup_graph`,
   from which a new hot set builds the next version);
3. checks the two stages in-process (:func:`export.tables.hot_cold_graph.stage_reference`,
   then ONNX Runtime on the dense model) against the all-in-graph graph on the check
   rows and on ids at the int64 limits: within :data:`FP32_STORE_TOLERANCE` for an
   FP32 store, within the FP16 AUC tolerance for an FP16 store and the INT8 one
   (the INT8 model's gate) for an int8 store;
4. writes the stage's, the dense model's and the ensemble's configs; the ensemble
   ``<family>_onnx`` replaces the all-in-graph model and its ``export_report.json``
   records the placement.

A failure leaves none of the family's hot/cold entries (nor the all-in-graph
model they would have replaced) in the repository.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bundle.errors import ConfigError, ExportError
from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    aoti_model_name,
    aoti_package_name,
    clear_model,
    read_config,
    torch_model_name,
    trt_model_name,
    version_dir,
    write_report,
)
from bundle.schema import COLD_POSITIONS, COLD_ROWS, DENSE_INPUT, HOT_SLOTS, OUTPUT
from criteo.profile import read_profile
from criteo.tables import check_table_sizes
from criteo.tsv import Batch
from export.framework import SMALL_ROWS, FrameworkExporter, StreamedTables
from export.graphs.ids import graph_hotness, recorded_hotness
from export.graphs.onnx_io import save_model
from export.graphs.parity import ParityResult, compare, extreme_id_rows, onnx_session, run_onnx
from export.options import NO_PROFILE_DATA, ExportOptions, PlacementOptions
from export.tables.ensemble import (
    ENSEMBLE_PLATFORM,
    HOT_SET_FILE,
    VARIANTS,
    add_hot_cold_models,
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    variant_models,
    write_lookup_graph,
)
from export.tables.hot_cold_graph import split_lookups, stage_reference, write_store, write_table_store
from export.tables.hot_rows import HotSet, choose_hot_rows
from export.tables.lookups import check_sizes, find_lookups, store_spec
from export.tables.row_store import RowStore, RowStoreSpec, format_bytes

log = logging.getLogger(__name__)

#: Max |hot/cold - all-in-graph| per probability with an FP32 store: the same
#: values reach the same layers, only gathered another way.
FP32_STORE_TOLERANCE = 1e-6
#: The row store's folder inside the embedding stage's model folder (shared by its versions).
ROWS_FOLDER = "rows"
#: Rows per stage + dense model call in the checks (as :func:`export.graphs.parity.run_onnx` chunks).
CHECK_CHUNK = 4096


@dataclass(frozen=True)
class Decision:
    """Whether the tables are split, and why (one line for the log and the report).

    Attributes:
        hot_cold: split hot/cold (else kept in the graph).
        reason: why, in words.
        table_bytes: bytes of every table row in FP32 (None: not measured).
    """

    hot_cold: bool
    reason: str
    table_bytes: int | None = None


def decide(options: PlacementOptions, table_bytes: int | None) -> Decision:
    """The placement of tables that take ``table_bytes`` (FP32, every row) under ``options``.

    Args:
        options: the placement options.
        table_bytes: the tables' bytes; None when not measured (only allowed without a budget).
    """
    budget = options.hot_budget
    if budget is None or options.mode == "in-graph":
        return Decision(False, "no hot budget: every table stays in the graph", table_bytes)
    if table_bytes is None:
        raise ConfigError("the placement needs the tables' bytes")
    sizes = f"the embedding tables take {format_bytes(table_bytes)} ({table_bytes} bytes)"
    limit = f"the hot budget of {format_bytes(budget)} ({budget} bytes)"
    if options.mode == "hot-cold":
        return Decision(True, f"--embeddings hot-cold: {sizes}, {limit} keeps the hottest rows", table_bytes)
    if table_bytes > budget:
        return Decision(True, f"{sizes}, more than {limit}: split hot/cold", table_bytes)
    return Decision(False, f"{sizes}, within {limit}: every table stays in the graph", table_bytes)


@dataclass(frozen=True)
class PlacedModel:
    """The ensemble written in place of the all-in-graph model, and its check against that model.

    Attributes:
        name: ``<family>_onnx``.
        path: its config.
        parity: the ensemble's stages (in-process) vs the all-in-graph FP32 graph, on the
            check rows and the out-of-range ids (AUC on the check rows).
        seconds: time spent placing and checking.
        report: what ``export_report.json`` holds.
        summary: one line for the CLI.
    """

    name: str
    path: Path
    parity: ParityResult
    seconds: float
    report: dict[str, Any]
    summary: str


def run_hot_cold(
    dense_path: Path,
    hot: HotSet,
    store: RowStore,
    batch: Batch,
    chunk: int = CHECK_CHUNK,
    hotness: tuple[int, ...] | None = None,
) -> np.ndarray:
    """Probabilities of the two stages in-process: :func:`stage_reference`, then the dense model (ORT CPU).

    Args:
        hotness: a multi-hot model's bags (default: what the dense model records, see
            :func:`export.graphs.ids.graph_hotness`; a converted variant may not keep the record).

    Returns:
        ``B x 1`` float32.
    """
    session = onnx_session(dense_path)
    # A multi-hot dense model records its bags' sizes (as the graph it was split from).
    if hotness is None:
        hotness = recorded_hotness(session.get_modelmeta().custom_metadata_map)
    outputs = []
    for start in range(0, len(batch), chunk):
        feeds = hot_cold_feeds(batch.slice(start, start + chunk), hot, store, hotness)
        outputs.append(session.run([OUTPUT], feeds)[0])
    return np.concatenate(outputs)


def hot_cold_feeds(
    batch: Batch, hot: HotSet, store: RowStore, hotness: tuple[int, ...] | None = None
) -> dict[str, np.ndarray]:
    """The dense model's inputs for ``batch``: its dense features and the stage's answer (in-process;
    ``hotness``: a multi-hot model's bags, ``B x H`` ids)."""
    slots, positions, rows = stage_reference(batch.categorical, hot, hot.table_sizes, store, hotness)
    return {DENSE_INPUT: batch.dense, HOT_SLOTS: slots, COLD_POSITIONS: positions, COLD_ROWS: rows}


def _check(
    name: str,
    against: str,
    reference: Callable[[Batch], np.ndarray],
    dense_path: Path,
    hot: HotSet,
    store: RowStore,
    rows: Batch,
    fp32_tolerance: float,
    auc_tolerance: float,
) -> tuple[ParityResult, dict[str, Any]]:
    """The stages vs ``reference`` (the all-in-graph graph, or the framework) on ``rows`` and their
    out-of-range copies.

    Returns:
        The combined comparison (max abs diff over both; AUC on ``rows``) and report fields.

    Raises:
        ExportError: an FP32 store off by more than ``fp32_tolerance``, or an FP16 or int8
            store whose AUC moved more than ``auc_tolerance``.
    """
    extreme = extreme_id_rows(rows)
    check = compare(run_hot_cold(dense_path, hot, store, rows), reference(rows), rows.labels)
    out_of_range = compare(run_hot_cold(dense_path, hot, store, extreme), reference(extreme), None)
    worst = max(check.max_abs_diff, out_of_range.max_abs_diff)
    parity = ParityResult(check.rows + out_of_range.rows, worst, check.auc, check.auc_delta)
    dtype = store.spec.dtype
    where = f"{name} ({dtype} row store) vs {against}"
    if dtype == "float32":
        gate: dict[str, Any] = {"max_abs_diff": fp32_tolerance}
        if not worst <= fp32_tolerance:
            raise ExportError(
                f"{where}: max abs diff {worst:.3g} (tolerance {fp32_tolerance:g}; "
                f"out-of-range ids: {out_of_range.max_abs_diff:.3g})"
            )
    else:
        gate = {"auc_delta": auc_tolerance}
        delta = check.auc_delta if check.auc_delta is not None else float("nan")
        if rows.labels is None or not abs(delta) <= auc_tolerance:
            raise ExportError(
                f"{where}: AUC differs by {delta:.3g} (tolerance {auc_tolerance:g}; max abs diff {worst:.3g})"
            )
    extra = {
        "tolerance": gate,
        "parity_check_rows": asdict(check),
        "parity_out_of_range_ids": asdict(out_of_range),
    }
    return parity, extra


def hot_cold_entries(family: str) -> tuple[str, ...]:
    """The repository entries of a family's hot/cold model: stage, dense model, ensemble."""
    return embedding_model_name(family), dense_model_name(family), ensemble_model_name(family)


def variant_entries(family: str) -> tuple[str, ...]:
    """The FP16 and INT8 variants' ensembles and dense models (:mod:`export.tables.hot_cold_variants`)."""
    return tuple(name for precision in VARIANTS for name in variant_models(family, precision))


def clear_split(repository: Path, family: str) -> None:
    """Remove the stage and dense models of an earlier hot/cold export, and its variants' ensembles
    (an in-graph variant of that name stays): the family is served in-graph now."""
    for name in (*hot_cold_entries(family)[:2], *variant_entries(family)):
        config = repository / name / CONFIG_NAME
        if name.startswith(ensemble_model_name(family)) and config.is_file():
            try:
                if read_config(config).platform != ENSEMBLE_PLATFORM:
                    continue
            except ConfigError:
                pass
        clear_model(repository, name)


def clear_variants(repository: Path, family: str) -> None:
    """Remove the family's FP16, INT8, TensorRT, TorchScript and AOTInductor models before a hot/cold export.

    They would be models of an earlier export, out of step with the new ensemble: the
    FP16 and INT8 variants are written again from the new dense model
    (:mod:`export.tables.hot_cold_variants`); TensorRT, TorchScript and AOTInductor are not
    written for a hot/cold model.
    """
    aoti = (aoti_model_name(family), aoti_package_name(family))
    for name in (*variant_entries(family), trt_model_name(family), torch_model_name(family), *aoti):
        clear_model(repository, name)


def place_embeddings(
    exporter: FrameworkExporter,
    in_graph: Path,
    in_graph_parity: ParityResult,
    rows: Batch,
    options: ExportOptions,
) -> PlacedModel | None:
    """Place the tables of the checked all-in-graph graph at ``in_graph`` as ``options.placement`` asks.

    Args:
        exporter: the model's exporter (its ``table_sizes``, ``family`` and ``source``).
        in_graph: ``<repository>/<family>_onnx/1/model.onnx``, checked against the framework.
        in_graph_parity: that check's result (kept in the ensemble's report).
        rows: the labeled check rows.
        options: the export options.

    Returns:
        None when the tables stay in the graph (the all-in-graph model stays; a stage and
        dense model of an earlier hot/cold export are removed); else the ensemble that
        replaced the all-in-graph model.

    Raises:
        ConfigError: the exporter does not know its table sizes, or the serving options
            do not apply to a dense model.
        ExportError: the split or its check failed; none of the family's entries are left.
    """
    if not options.placement.may_split:
        clear_split(options.repository, exporter.family)
        return None
    return _place(exporter, _Tables(in_graph, None, in_graph_parity), rows, options)


def place_streamed(exporter: FrameworkExporter, rows: Batch, options: ExportOptions) -> PlacedModel:
    """The hot/cold model of a checkpoint whose tables may be larger than memory, never built in-graph.

    1. the exporter's layers with placeholder tables (:data:`export.framework.SMALL_ROWS`
       rows at most) as an ONNX graph, whose lookups give the row store's layout;
    2. the row store written from the checkpoint's own tables, a chunk at a time
       (:func:`export.tables.hot_cold_graph.write_table_store`; the tables stay memory-mapped);
    3. the hot rows chosen from the profile, read from the store into the dense model
       (:func:`export.tables.hot_cold_graph.split_lookups` with ``rows=``);
    4. the two stages in-process checked against the framework's own model (which reads
       only the rows the check looks up) on the check rows and the out-of-range ids:
       within ``options.fp32_tolerance`` for an FP32 store, the FP16 AUC gate for FP16.

    Raises:
        ConfigError: an exporter that cannot read its tables by rows (not a DLRM checkpoint), or
            tables that fit the hot budget (they would stay in the graph).
        ExportError: the store, the split or the check failed; none of the family's entries are left.
    """
    import tempfile

    if not isinstance(exporter, StreamedTables):
        raise ConfigError(
            f"--stream-tables reads the tables from a DLRM checkpoint (the bundle's, facebookresearch/dlrm "
            f"or TorchRec); {exporter.source.get('format', 'this model')} is exported through its whole "
            "graph: drop --stream-tables"
        )

    with tempfile.TemporaryDirectory(prefix="placeholder-") as tmp:
        graph = Path(tmp) / MODEL_FILE
        log.info("exporting %s's layers with placeholder tables (--stream-tables)", exporter.family)
        exporter.placeholder_onnx(graph, options.opset, SMALL_ROWS)
        placed = _place(exporter, _Tables(graph, exporter, None), rows, options)
    if placed is None:
        raise ConfigError(
            f"--stream-tables: the tables of {exporter.family} fit the hot budget, so they stay in the "
            "graph: drop --stream-tables, or give --embeddings hot-cold"
        )
    return placed


@dataclass(frozen=True)
class _Tables:
    """Where a hot/cold export takes its layers, tables and reference from.

    Attributes:
        graph: the graph whose layers the dense model keeps: the all-in-graph graph, or
            (streamed) the placeholder graph.
        streamed: the exporter whose tables fill the store (None: the graph's own tables).
        in_graph_parity: the all-in-graph graph's check against the framework (None: streamed,
            the stages are checked against the framework itself).
    """

    graph: Path
    streamed: StreamedTables | None
    in_graph_parity: ParityResult | None


def _place(
    exporter: FrameworkExporter, tables: _Tables, rows: Batch, options: ExportOptions
) -> PlacedModel | None:
    family = exporter.family
    start = time.perf_counter()
    try:
        plan = _plan(exporter, tables, options)
        if plan is None:
            if tables.streamed is None:  # in the graph from now on (a streamed export refuses instead)
                clear_split(options.repository, family)
            return None
        placed = _write_hot_cold(exporter, tables, rows, options, plan)
        seconds = time.perf_counter() - start
        placed.report["seconds"] = round(seconds, 3)
        write_report(options.repository, placed.name, placed.report)
    except BaseException:  # the all-in-graph model was to be replaced: it goes too
        for name in (*hot_cold_entries(family), *variant_entries(family)):
            clear_model(options.repository, name)
        raise
    clear_variants(options.repository, family)
    return PlacedModel(placed.name, placed.path, placed.parity, seconds, placed.report, placed.summary)


@dataclass(frozen=True)
class _Plan:
    """A hot/cold split decided: why, the store's rows (FP32), and the file to profile with its option."""

    decision: Decision
    spec: RowStoreSpec
    profile: tuple[Path, str]
    #: A multi-hot model's ids per bag of each table (the graph's record; None: one id each).
    hotness: tuple[int, ...] | None = None


def _plan(exporter: FrameworkExporter, tables: _Tables, options: ExportOptions) -> _Plan | None:
    """Measure the graph's tables and decide (None: they stay in the graph); refuse what cannot be split."""
    placement = options.placement
    family = exporter.family
    sizes = exporter.table_sizes
    if sizes is None:
        raise ConfigError(
            f"a hot/cold {family} model needs the rows of each table: give --table-sizes "
            "(the model reduces ids its own way, so the export could not read them from the graph)"
        )
    graph = onnx.load(str(tables.graph), load_external_data=False)
    lookups = find_lookups(graph)
    # FP32: the graph's tables and hot rows (a placeholder graph reduces ids into its own small tables)
    spec = store_spec(lookups, check_table_sizes(sizes) if tables.streamed else check_sizes(lookups, sizes))
    decision = decide(placement, spec.total_bytes)
    log.info("%s: %s", family, decision.reason)
    if not decision.hot_cold:
        return None
    if options.serving.ort_trt:
        raise ConfigError(
            "--ort-trt does not apply to a hot/cold model's dense part: drop it, or keep the tables "
            "in the graph (--embeddings in-graph)"
        )
    source = placement.profile_source(options.calibration_data, options.check_data)
    if source is None:  # ExportOptions refuses this already
        raise ConfigError(NO_PROFILE_DATA)
    return _Plan(decision, spec, source, graph_hotness(graph))


def _write_hot_cold(
    exporter: FrameworkExporter, tables: _Tables, rows: Batch, options: ExportOptions, plan: _Plan
) -> PlacedModel:
    """Profile; choose the hot rows; write the store, hot set and dense model; check them; write configs."""
    placement, decision = options.placement, plan.decision
    repository, family = options.repository, exporter.family
    sizes, row_bytes = plan.spec.table_sizes, plan.spec.row_bytes
    budget = placement.hot_budget if placement.hot_budget is not None else 0
    stage_name, dense_name, name = hot_cold_entries(family)
    clear_model(repository, stage_name)
    clear_model(repository, dense_name)

    profile_path, profile_option = plan.profile
    log.info("profiling %s lookups of %s (%s)", family, profile_path, profile_option)
    # A TSV (of bags for a multi-hot model), or a folder `python -m criteo profile` wrote.
    profile = read_profile(profile_path, sizes, bags=plan.hotness is not None)
    hot = choose_hot_rows(profile, sizes, row_bytes, budget)
    log.info(
        "%s: %d hot rows of %d (%s of the %s budget), expected hit rate %.1f%%",
        family, hot.rows, sum(sizes), format_bytes(hot.bytes_used), format_bytes(budget),
        100 * hot.expected_hit_rate,
    )  # fmt: skip

    stage_dir = version_dir(repository, stage_name, 1)
    store_dir = repository / stage_name / ROWS_FOLDER
    graph, streamed = tables.graph, tables.streamed
    metadata = {"model": name, "source": exporter.source.get("path", "")}
    log.info("writing the %s row store to %s", placement.store_dtype, store_dir)
    if streamed is None:
        store = write_store(
            graph, store_dir, placement.store_dtype, sizes, metadata={**metadata, "graph": graph.name}
        )
    else:
        spec = replace(plan.spec, dtype=placement.store_dtype)
        if len(spec.columns) != 1:  # table_rows gives one embedding per id
            raise ExportError(f"a row store written from the tables has one column, not {dict(spec.columns)}")
        store = write_table_store(
            streamed.table_rows, spec, store_dir, metadata={"source": "tables", **metadata}
        )
    hot_path = hot.save(stage_dir / HOT_SET_FILE)
    dense_path = version_dir(repository, dense_name, 1) / MODEL_FILE
    save_model(split_lookups(graph, hot, sizes, rows=None if streamed is None else store), dense_path)
    write_lookup_graph(graph, repository, family)

    if streamed is None:
        reference: Callable[[Batch], np.ndarray] = lambda batch: run_onnx(graph, batch)  # noqa: E731
        fp32_tolerance, checked_against = FP32_STORE_TOLERANCE, "onnx_fp32_in_graph"
    else:
        reference, fp32_tolerance, checked_against = exporter.predict, options.fp32_tolerance, "framework"
    parity, check_fields = _check(
        name,
        checked_against,
        reference,
        dense_path,
        hot,
        store,
        rows,
        fp32_tolerance,
        options.int8_auc_tolerance if store.spec.quantized else options.fp16_auc_tolerance,
    )
    measured = hot.hit_rate(rows, plan.hotness)
    config = add_hot_cold_models(
        repository, family, store_dir, hot_path, options.serving, stage_instances=placement.stage_instances
    )[-1]
    store_bytes = store.spec.total_bytes
    report: dict[str, Any] = {
        "model": name,
        "placement": "hot-cold",
        "placement_reason": decision.reason,
        "models": {"embedding_stage": stage_name, "dense": dense_name},
        "checked_against": checked_against,
        "parity": asdict(parity),
        **check_fields,
        "hot_budget_bytes": budget,
        "hot_rows": hot.rows,
        "hot_bytes": hot.bytes_used,
        "hot_rows_per_table": list(hot.table_rows),
        "table_rows": sum(sizes),
        "table_sizes": list(sizes),
        "hotness": list(plan.hotness) if plan.hotness is not None else "one id per table",
        "table_bytes": decision.table_bytes,
        "row_bytes": row_bytes,
        "profile": {
            "source": str(profile_path),
            "from": profile_option,
            "rows": profile.rows,
            "lookups": hot.profiled_lookups,
        },
        "expected_hit_rate": hot.expected_hit_rate,
        "measured_hit_rate": {"rows": len(rows), "hit_rate": measured, "data": _rows_source(options)},
        "row_store": {
            "path": store_dir.relative_to(repository).as_posix(),
            "dtype": store.spec.dtype,
            "bytes": store_bytes,
            "width": store.spec.width,
            "rows": store.spec.rows,
        },
        "opset": options.opset,
        "source": exporter.source,
    }
    if tables.in_graph_parity is not None:
        report["in_graph"] = {"checked_against": "framework", "parity": asdict(tables.in_graph_parity)}
    else:
        report["streamed_tables"] = (
            "the row store written from the checkpoint's tables; no all-in-graph graph"
        )
    summary = (
        f"{name}: hot/cold: {hot.rows} of {sum(sizes)} rows hot "
        f"({format_bytes(hot.bytes_used)} of the {format_bytes(budget)} budget; "
        f"tables {format_bytes(decision.table_bytes or 0)}); "
        f"hit rate expected {100 * hot.expected_hit_rate:.1f}% "
        f"(profile {profile_path.name}), measured {100 * measured:.1f}% on the check rows; "
        f"row store {store_dir.relative_to(repository).as_posix()} ({store.spec.dtype}, "
        f"{format_bytes(store_bytes)}); max abs diff vs {checked_against} {parity.max_abs_diff:.2e}"
    )
    log.info("wrote %s as the ensemble of %s and %s", name, stage_name, dense_name)
    return PlacedModel(name, config, parity, 0.0, report, summary)


def _rows_source(options: ExportOptions) -> str:
    return str(options.check_data) if options.check_data is not None else "synthetic"
