"""Hot/cold models in the repository: an embedding stage and a dense model as one ensemble.

A model whose embedding tables are larger than memory keeps its family's name,
``<family>_onnx``, as a Triton ensemble of two steps:

1. ``<family>_embedding``: the embedding stage, the compiled Triton backend ``embedding``
   (``backends/embedding/backend.cc``, built by ``make stages``; in compose by the image's
   build stage; KIND_CPU), that maps the row store read-only and, for the request's
   ``categorical_ids`` (``B x 26`` int64, any value), answers ``hot_slots``
   (``B x 26``), ``cold_positions`` (``N``) and ``cold_rows`` (``N x W`` float32);
2. ``<family>_dense``: the ONNX model (``backend: "onnxruntime"``) that holds the
   hot rows and takes ``dense_features`` with those three tensors to
   ``click_probability`` (``B x 1``).

Only the cold rows travel between the steps. ``N`` differs per request, so no
tensor has a batch dimension Triton could split or merge: every model here has
``max_batch_size: 0`` and dims with a leading ``-1`` (no dynamic batching; each
client request runs as its own batch).

The stage's version folder holds the hot set (``hot_set.npz``); the row store stays where
it is, named by the config parameter ``row_store``: relative to the version folder when the
store lies inside the repository (so the repository moves, or is mounted at ``/models``,
with it), else absolute, or whatever ``store_path`` says (the store's path inside the
serving container).

Every config is a ``model_config_pb2.ModelConfig`` written with ``text_format``
(:func:`bundle.repository.write_config`); :func:`bundle.repository.read_config`
parses them back.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError
from bundle.repository import (
    CONFIG_NAME,
    ENSEMBLE_PLATFORM,
    MODEL_FILE,
    ONNX_BACKEND,
    ServingConfig,
    clear_model,
    make_ensemble_version,
    read_config,
    set_ort_threading,
    version_dir,
    write_config,
)
from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    HOTNESS_PARAMETER,
    INPUTS,
    NUM_CATEGORICAL,
    OUTPUTS,
    TensorSpec,
    inputs_for,
)
from export.graphs.onnx_io import save_model
from export.stage.hot_cold_lookup import (
    COLD_READ_THREADS,
    COLD_READS,
    DEFAULT_COLD_READ_THREADS,
    DEFAULT_COLD_READS,
    PARAM_COLD_READ_THREADS,
    PARAM_COLD_READS,
    PARAM_HOT_SET,
    PARAM_HOTNESS,
    PARAM_ROW_STORE,
    PARAM_ROW_STORE_FINGERPRINT,
    PARAM_TABLE_SIZES,
    STORE_FINGERPRINT_KEY,
)
from export.tables.hot_cold_graph import lookup_graph
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStore

#: Suffix of a family's embedding stage (``dlrm_embedding``).
EMBEDDING_SUFFIX = "_embedding"
#: Suffix of a family's dense model (``dlrm_dense``).
DENSE_SUFFIX = "_dense"
#: Suffix of the served model, the ensemble (``dlrm_onnx``): the family's usual name.
ENSEMBLE_SUFFIX = "_onnx"
#: Precisions of a hot/cold model's dense part: "" (FP32, ``<family>_dense`` under
#: ``<family>_onnx``), then the variants, each its own dense model and ensemble over the one
#: shared stage (``<family>_dense_fp16`` under ``<family>_onnx_fp16``, ...).
PRECISIONS: tuple[str, ...] = ("", "fp16", "int8")
#: The variants among them, in the order they are written.
VARIANTS: tuple[str, ...] = tuple(precision for precision in PRECISIONS if precision)
#: The hot set's file in the stage's version folder.
HOT_SET_FILE = "hot_set.npz"
#: The dense model's graph with its tables' values dropped, in its model folder
#: (:func:`export.tables.hot_cold_graph.lookup_graph`): a new hot set's dense model is built from it.
LOOKUP_GRAPH_FILE = "lookup_graph.onnx"
#: The embedding stage's backend: tritonserver opens
#: ``<backends>/embedding/libtriton_embedding.so`` (``backends/embedding/backend.cc``).
STAGE_BACKEND = "embedding"

#: Versions of the stage and of the dense model that may be loaded at once: the serving
#: pair and a new one, while the ensemble switches (:mod:`export.tables.rollout`). The policy
#: never changes after the export, because tritonserver reloads every version of a model
#: whose config changed, and reloading the serving version under load crashed the python
#: backend of tritonserver 2.51 (seen in tests/integration/test_hot_set_rollout.py).
VERSIONS_LOADED = 2

#: The dims of ``B x ...`` tensors in a model with ``max_batch_size: 0``.
ANY_ROWS = -1


def embedding_model_name(family: str) -> str:
    """The embedding stage of a family: ``dlrm`` -> ``dlrm_embedding``."""
    return f"{_check_family(family)}{EMBEDDING_SUFFIX}"


def dense_model_name(family: str, precision: str = "") -> str:
    """The dense model of a family: ``dlrm`` -> ``dlrm_dense`` (``fp16``: ``dlrm_dense_fp16``)."""
    return f"{_check_family(family)}{DENSE_SUFFIX}{_precision_suffix(precision)}"


def ensemble_model_name(family: str, precision: str = "") -> str:
    """The served model of a family: ``dlrm`` -> ``dlrm_onnx`` (``int8``: ``dlrm_onnx_int8``)."""
    return f"{_check_family(family)}{ENSEMBLE_SUFFIX}{_precision_suffix(precision)}"


def variant_models(family: str, precision: str) -> tuple[str, str]:
    """A variant's ensemble and dense model names: ``("dlrm_onnx_fp16", "dlrm_dense_fp16")``."""
    return ensemble_model_name(family, precision), dense_model_name(family, precision)


