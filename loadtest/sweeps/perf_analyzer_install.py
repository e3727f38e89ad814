"""perf_analyzer, Triton's own load tool, fetched from registry packages into the venv.

The binary ships in ``tritonclient`` 2.51's wheel (later wheels carry none,
and PyPI's ``perf-analyzer`` needs glibc 2.38). It links ``libcudart.so.12``
(PyPI's ``nvidia-cuda-runtime-cu12``) and ``libb64.so.0d`` (Debian's
``libb64-0d``, the one library no wheel carries). :func:`install` downloads
the three pinned files of ``requirements-perf-analyzer.txt``, checks their
SHA-256, and unpacks the binary and both libraries into
``<venv>/lib/perf_analyzer/``; ``<venv>/bin/perf_analyzer`` runs it with
them. No root, no system package: the Debian package is unpacked, not installed
(:mod:`bundle.downloads`).

:func:`locate` finds a working binary (``$PERF_ANALYZER``, the venv's, or one
on ``PATH``, as in NGC's SDK image); :func:`require` raises one line that says
how to get one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import loadtest
from bundle.downloads import DebPin, fetch_deb_file, parse_deb_pin
from bundle.errors import BundleError, ConfigError
from bundle.staging import write_file_atomically

REPO_ROOT = Path(loadtest.__file__).resolve().parent.parent
#: The pins: two wheels (pip's hash-checked format) and one Debian package (a ``# deb URL sha256=..`` line).
PINS_FILE = REPO_ROOT / "requirements-perf-analyzer.txt"
#: Environment variable naming a perf_analyzer binary to use instead.
ENV_VAR = "PERF_ANALYZER"
#: What to do when there is none, in one line.
HOW_TO_GET = (
    "install it with `make setup` or `python -m loadtest perf-analyzer install`, or set PERF_ANALYZER "
    "to a perf_analyzer binary (NGC's tritonserver SDK image has one: docker compose --profile sdk)"
)
_MEMBERS = {
    "tritonclient": ("bin/perf_analyzer", "perf_analyzer"),
    "nvidia-cuda-runtime-cu12": ("nvidia/cuda_runtime/lib/libcudart.so.12", "libcudart.so.12"),
}
#: Where Debian's libb64-0d installs the library.
LIBB64_PATH = "usr/lib/x86_64-linux-gnu/libb64.so.0d"


@dataclass(frozen=True)
class Pins:
    """What :func:`install` downloads.

    Attributes:
        wheels: pip requirement lines (``name==version --hash=sha256:...``).
        deb: the Debian package carrying ``libb64.so.0d``, by URL and SHA-256.
    """

    wheels: tuple[str, ...]
    deb: DebPin


def read_pins(path: Path = PINS_FILE) -> Pins:
    """The pins of ``requirements-perf-analyzer.txt``."""
    wheels: list[str] = []
    debs: list[DebPin] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if pin := parse_deb_pin(line):
            debs.append(pin)
        elif line and not line.startswith("#"):
            wheels.append(line)
    names = {re.split(r"[=<> ]", line, maxsplit=1)[0] for line in wheels}
    if len(debs) != 1 or names != set(_MEMBERS):
        wanted = ", ".join(sorted(_MEMBERS))
        raise ConfigError(f"{path} must pin {wanted} and hold one '# deb URL sha256=...' line")
    return Pins(tuple(wheels), debs[0])


def venv_home(prefix: Path | None = None) -> Path:
    """Where the binary and its libraries go: ``<prefix>/lib/perf_analyzer``."""
    return (prefix or Path(sys.prefix)) / "lib" / "perf_analyzer"


def venv_wrapper(prefix: Path | None = None) -> Path:
    """The command that runs it: ``<prefix>/bin/perf_analyzer``."""
    return (prefix or Path(sys.prefix)) / "bin" / "perf_analyzer"


def check(binary: Path) -> str | None:
    """None when ``binary --version`` runs; else why not, in one line (a missing library, say)."""
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary} does not run: {exc}"
    if done.returncode == 0 and "Perf Analyzer" in done.stdout + done.stderr:
        return None
    lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return f"{binary} does not run: {lines[-1] if lines else f'exit code {done.returncode}'}"


def locate() -> tuple[Path | None, str]:
    """A working perf_analyzer, or None with the reason in one line.

    Looks at ``$PERF_ANALYZER`` alone where it is set; else this venv's, then ``PATH``.
    """
    candidates: list[Path] = []
    if os.environ.get(ENV_VAR):
        # A binary named explicitly is the only one tried: never silently another.
        candidates.append(Path(os.environ[ENV_VAR]))
    else:
        candidates.append(venv_wrapper())
        if found := shutil.which("perf_analyzer"):
            candidates.append(Path(found))
    reasons = []
    for candidate in dict.fromkeys(candidates):
        if not candidate.exists():
            if os.environ.get(ENV_VAR):
                reasons.append(f"{ENV_VAR}={candidate} does not exist")
            continue
        reason = check(candidate)
        if reason is None:
            return candidate, ""
        reasons.append(reason)
    why = reasons[0] if reasons else "perf_analyzer is not installed"
    return None, f"{why}: {HOW_TO_GET}"


def require() -> Path:
    """A working perf_analyzer.

    Raises:
        ConfigError: there is none; the message says how to get one.
    """
    binary, reason = locate()
    if binary is None:
        raise ConfigError(reason)
    return binary


def install(prefix: Path | None = None, progress: Callable[[str], None] = lambda _: None) -> Path:
    """Download, check and unpack perf_analyzer and its two libraries into ``prefix`` (the venv).

    All or nothing: the files are unpacked beside their folder and moved in with one rename.

    Returns:
        The command that runs it (``<prefix>/bin/perf_analyzer``).

    Raises:
        BundleError: a download failed, a hash did not match, or the unpacked binary does not run.
    """
    pins = read_pins()
    home, wrapper = venv_home(prefix), venv_wrapper(prefix)
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".perf_analyzer-", dir=home.parent) as temp:
        work = Path(temp)
        staged = work / "perf_analyzer"
        staged.mkdir()
        progress("downloading the tritonclient 2.51 and CUDA runtime wheels (about 17 MiB)")
        requirements = work / "requirements.txt"
        requirements.write_text("\n".join(pins.wheels) + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--require-hashes", "-r", str(requirements), "-d", str(work / "wheels")],
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if done.returncode != 0:
            last = [line for line in done.stderr.splitlines() if line.strip()]
            why = last[-1] if last else f"exit code {done.returncode}"
            raise BundleError(f"pip could not download perf_analyzer's wheels: {why}")
        for wheel in sorted((work / "wheels").glob("*.whl")):
            project = wheel.name.split("-")[0].replace("_", "-")
            inside, name = _MEMBERS[project]
            with zipfile.ZipFile(wheel) as archive:
                member = next((m for m in archive.namelist() if m.endswith(inside)), None)
                if member is None:
                    raise BundleError(f"{wheel.name} holds no {inside}")
                (staged / name).write_bytes(archive.read(member))
        (staged / "libb64.so.0d").write_bytes(fetch_deb_file(pins.deb, LIBB64_PATH, progress))
        (staged / "perf_analyzer").chmod(0o755)
        reason = check_with_libraries(staged)
        if reason is not None:
            raise BundleError(reason)
        if home.exists():
            shutil.rmtree(home)
        staged.rename(home)
    write_file_atomically(wrapper, _wrapper_script().encode())
    wrapper.chmod(0o755)
    return wrapper


def _wrapper_script() -> str:
    return (
        "#!/bin/sh\n"
        "# perf_analyzer with the libraries beside it (python -m loadtest perf-analyzer install).\n"
        'home="$(cd "$(dirname "$0")/../lib/perf_analyzer" && pwd)"\n'
        'LD_LIBRARY_PATH="$home${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$home/perf_analyzer" "$@"\n'
    )


def check_with_libraries(folder: Path) -> str | None:
    """:func:`check` of ``folder/perf_analyzer`` with ``folder`` on the library path."""
    previous = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = str(folder) + (os.pathsep + previous if previous else "")
    try:
        return check(folder / "perf_analyzer")
    finally:
        if previous is None:
            del os.environ["LD_LIBRARY_PATH"]
        else:
            os.environ["LD_LIBRARY_PATH"] = previous
