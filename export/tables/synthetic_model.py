"""A DLRM of any preset's size without training it: random tables straight to the row store, for benchmarks.

A DLRM of the Criteo Terabyte preset (187,767,399 rows at ``D`` 128: 96 GB of
FP32 tables, 48 GB in FP16) cannot exist here as a torch module or as one ONNX
graph, so the usual way (export everything in-graph, then split it,
:mod:`export.tables.placement`) cannot make it. :func:`make_random_hot_cold_dlrm`
takes the other way:

1. the row store of the preset's real table sizes, written by
   :func:`export.tables.row_store.random_store` (streamed: memory holds two chunks; the
   values depend on the seed, table and row only), or reused when a store of that
   spec and seed is already there;
2. the bundle's DLRM with the preset's layers and placeholder tables (at most
   :data:`export.framework.SMALL_ROWS` rows each, its own ``Mod`` into them), exported to ONNX:
   served as it is, it is ``dlrm_small``, the same dense model with small in-graph
   tables (the baseline a benchmark compares with);
3. the hot rows, chosen from a measured access profile under a byte budget
   (:func:`export.tables.hot_rows.choose_hot_rows`; bytes of FP32 rows, as the dense model
   holds them);
4. the dense model from the placeholder graph, its hot rows read from the store
   (:func:`export.tables.hot_cold_graph.split_lookups` with ``rows=``), and the stage and
   ensemble configs (:func:`export.tables.ensemble.add_hot_cold_models`): ``dlrm_onnx``;
5. an exactness check: the placeholder module's own layers (torch) on embeddings
   read from the store for the ids reduced into the real sizes, against the dense
   ONNX model (ONNX Runtime) fed by :func:`export.tables.hot_cold_graph.stage_reference`,
   on batches of hot, cold, mixed and out-of-range ids: within
   :data:`TOLERANCES` (1e-6 for an FP32 store; 1e-3 for FP16 and int8, whose values
   both sides read alike, dequantized, but which the benchmark does not need tighter).

The placeholder graph's tables never matter to ``dlrm_onnx``: the split drops them
with their ``Mod``, and every row it serves comes from the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bundle.errors import ConfigError, ExportError
from bundle.memory import PeakMemory
from bundle.repository import (
    MODEL_FILE,
    ServingConfig,
    add_model,
    aoti_model_name,
    aoti_package_name,
    clear_model,
    torch_model_name,
    trt_model_name,
    version_dir,
    write_report,
)
from bundle.schema import (
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    NUM_DENSE,
    OUTPUT,
)
from criteo.profile import AccessProfile
from criteo.tsv import Batch, iter_batches
from export.framework import SMALL_ROWS, small_table_sizes
from export.graphs.onnx_io import save_model
from export.graphs.parity import onnx_session
from export.tables.ensemble import (
    HOT_SET_FILE,
    add_hot_cold_models,
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    write_lookup_graph,
)
from export.tables.hot_cold_graph import split_lookups, stage_reference
from export.tables.hot_rows import HotSet, choose_hot_rows
from export.tables.placement import variant_entries
from export.tables.row_store import (
    DTYPES,
    EMBEDDING_COLUMN,
    META_FILE,
    RowStore,
    RowStoreSpec,
    format_bytes,
    random_store,
)
from models.config import DLRMConfig

if TYPE_CHECKING:
    from models.dlrm import DLRM

log = logging.getLogger(__name__)

#: The family whose names the hot/cold model takes (``dlrm_onnx``, ``dlrm_embedding``, ``dlrm_dense``).
FAMILY = "dlrm"
#: The same dense model with small in-graph tables: the baseline a benchmark serves beside ``dlrm_onnx``.
SMALL_MODEL = "dlrm_small"
#: The ONNX opset of the export (as ``python -m export``'s default).
DEFAULT_OPSET = 17
#: Max |dense model - store reference| per probability, by store dtype.
TOLERANCES: dict[str, float] = {"float32": 1e-6, "float16": 1e-3, "int8": 1e-3}
#: Rows of each exactness batch.
CHECK_ROWS = 64
#: The initialisation of the random store (the reference DLRM's).
INIT = "dlrm"
#: Batches of the exactness check.
CHECK_CASES: tuple[str, ...] = ("hot", "cold", "mixed", "out_of_range")


@dataclass(frozen=True)
class CheckCase:
    """One batch of the exactness check.

    Attributes:
        rows: rows of the batch.
        hot_share: share of its lookups served by hot rows.
        max_abs_diff: largest |dense model - store reference| of its probabilities.
    """

    rows: int
    hot_share: float
    max_abs_diff: float


@dataclass(frozen=True)
class RandomDLRM:
    """What :func:`make_random_hot_cold_dlrm` wrote.

    Attributes:
        repository: the model repository.
        config: the architecture at its real table sizes.
        small_config: the same layers with the placeholder tables of ``dlrm_small``.
        store: the row store (opened).
        store_written: the store was written now (False: a matching one was reused).
        hot: the hot rows the dense model holds.
        configs: config paths: stage, dense model, ensemble, ``dlrm_small``.
        checks: the exactness check of each case (:data:`CHECK_CASES`).
        tolerance: its max abs diff.
        heldout_hit_rate: share of the held-out file's lookups served by hot rows (None: no file).
        seconds: wall time of each step.
    """

    repository: Path
    config: DLRMConfig
    small_config: DLRMConfig
    store: RowStore
    store_written: bool
    hot: HotSet
    configs: tuple[Path, ...]
    checks: dict[str, CheckCase]
    tolerance: float
    heldout_hit_rate: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    memory: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def peak_memory(self) -> tuple[int, int] | None:
        """The largest anonymous and file-backed resident bytes of any step (None: not reported here)."""
        steps = [m for m in self.memory.values() if "anon_bytes" in m]
        if not steps:
            return None
        return max(m["anon_bytes"] for m in steps), max(m["file_bytes"] for m in steps)

    @property
    def max_abs_diff(self) -> float:
        """The worst case of the exactness check."""
        return max(case.max_abs_diff for case in self.checks.values())

    def report(self) -> dict[str, Any]:
        """JSON-ready record (``export_report.json`` of ``dlrm_onnx``)."""
        spec = self.store.spec
        return {
            "source": {"format": "random DLRM (untrained)", **self.store.description.get("metadata", {})},
            "model": asdict(self.config),
            "small_model": {"name": SMALL_MODEL, "table_sizes": list(self.small_config.table_sizes)},
            "row_store": {
                "path": str(self.store.path),
                "spec": spec.to_json(),
                "bytes": spec.total_bytes,
                "written": self.store_written,
            },
            "hot_rows": {
                "rows": self.hot.rows,
                "bytes": self.hot.bytes_used,
                "budget_bytes": self.hot.budget_bytes,
                "expected_hit_rate": self.hot.expected_hit_rate,
                "heldout_hit_rate": self.heldout_hit_rate,
            },
            "exactness": {
                "tolerance": self.tolerance,
                "max_abs_diff": self.max_abs_diff,
                "reference": "torch: the same layers on embeddings read from the row store",
                "cases": {name: asdict(case) for name, case in self.checks.items()},
            },
            "seconds": {name: round(value, 3) for name, value in self.seconds.items()},
            "memory": {
                "per_step": self.memory,
                "note": "peak resident bytes per step, sampled: anonymous (must fit in RAM) and "
                "file-backed (the memory-mapped row store's pages: page cache, reclaimable)",
            },
        }

    def summary(self) -> list[str]:
        """Lines for the CLI: what was written, the hot set, the check and the timings."""
        spec = self.store.spec
        verb = "wrote" if self.store_written else "reused"
        lines = [
            f"row store: {verb} {self.store.path}: {spec.rows:,} rows x {spec.width} {spec.dtype} "
            f"({format_bytes(spec.total_bytes)})",
            f"hot rows: {self.hot.rows:,} ({format_bytes(self.hot.bytes_used)} of the "
            f"{format_bytes(self.hot.budget_bytes)} budget), expected hit rate "
            f"{self.hot.expected_hit_rate:.2%}"
            + ("" if self.heldout_hit_rate is None else f", held-out hit rate {self.heldout_hit_rate:.2%}"),
            f"models: {ensemble_model_name(FAMILY)} (ensemble of {embedding_model_name(FAMILY)} + "
            f"{dense_model_name(FAMILY)}) and {SMALL_MODEL} (placeholder tables of "
            f"{max(self.small_config.table_sizes)} rows at most) in {self.repository}",
            "exactness vs the store reference: "
            + ", ".join(f"{name} {case.max_abs_diff:.2g}" for name, case in self.checks.items())
            + f" (tolerance {self.tolerance:g})",
            "seconds: " + ", ".join(f"{name} {value:.1f}" for name, value in self.seconds.items()),
        ]
        peak = self.peak_memory
        if peak is not None:
            lines.append(
                f"peak memory: {format_bytes(peak[0])} anonymous, {format_bytes(peak[1])} of mapped files "
                "(the row store's pages: page cache the kernel reclaims)"
            )
        return lines


def random_store_spec(config: DLRMConfig, dtype: str) -> RowStoreSpec:
    """The row store of ``config``'s real tables: DLRM embeddings of width ``D`` in ``dtype``."""
    if dtype not in DTYPES:
        raise ConfigError(f"the row store's dtype must be {' or '.join(DTYPES)}, got {dtype!r}")
    return RowStoreSpec.for_dlrm(config.table_sizes, config.embedding_dim, dtype)


