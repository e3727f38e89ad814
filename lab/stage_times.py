"""Each server-side stage, python and compiled, timed by the server itself, side by side.

One local tritonserver serves both implementations of each stage the bundle runs on every
request: the raw-row stage (``criteo_rows``: the python backend and the C++ backend
``raw_rows``) and the embedding stage of a hot/cold model (``dlrm_embedding``: the python
backend and the C++ backend ``embedding``), each pair with the same config but its backend.
At each batch size, in ``rounds`` rounds that alternate which implementation goes first, one
client sends ``requests`` requests to each, one at a time (concurrency 1, warm: the row store
is in the page cache and each stage answered the same requests before the round). Triton's
statistics of each model give the server's time per request: the whole (``request``: arrival
to response) and the stage's compute (its inputs in, its work, its outputs out). The result
is the median over the rounds, with the ratio python / compiled.

The requests: Criteo-shaped rows (13 counts, 26 hex ids) for the raw-row stage; for the
embedding stage ``B x 26`` ids of which about :data:`HOT_SHARE` fall in the hot set, over a
float32 store of ``26 x rows_per_table`` rows of ``width`` values.

``python -m lab stage-times`` writes ``stage_times.json``, ``stage_times.md`` and
``stage_times.png``; ``benchmarks/stages/run.sh`` makes the committed ones.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import Progress

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from bundle.schema import CATEGORICAL_INPUT, NUM_CATEGORICAL, NUM_DENSE, RAW_ROWS_INPUT
from bundle.snippets import section_end, section_start
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.stepfiles import server_counters
from loadtest.sweeps.steps import ServerTimes

#: Share of the embedding stage's lookups that fall in the hot set.
HOT_SHARE = 0.8
#: Share of each table's rows that are hot.
HOT_ROWS_SHARE = 0.1
#: The implementations, in the order reports list them.
IMPLEMENTATIONS = ("python", "compiled")
#: The stages measured, in the order reports list them.
STAGES = ("raw rows", "embedding")
#: How long the server may take to count a round's last request after answering it.
COUNTED_WAIT_S = 5.0


@dataclass(frozen=True)
class StageTimesOptions:
    """What ``python -m lab stage-times`` measures.

    Args:
        batch_sizes: rows per request.
        requests: requests per implementation, batch size and round.
        rounds: rounds (the implementations alternate which goes first).
        rows_per_table: rows of each of the embedding stage's 26 tables.
        width: values per row of the embedding stage's store.
        stages: which stages to time (:data:`STAGES`).
        log_file: the server's log.
    """

    batch_sizes: tuple[int, ...] = (1, 64, 1024)
    requests: int = 200
    rounds: int = 5
    rows_per_table: int = 20_000
    width: int = 32
    stages: tuple[str, ...] = STAGES
    log_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if self.requests < 1 or self.rounds < 1:
            raise ConfigError(f"requests and rounds must be >= 1, got {self.requests} and {self.rounds}")
        if self.rows_per_table < 10 or self.width < 1:
            raise ConfigError(
                f"rows per table must be >= 10 and width >= 1, got {self.rows_per_table}, {self.width}"
            )
        unknown = sorted(set(self.stages) - set(STAGES))
        if unknown or not self.stages:
            raise ConfigError(f"stages must be among {', '.join(STAGES)}, got {list(self.stages)}")


@dataclass(frozen=True)
class _Pair:
    """One stage's two models and the requests they take at each batch size."""

    stage: str
    models: dict[str, str]
    input_name: str
    datatype: str
    requests: dict[int, np.ndarray]


