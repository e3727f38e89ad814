"""export.tables.placement: the placement options, the auto decision, export_family's hot/cold path.

The options and decisions need no model. The export cases run the bundle's tiny
DLRM (untrained, a different size per table) through :func:`export_family`: an
FP32 store (exact against the all-in-graph graph), an FP16 store (the AUC gate),
auto keeping the tables in the graph, and the failures (unknown table sizes, a
check that fails) that must leave none of the family's entries behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bundle.errors import ConfigError, ExportError
from bundle.repository import ServingConfig, read_config, write_report
from bundle.schema import NUM_CATEGORICAL
from criteo.synth import SynthConfig, write_tsv
from export.__main__ import _export_options, app
from export.options import NO_PROFILE_DATA, PLACEMENTS, ExportOptions, PlacementOptions, current_placement
from export.pipeline import export_family
from export.tables import placement as placement_module
from export.tables.hot_rows import HotSet
from export.tables.placement import FP32_STORE_TOLERANCE, decide
from export.tables.rollout import _read_report
from export.tables.row_store import RowStore

#: A different size per table; DLRM tiny rows are 8 float32 values (32 bytes).
SIZES = tuple(30 + 11 * t for t in range(NUM_CATEGORICAL))
ROW_BYTES = 32
TABLE_BYTES = sum(SIZES) * ROW_BYTES
#: Most rows cold: 64 hot rows of about 4,300.
BUDGET = 64 * ROW_BYTES


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "rows.tsv"
    write_tsv(SynthConfig(rows=1500, seed=5), path)
    return path


# --- options ----------------------------------------------------------------------------------------


def test_defaults_keep_the_tables_in_the_graph() -> None:
    options = PlacementOptions()
    assert (options.mode, options.hot_budget, options.store_dtype) == ("auto", None, "float32")
    assert not options.may_split
    assert not decide(options, None).hot_cold


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "sharded"}, "--embeddings must be auto, in-graph, hot-cold"),
        ({"hot_budget": 10, "store_dtype": "bfloat16"}, "--store-dtype must be float32 or float16 or int8"),
        ({"hot_budget": -1}, "--hot-budget must be a byte count >= 0"),
        ({"hot_budget": True}, "--hot-budget must be a byte count >= 0"),
        ({"mode": "hot-cold"}, "--embeddings hot-cold needs --hot-budget SIZE"),
        ({"mode": "in-graph", "hot_budget": 10}, "--embeddings in-graph keeps them all"),
        ({"store_dtype": "float16"}, "give --hot-budget too"),
        ({"profile_data": Path("rows.tsv")}, "give --hot-budget too"),
        ({"hot_budget": 10, "profile_data": Path("/nonexistent/rows.tsv")}, "does not exist"),
        ({"hot_budget": 10, "stage_instances": 0}, "--stage-instances must be an int >= 1"),
        ({"stage_instances": 2}, "give --hot-budget too"),
    ],
)
def test_bad_options_fail_where_they_are_set(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PlacementOptions(**fields)


def test_profile_data_defaults_to_calibration_then_check_data(tmp_path: Path, data: Path) -> None:
    other = tmp_path / "calibration.tsv"
    other.write_text(data.read_text())
    given = PlacementOptions(hot_budget=1, profile_data=data)
    assert given.profile_source(other, other) == (data, "--profile-data")
    budget = PlacementOptions(hot_budget=1)
    assert budget.profile_source(other, data) == (other, "--calibration-data")
    assert budget.profile_source(None, data) == (data, "--check-data")
    assert budget.profile_source(None, None) is None
    with pytest.raises(ConfigError) as raised:
        ExportOptions(repository=tmp_path, placement=budget)
    assert str(raised.value) == NO_PROFILE_DATA
    assert ExportOptions(repository=tmp_path, check_data=data, placement=budget).placement == budget
    with pytest.raises(ConfigError, match="--ort-trt"):
        ExportOptions(
            repository=tmp_path,
            serving=ServingConfig(profile="gpu", ort_trt=True),
            check_data=data,
            placement=PlacementOptions("hot-cold", hot_budget=1),
        )


def test_cli_options_build_the_placement(data: Path, tmp_path: Path) -> None:
    options, _ = _export_options(
        repository=tmp_path, check_data=data, hot_budget="512M", store_dtype="float16"
    )
    assert options.placement == PlacementOptions("auto", 512 * 2**20, None, "float16")
    default, _ = _export_options(repository=tmp_path)
    assert default.placement == PlacementOptions()
    with pytest.raises(ConfigError, match="a size must be an integer of bytes"):
        _export_options(repository=tmp_path, check_data=data, hot_budget="1.5G")


def test_a_missing_profile_is_one_error_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "export", "dlrm", "--checkpoint", str(tmp_path), "--hot-budget", "1M"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {NO_PROFILE_DATA}"]


def test_the_former_name_of_hot_cold_still_works_and_says_it_was_renamed(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    options, _ = _export_options(
        repository=tmp_path, check_data=data, embeddings="hierarchical", hot_budget="1M"
    )
    assert options.placement == PlacementOptions("hot-cold", 2**20)
    assert "--embeddings hierarchical was renamed to hot-cold" in caplog.text
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "dlrm",
            "--checkpoint",
            str(tmp_path),
            "--embeddings",
            "hierarchical",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    warning, error = done.stderr.strip().splitlines()  # one line says so, then the hot-cold error
    assert warning.endswith("--embeddings hierarchical was renamed to hot-cold: give --embeddings hot-cold")
    assert error.startswith("error: --embeddings hot-cold needs --hot-budget SIZE")


def test_help_names_hot_cold_only() -> None:
    done = CliRunner().invoke(app, ["dlrm", "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "auto, in-graph, hot-cold." in done.output
    assert "hierarchical" not in done.output


def test_reports_of_earlier_versions_read_with_the_current_name(tmp_path: Path) -> None:
    assert [current_placement(value) for value in PLACEMENTS] == list(PLACEMENTS)
    assert current_placement("hierarchical") == "hot-cold"
    write_report(tmp_path, "dlrm_onnx", {"placement": "hierarchical", "hot_rows": 3})
    assert _read_report(tmp_path, "dlrm_onnx") == {"placement": "hot-cold", "hot_rows": 3}
    write_report(tmp_path, "dlrm_onnx_fp16", {"placement": "hot-cold"})
    assert _read_report(tmp_path, "dlrm_onnx_fp16") == {"placement": "hot-cold"}
    assert _read_report(tmp_path, "absent") == {}


@pytest.mark.parametrize(
    ("mode", "budget", "table_bytes", "hot_cold", "says"),
    [
        ("auto", 1000, 1001, True, "more than the hot budget"),
        ("auto", 1000, 1000, False, "within the hot budget"),
        ("auto", 2**30, 10, False, "every table stays in the graph"),
        ("hot-cold", 2**30, 10, True, "--embeddings hot-cold"),
        ("hot-cold", 0, 10, True, "--embeddings hot-cold"),
    ],
)
def test_auto_splits_only_tables_over_the_budget(
    mode: str, budget: int, table_bytes: int, hot_cold: bool, says: str
) -> None:
    decision = decide(PlacementOptions(mode, hot_budget=budget), table_bytes)
    assert decision.hot_cold is hot_cold
    assert says in decision.reason and f"({table_bytes} bytes)" in decision.reason
    assert decision.table_bytes == table_bytes


# --- export_family ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle's tiny DLRM with per-table sizes (untrained), as `models train dlrm` writes it."""
    import torch

    from models.config import DLRMConfig, save_config
    from models.dlrm import DLRM, WEIGHTS_FILE

    folder = tmp_path_factory.mktemp("dlrm")
    save_config(DLRMConfig.preset("tiny", table_sizes=SIZES), folder)
    torch.manual_seed(0)
    torch.save(DLRM(DLRMConfig.preset("tiny", table_sizes=SIZES)).state_dict(), folder / WEIGHTS_FILE)
    return folder


