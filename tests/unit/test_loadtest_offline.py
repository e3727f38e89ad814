"""loadtest logic that needs no server: the order of the peer comparison's steps, rounds, and the
steps whose engine gave no figures."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from bundle.errors import ClientError
from loadtest.sweeps import runs
from loadtest.sweeps.steps import StepResult, SweepConfig, Target, median_step


def _step(target: Target, config: SweepConfig) -> StepResult:
    (concurrency,) = config.concurrency
    return StepResult(
        label=target.label, model=config.models[0], protocol=target.protocol,
        batch_size=config.batch_size, concurrency=concurrency, processes=1, seconds=1.0,
        requests=1, errors=0, requests_per_s=1.0, samples_per_s=float(config.batch_size),
        p50_ms=1.0, p90_ms=1.0, p95_ms=1.0, p99_ms=1.0, mean_ms=1.0, max_ms=1.0,
        engine=target.engine, samples_per_s_min=float(config.batch_size),
        samples_per_s_max=float(config.batch_size),
    )  # fmt: skip


def test_peer_steps_are_interleaved_with_the_first_server_rotating(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[tuple[int, int, str]] = []

    def fake_sweep(target: Target, config: SweepConfig, *args: object, **kwargs: object) -> list[StepResult]:
        step = _step(target, config)
        ran.append((step.batch_size, step.concurrency, step.label))
        return [step]

    monkeypatch.setattr(runs, "run_sweep", fake_sweep)
    targets = [
        Target("127.0.0.1:1", "grpc", "triton"),
        Target("127.0.0.1:2", "grpc", "pytriton", server_stats=False),
        Target("127.0.0.1:3", "fastapi", "fastapi", server_stats=False),
    ]
    options = runs.RunOptions(batch_sizes=(1, 1024), concurrency=(1, 2, 4), max_rows_in_flight=2048)
    steps = runs._interleaved_steps(targets, "m", options, tmp_path, tmp_path / "payload.npz")

    # One result per server and level, each level's in the servers' order.
    assert [(s.batch_size, s.concurrency, s.label) for s in steps] == [
        (b, c, label)
        for b, c in dict.fromkeys((b, c) for b, c, _ in ran)
        for label in ("triton", "pytriton", "fastapi")
    ]
    # Every (batch, concurrency) level runs all three servers back to back before the next level.
    levels = [(b, c) for b, c, _ in ran]
    assert levels == [(1, 1)] * 3 + [(1, 2)] * 3 + [(1, 4)] * 3 + [(1024, 1)] * 3 + [(1024, 2)] * 3
    # The server that goes first rotates from level to level.
    firsts = [ran[i][2] for i in range(0, len(ran), 3)]
    assert firsts == ["triton", "pytriton", "fastapi", "triton", "pytriton"]
    assert all(sorted(label for _, _, label in ran[i : i + 3]) == ["fastapi", "pytriton", "triton"]
               for i in range(0, len(ran), 3))  # fmt: skip


def test_rounds_repeat_each_level_and_give_each_server_its_median(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rates = iter(float(v) for v in range(100, 200))
    folders: list[Path] = []

    def fake_sweep(
        target: Target, config: SweepConfig, out: Path, *args: object, **kwargs: object
    ) -> list[StepResult]:
        folders.append(out)
        rate = next(rates)
        samples = rate * config.batch_size
        step = replace(
            _step(target, config),
            requests_per_s=rate,
            samples_per_s=samples,
            samples_per_s_min=samples,
            samples_per_s_max=samples,
        )
        return [replace(step, p99_ms=1000.0 / rate, max_ms=rate)]

    monkeypatch.setattr(runs, "run_sweep", fake_sweep)
    targets = [
        Target("127.0.0.1:1", "grpc", "triton"),
        Target("127.0.0.1:2", "fastapi", "fastapi", server_stats=False),
    ]
    options = runs.RunOptions(batch_sizes=(64,), concurrency=(1,), rounds=3)
    steps = runs._interleaved_steps(targets, "m", options, tmp_path, tmp_path / "p.npz")

    # Rounds 1-3 in their own folders; order triton,fastapi / fastapi,triton / triton,fastapi.
    assert folders == [tmp_path / f"round{r}" for r in (1, 1, 2, 2, 3, 3)]
    by_label = {step.label: step for step in steps}
    assert [step.label for step in steps] == ["triton", "fastapi"]
    triton, fastapi = by_label["triton"], by_label["fastapi"]
    # triton got rates 100, 103, 104 and fastapi 101, 102, 105: medians 103 and 102.
    assert triton.requests_per_s == 103.0 and triton.samples_per_s == 103.0 * 64
    assert fastapi.requests_per_s == 102.0
    assert triton.p99_ms == pytest.approx(1000.0 / 103) and triton.max_ms == 104.0
    assert triton.requests == 3 and triton.seconds == 3.0
    # The spread over the rounds: (104 - 100) / 103 of triton's rate.
    assert triton.rounds == 3 and triton.spread == pytest.approx(4 / 103)


def test_median_step_refuses_rounds_of_different_steps() -> None:
    config = SweepConfig(models=("m",), batch_size=1, concurrency=(1,))
    one = _step(Target("127.0.0.1:1", "grpc", "triton"), config)
    assert median_step([one]) is one
    with pytest.raises(ValueError, match="rounds of different steps"):
        median_step([one, replace(one, concurrency=2)])


def test_rounds_keep_the_shared_cores_reason_of_the_rounds_that_gave_it() -> None:
    config = SweepConfig(models=("m",), batch_size=1, concurrency=(1,))
    quiet = replace(
        _step(Target("127.0.0.1:1", "grpc", "triton"), config), server_cores=1.0, shared_share=0.05
    )
    reason = "load generator and server share 2 core(s), 99% busy: the load generator took 20% of the CPU"
    taken = replace(quiet, server_cores=1.6, shared_share=0.2, client_bound=True, bound_reason=reason)
    combined = median_step([quiet, taken, taken])
    assert combined.client_bound and combined.bound_reason == reason
    assert combined.shared_share == 0.2 and combined.server_cores == 1.6
    # Bound in one round of three: the step is not, and gives no reason.
    assert not median_step([quiet, quiet, taken]).client_bound
    assert median_step([quiet, quiet, taken]).bound_reason == ""


def test_a_sweep_of_a_running_server_without_its_repository_says_how_to_get_the_baseline(
    tmp_path: Path,
) -> None:
    """Every report states the served / in-process ratio, so a sweep that cannot time the
    model in-process stops before any load, instead of silently leaving the ratio out."""
    from bundle.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--repository DIR.*--no-baseline"):
        runs.sweep_run(
            models=["dlrm_onnx"],
            protocols=["grpc"],
            urls=["127.0.0.1:1"],
            repository=None,
            options=runs.RunOptions(batch_sizes=(1,), concurrency=(1,)),
            out=tmp_path / "sweep",
            title="t",
            command="test",
        )
    assert not (tmp_path / "sweep").exists()


def test_locust_gets_absolute_paths_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """locust runs in the repository root; a relative --out given elsewhere must still resolve."""
    from loadtest.sweeps.sweep import locust_command

    monkeypatch.chdir(tmp_path)
    config = SweepConfig(models=("dlrm_onnx",), batch_size=8, concurrency=(1,))
    command = locust_command(
        Target("127.0.0.1:1", "grpc", "triton"),
        "dlrm_onnx",
        config,
        1,
        Path("out/payload.npz"),
        Path("out/s"),
    )
    for flag in ("--payload", "--results-dir", "--csv"):
        value = Path(command[command.index(flag) + 1])
        assert value.is_absolute() and value.is_relative_to(tmp_path), (flag, value)


def _served_model(repository: Path, kind: str) -> Path:
    """A one-node model (sigmoid of the counts' sum) in ``repository/m/1`` with an instance of ``kind``."""
    import onnx
    from onnx import TensorProto, helper

    from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT

    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", [DENSE_INPUT], ["s"], keepdims=1),
            helper.make_node("Sigmoid", ["s"], [OUTPUT]),
        ],
        "g",
        [
            helper.make_tensor_value_info(DENSE_INPUT, TensorProto.FLOAT, ["b", NUM_DENSE]),
            helper.make_tensor_value_info(CATEGORICAL_INPUT, TensorProto.INT64, ["b", NUM_CATEGORICAL]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["b", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = repository / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save_model(model, str(path))
    (repository / "m" / "config.pbtxt").write_text(f'name: "m"\ninstance_group {{ kind: {kind} }}\n')
    return path


def test_the_baseline_runs_on_the_served_models_device(tmp_path: Path) -> None:
    """A KIND_GPU model is timed on ONNX Runtime's CUDA provider (as the server runs it), never
    silently on the CPU; without onnxruntime-gpu that is one clear error."""
    import onnxruntime as ort

    from bundle.errors import ConfigError
    from loadtest.engine.baseline import BaselineConfig, InProcessModel
    from loadtest.engine.payload import build_pool

    cpu = InProcessModel(
        BaselineConfig(_served_model(tmp_path / "cpu", "KIND_CPU"), (4,), repeats=1, seconds=0.01)
    )
    result = cpu.measure(4, build_pool(1, batches=16))
    assert cpu.device == "cpu" and result.provider == "CPUExecutionProvider"

    gpu_file = _served_model(tmp_path / "gpu", "KIND_GPU")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        model = InProcessModel(BaselineConfig(gpu_file, (4,), repeats=1, seconds=0.01))
        assert model.measure(4, build_pool(1, batches=16)).provider == "CUDAExecutionProvider"
    else:
        with pytest.raises(ConfigError, match=r"KIND_GPU.*onnxruntime-gpu.*--no-baseline"):
            InProcessModel(BaselineConfig(gpu_file, (4,)))


def test_a_step_without_figures_keeps_its_row_with_the_reason_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import math

    from bundle.errors import BundleError

    def fake_sweep(target: Target, config: SweepConfig, *args: object, **kwargs: object) -> list[StepResult]:
        if target.label == "broken" and config.concurrency == (2,):
            raise BundleError("no latency results\nsee locust.log")
        return [_step(target, config)]

    monkeypatch.setattr(runs, "run_sweep", fake_sweep)
    targets = [Target("127.0.0.1:1", "grpc", "triton"), Target("127.0.0.1:2", "grpc", "broken")]
    failed: list[str] = []
    options = runs.RunOptions(batch_sizes=(8,), concurrency=(1, 2))
    steps = runs._interleaved_steps(targets, "m", options, tmp_path, tmp_path / "p.npz", failed=failed)
    assert [(s.label, s.concurrency, s.measured) for s in steps] == [
        ("triton", 1, True), ("broken", 1, True), ("triton", 2, True), ("broken", 2, False),
    ]  # fmt: skip
    missing = steps[-1]
    assert missing.failure == "no latency results; see locust.log" and missing.engine == "locust"
    assert missing.requests == 0 and math.isnan(missing.samples_per_s) and math.isnan(missing.p99_ms)
    # Its row says it all: nothing else to note.
    assert failed == []
    # Read back from a report's JSON (NaN there is null), it is the same step.
    from loadtest.engine.writer import json_safe

    again = StepResult.from_dict(json_safe(missing.as_dict()))
    assert again.failure == missing.failure and math.isnan(again.samples_per_s)


def test_rounds_without_figures_leave_the_median_to_the_others_and_are_noted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from bundle.errors import BundleError

    calls: dict[str, int] = {}

    def fake_sweep(target: Target, config: SweepConfig, *args: object, **kwargs: object) -> list[StepResult]:
        calls[target.label] = calls.get(target.label, 0) + 1
        # "flaky" has no figures in its second round of three, "dead" in none of them.
        if target.label == "dead" or (target.label == "flaky" and calls["flaky"] == 2):
            raise BundleError("perf_analyzer exited with code 2: Failed to obtain stable measurement")
        return [_step(target, config)]

    monkeypatch.setattr(runs, "run_sweep", fake_sweep)
    targets = [Target("127.0.0.1:1", "grpc", "flaky"), Target("127.0.0.1:2", "grpc", "dead")]
    failed: list[str] = []
    options = runs.RunOptions(batch_sizes=(8,), concurrency=(1,), rounds=3)
    flaky, dead = runs._interleaved_steps(targets, "m", options, tmp_path, tmp_path / "p.npz", failed=failed)
    assert flaky.measured and flaky.rounds == 2 and flaky.requests == 2
    assert not dead.measured
    assert dead.failure == "no figures in any of 3 rounds: perf_analyzer exited with code 2: " + (
        "Failed to obtain stable measurement"
    )
    assert failed == [
        "flaky m grpc B=8 c=1: 1 of 3 rounds gave no figures, the step's are the median of the others: "
        "perf_analyzer exited with code 2: Failed to obtain stable measurement"
    ]


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
            "without Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "closed the connection"),
        (b"garbage\r\n\r\n", "not an HTTP/1.1 answer"),
    ],
)
def test_the_raw_http_client_refuses_an_answer_it_cannot_read_in_one_line(
    answer: bytes, message: str
) -> None:
    """An answer framed other than by Content-Length, cut short, or not HTTP fails the request
    (never a silent wrong answer), and the connection is dropped."""
    import socket
    import threading

    from loadtest.engine.wire import RawHttpInfer

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    raw = RawHttpInfer(f"127.0.0.1:{listener.getsockname()[1]}", "m", 10, timeout_s=5)
    try:
        with pytest.raises(ClientError, match=message) as error:
            raw(b"x" * 20, 1)
        assert "\n" not in str(error.value) and raw._socket is None
    finally:
        raw.close()
        listener.close()
        thread.join(timeout=5)


def test_a_server_the_sweep_starts_gets_the_cores_its_load_generator_leaves() -> None:
    cores = frozenset(os.sched_getaffinity(0))
    assert runs.server_cpus(None) is None
    assert runs.server_cpus(cores) is None  # the client takes every core: the server may use any
    if len(cores) > 1:
        assert runs.server_cpus(frozenset({min(cores)})) == cores - {min(cores)}