def existing_random_store(path: Path, spec: RowStoreSpec, seed: int) -> RowStore | None:
    """The random store at ``path`` when it holds ``spec`` from ``seed`` (DLRM init), else None.

    Only ``store.json`` and the sampled rows are read (:meth:`RowStore.open`), so this is
    cheap at any size.
    """
    if not (Path(path) / META_FILE).is_file():
        return None
    try:
        store = RowStore.open(Path(path))
    except ExportError as exc:
        log.debug("the row store at %s is not usable: %s", path, exc)
        return None
    metadata = store.description.get("metadata", {})
    wanted = {"source": "random", "seed": seed, "init": INIT}
    if store.spec.to_json() == spec.to_json() and all(metadata.get(k) == v for k, v in wanted.items()):
        return store
    return None


def _placeholder_module(config: DLRMConfig, seed: int) -> DLRM:
    """The bundle's DLRM of ``config`` (placeholder tables), seeded, in eval mode."""
    import torch

    from models.dlrm import DLRM

    torch.manual_seed(seed)
    return DLRM(config).eval()


def _export_small(module: DLRM, repository: Path, opset: int, serving: ServingConfig) -> Path:
    """Write ``dlrm_small`` (the placeholder graph, served as it is) and its config; return the ONNX path."""
    from export.framework import example_inputs
    from export.importers.torch_onnx import export_module

    path = version_dir(repository, SMALL_MODEL) / MODEL_FILE
    hotness = module.config.hotness
    dense, ids = example_inputs(module.config.table_sizes)
    if hotness is not None:
        import torch

        from criteo.multihot import expand

        ids = torch.from_numpy(expand(ids.numpy(), hotness))
    export_module(
        module,
        (dense, ids),
        path,
        opset,
        "a random DLRM with placeholder tables",
        doc=f"random DLRM {module.config} (untrained; small in-graph tables)",
        hotness=hotness,
    )
    report = {
        "source": {
            "format": "random DLRM (untrained)",
            "table_sizes": list(module.config.table_sizes),
            "hotness": list(hotness) if hotness is not None else "one id per table",
        },
        "role": f"the dense layers of {ensemble_model_name(FAMILY)} with small in-graph tables",
    }
    add_model(repository, SMALL_MODEL, serving, report=report)
    return path


