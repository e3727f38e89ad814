"""``python -m criteo``: synthetic data and file inspection."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

from bundle.cli import new_app, run
from criteo.synth import SynthConfig, write_tsv
from criteo.tables import TABLE_SIZE_PRESETS, parse_table_sizes

app = new_app("Criteo-format data: synthetic generator.")


@app.command()
def synth(
    rows: Annotated[int, typer.Option(help="Rows to write.")],
    out: Annotated[Path, typer.Option(help="Output TSV file.")],
    seed: Annotated[int, typer.Option(help="Seed of the row sampling.")] = 0,
    model_seed: Annotated[int, typer.Option(help="Seed of the hidden labeling model.")] = 2026,
    exponent: Annotated[float, typer.Option(help="Power-law exponent of id frequencies.")] = 1.05,
    vocabulary: Annotated[
        str | None,
        typer.Option(
            help="Distinct ids per table: "
            f"{' or '.join(TABLE_SIZE_PRESETS)}, one size, or 26 comma-separated sizes "
            "(default: 26 sizes from 10 to --max-vocabulary)."
        ),
    ] = None,
    max_vocabulary: Annotated[int, typer.Option(help="Cap on any table's distinct ids.")] = 200_000,
) -> None:
    """Write skewed synthetic click logs in the Criteo TSV format."""
    config = SynthConfig(
        rows=rows,
        seed=seed,
        model_seed=model_seed,
        exponent=exponent,
        max_vocabulary=max_vocabulary,
        vocabulary=None if vocabulary is None else parse_table_sizes(vocabulary),
    )
    with Progress(transient=True) as progress:
        task = progress.add_task(f"writing {out}", total=rows)
        write_tsv(config, out, on_rows=lambda n: progress.advance(task, n))
    print(f"wrote {rows} rows to {out}")


if __name__ == "__main__":
    run(app)
