"""docker-compose.yml: valid for `docker-compose config`, and the serving stack the README promises.

Needs the `docker-compose` command (Debian's 1.29 is enough: `make deps-system`
installs it as root). Its `config` output is YAML; this environment has no
YAML parser, so it is read with the interpreter docker-compose 1.x itself runs
on (which has PyYAML), or with `config --format json` on Compose v2.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "triton.json"
GPU_SERVICES = {"tritonserver", "trt-build"}
SERVERS = {"tritonserver", "tritonserver-cpu"}
#: A clean environment: the defaults in the file are what is checked, not this shell's settings.
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
#: The admin key has no default: the stack is checked with this one set.
TEST_ADMIN_KEY = "0123456789abcdef0123456789abcdef"
ADMIN_APIS = "model-repository,shared-memory,trace,logging"


def _docker_compose() -> str:
    path = shutil.which("docker-compose")
    if path is None:
        pytest.skip(
            "docker-compose is not installed: run `make deps-system` (as root it runs "
            "`apt-get install -y docker-compose`) to validate docker-compose.yml"
        )
    return path


def _run(args: list[str], stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(
        args,
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=CLEAN_ENV if env is None else env,
        check=False,
        timeout=120,
    )
    if completed.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({completed.returncode}):\n{completed.stderr}")
    return completed.stdout


def _config_command() -> list[str]:
    return [_docker_compose(), "-f", str(COMPOSE_FILE), "--profile", "gpu", "--profile", "cpu", "config"]


def _yaml_to_json(compose: str, text: str) -> Any:
    """Parse YAML with the Python that docker-compose 1.x runs on (it depends on PyYAML)."""
    shebang = Path(compose).read_bytes()[:200].split(b"\n", 1)[0].decode(errors="replace")
    if not shebang.startswith("#!") or "python" not in shebang:
        pytest.skip(f"{compose} is not a Python script ({shebang!r}); cannot parse its YAML")
    interpreter = shebang[2:].split()
    code = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"
    return json.loads(_run([*interpreter, "-c", code], stdin=text))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The resolved compose file (variables at their defaults, every profile)."""
    command = _docker_compose()
    version = _run([command, "version", "--short"]).strip()
    base = _config_command()
    env = {**CLEAN_ENV, "TRITON_ADMIN_KEY": TEST_ADMIN_KEY}
    if version.startswith("1."):
        return dict(_yaml_to_json(command, _run(base, env=env)))
    return dict(json.loads(_run([*base, "--format", "json"], env=env)))


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def _yaml_file(path: Path) -> Any:
    return _yaml_to_json(_docker_compose(), path.read_text())


