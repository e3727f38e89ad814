"""``row-store`` commands: make, describe and check memory-mapped row stores (:mod:`export.tables.row_store`).

A sub-app for ``python -m export`` (``app.add_typer(row_store_cli.app, name="row-store")``);
``python -m export.tables.row_store_cli`` runs it on its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from bundle.cli import new_app, run
from bundle.options import Seed
from bundle.staging import RepositoryWrite
from criteo.options import TableSizes
from criteo.schema import CATEGORICAL_COLUMNS
from criteo.tables import parse_table_sizes
from export.tables.row_store import DTYPES, INITS, RowStore, RowStoreSpec, format_bytes, random_store

app = new_app("Row stores: every embedding row in one memory-mapped file (for hot/cold models).")

StorePath = Annotated[Path, typer.Argument(help="The store's folder.")]
# ``--out`` of other commands is another kind of output.
StoreOut = Annotated[
    Path, typer.Option("--out", help="Folder of the store to write (replaced, once the new one is complete).")
]


@app.command("random")
def random_command(
    out: StoreOut,
    table_sizes: TableSizes[str] = "criteo-terabyte",
    dim: Annotated[int, typer.Option(help="Embedding dimension.")] = 128,
    dtype: Annotated[str, typer.Option(help=f"Value type: {' or '.join(DTYPES)}.")] = "float16",
    wide: Annotated[
        bool, typer.Option("--wide/--no-wide", help="Add Wide & Deep's wide weight as one more column.")
    ] = False,
    init: Annotated[
        str, typer.Option(help=f"{' or '.join(INITS)}: uniform(+-sqrt(1/rows)) or uniform(+-0.05).")
    ] = "dlrm",
    seed: Seed = 0,
) -> None:
    """Write a store of random tables of a model's size, without training (for benchmarks); its
    values depend on --seed, the table and the row only."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    sizes = parse_table_sizes(table_sizes)
    spec = (RowStoreSpec.for_wide_deep if wide else RowStoreSpec.for_dlrm)(sizes, dim, dtype)
    started = time.perf_counter()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as progress:
        task = progress.add_task(f"writing {format_bytes(spec.total_bytes)} of rows", total=spec.rows)
        # Written beside --out, then moved in with one rename: an interrupted or failed write (a
        # full disk) leaves a store that was there as it was.
        with RepositoryWrite(out, f"row-store random {out}") as write:
            staged = write.staged / "store"
            random_store(staged, spec, seed=seed, init=init, on_rows=lambda n: progress.advance(task, n))
            write.put(staged, out)
            write.commit()
    seconds = time.perf_counter() - started
    print(
        f"wrote {spec.rows} rows x {spec.width} {spec.dtype} ({format_bytes(spec.total_bytes)}) "
        f"to {out} in {seconds:.1f} s ({spec.total_bytes / 1e9 / seconds:.2f} GB/s)"
    )


@app.command()
def info(path: StorePath) -> None:
    """Describe a store: rows, width, dtype, columns, size, where it came from."""
    store = RowStore.open(path)
    spec = store.spec
    columns = ", ".join(f"{name} {start}..{stop - 1}" for name, (start, stop) in spec.columns.items())
    print(f"{path}: {spec.rows} rows x {spec.width} {spec.dtype} ({format_bytes(spec.total_bytes)})")
    print(f"columns: {columns}")
    tables = zip(CATEGORICAL_COLUMNS, spec.table_sizes, strict=True)
    print("tables: " + ", ".join(f"{name}={size}" for name, size in tables))
    if store.description.get("metadata"):
        print(f"source: {store.description['metadata']}")


@app.command()
def verify(path: StorePath) -> None:
    """Read every byte of a store and check it against the SHA-256 recorded when it was written."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    store = RowStore.open(path)
    started = time.perf_counter()
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as progress:
        task = progress.add_task(f"reading {path}", total=store.spec.total_bytes)
        store.verify(on_bytes=lambda n: progress.advance(task, n))
    seconds = time.perf_counter() - started
    print(f"{path}: SHA-256 matches ({format_bytes(store.spec.total_bytes)} read in {seconds:.1f} s)")


if __name__ == "__main__":
    run(app)
