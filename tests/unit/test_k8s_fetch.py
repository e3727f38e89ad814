"""The pod of each overlay run in its own filesystem layout: what the init containers write lands
where the manifests let them write, and the server serves the folder they filled.

Kubernetes runs every container of the tritonserver pod on a read-only root filesystem
(``readOnlyRootFilesystem: true``): it writes only into its volume mounts. An emptyDir volume
is a folder of the node, mounted into each container that names it (one mount each, shared
by the pod's containers, kept from the init containers to the server). ``python -m export
fetch`` downloads into a staging folder beside the repository, ``<parent>/.<name>.staging``
(:func:`bundle.staging.staging_root`), and moves each model in with one ``rename(2)``, which
fails across mounts: the repository and its staging folder must lie inside one writable mount.

Two checks over every container and volume of both overlays, as ``kubectl kustomize`` renders
them (the layout comes from the rendered pod, never from constants here):

- From the manifests: each path a container writes (an init container's ``--repository``,
  the staging folder beside it, its ``HOME``; the server's copy of an ``s3://`` repository,
  which tritonserver makes with ``mkdtemp("/tmp/folderXXXXXX")``) lies inside one writable
  mount; the server's ``--model-repository`` is the folder of the volume that the init
  containers fill.
- By running the pod: each emptyDir volume is a folder here. Each container gets a root of
  its own, read-only, that holds this machine's Python and the checkout (read-only too, at
  their own paths: the init containers' image holds the bundle and its Python the same way),
  with each of its volumes bind-mounted at its ``mountPath`` (read-only where the manifest
  says so), in a user and mount namespace of its own (``unshare -rm`` and ``chroot``: no root
  needed). In it, the fetch init container runs ``python -m export fetch`` with its
  manifest's arguments and environment against moto's S3 server on loopback, at the bucket
  and prefix of the manifest's own URL. trt-build needs TensorRT and a GPU, so it is probed
  instead: its repository holds what the fetch wrote and takes a new file. The server's
  repository holds the published models and nothing else (tritonserver loads every folder
  of it, hidden ones too), and it is read-only there; a server of an ``s3://`` repository
  can make its temporary folder under ``/tmp``. In every container a write to ``/`` fails
  with EROFS, so nothing lands outside the declared mounts.

Where the kernel (or a seccomp profile) refuses unprivileged user namespaces, the second check
skips with the reason; the first still runs. What differs from a cluster: the containers run
as uid 0 of the namespace (the pod runs as uid 1000; an emptyDir is world-writable, so no
permission differs), with this machine's Python and no network namespace of their own.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from bundle.s3 import S3Url
from bundle.staging import staging_root
from export.publish import publish_repository
from tests.k8s_manifests import K8S, OVERLAYS, pod_spec, render, server_container
from tests.s3_server import CREDENTIALS, MODELS, create_bucket, files, s3_endpoint, two_model_repository

ROOT = Path(__file__).resolve().parents[2]
#: The fake values of the Secrets the docs tell a user to create, by (Secret, key).
SECRETS = {
    ("triton-s3-credentials", "AWS_ACCESS_KEY_ID"): CREDENTIALS["AWS_ACCESS_KEY_ID"],
    ("triton-s3-credentials", "AWS_SECRET_ACCESS_KEY"): CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    ("triton-admin-key", "admin-key"): "k8s-layout-test-admin-key",
}
#: The image the init containers run and its entrypoint (deploy/k8s/trt-build/Dockerfile).
INIT_IMAGE = "ctr-bundle/trt-build"
INIT_ENTRYPOINT = '["python3", "-m", "export"]'
#: Where tritonserver copies an s3:// repository before it loads it (triton core's
#: LocalizePath: mkdtemp of "/tmp/folderXXXXXX").
LOCALIZED = PurePosixPath("/tmp/folderXXXXXX")
#: What a probe reports of each path: its entries, and whether a new folder can be made in it.
PROBE = """
import errno, json, os, sys, tempfile
report = {}
for path in sys.argv[1:]:
    entry = {"entries": sorted(os.listdir(path)) if os.path.isdir(path) else None}
    try:
        os.rmdir(tempfile.mkdtemp(prefix="probe", dir=path))
        entry["write"] = "ok"
    except OSError as error:
        entry["write"] = errno.errorcode.get(error.errno or 0, str(error))
    report[path] = entry
