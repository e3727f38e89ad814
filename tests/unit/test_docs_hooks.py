"""The site's hook turns a page's links to result files, right on GitHub, into links right in the site.

A benchmark page links the result file it includes and its charts by their paths from the page in
the repository (``docs/benchmarks/cpu.md`` -> ``../../benchmarks/cpu/precision.md``), which GitHub
follows; the hook (``docs_hooks/benchmark_figures.py``) makes a chart's link its path in the site
and a result file's link its text, and leaves every other link as mkdocs sees it.
"""

from __future__ import annotations

from pathlib import Path

from docs_hooks.benchmark_figures import repository_links

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def in_site(uri: str) -> bool:
    return uri.startswith("benchmarks/") and uri.endswith(".png")


def test_a_chart_gets_its_site_path_and_a_result_file_its_text() -> None:
    page = (
        "[`benchmarks/soak/result.md`](../../benchmarks/soak/result.md) (`bash benchmarks/soak/run.sh`)\n"
        "![RSS](../../benchmarks/soak/rss.png) and ![old style](../benchmarks/soak/rss.png)\n"
    )
    assert repository_links(page, "benchmarks/reliability.md", DOCS, in_site) == (
        "`benchmarks/soak/result.md` (`bash benchmarks/soak/run.sh`)\n"
        "![RSS](soak/rss.png) and ![old style](../benchmarks/soak/rss.png)\n"
    )


def test_other_links_are_left_for_mkdocs_to_check() -> None:
    page = (
        "[machines](index.md#the-machines), [lab](../lab.md), [site](https://example.org/a.md), "
        "[gone](../../benchmarks/no_such/result.md), [anchor](#top)\n"
        "```markdown\n[`x`](../../benchmarks/soak/result.md)\n```\n"
    )
    assert repository_links(page, "benchmarks/reliability.md", DOCS, in_site) == page