def _cold_ids(size: int, hot_sorted: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray | None:
    """``count`` ids of a table of ``size`` rows that are not hot (None: every row is hot)."""
    if hot_sorted.size >= size:
        return None
    if size <= 1 << 20:
        return rng.choice(np.setdiff1d(np.arange(size), hot_sorted, assume_unique=True), count)
    picked: list[np.ndarray] = []
    found = 0
    for _ in range(64):  # a big table: random ids are mostly cold; draw until there are enough
        candidates = rng.integers(0, size, 4 * count)
        cold = candidates[~np.isin(candidates, hot_sorted)]
        picked.append(cold)
        found += cold.size
        if found >= count:
            return np.concatenate(picked)[:count]
    return rng.choice(np.setdiff1d(np.arange(size), hot_sorted, assume_unique=True), count)


def check_batches(
    hot: HotSet, rows: int = CHECK_ROWS, seed: int = 0, hotness: tuple[int, ...] | None = None
) -> dict[str, np.ndarray]:
    """Raw ids of the exactness check, ``rows x 26`` each (``rows x H`` bags with ``hotness``;
    :data:`CHECK_CASES`).

    ``hot``: hot ids of every table with any (cold where a table has none); ``cold``:
    ids of no hot row (hot where a table is all hot); ``mixed``: each lookup hot or
    cold at random; ``out_of_range``: mixed ids moved by multiples of their table's
    size (negative ones too), half the rows at the int64 limits and near them.
    """
    rng = np.random.default_rng(seed)
    tables = np.repeat(np.arange(NUM_CATEGORICAL), hotness or (1,) * NUM_CATEGORICAL)
    width = tables.size
    sizes = np.asarray(hot.table_sizes, dtype=np.int64)[tables]
    hot_ids = np.empty((rows, width), dtype=np.int64)
    cold_ids = np.empty((rows, width), dtype=np.int64)
    for j, t in enumerate(tables):
        ids = hot.ids[t]
        cold = _cold_ids(hot.table_sizes[t], np.sort(ids), rows, rng)
        hot_ids[:, j] = rng.choice(ids, rows) if ids.size else cold
        cold_ids[:, j] = cold if cold is not None else rng.choice(ids, rows)
    mixed = np.where(rng.random((rows, width)) < 0.5, hot_ids, cold_ids)
    shifted = mixed + sizes[None, :] * rng.integers(-(10**9), 10**9, (rows, width))
    limits = np.iinfo(np.int64)
    extremes = np.array([limits.min, limits.max, limits.min + 1, limits.max - 1, -1], dtype=np.int64)
    half = rows // 2
    shifted[:half] = extremes[np.arange(half * width).reshape(half, -1) % extremes.size]
    return {"hot": hot_ids, "cold": cold_ids, "mixed": mixed, "out_of_range": shifted}


def check_dense(rows: int, seed: int = 0) -> np.ndarray:
    """``rows x 13`` float32 dense features in the range of log1p counts."""
    return np.random.default_rng(seed).uniform(0.0, 8.0, (rows, NUM_DENSE)).astype(np.float32)


def store_reference(module: DLRM, store: RowStore, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Probabilities of ``module``'s layers on embeddings read from ``store``: ``B x 1`` float32.

    Each id is reduced into its real table (``np.mod``, as ONNX ``Mod(fmod=0)``) and its
    row read from the store (cast to float32), whatever the module's own tables hold; a
    multi-hot module's bags (``ids`` ``B x H``) are summed per table.
    """
    import torch

    counts = module.config.hotness or (1,) * NUM_CATEGORICAL
    tables = np.repeat(np.arange(NUM_CATEGORICAL), counts)
    reduced = np.mod(ids, np.asarray(store.spec.table_sizes, dtype=np.int64)[tables][None, :])
    embedded = store.rows(tables[None, :], reduced, column=EMBEDDING_COLUMN).astype(np.float32)
    if module.config.hotness is not None:
        ends = np.cumsum(counts)
        embedded = np.stack(
            [embedded[:, end - n : end].sum(axis=1) for n, end in zip(counts, ends, strict=True)], axis=1
        )
    with torch.no_grad():
        x = module.bottom_mlp(torch.from_numpy(dense))
        interacted = module.interaction(x, torch.from_numpy(np.ascontiguousarray(embedded)))
        return torch.sigmoid(module.top_mlp(interacted)).numpy()


def check_exactness(
    module: DLRM, dense_path: Path, hot: HotSet, store: RowStore, seed: int = 0, rows: int = CHECK_ROWS
) -> dict[str, CheckCase]:
    """The dense ONNX model fed by :func:`stage_reference` vs :func:`store_reference`, per case.

    Returns:
        Each case of :func:`check_batches` with its hot share and max abs diff.

    Raises:
        ExportError: ONNX Runtime cannot load the dense model, or a case's max abs diff is
            over :data:`TOLERANCES` for the store's dtype (one line).
    """
    session = onnx_session(dense_path)
    tolerance = TOLERANCES[store.spec.dtype]
    results = {}
    hotness = module.config.hotness
    for name, ids in check_batches(hot, rows, seed, hotness).items():
        dense = check_dense(len(ids), seed)
        slots, positions, cold_rows = stage_reference(ids, hot, hot.table_sizes, store, hotness)
        feeds = {DENSE_INPUT: dense, HOT_SLOTS: slots, COLD_POSITIONS: positions, COLD_ROWS: cold_rows}
        (got,) = session.run([OUTPUT], feeds)
        want = store_reference(module, store, dense, ids)
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        if not np.all(np.isfinite(got)) or not diff <= tolerance:
            raise ExportError(
                f"{dense_path}: the dense model differs from the store reference on {name} ids by "
                f"{diff:.3g} (tolerance {tolerance:g} for a {store.spec.dtype} store)"
            )
        results[name] = CheckCase(len(ids), float(np.count_nonzero(slots)) / slots.size, diff)
    return results


def heldout_hit_rate(
    hot: HotSet, data: Path, max_rows: int | None = None, hotness: tuple[int, ...] | None = None
) -> float:
    """Share of the lookups of a Criteo TSV file (streamed) that ``hot``'s rows serve (``hotness``:
    a file of the multi-hot text format, bags of those sizes; every id a lookup)."""
    from criteo.multihot import fixed_bags, iter_bag_batches

    batches: Iterator[Batch] = (
        iter_batches(data)
        if hotness is None
        else (fixed_bags(bags, hotness) for bags in iter_bag_batches(data))
    )
    hits = rows = lookups = 0
    for batch in batches:
        if max_rows is not None:
            batch = batch.slice(0, max_rows - rows)
        hits += int(hot.hits(batch, hotness).sum())
        rows += len(batch)
        lookups += batch.categorical.size
        if max_rows is not None and rows >= max_rows:
            break
    return hits / lookups if lookups else 0.0


def _check_store_place(repository: Path, store_dir: Path) -> None:
    """The store must not lie inside a model folder this function rewrites (it would be removed)."""
    store = Path(store_dir).resolve()
    for name in (*_entries(), SMALL_MODEL):
        folder = (Path(repository) / name).resolve()
        if store.is_relative_to(folder):
            raise ConfigError(
                f"the row store {store_dir} lies inside {folder}, which is rewritten: put it elsewhere "
                f"(e.g. beside the repository)"
            )


def _entries() -> tuple[str, str, str]:
    return embedding_model_name(FAMILY), dense_model_name(FAMILY), ensemble_model_name(FAMILY)


def _variants() -> tuple[str, ...]:
    """The family's FP16, INT8 (their ensembles and dense models), TensorRT, TorchScript and
    AOTInductor models, which this function does not write."""
    aoti = (aoti_model_name(FAMILY), aoti_package_name(FAMILY))
    return *variant_entries(FAMILY), trt_model_name(FAMILY), torch_model_name(FAMILY), *aoti


@contextlib.contextmanager
def _step(name: str, seconds: dict[str, float], memory: dict[str, dict[str, Any]]) -> Iterator[None]:
    """Time the block into ``seconds[name]`` and record its peak memory into ``memory[name]``."""
    started = time.perf_counter()
    with PeakMemory() as peak:
        yield
    seconds[name] = time.perf_counter() - started
    memory[name] = peak.report()


def make_random_hot_cold_dlrm(
    repository: Path,
    config: DLRMConfig,
    store_dir: Path,
    store_dtype: str,
    hot_budget: int,
    profile: AccessProfile,
    seed: int = 0,
    *,
    serving: ServingConfig | None = None,
    small_rows: int = SMALL_ROWS,
    opset: int = DEFAULT_OPSET,
    store_path: str | None = None,
    stage_instances: int = 1,
    heldout_data: Path | None = None,
    on_store_rows: Callable[[int], None] | None = None,
) -> RandomDLRM:
    """Write an untrained DLRM of ``config``'s size as ``dlrm_onnx`` (hot/cold) and ``dlrm_small``.

    See the module docstring for the steps. Nothing holds more than one chunk of the
    store in memory but the hot rows themselves (``hot_budget`` bytes, a few times
    over while the dense model is built).

    Args:
        repository: the model repository (``dlrm_onnx``, ``dlrm_embedding``, ``dlrm_dense``
            and ``dlrm_small`` are replaced there; ``dlrm_onnx_fp16``, ``dlrm_onnx_int8`` and
            ``dlrm_trt`` of an earlier export are removed).
        config: the architecture, at its real table sizes (e.g. ``DLRMConfig.preset("criteo-terabyte")``).
        store_dir: the row store's folder; reused when it holds this store already (same
            spec and ``seed``), else written (replacing what is there). Not inside the
            folders of the models above.
        store_dtype: ``"float32"``, ``"float16"`` or ``"int8"`` (row-wise quantized).
        hot_budget: bytes of hot rows the dense model keeps (FP32 rows, ``4 D`` bytes each).
        profile: measured lookups that choose the hot rows (raw ids, or reduced into
            ``config.table_sizes``).
        seed: seed of the store's values and of the layers' initialisation.
        serving: how Triton serves the dense model and ``dlrm_small`` (default: ``ServingConfig()``).
        small_rows: rows of each placeholder table (:func:`export.framework.small_table_sizes`).
        opset: the ONNX opset.
        store_path: the store's path as the server sees it (see
            :func:`export.tables.ensemble.write_embedding_stage`).
        stage_instances: embedding stage instances.
        heldout_data: a Criteo TSV whose lookups measure the hot rows' hit rate (held-out traffic).
        on_store_rows: called with the rows written after each chunk of the store (not when reused).

    Returns:
        What was written, with the exactness check and timings (also in
        ``<repository>/dlrm_onnx/export_report.json``).

    Raises:
        ConfigError: a bad dtype, budget or ``small_rows``; a profile reduced into other
            sizes; a store inside a rewritten model folder.
        ExportError: not enough disk for the store; the export, the split or the exactness
            check failed (then none of the four models is left in the repository).
    """
    repository = Path(repository)
    store_dir = Path(store_dir)
    spec = random_store_spec(config, store_dtype)
    if isinstance(hot_budget, bool) or not isinstance(hot_budget, int) or hot_budget < 0:
        raise ConfigError(f"the hot budget must be a byte count >= 0, got {hot_budget!r}")
    small_config = dataclasses.replace(config, table_sizes=small_table_sizes(config.table_sizes, small_rows))
    _check_store_place(repository, store_dir)
    serving = serving or ServingConfig()
    seconds: dict[str, float] = {}

    memory: dict[str, dict[str, Any]] = {}
    with _step("hot_rows", seconds, memory):
        hot = choose_hot_rows(profile, config.table_sizes, config.embedding_dim * 4, hot_budget)
    log.info(
        "%d hot rows of %d (%s), expected hit rate %.2f%%",
        hot.rows, spec.rows, format_bytes(hot.bytes_used), 100 * hot.expected_hit_rate,
    )  # fmt: skip

    with _step("row_store", seconds, memory):
        store = existing_random_store(store_dir, spec, seed)
        written = store is None
        if store is None:
            if (store_dir / META_FILE).exists():
                log.warning(
                    "%s holds another row store (other sizes, dtype or seed, or damaged): it is replaced",
                    store_dir,
                )
            log.info("writing the row store %s: %s", store_dir, format_bytes(spec.total_bytes))
            store = random_store(store_dir, spec, seed=seed, init=INIT, on_rows=on_store_rows)
        else:
            log.info("reusing the row store %s (same spec and seed)", store_dir)

    stage_name, dense_name, _ = _entries()
    # The family's other variants would be all-in-graph models of an earlier export, out of step.
    for name in (*_entries(), SMALL_MODEL, *_variants()):
        clear_model(repository, name)
    try:
        with _step("export", seconds, memory):
            module = _placeholder_module(small_config, seed)
            small_path = _export_small(module, repository, opset, serving)

        with _step("dense_model", seconds, memory):
            dense_path = version_dir(repository, dense_name) / MODEL_FILE
            dense = split_lookups(small_path, hot, config.table_sizes, rows=store)
            save_model(dense, dense_path)
            del dense
            write_lookup_graph(small_path, repository, FAMILY)
            hot_path = hot.save(version_dir(repository, stage_name) / HOT_SET_FILE)
            configs = add_hot_cold_models(
                repository,
                FAMILY,
                store_dir,
                hot_path,
                serving,
                store_path=store_path,
                stage_instances=stage_instances,
            )

        with _step("check", seconds, memory):
            checks = check_exactness(module, dense_path, hot, store, seed)
    except BaseException:
        for name in (*_entries(), SMALL_MODEL):
            clear_model(repository, name)
        raise

    rate = None
    if heldout_data is not None:
        with _step("heldout_hit_rate", seconds, memory):
            rate = heldout_hit_rate(hot, heldout_data, hotness=config.hotness)
    result = RandomDLRM(
        repository=repository,
        config=config,
        small_config=small_config,
        store=store,
        store_written=written,
        hot=hot,
        configs=(*configs, repository / SMALL_MODEL / "config.pbtxt"),
        checks=checks,
        tolerance=TOLERANCES[spec.dtype],
        heldout_hit_rate=rate,
        seconds=seconds,
        memory=memory,
    )
    report = result.report()
    if heldout_data is not None:
        report["hot_rows"]["heldout_data"] = str(heldout_data)
    write_report(repository, ensemble_model_name(FAMILY), report)
    return result
