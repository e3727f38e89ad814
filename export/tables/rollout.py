"""A new hot set for a hot/cold model, rolled out as new model versions with no failed request.

Skew drifts: the rows that take most lookups this week are not last month's. A
fresh profile chooses a new hot set (:func:`export.tables.hot_rows.choose_hot_rows`);
:func:`roll_out` turns it into version ``N`` of the embedding stage and of the
dense model, checks the new pair against the serving pair in-process, and
switches the ensemble to it.

The two must switch together: a stage's hot slots index only the hot table of
the dense model built from the same hot set, so a new stage with an old dense
model would answer wrong numbers, not errors. The ensemble therefore names a
version of each step (:func:`export.tables.ensemble.build_ensemble_config`), and on a
server in explicit model-control mode the rollout goes:

1. write ``<family>_embedding/N`` (the stage's files and the new hot set) and
   ``<family>_dense/N/model.onnx`` (built from the model's lookup graph and the row
   store, :func:`export.tables.hot_cold_graph.split_lookups`) and load both models: version
   ``N`` loads beside the serving one (their configs keep the latest two versions), and
   the ensemble still runs the old pair;
2. the ensemble's config names version ``N`` of both steps and the ensemble is loaded:
   tritonserver keeps serving the old ensemble until the new one is ready, and each
   request runs one pair from end to end;
3. the old version folders move to ``<model>/retired/`` and both models are loaded
   again: the old versions unload (their files stay there).

Without a server the files are written straight in the state after step 3, for a
server started (or pointed at the repository) later.

The FP16 and INT8 variants of the model (:mod:`export.tables.hot_cold_variants`) run the same
stage, so they roll out with it: version ``N`` of each variant's dense model is made
from the new FP32 dense model by the recipe its report keeps (an INT8 one keeping the
serving version's quantization parameters, so a row's answer does not move), checked
against its serving version, loaded in step 1, and its ensemble switches in step 2
beside the FP32 one.

The row store is shared by
every version (it holds every row); each version holds only its hot rows, so a
rollout needs memory for two hot sets while both pairs are loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bundle.admin import admin_headers
from bundle.errors import ConfigError, ExportError
from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    REPORT_FILE,
    read_config,
    read_report,
    version_dir,
    write_config,
    write_report,
)
from bundle.staging import RepositoryWrite
from criteo.profile import AccessProfile
from criteo.tsv import Batch, read_batch
from export.graphs.onnx_io import save_model
from export.graphs.parity import ParityResult, compare, extreme_id_rows
from export.options import current_placement
from export.stage.hot_cold_lookup import PARAM_HOTNESS
from export.tables.ensemble import (
    ENSEMBLE_PLATFORM,
    ENSEMBLE_SUFFIX,
    HOT_SET_FILE,
    LOOKUP_GRAPH_FILE,
    VARIANTS,
    VERSIONS_LOADED,
    build_ensemble_config,
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    stage_store_path,
    variant_models,
)
from export.tables.hot_cold_graph import split_lookups
from export.tables.hot_cold_variants import (
    LABELS,
    VariantRecipe,
    build_dense_variant,
    check_variant,
    keep_quantization,
)
from export.tables.hot_rows import HotSet, choose_hot_rows
from export.tables.placement import FP32_STORE_TOLERANCE, run_hot_cold
from export.tables.row_store import RowStore, format_bytes

log = logging.getLogger(__name__)

#: Max |AUC(new pair) - AUC(old pair)| with an FP16 store (the export's FP16 gate): the
#: first export took its hot rows from the FP32 graph, a rollout takes them from the store.
FP16_STORE_AUC_TOLERANCE = 1e-3
#: The same with an int8 store (the export's INT8 gate).
INT8_STORE_AUC_TOLERANCE = 1e-3
#: Where a replaced version's folders go, inside each model's folder.
RETIRED_FOLDER = "retired"
#: Check rows read from the check data by default.
CHECK_ROWS = 2048


@dataclass(frozen=True)
class RolloutOptions:
    """What to roll out, and where (the options of ``python -m export rollout-hot-set``).

    Args:
        repository: the model repository holding the hot/cold model.
        family: ``dlrm``, ``wide_deep``, ...: the served model is ``<family>_onnx``.
        hot_budget: bytes of hot rows (None: the serving version's budget, from its report).
        check_data: a labeled Criteo TSV whose first ``check_rows`` rows check the new pair
            against the serving one (and their out-of-range copies).
        check_rows: rows read from ``check_data``.
        row_store: the row store's folder on this machine, when the stage's config names
            a path inside a container (None: the config's path).
        url: the server's HTTP endpoint (``host:port`` or ``http://host:port``) in explicit
            model-control mode; None: write the files only.
        admin_key: the server's admin key (its model-repository API is restricted).
        timeout_s: how long each load may take.

    Raises:
        ConfigError: a repository or check file that does not exist, fewer than 1 check
            row, a negative budget or timeout.
    """

    repository: Path
    family: str
    check_data: Path
    hot_budget: int | None = None
    check_rows: int = CHECK_ROWS
    row_store: Path | None = None
    url: str | None = None
    admin_key: str | None = field(default=None, repr=False)
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not Path(self.repository).is_dir():
            raise ConfigError(f"model repository {self.repository} is not a folder")
        if not Path(self.check_data).is_file():
            raise ConfigError(f"check data {self.check_data} is not a file")
        if self.check_rows < 1:
            raise ConfigError(f"--check-rows must be >= 1, got {self.check_rows}")
        budget = self.hot_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ConfigError(f"--hot-budget must be a byte count >= 0, got {budget!r}")
        if not self.timeout_s > 0:
            raise ConfigError(f"the load timeout must be > 0 s, got {self.timeout_s}")


@dataclass(frozen=True)
class Serving:
    """The hot/cold model as the repository serves it now.

    ``variants``: the FP16/INT8 variants served beside it (:mod:`export.tables.hot_cold_variants`), each
    with its recipe; they run the same stage version and roll out with it.
    """

    name: str
    stage: str
    dense: str
    version: int
    store: RowStore
    store_dir: Path
    hot: HotSet
    report: dict[str, Any]
    variants: dict[str, VariantRecipe] = field(default_factory=dict)

    @property
    def ensembles(self) -> list[str]:
        """Every ensemble that switches: the FP32 one, then the variants'."""
        return [self.name, *(variant_models(self.family, p)[0] for p in self.variants)]

    @property
    def dense_models(self) -> list[str]:
        """Every dense model: FP32, then the variants'."""
        return [self.dense, *(variant_models(self.family, p)[1] for p in self.variants)]

    @property
    def family(self) -> str:
        return self.name.removesuffix(ENSEMBLE_SUFFIX)


@dataclass(frozen=True)
class RolloutResult:
    """A rolled-out hot set.

    Attributes:
        name: the served model (``<family>_onnx``).
        old_version, new_version: the versions of the stage and the dense model before and after.
        hot_rows, hot_bytes: the new hot set's rows and bytes.
        expected_hit_rate: the new hot set's share of the profiled lookups.
        check_hit_rates: (old, new) share of the check rows' lookups that hit hot rows.
        parity: the new pair vs the old pair on the check rows and their out-of-range copies.
        applied: whether a server switched to the new version (else only files were written).
        seconds: per step (``hot_rows``, ``write``, ``check``, ``switch``).
    """

    name: str
    old_version: int
    new_version: int
    hot_rows: int
    hot_bytes: int
    expected_hit_rate: float
    check_hit_rates: tuple[float, float]
    parity: ParityResult
    applied: bool
    seconds: dict[str, float]
    variants: dict[str, ParityResult] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for the CLI."""
        where = "served" if self.applied else "written (load it on the server, or start one)"
        old, new = self.check_hit_rates
        line = (
            f"{self.name}: hot set version {self.new_version} {where}: {self.hot_rows} hot rows "
            f"({format_bytes(self.hot_bytes)}), expected hit rate {100 * self.expected_hit_rate:.1f}%; "
            f"check rows hit {100 * old:.1f}% -> {100 * new:.1f}%; max abs diff vs version "
            f"{self.old_version} {self.parity.max_abs_diff:.2e}"
        )
        if self.parity.auc_delta is not None:
            line += f", AUC delta {self.parity.auc_delta:+.1e}"
        for precision, parity in self.variants.items():
            line += f"; {LABELS[precision]} AUC delta {parity.auc_delta:+.1e}"
        return line


def _read_report(repository: Path, name: str) -> dict[str, Any]:
    """The model's export report, its ``placement`` as this version names it: a report that an
    earlier version wrote is written back with the current name (:func:`export.options.current_placement`)."""
    report = read_report(repository, name)
    placement = report.get("placement")
    if isinstance(placement, str):
        report["placement"] = current_placement(placement)
    return report


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def serving_state(repository: Path, family: str, row_store: Path | None = None) -> Serving:
    """Read which version pair ``<family>_onnx`` serves, its hot set, store and report.

    Raises:
        ConfigError: the model is not a hot/cold export (or one exported before its
            lookup graph was kept), or its steps name two different versions.
        ExportError, DataError: a damaged row store or hot set.
    """
    name, stage, dense = ensemble_model_name(family), embedding_model_name(family), dense_model_name(family)
    config_path = repository / name / CONFIG_NAME
    if not config_path.is_file():
        raise ConfigError(f"{repository} has no model {name}")
    config = read_config(config_path)
    steps = {step.model_name: step.model_version for step in config.ensemble_scheduling.step}
    if config.platform != ENSEMBLE_PLATFORM or set(steps) != {stage, dense}:
        raise ConfigError(
            f"{name} is not a hot/cold model (an ensemble of {stage} and {dense}): export it with "
            "--hot-budget first"
        )
    versions = {steps[stage], steps[dense]}
    if versions == {-1}:  # an ensemble of an earlier export: the latest of each
        common = set(_versions(repository / stage)) & set(_versions(repository / dense))
        versions = {max(common)} if common else set()
    if len(versions) != 1 or min(versions) < 1:
        raise ConfigError(f"{name} runs {stage} version {steps[stage]} with {dense} version {steps[dense]}")
    version = versions.pop()
    if not (repository / dense / LOOKUP_GRAPH_FILE).is_file():
        raise ConfigError(
            f"{repository / dense / LOOKUP_GRAPH_FILE} is missing (exported by an earlier version of "
            f"the bundle): export {name} again to roll out hot sets"
        )
    stage_config = read_config(repository / stage / CONFIG_NAME)
    if stage_config.parameters[PARAM_HOTNESS].string_value:
        raise ConfigError(
            f"{name} takes bags of ids (a multi-hot model): rolling out a new hot set is not supported for "
            "it yet; export it again with the new profile (--profile-data)"
        )
    for model, model_config in (
        (stage, stage_config),
        (dense, read_config(repository / dense / CONFIG_NAME)),
    ):
        if model_config.version_policy.latest.num_versions < VERSIONS_LOADED:
            raise ConfigError(
                f"{model} keeps fewer than {VERSIONS_LOADED} versions loaded (exported by an earlier "
                f"version of the bundle): export {name} again to roll out hot sets"
            )
    if row_store is None:
        row_store = stage_store_path(repository, stage, version, stage_config)
    store = RowStore.open(Path(row_store))
    hot = HotSet.load(version_dir(repository, stage, version) / HOT_SET_FILE)
    variants = _serving_variants(repository, family, stage, version)
    return Serving(
        name, stage, dense, version, store, Path(row_store), hot, _read_report(repository, name), variants
    )


def _serving_variants(repository: Path, family: str, stage: str, version: int) -> dict[str, VariantRecipe]:
    """The variant ensembles over ``stage`` and the recipes that made them.

    Raises:
        ConfigError: a variant that runs another version of the stage, keeps too few versions
            loaded, or has no recipe.
    """
    variants = {}
    for precision in VARIANTS:
        name, dense = variant_models(family, precision)
        config_path = repository / name / CONFIG_NAME
        if not config_path.is_file():
            continue
        config = read_config(config_path)
        if config.platform != ENSEMBLE_PLATFORM:
            continue  # not a hot/cold variant (a model of another export): left alone
        steps = {step.model_name: step.model_version for step in config.ensemble_scheduling.step}
        if steps != {stage: version, dense: version}:
            raise ConfigError(f"{name} runs {steps}, not version {version} of {stage} and {dense}")
        if read_config(repository / dense / CONFIG_NAME).version_policy.latest.num_versions < VERSIONS_LOADED:
            raise ConfigError(
                f"{dense} keeps fewer than {VERSIONS_LOADED} versions loaded: export {name} again"
            )
        where = str(repository / name / REPORT_FILE)
        variants[precision] = VariantRecipe.from_report(_read_report(repository, name), where)
    return variants


def _budget(options: RolloutOptions, serving: Serving) -> int:
    if options.hot_budget is not None:
        return options.hot_budget
    budget = serving.report.get("hot_budget_bytes")
    if not isinstance(budget, int):
        raise ConfigError(f"{serving.name}'s report names no hot budget: give --hot-budget SIZE")
    return budget


def _check(repository: Path, serving: Serving, dense_path: Path, hot: HotSet, rows: Batch) -> ParityResult:
    """The new pair vs the serving pair on ``rows`` and their out-of-range copies.

    Raises:
        ExportError: off by more than :data:`FP32_STORE_TOLERANCE` (FP32 store) or an AUC
            moved by more than :data:`FP16_STORE_AUC_TOLERANCE` (FP16 store) or
            :data:`INT8_STORE_AUC_TOLERANCE` (int8 store).
    """
    serving_dense = version_dir(repository, serving.dense, serving.version) / MODEL_FILE
    store = serving.store
    extreme = extreme_id_rows(rows)
    check = compare(
        run_hot_cold(dense_path, hot, store, rows),
        run_hot_cold(serving_dense, serving.hot, store, rows),
        rows.labels,
    )
    out_of_range = compare(
        run_hot_cold(dense_path, hot, store, extreme),
        run_hot_cold(serving_dense, serving.hot, store, extreme),
        None,
    )
    worst = max(check.max_abs_diff, out_of_range.max_abs_diff)
    parity = ParityResult(check.rows + out_of_range.rows, worst, check.auc, check.auc_delta)
    where = f"the new hot set vs version {serving.version} ({store.spec.dtype} row store)"
    if store.spec.dtype == "float32" and not worst <= FP32_STORE_TOLERANCE:
        raise ExportError(f"{where}: max abs diff {worst:.3g} (tolerance {FP32_STORE_TOLERANCE:g})")
    if store.spec.dtype != "float32":
        delta = check.auc_delta
        tolerance = INT8_STORE_AUC_TOLERANCE if store.spec.quantized else FP16_STORE_AUC_TOLERANCE
        if delta is None or not abs(delta) <= tolerance:
            raise ExportError(
                f"{where}: AUC differs by {delta} (tolerance {tolerance:g}; needs labeled "
                f"check data); max abs diff {worst:.3g}"
            )
    return parity


def _write_version(repository: Path, serving: Serving, hot: HotSet, version: int, staged: Path) -> Path:
    """The new version folders of the stage and the dense model, written under ``staged`` (a tree
    shaped like the repository); the dense model's path."""
    stage_dir = version_dir(staged, serving.stage, version)
    stage_dir.mkdir(parents=True)
    hot.save(stage_dir / HOT_SET_FILE)
    graph = repository / serving.dense / LOOKUP_GRAPH_FILE
    dense = split_lookups(graph, hot, serving.store.spec.table_sizes, rows=serving.store)
    dense_path = version_dir(staged, serving.dense, version) / MODEL_FILE
    save_model(dense, dense_path)
    return dense_path


def _variants(
    repository: Path, serving: Serving, dense_path: Path, hot: HotSet, version: int, rows: Batch, staged: Path
) -> dict[str, ParityResult]:
    """Version ``version`` of each variant's dense model, made from the new FP32 one by its recipe,
    each checked against its serving version.

    An INT8 variant keeps the serving version's quantization parameters
    (:func:`export.tables.hot_cold_variants.keep_quantization`): the static method still needs rows to
    build the graph, and gets the check rows.

    Raises:
        ExportError: a conversion failed or a variant's AUC moved more than its tolerance.
    """
    checks = {}
    for precision, recipe in serving.variants.items():
        name, dense = variant_models(serving.family, precision)
        path = version_dir(staged, dense, version) / MODEL_FILE
        old = version_dir(repository, dense, serving.version) / MODEL_FILE
        build_dense_variant(recipe, dense_path, path, hot, serving.store, rows, "the rollout's check rows")
        if recipe.quantize is not None:
            taken = keep_quantization(path, old)
            log.info(
                "%s version %d: %d quantization parameters kept from version %d",
                dense,
                version,
                taken,
                serving.version,
            )
        what = f"{name}: the new hot set vs version {serving.version}"
        checks[precision] = check_variant(recipe, path, old, serving.hot, hot, serving.store, rows, what)
    return checks


def _plan_switch(write: RepositoryWrite, repository: Path, serving: Serving, version: int) -> None:
    """Planned moves: every ensemble's config names ``version`` of both its steps (staged files that
    replace the served configs, each in one rename)."""
    for precision in ("", *serving.variants):
        name = ensemble_model_name(serving.family, precision)
        config = read_config(repository / name / CONFIG_NAME)
        steps = build_ensemble_config(serving.family, version, precision).ensemble_scheduling
        config.ensemble_scheduling.CopyFrom(steps)
        staged = write_config(write.staged / name, config)
        write.put(staged, repository / name / CONFIG_NAME)


def _plan_retire(write: RepositoryWrite, repository: Path, serving: Serving, version: int) -> None:
    """Planned moves: ``version`` of the stage and of every dense model out of tritonserver's sight,
    to ``<model>/retired/<version>`` (tritonserver reads numbered folders only)."""
    for name in (serving.stage, *serving.dense_models):
        write.put(version_dir(repository, name, version), repository / name / RETIRED_FOLDER / str(version))


def _http_client(url: str, timeout_s: float) -> Any:
    import tritonclient.http as httpclient

    address = url.split("://", 1)[-1].rstrip("/")
    return httpclient.InferenceServerClient(address, connection_timeout=timeout_s, network_timeout=timeout_s)


def _load(client: Any, name: str, headers: dict[str, str], url: str) -> None:
    from tritonclient.utils import InferenceServerException

    log.info("%s: loading %s", url, name)
    try:
        client.load_model(name, headers=headers)
    except InferenceServerException as exc:
        message = exc.message() or str(exc)
        hint = ""
        if "explicit" in message or "not allowed" in message:
            hint = " (start the server with --model-control-mode explicit)"
        raise ConfigError(f"{url}: loading {name} failed: {message}{hint}") from None
    except (OSError, ConnectionError) as exc:
        raise ConfigError(f"{url}: cannot reach the server ({exc})") from None


def _require(client: Any, name: str, version: int, ready: bool, url: str) -> None:
    if bool(client.is_model_ready(name, str(version))) != ready:
        state = "ready" if not ready else "not ready"
        raise ExportError(f"{url}: {name} version {version} is {state} after its load")


def _apply(
    write: RepositoryWrite, serving: Serving, version: int, url: str, key: str | None, timeout_s: float
) -> None:
    """Steps 1-3 of the module docstring on the server at ``url``, each step's moves made before
    its loads (the write's planned moves: the new versions, the switch, the retirement, then the
    reports)."""
    from tritonclient.utils import InferenceServerException

    headers = admin_headers(key, "http") if key else {}
    client = _http_client(url, timeout_s)
    try:
        try:
            live = client.is_server_live()
        except (InferenceServerException, OSError) as exc:
            raise ConfigError(f"{url}: cannot reach the server ({exc})") from None
        if not live:
            raise ConfigError(f"{url}: the server is not live")
        old = serving.version
        models = (serving.stage, *serving.dense_models)
        write.apply(len(models))
        for name in models:  # 1: the new pair (and variants) load beside the serving ones
            _load(client, name, headers, url)
            _require(client, name, version, True, url)
        write.apply(len(serving.ensembles))  # 2: the ensembles switch pairs
        for name in serving.ensembles:
            _load(client, name, headers, url)
        write.apply()  # 3: the old versions unload
        for name in models:
            _load(client, name, headers, url)
            _require(client, name, old, False, url)
    finally:
        client.close()


def roll_out(
    options: RolloutOptions, profile: AccessProfile, serving: Serving | None = None
) -> RolloutResult:
    """Choose a new hot set from ``profile`` and roll it out as the next version (see the module docstring).

    Args:
        options: the repository, model, budget, check data and server.
        profile: the lookups that choose the hot rows (reduced into the store's table
            sizes, or raw ids).
        serving: :func:`serving_state` of ``options`` when the caller read it already.

    Returns:
        What was rolled out; ``export_report.json`` of ``<family>_onnx`` records it too.

    Raises:
        ConfigError: not a hot/cold model; no budget; a hot set identical to the serving
            one; a server that refuses a load (then the files are as before).
        ExportError: the new pair does not match the serving pair (nothing is left written).
    """
    repository = Path(options.repository)
    if serving is None:
        serving = serving_state(repository, options.family, options.row_store)
    spec = serving.store.spec
    seconds: dict[str, float] = {}

    started = time.perf_counter()
    budget = _budget(options, serving)
    hot = choose_hot_rows(profile, spec.table_sizes, 4 * spec.width, budget)
    seconds["hot_rows"] = time.perf_counter() - started
    if all(np.array_equal(a, b) for a, b in zip(hot.ids, serving.hot.ids, strict=True)):
        raise ConfigError(
            f"{serving.name}: the profile chooses the hot set version {serving.version} already serves; "
            "nothing to roll out"
        )
    version = 1 + max(
        [
            *(v for name in (serving.stage, *serving.dense_models) for v in _versions(repository / name)),
            serving.version,
        ]
    )
    log.info(
        "%s: hot set version %d: %d hot rows (%s of the %s budget), expected hit rate %.1f%%",
        serving.name, version, hot.rows, format_bytes(hot.bytes_used), format_bytes(budget),
        100 * hot.expected_hit_rate,
    )  # fmt: skip

    started = time.perf_counter()
    with RepositoryWrite(repository, f"rollout-hot-set {serving.name}") as write:
        dense_path = _write_version(repository, serving, hot, version, write.staged)
        seconds["write"] = time.perf_counter() - started

        started = time.perf_counter()
        rows = read_batch(options.check_data, options.check_rows)
        parity = _check(repository, serving, dense_path, hot, rows)
        variants = _variants(repository, serving, dense_path, hot, version, rows, write.staged)
        rates = (serving.hot.hit_rate(rows), hot.hit_rate(rows))
        seconds["check"] = time.perf_counter() - started

        started = time.perf_counter()
        for name in (serving.stage, *serving.dense_models):
            write.put(version_dir(write.staged, name, version), version_dir(repository, name, version))
        _plan_switch(write, repository, serving, version)
        _plan_retire(write, repository, serving, serving.version)
        result = RolloutResult(
            serving.name,
            serving.version,
            version,
            hot.rows,
            hot.bytes_used,
            hot.expected_hit_rate,
            rates,
            parity,
            options.url is not None,
            {key: round(value, 3) for key, value in seconds.items()},
            variants,
        )
        _plan_reports(write, repository, serving, result, hot, budget, profile)
        write.decide()
        if options.url is not None:
            _apply(write, serving, version, options.url, options.admin_key, options.timeout_s)
        write.finish()
        seconds["switch"] = time.perf_counter() - started
    return dataclasses.replace(result, seconds={key: round(value, 3) for key, value in seconds.items()})


def _plan_reports(
    write: RepositoryWrite,
    repository: Path,
    serving: Serving,
    result: RolloutResult,
    hot: HotSet,
    budget: int,
    profile: AccessProfile,
) -> None:
    """Planned moves: the ensemble's report describes the new hot set, ``rollouts`` lists every
    switch (and each variant's report its own)."""
    report = dict(serving.report)
    report.update(
        {
            "version": result.new_version,
            "hot_budget_bytes": budget,
            "hot_rows": hot.rows,
            "hot_bytes": hot.bytes_used,
            "hot_rows_per_table": list(hot.table_rows),
            "expected_hit_rate": hot.expected_hit_rate,
            "profile": {"rows": profile.rows, "lookups": hot.profiled_lookups},
        }
    )
    entry = {
        "from_version": result.old_version,
        "to_version": result.new_version,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "applied_on_server": result.applied,
        "check_hit_rates": {"old": result.check_hit_rates[0], "new": result.check_hit_rates[1]},
        "parity_vs_old": asdict(result.parity),
        "seconds": result.seconds,
    }
    report["rollouts"] = [*report.get("rollouts", []), entry]
    write.put(write_report(write.staged, serving.name, report), repository / serving.name / REPORT_FILE)
    for precision, parity in result.variants.items():
        name = variant_models(serving.family, precision)[0]
        variant = _read_report(repository, name)
        variant["version"] = result.new_version
        step = {**entry, "parity_vs_old": asdict(parity)}
        variant["rollouts"] = [*variant.get("rollouts", []), step]
        write.put(write_report(write.staged, name, variant), repository / name / REPORT_FILE)
