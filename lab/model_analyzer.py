"""``tune`` beside Triton Model Analyzer: the same model, search space and p99 budget.

A benchmark, not a test: ``python -m lab model-analyzer`` (``bash
benchmarks/model_analyzer/run.sh`` reproduces the committed report) runs, for
each model family:

1. Model Analyzer 1.58 (``model-analyzer profile``, brute search, local launch
   mode) over the family's FP32 model: instances 1 and 2 and max queue delay
   100 and 2000 us (its manual ``model_config_parameters``, plus the
   repository's own config, which it always measures), client batch sizes and
   concurrencies as given. It starts the bundle's tritonserver through
   ``python -m server tritonserver`` and drives it with perf_analyzer, fed the
   same rows as the bundle's engines. Its best measurement whose p99 is within
   a budget is its answer for that budget; one search answers every budget
   (it measures every point whatever the budget), and its time counts once
   per budget.
2. ``python -m loadtest tune`` over the same space (FP32, the same instances
   and queue delays, ONNX Runtime's default threads, no preferred sizes, the
   same client loads), once per budget.
3. Both answers re-measured side by side with perf_analyzer: one server holds
   both configs under two names, and perf_analyzer drives each at its own
   client load, in alternating order, ``rounds`` times; medians.

The report puts, per family and budget, each tool's answer, the re-measured
samples/s and p99, the ratio tune / Model Analyzer, and each search's wall time.
"""

from __future__ import annotations

import csv
import json
import logging
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord, machine_summary
from bundle.repository import CONFIG_NAME, read_config
from bundle.snippets import section_end, section_start
from loadtest.engine.payload import build_pool
from loadtest.engine.writer import table, write_json, write_markdown
from loadtest.sweeps import perf_analyzer as pa
from loadtest.tune.space import ServerPoint, candidate_config, config_text, model_name

logger = logging.getLogger(__name__)

#: Model Analyzer's table of every measurement (under its ``export_path``).
MA_RESULTS = Path("results") / "metrics-model-inference.csv"
#: Seconds one Model Analyzer search may take before it is stopped.
MA_TIMEOUT_S = 3600.0
#: The repository root (``python -m server`` and ``python -m loadtest`` run from it).
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class CompareOptions:
    """What to compare.

    Args:
        repository: an exported repository holding ``<family>_onnx`` of every family.
        families: ``dlrm``, ``wide_deep``.
        budgets_ms: p99 budgets.
        model_analyzer: the ``model-analyzer`` executable.
        work: scratch folder (repositories, logs, Model Analyzer's output).
        batch_sizes: the batch sizes tried, by both tools.
        concurrency: the client concurrencies tried, by both tools.
        instances: the instance counts tried, by both tools.
        queue_delays_us: the dynamic batcher's queue delays tried, by both tools.
        rounds: side-by-side rounds of the re-measurement.
        window_s: perf_analyzer's measurement window in the re-measurement.
        ma_candidates: Model Analyzer's best answers within a budget tried side by side, best
            first, until one holds the budget there.
    """

    repository: Path
    model_analyzer: Path
    work: Path
    families: tuple[str, ...] = ("dlrm", "wide_deep")
    budgets_ms: tuple[float, ...] = (10.0, 50.0)
    batch_sizes: tuple[int, ...] = (64, 1024)
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    instances: tuple[int, ...] = (1, 2)
    queue_delays_us: tuple[int, ...] = (100, 2000)
    rounds: int = 3
    window_s: float = 2.0
    ma_candidates: int = 3

    def __post_init__(self) -> None:
        if not self.families or not self.budgets_ms:
            raise ConfigError("name at least one family and one budget")
        if self.rounds < 1 or self.ma_candidates < 1:
            raise ConfigError(
                f"rounds and candidates must be >= 1, got {self.rounds} and {self.ma_candidates}"
            )
        if not self.model_analyzer.exists():
            raise ConfigError(
                f"no Model Analyzer at {self.model_analyzer}: install it into its own venv, e.g. "
                "`python -m venv artifacts/model_analyzer/venv && "
                "artifacts/model_analyzer/venv/bin/pip install triton-model-analyzer==1.58.0`"
            )


