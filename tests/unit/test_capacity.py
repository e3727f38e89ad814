"""The capacity search over a synthetic server whose p99 rises with the rate: it finds the edge
within its resolution, says so, and treats failed, unfinished and short-sent steps as over
budget (one flagged for late sends alone holds where its p99, which counts the lag, does)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from bundle.errors import ConfigError
from loadtest.sweeps.capacity import Capacity, holds, search_capacity, write_capacity_report
from loadtest.sweeps.rates import RateStep


def _step(rate: float, p99_ms: float, **changes: object) -> RateStep:
    step = RateStep(
        label="triton", model="m", protocol="grpc", batch_size=64, arrival="poisson", request_rate=rate,
        scheduled_rate=rate, achieved_rate=rate, answered_per_s=rate, samples_per_s=64 * rate, connections=64,
        seconds=10.0, requests=int(10 * rate), errors=0, late=0, unfinished=0, in_flight_mean=1.0,
        in_flight_max=3, p50_ms=p99_ms / 3, p90_ms=p99_ms / 2, p99_ms=p99_ms, p999_ms=p99_ms * 1.5,
        max_ms=p99_ms * 2, service_p99_ms=p99_ms, send_lag_p99_ms=0.1, flag="", service_p50_ms=p99_ms / 3,
    )  # fmt: skip
    return replace(step, **changes)  # type: ignore[arg-type]


def _queue(edge: float) -> tuple[list[float], object]:
    """A server whose p99 is 2 ms far below ``edge`` requests/s and climbs steeply near it."""
    tried: list[float] = []

    def measure(rate: float) -> RateStep:
        tried.append(rate)
        load = rate / edge
        return _step(rate, 2.0 / (1.0 - load) if load < 1.0 else 1000.0)

    return tried, measure


@pytest.mark.parametrize("edge", [137.0, 1003.0, 5321.0])
def test_the_search_finds_the_edge_within_its_resolution(edge: float, tmp_path: Path) -> None:
    # p99 within 10 ms while 2 / (1 - load) <= 10: load <= 0.8.
    tried, measure = _queue(edge)
    result = search_capacity(measure, 10.0, start=50.0, resolution=0.05)  # type: ignore[arg-type]
    assert result.best is not None and result.failed_above is not None
    best, above = result.best.request_rate, result.failed_above.request_rate
    assert best <= 0.8 * edge < above <= best * 1.05 + 0.1
    assert holds(result.best, 10.0) == "" and holds(result.failed_above, 10.0).startswith("p99 ")
    assert len(tried) == len(set(tried)) <= 20  # no rate measured twice
    assert f"capacity at p99 10 ms: {best:g} requests/s" in result.statement()
    assert "resolution 5%" in result.statement()
    paths = write_capacity_report(result, "capacity", {"command": "x"}, {}, tmp_path)
    assert "**capacity at p99 10 ms" in paths["markdown"].read_text() and paths["png"].stat().st_size > 0


def test_the_first_rate_over_budget_and_the_highest_rate_holding_are_said() -> None:
    # Over the budget at the start: the search halves down to a rate that holds, then closes in.
    tried, measure = _queue(30.0)
    result = search_capacity(measure, 10.0, start=50.0, resolution=0.05)  # type: ignore[arg-type]
    assert tried[:3] == [50.0, 25.0, 12.5] and result.best is not None and result.failed_above is not None
    best, above = result.best.request_rate, result.failed_above.request_rate
    assert best <= 24.0 < above <= best * 1.05
    # Nothing holds: it stops at start / LOWEST_SHARE and says how far down it went.
    tried, measure = _queue(0.1)
    result = search_capacity(measure, 10.0, start=64.0)  # type: ignore[arg-type]
    assert result.best is None and tried == [64.0, 32.0, 16.0, 8.0, 4.0, 2.0, 1.0]
    assert "no rate held a p99 of 10 ms: 64/s down to 1/s did not (p99 " in result.statement()
    _, measure = _queue(1e9)
    result = search_capacity(measure, 10.0, start=50.0, max_rate=400.0)  # type: ignore[arg-type]
    assert result.best is not None and result.best.request_rate == 400.0 and result.failed_above is None
    assert "the search's highest rate held it" in result.statement()


def test_failed_unfinished_and_short_sent_steps_do_not_hold() -> None:
    assert holds(_step(100, 5.0), 10.0) == ""
    assert "2 failed" in holds(_step(100, 5.0, errors=2), 10.0)
    assert "1 unfinished" in holds(_step(100, 5.0, unfinished=1), 10.0)
    # Sent short of its schedule: the server saw less than the rate, whatever its p99.
    short = _step(100, 5.0, achieved_rate=95.0, flag="sent 950 of the 1000 requests scheduled")
    assert holds(short, 10.0).startswith("flagged: sent 950")
    # Late sends alone: the lag is inside the latency counted from the schedule, so a p99 within
    # the budget holds it, and one over it says the flag too.
    late = _step(100, 5.0, late=30, flag="3.0% of the requests sent more than 1 ms late")
    assert holds(late, 10.0) == ""
    assert holds(replace(late, p99_ms=12.0), 10.0) == (
        "p99 12.00 ms over the budget (flagged: 3.0% of the requests sent more than 1 ms late)"
    )
    assert "over the budget" in holds(_step(100, math.nan), 10.0)
    for bad in (
        (0.0, 50.0, 0.05, 1e5),
        (10.0, 0.0, 0.05, 1e5),
        (10.0, 50.0, 0.0, 1e5),
        (10.0, 50.0, 0.05, 10.0),
    ):
        with pytest.raises(ConfigError):
            search_capacity(lambda rate: _step(rate, 1.0), *bad)
    assert Capacity(10.0, 0.05).statement().startswith("no rate held")


def test_the_open_loop_and_perf_analyzer_agree_within_a_tenth_only_where_neither_is_flagged() -> None:
    from loadtest.sweeps.rates import RateLoad, agreement_rows, agrees
    from loadtest.sweeps.steps import ServerTimes

    ours = replace(_step(100.0, 9.0), engine="driver", client_cpu_us=80.0)
    close = replace(_step(100.0, 9.5), engine="perf_analyzer", client_cpu_us=150.0)
    assert agrees(ours, close) is True
    # Each engine's figures as it reports them: the open loop's from the schedule.
    assert agrees(ours, replace(close, service_p99_ms=12.0)) is False  # p99 0.75 of theirs
    assert agrees(ours, replace(close, service_p50_ms=4.0)) is False  # p50 0.75 of theirs
    assert agrees(ours, replace(close, flag="perf_analyzer delayed 3.0% of the requests")) is None
    lagging = replace(ours, p50_ms=ours.p50_ms * 1.3, p99_ms=ours.p99_ms * 1.3)
    assert agrees(lagging, close) is False  # its send lag counts against it
    quick = replace(ours, service_p50_ms=ours.service_p50_ms * 0.7, service_p99_ms=ours.service_p99_ms * 0.7)
    assert agrees(quick, close) is True  # a shorter interval from the send does not
    flagged = replace(ours, request_rate=200.0, flag="sent 90% of the scheduled requests")
    rows = agreement_rows([quick, close, flagged, replace(close, request_rate=200.0)])
    assert [row[8] for row in rows] == ["yes", "- (flagged)"]
    assert rows[0][4] == pytest.approx(0.947, abs=1e-3) and rows[0][7] == pytest.approx(0.947, abs=1e-3)
    assert rows[0][-2] == "0.663 / 0.663"  # from the send: 2.1 / (9.5 / 3) and 6.3 / 9.5
    assert rows[0][-1] == "80 / 150"  # client CPU us per request
    assert math.isnan(rows[0][9])  # neither step read the server
    # The server's own time per request, the open loop's over perf_analyzer's.
    served = {"success_count": 900.0, "execution_count": 300.0, "inference_count": 14400.0, "request": 1.2}
    theirs = ServerTimes.from_perf_analyzer({**served, "queue": 0.3, "infer": 0.7})
    assert theirs is not None and theirs.requests == 900 and theirs.batch == 48.0
    assert theirs.queue_ms == 0.3 and math.isnan(theirs.compute_input_ms)
    assert ServerTimes.from_perf_analyzer({}) is None  # it printed no server section
    ours_server = replace(theirs, request_ms=1.5)
    rows = agreement_rows([replace(quick, server=ours_server), replace(close, server=theirs)])
    assert rows[0][9] == pytest.approx(1.25)
    with pytest.raises(ConfigError, match="--arrival"):
        RateLoad("bursty")
    with pytest.raises(ConfigError, match="--connections"):
        RateLoad(connections=0)


def test_a_rate_step_is_lengthened_until_it_holds_the_requests_a_p99_needs() -> None:
    from loadtest.sweeps.rates import RateLoad

    load = RateLoad(duration_s=10.0, min_requests=1000)
    assert load.window_s(20.0) == 50.0  # 1,000 requests at 20/s
    assert load.window_s(100.0) == 10.0 and load.window_s(400.0) == 10.0
    assert RateLoad(duration_s=10.0).window_s(1.0) == 10.0  # no minimum: the window as asked
    assert "longer where 1,000 requests need it" in load.per_step()
    assert "longer" not in RateLoad().per_step()
    with pytest.raises(ConfigError, match="--min-requests"):
        RateLoad(min_requests=-1)


def test_rounds_of_a_rate_step_combine_into_medians_and_the_median_rounds_flag() -> None:
    from loadtest.sweeps.rates import median_rate_step
    from loadtest.sweeps.steps import ServerTimes

    times = ServerTimes(requests=100, executions=90, queue_ms=0.2, compute_input_ms=0.01,
                        compute_infer_ms=1.0, compute_output_ms=0.01, request_ms=1.3, batch=1.1)  # fmt: skip
    rounds = [
        _step(100.0, 4.0, late=1, server=times),
        _step(100.0, 30.0, late=40, in_flight_max=64, flag="2.0% of the requests sent more than 1 ms late"),
        _step(100.0, 5.0, late=2, server=replace(times, queue_ms=0.6)),
    ]
    step = median_rate_step(rounds)
    assert step.p99_ms == 5.0 and step.p50_ms == pytest.approx(5.0 / 3) and step.rounds == 3
    assert step.requests == 3000 and step.late == 43 and step.seconds == 30.0 and step.in_flight_max == 64
    assert step.flag == ""  # one round of three flagged: the median round was not
    assert (
        step.server is not None and step.server.queue_ms == pytest.approx(0.4) and step.server.requests == 200
    )
    two = median_rate_step([rounds[1], rounds[1], rounds[0]])
    assert two.flag == "2 of 3 rounds flagged: 2.0% of the requests sent more than 1 ms late"
    # A perf_analyzer round without figures (no stable measurement) is left out of the medians.
    empty = _step(100.0, math.nan, samples_per_s=math.nan, flag="perf_analyzer found no stable measurement")
    assert median_rate_step([rounds[0], empty, rounds[2]]).p99_ms == 4.5
    assert median_rate_step(rounds[:1]) is rounds[0]
    with pytest.raises(ValueError, match="different steps"):
        median_rate_step([rounds[0], _step(200.0, 4.0)])


def test_a_rates_report_is_written_again_from_its_json_by_the_report_command(tmp_path: Path) -> None:
    import subprocess
    import sys

    from bundle.errors import DataError
    from loadtest.sweeps.rates import rewrite_rate_report, write_rate_report

    steps = [
        replace(_step(100.0, 9.0), engine="driver", client_cpu_us=80.0),
        replace(_step(100.0, 9.5), engine="perf_analyzer", client_cpu_us=150.0, p999_ms=math.nan),
    ]
    first = write_rate_report("Rates", {"command": "x"}, {"arrival": "poisson"}, steps, tmp_path / "a", 10.0)
    again = rewrite_rate_report(first["json"], tmp_path / "b")
    assert again["markdown"].read_text() == first["markdown"].read_text()
    assert again["markdown"].read_text().startswith("# Rates\n")
    old = json.loads(first["json"].read_text())
    del old["title"]  # a file from before titles were kept: the title comes from its rates.md
    first["json"].write_text(json.dumps(old))
    completed = subprocess.run(
        [sys.executable, "-m", "loadtest", "report", str(first["json"]), "--out", str(tmp_path / "c")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert (tmp_path / "c" / "rates.md").read_text() == first["markdown"].read_text()
    assert "1 of 1 steps neither engine flagged agree within 10%" in first["markdown"].read_text()
    (tmp_path / "other.json").write_text('{"steps": [{"concurrency": 1}]}')
    with pytest.raises(DataError, match=r"not a rates\.json"):
        rewrite_rate_report(tmp_path / "other.json", tmp_path / "d")
