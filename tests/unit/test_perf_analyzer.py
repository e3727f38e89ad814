"""perf_analyzer as the reference engine, without a server: its pins, reading its own output, and
the client-bound rule every engine shares. Unpacking its library from Debian's package is
bundle/downloads.py's, tested in test_downloads.py."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

import pytest

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from loadtest.engine.client_cpu import (
    CORE_SHARE,
    MACHINE_SHARE,
    SERIAL_REASON,
    SERIAL_SHARE,
    ClientCpu,
    process_demand,
    thread_busy_s,
    threshold_line,
)
from loadtest.engine.payload import build_pool
from loadtest.engine.writer import json_safe
from loadtest.sweeps import perf_analyzer, perf_analyzer_install
from loadtest.sweeps.report import Report, engine_comparison, markdown, throughput_ratios
from loadtest.sweeps.steps import ServerTimes, StepResult, Target, median_step

CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait\n"
    "1,169512,101,660,277,29,4780,165,0,4774,9920,12261,17289,6015,101,5910\n"
)
STDOUT = """Request concurrency: 1
  Client:
    Request count: 1194
    Throughput: 169512 infer/sec
    Avg latency: 6015 usec (standard deviation 3241 usec)
  Server:
    Inference count: 1223680
    Execution count: 1195
    Successful request count: 1195
    Avg request latency: 5254 usec (overhead 2 usec + queue 277 usec + compute input 29 usec + compute infer \
4780 usec + compute output 165 usec)
"""


def test_the_pins_name_two_wheels_by_hash_and_one_debian_package() -> None:
    pins = perf_analyzer_install.read_pins()
    assert sorted(line.split("==")[0] for line in pins.wheels) == ["nvidia-cuda-runtime-cu12", "tritonclient"]
    assert all("--hash=sha256:" in line for line in pins.wheels)
    assert pins.deb.filename == "libb64-0d_1.2-5+b1_amd64.deb" and len(pins.deb.sha256) == 64


def test_a_pins_file_without_the_debian_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pins.txt"
    path.write_text("tritonclient==2.51.0\nnvidia-cuda-runtime-cu12==12.9.79\n")
    with pytest.raises(ConfigError, match="deb URL sha256"):
        perf_analyzer_install.read_pins(path)


def test_a_binary_that_does_not_run_is_reported_in_one_line_with_how_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "perf_analyzer"
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries: libb64.so.0d' >&2\nexit 127\n")
    broken.chmod(0o755)
    monkeypatch.setenv("PERF_ANALYZER", str(broken))
    monkeypatch.setattr(perf_analyzer_install, "venv_wrapper", lambda prefix=None: tmp_path / "none")
    monkeypatch.setattr(perf_analyzer_install.shutil, "which", lambda name: None)
    binary, reason = perf_analyzer_install.locate()
    assert binary is None
    assert "libb64.so.0d" in reason and "make setup" in reason and "\n" not in reason
    with pytest.raises(ConfigError, match="libb64"):
        perf_analyzer_install.require()


def test_its_figures_are_read_from_its_own_csv_and_summary(tmp_path: Path) -> None:
    path = tmp_path / "pa.csv"
    path.write_text(CSV)
    figures = perf_analyzer.read_figures(path, STDOUT)
    assert figures.samples_per_s == 169512.0 and figures.requests == 1194
    assert figures.p50_ms == pytest.approx(4.774) and figures.p99_ms == pytest.approx(17.289)
    assert figures.mean_ms == pytest.approx(6.015)
    assert figures.server["execution_count"] == 1195 and figures.server["queue"] == pytest.approx(0.277)
    assert figures.server["infer"] == pytest.approx(4.780)
    # Its client time per request: its own client send plus receive.
    assert figures.client_ms == pytest.approx(0.101)
    with pytest.raises(BundleError, match="Failed to obtain stable measurement"):
        perf_analyzer.read_figures(tmp_path / "missing.csv", "Failed to obtain stable measurement.\n")


#: perf_analyzer 2.51's own output (the bundle's pinned build), captured against the local
#: tritonserver (trailing blanks trimmed): a run whose windows never agreed (exit code 2, no CSV
#: written) ...
UNSTABLE_OUTPUT = """ Successfully read data for 1 stream/streams with 64 step/steps.
*** Measurement Settings ***
  Batch size: 1
  Service Kind: TRITON
  Using "time_windows" mode for stabilization
  Stabilizing using average latency and throughput
  Measurement window: 50 msec
  Using synchronous calls for inference

