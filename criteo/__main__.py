"""``python -m criteo``: synthetic data, and the access skew of a file's embedding lookups."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from bundle.cli import new_app, run
from bundle.errors import ConfigError
from bundle.options import ReportOut, Seed, SyntheticRows, UserFeatures
from bundle.schema import FeatureSplit
from criteo.coverage import (
    DEFAULT_FRACTIONS,
    CoverageConfig,
    measure_coverage,
    parse_fractions,
    parse_row_bytes,
    write_coverage,
)
from criteo.multihot import is_single_hot, parse_bags
from criteo.options import CriteoFile, Hotness, MaxRows, TableSizes
from criteo.profile import AccessProfile, profile_file
from criteo.synth import SPREADS, SynthConfig, UserRequests, write_tsv
from criteo.tables import TABLE_SIZE_PRESETS, parse_table_sizes

#: ``--users`` here: how many users a ranking file's rows are drawn from (``models dlrmv3-users``
#: takes the flag as the count of users to write).
DistinctUsers = Annotated[
    int,
    typer.Option("--users", help="With --user-features: distinct users, drawn with a power-law popularity."),
]

app = new_app("Criteo-format data: synthetic generator, access-skew profiling.")

# ``--out`` means another thing in each command (others take it too: see bundle.options).
TsvOut = Annotated[Path, typer.Option("--out", help="The Criteo TSV file to write.")]
ProfileOut = Annotated[
    Path,
    typer.Option("--out", help="Folder for counts.npz (read by --profile), profile.json and coverage.png."),
]
# ``--candidates`` of python -m lab ranking-speed is a list of sizes, one step each.
Candidates = Annotated[
    int,
    typer.Option(
        "--candidates", help="With --user-features: candidates per user request (their mean, drawn)."
    ),
]
# ``--profile`` of python -m export is the serving profile.
AccessProfileDir = Annotated[
    Path, typer.Option("--profile", help="Folder that `python -m criteo profile` wrote.")
]


@app.command()
def synth(
    rows: SyntheticRows,
    out: TsvOut,
    seed: Seed = 0,
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
    hotness: Hotness = "1",
    user_features: UserFeatures[str | None] = None,
    candidates: Candidates = 128,
    candidate_spread: Annotated[
        str, typer.Option(help=f"With --user-features: {' or '.join(SPREADS)} candidates per request.")
    ] = "fixed",
    users: DistinctUsers = 10_000,
) -> None:
    """Write skewed synthetic click logs in the Criteo TSV format (or its multi-hot form); --seed
    draws the rows, --model-seed the hidden model that labels them. With --user-features, the rows
    come as ranking requests: runs of rows that share one user's features, a row per candidate."""
    bags = parse_bags(hotness)
    requests = None
    if user_features is not None:
        split = FeatureSplit.parse(user_features)
        requests = UserRequests(split, candidates=candidates, spread=candidate_spread, users=users)
    config = SynthConfig(
        rows=rows,
        seed=seed,
        model_seed=model_seed,
        exponent=exponent,
        max_vocabulary=max_vocabulary,
        vocabulary=None if vocabulary is None else parse_table_sizes(vocabulary),
        bags=None if not isinstance(bags, str) and is_single_hot(bags) else bags,
        users=requests,
    )
    with Progress(transient=True) as progress:
        task = progress.add_task(f"writing {out}", total=rows)
        write_tsv(config, out, on_rows=lambda n: progress.advance(task, n))
    print(f"wrote {rows} rows to {out}")


def _row_progress() -> Progress:
    """A progress bar counting rows (a pulsing bar when the total is unknown)."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.completed:,} rows"),
        TimeElapsedColumn(),
        transient=True,
    )


@app.command("profile")
def profile_command(
    data: CriteoFile,
    out: ProfileOut,
    table_sizes: TableSizes[str | None] = None,
    max_rows: MaxRows = None,
    bags: Annotated[
        bool,
        typer.Option(
            "--bags",
            help="The file is of the multi-hot text format (comma-separated ids per field, as "
            "`synth --hotness` writes): every id of every bag is a lookup.",
        ),
    ] = False,
) -> None:
    """Measure each table's access skew: lookups per id, and the share its hottest rows serve (ids
    counted raw unless --table-sizes reduces them into tables first)."""
    sizes = None if table_sizes is None else parse_table_sizes(table_sizes)
    with _row_progress() as progress:
        task = progress.add_task(f"profiling {data}", total=max_rows)
        profile = profile_file(data, sizes, max_rows, on_rows=lambda n: progress.advance(task, n), bags=bags)
    files = profile.save(out)
    top = profile.summary()["top_share"]
    print(
        f"profiled {profile.rows:,} rows ({profile.lookups:,} lookups, {profile.distinct:,} distinct rows) "
        f"of {data}: the hottest 0.1/1/10 % of rows serve "
        f"{top['0.001']:.1%} / {top['0.01']:.1%} / {top['0.1']:.1%} of lookups"
    )
    print(f"wrote {', '.join(str(p) for p in files.values())}")


@app.command("coverage")
def coverage_command(
    profile: AccessProfileDir,
    data: CriteoFile,
    out: ReportOut[Path],
    table_sizes: TableSizes[str | None] = None,
    row_bytes: Annotated[
        str, typer.Option(help="Bytes of one row: one value or 26 (DLRM dimension 16, FP32: 64).")
    ] = "64",
    fractions: Annotated[
        str, typer.Option(help="Hot budgets as fractions of the table bytes, comma-separated (0.1 or 10%).")
    ] = ",".join(f"{f:g}" for f in DEFAULT_FRACTIONS),
    max_rows: MaxRows = None,
) -> None:
    """Choose hot rows from a profile at several byte budgets and measure their hit rate on held-out
    data (--data; the profile's table sizes unless --table-sizes)."""
    measured = AccessProfile.load(profile)
    if table_sizes is not None:
        sizes = parse_table_sizes(table_sizes)
    elif measured.table_sizes is not None:
        sizes = measured.table_sizes
    else:
        raise ConfigError("--table-sizes is needed: the profile counted raw ids")
    config = CoverageConfig(
        table_sizes=sizes,
        row_bytes=parse_row_bytes(row_bytes),
        fractions=parse_fractions(fractions),
        max_rows=max_rows,
    )
    command = shlex.join(["python", "-m", "criteo", *sys.argv[1:]])
    with _row_progress() as progress:
        task = progress.add_task(f"scoring {data}", total=max_rows)
        result = measure_coverage(measured, data, config, lambda n: progress.advance(task, n), command)
    files = write_coverage(result, out)
    for r in result.results:
        if r.reference == "tables":
            print(
                f"budget {r.fraction * 100:g} % of the table bytes: {r.hot_rows:,} hot rows serve "
                f"{r.heldout_hit_rate:.2%} of held-out lookups (profiled: {r.expected_hit_rate:.2%})"
            )
    print(f"wrote {', '.join(str(p) for p in files.values())}")


if __name__ == "__main__":
    run(app)
