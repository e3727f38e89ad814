"""The files of a tune: ``report.md`` (frontier, winner vs default, top-N with config.pbtxt diffs,
time against the brute force), ``report.json`` (everything) and ``frontier.png``, through the
shared writer (:mod:`loadtest.writer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bundle.records import RunRecord
from loadtest.writer import Panel, Series, plot, table, write_json, write_markdown


def _step(trial: dict[str, Any]) -> list[Any]:
    client = trial["client"]
    return [
        trial["server_label"],
        f"B={client['batch_size']} c={client['concurrency']}",
        f"{trial['samples_per_s']:,.0f} [{trial['rate_low']:,.0f}, {trial['rate_high']:,.0f}]",
        f"{trial['p99_ms']:.2f}",
        f"{trial['p50_ms']:.2f}",
        trial["stop"],
    ]


STEP_HEADER = ["server config", "client", "samples/s [95 % CI]", "p99 ms", "p50 ms", "step ended"]


def report_lines(document: dict[str, Any], command_note: str = "") -> list[str]:
    """The markdown page of a tune."""
    budget = document["budget_ms"]
    time = document["time"]
    space = document["space"]
    policy = document["policy"]
    winner, default = document["winner"], document["default"]
    others = sum(not entry["is_default"] for entry in document["finalists"])
    lines = [
        f"# Tune: {document['family']}, p99 budget {budget:g} ms",
        "",
        *RunRecord.from_json(document).lines(),
        *([command_note] if command_note else []),
        "",
        "## Winner vs the cpu profile's default, measured side by side",
        "",
        f"The default's best step and the best step of the {others} fastest other configs, re-measured "
        f"in {policy['confirm_rounds']} alternating rounds of {policy['confirm_windows']} "
        f"windows of {policy['window_s']:g} s after the search; medians of the rounds. The winner is the "
        f"fastest whose median p99 holds {budget:g} ms here.",
        "",
    ]
    rows = []
    for entry in document["finalists"]:
        role = " + ".join(
            r for r, on in (("default", entry["is_default"]), ("**winner**", entry["is_winner"])) if on
        )
        confirmed = entry["confirmed"]
        client = entry["client"]
        rows.append(
            [
                role or "finalist",
                entry["server_label"],
                f"B={client['batch_size']} c={client['concurrency']}",
                f"{entry['samples_per_s']:,.0f} ({entry['p99_ms']:.2f})",
                f"{confirmed['samples_per_s']:,.0f}",
                f"{confirmed['p99_ms']:.2f}" + ("" if confirmed["p99_ms"] <= budget else " (over)"),
            ]
        )
    if not document["default"].get("best"):
        rows.append(["default", default["label"], "-", f"no step within {budget:g} ms", "-", "-"])
    lines += table(
        ["", "config", "client", "search: samples/s (p99 ms)", "side by side: samples/s", "p99 ms"], rows
    )
    if winner and default.get("confirmed"):
        ratio = winner["confirmed"]["samples_per_s"] / default["confirmed"]["samples_per_s"]
        lines += ["", f"Winner / default (side by side, same run): **{ratio:.2f}x**."]
        if default["confirmed"]["p99_ms"] > budget:
            lines += [f"The default's step crossed {budget:g} ms side by side (its p99 above)."]
    elif not winner:
        lines += ["", f"No finalist held p99 within {budget:g} ms side by side: no winner."]
    lines += [
        "",
        "## Measurement time",
        "",
        *table(
            ["", "seconds"],
            [
                ["tune's search (every window, warm-ups included)", f"{time['search_measured_s']:.0f}"],
                ["finalists vs default, side by side", f"{time['confirm_measured_s']:.0f}"],
                ["brute force over the same space", f"{time['brute_force_s']:.0f}"],
            ],
        ),
        "",
        f"Brute force = {time['brute_force_rule']}: every grid point measured as long as the search's "
        f"longest step. Search / brute force = **{time['search_fraction']:.2f}** "
        f"({time['total_fraction']:.2f} with the side-by-side re-measurement); {time['steps_measured']} of "
        f"{space['grid_points']} grid points measured, {time['loads']} config loads, "
        f"search wall time {time['search_wall_s']:.0f} s.",
        "",
        "Space: variants " + ", ".join(space["variants"])
        + "; instances " + ", ".join(map(str, space["instances"]))
        + "; threads " + ", ".join(str(t) if t else "auto" for t in space["threads"])
        + "; max queue delay (us) " + ", ".join(map(str, space["queue_delays_us"]))
        + "; preferred " + ", ".join(",".join(map(str, p)) or "none" for p in space["preferred"])
        + "; batch " + ", ".join(map(str, space["batch_sizes"]))
        + "; concurrency " + ", ".join(map(str, space["concurrency"])) + ".",
        "",
        "## Throughput vs p99 frontier",
        "",
        "Steps no other step beats on both p99 and samples/s (![frontier](frontier.png)):",
        "",
        *table(STEP_HEADER, [_step(t) for t in document["frontier"]]),
        "",
        f"## Top {len(document['top'])} configurations within {budget:g} ms",
        "",
        *table(["#", *STEP_HEADER], [[str(i + 1), *_step(t)] for i, t in enumerate(document["top"])]),
        "",
    ]  # fmt: skip
    for index, entry in enumerate(document["top"]):
        lines += [f"### {index + 1}. {entry['server_label']} (`{entry['model']}`)", ""]
        diff = entry["diff"].rstrip("\n")
        lines += ["```diff", diff, "```", ""] if diff else ["Same config as the default.", ""]
    return lines


def plot_frontier(path: Path, document: dict[str, Any]) -> Path:
    """Every step (samples/s against p99), the frontier, and the budget."""
    trials = [t for t in document["trials"] if t["requests"] and not t["errors"]]
    frontier = document["frontier"]
    series = [
        Series("measured steps", [t["p99_ms"] for t in trials], [t["samples_per_s"] for t in trials], "o"),
        Series("frontier", [t["p99_ms"] for t in frontier], [t["samples_per_s"] for t in frontier], "s-",
               notes=[(f"{t['server_label']} B={t['client']['batch_size']} c={t['client']['concurrency']}",
                       t["p99_ms"], t["samples_per_s"]) for t in frontier]),
    ]  # fmt: skip
    panel = Panel(
        title=f"{document['family']}: samples/s vs p99",
        xlabel="p99 latency (ms)",
        ylabel="samples/s",
        series=series,
        vlines=[(document["budget_ms"], f"budget {document['budget_ms']:g} ms")],
    )
    return plot(path, f"tune {document['family']}, budget {document['budget_ms']:g} ms", [panel])


def write_tune(document: dict[str, Any], out: Path, command_note: str = "") -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and ``frontier.png`` into ``out``."""
    return {
        "json": write_json(out / "report.json", document),
        "png": plot_frontier(out / "frontier.png", document),
        "markdown": write_markdown(out / "report.md", report_lines(document, command_note)),
    }
