"""The commands of ``python -m lab`` (registered by :mod:`lab.__main__`): each reproduces a committed
result under ``benchmarks/``.

- ``soak``: the local tritonserver under steady, checked load; requests, errors, RSS growth.
- ``client-cost``: the client-side cost per request of HTTP, gRPC and shared memory.
- ``precision``: served and in-process samples/s of FP32, FP16 and INT8 against the sgemm ceiling.
- ``serving-defaults``: candidate serving settings (threads, instances, batcher) through the server.
- ``gpu``: served and in-process samples/s of every variant on the served device (:mod:`lab.gpu`).
- ``gpu-vs-cpu``: GPU served against CPU served on one host, from two ``gpu`` results
  (:mod:`lab.devices`).
- ``kernels``: each CUDA kernel's GPU time in one call of a model (:mod:`lab.kernels`).
- ``cold-reads``: the embedding stage's ways of reading cold rows, on a store evicted from memory,
  beside the disk's own random-read rate (:mod:`lab.cold_reads`).
- ``cold-tier``: a hot/cold model served with its store evicted and in memory, side by side
  (:mod:`lab.cold_tier`).
- ``stage-speed``: the compiled stages per warm request, served, in process and against a copy
  bound (:mod:`lab.stage_speed`).
- ``ranking-speed``: ranking requests (one user and its candidates) against flat ones through the
  server (:mod:`lab.ranking_speed`).
- ``model-analyzer``: ``loadtest tune`` beside Triton Model Analyzer, same model, space and budgets
  (:mod:`lab.model_analyzer`).
- ``raw-rows``: raw rows against tensors through the server (:mod:`lab.raw_rows`).
- ``open-loop``: open against closed loop on one model, its capacity under a p99 budget and
  MLPerf's verdict at that rate (:mod:`lab.open_loop`).
- ``faults``: crashes, damaged files, interrupted writes, a full disk (:mod:`lab.faults`).

Each builds its options object and calls the library function of its module;
the committed results under ``benchmarks/`` come from the ``run.sh`` beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

from bundle.errors import ConfigError
from bundle.options import Model, ReportOut, Repository, RowsPerRequest, SharedMemory, TritonLog, UserFeatures
from bundle.records import command_line
from lab.faults.table import FAULTS
from loadtest.options import (
    BaselineRepeats,
    BaselineSeconds,
    BatchSizes,
    ClientBatchSizes,
    ClientCpus,
    Concurrency,
    Connections,
    Data,
    Duration,
    Family,
    GemmSize,
    InstanceCounts,
    MaxRate,
    MinRequests,
    P99Budget,
    Processes,
    Protocol,
    QueueDelays,
    Resolution,
    Rounds,
    RowsPerCall,
    Seconds,
    StartRate,
    TimedRepeats,
    Warmup,
)
from loadtest.sweeps.steps import parse_cpus, parse_ints

_T = TypeVar("_T")

# The options that several lab commands take, each declared once (the load tests' come from
# loadtest.options, the stages' from bundle.options); each command gives its own default.
ServedRepository = Annotated[
    _T,
    typer.Option(
        "--repository",
        "-r",
        help="Model repository to serve: the local tritonserver starts on it.",
        file_okay=False,
    ),
]
HeldOutData = Annotated[
    Path,
    typer.Option(
        "--data", help="Held-out Criteo TSV: the requests send its rows in order, none twice in a step."
    ),
]
Stage = Annotated[str, typer.Option("--stage", help="The hot/cold embedding stage's model name.")]
Ways = Annotated[list[str] | None, typer.Option("--way", help="A way of reading cold rows (repeatable).")]
WayThreads = Annotated[int, typer.Option("--threads", help="Threads of the 'threads' way.")]
Requests = Annotated[int, typer.Option("--requests", help="Measured requests per compared case.")]
# ``--candidates`` of python -m criteo synth is one size (a request's mean).
CandidateSizes = Annotated[
    str, typer.Option("--candidates", help="Candidates per user, comma-separated, one step each.")
]
Steps = Annotated[
    list[str] | None,
    typer.Option("--step", help="A measured step BATCHxCONCURRENCY, e.g. 1024x4 (repeatable)."),
]
Work = Annotated[
    _T,
    typer.Option(
        "--work",
        help="Scratch folder of the run's models, copies and logs (where optional: a temporary one).",
        file_okay=False,
    ),
]
GpuResult = Annotated[
    Path, typer.Option("--gpu", help="The lab gpu result (result.json or its folder) of the gpu profile.")
]
CpuResult = Annotated[
    Path, typer.Option("--cpu", help="The lab gpu result (result.json or its folder) of the cpu profile.")
]
# Flags that other commands take with another meaning.
SoakDuration = Annotated[float, typer.Option("--duration", help="Seconds of load, warm-up included.")]
ClientThreads = Annotated[int, typer.Option("--threads", help="Client threads (alternating gRPC and HTTP).")]
WarmupRequests = Annotated[int, typer.Option("--warmup", help="Warm-up requests per case.")]
SoakReference = Annotated[
    list[str] | None,
    typer.Option(
        "--reference",
        help="MODEL=ONNX: the in-graph model whose in-process answers MODEL must give, for a model "
        "without an ONNX file of its own (a hot/cold ensemble: the same checkpoint exported in-graph); "
        "MODEL_raw is checked against MODEL's. Repeatable.",
    ),
]
RunStageInstances = Annotated[
    int,
    typer.Option("--stage-instances", help="Instances of the embedding stage for the run (0: as exported)."),
]


def soak(
    repository: ServedRepository[Path] = Path("model_repository"),
    model: Model[list[str] | None] = None,
    reference: SoakReference = None,
    duration: SoakDuration = 600.0,
    warmup: Warmup = 60.0,
    rate: Annotated[float, typer.Option(help="Requests per second over all client threads.")] = 100.0,
    threads: ClientThreads = 2,
    batch_size: RowsPerCall[list[int] | None] = None,
    data: Data = None,
    sample_interval: Annotated[float, typer.Option(help="Seconds between RSS samples.")] = 5.0,
    log_file: TritonLog = Path("logs/soak-tritonserver.log"),
    out: ReportOut[Path] = Path("reports/soak"),
) -> None:
    """Serve the repository, keep it under checked load, print the summary, write the result files
    (result.json, result.md, rss.png). Every model is loaded and load-tested unless --model names some;
    the requests take 1, 8, 64 and 256 rows unless --batch-size says otherwise; the RSS baseline is
    taken after --warmup."""
    from lab.soak import MAX_RSS_GROWTH, SoakConfig, SoakFailed, run_soak, write_result

    pairs = []
    for given in reference or ():
        name, sep, path = given.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--reference takes MODEL=PATH to an ONNX file, got {given!r}")
        pairs.append((name, Path(path)))
    config = SoakConfig(
        repository=repository,
        models=tuple(model or ()),
        references=tuple(pairs),
        duration_s=duration,
        warmup_s=warmup,
        rate=rate,
        threads=threads,
        batch_sizes=tuple(batch_size or (1, 8, 64, 256)),
        sample_interval_s=sample_interval,
        data=data,
        log_file=log_file,
    )
    result = run_soak(config, command_line("lab"))
    paths = write_result(result, out)
    summary = result.as_dict()["summary"]
    print(
        f"{summary['requests']} requests, {summary['errors']} errors, {summary['wrong']} wrong answers, "
        f"RSS growth after warm-up {result.rss_growth:+.2%}; report: {paths['markdown']}"
    )
    if not result.passed:
        raise SoakFailed(
            f"soak missed its targets (0 errors, RSS growth < {MAX_RSS_GROWTH:.0%}, whole run): "
            f"see {paths['markdown']}"
        )


def client_cost(
    repository: ServedRepository[Path | None] = None,
    http_url: Annotated[str | None, typer.Option(help="HTTP host:port of a running server.")] = None,
    grpc_url: Annotated[str | None, typer.Option(help="gRPC host:port of a running server.")] = None,
    model: Model[str] = "dlrm_onnx",
    batch_size: RowsPerRequest[list[int] | None] = None,
    requests: Requests = 1000,
    warmup: WarmupRequests = 50,
    rounds: Rounds = 10,
    out: ReportOut[Path] = Path("reports/client_cost"),
) -> None:
    """Measure the client-side cost per request of HTTP, gRPC and shared memory (a benchmark)."""
    from lab.client_cost import CostOptions, local_server, run_client_cost, write_report

    options = CostOptions(model, tuple(batch_size or (1, 1024)), requests, warmup, rounds)
    command = command_line("lab")
    if repository is not None:
        if http_url or grpc_url:
            raise ConfigError("give either --repository or --http-url/--grpc-url, not both")
        with local_server(repository) as (http, grpc):
            report = run_client_cost(http, grpc, options, command)
        data = repository.parent
        reproduce = [
            f"# any repository serving {model}; the cost depends on tensor sizes, not weights. Here:",
            f"python -m criteo synth --rows 5000 --out {data}/rows.tsv",
            f"python -m models train dlrm --data {data}/rows.tsv --out {data}/dlrm --preset tiny",
            f"python -m export dlrm --checkpoint {data}/dlrm --repository {repository}",
            command,
        ]
    else:
        if not (http_url and grpc_url):
            raise ConfigError("give --repository, or both --http-url and --grpc-url of a running server")
        report = run_client_cost(http_url, grpc_url, options, command)
        reproduce = ["python -m server serve --repository model_repository   # in another terminal", command]
    paths = write_report(report, out, reproduce)
    print(f"report: {paths['markdown']}")


def precision(
    repository: Repository[Path],
    dynamic_repository: Annotated[
        Path | None,
        typer.Option(
            help="Repository exported with --int8-method dynamic (served as <family>_onnx_int8_dynamic)."
        ),
    ] = None,
    out: ReportOut[Path] = Path("reports/cpu"),
    data: Data = None,
    batch_size: RowsPerCall[int] = 1024,
    concurrency: Concurrency = "1,2,4",
    rounds: Rounds = 5,
    seconds: Seconds = 2.0,
    gemm_size: GemmSize = 4096,
) -> None:
    """Served and in-process samples/s of FP32, FP16 and INT8 as fractions of the sgemm ceiling."""
    from lab.precision import PrecisionOptions, run_precision, write_precision

    options = PrecisionOptions(
        repository=repository,
        out=out,
        dynamic_repository=dynamic_repository,
        data=data,
        batch_size=batch_size,
        concurrency=parse_ints(concurrency, "--concurrency"),
        rounds=rounds,
        seconds=seconds,
        gemm_size=gemm_size,
    )
    paths = write_precision(run_precision(options, command_line("lab")), out)
    print(f"report: {paths['markdown']}")


def gpu(
    repository: Repository[Path],
    out: ReportOut[Path] = Path("reports/gpu"),
    model: Model[list[str] | None] = None,
    data: Data = None,
    step: Steps = None,
    shared_memory: SharedMemory[str] = "system",
    protocol: Protocol[str] = "grpc",
    processes: Processes = 8,
    seconds: Seconds = 2.0,
    repeats: TimedRepeats = 3,
    warmup: Warmup = 1.5,
    baseline_seconds: BaselineSeconds = 1.0,
    baseline_repeats: BaselineRepeats = 3,
    profile_calls: Annotated[
        int, typer.Option(help="Profiled ONNX Runtime calls per ONNX model (0: no profile).")
    ] = 20,
) -> None:
    """Served and in-process samples/s of every variant, side by side, on the served device.

    A gpu-profile repository (a cpu one runs on the CPU); every model with a file unless --model
    names some; steps of 1024 and 8192 rows at 1, 4 and 16 requests in flight unless --step."""
    from lab.gpu import DEFAULT_STEPS, GpuOptions, run_gpu_bench, write_gpu_report
    from lab.serving_defaults import parse_step

    options = GpuOptions(
        repository=repository,
        out=out,
        models=tuple(model or ()),
        data=data,
        steps=tuple(parse_step(s) for s in step) if step else DEFAULT_STEPS,
        shared_memory=shared_memory,
        protocol=protocol,
        max_processes=processes,
        seconds=seconds,
        repeats=repeats,
        warmup_s=warmup,
        in_process_seconds=baseline_seconds,
        in_process_repeats=baseline_repeats,
        profile_calls=profile_calls,
    )
    paths = write_gpu_report(run_gpu_bench(options, command_line("lab")), out)
    print(f"report: {paths['markdown']}")


def gpu_vs_cpu(
    gpu: GpuResult,
    cpu: CpuResult,
    out: ReportOut[Path] = Path("reports/gpu"),
) -> None:
    """GPU served against CPU served on the same host, per family: batch-1 p50 latency and best
    throughput, from two `lab gpu` results (the gpu-profile repository's and the cpu-profile one's,
    INT8 being the CPU default)."""
    from lab.devices import compare_devices, read_result, write_devices_report

    document = compare_devices(read_result(gpu), read_result(cpu), command_line("lab"))
    paths = write_devices_report(document, out)
    for family, found in document["families"].items():
        latency, throughput = found["latency_cpu_over_gpu"], found["throughput_gpu_over_cpu"]
        print(
            f"{family}: latency CPU/GPU {'-' if latency is None else f'{latency:.1f}x'}, "
            f"throughput GPU/CPU {'-' if throughput is None else f'{throughput:.1f}x'}"
        )
    print(f"report: {paths['markdown']}")


def kernels(
    repository: Repository[Path],
    model: Model[list[str]],
    out: ReportOut[Path] = Path("reports/gpu"),
    data: Data = None,
    batch_size: RowsPerCall[int] = 8192,
    calls: Annotated[int, typer.Option(help="Profiled calls per model.")] = 10,
    device: Annotated[
        str,
        typer.Option(
            help="gpu: each CUDA kernel's GPU time (CUPTI through torch.profiler); cpu: each operator's "
            "CPU time (ONNX Runtime's profiler, or torch.profiler for TorchScript)."
        ),
    ] = "gpu",
) -> None:
    """Each kernel's time in one call of each model: CUDA kernels on the GPU, operators on the CPU."""
    from lab.gpu import model_file
    from lab.kernels import run_kernels

    files = {}
    for name in model:
        path = model_file(repository, name)
        if path is None:
            raise ConfigError(f"model {name} has no model.onnx or model.pt in {repository}")
        files[name] = path
    paths = run_kernels(files, data, batch_size, calls, out, device)
    print(f"report: {paths['text']}")