Request concurrency: 1
Failed to obtain stable measurement within 3 measurement windows for concurrency 1. Please try to \
increase the --measurement-interval.
Failed to obtain stable measurement.

"""
UNSTABLE_LINE = (
    "Failed to obtain stable measurement within 3 measurement windows for concurrency 1. "
    "Please try to increase the --measurement-interval."
)
#: ... runs refused before any load (exit code 99) ...
UNKNOWN_MODEL_OUTPUT = (
    "error: failed to get model metadata: Request for unknown model: 'nosuch' is not found\n"
)
NO_SERVER_OUTPUT = "error: failed to get model metadata: HTTP client failed: Couldn't connect to server\n"
#: ... and a run that measured: its summary and its ``-f --verbose-csv`` file.
MEASURED_OUTPUT = """ Successfully read data for 1 stream/streams with 64 step/steps.
*** Measurement Settings ***
  Batch size: 1
  Service Kind: TRITON
  Using "time_windows" mode for stabilization
  Stabilizing using average latency and throughput
  Measurement window: 500 msec
  Using synchronous calls for inference

Request concurrency: 1
  Client:
    Request count: 7480
    Throughput: 4125.28 infer/sec
    Avg latency: 239 usec (standard deviation 116 usec)
    p50 latency: 222 usec
    p90 latency: 324 usec
    p95 latency: 344 usec
    p99 latency: 609 usec
    Avg HTTP time: 235 usec (send/recv 24 usec + response wait 211 usec)
  Server:
    Inference count: 7480
    Execution count: 7480
    Successful request count: 7480
    Avg request latency: 139 usec (overhead 1 usec + queue 23 usec + compute input 7 usec + compute \
infer 82 usec + compute output 25 usec)