print(json.dumps(report))
"""


@dataclass(frozen=True)
class Mount:
    """One volumeMount of a container: ``volume`` (at its ``sub_path``) seen at ``path``."""

    path: PurePosixPath
    volume: str
    sub_path: PurePosixPath
    read_only: bool


def _mounts(container: dict[str, Any]) -> list[Mount]:
    return [
        Mount(
            PurePosixPath(m["mountPath"]),
            m["name"],
            PurePosixPath(m.get("subPath") or "."),
            bool(m.get("readOnly", False)),
        )
        for m in container.get("volumeMounts", [])
    ]


def _mount_of(mounts: list[Mount], path: PurePosixPath) -> Mount | None:
    """The mount that holds ``path`` (the deepest one); None: the container's root filesystem."""
    holding = [m for m in mounts if path == m.path or path.is_relative_to(m.path)]
    return max(holding, key=lambda m: len(m.path.parts), default=None)


def _place(mounts: list[Mount], path: PurePosixPath) -> tuple[str, PurePosixPath] | None:
    """Where ``path`` lies on the pod's volumes: (volume, folder inside it); None: on the root."""
    mount = _mount_of(mounts, path)
    if mount is None:
        return None
    return mount.volume, PurePosixPath(os.path.normpath(mount.sub_path / path.relative_to(mount.path)))