def _precision_suffix(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ConfigError(f"a hot/cold model's precision is one of {PRECISIONS}, got {precision!r}")
    return f"_{precision}" if precision else ""


def _check_family(family: str) -> str:
    if not family or not family.replace("_", "").isalnum():
        raise ConfigError(f"a model family is letters, digits and '_', got {family!r}")
    return family


def _schema_dims(spec: TensorSpec) -> tuple[str, int, tuple[int, ...]]:
    """A schema tensor as (name, config data type, dims with the leading ``-1``)."""
    return spec.name, mc.DataType.Value(f"TYPE_{spec.triton_dtype}"), (ANY_ROWS, *spec.shape)


def _schema_tensor(name: str) -> tuple[str, int, tuple[int, ...]]:
    spec = next(spec for spec in (*INPUTS, *OUTPUTS) if spec.name == name)
    return _schema_dims(spec)


def _hot_slots(positions: int = NUM_CATEGORICAL) -> tuple[str, int, tuple[int, ...]]:
    return HOT_SLOTS, mc.TYPE_INT64, (ANY_ROWS, positions)


def _cold_positions() -> tuple[str, int, tuple[int, ...]]:
    return COLD_POSITIONS, mc.TYPE_INT64, (ANY_ROWS,)


def _cold_rows(width: int) -> tuple[str, int, tuple[int, ...]]:
    return COLD_ROWS, mc.TYPE_FP32, (ANY_ROWS, width)


def _add(tensors: Any, tensor: tuple[str, int, tuple[int, ...]]) -> None:
    name, data_type, dims = tensor
    entry = tensors.add()
    entry.name = name
    entry.data_type = data_type
    entry.dims.extend(dims)


def _check_width(width: int) -> int:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"the row width must be an int >= 1, got {width!r}")
    return width


