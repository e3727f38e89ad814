"""export.tables.synthetic_model: an untrained DLRM of real table sizes (placeholder graph, random store).

Tiny sizes (26 tables of 50..500 rows, D = 4, tiny MLPs). Beyond the function's own
check (torch layers on store rows), the served pair is compared through ONNX Runtime
with an all-in-graph graph of the real sizes built independently here: ``dlrm_small``'s
graph with its placeholder table swapped for the store's rows and its ``Mod`` and
offsets for the real sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from bundle.errors import BundleError, ConfigError, ExportError
from bundle.repository import CONFIG_NAME, MODEL_FILE, read_config
from bundle.schema import (
    CATEGORICAL_INPUT,
    COLD_POSITIONS,
    COLD_ROWS,
    DENSE_INPUT,
    HOT_SLOTS,
    NUM_CATEGORICAL,
    OUTPUT,
)
from criteo.profile import AccessProfile, profile_file
from criteo.synth import SynthConfig, write_tsv
from criteo.tables import table_offsets
from criteo.tsv import read_batch
from export.framework import small_table_sizes
from export.tables import synthetic_model, synthetic_model_cli
from export.tables.ensemble import HOT_SET_FILE
from export.tables.hot_cold_graph import PREFIX, split_lookups, stage_reference
from export.tables.hot_rows import HotSet
from export.tables.lookups import find_lookups
from export.tables.row_store import ROWS_FILE, RowStore, RowStoreSpec, random_rows, random_store
from export.tables.synthetic_model import (
    CHECK_CASES,
    SMALL_MODEL,
    TOLERANCES,
    check_batches,
    check_dense,
    make_random_hot_cold_dlrm,
)
from models.config import DLRMConfig

SIZES = tuple(50 + 18 * t for t in range(NUM_CATEGORICAL))
DIM = 4
CONFIG = DLRMConfig(SIZES, DIM, (8, DIM), (16, 1))
#: Placeholder tables of at most 64 rows: smaller than most real tables, so the split must use the store.
SMALL_ROWS = 64
#: About a third of the FP32 table bytes: both tiers are used.
BUDGET = sum(SIZES) * DIM * 4 // 3
ENTRIES = ("dlrm_onnx", "dlrm_embedding", "dlrm_dense", SMALL_MODEL)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("data")
    files = {"train": folder / "train.tsv", "heldout": folder / "heldout.tsv"}
    for seed, path in enumerate(files.values()):
        write_tsv(SynthConfig(rows=3000, seed=seed, vocabulary=SIZES, max_vocabulary=1000), path)
    return files


@pytest.fixture(scope="module")
def profile(data: dict[str, Path]) -> AccessProfile:
    return profile_file(data["train"], SIZES)


def _make(
    tmp_path: Path, profile: AccessProfile, dtype: str = "float32", **kwargs
) -> synthetic_model.RandomDLRM:
    return make_random_hot_cold_dlrm(
        tmp_path / "repo",
        CONFIG,
        kwargs.pop("store_dir", tmp_path / "store"),
        dtype,
        kwargs.pop("budget", BUDGET),
        profile,
        seed=kwargs.pop("seed", 3),
        small_rows=SMALL_ROWS,
        **kwargs,
    )


def real_size_graph(small_path: Path, store: RowStore) -> onnx.ModelProto:
    """``dlrm_small``'s graph with the store's rows as its table and the real sizes in its Mod and offsets."""
    model = onnx.load(str(small_path))
    producers = {out: node for node in model.graph.node for out in node.output}
    (mod,) = [node for node in model.graph.node if node.op_type == "Mod"]
    (add,) = [node for node in model.graph.node if node.op_type == "Add" and node.input[0] == mod.output[0]]
    replacements = {mod.input[1]: SIZES, add.input[1]: table_offsets(SIZES)}
    for name, values in replacements.items():
        constant = producers[name]
        assert constant.op_type == "Constant"
        del constant.attribute[:]
        constant.attribute.append(
            onnx.helper.make_attribute("value", numpy_helper.from_array(np.array([values], dtype=np.int64)))
        )
    (lookup,) = find_lookups(model)
    table = next(t for t in model.graph.initializer if t.name == lookup.table)
    table.CopyFrom(numpy_helper.from_array(np.asarray(store.data, dtype=np.float32), lookup.table))
    return model


def served_pair(repository: Path, hot: HotSet, store: RowStore, ids: np.ndarray) -> np.ndarray:
    """The ensemble's two steps in-process: the stage reference, then the dense ONNX model."""
    session = ort.InferenceSession(str(repository / "dlrm_dense" / "1" / MODEL_FILE))
    slots, positions, rows = stage_reference(ids, hot, SIZES, store)
    feeds = {DENSE_INPUT: check_dense(len(ids)), HOT_SLOTS: slots, COLD_POSITIONS: positions, COLD_ROWS: rows}
    return session.run([OUTPUT], feeds)[0]


