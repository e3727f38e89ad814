"""``python -m criteo``: synthetic data and file inspection."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

from bundle.cli import new_app, run
from criteo.synth import SynthConfig, write_tsv

app = new_app("Criteo-format data: synthetic generator.")


@app.command()
def synth(
    rows: Annotated[int, typer.Option(help="Rows to write.")],
    out: Annotated[Path, typer.Option(help="Output TSV file.")],
    seed: Annotated[int, typer.Option(help="Seed of the row sampling.")] = 0,
    model_seed: Annotated[int, typer.Option(help="Seed of the hidden labeling model.")] = 2026,
    exponent: Annotated[float, typer.Option(help="Power-law exponent of id frequencies.")] = 1.05,
) -> None:
    """Write skewed synthetic click logs in the Criteo TSV format."""
    config = SynthConfig(rows=rows, seed=seed, model_seed=model_seed, exponent=exponent)
    with Progress(transient=True) as progress:
        task = progress.add_task(f"writing {out}", total=rows)
        write_tsv(config, out, on_rows=lambda n: progress.advance(task, n))
    print(f"wrote {rows} rows to {out}")


if __name__ == "__main__":
    run(app)
