"""The fault table's files (lab.faults.table): a missed target is marked and raised, every row shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle.records import RunRecord
from lab.faults import FaultResult
from lab.faults import table as fault_table


def _results() -> list[FaultResult]:
    return [
        FaultResult("stub SIGKILL under load (dlrm_onnx)", "failed: none", 85, 0, 0, 1.8, True),
        FaultResult(
            "config.pbtxt that does not parse (m)", "model failed to load: 'm' | config", 12, 0, 0, None, True
        ),
        FaultResult("export killed moving the models in", "variants MIXED", 4, 0, 1, 6.4, False),
    ]


def test_the_table_marks_a_missed_target_and_escapes_pipes(tmp_path: Path) -> None:
    with RunRecord.begin("python -m lab faults") as record:
        pass
    faults = fault_table.FaultTable(_results(), record)
    paths = fault_table.write_table(faults, tmp_path)
    text = paths["markdown"].read_text()
    assert "3 faults, 1 wrong answers; missed: export killed moving the models in." in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 3  # the header and one row per fault
    assert "'m' \\| config" in text and "| **no** |" in text and "| 1.8 |" in text and "| - |" in text
    document = json.loads(paths["json"].read_text())
    assert [f["ok"] for f in document["faults"]] == [True, True, False]
    assert document["record"]["command"] == "python -m lab faults"


def test_a_missed_target_fails_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fault_table, "run_faults", lambda work, keep, only: _results())
    with pytest.raises(fault_table.FaultsFailed, match="1 of 3 faults missed their target"):
        fault_table.measure("python -m lab faults", tmp_path)
    assert (tmp_path / "result.md").is_file()  # written before the failure is raised
