"""Runs a typer app so that a BundleError becomes one line and exit code 1."""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from bundle.errors import BundleError
from bundle.staging import NO_SPACE, no_space_line

_state = {"verbose": False}

VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging and full tracebacks.")]


Command = TypeVar("Command", bound=Callable[..., Any])


def set_verbose(verbose: bool) -> None:
    """Turn on debug logging and full tracebacks (once on, it stays on for the process)."""
    if not verbose:
        return
    _state["verbose"] = True
    logging.getLogger().setLevel(logging.DEBUG)


def is_verbose() -> bool:
    """Whether ``--verbose`` was given (debug logging, full tracebacks, native libraries' start-up lines)."""
    return _state["verbose"]


def set_up_logging(verbose: bool) -> None:
    """The bundle's log format at INFO, and ``--verbose``'s debug logging and tracebacks."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    set_verbose(verbose)


def new_app(help_text: str) -> typer.Typer:
    """A typer app of subcommands with the shared ``--verbose`` option and logging set-up."""
    app = typer.Typer(
        help=help_text, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
    )

    @app.callback()
    def _main(verbose: VerboseOption = False) -> None:
        set_up_logging(verbose)

    return app


def single_command_app(command: Callable[..., Any]) -> typer.Typer:
    """A typer app that is one command (``PROG [OPTIONS]``, no subcommand name); ``command`` takes
    ``verbose: VerboseOption`` and calls :func:`set_up_logging` itself."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(command)
    return app


def shared_options(**builders: Callable[..., Any]) -> Callable[[Command], Command]:
    """Declare options once for several commands.

    Each keyword names a parameter of the decorated command and a builder
    function whose typer-annotated parameters become the command's options;
    the command receives the builder's return value in that parameter. So the
    options of, say, ``export dlrm`` and ``export wide-deep`` are declared in
    one function, with one default each, and build one options object.

    Example::

        def _common(repository: Repository = Path("repo"), verbose: VerboseOption = False) -> Options: ...

        @app.command()
        @shared_options(options=_common)
        def dlrm(options: Options, checkpoint: Annotated[Path, typer.Option()]) -> None: ...
    """

    def decorate(command: Command) -> Command:
        own = inspect.signature(command, eval_str=True)
        groups = {name: inspect.signature(builder, eval_str=True) for name, builder in builders.items()}
        missing = set(builders) - set(own.parameters)
        if missing:
            raise TypeError(f"{command.__name__} has no parameter {', '.join(sorted(missing))}")
        parameters = [p for name, p in own.parameters.items() if name not in builders]
        for group in groups.values():
            parameters += group.parameters.values()
        names = [p.name for p in parameters]
        if len(names) != len(set(names)):
            raise TypeError(f"{command.__name__}: an option is declared twice")

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            for name, builder in builders.items():
                kwargs[name] = builder(**{p: kwargs.pop(p) for p in groups[name].parameters})
            return command(**kwargs)

        # Keyword-only, so that options with and without defaults may come in any order.
        keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters]
        wrapper.__signature__ = own.replace(parameters=keyword)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


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
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        if _state["verbose"]:
            logging.getLogger(__name__).exception("failed")
        print(f"error: {no_space_line(exc)}", file=sys.stderr)
        sys.exit(1)