def cold_reads(
    repository: Repository[Path],
    data: HeldOutData,
    stage: Stage = "dlrm_embedding",
    batch_size: BatchSizes = "64,1024",
    requests: Requests = 30,
    rounds: Rounds = 2,
    way: Ways = None,
    threads: WayThreads = 8,
    probe_seconds: Annotated[float, typer.Option(help="Seconds of each disk probe.")] = 3.0,
    out: ReportOut[Path] = Path("reports/cold_reads"),
) -> None:
    """The embedding stage's ways of reading cold rows, on a store evicted from memory (a benchmark):
    every way (the stage's and io_uring-no-hints) unless --way names some; --requests per way,
    batch size and round."""
    from rich.progress import Progress

    from lab.cold_reads import WAYS, ColdReadOptions, run_cold_reads, write_cold_reads

    options = ColdReadOptions(
        repository=repository,
        stage=stage,
        data=data,
        batch_sizes=parse_ints(batch_size, "--batch-size"),
        requests=requests,
        rounds=rounds,
        ways=tuple(way or WAYS),
        threads=threads,
        probe_seconds=probe_seconds,
    )
    with Progress(transient=True) as progress:
        task = progress.add_task(
            "cold reads", total=options.rounds * len(options.ways) * len(options.batch_sizes)
        )
        report = run_cold_reads(options, command_line("lab"), lambda: progress.advance(task))
    paths = write_cold_reads(report, out)
    print(f"report: {paths['markdown']}")


