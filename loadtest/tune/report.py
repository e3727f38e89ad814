"""The files of a tune: ``report.md`` (winner vs default side by side with the loads each confirmed
config tried, time against the brute force, frontier, top-N with config.pbtxt diffs),
``report.json`` (everything) and ``frontier.png``, through the shared writer
(:mod:`loadtest.engine.writer`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bundle.records import RunRecord
from bundle.snippets import section_end, section_start
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown


def _step(trial: dict[str, Any]) -> list[Any]:
    client = trial["client"]
    return [
        trial["server_label"],
        f"B={client['batch_size']} c={client['concurrency']}",
        f"{trial['samples_per_s']:,.0f} [{trial['rate_low']:,.0f}, {trial['rate_high']:,.0f}]",
        f"{trial['p99_ms']:.2f}",
        f"{trial['p50_ms']:.2f}",
        trial["stop"]
        + (f", client-bound: {trial.get('bound_reason') or 'its CPU'}" if trial.get("client_bound") else ""),
    ]


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes: the run
#: down to the space searched, and the winner against the default, side by side.
SECTION_SUMMARY = "summary"
SECTION_WINNER = "winner"

STEP_HEADER = ["server config", "client", "samples/s [95 % CI]", "p99 ms", "p50 ms", "step ended"]


def _load(client: dict[str, Any]) -> str:
    return f"B={client['batch_size']} c={client['concurrency']}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def side_by_side_lines(document: dict[str, Any]) -> list[str]:
    """The section on the finalists and the default measured side by side: where each ended, the
    winner against the default, and every load each config tried with why it was kept or dropped."""
    budget = document["budget_ms"]
    policy = document["policy"]
    winner, default = document["winner"], document["default"]
    finalists = document["finalists"]
    others = sum(not entry["is_default"] for entry in finalists)
    rounds = _count(policy["confirm_rounds"], "round")
    lines = [
        "## Winner vs the cpu profile's default, measured side by side",
        "",
        section_start(SECTION_WINNER),
        f"The default's best step and the best step of the {others} fastest other configs, re-measured "
        f"in {rounds} in alternating order, each of {policy['confirm_windows']} windows of "
        f"{policy['window_s']:g} s, after the search; medians of the rounds. A config whose "
        f"median p99 is over {budget:g} ms (or that failed requests) steps its client load down (the "
        "next lower concurrency of the space, then the next lower batch size) and is measured again for "
        f"{rounds} beside every config still in, at most {_count(policy['step_downs'], 'time')}; "
        "the default follows the same rule. The winner is the fastest "
        f"whose median p99 holds {budget:g} ms at the load it ended at.",
        "",
    ]
    rows = []
    for entry in finalists:
        role = " + ".join(
            r for r, on in (("default", entry["is_default"]), ("**winner**", entry["is_winner"])) if on
        )
        confirmed = entry["confirmed"]
        rows.append(
            [
                role or "finalist",
                entry["server_label"],
                _load(entry["client"]),
                f"{entry['samples_per_s']:,.0f} ({entry['p99_ms']:.2f})",
                _load(confirmed["client"]),
                f"{confirmed['samples_per_s']:,.0f}",
                f"{confirmed['p99_ms']:.2f}" + ("" if entry["held"] else " (over)"),
            ]
        )
    if not default.get("best"):
        rows.append(["default", default["label"], "-", f"no step within {budget:g} ms", "-", "-", "-"])
    header = ["", "config", "search: client", "search: samples/s (p99 ms)", "side by side: client"]
    lines += table([*header, "samples/s", "p99 ms"], rows)
    lines.append("")
    if winner and default.get("held"):
        ratio = winner["confirmed"]["samples_per_s"] / default["confirmed"]["samples_per_s"]
        lines.append(f"Winner / default (side by side, same rounds): **{ratio:.2f}x**.")
    elif winner and default.get("confirmed"):
        tried = ", ".join(load["label"] for load in default["loads"])
        lines.append(
            f"The default held {budget:g} ms side by side at none of the loads it tried ({tried}): no ratio."
        )
    elif not winner:
        lines.append(f"No finalist held p99 within {budget:g} ms side by side, at any load tried: no winner.")
    lines.append(section_end(SECTION_WINNER))
    if finalists:
        lines += ["", "### Loads tried side by side", ""]
        steps = []
        for entry in finalists:
            name = entry["server_label"] + (" (default)" if entry["is_default"] else "")
            for load in entry["loads"]:
                per_round = ", ".join(f"{p99:.1f}" for p99 in load["rounds_p99_ms"])
                steps.append(
                    [name, load["label"], str(load["rounds"]), f"{load['samples_per_s']:,.0f}",
                     f"{load['p99_ms']:.2f}", per_round, load["reason"]]
                )  # fmt: skip
        columns = ["config", "client", "rounds", "samples/s", "p99 ms", "p99 ms per round", "verdict"]
        lines += table(columns, steps, align="lrrrrrl")
    return lines


def report_lines(document: dict[str, Any], command_note: str = "") -> list[str]:
    """The markdown page of a tune."""
    budget = document["budget_ms"]
    time = document["time"]
    space = document["space"]
    policy = document["policy"]
    lines = [
        f"# Tune: {document['family']}, p99 budget {budget:g} ms",
        "",
        section_start(SECTION_SUMMARY),
        *RunRecord.from_json(document).lines(),
        *([command_note] if command_note else []),
        *(
            [
                "- **Requests**: each row's text to the variant's raw-row model (`<model>_raw`), which "
                "parses it in the server; the config searched is the variant's"
            ]
            if document.get("raw")
            else []
        ),
        "",
    ]
    lines += side_by_side_lines(document)
    lines += [
        "",
        "## Measurement time",
        "",
        *table(
            ["", "seconds"],
            [
                ["tune's search (every window, warm-ups included)", f"{time['search_measured_s']:.0f}"],
                [
                    f"finalists vs default, side by side ({time['confirm_steps']} steps, step-downs in)",
                    f"{time['confirm_measured_s']:.0f}",
                ],
                ["brute force over the same space", f"{time['brute_force_s']:.0f}"],
            ],
        ),
        "",
        f"Brute force = {time['brute_force_rule']}: every grid point measured as long as the search's "
        f"longest step. Search / brute force = **{time['search_fraction']:.2f}** "
        f"({time['total_fraction']:.2f} with the side-by-side re-measurement); {time['steps_measured']} of "
        f"{space['grid_points']} grid points measured, {time['loads']} config loads, "
        f"search wall time {time['search_wall_s']:.0f} s. A step stops early as decided only when its "
        f"whole p99 interval lies at least {policy['p99_margin']:.0%} under the budget; closer, it runs "
        f"all {policy['max_windows']} windows (`near budget`).",
        "",
        "Space: variants " + ", ".join(space["variants"])
        + "; instances " + ", ".join(map(str, space["instances"]))
        + "; threads " + ", ".join(str(t) if t else "auto" for t in space["threads"])
        + "; max queue delay (us) " + ", ".join(map(str, space["queue_delays_us"]))
        + "; preferred " + ", ".join(",".join(map(str, p)) or "none" for p in space["preferred"])
        + "; batch " + ", ".join(map(str, space["batch_sizes"]))
        + "; concurrency " + ", ".join(map(str, space["concurrency"])) + ".",
        section_end(SECTION_SUMMARY),
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
