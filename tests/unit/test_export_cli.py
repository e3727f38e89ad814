"""The export CLI: one declaration of the options both commands share, --verbose anywhere, one-line errors."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import typer

from export.__main__ import _export_options, app


def _options(command: str) -> set[str]:
    sub = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {name for param in sub.params for name in param.opts}


def test_both_commands_take_every_shared_option() -> None:
    shared = {f"--{name.replace('_', '-')}" for name in inspect.signature(_export_options).parameters}
    assert {"--repository", "--int8-method", "--table-sizes", "--logits", "--verbose"} <= shared
    dlrm, wide_deep = _options("dlrm"), _options("wide-deep")
    assert shared <= dlrm and shared <= wide_deep
    assert dlrm - wide_deep == {"--checkpoint", "--factory", "--feature-order", "--hotness"}
    assert wide_deep - dlrm == {"--saved-model", "--input-map"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "export", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_errors_are_one_line_and_verbose_works_after_the_subcommand(tmp_path: Path) -> None:
    done = _run("dlrm", "--repository", str(tmp_path / "repo"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: give --checkpoint PATH, or --factory package.module:function (with --checkpoint PATH, "
        "the function receives that path)"
    ]
    done = _run("wide-deep", "--table-sizes", "1,2", "--saved-model", str(tmp_path), "--verbose")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: --table-sizes needs 26 sizes (C1..C26), got 2"
    assert "Traceback" in done.stderr  # --verbose after the subcommand: the full traceback too
