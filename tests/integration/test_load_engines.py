"""The load engines against the real local tritonserver: perf_analyzer as a sweep engine beside
locust on one server, its one line where it is missing, and the client-bound flag.

perf_analyzer comes from ``make setup`` (``python -m loadtest perf-analyzer install``); where it
could not be installed, the tests that drive it skip with the line saying why.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loadtest.engine.server_cpu import SHARED_REASON
from loadtest.sweeps.perf_analyzer import UNSTABLE
from loadtest.sweeps.perf_analyzer_install import locate
from server import LocalServer

pytestmark = pytest.mark.integration

MODEL = "dlrm_onnx"


def _sweep(
    server: LocalServer, out: Path, *extra: str, env: dict[str, str] | None = None, protocol: str = "grpc"
) -> subprocess.CompletedProcess[str]:
    url = server.grpc_url if protocol == "grpc" else server.http_url
    command = [
        sys.executable, "-m", "loadtest", "sweep", "--model", MODEL, "--protocol", protocol,
        "--url", url, "--no-baseline", "--out", str(out), *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, env=env)


@pytest.fixture(scope="module")
def perf_analyzer_binary() -> Path:
    binary, reason = locate()
    if binary is None:
        pytest.skip(reason)
    return binary


def test_perf_analyzer_and_locust_interleaved_on_one_server(
    exported_server: LocalServer, perf_analyzer_binary: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    done = _sweep(
        exported_server, out, "--engine", "locust,perf_analyzer", "--batch-size", "8",
        "--concurrency", "1", "--duration", "1", "--warmup", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads((out / "report.json").read_text())
    steps = {step["engine"]: step for step in report["steps"]}
    assert set(steps) == {"locust", "perf_analyzer"}
    if _without_figures(steps["perf_analyzer"], out):
        # Nothing to set the locust step beside: no comparison row, and the locust step's figures.
        assert report["summary"]["engines"] == [] and steps["locust"]["samples_per_s"] > 0
        return
    for step in steps.values():
        assert step["samples_per_s"] > 0 and step["p50_ms"] > 0
        assert step["client_cpu_us"] > 0 and step["client_cores"] > 0
    # The perf_analyzer step's figures are perf_analyzer's own, from the CSV it wrote.
    (folder,) = (out / "raw" / "steps").glob("*-perf_analyzer-b8-c1")
    with open(folder / "perf_analyzer.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    ours = steps["perf_analyzer"]
    assert ours["samples_per_s"] == pytest.approx(float(row["Inferences/Second"]))
    assert ours["p50_ms"] == pytest.approx(float(row["p50 latency"]) / 1000)
    assert ours["p99_ms"] == pytest.approx(float(row["p99 latency"]) / 1000)
    # Its client time per request is its own client send plus receive, set beside locust's serial time.
    assert ours["client_serial_us"] == pytest.approx(float(row["Client Send"]) + float(row["Client Recv"]))
    assert steps["locust"]["client_serial_us"] > 0
    # Side by side in the report, and in the CSV with its engine.
    (compared,) = report["summary"]["engines"]
    assert compared["engine"] == "locust" and compared["reference_samples_per_s"] == ours["samples_per_s"]
    assert compared["reference_client_serial_us"] == ours["client_serial_us"]
    with open(out / "steps.csv", newline="") as handle:
        assert {r["engine"] for r in csv.DictReader(handle)} == {"locust", "perf_analyzer"}
    assert "The engines against perf_analyzer" in (out / "report.md").read_text()


def _without_figures(step: dict[str, object], out: Path) -> bool:
    """Whether perf_analyzer's step has no figures: on a busy machine its windows may never
    agree. Such a step must say so in one line, with no figure, in report.json and report.md."""
    failure = str(step["failure"])
    if not failure:
        return False
    assert UNSTABLE in failure and "\n" not in failure, step
    assert step["requests"] == 0 and step["samples_per_s"] is None and step["p50_ms"] is None, step
    assert f"no figures: {failure}" in (out / "report.md").read_text()
    return True


def test_a_missing_perf_analyzer_is_one_line_saying_how_to_get_it(
    exported_server: LocalServer, tmp_path: Path
) -> None:
    env = {**os.environ, "PERF_ANALYZER": str(tmp_path / "no-such-perf_analyzer")}
    out = tmp_path / "out"
    done = _sweep(exported_server, out, "--engine", "perf_analyzer", "--concurrency", "1", env=env)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "does not exist" in lines[0] and "make setup" in lines[0]
    assert not (out / "report.json").exists()


#: Spinning processes on the load generator's core: each its own session, so its own scheduling
#: group (autogroup), so the load generator gets about 1 / (SPINNERS + 1) of that core.
SPINNERS = 4


@pytest.fixture
def busy_core() -> Iterator[int]:
    """This machine's last core, held by :data:`SPINNERS` spinning processes while the test runs."""
    core = max(os.sched_getaffinity(0))
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            preexec_fn=lambda: os.sched_setaffinity(0, {core}),
            start_new_session=True,
        )
        for _ in range(SPINNERS)
    ]
    try:
        yield core
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.fixture(scope="module")
def server_off_the_last_core(
    start_triton: Callable[..., LocalServer], exported_repository: Path
) -> LocalServer:
    """A tritonserver whose threads and stubs all run off the last core (they inherit this
    process's cores at their start), so the spinners there slow the load generator only."""
    cores = os.sched_getaffinity(0)
    if len(cores) < 2:
        pytest.skip("needs two cores: one for the server, one for the starved load generator")
    os.sched_setaffinity(0, cores - {max(cores)})
    try:
        return start_triton(exported_repository)
    finally:
        os.sched_setaffinity(0, cores)


