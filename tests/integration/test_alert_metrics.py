"""The metrics the alert rules and the dashboard read, on the real local tritonserver 2.51.

One model (``stall``, :mod:`tests.stall_model`) and an ensemble of one step over it, under
explicit model control, with the summary latencies on as compose turns them on. After a few
inferences through the ensemble, ``/metrics`` holds every Triton family that
``deploy/prometheus/alerts.yml`` and the Grafana dashboard read, except the GPU ones (no GPU
here), each with a series of the model. The ensemble's line counts its steps' compute time as its
own, and its own scheduler's queue time, not theirs (what docs/metrics.md tells a reader of an
ensemble's line). Once the
models are unloaded, their series are gone, which is what the ``TritonModelGone`` rule looks for,
except the failure counters, which 2.51 keeps. The stage's counters (``ctr_embedding_*``) are
checked where a hot/cold model serves (``tests/integration/test_hot_set_rollout.py``).
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from bundle.repository import make_ensemble_version, write_config
from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, NUM_CATEGORICAL, NUM_DENSE, OUTPUT
from clients.triton import TritonClient
from server import LocalServer
from tests.conftest import StartTriton
from tests.stall_model import MODEL, write_stall_model
from tests.unit.test_alerts import GPU_METRICS, TRITON_METRICS, _dashboard_exprs, _rules, metric_names

pytestmark = pytest.mark.integration

ENSEMBLE = "stall_ensemble"
#: A family's ``# TYPE`` line on the metrics page.
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
#: The family the TritonModelGone rule reads.
GONE_FAMILY = "nv_inference_request_success"


def _metrics(server: LocalServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.config.metrics_port}/metrics", timeout=10) as page:
        return str(page.read().decode())


def _series(text: str, family: str, model: str) -> list[float]:
    """The values of ``family``'s series of ``model`` (a summary's ``_count`` and ``_sum`` too)."""
    pattern = rf'^{family}(?:_count|_sum)?\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$'
    return [float(value) for value in re.findall(pattern, text, re.MULTILINE)]


def _write_ensemble(repository: Path) -> None:
    config = mc.ModelConfig(name=ENSEMBLE, platform="ensemble", max_batch_size=64)
    config.input.add(name=DENSE_INPUT, data_type=mc.TYPE_FP32, dims=[NUM_DENSE])
    config.input.add(name=CATEGORICAL_INPUT, data_type=mc.TYPE_INT64, dims=[NUM_CATEGORICAL])
    config.output.add(name=OUTPUT, data_type=mc.TYPE_FP32, dims=[1])
    step = config.ensemble_scheduling.step.add(model_name=MODEL, model_version=-1)
    for name in (DENSE_INPUT, CATEGORICAL_INPUT):
        step.input_map[name] = name
    step.output_map[OUTPUT] = OUTPUT
    make_ensemble_version(repository, ENSEMBLE)
    write_config(repository / ENSEMBLE, config)


@pytest.fixture(scope="module")
def server(start_triton: StartTriton, tmp_path_factory: pytest.TempPathFactory) -> LocalServer:
    repository = write_stall_model(tmp_path_factory.mktemp("alert-metrics") / "repository")
    _write_ensemble(repository)
    return start_triton(
        repository,
        model_control_mode="explicit",
        load_models=(MODEL, ENSEMBLE),
        extra_args=("--metrics-config=summary_latencies=true",),
    )


def _wanted() -> list[str]:
    """The Triton families the rules and the dashboard read, less the GPU ones."""
    read = set().union(*(metric_names(rule["expr"]) for rule in _rules()))
    read |= set().union(*(metric_names(expr) for expr in _dashboard_exprs()))
    return sorted((read & TRITON_METRICS) - GPU_METRICS)


def test_the_rules_metrics_are_served_and_an_ensemble_counts_its_steps_compute(server: LocalServer) -> None:
    wanted = _wanted()
    assert {"nv_inference_request_failure", "nv_inference_queue_summary_us", GONE_FAMILY} <= set(wanted)
    inputs = {
        DENSE_INPUT: np.zeros((2, NUM_DENSE), dtype=np.float32),
        CATEGORICAL_INPUT: np.zeros((2, NUM_CATEGORICAL), dtype=np.int64),
    }
    with TritonClient(server.http_url, "http") as client:
        for _ in range(3):
            client.infer(ENSEMBLE, inputs)
    text = _metrics(server)
    families = dict(_TYPE.findall(text))
    missing = [family for family in wanted if family not in families]
    assert not missing, f"tritonserver 2.51 exports no {missing}"
    for family in wanted:
        assert _series(text, family, MODEL), f"no {family} series of {MODEL}"

    def total(family: str, model: str) -> float:
        return sum(_series(text, family, model))

    for family in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert total(family, ENSEMBLE) == total(family, MODEL) > 0, family
    compute = "nv_inference_compute_infer_duration_us"
    assert total(compute, ENSEMBLE) == total(compute, MODEL) > 0, "an ensemble's compute is its steps'"
    queue = "nv_inference_queue_duration_us"
    assert total(queue, ENSEMBLE) != total(queue, MODEL), "an ensemble's queue is its own scheduler's"


def test_an_unloaded_models_series_leave_but_its_failure_counters(server: LocalServer) -> None:
    server.unload_model(ENSEMBLE)
    server.unload_model(MODEL)
    text = _metrics(server)
    left = {family for family in _wanted() for model in (MODEL, ENSEMBLE) if _series(text, family, model)}
    assert GONE_FAMILY not in left
    # tritonserver 2.51 keeps the failure counters (one per reason) of a model it unloaded.
    assert left <= {"nv_inference_request_failure"}, f"unloaded, yet series of {sorted(left)} remain"
