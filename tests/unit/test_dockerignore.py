"""Each Dockerfile's build context has a ``.dockerignore`` that leaves out local state, never a
file the Dockerfile copies.

Where each Dockerfile is built from: the ``build`` sections of ``docker-compose.yml`` (context and
Dockerfile as Compose resolves them), and every ``docker build -f <Dockerfile> ... <context>``
command the docs and the Dockerfiles' own comments show, run from the repository root. Every
Dockerfile in the repository must have one.

The files of a context are those git tracks or would add (``git ls-files --cached --others
--exclude-standard``): what a clean clone holds once this checkout is committed. The
``.dockerignore`` is read as Docker reads it (moby's patternmatcher: patterns cleaned and
anchored at the context's root, ``*`` within one path segment, ``**`` across any number, ``!``
for exceptions, the last matching line deciding, a path left out with its parent folder).
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
#: Local state no build context of the repository root may carry: the venv (gigabytes), training
#: outputs, exported repositories, builds, secrets.
ROOT_EXCLUDED = (
    ".venv/bin/python",
    ".env",
    "artifacts/demo/data/train.tsv",
    "build/stages/raw_rows/libtriton_raw_rows.so",
    "site/index.html",
    "data/train.tsv",
    "reports/sweep/steps.csv",
    "model_repository/dlrm_onnx/1/model.onnx",
    "model_repository_gpu/dlrm_trt/1/model.plan",
    "bundle/__pycache__/cli.cpython-311.pyc",
    "deploy/trt-build/wheels/numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.whl",
    "ctr-images.tar",
)


@dataclass(frozen=True)
class Pattern:
    """One line of a ``.dockerignore``: its regular expression and whether it is an exception."""

    regex: re.Pattern[str]
    exception: bool


def _compile(pattern: str) -> re.Pattern[str]:
    """A cleaned ``.dockerignore`` pattern as moby's patternmatcher compiles it."""
    out, index = "^", 0
    while index < len(pattern):
        char = pattern[index]
        index += 1
        if char == "*":
            if pattern[index : index + 1] == "*":
                index += 1
                if pattern[index : index + 1] == "/":
                    index += 1
                out += ".*" if index >= len(pattern) else "(.*/)?"
            else:
                out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "\\" and index < len(pattern):
            out += re.escape(pattern[index])
            index += 1
        elif char in "[]-^":
            out += char  # a character class passes through, as in Go's filepath.Match
        else:
            out += re.escape(char)
    return re.compile(out + "$")


def read_dockerignore(path: Path) -> list[Pattern]:
    """The patterns of ``path``: blank lines and ``#`` comments skipped, each pattern cleaned
    (``posixpath.normpath``, as Go's filepath.Clean) and its leading ``/`` dropped."""
    patterns = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        line = line[1:].strip() if exception else line
        cleaned = posixpath.normpath(line).lstrip("/")
        patterns.append(Pattern(_compile(cleaned), exception))
    return patterns