Inferences/Second vs. Client Average Batch Latency
Concurrency: 1, throughput: 4125.28 infer/sec, latency 239 usec
"""
MEASURED_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait\n"
    "1,4125.28,24,75,23,7,82,25,0,222,324,344,609,239,24,211\n"
)


@pytest.mark.parametrize(
    ("returncode", "output", "reason"),
    [
        (2, UNSTABLE_OUTPUT, f"perf_analyzer exited with code 2: {UNSTABLE_LINE}"),
        (99, UNKNOWN_MODEL_OUTPUT, f"perf_analyzer exited with code 99: {UNKNOWN_MODEL_OUTPUT.strip()}"),
        (99, NO_SERVER_OUTPUT, f"perf_analyzer exited with code 99: {NO_SERVER_OUTPUT.strip()}"),
        (
            -11,
            "Request concurrency: 1\n",
            "perf_analyzer was killed by SIGSEGV; its last line: Request concurrency: 1",
        ),
        (-6, "", "perf_analyzer was killed by SIGABRT, having printed nothing"),
        (0, "# perf_analyzer -m m\n", "perf_analyzer wrote no result, printing nothing"),
    ],
)
def test_a_run_without_figures_says_why_in_one_line(returncode: int, output: str, reason: str) -> None:
    """Its exit, and the line of its own output that says most (the step log's first line, the
    command, is not one of them)."""
    assert perf_analyzer.failure_reason(returncode, output) == reason


def _fake_perf_analyzer(folder: Path, body: str) -> Path:
    """An executable that answers ``--version`` as perf_analyzer does (so :func:`locate` takes it)
    and otherwise runs ``body`` (sh), its arguments parsed into ``$csv`` (``-f``) and ``$protocol``
    (``-i``)."""
    script = folder / "perf_analyzer"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "Perf Analyzer Version 2.51.0"; exit 0; }\n'
        "csv= protocol=\n"
        'while [ $# -gt 0 ]; do case "$1" in -f) csv=$2 ;; -i) protocol=$2 ;; esac; shift; done\n'
        f"{body}\n"
    )
    script.chmod(0o755)
    return script


def test_a_crashed_run_is_one_line_naming_the_signal(tmp_path: Path) -> None:
    binary = _fake_perf_analyzer(tmp_path, 'echo "Request concurrency: 1"; kill -SEGV $$')
    with pytest.raises(BundleError) as error:
        perf_analyzer.run_step(
            binary, "127.0.0.1:1", "http", "m", 1, 1, 0.1, tmp_path / "in.json", tmp_path / "step",
            timeout_s=30.0,
        )  # fmt: skip
    assert str(error.value) == "perf_analyzer was killed by SIGSEGV; its last line: Request concurrency: 1"


def test_a_sweep_step_perf_analyzer_gives_no_figures_for_keeps_its_row_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two perf_analyzer steps through the whole sweep (its real outputs, from a stand-in binary):
    over gRPC it measures, over HTTP its windows never agree. Both steps are in report.json,
    steps.csv and report.md, the HTTP one without figures and with perf_analyzer's own line, the
    gRPC one with the figures of its CSV; the charts skip the step without figures."""
    import csv
    import json

    from loadtest.sweeps import runs

    (tmp_path / "measured.csv").write_text(MEASURED_CSV)
    (tmp_path / "measured.txt").write_text(MEASURED_OUTPUT)
    (tmp_path / "unstable.txt").write_text(UNSTABLE_OUTPUT)
    binary = _fake_perf_analyzer(
        tmp_path,
        f'case "$protocol" in\n'
        f'  grpc) cp {tmp_path}/measured.csv "$csv"; cat {tmp_path}/measured.txt ;;\n'
        f"  *) cat {tmp_path}/unstable.txt; exit 2 ;;\n"
        "esac",
    )
    monkeypatch.setenv("PERF_ANALYZER", str(binary))
    out = tmp_path / "sweep"
    options = runs.RunOptions(
        batch_sizes=(16,), concurrency=(1,), duration_s=0.3, baseline=False, engines=("perf_analyzer",)
    )
    # A raw-row model: its input needs nothing of the (absent) server.
    _, paths = runs.sweep_run(
        ["dlrm_onnx_int8_raw"], ["grpc", "http"], ["127.0.0.1:1", "127.0.0.1:2"], None, options, out,
        "t", "test",
    )  # fmt: skip

    steps = {step["protocol"]: step for step in json.loads(paths["json"].read_text())["steps"]}
    assert set(steps) == {"grpc", "http"}
    measured, unstable = steps["grpc"], steps["http"]
    assert measured["failure"] == "" and measured["engine"] == unstable["engine"] == "perf_analyzer"
    assert measured["samples_per_s"] == pytest.approx(4125.28) and measured["requests"] == 7480
    assert measured["p50_ms"] == pytest.approx(0.222) and measured["p99_ms"] == pytest.approx(0.609)
    assert measured["server"]["queue_ms"] == pytest.approx(0.023)
    reason = f"perf_analyzer exited with code 2: {UNSTABLE_LINE}"
    assert unstable["failure"] == reason
    assert unstable["requests"] == 0 and unstable["samples_per_s"] is None and unstable["p99_ms"] is None
    # The same rows in steps.csv, the reason in its own column.
    rows = {row["protocol"]: row for row in csv.DictReader(paths["csv"].open(newline=""))}
    assert rows["http"]["failure"] == reason and rows["grpc"]["failure"] == ""
    assert float(rows["grpc"]["samples_per_s"]) == pytest.approx(4125.28)
    # In report.md: under the heading, and as a row of the step table whose client column says why.
    text = paths["markdown"].read_text()
    assert f"- **No figures**: triton dlrm_onnx_int8_raw http B=16 [perf_analyzer] c=1: {reason}" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| triton |") and "| http |" in line]
    assert row.endswith(f"| no figures: {reason} | - | - | - |") and "| - | - | - | - |" in row
    # The summaries are of the measured step only; the charts were drawn.
    (best,) = json.loads(paths["json"].read_text())["summary"]["throughput"]
    assert best["protocol"] == "grpc" and best["served_samples_per_s"] == pytest.approx(4125.28)
    assert paths["throughput_png"].stat().st_size > 0 and paths["p99_png"].stat().st_size > 0
    # The report written again from its JSON says the same.
    from loadtest.sweeps.report import Report, markdown

    assert markdown(Report.load(paths["json"])) == text


