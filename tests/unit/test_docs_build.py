"""``make docs`` fails on any warning of the site's build, and says which.

The test plants a tiny site in a temporary folder (a config and one page that links to a page
that does not exist) and runs the Makefile's own ``docs`` target on it through ``MKDOCS_CONFIG``,
with ``-o setup`` so that make takes the venv as set up and only the target's recipe runs. The
build must fail and print the warning: a ``--quiet`` in the recipe would hide the warning from
``--strict`` too, and the broken site would pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "python").exists(),
    reason="needs make and the project's venv (make setup)",
)


def make_docs(config: Path) -> subprocess.CompletedProcess[str]:
    """``make docs`` on ``config``, without remaking the venv."""
    return subprocess.run(
        ["make", "-C", str(ROOT), "--no-print-directory", "-o", "setup", "docs", f"MKDOCS_CONFIG={config}"],
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def plant_site(folder: Path, page: str) -> Path:
    (folder / "docs").mkdir()
    (folder / "docs" / "index.md").write_text(page)
    config = folder / "mkdocs.yml"
    config.write_text(f"site_name: planted\ndocs_dir: docs\nsite_dir: {folder / 'site'}\n")
    return config


def test_docs_target_fails_on_a_warning_and_prints_it(tmp_path: Path) -> None:
    config = plant_site(tmp_path, "# Planted\n\nSee [the missing page](missing.md).\n")
    completed = make_docs(config)
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, f"make docs passed a site with a broken link:\n{output}"
    assert "WARNING" in output and "missing.md" in output, f"the warning is not shown:\n{output}"
