"""The compose stack's alert rules (deploy/prometheus/alerts.yml): well formed, wired into
Prometheus, and built only on metrics that are really exported.

Where a metric comes from:

- Triton's own families (``nv_*``), as its metrics documentation lists them
  (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/metrics.md):
  :data:`TRITON_METRICS`. ``tests/integration/test_alert_metrics.py`` checks that the local
  tritonserver 2.51 exports each one the rules and the dashboard use, except the GPU ones (no GPU
  here);
- the embedding stage's counters (``ctr_embedding_*``), read from its source, where the backend
  names the families it creates;
- ``up``, which Prometheus writes for every scrape.

promtool (Prometheus's own checker) runs ``check config``, ``check rules`` and ``test rules``
(``alerts.test.yml``: each alert fires on the series it is written for, and not on the healthy ones
beside them). No package pip installs carries it: ``make setup`` (``python -m server promtool
install``) unpacks the one in Debian's ``prometheus`` package, pinned by hash in
``requirements-promtool.txt``, into ``.venv/bin``. The tests run that one, or the one ``PROMTOOL``
names, or one on ``PATH`` (:func:`server.promtool.locate`); where there is none (set-up could not
download it) they skip and say so.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.promtool import HOW_TO_GET, locate

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts.test.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "triton.json"
STAGE_BACKEND = ROOT / "backends" / "embedding" / "backend.cc"
METRICS_PAGE = ROOT / "docs" / "metrics.md"

#: Triton's metric families, from its metrics documentation (counts, latencies as counters and as
#: summaries, GPU, CPU, pinned memory).
TRITON_METRICS = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_pending_request_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        "nv_pinned_memory_pool_total_bytes",
        "nv_pinned_memory_pool_used_bytes",
    }
)
#: Written by Prometheus itself for each target it scrapes.
PROMETHEUS_METRICS = frozenset({"up"})
#: The GPU families: not exported by a server without a GPU.
GPU_METRICS = frozenset(name for name in TRITON_METRICS if name.startswith(("nv_gpu_", "nv_energy_")))

#: PromQL's words that are not metric names: operators, modifiers and aggregations.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
    | {"inf", "nan"}
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def stage_metrics() -> frozenset[str]:
    """The counter families the embedding stage creates, as its source names them."""
    families = re.findall(r'constexpr const char\* k\w*Family = "([a-z_]+)";', STAGE_BACKEND.read_text())
    assert families, f"no metric family found in {STAGE_BACKEND}"
    return frozenset(families)


def exported_metrics() -> frozenset[str]:
    return TRITON_METRICS | stage_metrics() | PROMETHEUS_METRICS


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, templates
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\boffset\s+-?\w+", "", text)
    text = re.sub(r"\$\w+", "", text)  # Grafana's variables ($model, $__rate_interval)
    names = set()
    for match in _NAME.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group(0).lower() in _KEYWORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(match.group(0))
    return names


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_the_name_reader_finds_metrics_only() -> None:
    expr = (
        'sum by (model) (rate(nv_inference_count{model=~"$model", tier="hot"}[$__rate_interval] offset 1d))'
        ' / on () group_left max(up{job="triton"}) > bool 0.5 and nv_cpu_utilization'
    )
    assert metric_names(expr) == {"nv_inference_count", "up", "nv_cpu_utilization"}


def test_every_rule_is_complete() -> None:
    rules = _rules()
    assert len(rules) >= 5
    names = [rule["alert"] for rule in rules]
    assert len(set(names)) == len(names), "two rules share a name"
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        assert re.fullmatch(r"\d+[smhd]", rule["for"]), rule["alert"]


def test_rules_and_dashboard_read_only_exported_metrics() -> None:
    known = exported_metrics()
    for rule in _rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']} reads no metric"
        assert names <= known, f"{rule['alert']} reads {sorted(names - known)}, which nothing exports"
    for expr in _dashboard_exprs():
        names = metric_names(expr)
        assert names and names <= known, f"the dashboard's {expr!r} reads {sorted(names - known)}"


def test_every_alert_is_tested_and_named_on_the_metrics_page() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    page = METRICS_PAGE.read_text()
    for rule in _rules():
        assert rule["alert"] in tested, f"alerts.test.yml never fires {rule['alert']}"
        assert f"`{rule['alert']}`" in page, f"docs/metrics.md does not name {rule['alert']}"


def test_prometheus_loads_the_rules_compose_mounts() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    assert config["rule_files"] == [ALERTS.name]
    assert yaml.safe_load(ALERTS_TEST.read_text())["rule_files"] == [ALERTS.name]
    prometheus = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["prometheus"]
    mounts = {}
    for volume in prometheus["volumes"]:
        source, target, *mode = volume.split(":")
        mounts[target] = (source, mode)
    config_file = next(
        arg.split("=", 1)[1] for arg in prometheus["command"] if arg.startswith("--config.file=")
    )
    # Prometheus reads rule_files relative to its config file's folder.
    rules_target = str(Path(config_file).parent / ALERTS.name)
    assert mounts[config_file] == ("./deploy/prometheus/prometheus.yml", ["ro"])
    assert mounts[rules_target] == ("./deploy/prometheus/alerts.yml", ["ro"])


def _promtool() -> str:
    promtool = locate()
    if promtool is None:
        pytest.skip(f"promtool is not installed: {HOW_TO_GET}")
    return str(promtool)


@pytest.mark.parametrize(
    "arguments",
    [
        ("check", "config", CONFIG.name),
        ("check", "rules", ALERTS.name),
        ("test", "rules", ALERTS_TEST.name),
    ],
    ids=lambda arguments: " ".join(arguments[:2]),
)
def test_promtool(arguments: tuple[str, ...]) -> None:
    done = subprocess.run(
        [_promtool(), *arguments], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr
