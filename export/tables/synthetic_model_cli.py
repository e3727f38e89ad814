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
from bundle.options import RepositoryOut, Seed
from bundle.repository import ServingConfig
from criteo.multihot import is_single_hot, parse_hotness
from criteo.options import Hotness, TableSizes
from criteo.profile import COUNTS_FILE, AccessProfile, read_profile
from criteo.tables import parse_table_sizes
from export.cli_options import HotBudget, Instances, Opset, ProfileData, StageInstances, StoreDtype
from export.framework import SMALL_ROWS
from export.tables.hot_rows import parse_size
from export.tables.row_store import format_bytes
from export.tables.synthetic_model import (
    DEFAULT_OPSET,
    SMALL_MODEL,
    existing_random_store,
    make_random_hot_cold_dlrm,
    random_store_spec,
)
from models.config import DLRMConfig
from models.options import Preset

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
    repository: RepositoryOut,
    store_dir: Annotated[
        Path,
        typer.Option(
            help="Folder of the row store (every row, memory-mapped); reused when it already holds this "
            "store (same sizes, dtype and seed), else written. Outside the repository's model folders."
        ),
    ],
    hot_budget: HotBudget[str],
    profile_data: ProfileData[Path],
    preset: Preset = "criteo-terabyte",
    table_sizes: TableSizes[str | None] = None,
    store_dtype: StoreDtype = "float16",
    hotness: Hotness = "1",
    seed: Seed = 0,
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
    stage_instances: StageInstances = 1,
    instances: Instances = 1,
    intra_op_threads: Annotated[
        int, typer.Option(help="ONNX Runtime threads per instance (0: its default).")
    ] = 0,
    opset: Opset = DEFAULT_OPSET,
) -> None:
    """Write an untrained DLRM of a preset's size (or of the preset's layers and --table-sizes) into
    --repository: random tables straight to a row store (streamed, never all in memory), the dense
    model with the hot rows (dlrm_onnx, an ensemble) and the same layers with small in-graph tables
    (dlrm_small); checked against the store. --seed draws the table values and the layers."""
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
