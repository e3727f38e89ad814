"""Raw rows against preprocessed tensors: what parsing the rows in the server costs.

One local tritonserver serves a model and its raw-row model (``<model>_raw``: the raw-row stage,
then the model). At each batch size and concurrency the closed-loop driver sends the same
pool's rows to both, back to back and in alternating order, ``rounds`` times: as tensors the
client made (the preprocessed path) and as text (the raw path). For the raw path the server's
statistics split each request's time into the stage (queue, parse), the model (queue, compute)
and the rest (the ensemble's hand-offs).

In-process, on the same rows, the work the stage does is timed against its alternatives:

- the stage's parse of ``B`` rows (:mod:`criteo.rows`, what ``criteo_rows`` runs), and the same
  rows preprocessed by the bundle's own client-side reader;
- the input's decoding in its two forms: ``B x 1`` BYTES (a row per element, the form chosen)
  and ``B x 39`` BYTES (a field per element), each decoded from Triton's wire format into the
  text the parser takes.

``python -m lab raw-rows`` writes ``raw_rows.json``, ``raw_rows.md`` and
``raw_rows.png``; ``benchmarks/raw_rows/run.sh`` makes the committed ones.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from rich.progress import Progress
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from bundle.schema import raw_model_name
from bundle.snippets import section_end, section_start
from clients.triton import TritonClient
from criteo.rows import model_inputs, parse_rows
from criteo.tsv import parse_lines, to_batch
from loadtest.engine.payload import MAX_POOL_ROWS, PayloadPool, build_pool
from loadtest.engine.served import served_throughput
from loadtest.engine.timer import TimerConfig, time_calls
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.stepfiles import server_counters
from loadtest.sweeps.steps import ServerTimes
from loadtest.tune.search import raw_models

logger = logging.getLogger(__name__)

#: The raw path's samples/s at batch 1024 should reach this share of the preprocessed path's.
TARGET_RATIO = 0.9
#: The in-process timings: 7 repeats of at least 0.2 s each, the candidates in turns.
IN_PROCESS_TIMER = TimerConfig(repeats=7, seconds=0.2, warmup_calls=1, min_calls=1)


@dataclass(frozen=True)
class RawRowsOptions:
    """What ``python -m lab raw-rows`` measures.

    Args:
        repository: an exported repository holding ``model`` and its raw-row model.
        model: the served model (its raw-row model is ``<model>_raw``).
        batch_sizes: rows per request.
        concurrency: requests in flight.
        rounds: turns of each step, the two paths in alternating order.
        seconds: measured seconds per path per round.
        warmup_s: seconds sent before each measurement.
        protocol: ``grpc`` or ``http``.
        data: Criteo TSV for the rows (None: synthetic).
        client_cpus: cores of this process (the load generator); the server gets the others.
        log_file: tritonserver's log.
    """

    repository: Path
    model: str = "dlrm_onnx_int8"
    batch_sizes: tuple[int, ...] = (1, 1024)
    concurrency: tuple[int, ...] = (1, 2, 4)
    rounds: int = 3
    seconds: float = 3.0
    warmup_s: float = 1.0
    protocol: str = "grpc"
    data: Path | None = None
    client_cpus: frozenset[int] | None = None
    log_file: Path = Path("logs/raw-rows-tritonserver.log")

    def __post_init__(self) -> None:
        if not self.batch_sizes or not self.concurrency or min(*self.batch_sizes, *self.concurrency) < 1:
            raise ConfigError("batch sizes and concurrency must be integers >= 1")
        if self.rounds < 1 or self.seconds <= 0 or self.warmup_s < 0:
            raise ConfigError("rounds must be >= 1, seconds > 0 and warm-up >= 0")
        if self.protocol not in ("grpc", "http"):
            raise ConfigError(f"protocol must be grpc or http, got {self.protocol!r}")


@dataclass(frozen=True)
class PathStep:
    """One path at one batch size and concurrency: medians over the rounds.

    Attributes:
        path: ``preprocessed`` or ``raw``.
        model: the model the requests went to.
        samples_per_s: median over the rounds.
        rounds_samples_per_s: each round's.
        p50_ms, p99_ms: medians over the rounds of each round's.
        errors: failed requests over every round.
        server_ms: mean ms per request inside the server, by part (``request``: arrival to
            answer; for the raw path also ``stage queue``, ``stage parse``, ``model queue``,
            ``model compute`` and ``hand-offs``, the rest); medians over the rounds.
    """

    path: str
    model: str
    batch_size: int
    concurrency: int
    samples_per_s: float
    rounds_samples_per_s: tuple[float, ...]
    p50_ms: float
    p99_ms: float
    errors: int
    server_ms: dict[str, float]


def _counters(client: TritonClient, names: Sequence[str]) -> dict[str, dict[str, int]]:
    """Triton's counters of each model now (:func:`~loadtest.sweeps.stepfiles.server_counters`).

    Raises:
        BundleError: the server did not give them.
    """
    counters = {name: server_counters(client, name) for name in names}
    missing = [name for name, found in counters.items() if found is None]
    if missing:
        raise BundleError(f"no statistics from the server for {missing}")
    return cast(dict[str, dict[str, int]], counters)


def _times(before: dict[str, int], after: dict[str, int]) -> ServerTimes:
    return ServerTimes.from_delta({key: after[key] - before[key] for key in after})


def _compute_ms(times: ServerTimes) -> float:
    """Mean ms per request of a model's compute: its inputs in, the run, its outputs out."""
    return times.compute_input_ms + times.compute_infer_ms + times.compute_output_ms


