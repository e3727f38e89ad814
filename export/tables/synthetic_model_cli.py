"""``synthetic-hot-cold``: an untrained DLRM of a preset's size, served hot/cold, for benchmarks.

The command line of :mod:`export.tables.synthetic_model`.

``python -m export.tables.synthetic_model_cli synthetic-hot-cold ...`` runs it on its own; ``python -m
export`` mounts :func:`synthetic_hot_cold` as ``python -m export synthetic-hot-cold``
(``app.command("synthetic-hot-cold")(synthetic_hot_cold)``). Not to be mixed up with
``python -m models random-dlrm``, which writes an untrained *checkpoint* for ``python -m export dlrm``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from bundle.cli import new_app, run
from bundle.repository import ServingConfig
from criteo.multihot import is_single_hot, parse_hotness
from criteo.profile import COUNTS_FILE, AccessProfile, read_profile
from criteo.tables import TABLE_SIZE_PRESETS, parse_table_sizes
from export.framework import SMALL_ROWS
from export.tables.hot_rows import parse_size
from export.tables.row_store import DTYPES, format_bytes
from export.tables.synthetic_model import (
    DEFAULT_OPSET,
    SMALL_MODEL,
    existing_random_store,
    make_random_hot_cold_dlrm,
    random_store_spec,
)
from models.config import DCN_PRESETS, PRESETS, DLRMConfig

app = new_app("An untrained DLRM of any preset's size, served hot/cold (random tables), for benchmarks.")


def _stderr() -> Console:
    """Progress bars go to stderr: stdout holds only what the command wrote."""
    return Console(stderr=True)


def load_profile(path: Path, table_sizes: tuple[int, ...], bags: bool = False) -> AccessProfile:
    """The access profile at ``path``: a folder ``python -m criteo profile`` wrote, or a Criteo TSV
    profiled here (ids reduced into ``table_sizes``, with a progress bar; ``bags``: a file of the
    multi-hot text format, every id of every bag a lookup)."""
    if path.is_dir() or path.name == COUNTS_FILE:  # nothing to count: no progress bar
        return read_profile(path)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        transient=True,
        console=_stderr(),
    ) as progress:
        task = progress.add_task(f"profiling {path}", total=None)
        return read_profile(path, table_sizes, on_rows=lambda n: progress.advance(task, n), bags=bags)


def synthetic_hot_cold(
    repository: Annotated[
        Path, typer.Option(help="Model repository to write dlrm_onnx and dlrm_small into.")
    ],
    store_dir: Annotated[
        Path,
        typer.Option(
            help="Folder of the row store (every row, memory-mapped); reused when it already holds this "
            "store (same sizes, dtype and seed), else written. Outside the repository's model folders."
        ),
    ],
    hot_budget: Annotated[
        str, typer.Option(help="Bytes of hot rows the dense model keeps (FP32 rows; 512M, 2G: binary units).")
    ],
    profile_data: Annotated[
        Path,
        typer.Option(
            help="Measured lookups that choose the hot rows: a folder `python -m criteo profile` wrote, "
            "or a Criteo TSV (profiled here)."
        ),
    ],
    preset: Annotated[
        str, typer.Option(help=f"DLRM layers and table sizes: {', '.join(PRESETS + DCN_PRESETS)}.")
    ] = "criteo-terabyte",
    table_sizes: Annotated[
        str | None,
        typer.Option(
            help=f"Other table sizes for the preset's layers: {' or '.join(TABLE_SIZE_PRESETS)}, one size "
            "for all 26, or 26 comma-separated sizes."
        ),
    ] = None,
    store_dtype: Annotated[str, typer.Option(help=f"Row store values: {' or '.join(DTYPES)}.")] = "float16",
    hotness: Annotated[
        str,
        typer.Option(
            help="Ids per bag of each table: mlperf, one count for all 26, or 26 comma-separated counts "
            "(1: one id per table). With bags, --profile-data and --heldout-data are files of the "
            "multi-hot text format (python -m criteo synth --hotness)."
        ),
    ] = "1",
    seed: Annotated[int, typer.Option(help="Seed of the table values and the layers.")] = 0,
    heldout_data: Annotated[
        Path | None,
        typer.Option(help="Held-out Criteo TSV: report the hot rows' hit rate on its lookups."),
    ] = None,
    small_rows: Annotated[
        int, typer.Option(help=f"Rows of each in-graph table of {SMALL_MODEL} (capped at the real size).")
    ] = SMALL_ROWS,
    store_path: Annotated[
        str | None,
        typer.Option(help="The store's path as the server sees it (e.g. inside a container)."),
    ] = None,
    stage_instances: Annotated[int, typer.Option(help="Embedding stage instances.")] = 1,
    instances: Annotated[int, typer.Option(help="Instances of the dense model and of dlrm_small.")] = 1,
    intra_op_threads: Annotated[
        int, typer.Option(help="ONNX Runtime threads per instance (0: its default).")
    ] = 0,
    opset: Annotated[int, typer.Option(help="ONNX opset.")] = DEFAULT_OPSET,
) -> None:
    """Write an untrained DLRM of a preset's size: random tables straight to a row store (streamed, never
    all in memory), the dense model with the hot rows (dlrm_onnx, an ensemble) and the same layers with
    small in-graph tables (dlrm_small); checked against the store."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    sizes = None if table_sizes is None else parse_table_sizes(table_sizes)
    counts = parse_hotness(hotness)
    config = dataclasses.replace(
        DLRMConfig.preset(preset, table_sizes=sizes), hotness=None if is_single_hot(counts) else counts
    )
    budget = parse_size(hot_budget)
    spec = random_store_spec(config, store_dtype)
    serving = ServingConfig(instances=instances, intra_op_threads=intra_op_threads, hotness=config.hotness)
    started = time.perf_counter()
    profile = load_profile(profile_data, config.table_sizes, bags=config.hotness is not None)
    profiled = time.perf_counter() - started
    reused = existing_random_store(store_dir, spec, seed) is not None
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
        disable=reused,
        console=_stderr(),
    ) as progress:
        task = progress.add_task(f"writing {format_bytes(spec.total_bytes)} of random rows", total=spec.rows)
        result = make_random_hot_cold_dlrm(
            repository,
            config,
            store_dir,
            store_dtype,
            budget,
            profile,
            seed,
            serving=serving,
            small_rows=small_rows,
            opset=opset,
            store_path=store_path,
            stage_instances=stage_instances,
            heldout_data=heldout_data,
            on_store_rows=lambda n: progress.advance(task, n),
        )
    for line in result.summary():
        print(line)
    print(
        f"profile: {profile.rows:,} rows from {profile_data} ({profiled:.1f} s); "
        f"total {time.perf_counter() - started:.1f} s"
    )


app.command("synthetic-hot-cold")(synthetic_hot_cold)


if __name__ == "__main__":
    run(app)
