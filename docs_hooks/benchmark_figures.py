"""mkdocs hook: committed result files, linked so that a page reads on GitHub and in the site.

Charts: the ones committed under ``benchmarks/`` appear in the site at the same path. The
build takes each file from the repository, never a copy: a chart that is regenerated is the one
the site shows, and a missing one fails the strict build.

Links: a page may link to a file of the repository outside ``docs/`` by its path from the page
(``docs/benchmarks/cpu.md`` links ``../../benchmarks/cpu/precision.md``), which is where GitHub
finds it. For the site, such a link to a chart becomes the chart's path in the site, and a link
to any other file that exists (a result page, whose tables the page includes with ``--8<--``)
becomes its text alone: the site holds no copy to link to. A link to a file that does not exist
is left as it is, so the strict build reports it. Charts linked the older way, by their path in
the site (``../benchmarks/cpu/...png`` from ``docs/benchmarks/``), keep working.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

#: A Markdown link or image with an inline target: ``[text](target)``, ``![alt](target)``.
LINK = re.compile(r"(?P<image>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def on_files(files: Files, config: Any) -> Files:
    for chart in sorted((ROOT / "benchmarks").rglob("*.png")):
        uri = chart.relative_to(ROOT).as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(chart)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    def in_site(uri: str) -> bool:
        return files.get_file_from_path(uri) is not None

    return repository_links(markdown, page.file.src_uri, Path(config["docs_dir"]), in_site)


def repository_links(markdown: str, src_uri: str, docs_dir: Path, in_site: Callable[[str], bool]) -> str:
    """``markdown`` with its links to repository files outside ``docs_dir`` made right for the site.

    Args:
        markdown: the page's Markdown.
        src_uri: the page's path under ``docs_dir`` (``benchmarks/cpu.md``).
        docs_dir: the documentation's folder, inside the repository (:data:`ROOT`).
        in_site: whether a path from the repository root (``benchmarks/cpu/x.png``) is a file of
            the site, at that same path under the site's root.

    Returns:
        The Markdown, fenced code blocks untouched.
    """
    page_dir = posixpath.dirname(src_uri)

    def rewrite(match: re.Match[str]) -> str:
        target, _, anchor = match["target"].partition("#")
        if not target or "://" in target or target.startswith(("/", "mailto:")):
            return match[0]
        path = Path(os.path.normpath(docs_dir / page_dir / target))
        if path.is_relative_to(docs_dir) or not path.is_relative_to(ROOT):
            return match[0]
        uri = path.relative_to(ROOT).as_posix()
        if in_site(uri):
            site_target = posixpath.relpath(uri, page_dir or ".") + (f"#{anchor}" if anchor else "")
            return f"{match['image']}[{match['text']}]({site_target})"
        if path.is_file() and not match["image"]:
            return match["text"]
        return match[0]

    lines = markdown.split("\n")
    in_fence = False
    for index, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            lines[index] = LINK.sub(rewrite, line)
    return "\n".join(lines)
