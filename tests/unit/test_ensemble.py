"""Hot/cold models without Triton: repository entries (export.tables.ensemble), the stage's numpy core."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import ConfigError, DataError, ExportError
from bundle.repository import MODEL_FILE, ServingConfig, read_config, version_dir
from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    OUTPUT,
)
from export.stage import hot_cold_lookup as stage
from export.stage.hot_cold_lookup import HotColdLookup, RequestError, StageError
from export.tables import row_store
from export.tables.ensemble import (
    HOT_SET_FILE,
    add_hot_cold_models,
    build_dense_config,
    build_embedding_config,
    build_ensemble_config,
    dense_model_name,
    embedding_model_name,
    ensemble_model_name,
    write_dense_config,
    write_embedding_stage,
    write_ensemble,
)
from export.tables.hot_rows import HotSet
from export.tables.row_store import RowStore, RowStoreSpec, write_arrays

WIDTH = 4
#: 26 tables of 2 .. 27 rows.
SIZES = tuple(range(2, 2 + NUM_CATEGORICAL))
INT64 = np.iinfo(np.int64)


def _tables(dtype: str = "float32") -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.normal(0, 1, (size, WIDTH)).astype(dtype) for size in SIZES]


def _hot_set(sizes: tuple[int, ...] = SIZES, seed: int = 2) -> HotSet:
    """About half of each table's ids hot (at least one), in a shuffled order."""
    rng = np.random.default_rng(seed)
    ids = tuple(rng.permutation(size)[: max(1, size // 2)].astype(np.int64) for size in sizes)
    counts = tuple(np.ones(i.size, dtype=np.int64) for i in ids)
    return HotSet(sizes, (WIDTH * 4,) * NUM_CATEGORICAL, 10**6, ids, counts, sum(i.size for i in ids))


def _store(path: Path, dtype: str = "float32") -> RowStore:
    return write_arrays(path, RowStoreSpec.for_dlrm(SIZES, WIDTH, dtype), _tables(dtype))


def _reference(ids: np.ndarray, hot: HotSet, tables: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The contract per lookup, with Python's % and a dict: nothing shared with the stage."""
    slot_of = [{int(i): s + 1 for s, i in enumerate(table)} for table in hot.ids]
    slots = np.zeros(ids.shape, dtype=np.int64)
    positions, rows = [], []
    for b in range(ids.shape[0]):
        for t in range(NUM_CATEGORICAL):
            row = int(ids[b, t]) % SIZES[t]
            slots[b, t] = slot_of[t].get(row, 0)
            if not slots[b, t]:
                positions.append(b * NUM_CATEGORICAL + t)
                rows.append(tables[t][row].astype(np.float32))
    return slots, np.array(positions, dtype=np.int64), np.array(rows, dtype=np.float32).reshape(-1, WIDTH)


@pytest.fixture
def store_and_hot_set(tmp_path: Path) -> tuple[Path, Path]:
    _store(tmp_path / "rows")
    return tmp_path / "rows", _hot_set().save(tmp_path / "hot.npz")


# ------------------------------------------------------------------ configs


def test_model_names() -> None:
    assert embedding_model_name("dlrm") == "dlrm_embedding"
    assert dense_model_name("wide_deep") == "wide_deep_dense"
    assert ensemble_model_name("dlrm") == "dlrm_onnx"
    with pytest.raises(ConfigError):
        ensemble_model_name("../x")


def _tensors(entries: object) -> list[tuple[str, int, list[int]]]:
    return [(t.name, t.data_type, list(t.dims)) for t in entries]  # type: ignore[attr-defined]


def test_the_three_configs_are_written_and_read_back(
    tmp_path: Path, store_and_hot_set: tuple[Path, Path]
) -> None:
    store_dir, hot_path = store_and_hot_set
    repository = tmp_path / "repository"
    stage_config = write_embedding_stage(repository, "dlrm", store_dir, hot_path, SIZES, WIDTH, instances=2)
    dense_folder = version_dir(repository, "dlrm_dense")
    dense_folder.mkdir(parents=True)
    (dense_folder / MODEL_FILE).write_bytes(b"written by export.tables.hot_cold_graph")
    dense_config = write_dense_config(repository, "dlrm", WIDTH, ServingConfig(intra_op_threads=2))
    ensemble_config = write_ensemble(repository, "dlrm")

    embedding = read_config(stage_config)
    fingerprint = json.loads((store_dir / "store.json").read_text())["fingerprint"]
    assert embedding == build_embedding_config(
        "dlrm_embedding", SIZES, WIDTH, str(store_dir.resolve()), instances=2, store_fingerprint=fingerprint
    )
    assert (embedding.backend, embedding.max_batch_size) == ("embedding", 0)
    assert _tensors(embedding.input) == [(CATEGORICAL_INPUT, mc.TYPE_INT64, [-1, 26])]
    assert _tensors(embedding.output) == [
        (HOT_SLOTS, mc.TYPE_INT64, [-1, 26]),
        (COLD_POSITIONS, mc.TYPE_INT64, [-1]),
        (COLD_ROWS, mc.TYPE_FP32, [-1, WIDTH]),
    ]
    assert [(g.kind, g.count) for g in embedding.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 2)]
    parameters = {key: value.string_value for key, value in embedding.parameters.items()}
    assert parameters == {
        stage.PARAM_ROW_STORE: store_dir.resolve().as_posix(),
        stage.PARAM_HOT_SET: HOT_SET_FILE,
        stage.PARAM_TABLE_SIZES: ",".join(map(str, SIZES)),
        stage.PARAM_ROW_STORE_FINGERPRINT: fingerprint,  # the stage refuses another store under that path
        stage.PARAM_COLD_READS: stage.DEFAULT_COLD_READS,  # written out: the knob is in the config
    }

    dense = read_config(dense_config)
    assert (dense.backend, dense.max_batch_size, dense.default_model_filename) == (
        "onnxruntime",
        0,
        MODEL_FILE,
    )
    assert _tensors(dense.input) == [
        (DENSE_INPUT, mc.TYPE_FP32, [-1, 13]),
        (HOT_SLOTS, mc.TYPE_INT64, [-1, 26]),
        (COLD_POSITIONS, mc.TYPE_INT64, [-1]),
        (COLD_ROWS, mc.TYPE_FP32, [-1, WIDTH]),
    ]
    assert _tensors(dense.output) == [(OUTPUT, mc.TYPE_FP32, [-1, 1])]
    assert dense.parameters["intra_op_thread_count"].string_value == "2"
    assert not dense.HasField("dynamic_batching")

    ensemble = read_config(ensemble_config)
    assert ensemble == build_ensemble_config("dlrm")
    assert (ensemble.name, ensemble.platform, ensemble.max_batch_size) == ("dlrm_onnx", "ensemble", 0)
    assert _tensors(ensemble.input) == [
        (DENSE_INPUT, mc.TYPE_FP32, [-1, 13]),
        (CATEGORICAL_INPUT, mc.TYPE_INT64, [-1, 26]),
    ]
    assert _tensors(ensemble.output) == [(OUTPUT, mc.TYPE_FP32, [-1, 1])]
    first, second = ensemble.ensemble_scheduling.step
    assert (first.model_name, first.model_version) == ("dlrm_embedding", 1)
    assert dict(first.input_map) == {CATEGORICAL_INPUT: CATEGORICAL_INPUT}
    assert dict(first.output_map) == {name: name for name in (HOT_SLOTS, COLD_POSITIONS, COLD_ROWS)}
    assert second.model_name == "dlrm_dense"
    assert dict(second.input_map) == {
        name: name for name in (DENSE_INPUT, HOT_SLOTS, COLD_POSITIONS, COLD_ROWS)
    }
    assert dict(second.output_map) == {OUTPUT: OUTPUT}
    assert version_dir(repository, "dlrm_onnx").is_dir()


def test_add_hot_cold_models_writes_all_three(tmp_path: Path, store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    repository = tmp_path / "repository"
    dense_folder = version_dir(repository, "wide_deep_dense")
    dense_folder.mkdir(parents=True)
    (dense_folder / MODEL_FILE).write_bytes(b"written by export.tables.hot_cold_graph")
    paths = add_hot_cold_models(repository, "wide_deep", store_dir, hot_path, ServingConfig())
    names = [read_config(path).name for path in paths]
    assert names == ["wide_deep_embedding", "wide_deep_dense", "wide_deep_onnx"]
    assert _tensors(read_config(paths[1]).input)[3] == (COLD_ROWS, mc.TYPE_FP32, [-1, WIDTH])


def test_the_stage_version_folder(tmp_path: Path, store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    repository = tmp_path / "repository"
    write_embedding_stage(repository, "dlrm", store_dir, hot_path)
    folder = version_dir(repository, "dlrm_embedding")
    # The compiled stage: its code is the backend's library, the folder holds the hot set alone.
    assert [p.name for p in folder.iterdir()] == [HOT_SET_FILE]
    copied = HotSet.load(folder / HOT_SET_FILE)
    for ours, theirs in zip(copied.ids, _hot_set().ids, strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_the_store_path_in_the_config(tmp_path: Path, store_and_hot_set: tuple[Path, Path]) -> None:
    _, hot_path = store_and_hot_set
    repository = tmp_path / "repository"
    inside = _store(repository / "dlrm_embedding" / "rows").path
    config = read_config(write_embedding_stage(repository, "dlrm", inside, hot_path))
    # Relative to the version folder, so the repository can move or be mounted elsewhere.
    assert config.parameters[stage.PARAM_ROW_STORE].string_value == "../rows"
    config = read_config(write_embedding_stage(repository, "dlrm", inside, hot_path, store_path="/row_store"))
    assert config.parameters[stage.PARAM_ROW_STORE].string_value == "/row_store"


def test_the_stage_refuses_what_does_not_fit(tmp_path: Path, store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    repository = tmp_path / "repository"
    with pytest.raises(ConfigError, match="table sizes"):
        write_embedding_stage(repository, "dlrm", store_dir, hot_path, table_sizes=(3,) * 26)
    with pytest.raises(ConfigError, match="width 4, not 8"):
        write_embedding_stage(repository, "dlrm", store_dir, hot_path, width=8)
    other = _hot_set(tuple(size + 1 for size in SIZES)).save(tmp_path / "other.npz")
    with pytest.raises(ConfigError, match="hot set"):
        write_embedding_stage(repository, "dlrm", store_dir, other)
    with pytest.raises(ExportError):
        write_embedding_stage(repository, "dlrm", tmp_path / "missing", hot_path)
    with pytest.raises(DataError):
        write_embedding_stage(repository, "dlrm", store_dir, tmp_path / "missing.npz")


def test_a_multi_hot_stage_takes_bags(tmp_path: Path, store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    hotness = tuple(1 + t % 3 for t in range(NUM_CATEGORICAL))
    width = sum(hotness)
    config = read_config(
        write_embedding_stage(tmp_path / "repository", "dlrm", store_dir, hot_path, hotness=hotness)
    )
    assert _tensors(config.input) == [(CATEGORICAL_INPUT, mc.TYPE_INT64, [-1, width])]
    assert _tensors(config.output)[0] == (HOT_SLOTS, mc.TYPE_INT64, [-1, width])
    assert config.parameters[stage.PARAM_HOTNESS].string_value == ",".join(map(str, hotness))
    # One id per table writes no hotness: the stage's configs stay as they were.
    assert stage.PARAM_HOTNESS not in build_embedding_config("s", SIZES, WIDTH, "rows").parameters
    for wrong in ((2,) * 25, (0,) * 26):
        with pytest.raises(ConfigError, match="hotness must be 26 counts >= 1"):
            build_embedding_config("s", SIZES, WIDTH, "rows", hotness=wrong)


def test_the_dense_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        write_dense_config(tmp_path, "dlrm", WIDTH, ServingConfig())
    gpu = build_dense_config("dlrm_dense", WIDTH, ServingConfig(profile="gpu", instances=3))
    assert [(g.kind, g.count) for g in gpu.instance_group] == [(mc.ModelInstanceGroup.KIND_GPU, 3)]
    with pytest.raises(ConfigError, match="TensorRT"):
        build_dense_config("dlrm_dense", WIDTH, ServingConfig(profile="gpu", ort_trt=True))
    with pytest.raises(ConfigError, match="width"):
        build_dense_config("dlrm_dense", 0, ServingConfig())


def test_the_ensemble_replaces_an_in_graph_model(tmp_path: Path) -> None:
    old = version_dir(tmp_path, "dlrm_onnx")
    old.mkdir(parents=True)
    (old / MODEL_FILE).write_bytes(b"in-graph model")
    (tmp_path / "dlrm_onnx" / "export_report.json").write_text("{}")
    write_ensemble(tmp_path, "dlrm")
    # The version folder holds only the file that keeps it in object storage (no model file).
    names = sorted(p.name for p in (tmp_path / "dlrm_onnx").rglob("*"))
    assert names == ["1", "config.pbtxt", "ensemble.txt"]


# -------------------------------------------------------------- stage core


def test_the_stage_places_lookups_as_the_contract_says(store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    lookup = HotColdLookup.open(store_dir, hot_path, SIZES)
    rng = np.random.default_rng(3)
    ids = rng.integers(-100, 100, (16, NUM_CATEGORICAL))
    ids[0, :4] = [INT64.min, INT64.max, -1, 0]
    ids[1] = rng.integers(INT64.min, INT64.max, NUM_CATEGORICAL, endpoint=True)
    placement = lookup.place(lookup.check_ids(ids, CATEGORICAL_INPUT))
    slots, positions, rows = _reference(ids, _hot_set(), _tables())
    np.testing.assert_array_equal(placement.hot_slots, slots)
    np.testing.assert_array_equal(placement.cold_positions, positions)
    np.testing.assert_array_equal(placement.cold_rows, rows)
    assert placement.hot_slots.dtype == placement.cold_positions.dtype == np.int64
    assert placement.cold_rows.dtype == np.float32 and placement.cold_rows.flags.c_contiguous
    assert np.all(np.diff(placement.cold_positions) > 0)
    assert placement.hot_lookups + placement.cold_lookups == ids.size
    assert 0 < placement.cold_lookups < ids.size


def test_all_hot_and_all_cold(store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    hot = _hot_set()
    lookup = HotColdLookup.open(store_dir, hot_path, SIZES)
    # The hottest id of each table, one table length below zero: still hot.
    all_hot = np.array([[ids[0] - size for ids, size in zip(hot.ids, SIZES, strict=True)]] * 3)
    placement = lookup.place(all_hot)
    np.testing.assert_array_equal(placement.hot_slots, np.ones_like(all_hot))
    assert placement.cold_positions.shape == (0,)
    assert placement.cold_rows.shape == (0, WIDTH) and placement.cold_rows.dtype == np.float32
    no_hot_ids = [np.zeros(0, dtype=np.int64)] * NUM_CATEGORICAL
    nothing_hot = HotColdLookup(SIZES, no_hot_ids, stage.open_store(store_dir).data)
    placement = nothing_hot.place(all_hot)
    assert not placement.hot_slots.any()
    np.testing.assert_array_equal(placement.cold_positions, np.arange(all_hot.size))


def test_an_fp16_store_is_cast_to_fp32(tmp_path: Path) -> None:
    store = _store(tmp_path / "rows", "float16")
    hot_path = _hot_set().save(tmp_path / "hot.npz")
    lookup = HotColdLookup.open(store.path, hot_path, SIZES)
    ids = np.random.default_rng(4).integers(0, 1000, (5, NUM_CATEGORICAL))
    placement = lookup.place(ids)
    assert placement.cold_rows.dtype == np.float32
    np.testing.assert_array_equal(placement.cold_rows, _reference(ids, _hot_set(), _tables("float16"))[2])


def test_requests_the_stage_refuses(store_and_hot_set: tuple[Path, Path]) -> None:
    lookup = HotColdLookup.open(*store_and_hot_set, SIZES)
    good = np.zeros((2, NUM_CATEGORICAL), dtype=np.int64)
    cases = [
        (good.astype(np.int32), "data type int32"),
        (good[:, :-1], r"shape \[2, 25\], expected \[-1, 26\]"),
        (good[0], r"shape \[26\]"),
        (good[:0], "empty batch"),
    ]
    for ids, message in cases:
        with pytest.raises(RequestError, match=message) as caught:
            lookup.check_ids(ids, CATEGORICAL_INPUT)
        assert CATEGORICAL_INPUT in str(caught.value) and caught.value.invalid_argument


def test_the_stage_reads_the_files_export_writes(
    tmp_path: Path, store_and_hot_set: tuple[Path, Path]
) -> None:
    """The stage's own readers of the row store and the hot set agree with export's."""
    store_dir, hot_path = store_and_hot_set
    assert (stage.STORE_ROWS_FILE, stage.STORE_META_FILE) == (row_store.ROWS_FILE, row_store.META_FILE)
    assert (stage.STORE_FORMAT, stage.STORE_FORMAT_VERSION) == (row_store.FORMAT, row_store.FORMAT_VERSION)
    ours, theirs = stage.open_store(store_dir), RowStore.open(store_dir)
    assert ours.table_sizes == theirs.spec.table_sizes and ours.width == theirs.spec.width
    np.testing.assert_array_equal(ours.offsets, theirs.spec.offsets)
    np.testing.assert_array_equal(ours.data, theirs.data)
    sizes, ids = stage.read_hot_ids(hot_path, NUM_CATEGORICAL)
    assert sizes == SIZES
    for got, want in zip(ids, HotSet.load(hot_path).ids, strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_stage_refuses_bad_files(tmp_path: Path, store_and_hot_set: tuple[Path, Path]) -> None:
    store_dir, hot_path = store_and_hot_set
    with pytest.raises(StageError, match="row store"):
        HotColdLookup.open(store_dir, hot_path, (3,) * NUM_CATEGORICAL)
    with pytest.raises(StageError, match="no row store"):
        stage.open_store(tmp_path / "missing")
    with pytest.raises(StageError, match="no hot-set file"):
        stage.read_hot_ids(tmp_path / "missing.npz", NUM_CATEGORICAL)
    with pytest.raises(StageError, match="not a hot-set file"):
        stage.read_hot_ids(store_dir / row_store.ROWS_FILE, NUM_CATEGORICAL)
    rows = store_dir / row_store.ROWS_FILE
    rows.write_bytes(rows.read_bytes()[:-1])
    with pytest.raises(StageError, match="truncated"):
        stage.open_store(store_dir)


def test_the_slot_map_and_the_sorted_search_place_alike(
    store_and_hot_set: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tables whose slot map would pass SLOT_MAP_MAX_BYTES are placed by searchsorted instead:
    both give the same slots, positions and rows, in- and out-of-range ids alike."""
    store_dir, hot_path = store_and_hot_set
    rng = np.random.default_rng(11)
    ids = rng.integers(-(2**62), 2**62, (64, NUM_CATEGORICAL))
    ids[:32] = rng.integers(0, 40, (32, NUM_CATEGORICAL))  # small ids: many hot
    mapped = HotColdLookup.open(store_dir, hot_path, SIZES)
    assert mapped._slot_map is not None
    monkeypatch.setattr(stage, "SLOT_MAP_MAX_BYTES", 0)
    searched = HotColdLookup.open(store_dir, hot_path, SIZES)
    assert searched._slot_map is None
    a, b = mapped.place(ids), searched.place(ids)
    assert 0 < a.hot_lookups < ids.size
    np.testing.assert_array_equal(a.hot_slots, b.hot_slots)
    np.testing.assert_array_equal(a.cold_positions, b.cold_positions)
    np.testing.assert_array_equal(a.cold_rows, b.cold_rows)