@dataclass(frozen=True)
class Answer:
    """One tool's best config and client load within a budget, as that tool measured it."""

    tool: str
    instances: int
    queue_delay_us: int
    batch_size: int
    concurrency: int
    samples_per_s: float
    p99_ms: float
    config: str = field(repr=False)


# ------------------------------------------------------------------ Model Analyzer
def ma_config(
    options: CompareOptions, model: str, repository: Path, input_data: Path, perf_analyzer: Path
) -> dict[str, Any]:
    """Model Analyzer's profile config (YAML is a superset of JSON, so it is written as JSON)."""
    from server.ports import free_ports

    http, grpc, metrics = free_ports(3)
    folder = (options.work / model / "model_analyzer").resolve()
    return {
        "model_repository": str(repository.resolve()),
        "output_model_repository_path": str(folder / "output_repository"),
        "override_output_model_repository": True,
        "export_path": str(folder / "export"),
        "checkpoint_directory": str(folder / "checkpoints"),
        "triton_launch_mode": "local",
        "triton_server_path": str((REPO_ROOT / "benchmarks" / "model_analyzer" / "tritonserver").resolve()),
        "triton_output_path": str(folder / "tritonserver.log"),
        "triton_http_endpoint": f"127.0.0.1:{http}",
        "triton_grpc_endpoint": f"127.0.0.1:{grpc}",
        "triton_metrics_url": f"http://127.0.0.1:{metrics}/metrics",
        "perf_analyzer_path": str(perf_analyzer),
        "perf_analyzer_flags": {"input-data": str(input_data.resolve())},
        "client_protocol": "grpc",
        "run_config_search_mode": "brute",
        # Its results tables (export/results) come with the summary reports; the detailed ones
        # are skipped.
        "skip_detailed_reports": True,
        "objectives": ["perf_throughput"],
        "profile_models": {
            model: {
                "cpu_only": True,
                "parameters": {
                    "batch_sizes": list(options.batch_sizes),
                    "concurrency": list(options.concurrency),
                },
                "model_config_parameters": {
                    "instance_group": [{"kind": "KIND_CPU", "count": list(options.instances)}],
                    "dynamic_batching": {"max_queue_delay_microseconds": list(options.queue_delays_us)},
                },
            }
        },
    }


def pa_binary() -> Path:
    """perf_analyzer, or one line saying how to get it."""
    from loadtest.sweeps.perf_analyzer_install import require

    return require()