def _environment(
    container: dict[str, Any], resources: tuple[dict[str, Any], ...], overrides: dict[str, str]
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom ConfigMaps (with ``overrides``
    of their values), then env (literal values and :data:`SECRETS`)."""
    maps = {r["metadata"]["name"]: r.get("data", {}) for r in resources if r["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        data = maps[source["configMapRef"]["name"]]
        env.update({name: overrides.get(name, value) for name, value in data.items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(item["value"], env)
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = SECRETS[(ref["name"], ref["key"])]
    return env


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of args and env values; an unknown name stays as written."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def _option(args: list[str], name: str) -> str:
    """The value of ``name`` in ``args``: ``--name value`` or ``--name=value``."""
    for index, arg in enumerate(args):
        if arg == name:
            return args[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} is not among {args}")


def _stub_url(url: str, endpoint: str) -> str:
    """The manifest's repository URL, its bucket and prefix, on moto's endpoint."""
    parsed = S3Url.parse(url)
    return f"s3://{endpoint}/{parsed.bucket}/{parsed.prefix}"


def _init_containers(overlay: str) -> list[dict[str, Any]]:
    return list(pod_spec(overlay).get("initContainers", []))


def _init_args(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The init container's ``python -m export`` arguments, expanded."""
    assert "command" not in container, f"{container['name']}: the image's entrypoint is what runs"
    assert container["image"].rpartition(":")[0].endswith(INIT_IMAGE), container["image"]
    return [_expand(arg, env) for arg in container["args"]]


def _repository_of_server(overlay: str, env: dict[str, str]) -> str:
    return _option([_expand(arg, env) for arg in server_container(overlay)["args"]], "--model-repository")


def _writable(mounts: list[Mount], path: PurePosixPath, pod: dict[str, Any]) -> Mount | None:
    """The writable mount that holds ``path``, None where none does."""
    mount = _mount_of(mounts, path)
    volumes = {v["name"]: v for v in pod["volumes"]}
    if mount is None or mount.read_only or "emptyDir" not in volumes[mount.volume]:
        return None
    return mount


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_write_of_the_pod_lands_in_one_writable_mount(overlay: str) -> None:
    pod = pod_spec(overlay)
    resources = render(overlay)
    for volume in pod["volumes"]:
        # An emptyDir is what the layout check reproduces; another kind needs its reproduction here.
        assert set(volume) == {"name", "emptyDir"}, volume
    dockerfile = (K8S / "trt-build" / "Dockerfile").read_text()
    assert f"ENTRYPOINT {INIT_ENTRYPOINT}" in dockerfile
    filled: set[tuple[str, PurePosixPath] | None] = set()
    for container in _init_containers(overlay):
        name, mounts = container["name"], _mounts(container)
        env = _environment(container, resources, {})
        args = _init_args(container, env)
        assert args[0] in {"fetch", "tensorrt"}, f"{name} runs {args[0]}: add its check here"
        repository = PurePosixPath(_option(args, "--repository"))
        mount = _writable(mounts, repository, pod)
        assert mount is not None, f"{name}: {repository} is in no writable volume mount (read-only root)"
        if args[0] == "fetch":
            staging = staging_root(Path(str(repository)))
            assert _mount_of(mounts, PurePosixPath(staging)) == mount, (
                f"{name}: the fetch stages in {staging}, beside {repository}, outside the mount "
                f"{mount.path} that holds {repository}: the read-only root refuses it, and a rename "
                "across mounts fails; put the repository in a folder inside the mount"
            )
        assert "HOME" in env, f"{name}: no HOME (boto3 and TensorRT read and write there)"
        assert _writable(mounts, PurePosixPath(env["HOME"]), pod), f"{name}: HOME={env['HOME']} is read-only"
        filled.add(_place(mounts, repository))
    server = server_container(overlay)
    mounts = _mounts(server)
    served = _repository_of_server(overlay, _environment(server, resources, {}))
    if served.startswith("s3://"):
        assert not filled, "init containers fill a folder that the server does not serve"
        assert _writable(mounts, LOCALIZED, pod), f"tritonserver copies {served} into {LOCALIZED}: read-only"
    else:
        assert filled == {_place(mounts, PurePosixPath(served))}, (
            f"the server serves {served}, {_place(mounts, PurePosixPath(served))} of its volumes; "
            f"the init containers write {filled}"
        )
    used = {m.volume for c in [*_init_containers(overlay), *pod["containers"]] for m in _mounts(c)}
    assert used == {v["name"] for v in pod["volumes"]}, "a volume that no container mounts"


# ------------------------------------------------------------ the pod, run in its layout


def _host_folders() -> list[Path]:
    """The folders a container's root holds from this machine, read-only: the system's, this
    Python's and the checkout's (each once: a folder inside another one goes with it)."""
    wanted = {Path("/usr"), Path("/etc"), ROOT, Path(sys.prefix), Path(sys.base_prefix)}
    wanted |= {Path(p) for p in [*site.getsitepackages(), site.getusersitepackages()] if Path(p).is_dir()}
    wanted = {Path(os.path.abspath(p)) for p in wanted}
    return sorted(p for p in wanted if not any(p != q and p.is_relative_to(q) for q in wanted))


def _read_only_root(container: dict[str, Any]) -> bool:
    return bool(container.get("securityContext", {}).get("readOnlyRootFilesystem", False))


def _layout_script(mounts: list[Mount], volumes: Path, read_only_root: bool) -> str:
    """A shell script that builds a container's root at ``$1`` and runs the rest of its arguments
    there: a tmpfs (read-only for ``read_only_root``) with this machine's folders (read-only) and
    the container's volume mounts. It runs inside ``unshare -rm``, so no mount outlives it or
    shows outside it."""
    lines = ["set -eu", "root=$1; shift", 'mount -t tmpfs -o mode=0755 pod-root "$root"']
    for link in ("bin", "lib", "lib64", "sbin"):
        if Path("/", link).is_symlink():
            lines.append(f'ln -s {shlex.quote(os.readlink(Path("/", link)))} "$root/{link}"')
    # /dev/null and /dev/urandom; a device stays writable on a read-only mount.
    lines += ['mkdir -p "$root/dev"', 'mount --rbind /dev "$root/dev"']
    for mount in sorted(mounts, key=lambda m: len(m.path.parts)):
        source = volumes / mount.volume / mount.sub_path
        target = '"$root"' + shlex.quote(str(mount.path))
        lines += [
            f"mkdir -p {shlex.quote(str(source))} {target}",
            f"mount --bind {shlex.quote(str(source))} {target}",
        ]
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    for folder in _host_folders():
        # After the volumes: a checkout under /tmp stays visible over the pod's /tmp.
        assert not any(m.path.is_relative_to(str(folder)) for m in mounts), f"{folder} would hide a mount"
        target = '"$root"' + shlex.quote(str(folder))
        lines += [f"mkdir -p {target}", f"mount --rbind {shlex.quote(str(folder.resolve()))} {target}",
                  f"mount -o remount,bind,ro {target}"]  # fmt: skip
    if read_only_root:
        lines.append('mount -o remount,ro "$root"')
    lines += ["cd /", 'exec chroot "$root" "$@"']
    return "\n".join(lines)


@functools.cache
def _namespaces_refused() -> str | None:
    """Why a user and mount namespace with a tmpfs cannot be made here (None: it can)."""
    missing = [tool for tool in ("unshare", "mount", "chroot") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found"
    script = 'mount -t tmpfs probe "$1" && mount -o remount,ro "$1"'
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script, "sh", folder],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
    return None if done.returncode == 0 else f"unshare -rm and a tmpfs mount refused: {done.stderr.strip()}"


def _run_in_layout(
    container: dict[str, Any], argv: list[str], env: dict[str, str], volumes: Path, roots: Path
) -> subprocess.CompletedProcess[str]:
    """``argv`` in ``container``'s layout, with its environment (plus what the image sets)."""
    root = roots / container["name"]
    root.mkdir()
    image_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    script = _layout_script(_mounts(container), volumes, _read_only_root(container))
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "layout", str(root), *argv],
        capture_output=True, text=True, check=False, timeout=120, env={**image_env, **env},
    )  # fmt: skip