def build_embedding_config(
    name: str,
    table_sizes: Sequence[int],
    width: int,
    row_store: str,
    hot_set: str = HOT_SET_FILE,
    instances: int = 1,
    store_fingerprint: str = "",
    cold_reads: str = DEFAULT_COLD_READS,
    cold_read_threads: int = DEFAULT_COLD_READ_THREADS,
    hotness: Sequence[int] | None = None,
) -> mc.ModelConfig:
    """The ModelConfig of an embedding stage (KIND_CPU, ``max_batch_size: 0``).

    Args:
        name: the model name (``dlrm_embedding``).
        table_sizes: rows of each of the 26 tables.
        width: values per store row ``W`` (``cold_rows`` is ``N x W``).
        row_store: the store's folder, absolute or relative to the version folder.
        hot_set: the hot-set file, absolute or relative to the version folder.
        instances: stage instances (each maps the same store; the store is verified once).
        store_fingerprint: the store's fingerprint (its ``store.json``): the stage refuses
            another store found under the same path ("" for none, e.g. an older store).
        cold_reads: how the stage reads cold rows from the store (``io_uring``, ``prefetch``,
            ``threads`` or ``fault``: :class:`export.stage.hot_cold_lookup.ColdReads`).
        cold_read_threads: threads of the ``threads`` way (written only for it).
        hotness: a multi-hot model's ids per bag of each table (None: one id each): the
            ids and ``hot_slots`` are then ``-1 x H``, ``H`` their sum.

    Raises:
        ConfigError: not 26 sizes >= 1, a width below 1, fewer than 1 instance, an
            empty path, an unknown way of reading cold rows, or not 26 counts >= 1.
    """
    sizes = tuple(int(size) for size in table_sizes)
    if len(sizes) != NUM_CATEGORICAL or min(sizes) < 1:
        raise ConfigError(f"an embedding stage needs {NUM_CATEGORICAL} table sizes >= 1, got {list(sizes)}")
    _check_width(width)
    if instances < 1:
        raise ConfigError(f"the embedding stage needs at least 1 instance, got {instances}")
    if not row_store or not hot_set:
        raise ConfigError("the embedding stage needs a row store path and a hot-set path")
    if cold_reads not in COLD_READS or cold_read_threads < 1:
        raise ConfigError(
            f"cold reads must be one of {', '.join(COLD_READS)} with threads >= 1, "
            f"got {cold_reads!r} and {cold_read_threads}"
        )
    counts = None if hotness is None else tuple(int(count) for count in hotness)
    if counts is not None and (len(counts) != NUM_CATEGORICAL or min(counts) < 1):
        raise ConfigError(f"hotness must be {NUM_CATEGORICAL} counts >= 1, got {list(counts)}")
    positions = NUM_CATEGORICAL if counts is None else sum(counts)
    config = mc.ModelConfig(name=name, backend=STAGE_BACKEND, max_batch_size=0)
    _add(config.input, (CATEGORICAL_INPUT, mc.TYPE_INT64, (ANY_ROWS, positions)))
    for tensor in (_hot_slots(positions), _cold_positions(), _cold_rows(width)):
        _add(config.output, tensor)
    group = config.instance_group.add()
    group.count = instances
    group.kind = mc.ModelInstanceGroup.KIND_CPU
    config.version_policy.latest.num_versions = VERSIONS_LOADED
    config.parameters[PARAM_ROW_STORE].string_value = row_store
    config.parameters[PARAM_HOT_SET].string_value = hot_set
    config.parameters[PARAM_TABLE_SIZES].string_value = ",".join(str(size) for size in sizes)
    if store_fingerprint:
        config.parameters[PARAM_ROW_STORE_FINGERPRINT].string_value = store_fingerprint
    config.parameters[PARAM_COLD_READS].string_value = cold_reads
    if cold_reads == COLD_READ_THREADS:
        config.parameters[PARAM_COLD_READ_THREADS].string_value = str(cold_read_threads)
    if counts is not None:
        config.parameters[PARAM_HOTNESS].string_value = ",".join(str(count) for count in counts)
    return config


def build_dense_config(name: str, width: int, serving: ServingConfig) -> mc.ModelConfig:
    """The ModelConfig of a dense model (``backend: "onnxruntime"``, ``max_batch_size: 0``).

    Instances, their kind (the serving profile's) and ONNX Runtime's thread count
    come from ``serving``; its batching options do not apply.

    Raises:
        ConfigError: ``serving.ort_trt``: the TensorRT accelerator's profiles are
            written for batched inputs, not for the ``N``-row cold tensors.
    """
    _check_width(width)
    if serving.ort_trt:
        raise ConfigError(
            f"{name}: the ONNX Runtime TensorRT accelerator is not supported for a hot/cold "
            "model's dense part"
        )
    config = mc.ModelConfig(name=name, backend=ONNX_BACKEND, max_batch_size=0)
    config.default_model_filename = MODEL_FILE
    positions = NUM_CATEGORICAL if serving.hotness is None else sum(serving.hotness)
    for tensor in (
        _schema_tensor(DENSE_INPUT),
        _hot_slots(positions),
        _cold_positions(),
        _cold_rows(width),
    ):
        _add(config.input, tensor)
    for spec in OUTPUTS:
        _add(config.output, _schema_dims(spec))
    config.version_policy.latest.num_versions = VERSIONS_LOADED
    group = config.instance_group.add()
    group.count = serving.instances
    group.kind = serving.instance_kind
    set_ort_threading(config, serving)
    return config


