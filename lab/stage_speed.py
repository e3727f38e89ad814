"""The compiled stages' time per warm request, served, beside the same work in process and a copy bound.

One local tritonserver serves the raw-row stage (``criteo_rows``) and the embedding stage of a
hot/cold model twice, over one float32 row store of ``26 x rows_per_table`` rows of ``width``
values, with the config the export writes (so the stage's default memory tier of cold rows),
each as it serves in production: the first step of an ensemble whose second step takes its
outputs (for the embedding stage, a stand-in dense model that reads all three; for the raw-row
stage, the same for its two tensors), so the stage hands its outputs to the next step, not to a
client's connection:

- ``80% hot``: a hot set of a tenth of each table's rows, and :data:`HOT_SHARES` ``[0]`` of the
  lookups among them;
- ``mostly cold``: the same hot set, and :data:`HOT_SHARES` ``[1]`` of the lookups among them (most
  lookups read a cold row).

At each batch size, a pool of :data:`POOL` different requests is sent to the ensemble twice
(warm: every cold row the pool asks for is then in the stage's memory tier), then ``requests``
requests cycling over the pool, one at a time, in each of ``rounds`` rounds. Triton's statistics
of the stage's model give its time per request: ``stage`` is the backend's whole work (its
inputs in, placement, cold rows, its outputs out, up to its complete response handed to Triton:
compute input + infer + output) and ``request`` the stage's arrival to that hand-over. As
Triton's own backends (onnxruntime, openvino) count it, the response's send, Triton passing it
on to the ensemble's next step, is not the model's time; ``ensemble`` (the ensemble's own
statistics: its arrival to its response, the stand-in's work included) carries it. The result is
the median over the rounds.

Beside each embedding step, in the same run: the same pool's lookups in process (the stage's
placement and cold reads, through its test driver ``embedding_lookup_driver``, the backend's code
outside Triton, with the same default tier, warmed the same way), and a memory-copy bound: one
``memcpy`` of each request's bytes (its ids in, its three outputs out), timed in that process.

``python -m lab stage-speed`` writes ``stage_speed.json``, ``stage_speed.md`` and
``stage_speed.png``; ``benchmarks/stages/run.sh`` makes the committed ones.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from bundle.schema import CATEGORICAL_INPUT, NUM_CATEGORICAL, NUM_DENSE, RAW_ROWS_INPUT
from bundle.snippets import section_end, section_start
from loadtest.engine.writer import Panel, Series, plot, table, write_json, write_markdown
from loadtest.sweeps.stepfiles import server_counters
from loadtest.sweeps.steps import ServerTimes

#: The embedding stage's two set-ups: the share of lookups that fall in the hot set.
HOT_SHARES = {"80% hot": 0.8, "mostly cold": 0.2}
#: Share of each table's rows that are hot.
HOT_ROWS_SHARE = 0.1
#: Different requests per batch size, sent in turn.
POOL = 16
#: How long the server may take to count a round's last request after answering it.
COUNTED_WAIT_S = 5.0
#: The embedding stage's bound per warm request at these batch sizes (microseconds of the stage's
#: own time per request, from Triton's statistics).
TARGET_US = {64: 50.0, 1024: 500.0}
#: The driver that runs the embedding stage's lookup outside Triton (``make stages`` builds it).
LOOKUP_DRIVER = Path("embedding") / "embedding_lookup_driver"


@dataclass(frozen=True)
class StageSpeedOptions:
    """What ``python -m lab stage-speed`` measures.

    Args:
        batch_sizes: rows per request.
        requests: requests per model, batch size and round.
        rounds: rounds.
        rows_per_table: rows of each of the embedding stage's 26 tables.
        width: values per row of the store.
        in_process: lookups timed in process per set-up and batch size.
        build: the compiled stages' build folder (``make stages``), for the lookup driver.
        log_file: the server's log.
    """

    batch_sizes: tuple[int, ...] = (1, 64, 1024)
    requests: int = 200
    rounds: int = 5
    rows_per_table: int = 20_000
    width: int = 32
    in_process: int = 400
    build: Path | None = None
    log_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError(f"batch sizes must be >= 1, got {list(self.batch_sizes)}")
        if min(self.requests, self.rounds, self.in_process) < 1:
            raise ConfigError(
                f"requests, rounds and in-process lookups must be >= 1, got {self.requests}, "
                f"{self.rounds} and {self.in_process}"
            )
        if self.rows_per_table < 10 or self.width < 1:
            raise ConfigError(
                f"rows per table must be >= 10 and width >= 1, got {self.rows_per_table}, {self.width}"
            )


@dataclass(frozen=True)
class _Stage:
    """One served stage: its model, the ensemble that runs it, the ensemble's input, and its
    pool of requests (that input) at each batch size."""

    name: str
    model: str
    ensemble: str
    input_name: str
    datatype: str
    pools: dict[int, list[np.ndarray]]


def _raw_rows_pools(batch_sizes: Sequence[int], seed: int) -> dict[int, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    pools: dict[int, list[np.ndarray]] = {}
    for batch_size in batch_sizes:
        pools[batch_size] = []
        for _ in range(POOL):
            rows = []
            for _ in range(batch_size):
                counts = [
                    str(int(v)) if rng.random() > 0.1 else "" for v in rng.integers(0, 10**4, NUM_DENSE)
                ]
                ids = [format(int(v), "x") for v in rng.integers(0, 2**32, NUM_CATEGORICAL)]
                rows.append("\t".join(counts + ids).encode())
            pools[batch_size].append(np.array(rows, dtype=np.object_).reshape(-1, 1))
    return pools


def _embedding_ids(
    rng: np.random.Generator, hot_ids: Sequence[np.ndarray], rows_per_table: int, batch: int, hot_share: float
) -> np.ndarray:
    """``batch x 26`` ids, each in its table's hot set with probability ``hot_share``."""
    ids = rng.integers(0, rows_per_table, (batch, NUM_CATEGORICAL), dtype=np.int64)
    hot = rng.random((batch, NUM_CATEGORICAL)) < hot_share
    for column_index, table_hot in enumerate(hot_ids):
        column = hot[:, column_index]
        ids[column, column_index] = table_hot[rng.integers(0, table_hot.size, int(column.sum()))]
    return ids