def excluded(patterns: list[Pattern], path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out of the build context."""
    parts = path.split("/")
    candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    result = False
    for pattern in patterns:
        if any(pattern.regex.match(candidate) for candidate in candidates):
            result = not pattern.exception
    return result


@cache
def repository_files() -> tuple[str, ...]:
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"git cannot list the repository's files here: {done.stderr.strip()}")
    return tuple(line for line in done.stdout.splitlines() if (ROOT / line).is_file())


def context_files(context: Path) -> list[str]:
    """The repository's files inside ``context``, relative to it."""
    prefix = context.relative_to(ROOT).as_posix()
    if prefix == ".":
        return list(repository_files())
    return [f[len(prefix) + 1 :] for f in repository_files() if f.startswith(prefix + "/")]


def _build_commands() -> list[tuple[Path, Path]]:
    """``(Dockerfile, context)`` of each ``docker build -f`` command the docs and Dockerfiles show."""
    texts = [page.read_text() for page in sorted((ROOT / "docs").rglob("*.md"))]
    texts += [(ROOT / name).read_text() for name in repository_files() if Path(name).name == "Dockerfile"]
    found = []
    for text in texts:
        joined = re.sub(r"\\\n[#\s]*", " ", text)  # continuation lines, in a comment or not
        for line in joined.splitlines():
            command = line.lstrip("# ").strip()
            if not command.startswith("docker build "):
                continue
            words = shlex.split(command)
            dockerfile = words[words.index("-f") + 1]
            found.append((ROOT / dockerfile, ROOT / words[-1]))
    return found


def _compose_builds() -> list[tuple[Path, Path]]:
    """``(Dockerfile, context)`` of each service of docker-compose.yml that builds an image."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]  # merge keys resolved
    found = []
    for service in services.values():
        build = service.get("build")
        if build is None:
            continue
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        found.append(((context / build.get("dockerfile", "Dockerfile")).resolve(), context))
    return found


def builds() -> list[tuple[Path, Path]]:
    return sorted(set(_compose_builds() + _build_commands()))


def copy_sources(dockerfile: Path) -> list[str]:
    """The sources of each ``COPY`` and ``ADD`` that reads the build context (not ``--from``)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    sources = []
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if len(words) < 2 or words[0].upper() not in ("COPY", "ADD"):
            continue
        arguments = words[1].strip()
        flags = re.match(r"((?:--\S+\s+)*)(.*)", arguments)
        assert flags is not None
        if "--from=" in flags.group(1):
            continue
        rest = flags.group(2)
        paths = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
        sources += [posixpath.normpath(path).lstrip("/") for path in paths[:-1]]
    return sources


def _matches(source: str, path: str) -> bool:
    """Whether ``path`` (a file of the context) is ``source`` or inside it (``source`` may glob)."""
    regex = _compile(source)
    parts = path.split("/")
    return any(regex.match("/".join(parts[: end + 1])) for end in range(len(parts))) or source == "."


def test_every_dockerfile_has_a_context_with_a_dockerignore() -> None:
    dockerfiles = {ROOT / name for name in repository_files() if Path(name).name == "Dockerfile"}
    assert dockerfiles, "no Dockerfile found"
    built = builds()
    assert {dockerfile for dockerfile, _ in built} == dockerfiles
    for dockerfile, context in built:
        assert context.is_dir(), f"{dockerfile.relative_to(ROOT)}: its context {context} is no folder"
        assert (context / ".dockerignore").is_file(), f"{context.relative_to(ROOT)} has no .dockerignore"


def test_copied_files_stay_in_the_build_context() -> None:
    for dockerfile, context in builds():
        name = dockerfile.relative_to(ROOT)
        patterns = read_dockerignore(context / ".dockerignore")
        files = context_files(context)
        sources = copy_sources(dockerfile)
        assert sources, f"{name} copies nothing from its context"
        for source in sources:
            copied = [path for path in files if _matches(source, path)]
            assert copied, f"{name}: COPY {source}: no such file in {context}"
            left_out = [path for path in copied if excluded(patterns, path)]
            assert not left_out, (
                f"{name}: {context.relative_to(ROOT)}/.dockerignore leaves out {left_out[:5]}"
            )


def test_the_repository_root_context_carries_no_local_state() -> None:
    patterns = read_dockerignore(ROOT / ".dockerignore")
    for path in ROOT_EXCLUDED:
        assert excluded(patterns, path), f".dockerignore lets {path} into the build context"
    # A name that only starts like an excluded folder stays in (patterns are anchored, not prefixes).
    for path in ("models/dlrm.py", "backends/embedding/store.cc", "export/tables/row_store.py"):
        assert not excluded(patterns, path), path


def test_the_stages_context_leaves_out_python_caches_only() -> None:
    context = ROOT / "backends"
    patterns = read_dockerignore(context / ".dockerignore")
    assert excluded(patterns, "embedding/__pycache__/uring.cpython-311.pyc")
    assert excluded(patterns, "build/CMakeCache.txt")
    assert not any(excluded(patterns, path) for path in context_files(context))


def test_the_matcher_reads_patterns_as_docker_does(tmp_path: Path) -> None:
    ignore = tmp_path / ".dockerignore"
    ignore.write_text("# comment\n/logs/\n**/*.tmp\ndocs/*.md\n!docs/keep.md\nmodel_*\n")
    patterns = read_dockerignore(ignore)
    assert excluded(patterns, "logs/a/b.txt")  # a folder leaves out what it holds
    assert not excluded(patterns, "src/logs/a.txt")  # anchored at the root
    assert excluded(patterns, "a/b/c.tmp") and excluded(patterns, "c.tmp")
    assert excluded(patterns, "docs/page.md") and not excluded(patterns, "docs/keep.md")
    assert not excluded(patterns, "docs/sub/page.md")  # * stays within one segment
    assert excluded(patterns, "model_repository_gpu/x") and not excluded(patterns, "models/x")