def test_a_sweep_whose_every_step_gives_no_figures_writes_its_report_and_fails_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loadtest.sweeps import runs

    (tmp_path / "unstable.txt").write_text(UNSTABLE_OUTPUT)
    binary = _fake_perf_analyzer(tmp_path, f"cat {tmp_path}/unstable.txt; exit 2")
    monkeypatch.setenv("PERF_ANALYZER", str(binary))
    options = runs.RunOptions(
        batch_sizes=(16,), concurrency=(1, 2), duration_s=0.3, baseline=False, engines=("perf_analyzer",)
    )
    with pytest.raises(BundleError, match=r"no step gave figures; the first, .* c=1: perf_analyzer exited"):
        runs.sweep_run(
            ["dlrm_onnx_int8_raw"], ["http"], ["127.0.0.1:1"], None, options, tmp_path / "sweep", "t", "test"
        )
    text = (tmp_path / "sweep" / "report.md").read_text()
    assert text.count("- **No figures**: ") == 2 and UNSTABLE_LINE in text
    assert (tmp_path / "sweep" / "latency_vs_throughput.png").stat().st_size > 0


def test_input_data_holds_one_batch_one_entry_per_row(tmp_path: Path) -> None:
    import json

    pool = build_pool(8, batches=2)
    path = perf_analyzer.write_input_data(pool, tmp_path / "in.json", rows=10)
    entries = json.loads(path.read_text())["data"]
    assert len(entries) == 10
    assert entries[3]["dense_features"] == pytest.approx(pool.dense[3].tolist())
    assert entries[3]["categorical_ids"] == pool.categorical[3].tolist()


def test_the_step_command_measures_one_concurrency_into_a_csv(tmp_path: Path) -> None:
    argv = perf_analyzer.command(
        Path("/pa"),
        "127.0.0.1:8001",
        "grpc",
        "dlrm_onnx",
        64,
        4,
        2.5,
        tmp_path / "in.json",
        tmp_path / "o.csv",
    )
    joined = " ".join(argv)
    assert "--concurrency-range 4:4" in joined and "-b 64" in joined and "-i grpc" in joined
    assert "--measurement-interval 2500" in joined and "--verbose-csv" in joined


def test_client_bound_when_saturated_starved_or_taking_the_machine() -> None:
    quiet = ClientCpu.of_processes([(0.2, 1.0, 0.3)], requests=1000)
    assert not quiet.bound and quiet.per_request_us == pytest.approx(200.0)
    # One process running or waiting for a CPU most of the window: saturated, or starved.
    saturated = ClientCpu.of_processes([(0.4, 1.0, CORE_SHARE + 0.05), (0.1, 1.0, 0.1)], requests=10)
    assert saturated.bound and saturated.demand == pytest.approx(CORE_SHARE + 0.05)
    # Four processes, none saturated alone, together wanting more than the one core they may use.
    starved = ClientCpu.of_processes([(0.05, 1.0, 0.6)] * 4, requests=10, allowed=1)
    assert starved.demand < CORE_SHARE and starved.total_demand == pytest.approx(2.4) and starved.bound
    assert not ClientCpu.of_processes([(0.05, 1.0, 0.3)] * 2, requests=10, allowed=1).bound
    # Together using more than the machine share of all cores.
    cores = ClientCpu.of_processes([(0.1, 1.0, 0.1)], requests=10).cores
    heavy = ClientCpu.of_processes([(MACHINE_SHARE * cores * 1.1, 1.0, 0.5)], requests=10)
    assert heavy.share > MACHINE_SHARE * cores and heavy.bound
    # One closed-loop user whose client CPU is a third of its cycle; four users sharing it: not.
    assert ClientCpu.of_processes([(0.33, 1.0, 0.4)], requests=10, users=1).bound
    assert not ClientCpu.of_processes([(0.33, 1.0, 0.4)], requests=10, users=4).bound
    unknown = ClientCpu.of_processes([], requests=10)
    assert math.isnan(unknown.per_request_us) and not unknown.bound
    # Each flag names the part of the rule its window broke; no flag, no reason.
    assert quiet.reason() == "" and unknown.reason() == ""
    assert "one load-generator process" in saturated.reason()
    assert "2.40 cores on the 1 they may use" in starved.reason()
    assert f"of this machine's {cores} cores" in heavy.reason()
    assert (
        "each closed-loop user's request cycle"
        in ClientCpu.of_processes([(0.33, 1.0, 0.4)], requests=10).reason()
    )
    assert f"{CORE_SHARE:g} of a core" in threshold_line(2) and "2 cores" in threshold_line(2)


