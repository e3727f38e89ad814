"""The GPU page and every page that names a release's versions say what ``bundle/ngc.py`` says.

The host's requirements (driver, CUDA, TensorRT) and the LibTorch bound of the pinned release are
facts read from NVIDIA's pages and written down once, in :data:`bundle.ngc.RELEASES`; the
defaults the sizing table names are the repository contract's. A page that quotes them must not
drift from them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bundle.ngc import PINNED_RELEASE, RELEASES
from bundle.repository import INSTANCES, ServingConfig

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "serving" / "gpu.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the first table under ``## heading``, by their first cell (cells stripped)."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows.setdefault(cells[0], cells[1:])
    return rows


def test_the_host_table_quotes_each_release_as_bundle_ngc_records_it() -> None:
    rows = table_rows(PAGE.read_text(), "The GPU host")
    header = rows["requirement"]
    assert header[0].startswith(f"NGC {PINNED_RELEASE}"), header
    for column, name in enumerate(("26.11", "25.01")):
        assert header[column].startswith(f"NGC {name}"), header
        release = RELEASES[name]
        facts = {
            "NVIDIA driver": release.driver,
            "CUDA in the images": release.cuda,
            "TensorRT": release.tensorrt,
        }
        for requirement, fact in facts.items():
            cell = rows[requirement][column]
            if fact is None:
                assert cell.startswith(("unknown", "**unknown**")), (name, requirement, cell)
            else:
                # The page may shorten a version (12.8.0.038 -> 12.8) but never change it.
                assert "unknown" not in cell, (name, requirement, cell)
                shown = re.sub(r"\s+", " ", cell)
                if requirement == "NVIDIA driver":
                    assert shown == re.sub(r"\s+", " ", fact), (shown, fact)
                else:
                    assert fact.startswith(shown.split()[0]), (name, requirement, shown, fact)


def test_the_sizing_table_names_the_repository_contracts_defaults() -> None:
    rows = table_rows(PAGE.read_text(), "Sizing: what was measured, and where")
    assert rows["`--max-batch-size`"][0] == str(ServingConfig(profile="gpu").max_batch_size)
    assert rows["`--instances` (per GPU)"][0] == str(INSTANCES["gpu"])


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_page_gives_the_pinned_releases_libtorch_bound_of_bundle_ngc(page: Path) -> None:
    """One value for "the pinned release's LibTorch is at least ...", wherever a page names it."""
    bound = re.match(r"\d+\.\d+", RELEASES[PINNED_RELEASE].libtorch_at_least)
    assert bound is not None
    text = re.sub(r"\s+", " ", page.read_text())
    said = re.findall(r"(?:LibTorch|PyTorch)\b[^.;]{0,80}?\b(\d+\.\d+)[\w.+]* or newer", text)
    assert all(version == bound.group(0) for version in said), (page, said, bound.group(0))
