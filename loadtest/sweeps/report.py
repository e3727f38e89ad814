"""Sweep results as files: CSV and JSON, PNG curves, and a markdown report with the ratios.

A :class:`Report` holds every step of one run (several models, protocols,
batch sizes or servers), the in-process baselines, and where and how it was
measured. :func:`write_report` writes into one folder:

- ``steps.csv``: one row per step;
- ``report.json``: everything, including the machine, command and baselines;
- ``latency_vs_throughput.png``: p50 and p99 latency against samples/s, one
  panel per batch size, one curve per series;
- ``p99_vs_concurrency.png``: p99 latency against requests in flight;
- ``report.md``: the summary (served / in-process ratios, peers, engines
  side by side), the step table and the two charts.

A client-bound step (:mod:`loadtest.engine.client_cpu`) is flagged in every
one of them, and never taken as the server's best in a ratio. A step whose
engine gave no figures (:attr:`~loadtest.sweeps.steps.StepResult.failure`) keeps
its row in the CSV, the JSON and the step table, with its reason; the
summaries and the charts skip it.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundle.errors import DataError
from bundle.records import RunRecord
from bundle.snippets import section_end, section_start
from loadtest.engine.baseline import BaselineResult, ratio
from loadtest.engine.client_cpu import SERIAL_REASON, threshold_line
from loadtest.engine.server_cpu import SHARED_REASON
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.steps import StepResult, paired_ratios

CSV_FILE = "steps.csv"
JSON_FILE = "report.json"
MARKDOWN_FILE = "report.md"
THROUGHPUT_PNG = "latency_vs_throughput.png"
P99_PNG = "p99_vs_concurrency.png"
#: With several engines: each engine's samples/s against concurrency, beside perf_analyzer's.
ENGINES_PNG = "engines.png"
#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes:
#: everything below the title down to the curves (the engines' chart, beside its table, is in
#: it); the served / in-process tables; the peers against the primary server; the engines
#: against perf_analyzer; the steps table with its note.
SECTION_RESULTS = "results"
SECTION_SERVED_VS_IN_PROCESS = "served-vs-in-process"
SECTION_PEERS = "peers"
SECTION_ENGINES = "engines"
#: What each engine's client costs per request, by protocol and batch size.
SECTION_CLIENT_COSTS = "client-costs"
SECTION_STEPS = "steps"

#: The served / in-process throughput that a step at batch 1024 or more should reach, where a
#: batch's compute dwarfs the serving overhead (reports show it beside the measured ratios).
THROUGHPUT_RATIO_TARGET = 0.95

CSV_COLUMNS = (
    "label", "model", "protocol", "batch_size", "concurrency", "processes", "seconds",
    "requests", "errors", "requests_per_s", "samples_per_s",
    "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms",
    "engine", "client_cpu_us", "client_cores", "client_demand", "client_bound", "bound_reason",
    "shared_share",
    "rounds", "samples_per_s_min", "samples_per_s_max", "rows_sent", "distinct_rows",
    "server_requests", "server_executions", "server_batch", "server_queue_ms",
    "server_compute_input_ms", "server_compute_infer_ms", "server_compute_output_ms", "server_request_ms",
    "server_cores", "failure",
)  # fmt: skip


@dataclass
class Report:
    """One load-test run and where it ran.

    Attributes:
        title: what was measured, for the heading.
        record: the command, machine, dates and load across the run.
        steps: every step, in run order.
        baselines: in-process results by model name.
        settings: sweep and serving settings worth recording (JSON-ready).
        primary: the label of the bundle's own server (ratios are of its steps).
        notes: free-text lines shown under the heading.
    """

    title: str
    record: RunRecord
    steps: list[StepResult]
    baselines: dict[str, list[BaselineResult]] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    primary: str = "triton"
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            **self.record.to_json(),
            "settings": self.settings,
            "primary": self.primary,
            "notes": self.notes,
            "baselines": {model: [r.as_dict() for r in results] for model, results in self.baselines.items()},
            "steps": [step.as_dict() for step in self.steps],
            "summary": {
                "throughput": throughput_ratios(self),
                "latency": latency_ratios(self),
                "peers": peer_comparison(self),
                "engines": engine_comparison(self),
                "client_costs": client_costs(self) if engine_comparison(self) else [],
            },
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Report:
        try:
            return cls(
                title=document["title"],
                record=RunRecord.from_json(document),
                steps=[StepResult.from_dict(step) for step in document["steps"]],
                baselines={
                    model: [BaselineResult.from_dict(r) for r in results]
                    for model, results in document.get("baselines", {}).items()
                },
                settings=document.get("settings", {}),
                primary=document.get("primary", "triton"),
                notes=list(document.get("notes", [])),
            )
        except (KeyError, TypeError) as exc:
            raise DataError(f"not a load-test report: {exc}") from None

    @classmethod
    def load(cls, path: Path) -> Report:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"cannot read report {path}: {exc}") from None


# ------------------------------------------------------------------ summaries
def _baseline(report: Report, model: str, batch_size: int) -> BaselineResult | None:
    for result in report.baselines.get(model, []):
        if result.batch_size == batch_size:
            return result
    return None


#: A curve: (label, model, protocol, batch size, engine).
SeriesKey = tuple[str, str, str, int, str]


def _series(steps: Iterable[StepResult]) -> dict[SeriesKey, list[StepResult]]:
    """The steps with figures, by curve, concurrency ascending (a step without figures is on none)."""
    grouped: dict[SeriesKey, list[StepResult]] = defaultdict(list)
    for step in _measured(steps):
        grouped[(step.label, step.model, step.protocol, step.batch_size, step.engine)].append(step)
    for members in grouped.values():
        members.sort(key=lambda s: s.concurrency)
    return dict(grouped)


def _measured(steps: Iterable[StepResult]) -> list[StepResult]:
    """The steps that have figures."""
    return [step for step in steps if step.measured]


def _best(steps: list[StepResult]) -> StepResult:
    """The step with the highest rate that the client did not limit (the highest of all when
    every step was client-bound: the caller shows the flag)."""
    server_bound = [s for s in steps if not s.client_bound]
    return max(server_bound or steps, key=lambda s: s.samples_per_s)


def throughput_ratios(report: Report) -> list[dict[str, Any]]:
    """Per series of the primary server: its best samples/s that no client limited, against
    in-process at the same batch."""
    rows = []
    for (label, model, protocol, batch, engine), steps in _series(report.steps).items():
        if label != report.primary:
            continue
        top = _best(steps)
        base = _baseline(report, model, batch)
        rows.append(
            {
                "model": model,
                "protocol": protocol,
                "engine": engine,
                "batch_size": batch,
                "served_samples_per_s": top.samples_per_s,
                "at_concurrency": top.concurrency,
                "client_bound": top.client_bound,
                "in_process_samples_per_s": base.samples_per_s if base else math.nan,
                "ratio": ratio(top.samples_per_s, base.samples_per_s) if base else math.nan,
            }
        )
    return rows


def latency_ratios(report: Report) -> list[dict[str, Any]]:
    """Per series of the primary server: p50 at its lowest concurrency against in-process p50."""
    rows = []
    for (label, model, protocol, batch, engine), steps in _series(report.steps).items():
        if label != report.primary:
            continue
        lone = steps[0]
        base = _baseline(report, model, batch)
        rows.append(
            {
                "model": model,
                "protocol": protocol,
                "engine": engine,
                "client_bound": lone.client_bound,
                "batch_size": batch,
                "concurrency": lone.concurrency,
                "served_p50_ms": lone.p50_ms,
                "in_process_p50_ms": base.p50_ms if base else math.nan,
                "ratio": ratio(lone.p50_ms, base.p50_ms) if base else math.nan,
            }
        )
    return rows


def peer_comparison(report: Report) -> list[dict[str, Any]]:
    """The primary server against every other label, per model and batch size.

    For each peer: best samples/s of each (and their ratio), and p99 at each
    concurrency both ran (and at how many of those the primary's is lower).
    """
    rows = []
    by_key: dict[tuple[str, int], dict[str, list[StepResult]]] = defaultdict(dict)
    for (label, model, _protocol, batch, _engine), steps in _series(report.steps).items():
        by_key[(model, batch)].setdefault(label, []).extend(steps)
    for (model, batch), labels in sorted(by_key.items()):
        ours = labels.get(report.primary)
        if not ours:
            continue
        our_best = _best(ours)
        our_p99 = {s.concurrency: s.p99_ms for s in ours}
        for peer, theirs in sorted(labels.items()):
            if peer == report.primary:
                continue
            their_best = _best(theirs)
            their_p99 = {s.concurrency: s.p99_ms for s in theirs}
            common = sorted(set(our_p99) & set(their_p99))
            rows.append(
                {
                    "model": model,
                    "batch_size": batch,
                    "peer": peer,
                    "samples_per_s": our_best.samples_per_s,
                    "peer_samples_per_s": their_best.samples_per_s,
                    "throughput_ratio": ratio(our_best.samples_per_s, their_best.samples_per_s),
                    "p99_ms": {c: our_p99[c] for c in common},
                    "peer_p99_ms": {c: their_p99[c] for c in common},
                    "p99_lower_at": sum(1 for c in common if our_p99[c] < their_p99[c]),
                    "concurrency_levels": len(common),
                    "errors": sum(s.errors for s in ours),
                    "peer_errors": sum(s.errors for s in theirs),
                }
            )
    return rows


#: How close an engine's samples/s must come to perf_analyzer's to agree (a share of theirs).
AGREEMENT = 0.10


def engine_comparison(report: Report) -> list[dict[str, Any]]:
    """Each engine's step against perf_analyzer's at the same (model, protocol, batch, concurrency).

    The sweep runs each round of a step for every engine back to back, so the engines' rates are
    set beside each other round by round (:func:`~loadtest.sweeps.steps.paired_ratios`): the
    ``throughput_ratio`` is the median of those paired ratios, and ``spread`` is theirs
    (``(max - min) / median``), what the engines' difference moved by from round to round once
    the machine's own drift, which both saw, is divided out. Where the two steps do not have
    rounds to pair (one round, or a report written before rounds were recorded), the ratio is of
    their medians and the spread the larger of each side's own.

    ``agrees`` is judged where neither engine was client-bound: samples/s within
    :data:`AGREEMENT` and p50 within 10 % or 0.2 ms. A step whose spread is above the tolerance
    and whose rounds do not all give the same verdict on samples/s (below the band, within it,
    above it: two rounds on either side of it disagree too) is ``noisy`` instead (its rounds
    cannot tell the engines apart) and ``agrees`` is None, as it is for a client-bound one.
    So it is where ``server_differs``: the server's own compute time per row over the two steps'
    windows (``server_compute_ratio``, perf_analyzer's over the engine's) is outside the tolerance,
    so the two rates are of a server running at two speeds, not of two ways to measure one.
    """
    measured = _measured(report.steps)
    reference: dict[tuple[str, str, int, int], StepResult] = {
        (s.model, s.protocol, s.batch_size, s.concurrency): s for s in measured if s.engine == "perf_analyzer"
    }
    rows = []
    for step in measured:
        ref = reference.get((step.model, step.protocol, step.batch_size, step.concurrency))
        if step.engine == "perf_analyzer" or ref is None:
            continue
        both_server_bound = not (step.client_bound or ref.client_bound)
        pairs = paired_ratios(step, ref)
        if len(pairs) >= 2:
            throughput = _median(pairs)
            spread = (max(pairs) - min(pairs)) / throughput
            verdicts = {_side(pair) for pair in pairs}
        else:
            throughput = ratio(step.samples_per_s, ref.samples_per_s)
            spread = max(step.spread, ref.spread)
            verdicts = {-1, 0}  # the rounds' own verdicts are not known
        noisy = both_server_bound and spread > AGREEMENT and len(verdicts) > 1
        server_ratio = ratio(_compute_per_row(ref), _compute_per_row(step))
        server_differs = both_server_bound and not noisy and abs(server_ratio - 1.0) > AGREEMENT
        p50_close = abs(step.p50_ms - ref.p50_ms) <= max(0.2, 0.1 * ref.p50_ms)
        rows.append(
            {
                "model": step.model,
                "protocol": step.protocol,
                "batch_size": step.batch_size,
                "concurrency": step.concurrency,
                "engine": step.engine,
                "samples_per_s": step.samples_per_s,
                "reference_samples_per_s": ref.samples_per_s,
                "throughput_ratio": throughput,
                "p50_ms": step.p50_ms,
                "reference_p50_ms": ref.p50_ms,
                "client_cpu_us": step.client_cpu_us,
                "reference_client_cpu_us": ref.client_cpu_us,
                "client_cpu_ratio": ratio(step.client_cpu_us, ref.client_cpu_us),
                "client_serial_us": step.client_serial_us,
                "reference_client_serial_us": ref.client_serial_us,
                "client_bound": step.client_bound,
                "reference_client_bound": ref.client_bound,
                "flag": _flag(step),
                "reference_flag": _flag(ref),
                "round_ratios": pairs,
                "spread": spread,
                "noisy": noisy,
                "server_compute_ratio": server_ratio,
                "server_differs": server_differs,
                "agrees": (
                    (abs(throughput - 1.0) <= AGREEMENT and p50_close)
                    if both_server_bound and not noisy and not server_differs
                    else None
                ),
            }
        )
    return rows


def _side(ratio: float) -> int:
    """A round's verdict on samples/s: -1 below the band of :data:`AGREEMENT`, 0 within, 1 above."""
    if abs(ratio - 1.0) <= AGREEMENT:
        return 0
    return 1 if ratio > 1.0 else -1


def _compute_per_row(step: StepResult) -> float:
    """The server's own compute time per row of a step (input, inference and output, by its
    statistics over the step's window): a request shares its batch's time, so the mean per
    request over the rows per execution."""
    server = step.server
    if server is None or not server.batch > 0:
        return math.nan
    return (server.compute_input_ms + server.compute_infer_ms + server.compute_output_ms) / server.batch


def client_costs(report: Report) -> list[dict[str, Any]]:
    """Per protocol, batch size and engine: the median client CPU and serial client time per
    request over its measured steps, and the CPU's ratio to perf_analyzer's at the same batch
    and protocol (NaN where perf_analyzer has none)."""
    groups: dict[tuple[str, int, str], list[StepResult]] = defaultdict(list)
    for step in _measured(report.steps):
        groups[(step.protocol, step.batch_size, step.engine)].append(step)
    rows: list[dict[str, Any]] = []
    cpu_of: dict[tuple[str, int], float] = {}
    for (protocol, batch_size, engine), steps in sorted(groups.items(), key=lambda item: item[0]):
        cpu_us = _median([s.client_cpu_us for s in steps])
        if engine == "perf_analyzer":
            cpu_of[(protocol, batch_size)] = cpu_us
        rows.append(
            {
                "protocol": protocol,
                "batch_size": batch_size,
                "engine": engine,
                "steps": len(steps),
                "client_cpu_us": cpu_us,
                "client_serial_us": _median([s.client_serial_us for s in steps]),
            }
        )
    for row in rows:
        base = cpu_of.get((row["protocol"], row["batch_size"]), math.nan)
        row["cpu_ratio"] = ratio(row["client_cpu_us"], base) if not math.isnan(base) else math.nan
    return rows


def _median(values: list[float]) -> float:
    """The median of the values that are numbers (NaN: none is)."""
    numbers = sorted(v for v in values if not math.isnan(v))
    if not numbers:
        return math.nan
    middle = len(numbers) // 2
    return numbers[middle] if len(numbers) % 2 else (numbers[middle - 1] + numbers[middle]) / 2


def _agreement_counts(rows: list[dict[str, Any]]) -> str:
    """Per engine: how many judged steps agree with perf_analyzer, and why the others were not judged."""
    parts = []
    for engine in dict.fromkeys(row["engine"] for row in rows):
        mine = [row for row in rows if row["engine"] == engine]
        judged = [row["agrees"] for row in mine if row["agrees"] is not None]
        noisy = sum(1 for row in mine if row["noisy"])
        differs = sum(1 for row in mine if row.get("server_differs"))
        parts.append(
            f"{engine}: {sum(judged)} of {len(judged)} judged steps agree, "
            f"{len(mine) - len(judged) - noisy - differs} client-bound, {noisy} too noisy to judge, "
            f"{differs} on a server that computed at another speed"
        )
    return "; ".join(parts) + "."


def _verdict(row: dict[str, Any]) -> str:
    """The comparison's last column: yes, no, noisy (by how much), server differs (by how much),
    or - (client-bound)."""
    if row["noisy"]:
        paired = "paired rounds" if len(row.get("round_ratios") or ()) >= 2 else "rounds"
        return f"noisy: {paired} spread {row['spread']:.0%}"
    if row.get("server_differs"):
        times = row["server_compute_ratio"]
        return f"server differs: its compute per row under perf_analyzer {times:.2f} of this engine's"
    return "-" if row["agrees"] is None else ("yes" if row["agrees"] else "no")


def _flag(step: StepResult) -> str:
    if not step.measured:
        return f"no figures: {step.failure}"
    if not step.client_bound:
        return ""
    if SHARED_REASON in step.bound_reason:
        return f"client-bound: shares cores with the server, {step.shared_share:.0%} of their CPU"
    if SERIAL_REASON in step.bound_reason:
        return (
            f"client-limited: {step.client_serial_us:.0f} us of serial client time per request, "
            f"{step.client_serial_us / 1000 / step.mean_ms:.0%} of its mean latency"
        )
    return "client-bound: its own CPU"


# ------------------------------------------------------------------ files
def _row(step: StepResult) -> dict[str, Any]:
    row = {key: getattr(step, key) for key in CSV_COLUMNS if not key.startswith("server_")}
    server = step.server
    row.update(
        {
            "server_requests": server.requests if server else "",
            "server_executions": server.executions if server else "",
            "server_batch": server.batch if server else "",
            "server_queue_ms": server.queue_ms if server else "",
            "server_compute_input_ms": server.compute_input_ms if server else "",
            "server_compute_infer_ms": server.compute_infer_ms if server else "",
            "server_compute_output_ms": server.compute_output_ms if server else "",
            "server_request_ms": server.request_ms if server else "",
            "server_cores": step.server_cores,
        }
    )
    return row


def write_csv(steps: list[StepResult], path: Path) -> Path:
    """One row per step (full float precision)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_COLUMNS))
        writer.writeheader()
        for step in steps:
            writer.writerow(_row(step))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a ``steps.csv``."""
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _panels(report: Report, kind: str) -> list[Panel]:
    """One panel per batch size: latency against throughput, or p99 against concurrency (the
    steps without figures on no curve; a batch size none of whose steps has figures, a panel
    that says so)."""
    series = _series(report.steps)
    panels = []
    for batch in sorted({step.batch_size for step in report.steps}):
        curves: list[Series] = []
        bound: list[StepResult] = []
        for key, steps in sorted(series.items()):
            if key[3] != batch:
                continue
            engine = "" if key[4] == "locust" else f" [{key[4]}]"
            name, color = f"{key[0]} {key[1]} {key[2]}{engine}", " ".join((*key[:3], key[4]))
            bound += [s for s in steps if s.client_bound]
            if kind == "throughput":
                x = [s.samples_per_s for s in steps]
                notes = [(f"c{s.concurrency}", s.samples_per_s, s.p99_ms) for s in steps]
                curves.append(Series(f"{name} p50", x, [s.p50_ms for s in steps], "o-", color))
                curves.append(Series(f"{name} p99", x, [s.p99_ms for s in steps], "s--", color, notes))
            else:
                x = [s.concurrency for s in steps]
                curves.append(Series(f"{name} p99", x, [s.p99_ms for s in steps], "s-", color))
        if bound:
            # One marker over every point the client limited, whatever its curve.
            x = [s.samples_per_s if kind == "throughput" else s.concurrency for s in bound]
            curves.append(Series("client-bound step", x, [s.p99_ms for s in bound], "X", "client-bound"))
        if kind == "throughput":
            panels.append(
                Panel(f"latency vs throughput, batch {batch}", "throughput (samples/s)", "latency (ms)",
                      curves, ylog=True)
            )  # fmt: skip
        else:
            levels = sorted({s.concurrency for s in report.steps if s.batch_size == batch})
            panels.append(
                Panel(f"p99 vs concurrency, batch {batch}", "requests in flight (concurrency)",
                      "p99 latency (ms)", curves, xlog2=True, ylog=True, xticks=levels)
            )  # fmt: skip
    return panels


def _engine_panels(report: Report) -> list[Panel]:
    """One panel per (protocol, batch size) of the first model: samples/s against concurrency,
    one curve per engine, an x over each client-bound step (the steps without figures on none)."""
    model = report.steps[0].model
    panels = []
    for protocol, batch in sorted({(s.protocol, s.batch_size) for s in report.steps if s.model == model}):
        level = [s for s in report.steps if (s.model, s.protocol, s.batch_size) == (model, protocol, batch)]
        steps = _measured(level)
        curves = []
        for engine in dict.fromkeys(s.engine for s in steps):
            mine = sorted((s for s in steps if s.engine == engine), key=lambda s: s.concurrency)
            curves.append(
                Series(engine, [s.concurrency for s in mine], [s.samples_per_s for s in mine], "o-", engine)
            )
        bound = [s for s in steps if s.client_bound]
        if bound:
            curves.append(Series("client-bound step", [s.concurrency for s in bound],
                                 [s.samples_per_s for s in bound], "X", "client-bound"))  # fmt: skip
        levels = sorted({s.concurrency for s in level})
        panels.append(
            Panel(f"{model} {protocol}, batch {batch}", "requests in flight (concurrency)", "samples/s",
                  curves, xlog2=True, xticks=levels)
        )  # fmt: skip
    return panels


def markdown(report: Report) -> str:
    """The report as markdown (charts referenced by file name, beside it)."""
    lines = [f"# {report.title}", "", section_start(SECTION_RESULTS), *report.record.lines()]
    for key, value in report.settings.items():
        lines.append(f"- **{key}**: {value}")
    lines += [f"- {note}" for note in report.notes]
    lines += [
        f"- **No figures**: {s.series} c={s.concurrency}: {s.failure}" for s in report.steps if not s.measured
    ]
    if "Client-bound" not in report.settings:
        lines.append(f"- **Client-bound**: {threshold_line()}")
    lines.append("")

    throughput = throughput_ratios(report)
    served_vs_in_process = False
    if any(not math.isnan(row["ratio"]) for row in throughput):
        lines += ["## Served / in-process throughput", "", section_start(SECTION_SERVED_VS_IN_PROCESS)]
        served_vs_in_process = True
        lines += table(
            ["model", "protocol", "engine", "batch", "served samples/s (best not client-bound)",
             "at concurrency", "in-process samples/s", "served / in-process",
             f"target >= {THROUGHPUT_RATIO_TARGET}"],
            [
                [r["model"], r["protocol"], r["engine"], r["batch_size"], r["served_samples_per_s"],
                 f"{r['at_concurrency']}" + (" (client-bound: every step was)" if r["client_bound"] else ""),
                 r["in_process_samples_per_s"], r["ratio"],
                 "-" if math.isnan(r["ratio"]) or r["batch_size"] < 1024 or r["client_bound"]
                 else ("met" if r["ratio"] >= THROUGHPUT_RATIO_TARGET else "missed")]
                for r in throughput
            ],
        )  # fmt: skip
    latency = [r for r in latency_ratios(report) if r["batch_size"] == 1 and not math.isnan(r["ratio"])]
    if latency:
        if not served_vs_in_process:
            lines.append(section_start(SECTION_SERVED_VS_IN_PROCESS))
            served_vs_in_process = True
        else:
            lines.append("")
        lines += ["## Batch-1 latency, served / in-process", ""]
        lines += table(
            [
                "model",
                "protocol",
                "engine",
                "concurrency",
                "served p50 ms",
                "in-process p50 ms",
                "served / in-process",
            ],
            [
                [
                    r["model"],
                    r["protocol"],
                    r["engine"],
                    f"{r['concurrency']}" + (" (client-bound)" if r["client_bound"] else ""),
                    r["served_p50_ms"],
                    r["in_process_p50_ms"],
                    r["ratio"],
                ]
                for r in latency
            ],
        )
    if served_vs_in_process:
        lines += [section_end(SECTION_SERVED_VS_IN_PROCESS), ""]
    peers = peer_comparison(report)
    if peers:
        lines += [f"## {report.primary} against its peers", "", section_start(SECTION_PEERS)]
        lines += table(
            ["model", "batch", "peer", f"{report.primary} best samples/s", "peer best samples/s",
             "throughput ratio", "p99 lower than peer at", "errors (ours / peer)"],
            [
                [r["model"], r["batch_size"], r["peer"], r["samples_per_s"], r["peer_samples_per_s"],
                 r["throughput_ratio"], f"{r['p99_lower_at']} of {r['concurrency_levels']} levels",
                 f"{r['errors']} / {r['peer_errors']}"]
                for r in peers
            ],
        )  # fmt: skip
        lines += [section_end(SECTION_PEERS), ""]
    engines = engine_comparison(report)
    if engines:
        lines += ["## The engines against perf_analyzer (same server, steps interleaved)", ""]
        lines += [section_start(SECTION_ENGINES)]
        lines += table(
            ["model", "protocol", "batch", "concurrency", "engine", "samples/s", "perf_analyzer samples/s",
             "ratio", "p50 ms", "perf_analyzer p50 ms", "client CPU us/request", "perf_analyzer us/request",
             "serial client us/request", "perf_analyzer client us/request",
             "flag (engine)", "flag (perf_analyzer)", "agrees"],
            [
                [r["model"], r["protocol"], r["batch_size"], r["concurrency"], r["engine"],
                 r["samples_per_s"], r["reference_samples_per_s"], r["throughput_ratio"], r["p50_ms"],
                 r["reference_p50_ms"],
                 r["client_cpu_us"], r["reference_client_cpu_us"],
                 r["client_serial_us"], r["reference_client_serial_us"],
                 r["flag"].replace("|", "\\|") or "-", r["reference_flag"].replace("|", "\\|") or "-",
                 _verdict(r)]
                for r in engines
            ],
        )  # fmt: skip
        lines += [
            "",
            "Agrees: samples/s within 10 % of perf_analyzer's and p50 within 10 % or 0.2 ms, judged only "
            "where neither engine was client-bound. The ratio is the median over the rounds of the "
            "engine's samples/s over perf_analyzer's in the same round (the two ran back to back); "
            "noisy: those ratios spread more than 10 % and the rounds disagree on the verdict (below, "
            "within or above the band), so the "
            "step cannot tell the engines apart; server differs: the server's own compute time per "
            "row (its statistics over each step's window) differed by more than 10 % between the two "
            "steps, so their rates measure two speeds of the server, not the engines. "
            + _agreement_counts(engines)
            + " Serial client "
            "time: the bundle's engines measure it from an answer's arrival to the next request's "
            "send; perf_analyzer's is its own client send plus receive (its CSV).",
            section_end(SECTION_ENGINES),
            "",
            f"![each engine beside perf_analyzer]({ENGINES_PNG})",
            "",
        ]
        costs = client_costs(report)
        lines += ["## What each engine's client costs per request", "", section_start(SECTION_CLIENT_COSTS)]
        lines += table(
            ["protocol", "batch", "engine", "steps", "client CPU us/request (median)",
             "serial client us/request (median)", "CPU against perf_analyzer"],
            [
                [r["protocol"], r["batch_size"], r["engine"], r["steps"], r["client_cpu_us"],
                 r["client_serial_us"], r["cpu_ratio"]]
                for r in costs
            ],
        )  # fmt: skip
        lines += [
            "",
            "Medians over the steps of each batch size (every concurrency and model); CPU against "
            "perf_analyzer: the engine's median over perf_analyzer's.",
            section_end(SECTION_CLIENT_COSTS),
            "",
        ]
    if report.baselines:
        lines += ["## In-process ONNX Runtime (same files, same rows)", ""]
        lines += table(
            ["model", "provider", "batch", "threads", "samples/s (median)", "p50 ms", "p99 ms"],
            [
                [model, r.provider, r.batch_size, r.threads or "default", r.samples_per_s, r.p50_ms, r.p99_ms]
                for model, results in report.baselines.items()
                for r in results
            ],
        )
        lines.append("")
    lines += ["## Steps", "", section_start(SECTION_STEPS)]
    lines += table(
        ["server", "model", "protocol", "engine", "batch", "concurrency", "procs", "requests/s", "samples/s",
         "spread", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "errors", "client CPU us/request", "client cores",
         "server cores", "client", "server queue ms", "server compute ms", "server batch"],
        [
            [s.label, s.model, s.protocol, s.engine, s.batch_size, s.concurrency, s.processes,
             s.requests_per_s, s.samples_per_s, f"{s.spread:.0%} of {s.rounds}" if s.rounds > 1 else "-",
             s.p50_ms, s.p90_ms, s.p95_ms, s.p99_ms, s.errors, s.client_cpu_us, s.client_cores,
             s.server_cores, _flag(s).replace("|", "\\|") or "-",
             s.server.queue_ms if s.server else None, s.server.compute_infer_ms if s.server else None,
             s.server.batch if s.server else None]
            for s in report.steps
        ],
    )  # fmt: skip
    lines += [
        "",
        "Latencies are client-side (request built, sent, answered, decoded), from each request's exact "
        "time; server queue/compute are Triton's statistics over the same window, per request. "
        "Client CPU is the load generator's own (user + system, all its processes) over the window, "
        "per request; spread is (max - min) / median of samples/s over the step's rounds."
        + (
            " A step whose engine gave no figures keeps its row, its client column saying why."
            if not all(s.measured for s in report.steps)
            else ""
        ),
        section_end(SECTION_STEPS),
        section_end(SECTION_RESULTS),
        "",
        "## Curves",
        "",
        f"![latency vs throughput]({THROUGHPUT_PNG})",
        "",
        f"![p99 vs concurrency]({P99_PNG})",
        "",
    ]
    return "\n".join(lines)


def write_report(report: Report, out: Path) -> dict[str, Path]:
    """Write CSV, JSON, both PNGs and the markdown report into ``out``.

    Returns:
        The written files by kind (``csv``, ``json``, ``throughput_png``, ``p99_png``, ``markdown``).
    """
    if not report.steps:
        raise DataError("a report needs at least one step")
    out.mkdir(parents=True, exist_ok=True)
    extra = {}
    if len({step.engine for step in report.steps}) > 1:
        panels = _engine_panels(report)
        columns = len({step.batch_size for step in report.steps})
        extra["engines_png"] = plot(out / ENGINES_PNG, report.title, panels, columns=columns)
    return {
        **extra,
        "csv": write_csv(report.steps, out / CSV_FILE),
        "json": write_json(out / JSON_FILE, report.to_json()),
        "throughput_png": plot(out / THROUGHPUT_PNG, report.title, _panels(report, "throughput")),
        "p99_png": plot(out / P99_PNG, report.title, _panels(report, "p99")),
        "markdown": write_markdown(out / MARKDOWN_FILE, markdown(report).splitlines()),
    }