def test_a_step_whose_serial_client_time_is_over_a_tenth_of_its_latency_is_client_limited() -> None:
    # 841 us of serial client time against a mean latency of 6.74 ms: 12 %, with little CPU.
    slow = ClientCpu.of_processes([(0.12, 1.0, 0.12)], requests=150, serial_us=841.0, mean_ms=6.74)
    assert slow.bound and slow.serial_share == pytest.approx(0.841 / 6.74)
    assert SERIAL_REASON in slow.reason() and "841 us" in slow.reason() and "12% of the mean" in slow.reason()
    fast = ClientCpu.of_processes([(0.12, 1.0, 0.12)], requests=150, serial_us=300.0, mean_ms=6.74)
    assert not fast.bound and fast.reason() == ""
    unmeasured = ClientCpu.of_processes([(0.12, 1.0, 0.12)], requests=150)
    assert math.isnan(unmeasured.serial_share) and not unmeasured.bound
    assert f"above {SERIAL_SHARE:.0%} of the mean latency" in threshold_line(2)


def test_a_tally_adds_up_serial_client_time_across_windows_and_files() -> None:
    from loadtest.engine.latency import Tally, merged_tallies

    first, second = Tally(), Tally()
    for tally, seconds in ((first, 0.001), (first, 0.003), (second, 0.002), (second, math.nan)):
        tally.answer(5.0)
        tally.serial(seconds)
    assert first.serial_count == 2 and first.serial_us == pytest.approx(2000.0)
    assert second.serial_count == 1  # a request whose sender measured nothing is not counted
    merged = merged_tallies([first, Tally.from_json(second.to_json())])
    assert merged.serial_count == 3 and merged.serial_us == pytest.approx(2000.0)
    assert math.isnan(Tally().serial_us)


def test_thread_busy_time_is_read_for_this_process() -> None:
    before = thread_busy_s()
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:
        pass
    after = thread_busy_s()
    assert os.getpid() in after  # the main thread's id is the process id
    # Spinning for 0.3 s: this process was busy for most of it.
    assert process_demand(before, after, 0.3) > 0.5


def _step(engine: str, concurrency: int, rate: float, p50: float, bound: bool = False) -> StepResult:
    return StepResult(
        label="triton", model="m", protocol="grpc", batch_size=64, concurrency=concurrency, processes=1,
        seconds=1.0, requests=10, errors=0, requests_per_s=rate / 64, samples_per_s=rate, p50_ms=p50,
        p90_ms=p50, p95_ms=p50, p99_ms=p50, mean_ms=p50, max_ms=p50, engine=engine, client_cpu_us=100.0,
        client_bound=bound, samples_per_s_min=rate, samples_per_s_max=rate,
    )  # fmt: skip


def test_engines_are_compared_step_by_step_and_client_bound_steps_are_not_judged() -> None:
    steps = [
        _step("perf_analyzer", 1, 1000.0, 1.0),
        _step("locust", 1, 950.0, 1.05),
        _step("perf_analyzer", 4, 4000.0, 1.0),
        _step("locust", 4, 2000.0, 2.0, bound=True),
    ]
    report = Report("t", RunRecord.begin("cmd"), steps)
    rows = {row["concurrency"]: row for row in engine_comparison(report)}
    assert rows[1]["agrees"] is True and rows[1]["throughput_ratio"] == pytest.approx(0.95)
    assert rows[4]["agrees"] is None and rows[4]["client_bound"]
    # The locust series' best is its step the client did not limit, not its (bound) highest.
    best = {row["engine"]: row for row in throughput_ratios(report)}
    assert best["locust"]["at_concurrency"] == 1 and not best["locust"]["client_bound"]
    text = markdown(report)
    assert "client-bound" in text and "The engines against perf_analyzer" in text