def build_ensemble_config(
    family: str, version: int = 1, precision: str = "", hotness: Sequence[int] | None = None
) -> mc.ModelConfig:
    """The ModelConfig of ``<family>_onnx`` as an ensemble of the stage and the dense model
    (``precision``: ``<family>_onnx_<precision>`` over ``<family>_dense_<precision>``, same stage).

    Its inputs and output are the schema's (``dense_features`` ``-1 x 13``,
    ``categorical_ids`` ``-1 x 26``, ``click_probability`` ``-1 x 1``), so clients
    send the same tensors as to an in-graph model.

    Both steps name ``version`` of their model, never "the latest": a stage's hot
    slots are only meaningful to the dense model built from the same hot set, so a
    new hot set (:mod:`export.tables.rollout`) switches both at once by reloading this
    ensemble with the new version, while the old pair keeps answering.

    Raises:
        ConfigError: a version below 1.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"a model version is an int >= 1, got {version!r}")
    config = mc.ModelConfig(
        name=ensemble_model_name(family, precision), platform=ENSEMBLE_PLATFORM, max_batch_size=0
    )
    for spec in inputs_for(None if hotness is None else tuple(int(count) for count in hotness)):
        _add(config.input, _schema_dims(spec))
    for spec in OUTPUTS:
        _add(config.output, _schema_dims(spec))
    if hotness is not None:  # clients send bags: C1's first, as many ids as this says
        config.parameters[HOTNESS_PARAMETER].string_value = ",".join(str(int(count)) for count in hotness)
    stage = config.ensemble_scheduling.step.add()
    stage.model_name = embedding_model_name(family)
    stage.model_version = version
    stage.input_map[CATEGORICAL_INPUT] = CATEGORICAL_INPUT
    for tensor in (HOT_SLOTS, COLD_POSITIONS, COLD_ROWS):
        stage.output_map[tensor] = tensor
    dense = config.ensemble_scheduling.step.add()
    dense.model_name = dense_model_name(family, precision)
    dense.model_version = version
    for tensor in (DENSE_INPUT, HOT_SLOTS, COLD_POSITIONS, COLD_ROWS):
        dense.input_map[tensor] = tensor
    for spec in OUTPUTS:
        dense.output_map[spec.name] = spec.name
    return config


def store_reference(store_dir: Path, repository: Path, version_folder: Path) -> str:
    """How the stage's config names the store: relative to ``version_folder`` when the
    store lies inside ``repository``, else its absolute path (POSIX form)."""
    store = store_dir.resolve()
    if store.is_relative_to(repository.resolve()):
        return Path(os.path.relpath(store, version_folder.resolve())).as_posix()
    return store.as_posix()


def stage_store_path(
    repository: Path, stage: str, version: int, config: mc.ModelConfig | None = None
) -> Path:
    """The row store that version ``version`` of ``stage`` maps: its config's ``row_store`` parameter,
    resolved from the version folder (see :func:`store_reference`).

    Args:
        config: the stage's config, when the caller has read it already.
    """
    config = config or read_config(repository / stage / CONFIG_NAME)
    raw = config.parameters[PARAM_ROW_STORE].string_value
    return (version_dir(repository, stage, version) / raw).resolve()


def write_embedding_stage(
    repository: Path,
    family: str,
    store_dir: Path,
    hot_set_path: Path,
    table_sizes: Sequence[int] | None = None,
    width: int | None = None,
    *,
    store_path: str | None = None,
    instances: int = 1,
    version: int = 1,
    cold_reads: str = DEFAULT_COLD_READS,
    cold_read_threads: int = DEFAULT_COLD_READ_THREADS,
    hotness: Sequence[int] | None = None,
    name: str = "",
) -> Path:
    """Write ``<family>_embedding``: its version folder (the hot set) and config.

    The store and the hot set are opened here (the store's size and sampled rows
    checked, see :meth:`export.tables.row_store.RowStore.open`), so a mismatch fails at
    export time, not when the server loads the model.

    Args:
        repository: the model repository root.
        family: ``dlrm``, ``wide_deep``, ...
        store_dir: the row store's folder (every row of the 26 tables).
        hot_set_path: the hot set (:meth:`export.tables.hot_rows.HotSet.save`); copied as ``hot_set.npz``.
        table_sizes: expected table sizes (default: the store's); checked against both files.
        width: expected row width ``W`` (default: the store's).
        store_path: the store's path as the server sees it (e.g. ``/row_store`` inside
            the serving container); default: see :func:`store_reference`.
        instances: stage instances.
        version: the model version folder.
        cold_reads: how the stage reads cold rows (see :func:`build_embedding_config`).
        cold_read_threads: threads of the ``threads`` way.
        hotness: a multi-hot model's ids per bag of each table (None: one id each).
        name: the model's name (default: ``<family>_embedding``).

    Returns:
        The config path.

    Raises:
        ExportError: no valid row store at ``store_dir``.
        DataError: no valid hot set at ``hot_set_path``.
        ConfigError: sizes or width that disagree between the arguments, the store and
            the hot set.
    """
    store = RowStore.open(store_dir)
    hot = HotSet.load(hot_set_path)
    sizes = store.spec.table_sizes
    if table_sizes is not None and tuple(int(size) for size in table_sizes) != sizes:
        raise ConfigError(f"row store {store_dir} has table sizes {list(sizes)}, not {list(table_sizes)}")
    if hot.table_sizes != sizes:
        raise ConfigError(
            f"hot set {hot_set_path} was chosen for table sizes {list(hot.table_sizes)}, "
            f"the row store {store_dir} has {list(sizes)}"
        )
    if width is not None and width != store.spec.width:
        raise ConfigError(f"row store {store_dir} has rows of width {store.spec.width}, not {width}")
    name = name or embedding_model_name(family)
    folder = version_dir(repository, name, version)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / HOT_SET_FILE
    if Path(hot_set_path).resolve() != target.resolve():
        shutil.copyfile(hot_set_path, target)
    reference = store_path or store_reference(Path(store_dir), repository, folder)
    fingerprint = str(store.description.get(STORE_FINGERPRINT_KEY, ""))
    config = build_embedding_config(
        name,
        sizes,
        store.spec.width,
        reference,
        HOT_SET_FILE,
        instances,
        fingerprint,
        cold_reads,
        cold_read_threads,
        hotness,
    )
    return write_config(repository / name, config)


def write_dense_config(
    repository: Path, family: str, width: int, serving: ServingConfig, version: int = 1, precision: str = ""
) -> Path:
    """Write the config of ``<family>_dense[_<precision>]`` whose ONNX file is in its version folder.

    Returns:
        The config path.

    Raises:
        ConfigError: the ONNX file is missing, or see :func:`build_dense_config`.
    """
    name = dense_model_name(family, precision)
    onnx_path = version_dir(repository, name, version) / MODEL_FILE
    if not onnx_path.is_file():
        raise ConfigError(f"{onnx_path} is missing: export the dense model before writing its config")
    return write_config(repository / name, build_dense_config(name, width, serving))


def write_ensemble(
    repository: Path, family: str, version: int = 1, precision: str = "", hotness: Sequence[int] | None = None
) -> Path:
    """Write ``<family>_onnx`` (``_<precision>``) as the ensemble of the stage and the dense model
    (``hotness``: a multi-hot model's, see :func:`build_ensemble_config`).

    Whatever the repository held under that name (an in-graph model's ONNX file,
    its report) is removed first: the name now means the ensemble. Triton needs
    the (empty) version folder of an ensemble, so it is created.

    Returns:
        The config path.
    """
    name = ensemble_model_name(family, precision)
    clear_model(repository, name)
    make_ensemble_version(repository, name, version)
    return write_config(repository / name, build_ensemble_config(family, version, precision, hotness))


def write_lookup_graph(graph: Path | str, repository: Path, family: str) -> Path:
    """Keep ``graph``'s lookup graph as ``<family>_dense/lookup_graph.onnx`` (see :data:`LOOKUP_GRAPH_FILE`).

    Triton reads only the numbered version folders and ``config.pbtxt`` of a model
    folder, so the file lies beside them unserved.

    Args:
        graph: the all-in-graph graph the dense model was split from, or the placeholder
            graph of a model built from a row store.
        repository: the model repository root.
        family: ``dlrm``, ``wide_deep``, ...

    Returns:
        The file written.
    """
    path = repository / dense_model_name(family) / LOOKUP_GRAPH_FILE
    save_model(lookup_graph(graph), path)
    return path


def add_hot_cold_models(
    repository: Path,
    family: str,
    store_dir: Path,
    hot_set_path: Path,
    serving: ServingConfig,
    *,
    store_path: str | None = None,
    stage_instances: int = 1,
) -> list[Path]:
    """Write the three entries of a hot/cold model whose dense ONNX file is already written
    (a multi-hot model's bags with ``serving.hotness``).

    Args:
        repository: the model repository root.
        family: ``dlrm``, ``wide_deep``, ...
        store_dir: the row store's folder.
        hot_set_path: the hot set the dense model's hot rows were taken from.
        serving: how Triton serves the dense model (instances, kind, threads).
        store_path: the store's path as the server sees it (see :func:`write_embedding_stage`).
        stage_instances: embedding stage instances.

    Returns:
        The config paths: stage, dense model, ensemble.
    """
    stage = write_embedding_stage(
        repository,
        family,
        store_dir,
        hot_set_path,
        store_path=store_path,
        instances=stage_instances,
        hotness=serving.hotness,
    )
    width = RowStore.open(store_dir).spec.width
    dense = write_dense_config(repository, family, width, serving)
    return [stage, dense, write_ensemble(repository, family, hotness=serving.hotness)]