def cold_tier(
    repository: Repository[list[Path]],
    data: HeldOutData,
    model: Model[str] = "dlrm_onnx",
    stage: Stage = "dlrm_embedding",
    way: Ways = None,
    batch_size: BatchSizes = "64,1024",
    concurrency: Concurrency = "1,4",
    rounds: Rounds = 2,
    seconds: Seconds = 20.0,
    threads: WayThreads = 8,
    stream_rows: Annotated[int, typer.Option(help="Held-out rows read for the steps.")] = 1_500_000,
    warm: Annotated[
        str,
        typer.Option(
            help="A warm step: 'resident' (the whole store in memory) or 'cycled' (a pool of rows sent "
            "over and over; for a store larger than memory)."
        ),
    ] = "resident",
    pool_rows: Annotated[int, typer.Option(help="Rows of the cycled pool.")] = 32_768,
    stage_instances: RunStageInstances = 0,
    dense_instances: Annotated[
        int, typer.Option(help="Instances of the ensemble's dense model for the run (0: as exported).")
    ] = 0,
    dense_threads: Annotated[
        int, typer.Option(help="ONNX Runtime intra-op threads of each dense instance (0: as exported).")
    ] = 0,
    cold_cache: Annotated[
        str,
        typer.Option(
            help="The stage's cache of cold rows for the ways named with '+cache' (--way io_uring+cache), "
            "in bytes, or with K, M or G (2G); their warm steps need --warm cycled."
        ),
    ] = "0",
    out: ReportOut[Path] = Path("reports/cold_tier"),
) -> None:
    """A hot/cold model served with its store evicted (cold) and in memory (warm), side by side:
    each --repository (stores side by side) through its ensemble --model, with the ways io_uring
    and fault unless --way names others."""
    from rich.progress import Progress

    from export.tables.hot_rows import parse_size
    from lab.cold_tier import ColdTierOptions, run_cold_tier, write_cold_tier

    options = ColdTierOptions(
        repositories=tuple(repository),
        data=data,
        model=model,
        stage=stage,
        ways=tuple(way or ("io_uring", "fault")),
        batch_sizes=parse_ints(batch_size, "--batch-size"),
        concurrency=parse_ints(concurrency, "--concurrency"),
        rounds=rounds,
        seconds=seconds,
        threads=threads,
        stream_rows=stream_rows,
        warm=warm,
        pool_rows=pool_rows,
        stage_instances=stage_instances,
        dense_instances=dense_instances,
        dense_threads=dense_threads,
        cold_cache_bytes=parse_size(cold_cache),
    )
    steps = (
        options.rounds
        * len(options.repositories)
        * len(options.ways)
        * len(options.batch_sizes)
        * len(options.concurrency)
        * 2
    )
    with Progress(transient=True) as progress:
        task = progress.add_task("cold tier", total=steps)
        report = run_cold_tier(options, command_line("lab"), lambda: progress.advance(task))
    paths = write_cold_tier(report, out)
    print(f"report: {paths['markdown']}")


