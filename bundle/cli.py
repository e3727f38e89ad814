"""Runs a typer app so that a BundleError becomes one line and exit code 1."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from bundle.errors import BundleError

_state = {"verbose": False}

VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and full tracebacks.")]


def new_app(help_text: str) -> typer.Typer:
    """A typer app with the shared ``--verbose`` option and logging set-up."""
    app = typer.Typer(
        help=help_text, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
    )

    @app.callback()
    def _main(verbose: VerboseOption = False) -> None:
        _state["verbose"] = verbose
        logging.basicConfig(
            level=logging.DEBUG if verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )

    return app


def run(app: typer.Typer) -> None:
    """Run ``app``; report a BundleError as ``error: ...`` and exit 1.

    typer (in standalone mode) handles usage errors itself and exits; any
    other exception passes through to here.
    """
    try:
        app()
    except BundleError as exc:
        if _state["verbose"]:
            logging.getLogger(__name__).exception("failed")
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