def _only_step(out: Path) -> dict[str, object]:
    (step,) = json.loads((out / "report.json").read_text())["steps"]
    return dict(step)


def test_a_quiet_small_step_is_not_client_bound(exported_server: LocalServer, tmp_path: Path) -> None:
    # Two users, mid-size requests: the client's CPU is a small part of each request's cycle.
    done = _sweep(
        exported_server, tmp_path / "quiet", "--batch-size", "256", "--concurrency", "2",
        "--duration", "2", "--warmup", "0.5", protocol="http",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    step = _only_step(tmp_path / "quiet")
    assert step["client_bound"] is False, step


def test_a_load_generator_starved_of_cpu_is_flagged_client_bound(
    server_off_the_last_core: LocalServer, busy_core: int, tmp_path: Path
) -> None:
    # The load generator gets a fifth of one core: pinned to the core the spinners hold, its
    # threads wait for that core most of the time, and twelve users want well over that fifth.
    # Starved, it reads its own CPU late; the flag must come from what it read, over the time
    # between its readings. Users of one row each can starve so far that none is answered
    # inside the window: batch 8 keeps the step's figures.
    done = _sweep(
        server_off_the_last_core, tmp_path / "starved", "--batch-size", "8", "--concurrency", "12",
        "--duration", "2", "--warmup", "0.5", "--client-cpus", str(busy_core), "--processes", "1",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    step = _only_step(tmp_path / "starved")
    assert step["client_bound"] is True, step
    assert "client-bound" in (tmp_path / "starved" / "report.md").read_text()


def test_the_default_unpinned_sweep_agrees_with_perf_analyzer_or_says_it_took_the_servers_cores(
    exported_server: LocalServer, perf_analyzer_binary: Path, tmp_path: Path
) -> None:
    # As the docs run it: no pinning, so locust, perf_analyzer and the server share every core.
    out = tmp_path / "unpinned"
    done = _sweep(
        exported_server, out, "--engine", "locust,perf_analyzer", "--batch-size", "64",
        "--concurrency", "4", "--duration", "3", "--warmup", "1",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    steps = {step["engine"]: step for step in json.loads((out / "report.json").read_text())["steps"]}
    ours, reference = steps["locust"], steps["perf_analyzer"]
    # The server's CPU was read beside the load generator's, on the cores they share.
    assert ours["server_cores"] > 0 and 0 < ours["shared_share"] < 1, ours
    if _without_figures(reference, out):
        return
    ratio = ours["samples_per_s"] / reference["samples_per_s"]
    # Apart by more than a tenth: flagged, with the part of the rule the step broke (sharing the
    # server's cores, or on 2 cores as often the load generator's own CPU), in the report too.
    if abs(ratio - 1) > 0.1:
        assert ours["client_bound"] is True, (ratio, ours)
        assert ours["bound_reason"], ours
        shared = SHARED_REASON in ours["bound_reason"]
        flag = "shares cores with the server" if shared else "client-bound: its own CPU"
        assert flag in (out / "report.md").read_text()


def test_a_streamed_sweep_sends_each_row_of_a_file_larger_than_the_pool_once(
    exported_server: LocalServer, tmp_path: Path
) -> None:
    from criteo.synth import SynthConfig, write_tsv
    from loadtest.engine.payload import MAX_POOL_ROWS

    data = tmp_path / "rows.tsv"
    write_tsv(SynthConfig(rows=3 * MAX_POOL_ROWS, seed=3), data)
    out = tmp_path / "streamed"
    done = _sweep(
        exported_server, out, "--engine", "locust,driver", "--batch-size", "4", "--concurrency", "1,2",
        "--duration", "1", "--warmup", "0.5", "--data", str(data), "--stream",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads((out / "report.json").read_text())
    steps = report["steps"]
    assert {step["engine"] for step in steps} == {"locust", "driver"}
    # Counted from the rows each process recorded sending: every step's rows are distinct, and
    # no row went out twice over the whole run (the file is larger than all the steps took).
    for step in steps:
        assert step["rows_sent"] > 0 and step["rows_sent"] == step["distinct_rows"], step
    total = sum(step["rows_sent"] for step in steps)
    settings = report["settings"]
    assert settings["Rows streamed"].startswith(f"{total:,} sent over the run, {total:,} of them distinct")
    assert "streamed from" in settings["Request rows"]


def test_request_rate_steps_of_the_open_loop_and_of_perf_analyzer_side_by_side(
    exported_server: LocalServer, perf_analyzer_binary: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rates"
    done = _sweep(
        exported_server, out, "--engine", "driver,perf_analyzer", "--request-rate", "100",
        "--arrival", "constant", "--batch-size", "8", "--duration", "3", "--warmup", "0.5",
        "--connections", "4",
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    document = json.loads((out / "rates.json").read_text())
    steps = {step["engine"]: step for step in document["steps"]}
    assert set(steps) == {"driver", "perf_analyzer"}
    ours, theirs = steps["driver"], steps["perf_analyzer"]
    assert ours["request_rate"] == 100 and ours["samples_per_s"] > 0 and 0 < ours["p50_ms"] <= ours["p99_ms"]
    (folder,) = (out / "raw").glob(f"{MODEL}-grpc-perf_analyzer-b8-r100")
    if theirs["samples_per_s"] is None:
        # On a busy machine perf_analyzer's windows may never agree: the step says so, flagged,
        # with no figures, and the run goes on.
        assert theirs["flag"].startswith("perf_analyzer found no stable measurement"), theirs
        assert "Failed to obtain stable measurement" in (folder / "perf_analyzer.log").read_text()
        assert "- (flagged)" in (out / "rates.md").read_text()
        return
    assert theirs["request_rate"] == 100 and 0 < theirs["p50_ms"] <= theirs["p99_ms"]
    # perf_analyzer's figures are its own, from the CSV its request-rate mode wrote.
    with open(folder / "perf_analyzer.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert theirs["samples_per_s"] == pytest.approx(float(row["Inferences/Second"]))
    assert theirs["p99_ms"] == pytest.approx(float(row["p99 latency"]) / 1000)
    # It times a request from its send: beside it, the open loop's figures from the send.
    assert theirs["service_p50_ms"] == theirs["p50_ms"] and theirs["service_p99_ms"] == theirs["p99_ms"]
    assert 0 < ours["service_p50_ms"] <= ours["p50_ms"]
    assert "--request-rate-range" in (folder / "perf_analyzer.log").read_text().splitlines()[0]
    assert (
        "The bundle's open loop against perf_analyzer's request-rate mode" in (out / "rates.md").read_text()
    )