def _sink_graph(inputs: Sequence[tuple[str, int, Sequence[int | str]]], output: str) -> Any:
    """An ONNX graph that reads every input (a sum of each, cast to float) and answers ``output``
    ``-1 x 1``: the next step of a stage's ensemble, whose own time is not the stage's."""
    from onnx import TensorProto, helper

    nodes, terms = [], []
    for name, _, _ in inputs:
        cast = f"{name}_float"
        nodes.append(helper.make_node("Cast", [name], [cast], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("ReduceSum", [cast], [f"{name}_sum"], keepdims=0))
        terms.append(f"{name}_sum")
    total = terms[0]
    for index, term in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [total, term], [f"total_{index}"]))
        total = f"total_{index}"
    nodes.append(helper.make_node("Reshape", [total, "one_by_one"], [output]))
    graph = helper.make_graph(
        nodes,
        "stage_sink",
        [helper.make_tensor_value_info(name, elem_type, list(shape)) for name, elem_type, shape in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor("one_by_one", TensorProto.INT64, [2], [1, 1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _write_ensemble(
    repository: Path,
    name: str,
    stage: Any,
    inputs: Sequence[tuple[str, int, Sequence[int | str]]],
    ensemble_input: tuple[str, int, Sequence[int]],
) -> None:
    """``name``: ``stage``'s model (its config) then a sink over ``inputs`` (its outputs)."""
    from onnx import TensorProto
    from tritonclient.grpc import model_config_pb2 as mc

    from bundle.repository import ENSEMBLE_PLATFORM, make_ensemble_version, write_config
    from export.graphs.onnx_io import save_model

    types: dict[int, Any] = {TensorProto.FLOAT: mc.TYPE_FP32, TensorProto.INT64: mc.TYPE_INT64}
    sink = f"{name}_sink"
    save_model(_sink_graph(inputs, "total"), repository / sink / "1" / "model.onnx")
    config = mc.ModelConfig(name=sink, backend="onnxruntime", max_batch_size=0)
    for tensor, elem_type, shape in inputs:
        entry = config.input.add(name=tensor, data_type=types[elem_type])
        entry.dims.extend(-1 if isinstance(size, str) else size for size in shape)
    config.output.add(name="total", data_type=mc.TYPE_FP32, dims=[1, 1])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    write_config(repository / sink, config)
    ensemble = mc.ModelConfig(name=name, platform=ENSEMBLE_PLATFORM, max_batch_size=0)
    input_name, input_type, input_dims = ensemble_input
    ensemble.input.add(name=input_name, data_type=input_type, dims=list(input_dims))
    ensemble.output.add(name="total", data_type=mc.TYPE_FP32, dims=[1, 1])
    first = ensemble.ensemble_scheduling.step.add(model_name=stage.name, model_version=1)
    first.input_map[input_name] = input_name
    second = ensemble.ensemble_scheduling.step.add(model_name=sink, model_version=1)
    for tensor, _, _ in inputs:
        first.output_map[tensor] = tensor
        second.input_map[tensor] = tensor
    second.output_map["total"] = "total"
    make_ensemble_version(repository, name, 1)
    write_config(repository / name, ensemble)


def _write_stages(repository: Path, options: StageSpeedOptions) -> tuple[list[_Stage], Path, Path]:
    """The raw-row stage and the two embedding stages in ``repository``, each in its ensemble;
    the store and hot set."""
    from onnx import TensorProto
    from tritonclient.grpc import model_config_pb2 as mc

    from bundle.repository import read_config
    from bundle.schema import COLD_POSITIONS, COLD_ROWS, DENSE_INPUT, HOT_SLOTS
    from export.raw_rows import STAGE_MODEL, write_stage
    from export.tables.ensemble import embedding_model_name, write_embedding_stage
    from export.tables.hot_rows import HotSet
    from export.tables.row_store import RowStoreSpec, write_arrays

    stages = []
    config = read_config(write_stage(repository))
    raw_outputs = [
        (DENSE_INPUT, TensorProto.FLOAT, ("b", NUM_DENSE)),
        (CATEGORICAL_INPUT, TensorProto.INT64, ("b", NUM_CATEGORICAL)),
    ]
    _write_ensemble(
        repository, f"{STAGE_MODEL}_ensemble", config, raw_outputs, (RAW_ROWS_INPUT, mc.TYPE_STRING, (-1, 1))
    )
    stages.append(
        _Stage(
            "raw rows",
            STAGE_MODEL,
            f"{STAGE_MODEL}_ensemble",
            RAW_ROWS_INPUT,
            "BYTES",
            _raw_rows_pools(options.batch_sizes, 0),
        )
    )
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
    for index, (setup, share) in enumerate(HOT_SHARES.items()):
        name = f"{embedding_model_name('dlrm')}_{index}"
        config = read_config(write_embedding_stage(repository, "dlrm", store, hot_path, name=name))
        outputs = [
            (HOT_SLOTS, TensorProto.INT64, ("b", NUM_CATEGORICAL)),
            (COLD_POSITIONS, TensorProto.INT64, ("n",)),
            (COLD_ROWS, TensorProto.FLOAT, ("n", options.width)),
        ]
        ensemble = f"{name}_ensemble"
        _write_ensemble(
            repository, ensemble, config, outputs, (CATEGORICAL_INPUT, mc.TYPE_INT64, (-1, NUM_CATEGORICAL))
        )
        pools = {
            batch: [_embedding_ids(rng, hot_ids, options.rows_per_table, batch, share) for _ in range(POOL)]
            for batch in options.batch_sizes
        }
        stages.append(_Stage(setup, name, ensemble, CATEGORICAL_INPUT, "INT64", pools))
    return stages, store, hot_path


def _send(client: Any, stage: _Stage, pool: Sequence[np.ndarray], count: int) -> None:
    import tritonclient.grpc as grpcclient

    tensors = []
    for array in pool:
        tensor = grpcclient.InferInput(stage.input_name, list(array.shape), stage.datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    for index in range(count):
        client.infer(stage.ensemble, [tensors[index % len(tensors)]])


def _counters(client: Any, model: str) -> dict[str, int]:
    found = server_counters(client, model)
    if found is None:
        raise BundleError(f"no statistics from the server for {model}")
    return found


def _counters_after(client: Any, model: str, before: dict[str, int], sent: int) -> dict[str, int]:
    """The counters once the server has counted all ``sent`` requests since ``before``."""
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


def _delta(before: dict[str, int], after: dict[str, int]) -> ServerTimes:
    """A model's times over the requests counted between two readings of its counters."""
    return ServerTimes.from_delta({key: after[key] - before[key] for key in after})


def _stage_us(times: ServerTimes) -> float:
    return (times.compute_input_ms + times.compute_infer_ms + times.compute_output_ms) * 1000


def in_process(
    driver: Path, store: Path, hot_set: Path, pool: Sequence[np.ndarray], lookups: int
) -> dict[str, float]:
    """The pool's lookups in process with the stage's default tier, warmed by one pass over the
    pool, then ``lookups`` of them timed: the medians of the lookup, of a copy of each request's
    bytes, and of those bytes.

    Raises:
        BundleError: the driver is not built, or it fails.
    """
    if not driver.is_file():
        raise BundleError(f"no lookup driver at {driver}: build the compiled stages first (make stages)")
    lines = [
        f"store {store}",
        f"hot_set {hot_set}",
        "table_sizes " + ",".join(str(size) for size in _table_sizes(store)),
        "way io_uring",
        "cache_bytes default",
    ]
    requests = [
        f"ids {ids.shape[0]} {ids.shape[1]} " + " ".join(map(str, ids.reshape(-1).tolist())) for ids in pool
    ]
    lines += [*requests, f"time {len(pool)}", *requests, f"time {lookups}"]
    done = subprocess.run(
        [str(driver)], input="\n".join(lines) + "\n", capture_output=True, text=True, check=False
    )
    timed = [line.split() for line in done.stdout.splitlines() if line.startswith("time ")]
    errors = [line for line in done.stdout.splitlines() if line.startswith("error ")]
    if done.returncode != 0 or errors or len(timed) != 2:
        raise BundleError(
            f"the lookup driver failed (exit {done.returncode}): "
            + (errors[0] if errors else done.stderr.strip()[-300:] or "no timing")
        )
    lookup_ns, copy_ns, moved = (int(value) for value in timed[1][1:])
    return {"lookup_us": lookup_ns / 1000, "copy_us": copy_ns / 1000, "bytes": moved}


def _table_sizes(store: Path) -> tuple[int, ...]:
    from export.tables.row_store import RowStore

    return RowStore.open(store).spec.table_sizes


def run_stage_speed(
    options: StageSpeedOptions, command: str, advance: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Time each compiled stage served, and the embedding stage's lookups in process (see the
    module); the JSON-ready result.

    Raises:
        ServerError: the server or a stage does not come up (a compiled stage not built:
            ``make stages``).
        BundleError: the lookup driver is not built or fails.
    """
    import tritonclient.grpc as grpcclient

    from clients.triton import TritonClient
    from server.config import ServerConfig
    from server.installation import COMPILED_STAGES
    from server.launcher import LocalServer

    driver = (options.build or COMPILED_STAGES) / LOOKUP_DRIVER
    record = RunRecord.begin(command)
    steps: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stage-speed-") as scratch:
        repository = Path(scratch) / "repository"
        repository.mkdir()
        stages, store, hot_set = _write_stages(repository, options)
        config = ServerConfig.with_free_ports(repository, log_file=options.log_file)
        with (
            LocalServer(config) as server,
            TritonClient(server.grpc_url, "grpc") as stats,
            grpcclient.InferenceServerClient(server.grpc_url) as client,
        ):
            for stage in stages:
                for batch_size in options.batch_sizes:
                    pool = stage.pools[batch_size]
                    _send(client, stage, pool, 2 * len(pool))  # warm: the tier, the buffers
                    rounds: list[ServerTimes] = []
                    ensemble_us: list[float] = []
                    for _ in range(options.rounds):
                        before = _counters(stats, stage.model)
                        ensemble_before = _counters(stats, stage.ensemble)
                        _send(client, stage, pool, options.requests)
                        after = _counters_after(stats, stage.model, before, options.requests)
                        ensemble_after = _counters_after(
                            stats, stage.ensemble, ensemble_before, options.requests
                        )
                        rounds.append(_delta(before, after))
                        ensemble_us.append(_delta(ensemble_before, ensemble_after).request_ms * 1000)
                        advance()
                    step: dict[str, Any] = {
                        "stage": stage.name,
                        "model": stage.model,
                        "batch_size": batch_size,
                        "stage_us": statistics.median(_stage_us(t) for t in rounds),
                        "request_us": statistics.median(t.request_ms * 1000 for t in rounds),
                        "ensemble_us": statistics.median(ensemble_us),
                        "queue_us": statistics.median(t.queue_ms * 1000 for t in rounds),
                        "input_us": statistics.median(t.compute_input_ms * 1000 for t in rounds),
                        "infer_us": statistics.median(t.compute_infer_ms * 1000 for t in rounds),
                        "output_us": statistics.median(t.compute_output_ms * 1000 for t in rounds),
                        "rounds_stage_us": [_stage_us(t) for t in rounds],
                        "requests": sum(t.requests for t in rounds),
                    }
                    if stage.input_name == CATEGORICAL_INPUT:
                        step["cold_share"] = 1 - HOT_SHARES[stage.name]
                        step.update(in_process(driver, store, hot_set, pool, options.in_process))
                    steps.append(step)
    return {
        **record.finish().to_json(),
        "requests": options.requests,
        "rounds": options.rounds,
        "pool": POOL,
        "rows_per_table": options.rows_per_table,
        "width": options.width,
        "in_process": options.in_process,
        "targets_us": {str(batch): bound for batch, bound in TARGET_US.items()},
        "steps": steps,
    }


def _verdict(step: dict[str, Any]) -> str:
    bound = TARGET_US.get(step["batch_size"])
    if bound is None or "lookup_us" not in step:
        return ""
    return f"{'yes' if step['stage_us'] <= bound else 'NO'} (<= {bound:g})"


def report_lines(document: dict[str, Any]) -> list[str]:
    """The markdown report: the stages' time per warm request, and the embedding stage beside its
    in-process lookup and its copy bound."""
    lines = [
        "# The compiled stages per warm request: served, in process, and a copy bound",
        "",
        *RunRecord.from_json(document).lines(),
        "",
        f"One local tritonserver; {document['requests']} requests per stage, batch size and round, one at a "
        f"time, cycling over a pool of {document['pool']} different requests sent once before (warm), "
        f"{document['rounds']} rounds; medians of the rounds. From Triton's statistics of each model: "
        "*stage* is the backend's whole work per request (its inputs in, its work, its outputs out, up to "
        "its complete response handed to Triton), *request* the stage's arrival to that hand-over; as "
        "Triton's own backends count it, the response's send (Triton passing it on to the ensemble's "
        "next step) is outside both, and *ensemble* (the ensemble's arrival to its response, the "
        "stand-in next step's work included) carries it. The embedding stage reads a float32 store of "
        f"26 x {document['rows_per_table']:,} rows of {document['width']} values with its default config "
        "(its memory tier of cold rows holds the whole store); a tenth of each table's rows are hot. "
        "*in process*: the same pool's lookups (placement and cold reads) through the stage's own code "
        f"outside Triton, {document['in_process']} timed; *copy bound*: one memcpy of a request's bytes "
        "(its ids in, its outputs out), in that process.",
        "",
        section_start("embedding"),
    ]
    header = [
        "set-up", "batch", "cold lookups", "stage us", "request us", "ensemble us", "in process us",
        "copy bound us", "bytes", "stage / in process", "within target",
    ]  # fmt: skip
    rows = []
    for step in document["steps"]:
        if "lookup_us" not in step:
            continue
        cold = round(step["batch_size"] * 26 * step["cold_share"])
        rows.append(
            [
                step["stage"], str(step["batch_size"]), f"~{cold:,}", step["stage_us"], step["request_us"],
                step["ensemble_us"], step["lookup_us"], step["copy_us"], f"{step['bytes']:,}",
                f"{step['stage_us'] / step['lookup_us']:.1f}x", _verdict(step),
            ]
        )  # fmt: skip
    lines += table(header, rows, align="lrrrrrrrrrl")
    lines += [section_end("embedding"), "", section_start("raw-rows")]
    raw = [s for s in document["steps"] if "lookup_us" not in s]
    lines += table(
        ["stage", "batch", "stage us", "request us", "ensemble us", "stage us per row"],
        [
            [
                s["stage"],
                str(s["batch_size"]),
                s["stage_us"],
                s["request_us"],
                s["ensemble_us"],
                s["stage_us"] / s["batch_size"],
            ]
            for s in raw
        ],
        align="lrrrrr",
    )
    lines += [section_end("raw-rows"), ""]
    return lines


def write_stage_speed(document: dict[str, Any], out: Path) -> dict[str, Path]:
    """``stage_speed.json``, ``stage_speed.md`` and ``stage_speed.png`` in ``out``."""
    # One panel per stage: the embedding set-ups with their in-process and copy curves, then the
    # raw-row stage, served alone.
    panels = []
    titles = {**{setup: f"embedding stage, {setup}" for setup in HOT_SHARES}, "raw rows": "raw-row stage"}
    curves = (
        ("served: the stage's time (Triton)", "stage_us", "served"),
        ("in process: its lookup alone", "lookup_us", "process"),
        ("memcpy of its bytes", "copy_us", "copy"),
    )
    for stage, title in titles.items():
        mine = [step for step in document["steps"] if step["stage"] == stage]
        if not mine:
            continue
        x = [float(step["batch_size"]) for step in mine]
        series = [
            Series(label, x, [s[key] for s in mine], color_key=color)
            for label, key, color in curves
            if key in mine[0]
        ]
        panels.append(
            Panel(
                title=title,
                xlabel="rows per request",
                ylabel="us per warm request (median)",
                series=series,
                xlog2=True,
                ylog=True,
                xticks=x,
            )
        )
    return {
        "json": write_json(out / "stage_speed.json", document),
        "markdown": write_markdown(out / "stage_speed.md", report_lines(document)),
        "png": plot(out / "stage_speed.png", "The compiled stages per warm request", panels),
    }