def _raw_rows_requests(batch_sizes: Sequence[int], seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for batch_size in batch_sizes:
        rows = []
        for _ in range(batch_size):
            counts = [str(int(v)) if rng.random() > 0.1 else "" for v in rng.integers(0, 10**4, NUM_DENSE)]
            ids = [format(int(v), "x") for v in rng.integers(0, 2**32, NUM_CATEGORICAL)]
            rows.append("\t".join(counts + ids).encode())
        out[batch_size] = np.array(rows, dtype=np.object_).reshape(-1, 1)
    return out


def _write_raw_rows(repository: Path, batch_sizes: Sequence[int]) -> _Pair:
    from export.raw_rows import PYTHON_BACKEND, STAGE_BACKEND, STAGE_MODEL, write_stage

    models = {"python": f"{STAGE_MODEL}_python", "compiled": STAGE_MODEL}
    write_stage(repository, PYTHON_BACKEND, models["python"])
    write_stage(repository, STAGE_BACKEND, models["compiled"])
    return _Pair("raw rows", models, RAW_ROWS_INPUT, "BYTES", _raw_rows_requests(batch_sizes, 0))


def _write_embedding(repository: Path, options: StageTimesOptions) -> _Pair:
    from export.tables.ensemble import (
        PYTHON_BACKEND,
        STAGE_BACKEND,
        embedding_model_name,
        write_embedding_stage,
    )
    from export.tables.hot_rows import HotSet
    from export.tables.row_store import RowStoreSpec, write_arrays

    rng = np.random.default_rng(1)
    sizes = (options.rows_per_table,) * NUM_CATEGORICAL
    tables = [rng.standard_normal((size, options.width), dtype=np.float32) for size in sizes]
    store = repository.parent / "row_store"
    write_arrays(store, RowStoreSpec.for_dlrm(sizes, options.width), tables)
    hot_rows = max(1, int(options.rows_per_table * HOT_ROWS_SHARE))
    hot_ids = tuple(rng.permutation(size)[:hot_rows].astype(np.int64) for size in sizes)
    hot_set = HotSet(
        table_sizes=sizes,
        row_bytes=(options.width * 4,) * NUM_CATEGORICAL,
        budget_bytes=hot_rows * options.width * 4 * NUM_CATEGORICAL,
        ids=hot_ids,
        counts=tuple(np.ones(hot_rows, dtype=np.int64) for _ in sizes),
        profiled_lookups=hot_rows * NUM_CATEGORICAL,
    )
    hot_path = hot_set.save(repository.parent / "hot_set.npz")
    family = "dlrm"
    models = {"python": f"{embedding_model_name(family)}_python", "compiled": embedding_model_name(family)}
    for implementation, backend in (("python", PYTHON_BACKEND), ("compiled", STAGE_BACKEND)):
        write_embedding_stage(
            repository, family, store, hot_path, backend=backend, name=models[implementation]
        )
    requests = {}
    for batch_size in options.batch_sizes:
        ids = rng.integers(0, options.rows_per_table, (batch_size, NUM_CATEGORICAL), dtype=np.int64)
        hot = rng.random((batch_size, NUM_CATEGORICAL)) < HOT_SHARE
        picks = rng.integers(0, hot_rows, (batch_size, NUM_CATEGORICAL))
        for table_index in range(NUM_CATEGORICAL):
            column = hot[:, table_index]
            ids[column, table_index] = hot_ids[table_index][picks[column, table_index]]
        requests[batch_size] = ids
    return _Pair("embedding", models, CATEGORICAL_INPUT, "INT64", requests)


def _send(client: Any, model: str, name: str, datatype: str, array: np.ndarray, count: int) -> None:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    for _ in range(count):
        client.infer(model, [tensor])


def _times(before: dict[str, int], after: dict[str, int]) -> ServerTimes:
    return ServerTimes.from_delta({key: after[key] - before[key] for key in after})


def _counters(client: Any, model: str) -> dict[str, int]:
    found = server_counters(client, model)
    if found is None:
        raise BundleError(f"no statistics from the server for {model}")
    return found


def _counters_after(client: Any, model: str, before: dict[str, int], sent: int) -> dict[str, int]:
    """The counters once the server has counted all ``sent`` requests since ``before``.

    A backend may record a request's statistics just after its response reaches the client
    (Triton's python backend does), so the last request of a round can be missing from a read
    made at once: read again, for at most :data:`COUNTED_WAIT_S`.
    """
    deadline = time.monotonic() + COUNTED_WAIT_S
    while True:
        after = _counters(client, model)
        counted = after["success_count"] - before["success_count"]
        if counted >= sent:
            return after
        if time.monotonic() > deadline:
            raise BundleError(
                f"the server counted {counted} of the {sent} requests sent to {model} "
                f"after {COUNTED_WAIT_S:g} s"
            )
        time.sleep(0.01)


def run_stage_times(options: StageTimesOptions, command: str) -> dict[str, Any]:
    """Time both implementations of each stage (see the module); the JSON-ready result.

    Raises:
        ServerError: the server or a stage does not come up (a compiled stage not built:
            ``make stages``).
    """
    import tritonclient.grpc as grpcclient

    from clients.triton import TritonClient
    from server.config import ServerConfig
    from server.launcher import LocalServer

    record = RunRecord.begin(command)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stage-times-") as scratch:
        repository = Path(scratch) / "repository"
        repository.mkdir()
        pairs = []
        if "raw rows" in options.stages:
            pairs.append(_write_raw_rows(repository, options.batch_sizes))
        if "embedding" in options.stages:
            pairs.append(_write_embedding(repository, options))
        config = ServerConfig.with_free_ports(repository, log_file=options.log_file)
        steps = len(pairs) * len(options.batch_sizes) * options.rounds * len(IMPLEMENTATIONS)
        with LocalServer(config) as server, Progress(transient=True) as progress:
            task = progress.add_task("stage times", total=steps)
            with (
                TritonClient(server.grpc_url, "grpc") as stats,
                grpcclient.InferenceServerClient(server.grpc_url) as client,
            ):
                for pair in pairs:
                    for batch_size in options.batch_sizes:
                        array = pair.requests[batch_size]
                        for model in pair.models.values():  # warm: the store's pages, the stages' buffers
                            _send(
                                client,
                                model,
                                pair.input_name,
                                pair.datatype,
                                array,
                                max(3, options.requests // 10),
                            )
                        rounds: dict[str, list[ServerTimes]] = {name: [] for name in IMPLEMENTATIONS}
                        for turn in range(options.rounds):
                            order = IMPLEMENTATIONS if turn % 2 == 0 else IMPLEMENTATIONS[::-1]
                            for implementation in order:
                                model = pair.models[implementation]
                                before = _counters(stats, model)
                                _send(client, model, pair.input_name, pair.datatype, array, options.requests)
                                after = _counters_after(stats, model, before, options.requests)
                                rounds[implementation].append(_times(before, after))
                                progress.update(
                                    task,
                                    advance=1,
                                    description=f"{pair.stage} B={batch_size} {implementation}",
                                )
                        results.append(_step(pair, batch_size, rounds))
    return {
        **record.finish().to_json(),
        "requests": options.requests,
        "rounds": options.rounds,
        "rows_per_table": options.rows_per_table,
        "width": options.width,
        "hot_share": HOT_SHARE,
        "steps": results,
    }


def _compute_ms(times: ServerTimes) -> float:
    return times.compute_input_ms + times.compute_infer_ms + times.compute_output_ms


def _step(pair: _Pair, batch_size: int, rounds: dict[str, list[ServerTimes]]) -> dict[str, Any]:
    step: dict[str, Any] = {"stage": pair.stage, "batch_size": batch_size}
    for implementation, taken in rounds.items():
        step[implementation] = {
            "model": pair.models[implementation],
            "request_ms": statistics.median(t.request_ms for t in taken),
            "compute_ms": statistics.median(_compute_ms(t) for t in taken),
            "rounds_request_ms": [t.request_ms for t in taken],
            "requests": sum(t.requests for t in taken),
        }
    step["ratio"] = step["python"]["request_ms"] / step["compiled"]["request_ms"]
    return step


def report_lines(document: dict[str, Any]) -> list[str]:
    """The markdown report: one table of the server's time per request."""
    lines = [
        "# Server-side stages: python against compiled",
        "",
        *RunRecord.from_json(document).lines(),
        "",
        f"One local tritonserver serves both implementations of each stage; {document['requests']} "
        f"requests per implementation, batch size and round, one at a time, {document['rounds']} rounds "
        "that alternate which goes first; medians of the rounds. From Triton's statistics of each model: "
        "`request` is arrival to response, `compute` the stage's inputs in, its work and its outputs out. "
        "The embedding stage reads a warm float32 store of "
        f"26 x {document['rows_per_table']:,} rows of {document['width']} values, "
        f"{document['hot_share']:.0%} of the lookups hot.",
        "",
        section_start("stage-times"),
    ]
    rows = [
        [
            step["stage"],
            str(step["batch_size"]),
            step["python"]["request_ms"],
            step["compiled"]["request_ms"],
            step["python"]["compute_ms"],
            step["compiled"]["compute_ms"],
            f"{step['ratio']:.1f}x",
        ]
        for step in document["steps"]
    ]
    header = [
        "stage", "batch", "python request ms", "compiled request ms", "python compute ms",
        "compiled compute ms", "python / compiled",
    ]  # fmt: skip
    lines += table(header, rows, align="lrrrrrr")
    lines += [section_end("stage-times"), ""]
    return lines


def write_stage_times(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """``stage_times.json``, ``stage_times.md`` and ``stage_times.png`` in ``out``."""
    panels = []
    for stage in STAGES:
        mine = [step for step in document["steps"] if step["stage"] == stage]
        if not mine:
            continue
        x = [float(step["batch_size"]) for step in mine]
        ratios = [(f"{s['ratio']:.1f}x", float(s["batch_size"]), s["python"]["request_ms"]) for s in mine]
        series = [
            Series(
                f"{implementation} stage", x, [step[implementation]["request_ms"] for step in mine],
                color_key=implementation,
                notes=ratios if implementation == "python" else (),
            )
            for implementation in IMPLEMENTATIONS
        ]  # fmt: skip
        panels.append(
            Panel(
                title=f"{stage} stage",
                xlabel="rows per request",
                ylabel="server ms per request (median)",
                series=series,
                xlog2=True,
                ylog=True,
                xticks=x,
            )
        )
    return {
        "json": write_json(out / "stage_times.json", document),
        "markdown": write_markdown(out / "stage_times.md", report_lines(document)),
        "png": plot(
            out / "stage_times.png", "Server time per request: python stage against compiled", panels
        ),
    }