def test_a_step_whose_rounds_spread_more_than_the_tolerance_is_not_judged_but_said_noisy() -> None:
    from dataclasses import replace

    steps = [
        replace(
            _step("perf_analyzer", 1, 1000.0, 1.0),
            rounds=2,
            samples_per_s_min=880.0,
            samples_per_s_max=1120.0,
        ),
        _step("locust", 1, 700.0, 1.4),
        _step("perf_analyzer", 2, 2000.0, 1.0),
        replace(
            _step("driver", 2, 1500.0, 1.3), rounds=2, samples_per_s_min=1460.0, samples_per_s_max=1540.0
        ),
    ]
    report = Report("t", RunRecord.begin("cmd"), steps)
    rows = {row["concurrency"]: row for row in engine_comparison(report)}
    assert rows[1]["noisy"] and rows[1]["agrees"] is None and rows[1]["spread"] == pytest.approx(0.24)
    # Rounds within 10 % of each other: judged, and 0.75 of perf_analyzer's does not agree.
    assert not rows[2]["noisy"] and rows[2]["agrees"] is False
    text = markdown(report)
    assert "| noisy: rounds spread 24% |" in text
    assert "locust: 0 of 0 judged steps agree, 0 client-bound, 1 too noisy to judge, 0 on a server" in text
    assert "driver: 0 of 1 judged steps agree, 0 client-bound, 0 too noisy to judge, 0 on a server" in text


def _rounds(engine: str, concurrency: int, *rates: float) -> StepResult:
    """A step of several rounds at ``rates`` samples/s, in the order they ran (NaN: no figures)."""
    from dataclasses import replace

    measured = [rate for rate in rates if not math.isnan(rate)]
    return replace(
        _step(engine, concurrency, statistics.median(measured), 1.0), rounds=len(rates),
        round_rates=tuple(rates), samples_per_s_min=min(measured), samples_per_s_max=max(measured),
    )  # fmt: skip


def test_engines_are_judged_round_by_round_against_perf_analyzers_round_beside_them() -> None:
    steps = [
        # The machine slowed by a fifth between the rounds, for both engines alike: each side's
        # own rounds spread 22 %, and the paired ratios (0.95, 0.96) agree.
        _rounds("perf_analyzer", 1, 1250.0, 1000.0),
        _rounds("locust", 1, 1187.5, 960.0),
        # Every round within the tolerance, though the ratios spread 18 %: agrees.
        _rounds("perf_analyzer", 2, 1000.0, 1000.0),
        _rounds("locust", 2, 910.0, 1090.0),
        # One round in, one out, 16 % apart: noisy, not judged.
        _rounds("perf_analyzer", 4, 1000.0, 1000.0),
        _rounds("locust", 4, 850.0, 1000.0),
        # Both rounds below: does not agree, whatever the spread.
        _rounds("perf_analyzer", 8, 1000.0, 1000.0),
        _rounds("locust", 8, 700.0, 850.0),
        # One round below the band, one above: they disagree, so noisy, not judged.
        _rounds("perf_analyzer", 32, 1000.0, 1000.0),
        _rounds("locust", 32, 780.0, 1150.0),
        # A round without figures on one side: paired on the round both measured only, so one
        # ratio, and judged on the medians' ratio.
        _rounds("perf_analyzer", 16, 1000.0, float("nan")),
        _rounds("locust", 16, 980.0, 990.0),
    ]
    report = Report("t", RunRecord.begin("cmd"), steps)
    rows = {row["concurrency"]: row for row in engine_comparison(report)}
    assert rows[1]["round_ratios"] == pytest.approx([0.95, 0.96])
    assert rows[1]["throughput_ratio"] == pytest.approx(0.955) and rows[1]["agrees"] is True
    assert rows[1]["spread"] == pytest.approx(0.01 / 0.955)
    assert rows[2]["agrees"] is True and rows[2]["spread"] == pytest.approx(0.18)
    assert rows[4]["noisy"] and rows[4]["agrees"] is None and rows[4]["spread"] == pytest.approx(0.15 / 0.925)
    assert not rows[8]["noisy"] and rows[8]["agrees"] is False
    assert rows[16]["round_ratios"] == [0.98] and rows[16]["agrees"] is True
    assert rows[32]["noisy"] and rows[32]["agrees"] is None
    text = markdown(report)
    assert "| noisy: paired rounds spread 16% |" in text
    assert "locust: 3 of 4 judged steps agree, 0 client-bound, 2 too noisy to judge, 0 on a server" in text


def _served(step: StepResult, compute_ms: float, batch: float) -> StepResult:
    """The step with the server's statistics: ``compute_ms`` of inference per request, ``batch``
    rows per execution."""
    from dataclasses import replace

    times = ServerTimes(
        requests=10, executions=10, queue_ms=0.1, compute_input_ms=0.0, compute_infer_ms=compute_ms,
        compute_output_ms=0.0, request_ms=compute_ms + 0.1, batch=batch,
    )  # fmt: skip
    return replace(step, server=times)