def server_parts(model: str, stage: str, ensemble: str, times: dict[str, ServerTimes]) -> dict[str, float]:
    """Mean ms per raw-path request in each part of the server (see :class:`PathStep`)."""
    whole, parse, scored = times[ensemble], times[stage], times[model]
    parts = {
        "request": whole.request_ms,
        "stage queue": parse.queue_ms,
        "stage parse": _compute_ms(parse),
        "model queue": scored.queue_ms,
        "model compute": _compute_ms(scored),
    }
    parts["hand-offs"] = parts["request"] - sum(v for k, v in parts.items() if k != "request")
    return parts


def _median_parts(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def _by_index(call: Callable[[], object]) -> Callable[[int], object]:
    """``call`` as the timer calls its candidates (with a call index, not needed here)."""
    return lambda _: call()


def in_process(text: np.ndarray, batch_sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Per batch size, ms per batch of: the stage's parse, the client-side reader, and the
    decoding of each input form (see the module)."""
    rows = [bytes(row) for row in text.tolist()]
    results = []
    for batch_size in batch_sizes:
        batch = (rows * (-(-batch_size // len(rows))))[:batch_size]
        data = b"\n".join(batch)
        one_column = serialize_byte_tensor(np.array(batch, dtype=np.object_).reshape(-1, 1)).item()
        fields = [row.split(b"\t") for row in batch]
        columns = serialize_byte_tensor(np.array(fields, dtype=np.object_)).item()
        lines = [row.decode() for row in batch]

        def decode_one_column(wire: bytes = one_column) -> bytes:
            return b"\n".join(deserialize_bytes_tensor(wire).tolist())

        def decode_columns(wire: bytes = columns, width: int = len(fields[0])) -> bytes:
            elements = deserialize_bytes_tensor(wire).tolist()
            return b"\n".join(b"\t".join(elements[i : i + width]) for i in range(0, len(elements), width))

        def stage_parse(text: bytes = data, count: int = batch_size) -> object:
            return model_inputs(parse_rows(text, labeled=False, rows=count))

        def client_reader(text: list[str] = lines) -> object:
            return to_batch(parse_lines(text, fields=39))

        candidates: dict[str, Callable[[], object]] = {
            "stage parse ms": stage_parse,
            "client-side reader ms": client_reader,
            "decode B x 1 ms": decode_one_column,
            "decode B x 39 ms": decode_columns,
        }
        timings = time_calls(
            {key: _by_index(call) for key, call in candidates.items()}, 1.0, IN_PROCESS_TIMER
        )
        results.append({"batch_size": batch_size, **{key: 1000 / t.median for key, t in timings.items()}})
    return results


def run_raw_rows(options: RawRowsOptions, command: str) -> dict[str, Any]:
    """Measure both paths (see the module); the JSON-ready result.

    Raises:
        ConfigError: the repository lacks the model or its raw-row model.
    """
    from loadtest.sweeps.runs import server_cpus
    from server.config import ServerConfig
    from server.launcher import LocalServer

    model, raw = options.model, raw_model_name(options.model)
    if not (options.repository / model).is_dir():
        raise ConfigError(f"{options.repository} has no {model}")
    _, *steps = raw_models(options.repository, model)
    stage = steps[0] if steps else ""
    record = RunRecord.begin(command)
    rows = build_pool(1, data=options.data, batches=MAX_POOL_ROWS)
    if rows.text is None:
        raise ConfigError("the request rows have no text")
    pools: dict[int, PayloadPool] = {b: rows.rebatched(b) for b in options.batch_sizes}
    if options.client_cpus:
        os.sched_setaffinity(0, options.client_cpus)
    config = ServerConfig.with_free_ports(
        options.repository, log_file=options.log_file, model_control_mode="explicit",
        load_models=(model, raw), cpus=server_cpus(options.client_cpus),
    )  # fmt: skip
    results: list[PathStep] = []
    loads = [(b, c) for b in options.batch_sizes for c in options.concurrency]
    with LocalServer(config) as server, Progress(transient=True) as progress:
        url = server.grpc_url if options.protocol == "grpc" else server.http_url
        task = progress.add_task("raw rows vs tensors", total=len(loads) * options.rounds * 2)
        with TritonClient(server.grpc_url, "grpc") as stats_client:
            for batch_size, concurrency in loads:
                measured: dict[str, list[tuple[Any, dict[str, float]]]] = {"preprocessed": [], "raw": []}
                for turn in range(options.rounds):
                    order = ["preprocessed", "raw"] if turn % 2 == 0 else ["raw", "preprocessed"]
                    for path in order:
                        name = raw if path == "raw" else model
                        names = [model, raw, stage]
                        before = _counters(stats_client, names)
                        result = served_throughput(
                            url, name, pools[batch_size], concurrency, options.protocol,
                            seconds=options.seconds, repeats=1, warmup_s=options.warmup_s,
                        )  # fmt: skip
                        after = _counters(stats_client, names)
                        times = {n: _times(before[n], after[n]) for n in names}
                        if path == "raw":
                            parts = server_parts(model, stage, raw, times)
                        else:
                            scored = times[model]
                            parts = {
                                "request": scored.request_ms,
                                "model queue": scored.queue_ms,
                                "model compute": _compute_ms(scored),
                            }
                        measured[path].append((result, parts))
                        progress.update(
                            task, advance=1,
                            description=f"B={batch_size} c={concurrency} {path}: {result.samples_per_s:,.0f}",
                        )  # fmt: skip
                for path, taken in measured.items():
                    rates = tuple(r.samples_per_s for r, _ in taken)
                    results.append(
                        PathStep(
                            path=path, model=raw if path == "raw" else model, batch_size=batch_size,
                            concurrency=concurrency, samples_per_s=statistics.median(rates),
                            rounds_samples_per_s=rates,
                            p50_ms=statistics.median(r.p50_ms for r, _ in taken),
                            p99_ms=statistics.median(r.p99_ms for r, _ in taken),
                            errors=sum(r.errors for r, _ in taken),
                            server_ms=_median_parts([p for _, p in taken]),
                        )
                    )  # fmt: skip
    timings = in_process(rows.text, options.batch_sizes)
    return {
        **record.finish().to_json(),
        "model": model,
        "raw_model": raw,
        "stage": stage,
        "protocol": options.protocol,
        "rounds": options.rounds,
        "seconds": options.seconds,
        "warmup_s": options.warmup_s,
        "client_cpus": sorted(options.client_cpus) if options.client_cpus else None,
        "target_ratio": TARGET_RATIO,
        "steps": [asdict(step) for step in results],
        "in_process": timings,
    }


def ratios(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Per batch size and concurrency: both paths' samples/s and the raw path's share."""
    by_load: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for step in document["steps"]:
        by_load.setdefault((step["batch_size"], step["concurrency"]), {})[step["path"]] = step
    out = []
    for (batch_size, concurrency), paths in sorted(by_load.items()):
        pre, raw = paths["preprocessed"], paths["raw"]
        out.append(
            {
                "batch_size": batch_size,
                "concurrency": concurrency,
                "preprocessed": pre,
                "raw": raw,
                "ratio": raw["samples_per_s"] / pre["samples_per_s"]
                if pre["samples_per_s"]
                else float("nan"),
            }
        )
    return out


def verdict(document: dict[str, Any]) -> str:
    """The target's line: the raw path's share of the preprocessed path's samples/s at the
    largest batch measured (1024 by default), lowest and highest, against :data:`TARGET_RATIO`."""
    every = ratios(document)
    batch_size = max(r["batch_size"] for r in every)
    shares = [r for r in every if r["batch_size"] == batch_size]
    worst = min(shares, key=lambda r: r["ratio"])
    best = max(shares, key=lambda r: r["ratio"])
    held = all(r["ratio"] >= document["target_ratio"] for r in shares)
    return (
        f"At batch {batch_size} the raw path reaches {worst['ratio']:.2f}x (c={worst['concurrency']}) to "
        f"{best['ratio']:.2f}x (c={best['concurrency']}) of the preprocessed path's samples/s: the "
        f"{document['target_ratio']:g}x target is {'met' if held else 'missed'}"
        + ("" if held else " (where the time goes: the server's parts below)")
        + "."
    )


def report_lines(document: dict[str, Any]) -> list[str]:
    """The markdown page."""
    lines = [
        f"# Raw rows against preprocessed tensors: {document['model']}",
        "",
        *RunRecord.from_json(document).lines(),
        f"- **Paths**: `{document['model']}` (the client's tensors) and `{document['raw_model']}` (the rows' "
        f"text, parsed by `{document['stage']}` in the server), over {document['protocol']}, the same rows",
        f"- **Per step**: {document['rounds']} rounds, the paths in alternating order, each "
        f"{document['warmup_s']:g} s warm-up + {document['seconds']:g} s measured on the closed-loop driver; "
        "medians of the rounds",
        f"- **Load generator cores**: {document['client_cpus'] or 'any'} (the server on the others)",
        "",
        section_start("ratio"),
        verdict(document),
        "",
    ]
    rows = []
    for r in ratios(document):
        pre, raw = r["preprocessed"], r["raw"]
        rows.append(
            [
                str(r["batch_size"]), str(r["concurrency"]), f"{pre['samples_per_s']:,.0f}",
                f"{raw['samples_per_s']:,.0f}", f"**{r['ratio']:.2f}**", f"{pre['p50_ms']:.2f}",
                f"{raw['p50_ms']:.2f}", f"{pre['p99_ms']:.2f}", f"{raw['p99_ms']:.2f}",
                str(pre["errors"] + raw["errors"]),
            ]
        )  # fmt: skip
    lines += table(
        ["batch", "concurrency", "tensors samples/s", "raw samples/s", "raw / tensors", "tensors p50 ms",
         "raw p50 ms", "tensors p99 ms", "raw p99 ms", "errors"],
        rows,
    )  # fmt: skip
    lines += [section_end("ratio"), "", "![raw rows against tensors](raw_rows.png)", ""]
    lines += [
        "## Where a raw request's time goes in the server",
        "",
        "Mean ms per request from the server's statistics (medians of the rounds): the stage's queue and "
        "parse, the model's queue and compute, and the rest of the request (the ensemble's hand-offs: "
        "tensors passed from the stage to the model, the answer back). The tensors' path for comparison.",
        "",
        section_start("parts"),
    ]
    parts = ["request", "stage queue", "stage parse", "model queue", "model compute", "hand-offs"]
    rows = []
    for r in ratios(document):
        for path in ("preprocessed", "raw"):
            server = r[path]["server_ms"]
            rows.append(
                [str(r["batch_size"]), str(r["concurrency"]), "tensors" if path == "preprocessed" else "raw"]
                + [f"{server[p]:.3f}" if p in server else "-" for p in parts]
            )
    lines += table(["batch", "concurrency", "path", *(f"{p} ms" for p in parts)], rows, align="rrl" + "r" * 6)
    lines += [
        section_end("parts"),
        "",
        "## The input's form, and the parse, in-process",
        "",
        "ms per batch on this machine, medians: the stage's parse (`criteo/rows.py`, numpy, what the stage "
        "runs), the same rows through the bundle's client-side reader, and decoding each input form from "
        "Triton's BYTES wire format into the text the parser takes: `B x 1` (a row per element, the form "
        "the raw-row models take) or `B x 39` (a field per element).",
        "",
        section_start("forms"),
    ]
    keys = ["stage parse ms", "client-side reader ms", "decode B x 1 ms", "decode B x 39 ms"]
    lines += table(
        ["batch", *keys, "B x 39 / B x 1"],
        [
            [
                str(t["batch_size"]),
                *(f"{t[k]:.3f}" for k in keys),
                f"{t['decode B x 39 ms'] / t['decode B x 1 ms']:.1f}x",
            ]
            for t in document["in_process"]
        ],
    )
    lines += [section_end("forms")]
    return lines


def write_raw_rows(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """``raw_rows.json``, ``raw_rows.md`` and ``raw_rows.png`` in ``out``."""
    shares = ratios(document)
    panels = []
    for batch_size in sorted({r["batch_size"] for r in shares}):
        mine = [r for r in shares if r["batch_size"] == batch_size]
        x = [float(r["concurrency"]) for r in mine]
        raw = [r["raw"]["samples_per_s"] for r in mine]
        tensors = [r["preprocessed"]["samples_per_s"] for r in mine]
        notes = [(f"{r['ratio']:.2f}x", float(r["concurrency"]), r["raw"]["samples_per_s"]) for r in mine]
        panels.append(
            Panel(
                title=f"batch {batch_size}",
                xlabel="concurrency",
                ylabel="samples/s",
                series=[
                    Series("tensors (client preprocesses)", x, tensors),
                    Series("raw rows (server parses)", x, raw, notes=notes),
                ],
                xlog2=True,
                xticks=x,
            )
        )  # fmt: skip
    return {
        "json": write_json(out / "raw_rows.json", document),
        "markdown": write_markdown(out / "raw_rows.md", report_lines(document)),
        "png": plot(out / "raw_rows.png", f"Raw rows against tensors: {document['model']}", panels),
    }
