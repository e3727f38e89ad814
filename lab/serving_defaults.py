"""Which serving settings the cpu profile should default to, by measurement through the local server.

For each model, a scratch repository holds it under its own name with links
to the exported files and a config.pbtxt per candidate (:data:`CANDIDATES`):
ONNX Runtime intra-op threads, instance count, dynamic batcher delay and
preferred sizes. Each candidate is loaded in turn into one tritonserver
(explicit model control) and driven at batch 1024 and at batch 1 with a few
concurrencies; the candidates take ``rounds`` turns in alternating order, so
background load hits them alike, and medians are reported.

Graph optimization levels are compared in-process (both the local backend
and Triton's C++ onnxruntime backend default to all optimizations), with the
in-process timer (:mod:`loadtest.engine.timer`); served steps run on the closed-loop
driver (:func:`loadtest.engine.served.served_throughput`).
``python -m lab serving-defaults`` writes ``serving_defaults.json`` and
``.md``; ``benchmarks/cpu/run.sh`` reproduces the committed ones.
"""

from __future__ import annotations

import logging
import shutil
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bundle.errors import ConfigError
from bundle.onnx_session import inference_session
from bundle.records import RunRecord
from bundle.repository import MODEL_FILE, ServingConfig, build_config, version_dir, write_config
from bundle.schema import OUTPUT
from bundle.snippets import name_for, section_end, section_start
from loadtest.engine.payload import MAX_POOL_ROWS, PayloadPool, build_pool
from loadtest.engine.served import served_throughput
from loadtest.engine.timer import TimerConfig, time_calls
from loadtest.engine.writer import table, write_json, write_markdown

logger = logging.getLogger(__name__)

#: The settings tried: name -> changes to the cpu profile's ServingConfig.
CANDIDATES: dict[str, dict[str, Any]] = {
    "1 inst x default threads, delay 100": {"instances": 1, "intra_op_threads": 0, "max_queue_delay_us": 100},
    "1 inst x 2 threads, delay 0": {"instances": 1, "intra_op_threads": 2, "max_queue_delay_us": 0},
    "1 inst x 2 threads, delay 100": {"instances": 1, "intra_op_threads": 2, "max_queue_delay_us": 100},
    "1 inst x 2 threads, delay 1000": {"instances": 1, "intra_op_threads": 2, "max_queue_delay_us": 1000},
    "1 inst x 1 thread, delay 100": {"instances": 1, "intra_op_threads": 1, "max_queue_delay_us": 100},
    "2 inst x 1 thread, delay 100": {"instances": 2, "intra_op_threads": 1, "max_queue_delay_us": 100},
    "2 inst x 1 thread, delay 1000": {"instances": 2, "intra_op_threads": 1, "max_queue_delay_us": 1000},
    "2 inst x 2 threads, delay 100": {"instances": 2, "intra_op_threads": 2, "max_queue_delay_us": 100},
    "1 inst x 2 threads, delay 1000, preferred 16,64": {
        "instances": 1,
        "intra_op_threads": 2,
        "max_queue_delay_us": 1000,
        "preferred_batch_sizes": (16, 64),
    },
}
#: Why served batch-1024 throughput fell at concurrency 2 and 4: each candidate
#: isolates one hypothesis against the old default (ONNX Runtime's spinning on) and the new one.
#: Spinning idle intra-op threads taking the cores that tritonserver, the stub and the client
#: need; the dynamic batcher merging two 1024-row requests into one 2048-row batch (max batch
#: 1024 forbids it, preferred 1024 avoids it); the intra-op pool oversubscribing 2 cores
#: (1 thread; 2 instances x 1).
#: The candidates above take the cpu profile's spinning and preferred-size defaults (on, none);
#: these name both.
CONCURRENCY_CANDIDATES: dict[str, dict[str, Any]] = {
    "1 inst x default threads, spin on, delay 100": {"intra_op_spinning": True, "preferred_batch_sizes": ()},
    "1 inst x default threads, spin off, delay 100": {
        "intra_op_spinning": False,
        "preferred_batch_sizes": (),
    },
    "1 inst x default threads, spin on, delay 100, max batch 1024": {
        "intra_op_spinning": True,
        "max_batch_size": 1024,
        "preferred_batch_sizes": (),
    },
    "1 inst x default threads, spin off, delay 100, max batch 1024": {
        "intra_op_spinning": False,
        "max_batch_size": 1024,
        "preferred_batch_sizes": (),
    },
    "1 inst x default threads, spin off, delay 100, preferred 1024": {
        "intra_op_spinning": False,
        "preferred_batch_sizes": (1024,),
    },
    "1 inst x 1 thread, spin off, delay 100": {
        "intra_op_threads": 1,
        "intra_op_spinning": False,
        "preferred_batch_sizes": (),
    },
    "2 inst x 1 thread, spin off, delay 100": {
        "instances": 2,
        "intra_op_threads": 1,
        "intra_op_spinning": False,
        "preferred_batch_sizes": (),
    },
}
CANDIDATES.update(
    {
        name: {"instances": 1, "intra_op_threads": 0, "max_queue_delay_us": 100, **changes}
        for name, changes in CONCURRENCY_CANDIDATES.items()
    }
)
#: The candidates ``python -m lab serving-defaults`` tries when none is named.
DEFAULT_CANDIDATES: tuple[str, ...] = tuple(name for name in CANDIDATES if name not in CONCURRENCY_CANDIDATES)
#: (batch size, concurrency) steps measured per candidate.
STEPS: tuple[tuple[int, int], ...] = ((1024, 1), (1024, 4), (1, 1), (1, 16))
#: ONNX Runtime graph optimization levels compared in-process.
GRAPH_LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def parse_step(text: str) -> tuple[int, int]:
    """``"1024x4"`` -> ``(1024, 4)``: batch size and concurrency of one measured step."""
    batch, _, level = text.lower().partition("x")
    if not batch.isdigit() or not level.isdigit() or int(batch) < 1 or int(level) < 1:
        raise ConfigError(f"a step is BATCHxCONCURRENCY with both >= 1, e.g. 1024x4; got {text!r}")
    return int(batch), int(level)