def _probe(
    container: dict[str, Any], paths: list[PurePosixPath], env: dict[str, str], volumes: Path, roots: Path
) -> dict[str, dict[str, Any]]:
    done = _run_in_layout(container, [sys.executable, "-c", PROBE, *map(str, paths)], env, volumes, roots)
    assert done.returncode == 0, f"{container['name']}: the probe failed:\n{done.stderr}"
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_endpoint() as address:
        yield address


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_init_containers_fill_what_the_server_serves_in_the_pods_own_layout(
    overlay: str, endpoint: str, tmp_path: Path
) -> None:
    refused = _namespaces_refused()
    if refused:
        pytest.skip(f"the pod's layout needs a user and mount namespace: {refused}")
    pod, resources = pod_spec(overlay), render(overlay)
    (config,) = [r["data"] for r in resources if r["kind"] == "ConfigMap"]
    overrides = {
        name: _stub_url(value, endpoint) for name, value in config.items() if value.startswith("s3://")
    }
    volumes, roots = tmp_path / "volumes", tmp_path / "roots"
    roots.mkdir()
    for volume in pod["volumes"]:
        (volumes / volume["name"]).mkdir(parents=True)
        (volumes / volume["name"]).chmod(0o777)  # as the kubelet makes an emptyDir
    published = two_model_repository(tmp_path / "published")
    filled: tuple[str, PurePosixPath] | None = None
    for container in _init_containers(overlay):
        name, mounts = container["name"], _mounts(container)
        env = _environment(container, resources, overrides)
        args = _init_args(container, env)
        repository = PurePosixPath(_option(args, "--repository"))
        if args[0] == "fetch":
            url = S3Url.parse(_option(args, "--from"))
            create_bucket(endpoint, url.bucket)
            publish_repository(published, url)
            done = _run_in_layout(container, [sys.executable, "-m", "export", *args], env, volumes, roots)
            assert done.returncode == 0, (
                f"{overlay}: init container {name}: python -m export {' '.join(args)} failed in the "
                f"pod's layout:\n{done.stdout}{done.stderr}"
            )
            assert f"fetched {len(files(published))} files" in done.stdout, done.stdout
            filled = _place(mounts, repository)
            assert filled is not None
            volume, folder = filled
            assert files(volumes / volume / folder) == files(published)
            # Nothing else is left in the volume: the staging folder went with the last move.
            left = sorted(p.name for p in (volumes / volume).iterdir())
            assert left == (list(folder.parts[:1]) or sorted(MODELS)), left
        else:
            # TensorRT and a GPU are not here: its repository holds what the fetch wrote, writable.
            report = _probe(container, [PurePosixPath("/"), repository], env, volumes, roots)
            assert report["/"]["write"] == ("EROFS" if _read_only_root(container) else "ok"), (name, report)
            assert report[str(repository)]["entries"] == sorted(MODELS), (name, report)
            assert report[str(repository)]["write"] == "ok", (name, report)
            assert _place(mounts, repository) == filled, f"{name} writes another folder than the fetch"
    server = server_container(overlay)
    env = _environment(server, resources, overrides)
    served = _repository_of_server(overlay, env)
    mounts = _mounts(server)
    paths = [PurePosixPath("/"), *(m.path for m in mounts)]
    paths.append(LOCALIZED.parent if served.startswith("s3://") else PurePosixPath(served))
    report = _probe(server, paths, env, volumes, roots)
    assert report["/"]["write"] == ("EROFS" if _read_only_root(server) else "ok"), report
    for mount in mounts:
        assert report[str(mount.path)]["write"] == ("EROFS" if mount.read_only else "ok"), (mount, report)
    if served.startswith("s3://"):
        assert filled is None
        assert report[str(LOCALIZED.parent)]["write"] == "ok", f"tritonserver copies {served} there"
    else:
        # tritonserver loads every folder of its repository: the published models and nothing else.
        assert report[served]["entries"] == sorted(MODELS), report[served]
        assert _place(mounts, PurePosixPath(served)) == filled, "the server serves another folder"
