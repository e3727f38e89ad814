"""Open-loop steps against the real local tritonserver.

The model ``stall`` (:mod:`tests.stall_model`) takes the bundle's two inputs and answers zeros,
one request at a time, in about a millisecond; once, when the file ``stall`` appears in its
version folder, it sleeps 200 ms on the next request. Sent at 100 requests/s, the open loop counts that
stall in every request it held up, so its p99 shows it; a closed loop of one user over the same
server sees one slow request among thousands, and its p99 hides it. ``loadtest sweep
--request-rate`` writes its report over gRPC and HTTP, and refuses bad rates and a closed-loop
engine in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from loadtest.sweeps.engines import driver_step
from loadtest.sweeps.rates import RateLoad, RateStep, rate_step
from loadtest.sweeps.steps import SweepConfig, Target
from loadtest.sweeps.sweep import make_payload
from server import LocalServer
from tests.stall_model import MODEL, STALL_S, write_stall_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stall_model(tmp_path_factory.mktemp("open-loop") / "repository")


@pytest.fixture(scope="module")
def server(start_triton: Callable[..., LocalServer], repository: Path) -> LocalServer:
    return start_triton(repository)


def _stall_after(repository: Path, seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, (repository / MODEL / "1" / "stall").touch)
    timer.start()
    return timer


def test_a_stall_shows_in_the_open_loop_and_hides_in_the_closed_loop(
    server: LocalServer, repository: Path, tmp_path: Path
) -> None:
    payload = make_payload(tmp_path, None)
    target = Target(server.grpc_url, "grpc")
    timer = _stall_after(repository, 2.0)  # inside the window: 0.5 s of warm-up, then 4 s
    load = RateLoad("constant", connections=16, duration_s=4.0, warmup_s=0.5)
    step = rate_step(target, MODEL, 1, 100.0, payload, tmp_path / "open", load)
    timer.join()
    assert not (repository / MODEL / "1" / "stall").exists()  # the model stalled
    assert step.errors == 0 and step.unfinished == 0 and step.requests > 300, step
    # About 20 requests arrived during the stall and waited for it: 5 % of the window.
    assert step.p99_ms >= 100.0, step
    assert step.max_ms >= 0.9 * STALL_S * 1e3 and step.in_flight_max > 5, step
    assert step.server is not None and step.server.requests >= step.requests
    assert step.service_p99_ms <= step.p99_ms

    timer = _stall_after(repository, 2.0)
    (tmp_path / "closed").mkdir()
    closed = driver_step(
        target, MODEL, SweepConfig((MODEL,), 1, (1,), 4.0, 0.5), 1, payload, tmp_path / "closed"
    )
    timer.join()
    assert not (repository / MODEL / "1" / "stall").exists()
    assert closed.errors == 0 and closed.requests > 1000, closed
    assert closed.max_ms >= 0.9 * STALL_S * 1e3 and closed.p99_ms < 50.0, closed


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadtest", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_sweep_at_request_rates_reports_each_step(repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = _loadtest(
        "sweep", "--repository", str(repository), "--model", MODEL,
        "--protocol", "grpc", "--protocol", "http", "--request-rate", "50,100", "--batch-size", "4",
        "--duration", "1", "--warmup", "0.5", "--connections", "8", "--p99-budget-ms", "10",
        "--rounds", "2", "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    document = json.loads((out / "rates.json").read_text())
    steps = [RateStep.from_dict(step) for step in document["steps"]]
    # Two rounds of each rate, one after the other, combined into one step of both windows.
    assert all(s.rounds == 2 and s.seconds == pytest.approx(2.0) for s in steps), steps
    assert run.stdout.count("round 2/2") == 4
    assert (out / "raw" / f"{MODEL}-http-driver-b4-r100" / "round2").is_dir()
    assert [(s.protocol, s.request_rate) for s in steps] == [
        ("grpc", 50),
        ("grpc", 100),
        ("http", 50),
        ("http", 100),
    ]
    for step in steps:
        assert step.errors == 0 and step.unfinished == 0 and step.requests > 0, step
        assert step.samples_per_s == pytest.approx(4 * step.answered_per_s)
        if not step.flag:
            assert step.achieved_rate >= 0.9 * step.scheduled_rate, step
        assert step.p50_ms <= step.p99_ms <= step.p999_ms <= step.max_ms, step
    markdown = (out / "rates.md").read_text()
    assert "| rate asked /s |" in markdown and "latency counts from the scheduled time" in markdown
    assert (out / "rates.png").stat().st_size > 0
    assert "FLAGGED" in run.stdout or "p99.9" in run.stdout


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--request-rate", "0"], "--request-rate must be requests per second > 0"),
        (["--request-rate", "fast"], "--request-rate must be comma-separated requests per second"),
        (["--request-rate", "10", "--engine", "locust"], "--request-rate runs the bundle's open-loop driver"),
        (["--request-rate", "10", "--arrival", "bursty"], "--arrival must be one of poisson, constant"),
    ],
)
def test_a_bad_rate_option_is_one_line(repository: Path, tmp_path: Path, extra: list[str], says: str) -> None:
    run = _loadtest(
        "sweep", "--repository", str(repository), "--model", MODEL, "--out", str(tmp_path), *extra
    )
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], run.stderr


def test_capacity_finds_a_rate_under_the_budget_and_says_how(repository: Path, tmp_path: Path) -> None:
    run = _loadtest(
        "capacity", "--repository", str(repository), "--model", MODEL, "--p99-budget-ms", "50",
        "--start-rate", "40", "--max-rate", "160", "--resolution", "0.25", "--duration", "1",
        "--warmup", "0.2", "--connections", "8", "--min-requests", "60", "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    document = json.loads((tmp_path / "capacity.json").read_text())
    rates = [step["request_rate"] for step in document["steps"]]
    assert rates[0] == 40 and document["budget_ms"] == 50 and document["resolution"] == 0.25
    # 60 requests at 40/s need 1.5 s: the 1 s window is lengthened; at 80/s and above 1 s holds them.
    windows = {step["request_rate"]: step["seconds"] for step in document["steps"]}
    assert windows[40] >= 1.45, windows
    assert all(seconds < 1.45 for rate, seconds in windows.items() if rate >= 80), windows
    assert "longer where 60 requests need it" in (tmp_path / "capacity.md").read_text()
    verdicts = document["verdicts"]
    assert len(verdicts) == len(rates) and all(
        v == "" or v.startswith(("p99 ", "flagged: ")) for v in verdicts
    )
    # A model of about a millisecond holds 50 ms at these rates: a rate fails only where the load
    # generator could not keep its schedule on a busy machine, and says so.
    assert all(v == "" or "flagged: " in v for v in verdicts), verdicts
    if verdicts[0] == "":  # it held, so the rate doubled
        assert rates[:2] == [40, 80] and document["best"]["p99_ms"] <= 50
    said = "capacity at p99 50 ms" if document["best"] is not None else "no rate held a p99 of 50 ms"
    assert document["statement"] in run.stdout and said in document["statement"]
    assert (tmp_path / "capacity.png").stat().st_size > 0
    assert "| rate asked /s |" in (tmp_path / "capacity.md").read_text()


def test_loadgen_runs_the_server_and_offline_scenarios_and_says_its_verdict(
    repository: Path, tmp_path: Path
) -> None:
    """MLPerf's LoadGen, not the bundle, draws the arrivals and judges: its verdict is printed as
    it says it, VALID or INVALID (a busy machine's tail can miss the bound), with its figures."""
    run = _loadtest(
        "mlperf", "--repository", str(repository), "--model", MODEL, "--scenario", "server",
        "--scenario", "offline", "--target-qps", "40", "--latency-bound-ms", "100", "--min-duration", "1",
        "--min-queries", "40", "--samples-per-request", "8", "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    for scenario in ("server", "offline"):
        summary = (tmp_path / scenario / "mlperf_log_summary.txt").read_text()
        verdict = "VALID" if "Result is : VALID" in summary else "INVALID"
        assert f"Result is : {verdict}" in summary
        assert f"LoadGen {scenario}: Result is {verdict}" in run.stdout
    assert "Scheduled samples per second" in run.stdout and "99.00 percentile latency (ms)" in run.stdout
    assert "Samples per second" in run.stdout  # the Offline scenario's throughput
    # Pairs per query drawn from a quantile file, as MLPerf's dlrm-v2 reference draws them.
    quantile = tmp_path / "dist_quantile.txt"
    quantile.write_text("2, 3, 3, 5, 8\n")
    drawn = _loadtest(
        "mlperf", "--repository", str(repository), "--model", MODEL, "--target-qps", "40",
        "--latency-bound-ms", "100", "--min-duration", "1", "--min-queries", "40", "--pairs", str(quantile),
        "--out", str(tmp_path / "drawn"),
    )  # fmt: skip
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    assert f"query samples: pairs per query from {quantile} (2 to 8, mean 4.2)" in drawn.stdout
    assert "LoadGen server: Result is" in drawn.stdout
    bad = _loadtest("mlperf", "--repository", str(repository), "--model", MODEL, "--scenario", "singlestream")
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode != 0 and len(lines) == 1 and "--scenario must be one of server, offline" in lines[0]