def stage_speed(
    batch_size: BatchSizes = "1,64,1024",
    requests: Requests = 200,
    rounds: Rounds = 5,
    in_process: Annotated[
        int, typer.Option(help="Lookups timed in process per set-up and batch size.")
    ] = 400,
    log_file: TritonLog = Path("logs/stage-speed-tritonserver.log"),
    out: ReportOut[Path] = Path("reports/stage_speed"),
) -> None:
    """The compiled stages' time per warm request, served (Triton's statistics), beside the embedding
    stage's lookup in process and a memory-copy bound of its bytes (a benchmark): --requests per
    stage, batch size and round, one at a time."""
    from rich.progress import Progress

    from lab.stage_speed import HOT_SHARES, StageSpeedOptions, run_stage_speed, write_stage_speed

    options = StageSpeedOptions(
        batch_sizes=parse_ints(batch_size, "--batch-size"),
        requests=requests,
        rounds=rounds,
        in_process=in_process,
        log_file=log_file,
    )
    with Progress(transient=True) as progress:
        task = progress.add_task(
            "stage speed", total=(1 + len(HOT_SHARES)) * len(options.batch_sizes) * options.rounds
        )
        report = run_stage_speed(options, command_line("lab"), lambda: progress.advance(task))
    paths = write_stage_speed(report, out)
    print(f"report: {paths['markdown']}")


