"""bundle.snippets: the named sections a result file carries are the ones pymdownx.snippets finds."""

from __future__ import annotations

from pathlib import Path

import markdown
import pytest

from bundle.errors import ConfigError
from bundle.snippets import name_for, section, section_end, section_start


def include(folder: Path, target: str) -> str:
    """The HTML of a page that holds nothing but ``--8<-- "target"``, as the site renders it."""
    return markdown.markdown(
        f'--8<-- "{target}"',
        extensions=["pymdownx.snippets"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(folder)], "check_paths": True}},
    )


def test_a_page_gets_the_section_and_nothing_else(tmp_path: Path) -> None:
    lines = [
        "# Title",
        "",
        section_start("results"),
        "before",
        "",
        *section("steps", ["inside"]),
        "",
        "after",
        section_end("results"),
        "",
        "chart",
    ]
    (tmp_path / "report.md").write_text("\n".join(lines) + "\n")
    steps = include(tmp_path, "report.md:steps")
    assert "inside" in steps and "before" not in steps and "8&lt;" not in steps
    results = include(tmp_path, "report.md:results")
    assert all(word in results for word in ("before", "inside", "after"))
    assert "Title" not in results and "chart" not in results and "8&lt;" not in results
    whole = include(tmp_path, "report.md")
    assert "chart" in whole and "8&lt;" not in whole and "8<" not in whole


def test_names() -> None:
    assert name_for("scaling-dlrm_onnx_int8") == "scaling-dlrm_onnx_int8"
    assert name_for("Wide & Deep") == "wide-deep"
    assert name_for("8192x4") == "s-8192x4"
    with pytest.raises(ConfigError):
        section_start("Steps")
    with pytest.raises(ConfigError):
        section_end("a b")
