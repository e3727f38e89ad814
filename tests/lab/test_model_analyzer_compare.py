"""The Model Analyzer comparison's own logic: its config, and reading its answer within a budget."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bundle.errors import ConfigError
from lab import model_analyzer
from lab.model_analyzer import Answer, CompareOptions, ma_answers, ma_config

HEADER = [
    "Model", "Batch", "Concurrency", "Model Config Path", "Instance Group", "Max Batch Size",
    "Satisfies Constraints", "Throughput (infer/sec)", "p99 Latency (ms)",
]  # fmt: skip


def _options(tmp_path: Path) -> CompareOptions:
    executable = tmp_path / "model-analyzer"
    executable.write_text("#!/bin/sh\n")
    return CompareOptions(repository=tmp_path / "repo", model_analyzer=executable, work=tmp_path / "work")


def _config(folder: Path, instances: int, delay_us: int) -> None:
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{folder.name}"\nmax_batch_size: 4096\n'
        f"instance_group {{\n  count: {instances}\n  kind: KIND_CPU\n}}\n"
        f"dynamic_batching {{\n  max_queue_delay_microseconds: {delay_us}\n}}\n"
    )


def test_the_best_measurement_within_the_budget_is_the_answer_with_its_config(tmp_path: Path) -> None:
    output = tmp_path / "output"
    _config(output / "dlrm_onnx_config_default", 1, 100)
    _config(output / "dlrm_onnx_config_2", 2, 2000)
    path = tmp_path / "metrics.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER)
        writer.writerow(["dlrm_onnx", 1024, 8, "dlrm_onnx_config_2", "2:CPU", 4096, "No", 300000, 31.0])
        writer.writerow(["dlrm_onnx", 1024, 2, "dlrm_onnx_config_2", "2:CPU", 4096, "Yes", 250000, 9.5])
        writer.writerow(["dlrm_onnx", 64, 4, "dlrm_onnx_config_default", "1:CPU", 4096, "Yes", 90000, 4.0])
    with open(path, newline="") as handle:
        rows = [dict(row) for row in csv.DictReader(handle)]

    tight = ma_answers(rows, 10.0, output)[0]
    assert (tight.instances, tight.queue_delay_us, tight.batch_size, tight.concurrency) == (2, 2000, 1024, 2)
    assert tight.samples_per_s == 250000 and tight.p99_ms == 9.5
    assert "max_queue_delay_microseconds: 2000" in tight.config

    loose = ma_answers(rows, 50.0, output, count=5)
    assert [(a.batch_size, a.concurrency, a.samples_per_s) for a in loose] == [
        (1024, 8, 300000), (1024, 2, 250000), (64, 4, 90000),
    ]  # fmt: skip
    assert ma_answers(rows, 3.0, output) == []


def _answer(tool: str, concurrency: int) -> Answer:
    return Answer(tool, 1, 100, 1024, concurrency, 1000.0 * concurrency, 5.0, config="")


def test_model_analyzer_answers_that_miss_the_budget_side_by_side_are_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its best answers are measured beside tune's, best first, until one holds the budget;
    tune is compared with that one, and those passed over are kept with their figures."""
    p99_by_concurrency = {4: 12.0, 2: 11.0, 1: 8.0}
    calls: list[list[int]] = []

    def remeasure(options, family, budget_ms, answers, input_data, attempt):  # type: ignore[no-untyped-def]
        calls.append([a.concurrency for a in answers])
        p99 = p99_by_concurrency.get
        return {a.tool: {"samples_per_s": a.samples_per_s, "p99_ms": p99(a.concurrency, 7.0)}
                for a in answers}  # fmt: skip

    monkeypatch.setattr(model_analyzer, "remeasure", remeasure)
    options = _options(tmp_path)
    candidates = [_answer("Model Analyzer", c) for c in (4, 2, 1)]
    tuned = _answer("tune", 3)
    ma, measured, passed = model_analyzer.best_holding(options, "dlrm", 10.0, candidates, tuned, tmp_path)
    assert calls == [[4, 3], [2, 3], [1, 3]]
    assert ma is candidates[2] and measured["Model Analyzer"]["p99_ms"] == 8.0
    assert [p["answer"]["concurrency"] for p in passed] == [4, 2]
    assert [p["side_by_side"]["p99_ms"] for p in passed] == [12.0, 11.0]

    calls.clear()
    ma, _, passed = model_analyzer.best_holding(options, "dlrm", 10.0, candidates[:2], tuned, tmp_path)
    assert ma is candidates[1] and len(passed) == 1  # none held it: the last one tried is compared
    case = {"family": "dlrm", "budget_ms": 10.0, "side_by_side": {"tune": {"p99_ms": 7.0},
            "Model Analyzer": {"p99_ms": 11.0}}, "tune_s": 50.0, "model_analyzer_s": 300.0,
            "model_analyzer_passed_over": passed}  # fmt: skip
    assert "none of Model Analyzer's best 2 answers within the budget does" in model_analyzer.verdict(case)