def ranking_speed(
    candidates: CandidateSizes = "16,128,1024",
    concurrency: Concurrency = "1,4",
    duration: Duration = 5.0,
    rounds: Rounds = 3,
    user_features: UserFeatures[str] = "I1-I6,C1-C13",
    log_file: TritonLog = Path("logs/ranking-speed-tritonserver.log"),
    out: ReportOut[Path] = Path("reports/ranking_speed"),
) -> None:
    """Ranking requests (one user and its candidates, the user's features sent once) against flat
    requests of the same candidates, through one local tritonserver (a benchmark): candidates/s,
    latency per user, bytes and client CPU per candidate. Exports an untrained DLRM (INT8) with its
    ranking variant under artifacts/ranking first."""
    from rich.progress import Progress

    from lab.ranking_speed import RankingSpeedOptions, candidate_sizes, run_ranking_speed, write_ranking_speed

    options = RankingSpeedOptions(
        candidates=candidate_sizes(candidates),
        concurrency=parse_ints(concurrency, "--concurrency"),
        seconds=duration,
        rounds=rounds,
        user_features=user_features,
        log_file=log_file,
    )
    with Progress(transient=True) as progress:
        task = progress.add_task(
            "ranking speed", total=len(options.candidates) * len(options.concurrency) * options.rounds
        )
        report = run_ranking_speed(options, command_line("lab"), lambda: progress.advance(task))
    paths = write_ranking_speed(report, out)
    print(f"report: {paths['markdown']}")


