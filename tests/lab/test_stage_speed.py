"""``python -m lab stage-speed`` at a tiny size, through the real local tritonserver: every stage
timed inside its ensemble, the embedding stage's lookups in process beside it, and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle.errors import BundleError
from bundle.schema import NUM_CATEGORICAL
from lab.stage_speed import HOT_SHARES, StageSpeedOptions, in_process, run_stage_speed, write_stage_speed

WIDTH = 4


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict:
    log = tmp_path_factory.mktemp("stage-speed") / "tritonserver.log"
    options = StageSpeedOptions(
        batch_sizes=(1, 64),
        requests=6,
        rounds=2,
        rows_per_table=200,
        width=WIDTH,
        in_process=20,
        log_file=log,
    )
    return run_stage_speed(options, "python -m lab stage-speed (test)")


def test_every_stage_is_timed_in_its_ensemble_and_the_embedding_stage_in_process(document: dict) -> None:
    steps = document["steps"]
    assert [(s["stage"], s["batch_size"]) for s in steps] == [
        (stage, batch) for stage in ("raw rows", *HOT_SHARES) for batch in (1, 64)
    ]
    for step in steps:
        # Every request of every round counted, through the ensemble: the stage served them all.
        assert step["requests"] == 6 * 2, step
        assert 0 < step["stage_us"] <= step["request_us"] < step["ensemble_us"], step
        assert len(step["rounds_stage_us"]) == 2
        if step["stage"] == "raw rows":
            assert "lookup_us" not in step
            continue
        assert step["lookup_us"] > 0 and step["copy_us"] > 0, step
        # Its ids in and its hot slots out at least (8 bytes each), plus the cold rows.
        assert step["bytes"] >= 2 * step["batch_size"] * NUM_CATEGORICAL * 8, step


def test_the_report_says_which_steps_are_within_the_bound(document: dict, tmp_path: Path) -> None:
    paths = write_stage_speed(document, tmp_path)
    markdown = paths["markdown"].read_text()
    for section in ("embedding", "raw-rows"):
        assert f"--8<-- [start:{section}]" in markdown and f"--8<-- [end:{section}]" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith(("| 80% hot", "| mostly cold"))]
    assert len(rows) == 4, rows
    for row in rows:
        batch = int(row.split("|")[2])
        verdict = row.rstrip("|").split("|")[-1].strip()
        assert (verdict.startswith(("yes", "NO")) and "(<= 50)" in verdict) if batch == 64 else verdict == ""
    assert json.loads(paths["json"].read_text())["steps"] == json.loads(json.dumps(document["steps"]))
    assert paths["png"].stat().st_size > 0


def test_a_missing_driver_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"^no lookup driver at .*: build the compiled stages first"):
        in_process(tmp_path / "nothing", tmp_path, tmp_path, [], 1)