def test_fp32_store_answers_as_the_real_size_model(
    tmp_path: Path, profile: AccessProfile, data: dict[str, Path]
) -> None:
    result = _make(tmp_path, profile, heldout_data=data["heldout"])
    repository = tmp_path / "repo"
    store = RowStore.open(tmp_path / "store")
    hot = HotSet.load(repository / "dlrm_embedding" / "1" / HOT_SET_FILE)

    # The store holds the real sizes, random_rows' values; the hot rows use both tiers.
    assert store.spec == RowStoreSpec.for_dlrm(SIZES, DIM, "float32") and result.store_written
    for t in (0, 13, 25):
        np.testing.assert_array_equal(store.table(t), random_rows(store.spec, t, 0, SIZES[t], seed=3))
    assert 0 < hot.rows < sum(SIZES) and hot.bytes_used <= BUDGET and hot.row_bytes == (DIM * 4,) * 26
    assert 0 < hot.expected_hit_rate < 1 and result.heldout_hit_rate is not None
    assert result.heldout_hit_rate == pytest.approx(hot.hit_rate(read_batch(data["heldout"])), abs=1e-12)

    # Its own check: every case within 1e-6, hot and cold batches as named.
    assert set(result.checks) == set(CHECK_CASES) and result.max_abs_diff <= TOLERANCES["float32"]
    assert result.checks["hot"].hot_share == 1.0 and result.checks["cold"].hot_share == 0.0
    assert 0.0 < result.checks["mixed"].hot_share < 1.0

    # Independently, through ONNX Runtime: the all-in-graph graph of the real sizes.
    small_path = repository / SMALL_MODEL / "1" / MODEL_FILE
    whole = ort.InferenceSession(real_size_graph(small_path, store).SerializeToString())
    cases = check_batches(hot, rows=32, seed=11)
    rng = np.random.default_rng(5)
    cases["raw_32_bit"] = rng.integers(0, 2**32, (32, NUM_CATEGORICAL), dtype=np.int64)
    cases["batch_1"] = cases["mixed"][:1]
    for name, ids in cases.items():
        want = whole.run([OUTPUT], {DENSE_INPUT: check_dense(len(ids)), CATEGORICAL_INPUT: ids})[0]
        got = served_pair(repository, hot, store, ids)
        assert got.shape == want.shape == (len(ids), 1)
        assert float(np.abs(got - want).max()) <= 1e-6, name

    # The repository: four configs that parse back; dlrm_small keeps its small tables and Mod.
    names = {read_config(path).name for path in result.configs}
    assert names == set(ENTRIES)
    ensemble = read_config(repository / "dlrm_onnx" / CONFIG_NAME)
    assert [step.model_name for step in ensemble.ensemble_scheduling.step] == ["dlrm_embedding", "dlrm_dense"]
    (small_lookup,) = find_lookups(onnx.load(str(small_path)))
    assert small_lookup.divisors == small_table_sizes(SIZES, SMALL_ROWS) == tuple(min(s, 64) for s in SIZES)
    dense = onnx.load(str(repository / "dlrm_dense" / "1" / MODEL_FILE))
    (hot_table,) = [
        t for t in dense.graph.initializer if t.name.startswith(PREFIX) and t.name.endswith("/hot")
    ]
    assert hot_table.dims[0] == hot.rows + 1
    assert not any(node.op_type == "Mod" for node in dense.graph.node)
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["row_store"]["bytes"] == sum(SIZES) * DIM * 4
    assert report["hot_rows"]["rows"] == hot.rows and report["exactness"]["max_abs_diff"] <= 1e-6
    assert report["source"]["seed"] == 3
    steps = report["memory"]["per_step"]
    assert set(steps) == set(report["seconds"])  # every step's peak memory, by kind
    assert all(m.get("anon_bytes", 1) > 0 for m in steps.values())