def _exporter(checkpoint: Path) -> Any:
    from export.importers.onnx_dlrm import DLRMExporter

    return DLRMExporter(checkpoint)


def _options(repository: Path, data: Path, **placement: Any) -> ExportOptions:
    return ExportOptions(
        repository=repository,
        check_data=data,
        check_rows=1024,
        fp16=False,
        int8=False,
        placement=PlacementOptions(**{"hot_budget": BUDGET, **placement}),
        raw_rows=False,  # the placement's models alone
    )


def _entries(repository: Path) -> set[str]:
    return {path.name for path in repository.iterdir()} if repository.exists() else set()


def test_hot_cold_export_is_exact_with_an_fp32_store(
    checkpoint: Path, data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = tmp_path / "repo"
    # Stale all-in-graph variants of an earlier export go: they no longer match what is served.
    for stale in ("dlrm_onnx_fp16", "dlrm_onnx_int8", "dlrm_trt", "dlrm_torch"):
        (repository / stale / "1").mkdir(parents=True)
    caplog.set_level("INFO", logger="export.tables.placement")
    options = replace(_options(repository, data, stage_instances=2), fp16=True)
    result, fp16 = export_family(_exporter(checkpoint), options)
    # The FP16 variant is the shared stage and its own dense model; nothing else of before is left.
    assert _entries(repository) == {
        "dlrm_onnx",
        "dlrm_embedding",
        "dlrm_dense",
        "dlrm_onnx_fp16",
        "dlrm_dense_fp16",
    }
    assert "more than the hot budget" in caplog.text
    assert fp16.name == "dlrm_onnx_fp16" and fp16.reference == "hot/cold FP32 (same stage)"
    assert abs(fp16.parity.auc_delta or 0.0) <= options.fp16_auc_tolerance
    assert result.name == "dlrm_onnx" and result.reference == "onnx_fp32 (in-graph)"
    assert result.parity.max_abs_diff <= FP32_STORE_TOLERANCE
    assert result.parity.rows == 1024 + 64  # the check rows and their out-of-range copies
    assert result.summary.startswith("dlrm_onnx: hot/cold: 64 of")

    assert read_config(repository / "dlrm_onnx" / "config.pbtxt").platform == "ensemble"
    assert read_config(repository / "dlrm_embedding" / "config.pbtxt").instance_group[0].count == 2
    assert not (repository / "dlrm_onnx" / "1" / "model.onnx").exists()
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["placement"] == "hot-cold"
    assert (report["hot_budget_bytes"], report["hot_rows"], report["hot_bytes"]) == (BUDGET, 64, BUDGET)
    assert report["table_bytes"] == TABLE_BYTES and report["table_rows"] == sum(SIZES)
    assert report["profile"]["source"] == str(data) and report["profile"]["from"] == "--check-data"
    hot = HotSet.load(repository / "dlrm_embedding" / "1" / "hot_set.npz")
    assert report["expected_hit_rate"] == pytest.approx(hot.expected_hit_rate)
    assert 0 < report["measured_hit_rate"]["hit_rate"] < 1
    assert report["row_store"] == {
        "path": "dlrm_embedding/rows",
        "dtype": "float32",
        "bytes": TABLE_BYTES,
        "width": 8,
        "rows": sum(SIZES),
    }
    assert report["parity"]["max_abs_diff"] <= FP32_STORE_TOLERANCE
    assert report["in_graph"]["checked_against"] == "framework"
    store = RowStore.open(repository / "dlrm_embedding" / "rows")
    assert store.spec.table_sizes == SIZES


def _closed_gate_changes_nothing(
    checkpoint: Path, repository: Path, strict: ExportOptions, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the hot/cold answers nudged, the ``strict`` export fails with ``match`` and leaves the
    repository as it was."""
    before = {path: path.read_bytes() for path in sorted(repository.rglob("*")) if path.is_file()}
    original = placement_module.run_hot_cold

    def nudged(*args: Any, **kwargs: Any) -> np.ndarray:
        probabilities: np.ndarray = original(*args, **kwargs)
        return np.clip(probabilities + np.linspace(0, 0.2, len(probabilities))[:, None], 0, 1).astype(
            np.float32
        )

    with monkeypatch.context() as patch:
        patch.setattr(placement_module, "run_hot_cold", nudged)
        with pytest.raises(ExportError, match=match):
            export_family(_exporter(checkpoint), strict)
    assert {path: path.read_bytes() for path in sorted(repository.rglob("*")) if path.is_file()} == before


def test_an_fp16_store_passes_the_auc_gate(
    checkpoint: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "repo"
    options = _options(repository, data, mode="hot-cold", store_dtype="float16", profile_data=data)
    (result,) = export_family(_exporter(checkpoint), options)
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["row_store"]["dtype"] == "float16"
    assert report["row_store"]["bytes"] == TABLE_BYTES // 2
    assert report["tolerance"] == {"auc_delta": options.fp16_auc_tolerance}
    assert report["profile"]["from"] == "--profile-data"
    assert abs(result.parity.auc_delta or 0.0) <= options.fp16_auc_tolerance
    assert 0 < result.parity.max_abs_diff < 1e-2  # FP16 rounding of the cold rows, reported

    # The same gate, closed: the export fails and leaves the repository as it was.
    _closed_gate_changes_nothing(
        checkpoint, repository, replace(options, fp16_auc_tolerance=1e-12), "AUC differs by", monkeypatch
    )


def test_an_int8_store_passes_the_int8_auc_gate(
    checkpoint: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "repo"
    options = _options(repository, data, mode="hot-cold", store_dtype="int8", profile_data=data)
    (result,) = export_family(_exporter(checkpoint), options)
    report = json.loads((repository / "dlrm_onnx" / "export_report.json").read_text())
    assert report["row_store"]["dtype"] == "int8"
    # 8 codes and one scale and bias per row (the embedding is the row's one column).
    assert report["row_store"]["bytes"] == sum(SIZES) * (8 + 8)
    assert report["tolerance"] == {"auc_delta": options.int8_auc_tolerance}
    assert abs(result.parity.auc_delta or 0.0) <= options.int8_auc_tolerance
    assert 0 < result.parity.max_abs_diff < 5e-2  # the cold rows' quantization, reported

    _closed_gate_changes_nothing(
        checkpoint,
        repository,
        replace(options, int8_auc_tolerance=1e-12),
        r"\(int8 row store\) vs .*AUC differs by .*tolerance 1e-12",
        monkeypatch,
    )


def test_a_failed_fp32_check_leaves_nothing(
    checkpoint: Path, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository = tmp_path / "repo"
    original = placement_module.stage_reference

    def wrong_cold_rows(*args: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        slots, positions, rows = original(*args)
        return slots, positions, rows + np.float32(0.01)

    monkeypatch.setattr(placement_module, "stage_reference", wrong_cold_rows)
    with pytest.raises(ExportError, match=r"max abs diff .* \(tolerance 1e-06"):
        export_family(_exporter(checkpoint), _options(repository, data))
    assert _entries(repository) == set()


def test_auto_keeps_tables_within_the_budget_in_the_graph(
    checkpoint: Path, data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = tmp_path / "repo"
    export_family(_exporter(checkpoint), _options(repository, data))
    assert (repository / "dlrm_dense").is_dir()
    caplog.set_level("INFO", logger="export.tables.placement")
    # Now the tables fit: in-graph, and the earlier export's stage and dense model go.
    (result,) = export_family(_exporter(checkpoint), _options(repository, data, hot_budget=TABLE_BYTES))
    assert "within the hot budget" in caplog.text
    assert _entries(repository) == {"dlrm_onnx"}
    assert result.reference == "framework" and not result.summary
    assert (repository / "dlrm_onnx" / "1" / "model.onnx").is_file()


@dataclass
class _NoSizes:
    """An exporter whose model reduces ids its own way, with sizes the export could not read."""

    inner: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def table_sizes(self) -> None:
        return None


def test_unknown_table_sizes_ask_for_them(checkpoint: Path, data: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    with pytest.raises(ConfigError, match="give --table-sizes"):
        export_family(_NoSizes(_exporter(checkpoint)), _options(repository, data))
    assert _entries(repository) == set()
