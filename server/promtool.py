"""promtool, Prometheus's rule checker, unpacked from Debian's ``prometheus`` package into the venv.

The compose stack's alert rules (``deploy/prometheus/alerts.yml``) and their unit tests
(``alerts.test.yml``) are checked by promtool. No package pip installs carries it, so
:func:`install` downloads the Debian package pinned in ``requirements-promtool.txt``, checks its
SHA-256 and writes the one file it needs, ``usr/bin/promtool``, to ``<venv>/bin/promtool``
(:mod:`bundle.downloads`): no root, no system package. :func:`locate` finds the promtool the
tests run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bundle.downloads import fetch_deb_file, read_deb_pin
from bundle.errors import BundleError

#: The pin: one ``# deb URL sha256=...`` line.
PINS_FILE = Path(__file__).resolve().parents[1] / "requirements-promtool.txt"
#: Where the Debian package installs promtool.
PACKAGE_PATH = "usr/bin/promtool"
#: Environment variable naming a promtool to use instead.
ENV_VAR = "PROMTOOL"
#: What to do when there is none, in one line.
HOW_TO_GET = f"install it with `make setup` or `python -m server promtool install`, or set {ENV_VAR}"


def venv_promtool(prefix: Path | None = None) -> Path:
    """Where :func:`install` writes it: ``<prefix>/bin/promtool``, beside the venv's python."""
    return (prefix or Path(sys.prefix)) / "bin" / "promtool"


def version(binary: Path) -> str:
    """The first line ``binary --version`` prints (``promtool, version 2.42.0+ds (...)``).

    Raises:
        BundleError: it does not run, or does not answer as promtool does.
    """
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"{binary} does not run: {exc}") from None
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    if done.returncode != 0 or not lines or not lines[0].startswith("promtool, version"):
        said = lines[-1] if lines else "nothing"
        raise BundleError(f"{binary} is not a working promtool: exit code {done.returncode}, said {said!r}")
    return lines[0]


def install(prefix: Path | None = None, progress: Callable[[str], None] = lambda _: None) -> tuple[Path, str]:
    """Download the pinned package, check its hash, and write its promtool (mode 755) into the venv.

    The binary is written beside its place and checked (``--version``) before one rename moves it
    in, so a failed install leaves any earlier promtool as it was.

    Returns:
        Its path (``<prefix>/bin/promtool``) and the first line of its ``--version``.

    Raises:
        BundleError: the download failed, the hash did not match, the package holds no promtool,
            or the unpacked binary does not run.
    """
    target = venv_promtool(prefix)
    binary = fetch_deb_file(read_deb_pin(PINS_FILE), PACKAGE_PATH, progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".promtool-", dir=target.parent) as temp:
        staged = Path(temp) / "promtool"
        staged.write_bytes(binary)
        staged.chmod(0o755)
        line = version(staged)
        os.replace(staged, target)
    return target, line


def locate() -> Path | None:
    """The promtool to run: ``$PROMTOOL`` where it is set, else the venv's, else one on ``PATH``."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    if (installed := venv_promtool()).exists():
        return installed
    found = shutil.which("promtool")
    return Path(found) if found else None