def test_model_analyzer_searches_the_same_space_through_the_bundle_server(tmp_path: Path) -> None:
    options = _options(tmp_path)
    config = ma_config(options, "dlrm_onnx", tmp_path / "repo", tmp_path / "rows.json", Path("/pa"))
    model = config["profile_models"]["dlrm_onnx"]
    assert config["run_config_search_mode"] == "brute" and config["triton_launch_mode"] == "local"
    assert model["parameters"] == {"batch_sizes": [64, 1024], "concurrency": [1, 2, 4, 8]}
    assert model["model_config_parameters"]["instance_group"] == [{"kind": "KIND_CPU", "count": [1, 2]}]
    assert model["model_config_parameters"]["dynamic_batching"] == {
        "max_queue_delay_microseconds": [100, 2000]
    }
    assert Path(config["triton_server_path"]).name == "tritonserver"
    assert Path(config["triton_server_path"]).exists()
    assert config["perf_analyzer_flags"]["input-data"].endswith("rows.json")


def test_a_missing_model_analyzer_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pip install triton-model-analyzer"):
        CompareOptions(repository=tmp_path, model_analyzer=tmp_path / "none", work=tmp_path)


def test_the_report_sets_both_answers_side_by_side_and_says_when_they_are_one(tmp_path: Path) -> None:
    from bundle.records import RunRecord
    from lab.model_analyzer import write_report

    answer = {"instances": 1, "queue_delay_us": 100, "batch_size": 1024, "concurrency": 1,
              "samples_per_s": 216000.0, "p99_ms": 8.8, "config": "", "tool": "Model Analyzer"}  # fmt: skip
    other = {**answer, "concurrency": 2, "tool": "tune", "samples_per_s": 250000.0, "p99_ms": 9.0}
    measured = {"Model Analyzer": {"samples_per_s": 210000.0, "p99_ms": 8.5},
                "tune": {"samples_per_s": 252000.0, "p99_ms": 9.1}}  # fmt: skip
    case = {"family": "dlrm", "budget_ms": 10.0, "model_analyzer": answer, "tune": other,
            "side_by_side": measured, "model_analyzer_s": 360.0, "tune_s": 60.0, "ratio": 1.2}  # fmt: skip
    same = {**case, "budget_ms": 50.0, "tune": {**answer, "tool": "tune"}, "ratio": 1.0}
    document = {
        **RunRecord.begin("python -m lab model-analyzer").finish().to_json(),
        "space": {"variant": "fp32", "instances": [1, 2], "queue_delays_us": [100, 2000],
                  "batch_sizes": [64, 1024], "concurrency": [1, 2, 4, 8]},
        "rounds": 3, "window_s": 2.0, "cases": [case, same],
    }  # fmt: skip
    text = write_report(document, tmp_path)["markdown"].read_text()
    lines = [line for line in text.splitlines() if line.startswith("| dlrm")]
    assert len(lines) == 4
    assert "B=1024 c=2" in lines[1] and "252,000" in lines[1] and "**1.20x**" in lines[1]
    assert "(same answer)" not in lines[1] and "(same answer)" in lines[3]
    assert "dlrm at 10 ms: tune's answer is at least Model Analyzer's, 1.20x" in text
    assert "dlrm at 50 ms: both chose the same config and load" in text
    assert "<!-- --8<-- [start:summary] -->" in text and "<!-- --8<-- [end:summary] -->" in text


def test_an_answer_over_the_budget_side_by_side_is_no_answer() -> None:
    from lab.model_analyzer import verdict

    measured = {"Model Analyzer": {"samples_per_s": 290000.0, "p99_ms": 11.5},
                "tune": {"samples_per_s": 250000.0, "p99_ms": 7.5}}  # fmt: skip
    ma = {"instances": 1, "queue_delay_us": 100, "batch_size": 1024, "concurrency": 2}
    case = {"family": "dlrm", "budget_ms": 10.0, "side_by_side": measured, "model_analyzer": ma,
            "tune": {**ma, "concurrency": 1}, "ratio": 0.86, "tune_s": 60.0,
            "model_analyzer_s": 360.0}  # fmt: skip
    assert verdict(case) == (
        "dlrm at 10 ms: tune's answer holds the budget, Model Analyzer's does not "
        "(tune 60 s against Model Analyzer 360 s)."
    )
    over = {**case, "side_by_side": {**measured, "tune": {"samples_per_s": 1.0, "p99_ms": 12.0}}}
    assert "tune's answer does not hold the budget" in verdict(over)


def test_a_ratio_below_one_inside_the_rounds_spread_is_called_so() -> None:
    sides = {
        "tune": {"p99_ms": 40.0, "rounds_samples_per_s": [263_000.0, 273_000.0, 264_000.0]},
        "Model Analyzer": {"p99_ms": 22.0, "rounds_samples_per_s": [267_000.0, 252_000.0, 273_000.0]},
    }
    case = {"family": "wide_deep", "budget_ms": 50.0, "side_by_side": sides, "ratio": 0.99,
            "tune_s": 90.0, "model_analyzer_s": 300.0, "model_analyzer": {"instances": 1},
            "tune": {"instances": 2}}  # fmt: skip
    assert "0.99x of Model Analyzer's, within the rounds' spread" in model_analyzer.verdict(case)
    sides["tune"]["rounds_samples_per_s"] = [200_000.0, 201_000.0, 202_000.0]
    assert "below Model Analyzer's, 0.99x" in model_analyzer.verdict(case)