@dataclass(frozen=True)
class ServingOptions:
    """What the serving-defaults run measures.

    Args:
        repository: an exported cpu-profile repository.
        models: the models whose settings are tried (each on its own).
        out: folder for ``serving_defaults.json`` and ``.md``.
        data: Criteo TSV for the request rows (None: synthetic).
        candidates: names from :data:`CANDIDATES` (empty: :data:`DEFAULT_CANDIDATES`).
        steps: (batch size, concurrency) pairs.
        rounds: turns over the candidates.
        seconds: one measured window per step and turn.
    """

    repository: Path
    models: tuple[str, ...]
    out: Path
    data: Path | None = None
    candidates: tuple[str, ...] = ()
    steps: tuple[tuple[int, int], ...] = STEPS
    rounds: int = 2
    seconds: float = 3.0
    graph_levels: bool = True
    scratch: Path = field(default=Path("artifacts/serving-scratch"))

    def __post_init__(self) -> None:
        unknown = sorted(set(self.candidates) - set(CANDIDATES))
        if unknown:
            raise ConfigError(f"unknown candidates {unknown}; choose from {list(CANDIDATES)}")
        if not self.models or self.rounds < 1 or self.seconds <= 0:
            raise ConfigError("give at least one model, rounds >= 1 and seconds > 0")
        for model in self.models:
            if not (version_dir(self.repository, model) / MODEL_FILE).is_file():
                raise ConfigError(f"{self.repository} has no {model}/1/{MODEL_FILE}")


def _scratch_repository(options: ServingOptions, model: str) -> Path:
    """``scratch/<model>/1`` links to the exported version folder; configs are written per candidate."""
    root = options.scratch / "repository"
    if root.exists():
        shutil.rmtree(root)
    (root / model).mkdir(parents=True)
    (root / model / "1").symlink_to(
        version_dir(options.repository, model).resolve(), target_is_directory=True
    )
    return root


def _pools(options: ServingOptions) -> dict[int, PayloadPool]:
    rows = build_pool(1, data=options.data, batches=MAX_POOL_ROWS)
    return {batch: rows.rebatched(batch) for batch in sorted({b for b, _ in options.steps})}