def test_a_step_where_the_server_computed_at_another_speed_under_each_engine_is_not_judged() -> None:
    steps = [
        # The server took 1.15 times as long per row under perf_analyzer: the engine's 1.15 is
        # the server's speed, not the engine's measurement.
        _served(_rounds("perf_analyzer", 1, 1000.0, 1000.0), 1.15, 64.0),
        _served(_rounds("driver", 1, 1150.0, 1150.0), 1.0, 64.0),
        # Per row the same (bigger batches, longer executions): judged, and 0.8 does not agree.
        _served(_rounds("perf_analyzer", 2, 1000.0, 1000.0), 2.0, 128.0),
        _served(_rounds("driver", 2, 800.0, 800.0), 1.0, 64.0),
    ]
    report = Report("t", RunRecord.begin("cmd"), steps)
    rows = {row["concurrency"]: row for row in engine_comparison(report)}
    assert rows[1]["server_differs"] and rows[1]["agrees"] is None
    assert rows[1]["server_compute_ratio"] == pytest.approx(1.15)
    assert not rows[2]["server_differs"] and rows[2]["agrees"] is False
    assert rows[2]["server_compute_ratio"] == pytest.approx(1.0)
    text = markdown(report)
    assert "| server differs: its compute per row under perf_analyzer 1.15 of this engine's |" in text
    assert "driver: 0 of 1 judged steps agree, 0 client-bound, 0 too noisy to judge, 1 on a server" in text


def test_a_steps_rounds_keep_their_rates_in_order_through_the_median_and_its_json() -> None:
    from dataclasses import replace

    first, second = _step("locust", 1, 900.0, 1.0), _step("locust", 1, 1100.0, 1.0)
    first, second = replace(first, round_rates=(900.0,)), replace(second, round_rates=(1100.0,))
    failed = replace(first, samples_per_s=float("nan"), round_rates=(float("nan"),), failure="crashed")
    combined = median_step([first, failed, second])
    assert combined.round_rates[0] == 900.0 and math.isnan(combined.round_rates[1])
    assert combined.round_rates[2] == 1100.0 and combined.samples_per_s == 1000.0
    again = StepResult.from_dict(json.loads(json.dumps(json_safe(combined.as_dict()))))
    assert again.round_rates[::2] == (900.0, 1100.0) and math.isnan(again.round_rates[1])


def test_the_comparison_sets_each_engines_serial_client_time_beside_perf_analyzers() -> None:
    from dataclasses import replace

    from loadtest.engine.client_cpu import SERIAL_REASON

    reason = f"841 us {SERIAL_REASON}, 12% of the mean latency of 6.74 ms (above 10%)"
    steps = [
        replace(_step("perf_analyzer", 1, 1000.0, 6.74), client_serial_us=101.0, client_cpu_us=90.0),
        replace(
            _step("locust", 1, 780.0, 6.74, bound=True),
            client_serial_us=841.0,
            bound_reason=reason,
            client_cpu_us=180.0,
        ),
    ]
    report = Report("t", RunRecord.begin("cmd"), steps)
    (row,) = engine_comparison(report)
    assert row["client_serial_us"] == 841.0 and row["reference_client_serial_us"] == 101.0
    assert row["agrees"] is None and row["flag"].startswith("client-limited: 841 us of serial client time")
    costs = {r["engine"]: r for r in report.to_json()["summary"]["client_costs"]}
    assert costs["locust"]["cpu_ratio"] == pytest.approx(2.0) and costs["perf_analyzer"]["cpu_ratio"] == 1.0
    text = markdown(report)
    assert "perf_analyzer client us/request" in text and "What each engine's client costs" in text


def test_a_perf_analyzer_target_speaks_triton_only() -> None:
    Target("127.0.0.1:8001", "grpc", engine="perf_analyzer")
    with pytest.raises(ConfigError, match="Triton's protocols"):
        Target("127.0.0.1:8001", "fastapi", server_stats=False, engine="perf_analyzer")
    with pytest.raises(ConfigError, match="unknown engine"):
        Target("127.0.0.1:8001", "grpc", engine="wrk")
