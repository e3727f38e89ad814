"""perf_analyzer as the reference engine, without a server: its pins, the unpacking of its
library, reading its own output, and the client-bound rule every engine shares."""

from __future__ import annotations

import io
import math
import os
import tarfile
import time
from pathlib import Path

import pytest

from bundle.errors import BundleError, ConfigError
from bundle.records import RunRecord
from loadtest.engine.client_cpu import (
    CORE_SHARE,
    MACHINE_SHARE,
    ClientCpu,
    process_demand,
    thread_busy_s,
    threshold_line,
)
from loadtest.engine.payload import build_pool
from loadtest.sweeps import perf_analyzer, perf_analyzer_install
from loadtest.sweeps.report import Report, engine_comparison, markdown, throughput_ratios
from loadtest.sweeps.steps import StepResult, Target

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
    assert pins.deb_url.endswith(".deb") and len(pins.deb_sha256) == 64


def test_a_pins_file_without_the_debian_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pins.txt"
    path.write_text("tritonclient==2.51.0\nnvidia-cuda-runtime-cu12==12.9.79\n")
    with pytest.raises(ConfigError, match="deb URL sha256"):
        perf_analyzer_install.read_pins(path)


def _deb(files: dict[str, bytes]) -> bytes:
    """A Debian package: an ar archive holding debian-binary and a data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    out = b"!<arch>\n"
    for name, body in (("debian-binary", b"2.0\n"), ("data.tar.xz", data.getvalue())):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    return out


def test_the_library_is_unpacked_from_the_debian_package_and_a_bad_hash_stops_it() -> None:
    deb = _deb({"./usr/lib/x86_64-linux-gnu/libb64.so.0d": b"ELF library"})
    assert perf_analyzer_install._deb_member(deb, "libb64.so.0d") == b"ELF library"
    with pytest.raises(BundleError, match=r"holds no libother\.so"):
        perf_analyzer_install._deb_member(deb, "libother.so")
    with pytest.raises(BundleError, match="not an ar archive"):
        perf_analyzer_install._deb_member(b"PK\x03\x04", "libb64.so.0d")
    with pytest.raises(BundleError, match="SHA-256"):
        perf_analyzer_install._verified(deb, "0" * 64, "libb64")


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
    with pytest.raises(BundleError, match="Failed to obtain stable measurement"):
        perf_analyzer.read_figures(tmp_path / "missing.csv", "Failed to obtain stable measurement.\n")


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


def test_a_perf_analyzer_target_speaks_triton_only() -> None:
    Target("127.0.0.1:8001", "grpc", engine="perf_analyzer")
    with pytest.raises(ConfigError, match="Triton's protocols"):
        Target("127.0.0.1:8001", "fastapi", server_stats=False, engine="perf_analyzer")
    with pytest.raises(ConfigError, match="unknown engine"):
        Target("127.0.0.1:8001", "grpc", engine="wrk")