def _volumes(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """``(source, target, read_only)`` of each mount, short or long syntax."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            mode = parts[2] if len(parts) > 2 else "rw"
            mounts.append((parts[0], parts[1], "ro" in mode.split(",")))
        else:
            mounts.append((str(volume["source"]), str(volume["target"]), bool(volume.get("read_only"))))
    return mounts


def _host_ips(service: dict[str, Any]) -> list[str]:
    ips = []
    for port in service.get("ports", []):
        if isinstance(port, str):
            parts = port.split(":")
            ips.append(parts[0] if len(parts) == 3 else "")
        else:
            ips.append(str(port.get("host_ip", "")))
    return ips


def test_services_and_profiles(services: dict[str, Any]) -> None:
    assert set(services) == {"tritonserver", "trt-build", "tritonserver-cpu", "prometheus", "grafana"}
    for name in GPU_SERVICES:
        assert services[name]["profiles"] == ["gpu"], name
    assert services["tritonserver-cpu"]["profiles"] == ["cpu"]
    for name in ("prometheus", "grafana"):
        assert "profiles" not in services[name], f"{name} runs with either profile"
    env_file = (ROOT / ".env").read_text()
    assert re.search(r"^COMPOSE_PROFILES=gpu$", env_file, re.MULTILINE), (
        "plain `docker compose up` is the gpu stack"
    )


def test_images_are_pinned_and_nvidia_images_share_one_release(services: dict[str, Any]) -> None:
    for name, service in services.items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"{name}: {image} has no tag"
        assert not image.endswith((":latest", ":main", ":nightly")), f"{name}: {image} is not pinned"
    release = re.compile(r"nvcr\.io/nvidia/(tritonserver|tensorrt):(\d{2}\.\d{2})-py3")
    found = {name: release.fullmatch(services[name]["image"]) for name in (*SERVERS, "trt-build")}
    assert all(found.values()), found
    # A plan runs only under the TensorRT that built it: one NGC release for all three.
    assert len({match.group(2) for match in found.values() if match}) == 1
    assert services["trt-build"]["image"].startswith("nvcr.io/nvidia/tensorrt:")


def test_gpu_reservation(services: dict[str, Any]) -> None:
    for name in GPU_SERVICES:
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}], name
    for name in ("tritonserver-cpu", "prometheus", "grafana"):
        assert "deploy" not in services[name], f"{name} must run without a GPU"


def test_published_ports_bind_to_loopback(services: dict[str, Any]) -> None:
    published = {name: _host_ips(service) for name, service in services.items() if service.get("ports")}
    assert set(published) == {*SERVERS, "prometheus", "grafana"}
    for name, ips in published.items():
        assert ips and all(ip == "127.0.0.1" for ip in ips), f"{name} publishes {ips}"
    for name in SERVERS:
        targets = {str(port).split(":")[-1].split("/")[0] for port in services[name]["ports"]}
        assert targets == {"8000", "8001", "8002"}, name


def test_mounts_of_the_checkout_are_read_only(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for source, target, read_only in _volumes(service):
            is_bind = source.startswith("/")
            if is_bind and not (name == "trt-build" and target == "/models"):
                assert read_only, f"{name}: {source} -> {target} must be read-only"
    for name in SERVERS:
        models = [m for m in _volumes(services[name]) if m[1] == "/models"]
        assert len(models) == 1 and models[0][2], f"{name} serves its repository read-only"
    build = {target: read_only for _, target, read_only in _volumes(services["trt-build"])}
    assert build["/bundle"] is True and build["/models"] is False, "trt-build writes only the plans"


def test_server_health_start_order_and_hardening(services: dict[str, Any]) -> None:
    for name in SERVERS:
        server = services[name]
        check = " ".join(server["healthcheck"]["test"])
        assert "/v2/health/ready" in check and "8000" in check, name
        assert server["healthcheck"]["retries"] >= 1
        assert "--model-repository=/models" in server["command"]
        assert "--metrics-config=summary_latencies=true" in server["command"], "p50/p99 panels need summaries"
    assert services["tritonserver"]["depends_on"] == {
        "trt-build": {"condition": "service_completed_successfully"}
    }
    assert "depends_on" not in services["tritonserver-cpu"]
    for name, service in services.items():
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert not service.get("privileged"), name
        assert service.get("cap_drop") == ["ALL"], f"{name} keeps Linux capabilities"
        assert not {"network_mode", "pid", "ipc", "devices"} & set(service), f"{name} shares host namespaces"
    assert sorted(services["trt-build"]["cap_add"]) == ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
    for name in ("tritonserver", "tritonserver-cpu", "prometheus", "grafana"):
        assert "cap_add" not in services[name], name
    build = services["trt-build"]
    assert build["entrypoint"][-1] == "/bundle/deploy/trt-build/build.sh"
    assert "python3 -m export tensorrt" in (ROOT / "deploy" / "trt-build" / "build.sh").read_text()


def test_prometheus_scrapes_triton_and_grafana_is_provisioned(services: dict[str, Any]) -> None:
    prometheus = _yaml_file(ROOT / "deploy" / "prometheus" / "prometheus.yml")
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert targets == ["tritonserver:8002"]
    assert "tritonserver" in services["tritonserver-cpu"]["networks"]["default"]["aliases"]

    datasources = _yaml_file(ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = _yaml_file(ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "triton.yml")
    grafana_mounts = {target for _, target, _ in _volumes(services["grafana"])}
    assert providers["providers"][0]["options"]["path"] in grafana_mounts

    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    for metric in (
        "nv_inference_request_success",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "ctr_embedding_lookups_total",  # hierarchical models: the embedding stage's hot/cold counters
    ):
        assert metric in exprs, metric
    assert 'tier="hot"' in exprs and 'tier="cold"' in exprs
    assert 'quantile="0.5"' in exprs and 'quantile="0.99"' in exprs
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"]}
    assert uids == {source["uid"]}


def test_admin_apis_need_the_key_on_both_servers(services: dict[str, Any]) -> None:
    for name in SERVERS:
        command = services[name]["command"]
        assert f"--http-restricted-api={ADMIN_APIS}:admin-key={TEST_ADMIN_KEY}" in command, name
        assert f"--grpc-restricted-protocol={ADMIN_APIS}:admin-key={TEST_ADMIN_KEY}" in command, name
        # Inference, health, metadata, model config and statistics stay open; the
        # health check needs no key.
        assert "inference" not in " ".join(arg for arg in command if "restricted" in arg)


def test_there_is_no_default_admin_key_and_compose_refuses_to_run_without_one() -> None:
    text = COMPOSE_FILE.read_text()
    assert "TRITON_ADMIN_KEY:-" not in text and "TRITON_ADMIN_KEY-" not in text, "no default key"
    assert "TRITON_ADMIN_KEY" not in (ROOT / ".env").read_text(), "no key committed in .env"
    completed = subprocess.run(
        _config_command(), capture_output=True, text=True, cwd=ROOT, env=CLEAN_ENV, check=False, timeout=120
    )
    assert completed.returncode != 0
    assert "set TRITON_ADMIN_KEY" in completed.stderr and "openssl rand -hex 32" in completed.stderr