def serving_defaults(
    repository: Repository[Path],
    model: Model[list[str]],
    out: ReportOut[Path] = Path("reports/cpu"),
    data: Data = None,
    candidate: Annotated[
        list[str] | None,
        typer.Option(
            help="Candidate settings by name (repeatable; default: all but the concurrency study's)."
        ),
    ] = None,
    step: Steps = None,
    rounds: Rounds = 2,
    seconds: Seconds = 3.0,
    name: Annotated[str, typer.Option(help="File stem of the results in --out.")] = "serving_defaults",
) -> None:
    """Throughput and latency of candidate serving settings (threads, instances, batcher), at the
    steps 1024x1, 1024x4, 1x1 and 1x16 unless --step names others."""
    from lab.serving_defaults import (
        STEPS,
        ServingOptions,
        parse_step,
        run_serving,
        write_serving,
    )

    options = ServingOptions(
        repository=repository,
        models=tuple(model),
        out=out,
        data=data,
        candidates=tuple(candidate or ()),
        steps=tuple(parse_step(text) for text in step) if step else STEPS,
        rounds=rounds,
        seconds=seconds,
    )
    paths = write_serving(run_serving(options, command_line("lab")), out, name)
    print(f"report: {paths['markdown']}")


def model_analyzer(
    repository: Repository[Path],
    model_analyzer_path: Annotated[
        Path, typer.Option("--model-analyzer", help="The model-analyzer executable (its own venv).")
    ] = Path("artifacts/model_analyzer/venv/bin/model-analyzer"),
    family: Family[list[str] | None] = None,
    p99_budget_ms: P99Budget[list[float] | None] = None,
    batch_sizes: ClientBatchSizes = "64,1024",
    concurrency: Concurrency = "1,2,4,8",
    instances: InstanceCounts = "1,2",
    queue_delay_us: QueueDelays = "100,2000",
    rounds: Rounds = 3,
    work: Work[Path] = Path("artifacts/model_analyzer/work"),
    out: ReportOut[Path] = Path("reports/model_analyzer"),
) -> None:
    """Run tune and Triton Model Analyzer over the same model, space and p99 budgets, and measure
    both answers side by side with perf_analyzer (a benchmark)."""
    from lab.model_analyzer import CompareOptions, run_compare, write_report

    options = CompareOptions(
        repository=repository,
        model_analyzer=model_analyzer_path,
        work=work,
        families=tuple(family or ("dlrm", "wide_deep")),
        budgets_ms=tuple(p99_budget_ms or (10.0, 50.0)),
        batch_sizes=parse_ints(batch_sizes, "--batch-sizes"),
        concurrency=parse_ints(concurrency, "--concurrency"),
        instances=parse_ints(instances, "--instances"),
        queue_delays_us=tuple(int(d) for d in queue_delay_us.split(",") if d.strip()),
        rounds=rounds,
    )
    paths = write_report(run_compare(options, command_line("lab")), out)
    print(f"report: {paths['markdown']}")


def faults(
    out: ReportOut[Path] = Path("reports/faults"),
    work: Work[Path | None] = None,
    keep: Annotated[
        bool, typer.Option("--keep/--no-keep", help="Keep the workspace (server logs) afterwards.")
    ] = False,
    fault: Annotated[
        list[str] | None,
        typer.Option(help=f"A fault to try (repeatable; default all): {', '.join(FAULTS)}."),
    ] = None,
) -> None:
    """Try every fault of the fault table on tiny models made for it; write the table.

    Crashes under load (a python-backend stub of a plain model and of the hot/cold stage,
    tritonserver itself, and tritonserver killed or crashed while the compiled raw-row stage
    serves, under python -m server serve, which restarts it), damaged files (row store, model
    files, config), an export and a rollout killed at six points each, and an export out of
    space. Exits 1 if any fault gave a wrong answer, lost a model or did not recover in time.
    """
    from lab.faults.table import measure

    table = measure(command_line("lab"), out, work, keep, tuple(fault or ()))
    print(f"{len(table.results)} faults, every target met: {out / 'result.md'}")


def raw_rows(
    repository: Repository[Path] = Path("model_repository"),
    model: Model[str] = "dlrm_onnx_int8",
    batch_size: BatchSizes = "1,1024",
    concurrency: Concurrency = "1,2,4",
    rounds: Rounds = 3,
    seconds: Seconds = 3.0,
    warmup: Warmup = 1.0,
    protocol: Protocol[str] = "grpc",
    data: Data = None,
    client_cpus: ClientCpus = None,
    out: ReportOut[Path] = Path("reports/raw_rows"),
) -> None:
    """Raw rows against tensors: samples/s and latency of <model>_raw beside <model>, where a raw
    request's time goes in the server, and the input forms timed in-process."""
    from lab.raw_rows import RawRowsOptions, run_raw_rows, verdict, write_raw_rows

    options = RawRowsOptions(
        repository, model, parse_ints(batch_size, "--batch-size"), parse_ints(concurrency, "--concurrency"),
        rounds, seconds, warmup, protocol, data, None if client_cpus is None else parse_cpus(client_cpus),
    )  # fmt: skip
    document = run_raw_rows(options, command_line("lab"))
    paths = write_raw_rows(document, out)
    print(verdict(document))
    print(f"report: {paths['markdown']}")


def open_loop(
    repository: Repository[Path] = Path("model_repository"),
    model: Model[str] = "dlrm_onnx_int8",
    batch_size: RowsPerCall[int] = 64,
    p99_budget_ms: P99Budget[float] = 10.0,
    fractions: Annotated[
        str, typer.Option("--rate-fractions", help="Open-loop steps at these fractions of the rate found.")
    ] = "0.25,0.5,0.75,1,1.25",
    concurrency: Concurrency = "1,2,4,8",
    duration: Duration = 10.0,
    warmup: Warmup = 2.0,
    start_rate: StartRate = 20.0,
    max_rate: MaxRate = 100_000.0,
    resolution: Resolution = 0.05,
    min_requests: MinRequests = 1000,
    connections: Connections = 64,
    loadgen_duration: Annotated[float, typer.Option(help="LoadGen's minimum duration, seconds.")] = 60.0,
    loadgen_min_queries: Annotated[int, typer.Option(help="LoadGen's minimum query count.")] = 1024,
    protocol: Protocol[str] = "grpc",
    data: Data = None,
    client_cpus: ClientCpus = None,
    out: ReportOut[Path] = Path("reports/open_loop"),
) -> None:
    """Open against closed loop on one model: its capacity under a p99 budget, open-loop steps at
    fractions of it beside closed-loop steps (p99 at the throughput reached), and MLPerf's Server
    scenario through LoadGen at the rate found."""
    from lab.open_loop import OpenLoopOptions, run_open_loop, write_open_loop

    try:
        shares = tuple(float(part) for part in fractions.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--rate-fractions must be comma-separated numbers, got {fractions!r}") from None
    options = OpenLoopOptions(
        repository, model, batch_size, p99_budget_ms, shares, parse_ints(concurrency, "--concurrency"),
        duration, warmup, start_rate, resolution, max_rate, connections, loadgen_duration,
        loadgen_min_queries, data, protocol, None if client_cpus is None else parse_cpus(client_cpus),
        min_requests,
    )  # fmt: skip
    document = run_open_loop(options, out, command_line("lab"))
    paths = write_open_loop(document, out)
    print(f"report: {paths['markdown']}")
