"""mkdocs hook: the charts committed under ``benchmarks/`` appear in the site at the same path.

A page shows a committed chart as ``![...](benchmarks/<folder>/<chart>.png)`` (relative to
``docs/``) and the build takes the file from the repository, never a copy: a chart that is
regenerated is the one the site shows, and a missing one fails the strict build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def on_files(files: Files, config: Any) -> Files:
    for chart in sorted((ROOT / "benchmarks").rglob("*.png")):
        uri = chart.relative_to(ROOT).as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(chart)))
    return files
