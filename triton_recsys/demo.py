"""``triton-recsys demo`` (what ``make demo`` runs): the whole path, locally.

synthetic Criteo data -> train DLRM (PyTorch) and Wide & Deep (Keras) ->
export both to ONNX FP32 + FP16 + INT8 with parity and accuracy checks ->
model_repository/ -> the real local tritonserver -> one HTTP and one gRPC
request per model, checked against ONNX Runtime in-process -> a short locust
sweep of both families over gRPC and HTTP (reports/demo/report.md, PNG
curves, served / in-process ratios).

Each stage runs as its own ``python -m`` process, so TensorFlow and PyTorch
never load into one process. The demo belongs to the console script, above
every stage: it drives each stage as a user would, starts the local server,
checks the answers with the clients, and ends with a load test.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from bundle.cli import VerboseOption, set_up_logging, single_command_app
from bundle.errors import BundleError, ConfigError
from bundle.options import RepositoryOut, SyntheticRows, TableSize

console = Console()

# The demo trains both families, so it takes only the presets both have (python -m models' --preset
# offers more).
DemoPreset = Annotated[str, typer.Option("--preset", help="Model preset: tiny, small, reference.")]


def _step(title: str, *args: str) -> None:
    command = [sys.executable, "-m", *args]
    console.rule(f"[bold]{title}")
    console.print(f"$ {shlex.join(['python', '-m', *args])}", style="dim")
    started = time.perf_counter()
    completed = subprocess.run(command, env=os.environ.copy(), check=False)
    if completed.returncode != 0:
        raise BundleError(f"step '{title}' failed (exit {completed.returncode}): {shlex.join(command)}")
    console.print(f"done in {time.perf_counter() - started:.1f} s", style="green")


@dataclass(frozen=True)
class DemoOptions:
    """What the demo builds and serves (the defaults are those of ``triton-recsys demo``).

    Args:
        workdir: where data and checkpoints go.
        repository: the model repository to write and serve.
        rows: synthetic training rows.
        preset: model preset (``tiny``, ``small``, ``reference``).
        table_size: rows per embedding table.
        tolerance: largest served vs in-process difference accepted.
        report: folder of the load-test report.
        sweep_seconds: seconds per load-test step (0: no load test).
    """

    workdir: Path
    repository: Path
    rows: int
    preset: str
    table_size: int
    tolerance: float
    report: Path
    sweep_seconds: float

    def __post_init__(self) -> None:
        if self.rows < 1 or self.table_size < 1:
            raise ConfigError(f"rows and table size must be >= 1, got {self.rows} and {self.table_size}")
        if self.tolerance < 0 or self.sweep_seconds < 0:
            raise ConfigError("tolerance and sweep seconds must be >= 0")


def run_demo(options: DemoOptions) -> None:
    """Run every stage of the bundle on this machine (no Docker, no GPU)."""
    from clients.verify import sample_rows, verify_repository
    from server.config import ServerConfig
    from server.launcher import LocalServer

    workdir, repository, rows, preset = options.workdir, options.repository, options.rows, options.preset
    table_size, tolerance, report = options.table_size, options.tolerance, options.report
    sweep_seconds = options.sweep_seconds
    started = time.perf_counter()
    data = workdir / "data"
    train_file, valid_file = data / "train.tsv", data / "valid.tsv"
    _step(
        "synthetic training data",
        "criteo",
        "synth",
        "--rows",
        str(rows),
        "--out",
        str(train_file),
        "--seed",
        "1",
    )
    _step(
        "synthetic validation data",
        "criteo",
        "synth",
        "--rows",
        "20000",
        "--out",
        str(valid_file),
        "--seed",
        "2",
    )
    common = ["--data", str(train_file), "--valid", str(valid_file), "--preset", preset]
    common += ["--table-size", str(table_size)]
    _step("train DLRM (PyTorch)", "models", "train", "dlrm", *common, "--out", str(workdir / "dlrm"))
    _step(
        "train Wide & Deep (Keras)",
        "models",
        "train",
        "wide-deep",
        *common,
        "--out",
        str(workdir / "wide_deep"),
    )
    export = ["--repository", str(repository), "--check-data", str(valid_file)]
    export += ["--calibration-data", str(train_file)]
    _step("export DLRM", "export", "dlrm", "--checkpoint", str(workdir / "dlrm"), *export)
    _step("export Wide & Deep", "export", "wide-deep", "--saved-model", str(workdir / "wide_deep"), *export)

    console.rule("[bold]serve with the local tritonserver and verify")
    batch = sample_rows(valid_file, 64)
    config = ServerConfig.with_free_ports(repository, log_file=workdir / "tritonserver.log")
    with LocalServer(config) as server:
        console.print(f"tritonserver pid {server.pid}: http {server.http_url}, grpc {server.grpc_url}")
        results = verify_repository(repository, server.http_url, server.grpc_url, batch)
    table = Table(title=f"served vs ONNX Runtime in-process ({len(batch)} rows per request)")
    for column in ("model", "HTTP max abs diff", "gRPC max abs diff"):
        table.add_column(column)
    for r in results:
        table.add_row(r.model, f"{r.http_max_abs_diff:.2e}", f"{r.grpc_max_abs_diff:.2e}")
    console.print(table)
    failed = [r.model for r in results if r.max_abs_diff > tolerance]
    if failed:
        raise BundleError(f"served outputs differ from in-process by more than {tolerance:g}: {failed}")
    if sweep_seconds > 0:
        served = [r.model for r in results]
        models = [_served_variant(served, family) for family in ("dlrm", "wide_deep")]
        sweep = ["sweep", *[arg for m in models for arg in ("--model", m)], "--protocol", "grpc"]
        sweep += ["--protocol", "http", "--repository", str(repository), "--data", str(valid_file)]
        sweep += ["--batch-size", "64", "--concurrency", "1,2,4", "--duration", f"{sweep_seconds:g}"]
        sweep += [
            "--warmup",
            "1",
            "--baseline-seconds",
            "0.5",
            "--baseline-repeats",
            "3",
            "--out",
            str(report),
        ]
        sweep += ["--title", "Demo load test: the cpu profile's models on the local tritonserver"]
        _step("load test (locust sweep)", "loadtest", *sweep)
        console.print(f"load-test report: [bold]{report / 'report.md'}[/bold] (PNG curves beside it)")
    console.print(f"[green]demo finished in {time.perf_counter() - started:.0f} s[/green]")


def _served_variant(models: list[str], family: str) -> str:
    """The model the cpu profile serves for ``family``, among the repository's ``models``: its
    INT8 variant when the export wrote it (it passed the accuracy gate), else FP32."""
    int8 = f"{family}_onnx_int8"
    return int8 if int8 in models else f"{family}_onnx"


def demo(
    workdir: Annotated[Path, typer.Option(help="Where data and checkpoints go.")] = Path("artifacts/demo"),
    repository: RepositoryOut = Path("model_repository"),
    rows: SyntheticRows = 200_000,
    preset: DemoPreset = "small",
    table_size: TableSize[int] = 20_000,
    tolerance: Annotated[float, typer.Option(help="Max served vs in-process difference.")] = 1e-6,
    report: Annotated[Path, typer.Option(help="Folder of the load-test report.")] = Path("reports/demo"),
    sweep_seconds: Annotated[float, typer.Option(help="Seconds per load-test step (0: no load test).")] = 3.0,
    verbose: VerboseOption = False,
) -> None:
    """Run every stage of the bundle on this machine (no Docker, no GPU): synthetic data, training,
    export, the local tritonserver, served answers checked, a load test. `make demo` runs this."""
    set_up_logging(verbose)
    run_demo(DemoOptions(workdir, repository, rows, preset, table_size, tolerance, report, sweep_seconds))


app = single_command_app(demo)
