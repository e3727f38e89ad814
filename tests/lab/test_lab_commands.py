"""Each command of ``python -m lab`` run as a user runs it, at a tiny size, against the real
local tritonserver where it serves: the files it writes are read back and checked.

``gpu`` and ``raw-rows`` run through their command line in ``test_gpu_bench_served.py`` and
``tests/integration/test_raw_rows.py``, ``gpu`` and ``gpu-vs-cpu`` once more in
``test_gpu_run_script.py`` (``benchmarks/gpu/run.sh --cpu``), ``cold-reads`` in
``test_cold_reads.py``; ``cold-tier`` runs its library at a tiny size in
``tests/integration/test_embedding_stage.py`` (a step that hangs is planted there).
``model-analyzer`` runs at a tiny size below as a ``slow`` test (Model Analyzer's install and
search take minutes); its own logic is tested in ``test_model_analyzer_compare.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]

#: The benchmark commands ``python -m lab`` offers.
LAB_COMMANDS = {
    "soak", "client-cost", "precision", "serving-defaults", "gpu", "gpu-vs-cpu", "kernels", "cold-reads",
    "cold-tier", "stage-speed", "ranking-speed", "model-analyzer", "raw-rows", "open-loop", "faults",
}  # fmt: skip
#: What a user load-tests with: the only commands ``python -m loadtest`` offers.
LOADTEST_COMMANDS = {
    "sweep", "compare", "baseline", "report", "roofline", "tune", "capacity", "mlperf", "perf-analyzer",
}  # fmt: skip


def lab(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m lab *args`` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _commands(module: str) -> set[str]:
    app = __import__(f"{module}.__main__", fromlist=["app"]).app
    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_lab_offers_the_benchmark_commands_and_loadtest_only_what_users_load_test_with() -> None:
    assert _commands("lab") == LAB_COMMANDS
    assert _commands("loadtest") == LOADTEST_COMMANDS and len(LOADTEST_COMMANDS) <= 9
    listed = lab("--help", timeout=60)
    assert listed.returncode == 0 and all(name in listed.stdout for name in LAB_COMMANDS)


@pytest.mark.integration
def test_soak_reports_requests_errors_and_memory(exported_repository: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak"
    run = lab(
        "soak", "--repository", str(exported_repository), "--model", "dlrm_onnx", "--duration", "5",
        "--warmup", "2", "--rate", "60", "--batch-size", "1", "--batch-size", "16",
        "--sample-interval", "1", "--log-file", str(tmp_path / "tritonserver.log"), "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((out / "result.json").read_text())
    summary = document["summary"]
    assert summary["requests"] >= 100 and summary["errors"] == 0 and summary["wrong"] == 0
    assert "rss_growth" in summary and len(document["memory"]) >= 4
    assert all(s["server_rss"] > 0 and s["stubs_rss"] > 0 for s in document["memory"])
    # The run record: the command, the machine, and the load average sampled across the run.
    assert document["command"].startswith("python -m lab soak") and document["machine"]["cores"] >= 1
    assert document["load_during"]["samples"] >= 2
    assert "RSS growth after warm-up" in (out / "result.md").read_text()
    assert (out / "rss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration
def test_client_cost_times_each_transport_phase_by_phase(exported_repository: Path, tmp_path: Path) -> None:
    from lab.client_cost import TRANSPORTS

    # Its own server: the server's time per request is read from its statistics, which another
    # test's client sending to a shared server would add to (the command refuses that).
    run = lab(
        "client-cost", "--repository", str(exported_repository),
        "--model", "dlrm_onnx", "--batch-size", "1", "--batch-size", "8", "--requests", "10",
        "--warmup", "1", "--rounds", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((tmp_path / "client_cost.json").read_text())
    cases = document["cases"]
    assert [(c["protocol"], c["shared_memory"], c["batch_size"]) for c in cases] == [
        (protocol, memory, batch) for batch in (1, 8) for protocol, memory in TRANSPORTS
    ]
    for case in cases:
        assert case["requests"] == 10 and 0 < case["server_us"] < case["total_us"]
        assert 0 < case["client_us"] <= case["client_p90_us"]
        assert case["build_us"] > 0 and case["call_us"] > 0 and case["decode_us"] > 0
    assert document["command"].startswith("python -m lab client-cost")
    assert "client-side" in (tmp_path / "client_cost.md").read_text()


@pytest.mark.integration
def test_precision_measures_every_variant_against_the_ceiling(
    exported_repository: Path, labeled_file: Path, tmp_path: Path
) -> None:
    run = lab(
        "precision", "--repository", str(exported_repository), "--data", str(labeled_file),
        "--batch-size", "64", "--concurrency", "1", "--rounds", "1", "--seconds", "0.3",
        "--gemm-size", "256", "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((tmp_path / "precision.json").read_text())
    measured = {r["model"]: r for r in document["results"]}
    assert {"dlrm_onnx", "dlrm_onnx_fp16", "dlrm_onnx_int8", "wide_deep_onnx", "wide_deep_onnx_int8"} <= set(
        measured
    )
    assert document["ceiling_gflops"] > 0
    assert all(r["flops_per_sample"] > 0 and r["served_fraction_of_ceiling"] > 0 for r in measured.values())
    assert (tmp_path / "precision.md").read_text().startswith("#")


@pytest.mark.integration
def test_serving_defaults_measures_each_candidate(exported_repository: Path, tmp_path: Path) -> None:
    from lab.serving_defaults import DEFAULT_CANDIDATES

    candidates = DEFAULT_CANDIDATES[:2]
    run = lab(
        "serving-defaults", "--repository", str(exported_repository), "--model", "dlrm_onnx",
        *[arg for name in candidates for arg in ("--candidate", name)], "--step", "16x1", "--step", "16x2",
        "--rounds", "1", "--seconds", "0.3", "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((tmp_path / "serving_defaults.json").read_text())
    text = json.dumps(document)
    assert all(name in text for name in candidates)
    assert (tmp_path / "serving_defaults.md").is_file()


@pytest.mark.integration
def test_kernels_lists_each_operators_time_on_the_cpu(exported_repository: Path, tmp_path: Path) -> None:
    models = ("dlrm_onnx", "dlrm_onnx_int8")
    run = lab(
        "kernels", "--repository", str(exported_repository), *[a for m in models for a in ("--model", m)],
        "--device", "cpu", "--batch-size", "64", "--calls", "3", "--out", str(tmp_path),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((tmp_path / "kernels.json").read_text())
    assert document["device"] == "cpu" and set(document["models"]) == set(models)
    for model in models:
        kernels = document["models"][model]
        assert kernels and all(k["ms_per_call"] > 0 and k["launches_per_call"] >= 1 for k in kernels)
        assert kernels == sorted(kernels, key=lambda k: k["ms_per_call"], reverse=True)
    # A DLRM's lookups are Gathers; its INT8 variant runs integer matrix products.
    assert "Gather" in {k["name"] for k in document["models"]["dlrm_onnx"]}
    assert {k["name"] for k in document["models"]["dlrm_onnx_int8"]} & {
        "MatMulInteger", "QLinearMatMul", "DynamicQuantizeLinear", "QuantizeLinear", "QGemm",
    }  # fmt: skip
    assert (tmp_path / "kernels.txt").read_text().startswith("== dlrm_onnx:")


def test_kernels_on_a_gpu_without_one_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    model = tmp_path / "repo" / "m" / "1"
    model.mkdir(parents=True)
    (model / "model.onnx").write_bytes(b"not read before the device is checked")
    run = lab(
        "kernels", "--repository", str(tmp_path / "repo"), "--model", "m", "--device", "gpu", timeout=120
    )
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[-1].startswith("error:") and "needs a CUDA GPU" in lines[-1], run.stderr


@pytest.mark.integration
def test_faults_tries_the_faults_it_is_given(tmp_path: Path) -> None:
    refused = lab("faults", "--fault", "no-such-fault", "--out", str(tmp_path), timeout=60)
    assert refused.returncode == 1 and "unknown fault no-such-fault" in refused.stderr
    run = lab("faults", "--fault", "disk-full", "--out", str(tmp_path), "--work", str(tmp_path), timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((tmp_path / "result.json").read_text())
    [result] = document["faults"]
    assert "out of space" in result["fault"] and result["ok"] and result["wrong"] == 0
    assert "no space left" in result["seen"]
    assert (tmp_path / "result.md").is_file()


@pytest.mark.integration
def test_faults_server_and_stage_crash_are_restarted_by_serve(tmp_path: Path) -> None:
    from lab.faults.server_crashes import STAGE_LIBRARY

    faults = ["server-crash", *(["stage-crash"] if STAGE_LIBRARY.is_file() else [])]
    chosen = [arg for name in faults for arg in ("--fault", name)]
    run = lab("faults", *chosen, "--out", str(tmp_path), "--work", str(tmp_path), timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "result.json").read_text())["faults"]
    assert [r["fault"].split(":")[0] for r in results] == [name.replace("-", " ") for name in faults]
    for result in results:
        assert result["ok"] and result["wrong"] == 0 and result["requests"] > 0, result
        assert result["recovery_s"] is not None and result["recovery_s"] <= 15
        assert "restart 1, ready again in" in result["seen"] and "exit 0" in result["seen"]
    assert "killed by SIGKILL" in results[0]["seen"]
    if len(results) > 1:
        assert "killed by SIGSEGV" in results[1]["seen"] and "compiled raw-row stage" in results[1]["fault"]


@pytest.fixture(scope="session")
def model_analyzer() -> Path:
    """Triton Model Analyzer in a venv of its own (it pins packages of its own), installed as
    ``benchmarks/model_analyzer/run.sh`` installs it; skips where it cannot be installed."""
    venv = ROOT / "artifacts" / "model_analyzer" / "venv"
    executable = venv / "bin" / "model-analyzer"
    if not executable.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        pip = [str(venv / "bin" / "pip"), "install", "--quiet", "triton-model-analyzer==1.58.0"]
        installed = (
            made.returncode == 0 and subprocess.run(pip, capture_output=True, text=True).returncode == 0
        )
        if not installed:
            pytest.skip("triton-model-analyzer 1.58.0 could not be installed into its own venv")
    return executable


@pytest.mark.slow
@pytest.mark.integration
def test_model_analyzer_and_tune_answer_the_same_tiny_space(
    exported_repository: Path, model_analyzer: Path, tmp_path: Path
) -> None:
    """About four minutes (Model Analyzer's install and its search), hence ``slow``."""
    run = lab(
        "model-analyzer", "--repository", str(exported_repository), "--model-analyzer", str(model_analyzer),
        "--model", "dlrm", "--p99-budget-ms", "50", "--batch-sizes", "16", "--concurrency", "1",
        "--instances", "1", "--queue-delay-us", "100", "--rounds", "1",
        "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    text = json.dumps(document)
    assert "Model Analyzer" in text and "tune" in text
    assert (tmp_path / "out" / "report.md").is_file()


def test_soak_checks_an_ensemble_against_the_reference_it_is_given(tmp_path: Path) -> None:
    from bundle.errors import ConfigError
    from lab.soak import SoakConfig, reference_file

    repo = tmp_path / "repo"
    (repo / "plain" / "1").mkdir(parents=True)
    (repo / "plain" / "1" / "model.onnx").write_bytes(b"onnx")
    (repo / "ensemble" / "1").mkdir(parents=True)
    config = SoakConfig(repository=repo, references=(("ensemble", repo / "plain" / "1" / "model.onnx"),))
    own = repo / "plain" / "1" / "model.onnx"
    # A model with an ONNX file of its own is checked against it; a raw-row model against its base's.
    assert reference_file(config, "plain") == own and reference_file(config, "plain_raw") == own
    # An ensemble (no model.onnx) against the reference named for it, its raw-row model too.
    assert reference_file(config, "ensemble") == own and reference_file(config, "ensemble_raw") == own
    with pytest.raises(ConfigError, match=r"model 'lonely' has no model.onnx .* --reference lonely="):
        reference_file(SoakConfig(repository=repo), "lonely")
    missing = SoakConfig(repository=repo, references=(("ensemble", tmp_path / "gone.onnx"),))
    with pytest.raises(ConfigError, match=r"the reference of model 'ensemble' is not a file: .*gone.onnx"):
        reference_file(missing, "ensemble_raw")


def test_soak_reference_without_a_model_name_is_one_line(tmp_path: Path) -> None:
    run = lab("soak", "--repository", str(tmp_path), "--reference", "model.onnx", timeout=120)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert "--reference takes MODEL=PATH to an ONNX file, got 'model.onnx'" in lines[-1], run.stderr
