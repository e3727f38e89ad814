"""Native start-up lines (bundle.native): held while a library loads, shown with --verbose or on an error."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from bundle.cli import set_verbose
    from bundle.native import quiet_native_stderr
    set_verbose(sys.argv[1] == "verbose")
    try:
        with quiet_native_stderr():
            os.write(2, b"I0000 native start-up line\\n")
            if sys.argv[2] == "fail":
                raise ImportError("the library did not load")
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
    print("command output", file=sys.stderr)
    """
)


def _stderr(verbose: str, outcome: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, verbose, outcome], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_native_lines_are_held_back() -> None:
    assert _stderr("quiet", "load") == "command output\n"


def test_verbose_lets_them_through_and_a_failed_import_shows_them() -> None:
    assert _stderr("verbose", "load") == "I0000 native start-up line\ncommand output\n"
    assert _stderr("quiet", "fail").splitlines() == [
        "I0000 native start-up line",
        "error: the library did not load",
        "command output",
    ]
