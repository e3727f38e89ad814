"""The run record every result starts from, and the one report writer (tables, JSON, PNG)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from bundle.errors import ConfigError
from bundle.records import RunRecord, command_line, machine_with_flags
from loadtest.engine.writer import Panel, Series, fmt, plot, table, write_json


def test_a_record_samples_the_load_across_the_run_and_reads_back() -> None:
    with RunRecord.begin("python -m lab soak", sample_every_s=0.05) as record:
        time.sleep(0.3)
    assert record.finished >= record.started and record.load_end is not None
    # At the start, every 50 ms, and at the end.
    assert len(record.load_samples) >= 4
    during = record.load_during()
    assert during["samples"] == len(record.load_samples)
    assert during["min"] <= during["median"] <= during["max"]
    assert record.machine["cores"] >= 1 and set(record.machine["cpu_flags"]) >= {"avx512f"}
    finished = record.finished
    assert record.finish().finished == finished  # a second finish changes nothing

    document = json.loads(json.dumps(record.to_json()))
    again = RunRecord.from_json(document)
    assert json.loads(json.dumps(again.to_json())) == document
    lines = "\n".join(again.lines())
    assert "- **Command**: `python -m lab soak`" in lines and "during the run" in lines


def test_a_report_written_before_records_still_reads() -> None:
    legacy = {
        "command": "python -m loadtest sweep",
        "started": "2026-11-22T09:57:40Z",
        "finished": "2026-11-22T10:02:05Z",
        "machine": {"cpu": "x", "cores": 2, "memory_gib": 23.5, "load_average": [1.31, 1.84, 1.79]},
        "load_after": [2.26, 2.19, 1.97],
    }
    record = RunRecord.from_json(legacy)
    assert record.load_start == (1.31, 1.84, 1.79) and record.load_end == (2.26, 2.19, 1.97)
    during = record.load_during()
    assert (during["min"], during["max"], during["samples"]) == (1.31, 2.26, 2)
    assert during["median"] == pytest.approx(1.785, abs=0.006)


def test_a_machine_is_named_with_only_the_flags_its_record_looked_for() -> None:
    base = {"cpu": "AMD EPYC", "cores": 2, "memory_gib": 23.5}
    # A record from before avx2 was kept neither claims nor denies it.
    old_avx2_only = {**base, "cpu_flags": {"avx512f": False, "amx_bf16": False}}
    assert machine_with_flags(old_avx2_only) == "AMD EPYC, 2 cores, 23.5 GiB (none of avx512f, amx_bf16)"
    avx512 = {**base, "cpu_flags": {"avx2": True, "avx512f": True, "amx_bf16": False}}
    assert machine_with_flags(avx512) == "AMD EPYC, 2 cores, 23.5 GiB (avx2, avx512f)"
    assert machine_with_flags(base) == "AMD EPYC, 2 cores, 23.5 GiB"


def test_command_line_quotes_its_arguments() -> None:
    assert command_line("lab", ["soak", "--out", "a b"]) == "python -m lab soak --out 'a b'"
    with pytest.raises(ConfigError):
        RunRecord.begin("x", sample_every_s=0)


def test_tables_format_numbers_one_way_and_check_their_shape() -> None:
    lines = table(["model", "samples/s", "ratio"], [["dlrm", 22475.3, 0.9523], ["w&d", math.nan, "-"]])
    assert lines == [
        "| model | samples/s | ratio |",
        "|---|---:|---:|",
        "| dlrm | 22,475 | 0.952 |",
        "| w&d | - | - |",
    ]
    assert table(["a", "b"], [[1, 2]], align="ll")[1] == "|---|---|"
    assert fmt(12.5) == "12.5" and fmt(None) == "-" and fmt(3) == "3"
    with pytest.raises(ConfigError, match="cells"):
        table(["a", "b"], [[1]])
    with pytest.raises(ConfigError, match="align"):
        table(["a", "b"], [[1, 2]], align="x")


def test_json_is_strict_and_charts_are_pngs(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "out" / "r.json", {"nan": math.nan, "t": (1, 2), "p": Path("a"), 3: math.inf}
    )
    assert json.loads(path.read_text()) == {"nan": None, "t": [1, 2], "p": "a", "3": None}

    panel = Panel(
        "p99",
        "concurrency",
        "ms",
        [Series("triton", [1, 2, 4], [1.0, 2.0, 5.0], notes=[("c4", 4, 5.0)])],
        xlog2=True,
        ylog=True,
        xticks=[1, 2, 4],
        vlines=[(2, "knee")],
    )
    png = plot(tmp_path / "chart.png", "title", [panel, panel])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="panel"):
        plot(tmp_path / "none.png", "title", [])


def test_a_log_panel_of_steps_that_answered_nothing_still_draws(tmp_path: Path) -> None:
    # A starved load generator can finish a step with no answer in its window: no latency at all.
    empty = Panel("p99", "concurrency", "ms", [Series("triton", [12], [math.nan])], xlog2=True, ylog=True)
    zeros = Panel("errors", "concurrency", "per s", [Series("triton", [1, 2], [0.0, 0.0])], ylog=True)
    png = plot(tmp_path / "empty.png", "title", [empty, zeros])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