def test_fp16_store_within_its_tolerance_and_reused(tmp_path: Path, profile: AccessProfile) -> None:
    first = _make(tmp_path, profile, "float16")
    assert first.store_written and first.store.spec.dtype == "float16"
    assert first.max_abs_diff <= TOLERANCES["float16"]
    rows_file = tmp_path / "store" / ROWS_FILE
    stamp = rows_file.stat().st_mtime_ns

    again = _make(tmp_path, profile, "float16", budget=BUDGET // 2)
    assert not again.store_written and rows_file.stat().st_mtime_ns == stamp
    assert again.hot.rows < first.hot.rows and again.max_abs_diff <= TOLERANCES["float16"]

    other_seed = _make(tmp_path, profile, "float16", seed=4)
    assert other_seed.store_written and other_seed.store.description["metadata"]["seed"] == 4


def test_refusals_leave_nothing_behind(tmp_path: Path, profile: AccessProfile) -> None:
    repository = tmp_path / "repo"
    with pytest.raises(ConfigError, match=r"inside .*dlrm_embedding.*rewritten"):
        _make(tmp_path, profile, store_dir=repository / "dlrm_embedding" / "rows")
    with pytest.raises(ConfigError, match="dtype must be float32 or float16"):
        _make(tmp_path, profile, "bfloat16")
    with pytest.raises(ConfigError, match="hot budget"):
        _make(tmp_path, profile, budget=-1)
    with pytest.raises(ConfigError, match="other table sizes"):
        _make(tmp_path, profile_file_reduced(profile))
    with pytest.raises(ConfigError, match="at least 2 rows"):
        small_table_sizes(SIZES, 1)
    assert not (tmp_path / "store").exists() and not repository.exists()


def profile_file_reduced(profile: AccessProfile) -> AccessProfile:
    """``profile`` as if counted into other table sizes."""
    return AccessProfile(profile.tables, profile.rows, tuple(s + 1 for s in SIZES))


def test_a_failed_check_is_one_line_and_clears_the_models(
    tmp_path: Path, profile: AccessProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(synthetic_model.TOLERANCES, "float32", -1.0)
    with pytest.raises(ExportError) as error:
        _make(tmp_path, profile)
    message = str(error.value)
    assert "\n" not in message and "differs from the store reference on hot ids" in message
    assert not any((tmp_path / "repo" / name).exists() for name in ENTRIES)
    assert RowStore.open(tmp_path / "store").spec.table_sizes == SIZES  # the store stays, to be reused


def test_split_lookups_checks_the_store_it_reads(tmp_path: Path, profile: AccessProfile) -> None:
    result = _make(tmp_path, profile)
    small_path = tmp_path / "repo" / SMALL_MODEL / "1" / MODEL_FILE
    # Without a store, the graph's own (placeholder) sizes must be the table sizes.
    with pytest.raises(ExportError, match="reduces C2 into 64 rows, table_sizes says 68"):
        split_lookups(small_path, result.hot, SIZES)
    other = random_store(tmp_path / "other", RowStoreSpec.for_dlrm(tuple(s + 1 for s in SIZES), DIM))
    with pytest.raises(ConfigError, match="holds tables of"):
        split_lookups(small_path, result.hot, SIZES, rows=other)
    wide = random_store(tmp_path / "wide", RowStoreSpec.for_wide_deep(SIZES, DIM))
    with pytest.raises(ExportError, match="the graph's lookups need"):
        split_lookups(small_path, result.hot, SIZES, rows=wide)


def test_cli(tmp_path: Path, data: dict[str, Path]) -> None:
    profile_dir = tmp_path / "profile"
    profile_file(data["train"], SIZES).save(profile_dir)
    sizes = ",".join(map(str, SIZES))
    common = [
        "synthetic-hot-cold", "--preset", "tiny", "--table-sizes", sizes,
        "--repository", str(tmp_path / "repo"), "--store-dir", str(tmp_path / "store"),
        "--hot-budget", "8K", "--small-rows", "100",
    ]  # fmt: skip
    runner = CliRunner()
    done = runner.invoke(
        synthetic_model_cli.app,
        [*common, "--profile-data", str(profile_dir), "--heldout-data", str(data["heldout"])],
    )
    assert done.exit_code == 0, done.output
    assert "row store: wrote" in done.output and "float16" in done.output
    assert "held-out hit rate" in done.output and "tolerance 0.001" in done.output
    config = read_config(tmp_path / "repo" / SMALL_MODEL / CONFIG_NAME)
    assert config.name == SMALL_MODEL

    done = runner.invoke(synthetic_model_cli.app, [*common, "--profile-data", str(data["train"])])
    assert done.exit_code == 0, done.output
    assert "row store: reused" in done.output and "hot rows: " in done.output

    done = runner.invoke(synthetic_model_cli.app, [*common[:-4], "--hot-budget", "8Q", "--profile-data", "x"])
    assert isinstance(done.exception, BundleError) and "a size must be" in str(done.exception)


#: 1 to 3 ids per bag: 52 ids a row.
HOTNESS = tuple(1 + t % 3 for t in range(NUM_CATEGORICAL))


def test_a_multi_hot_model_takes_bags_hot_and_cold(tmp_path: Path) -> None:
    """Bags of fixed sizes: the profile and the held-out hit rate count every id of every bag, the
    stage and the dense model take ``B x H`` ids, and the check sums each bag's store rows."""
    files = {name: tmp_path / f"{name}.tsv" for name in ("train", "heldout")}
    for seed, path in enumerate(files.values()):
        write_tsv(
            SynthConfig(rows=2000, seed=seed, vocabulary=SIZES, max_vocabulary=1000, bags=HOTNESS), path
        )
    width = sum(HOTNESS)
    done = CliRunner().invoke(
        synthetic_model_cli.app,
        [
            "synthetic-hot-cold", "--preset", "tiny", "--table-sizes", ",".join(map(str, SIZES)),
            "--repository", str(tmp_path / "repo"), "--store-dir", str(tmp_path / "store"),
            "--hot-budget", "8K", "--small-rows", "100", "--store-dtype", "float32",
            "--hotness", ",".join(map(str, HOTNESS)),
            "--profile-data", str(files["train"]), "--heldout-data", str(files["heldout"]),
        ],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    report = json.loads((tmp_path / "repo" / "dlrm_onnx" / "export_report.json").read_text())
    text = json.dumps(report)
    assert "heldout_hit_rate" in text
    for name in ("dlrm_onnx", "dlrm_embedding", "dlrm_dense", SMALL_MODEL):
        assert f"dims: {width}" in (tmp_path / "repo" / name / CONFIG_NAME).read_text(), name
    # The pair in-process against the store's rows summed per bag, on each case of the check.
    store = RowStore.open(tmp_path / "store")
    hot = HotSet.load(tmp_path / "repo" / "dlrm_embedding" / "1" / HOT_SET_FILE)
    dense_path = tmp_path / "repo" / "dlrm_dense" / "1" / MODEL_FILE
    session = ort.InferenceSession(str(dense_path), providers=["CPUExecutionProvider"])
    for name, ids in check_batches(hot, 64, seed=1, hotness=HOTNESS).items():
        assert ids.shape == (64, width), name
        slots, positions, rows = stage_reference(ids, hot, SIZES, store, HOTNESS)
        dense = check_dense(64, seed=1)
        feeds = {DENSE_INPUT: dense, HOT_SLOTS: slots, COLD_POSITIONS: positions, COLD_ROWS: rows}
        (got,) = session.run([OUTPUT], feeds)
        assert got.shape == (64, 1) and np.all(np.isfinite(got)), name
    hits = synthetic_model.heldout_hit_rate(hot, files["heldout"], hotness=HOTNESS)
    assert 0.0 < hits < 1.0