def run_model_analyzer(
    options: CompareOptions, model: str, input_data: Path
) -> tuple[list[dict[str, Any]], float]:
    """Model Analyzer's search over ``model``: every measurement it made, and its wall time.

    Raises:
        BundleError: it failed, overran :data:`MA_TIMEOUT_S`, or wrote no results.
    """
    folder = options.work / model / "model_analyzer"
    shutil.rmtree(folder, ignore_errors=True)
    repository = folder / "repository"
    shutil.copytree(options.repository / model, repository / model, symlinks=True)
    config = ma_config(options, model, repository, input_data, pa_binary())
    config_path = folder / "config.yaml"
    config_path.write_text(json.dumps(config, indent=2))
    log_path = folder / "model_analyzer.log"
    argv = [str(options.model_analyzer.resolve()), "profile", "-f", str(config_path.resolve())]
    logger.info("Model Analyzer on %s (log %s)", model, log_path)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            completed = subprocess.run(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=MA_TIMEOUT_S,
                cwd=folder,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BundleError(f"Model Analyzer overran {MA_TIMEOUT_S:.0f} s (log: {log_path})") from None
    wall = time.perf_counter() - started
    results = Path(config["export_path"]) / MA_RESULTS
    if completed.returncode != 0 or not results.exists():
        lines = [line.strip() for line in log_path.read_text().splitlines() if line.strip()]
        raise BundleError(
            f"Model Analyzer failed (exit {completed.returncode}): {lines[-1] if lines else 'no output'} "
            f"(log: {log_path})"
        )
    with open(results, newline="") as handle:
        rows = [dict(row) for row in csv.DictReader(handle)]
    if not rows:
        raise BundleError(f"Model Analyzer measured nothing ({results})")
    return rows, wall


def _column(row: dict[str, Any], *words: str) -> str:
    """The value of the one column whose header holds every word (case-insensitive)."""
    for key, value in row.items():
        if key and all(word.lower() in key.lower() for word in words):
            return str(value)
    raise BundleError(f"Model Analyzer's results have no column with {words} (columns: {', '.join(row)})")


def ma_answers(
    rows: list[dict[str, Any]], budget_ms: float, output_repository: Path, count: int = 1
) -> list[Answer]:
    """Model Analyzer's ``count`` best measurements with p99 within ``budget_ms``, best first
    (empty: none held it)."""
    within = [row for row in rows if float(_column(row, "p99", "latency")) <= budget_ms]
    ranked = sorted(within, key=lambda row: float(_column(row, "throughput")), reverse=True)
    answers = []
    for row in ranked[:count]:
        config = read_config(output_repository / _column(row, "model config path") / CONFIG_NAME)
        answers.append(
            Answer(
                tool="Model Analyzer",
                instances=sum(group.count for group in config.instance_group) or 1,
                queue_delay_us=int(config.dynamic_batching.max_queue_delay_microseconds),
                batch_size=int(_column(row, "batch")),
                concurrency=int(_column(row, "concurrency")),
                samples_per_s=float(_column(row, "throughput")),
                p99_ms=float(_column(row, "p99", "latency")),
                config=config_text(config),
            )
        )
    return answers


# ------------------------------------------------------------------ tune
def run_tune(options: CompareOptions, family: str, budget_ms: float) -> tuple[Answer | None, float, Path]:
    """``python -m loadtest tune`` over the same space: its winner, wall time and report folder."""
    out = options.work / family / f"tune-{budget_ms:g}ms"
    argv = [
        sys.executable, "-m", "loadtest", "tune", "--repository", str(options.repository.resolve()),
        "--model", family, "--p99-budget-ms", f"{budget_ms:g}", "--variants", "fp32",
        "--instances", ",".join(map(str, options.instances)), "--threads", "0",
        "--queue-delay-us", ",".join(map(str, options.queue_delays_us)), "--preferred", "none",
        "--batch-sizes", ",".join(map(str, options.batch_sizes)),
        "--concurrency", ",".join(map(str, options.concurrency)), "--out", str(out.resolve()),
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "tune.log"
    logger.info("tune on %s at %g ms (log %s)", family, budget_ms, log_path)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        completed = subprocess.run(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT
        )
    wall = time.perf_counter() - started
    report = out / "report.json"
    if completed.returncode != 0 or not report.exists():
        raise BundleError(f"tune failed (exit {completed.returncode}; log: {log_path})")
    winner = json.loads(report.read_text())["winner"]
    if winner is None:
        return None, wall, out
    server = winner["server"]
    point = ServerPoint(
        variant=server["variant"], instances=int(server["instances"]), threads=int(server["threads"]),
        queue_delay_us=int(server["queue_delay_us"]), preferred=tuple(server.get("preferred") or ()),
    )  # fmt: skip
    confirmed = winner.get("confirmed") or winner
    client = confirmed.get("client") or winner["client"]
    base = read_config(options.repository / model_name(family, "fp32") / CONFIG_NAME)
    answer = Answer(
        tool="tune",
        instances=point.instances,
        queue_delay_us=point.queue_delay_us,
        batch_size=int(client["batch_size"]),
        concurrency=int(client["concurrency"]),
        samples_per_s=float(confirmed["samples_per_s"]),
        p99_ms=float(confirmed["p99_ms"]),
        config=config_text(candidate_config(base, point)),
    )
    return answer, wall, out


# ------------------------------------------------------------------ side by side
def remeasure(
    options: CompareOptions,
    family: str,
    budget_ms: float,
    answers: list[Answer],
    input_data: Path,
    attempt: int = 1,
) -> dict[str, dict[str, Any]]:
    """Each answer's config under its own name in one server, driven by perf_analyzer at its own
    client load, the answers taking turns ``rounds`` times; per tool, the rounds and medians.
    ``attempt`` numbers the side-by-side runs of one family and budget."""
    from server import LocalServer, ServerConfig

    model = model_name(family, "fp32")
    root = options.work / family / f"side-by-side-{budget_ms:g}ms-{attempt}"
    shutil.rmtree(root, ignore_errors=True)
    names: dict[str, str] = {}
    for answer in answers:
        name = f"{model}_{'ma' if answer.tool == 'Model Analyzer' else 'tune'}"
        names[answer.tool] = name
        shutil.copytree(options.repository / model, root / "repository" / name, symlinks=True)
        config = mc.ModelConfig()
        text_format.Parse(answer.config, config)
        config.name = name
        (root / "repository" / name / CONFIG_NAME).write_text(config_text(config))
    binary = pa_binary()
    rounds: dict[str, list[pa.Figures]] = {answer.tool: [] for answer in answers}
    server_config = ServerConfig.with_free_ports(root / "repository", log_file=root / "tritonserver.log")
    with LocalServer(server_config) as server:
        for index in range(options.rounds):
            order = answers if index % 2 == 0 else answers[::-1]
            for answer in order:
                name = names[answer.tool]
                run = pa.run_step(
                    binary, server.grpc_url, "grpc", name, answer.batch_size, answer.concurrency,
                    options.window_s, input_data, root / "steps" / f"{name}-{index + 1}", timeout_s=300.0,
                )  # fmt: skip
                logger.info(
                    "%s round %d: %.0f samples/s, p99 %.2f ms",
                    answer.tool, index + 1, run.figures.samples_per_s, run.figures.p99_ms,
                )  # fmt: skip
                rounds[answer.tool].append(run.figures)
    return {
        tool: {
            "samples_per_s": statistics.median(f.samples_per_s for f in figures),
            "p99_ms": statistics.median(f.p99_ms for f in figures),
            "p50_ms": statistics.median(f.p50_ms for f in figures),
            "rounds_samples_per_s": [f.samples_per_s for f in figures],
            "rounds_p99_ms": [f.p99_ms for f in figures],
        }
        for tool, figures in rounds.items()
    }


def best_holding(
    options: CompareOptions,
    family: str,
    budget_ms: float,
    candidates: list[Answer],
    tuned: Answer | None,
    input_data: Path,
) -> tuple[Answer | None, dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Model Analyzer's best answer that holds the budget side by side, each candidate measured
    beside tune's answer in turn, best first, until one holds it (or the candidates run out).

    Returns:
        the candidate compared (the one that held, else the last tried), the side-by-side figures
        of it and tune's answer, and the candidates passed over (each with its figures).
    """
    passed_over: list[dict[str, Any]] = []
    ma: Answer | None = None
    measured: dict[str, dict[str, Any]] = {}
    for attempt, candidate in enumerate(candidates or [None], start=1):
        if ma is not None:
            passed_over.append({"answer": asdict(ma), "side_by_side": measured[ma.tool]})
        ma = candidate
        answers = [a for a in (ma, tuned) if a is not None]
        measured = remeasure(options, family, budget_ms, answers, input_data, attempt) if answers else {}
        if ma is None or measured[ma.tool]["p99_ms"] <= budget_ms:
            break
    return ma, measured, passed_over


# ------------------------------------------------------------------ the run
def run_compare(options: CompareOptions, command: str) -> dict[str, Any]:
    """Every family and budget (see the module doc); the report's document."""
    record = RunRecord.begin(command)
    input_data = pa.write_input_data(build_pool(max(options.batch_sizes)), options.work / "input_data.json")
    cases: list[dict[str, Any]] = []
    for family in options.families:
        model = model_name(family, "fp32")
        if not (options.repository / model / CONFIG_NAME).exists():
            raise ConfigError(f"{options.repository} holds no {model}: export the {family} model first")
        rows, ma_wall = run_model_analyzer(options, model, input_data)
        output_repository = options.work / model / "model_analyzer" / "output_repository"
        for budget in options.budgets_ms:
            candidates = ma_answers(rows, budget, output_repository, options.ma_candidates)
            tuned, tune_wall, tune_out = run_tune(options, family, budget)
            ma, measured, passed_over = best_holding(options, family, budget, candidates, tuned, input_data)
            case = {
                "family": family,
                "model": model,
                "budget_ms": budget,
                "model_analyzer": None if ma is None else asdict(ma),
                "model_analyzer_passed_over": passed_over,
                "tune": None if tuned is None else asdict(tuned),
                "side_by_side": measured,
                "model_analyzer_s": ma_wall,
                "model_analyzer_points": len(rows),
                "tune_s": tune_wall,
                "tune_report": str(tune_out),
            }
            if ma is not None and tuned is not None:
                ours, theirs = measured["tune"], measured["Model Analyzer"]
                case["ratio"] = ours["samples_per_s"] / theirs["samples_per_s"]
            cases.append(case)
            logger.info("%s at %g ms: %s", family, budget, case.get("ratio"))
    record.finish()
    return {
        **record.to_json(),
        "space": {
            "variant": "fp32",
            "instances": list(options.instances),
            "queue_delays_us": list(options.queue_delays_us),
            "batch_sizes": list(options.batch_sizes),
            "concurrency": list(options.concurrency),
        },
        "rounds": options.rounds,
        "window_s": options.window_s,
        "ma_candidates": options.ma_candidates,
        "cases": cases,
    }


def _same(case: dict[str, Any]) -> bool:
    """Whether both tools answered with one config at one client load (their side-by-side
    ratio is then the noise of the measurement)."""
    ma, tuned = case["model_analyzer"], case["tune"]
    keys = ("instances", "queue_delay_us", "batch_size", "concurrency")
    return ma is not None and tuned is not None and all(ma[key] == tuned[key] for key in keys)


def verdict(case: dict[str, Any]) -> str:
    """One line: how tune's answer compares with Model Analyzer's, side by side, at one budget."""
    where = f"{case['family']} at {case['budget_ms']:g} ms"
    sides, budget = case["side_by_side"], case["budget_ms"]
    holds = {tool: tool in sides and sides[tool]["p99_ms"] <= budget for tool in ("tune", "Model Analyzer")}
    faster = f"tune {case['tune_s']:.0f} s against Model Analyzer {case['model_analyzer_s']:.0f} s"
    passed = len(case.get("model_analyzer_passed_over") or [])
    if not holds["tune"]:
        return f"{where}: tune's answer does not hold the budget side by side ({faster})."
    if not holds["Model Analyzer"] and not passed:
        return f"{where}: tune's answer holds the budget, Model Analyzer's does not ({faster})."
    if not holds["Model Analyzer"]:
        return (
            f"{where}: tune's answer holds the budget; none of Model Analyzer's best {passed + 1} "
            f"answers within the budget does side by side ({faster})."
        )
    ratio = case["ratio"]
    mine = (
        f"{passed} of Model Analyzer's answers did not hold the budget side by side; beside its best "
        "answer that did, "
        if passed
        else ""
    )
    if _same(case):
        return f"{where}: {mine}both chose the same config and load ({ratio:.2f}x is the noise; {faster})."
    if ratio >= 1.0:
        return f"{where}: {mine}tune's answer is at least Model Analyzer's, {ratio:.2f}x ({faster})."
    ours, theirs = (
        sides["tune"].get("rounds_samples_per_s"),
        sides["Model Analyzer"].get("rounds_samples_per_s"),
    )
    if ours and theirs and max(ours) >= min(theirs):
        return (
            f"{where}: {mine}tune's answer is {ratio:.2f}x of Model Analyzer's, within the rounds' spread "
            f"(tune {min(ours):,.0f} to {max(ours):,.0f} samples/s, Model Analyzer {min(theirs):,.0f} to "
            f"{max(theirs):,.0f}; {faster})."
        )
    return f"{where}: {mine}tune's answer is below Model Analyzer's, {ratio:.2f}x ({faster})."


def _answer_text(answer: dict[str, Any]) -> str:
    return (
        f"{answer['instances']} inst, delay {answer['queue_delay_us']} us, B={answer['batch_size']} "
        f"c={answer['concurrency']}"
    )


def write_report(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """``report.json`` and ``report.md`` in ``out``."""
    json_path = write_json(out / "report.json", document)
    space = {key: ", ".join(map(str, value)) if isinstance(value, list) else value
             for key, value in document["space"].items()}  # fmt: skip
    during = document["load_during"]
    lines = [
        "# tune beside Model Analyzer",
        "",
        f"- **Date (UTC)**: {document['started']} to {document['finished']}",
        f"- **Machine**: {machine_summary(document['machine'])}",
        f"- **Load average** (1 min) during the run: {during['min']}-{during['max']} "
        f"(median {during['median']}). The machine may be shared.",
        f"- **Command**: `{document['command']}`",
        f"- **Space, for both**: {space['variant'].upper()}; instances {space['instances']}; max queue "
        f"delay (us) {space['queue_delays_us']}; client batch {space['batch_sizes']}; concurrency "
        f"{space['concurrency']}; gRPC.",
        f"- **Side by side**: both answers in one server under two names, perf_analyzer at each answer's "
        f"own client load, {document['rounds']} rounds in alternating order, windows of "
        f"{document['window_s']:g} s; medians.",
        "",
        section_start("summary"),
    ]
    rows = []
    for case in document["cases"]:
        sides = case["side_by_side"]
        for passed in case.get("model_analyzer_passed_over") or []:
            answer, measured = passed["answer"], passed["side_by_side"]
            rows.append([
                case["family"], f"{case['budget_ms']:g}", "Model Analyzer, passed over",
                _answer_text(answer), f"{answer['samples_per_s']:,.0f} ({answer['p99_ms']:.2f})",
                f"{measured['samples_per_s']:,.0f}", f"{measured['p99_ms']:.2f}", "**no**", "", "",
            ])  # fmt: skip
        for tool, key in (("Model Analyzer", "model_analyzer"), ("tune", "tune")):
            answer = case[key]
            measured = sides.get(tool)
            rows.append([
                case["family"], f"{case['budget_ms']:g}", tool,
                "none within the budget" if answer is None else _answer_text(answer),
                "" if answer is None else f"{answer['samples_per_s']:,.0f} ({answer['p99_ms']:.2f})",
                "" if measured is None else f"{measured['samples_per_s']:,.0f}",
                "" if measured is None else f"{measured['p99_ms']:.2f}",
                "" if measured is None else ("yes" if measured["p99_ms"] <= case["budget_ms"] else "**no**"),
                f"{case['model_analyzer_s' if key == 'model_analyzer' else 'tune_s']:.0f}",
                "" if key == "model_analyzer" or "ratio" not in case else
                f"**{case['ratio']:.2f}x**" + (" (same answer)" if _same(case) else ""),
            ])  # fmt: skip
    lines += table(
        ["family", "p99 budget ms", "tool", "answer", "its own figure: samples/s (p99 ms)",
         "side by side: samples/s", "p99 ms", "holds the budget", "search s", "tune / MA"],
        rows, "lllllrrlrr",
    )  # fmt: skip
    lines += ["", *(f"- {verdict(case)}" for case in document["cases"])]
    lines += [
        section_end("summary"),
        "",
        "*Holds the budget*: the median p99 of the side-by-side rounds is within it. An answer that does "
        "not hold it is no answer at that budget, whatever its samples/s: Model Analyzer's next best "
        f"answer within the budget is then measured beside tune's, up to {document.get('ma_candidates', 1)} "
        "of them (*passed over*: those that did not hold it), and tune is compared with the first that "
        "holds it.",
        "Model Analyzer's search covers every budget at once (it measures every point); its time is the "
        "one search's, counted again for each budget. tune searches once per budget. *Same answer*: both "
        "chose one config at one client load, so their ratio is the run-to-run noise of the measurement.",
    ]
    md_path = write_markdown(out / "report.md", lines)
    return {"json": json_path, "markdown": md_path}