def _measure_candidate(
    server: Any, model: str, pools: dict[int, PayloadPool], options: ServingOptions
) -> dict[str, dict[str, float]]:
    results = {}
    for batch, level in options.steps:
        served = served_throughput(
            server.grpc_url, model, pools[batch], level, "grpc", options.seconds, repeats=1, warmup_s=1.0
        )
        results[f"B={batch} c={level}"] = {
            "samples_per_s": served.samples_per_s,
            "p50_ms": served.p50_ms,
            "p99_ms": served.p99_ms,
        }
    return results


def _graph_levels(model_file: Path, pool: PayloadPool, rounds: int, seconds: float) -> dict[str, float]:
    """In-process samples/s at each graph optimization level, in turns; medians."""
    sessions = {level: inference_session(model_file, graph_optimization=level) for level in GRAPH_LEVELS}
    batches = pool.batches()

    def call(session: Any) -> Any:
        return lambda index: session.run([OUTPUT], batches[index % len(batches)])

    timings = time_calls(
        {level: call(session) for level, session in sessions.items()},
        pool.batch_size,
        TimerConfig(repeats=rounds, seconds=seconds),
    )
    return {level: timing.median for level, timing in timings.items()}


def run_serving(options: ServingOptions, command: str) -> dict[str, Any]:
    """Measure every candidate for every model (see the module doc)."""
    from server import LocalServer, ServerConfig

    record = RunRecord.begin(command)
    names = list(options.candidates or DEFAULT_CANDIDATES)
    pools = _pools(options)
    per_model: dict[str, Any] = {}
    for model in options.models:
        root = _scratch_repository(options, model)
        config = ServerConfig.with_free_ports(
            root, model_control_mode="explicit", log_file=Path("logs/serving-defaults-tritonserver.log")
        )
        raw: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in names}
        with LocalServer(config) as server:
            for round_index in range(options.rounds):
                order = names if round_index % 2 == 0 else names[::-1]
                for name in order:
                    serving = replace(ServingConfig(), **CANDIDATES[name])
                    write_config(root / model, build_config(model, serving))
                    server.load_model(model, timeout=600)
                    logger.info("%s: %s (round %d)", model, name, round_index + 1)
                    raw[name].append(_measure_candidate(server, model, pools, options))
        per_model[model] = {
            name: {
                step: {
                    key: statistics.median(turn[step][key] for turn in turns)
                    for key in ("samples_per_s", "p50_ms", "p99_ms")
                }
                for step in turns[0]
            }
            for name, turns in raw.items()
        }
        shutil.rmtree(root)
    levels = {}
    if options.graph_levels:
        for model in options.models:
            levels[model] = _graph_levels(
                version_dir(options.repository, model) / MODEL_FILE, pools[max(pools)], 5, 1.0
            )
    return {
        **record.finish().to_json(),
        "options": {
            k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items() if k != "scratch"
        },
        "candidates": {name: CANDIDATES[name] for name in names},
        "results": per_model,
        "graph_levels_in_process": levels,
    }


#: The candidate that matches the cpu profile's ServingConfig defaults (bundle/repository.py).
CURRENT_DEFAULT = "1 inst x default threads, delay 100"


