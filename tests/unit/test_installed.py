"""The bundle is installed into its venv (``make setup``): its stages and the console script run from any
folder, without PYTHONPATH, and ``triton-recsys --help`` imports no stage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_recsys.__main__ import STAGES, main

CONSOLE_SCRIPT = Path(sys.executable).parent / "triton-recsys"


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("stage", ["export", "loadtest"])
def test_a_stage_runs_from_another_folder(stage: str, tmp_path: Path) -> None:
    done = _run([sys.executable, "-m", stage, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout


def test_the_console_script_lists_the_stages_and_runs_one(tmp_path: Path) -> None:
    assert CONSOLE_SCRIPT.is_file(), f"{CONSOLE_SCRIPT} is missing: run make setup"
    listed = _run([str(CONSOLE_SCRIPT), "--help"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert all(f"  {stage} " in listed.stdout for stage in STAGES)
    stage = _run([str(CONSOLE_SCRIPT), "criteo", "--help"], tmp_path)
    assert stage.returncode == 0 and "synth" in stage.stdout, stage.stderr


def test_an_unknown_stage_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: unknown stage or command 'nope'; choose one of demo, criteo, models, export, server, "
        "clients, loadtest, lab"
    )


def test_the_demo_is_the_console_scripts_own_command(tmp_path: Path) -> None:
    done = _run([str(CONSOLE_SCRIPT), "demo", "--help"], tmp_path)
    assert done.returncode == 0 and "--sweep-seconds" in done.stdout, done.stderr
    assert "demo" in _run([str(CONSOLE_SCRIPT), "--help"], tmp_path).stdout


def test_the_help_imports_no_stage() -> None:
    code = "import sys; from triton_recsys.__main__ import main; main(['--help']); " + (
        "print(sorted(m for m in sys.modules if m.split('.')[0] in " + repr(sorted(STAGES)) + "))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