def _ranking(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Candidates ranked by the geometric mean, over every model and step, of their samples/s
    relative to :data:`CURRENT_DEFAULT` (1.00: as fast as the default)."""
    ratios: dict[str, list[float]] = {}
    for candidates in results.values():
        base = candidates.get(CURRENT_DEFAULT)
        if base is None:
            return []
        for name, by_step in candidates.items():
            for step, measured in by_step.items():
                reference = base[step]["samples_per_s"]
                if reference > 0 and measured["samples_per_s"] > 0:
                    ratios.setdefault(name, []).append(measured["samples_per_s"] / reference)
    if not ratios:
        return []
    score = {name: statistics.geometric_mean(values) for name, values in ratios.items()}
    ranked = sorted(score, key=score.__getitem__, reverse=True)
    lines = [
        "## Ranking",
        "",
        f"Geometric mean over every model and step of samples/s relative to the current default "
        f"(`{CURRENT_DEFAULT}`):",
        "",
    ]
    lines += table(
        ["candidate", "x default (geomean)", "worst step", "best step"],
        [
            [name, f"{score[name]:.2f}", f"{min(ratios[name]):.2f}", f"{max(ratios[name]):.2f}"]
            for name in ranked
        ],
    )
    return lines


#: The report's named sections (:mod:`bundle.snippets`), which the documentation includes:
#: everything below the title, and per model its concurrency scaling (``scaling-<model>``).
SECTION_RESULTS = "results"


def scaling_section(model: str) -> str:
    """The name of ``model``'s concurrency-scaling section."""
    return name_for(f"scaling-{model}")


def _scaling(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Per model, each candidate's samples/s at every concurrency of a batch size as a ratio of
    its samples/s at the lowest concurrency measured for that batch size (same run, same turns)."""
    lines: list[str] = []
    for model, candidates in results.items():
        steps = [
            parse_step(step.replace("B=", "").replace(" c=", "x")) for step in next(iter(candidates.values()))
        ]
        by_batch: dict[int, list[int]] = {}
        for batch, level in steps:
            by_batch.setdefault(batch, []).append(level)
        pairs = [
            (batch, min(levels), level) for batch, levels in by_batch.items() for level in sorted(levels)[1:]
        ]
        if not pairs:
            continue
        headers = [f"B={b} c={c} / c={low}" for b, low, c in pairs]
        rows = []
        for candidate, by_step in candidates.items():
            cells = []
            for batch, low, level in pairs:
                base = by_step[f"B={batch} c={low}"]
                step = by_step[f"B={batch} c={level}"]
                ratio = step["samples_per_s"] / base["samples_per_s"] if base["samples_per_s"] else 0.0
                cells.append(f"{ratio:.2f} (p50 {base['p50_ms']:.0f} -> {step['p50_ms']:.0f} ms)")
            rows.append([candidate, *cells])
        lines += [
            f"## {model}: concurrency scaling",
            "",
            section_start(scaling_section(model)),
            "samples/s at the higher concurrency / samples/s at the lowest, same batch size "
            "(medians of the turns), and the p50 latency at both:",
            "",
            *table(["candidate", *headers], rows),
            section_end(scaling_section(model)),
            "",
        ]
    return lines


def write_serving(result: dict[str, Any], out: Path, name: str = "serving_defaults") -> dict[str, Path]:
    """Write ``<name>.json`` and ``<name>.md`` into ``out``."""
    options = result["options"]
    lines = [
        "# CPU serving defaults, measured through the local tritonserver",
        "",
        section_start(SECTION_RESULTS),
        *RunRecord.from_json(result).lines(),
        f"- each candidate's config loaded in turn into one tritonserver (explicit model control); "
        f"gRPC, {options['seconds']:g} s per step after 1 s of warm-up, {options['rounds']} turns over the "
        "candidates in alternating order; medians of the turns. Client and server share the "
        f"{result['machine'].get('cores', '?')} cores.",
        "",
    ]
    for model, candidates in result["results"].items():
        steps = list(next(iter(candidates.values())))
        lines += [f"## {model}", "", "samples/s (p99 ms) per step:", ""]
        rows = []
        for candidate, by_step in candidates.items():
            rows.append(
                [candidate]
                + [f"{by_step[s]['samples_per_s']:,.0f} ({by_step[s]['p99_ms']:.1f})" for s in steps]
            )
        lines += table(["candidate", *steps], rows)
        lines.append("")
    lines += _scaling(result["results"])
    lines += [*_ranking(result["results"]), ""]
    if result.get("graph_levels_in_process"):
        lines += ["## Graph optimization level (in-process, batch 1024, samples/s)", ""]
        rows = [
            [model, *[f"{levels[level]:,.0f}" for level in GRAPH_LEVELS]]
            for model, levels in result["graph_levels_in_process"].items()
        ]
        lines += table(["model", *GRAPH_LEVELS], rows)
        lines.append("")
    while lines[-1] == "":
        lines.pop()
    lines += [section_end(SECTION_RESULTS), ""]
    return {
        "json": write_json(out / f"{name}.json", result),
        "markdown": write_markdown(out / f"{name}.md", lines),
    }
