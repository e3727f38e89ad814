"""docker-compose.yml: valid against the Compose Specification, and the serving stack the docs promise.

No Docker and no root: the file is read the way Compose reads it, then checked.
- YAML with anchors and ``<<`` merge keys (PyYAML's safe loader resolves both);
- variable interpolation as the Compose Specification defines it (``${VAR}``,
  ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``,
  ``${VAR:+alt}``, ``${VAR+alt}``, ``$$``), from the ``.env`` that
  ``deploy/make-env.sh`` makes (``.env.example`` and the two secrets) and a
  clean environment: no pip package implements it (docker-compose 1.29 on PyPI
  needs jsonschema<4, PyYAML<6 and websocket-client<1, which this environment
  has newer), so :func:`_interpolate` does, and the tests below hold it to the
  file's own defaults and its required admin key and Grafana password;
- ``.env`` itself: git ignores it and tracks none, ``.env.example`` holds no secret and names
  each setting at the file's own default, and ``deploy/make-env.sh`` makes one compose accepts;
- ``deploy/trt-build/build.sh``, run outside its container with a stand-in python3: pinned
  wheels installed once, from the index or (with no network) the wheel folder;
- the stages' CMake project, configured: warnings are errors unless the image build turns them off;
- the Compose Specification's JSON schema, as check-jsonschema ships it
  (``--builtin-schema vendor.compose-spec``): its CLI on the file as written,
  and the same schema in-process on the interpolated file;
- ``docker-compose config`` (Compose 1.29, Debian's package) where it is installed;
- the servers' image, built by ``deploy/tritonserver/Dockerfile``, read instruction by
  instruction: the stages built (and their C API declarations checked) against the NGC image's
  own headers, each backend where a config's ``backend`` name makes tritonserver look.
"""

from __future__ import annotations

import copy
import http.server
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import jsonschema
import pytest
import yaml

from bundle.ngc import PINNED_RELEASE
from export.raw_rows import STAGE_BACKEND as RAW_ROWS_BACKEND
from server.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
MAKE_ENV = ROOT / "deploy" / "make-env.sh"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "triton.json"
SERVER_DOCKERFILE = ROOT / "deploy" / "tritonserver" / "Dockerfile"
STAGES_SOURCE = ROOT / "backends"
#: The compiled stages, by the backend name a config.pbtxt gives (``backend: "raw_rows"``).
COMPILED_STAGES = {RAW_ROWS_BACKEND, "embedding"}
#: Where the NGC image's tritonserver looks for the backend ``<name>``.
NGC_BACKENDS = "/opt/tritonserver/backends"
GPU_SERVICES = {"tritonserver", "trt-build"}
SERVERS = {"tritonserver", "tritonserver-cpu"}
#: A clean environment: the defaults in the file are what is checked, not this shell's settings.
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
#: The admin key has no default: the stack is checked with this one set.
TEST_ADMIN_KEY = "0123456789abcdef0123456789abcdef"
#: Nor has Grafana's admin password.
TEST_GRAFANA_PASSWORD = "fedcba9876543210fedcba9876543210"
#: The variables compose requires, each with no default, that deploy/make-env.sh writes into .env.
SECRETS = {"TRITON_ADMIN_KEY": TEST_ADMIN_KEY, "GRAFANA_ADMIN_PASSWORD": TEST_GRAFANA_PASSWORD}
ADMIN_APIS = "model-repository,shared-memory,trace,logging"

_VARIABLE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[_a-zA-Z][_a-zA-Z0-9]*))")
_BRACED = re.compile(r"(?P<name>[_a-zA-Z][_a-zA-Z0-9]*)(?:(?P<op>:?[-?+])(?P<arg>.*))?", re.DOTALL)


class InterpolationError(ValueError):
    """A ``${VAR:?message}`` whose variable is missing: Compose stops with the message."""


def _substitute(text: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        if match.group("named"):
            return env.get(match.group("named"), "")
        braced = _BRACED.fullmatch(match.group("braced"))
        if braced is None:
            raise InterpolationError(f"invalid interpolation format: {match.group(0)!r}")
        name, op, arg = braced.group("name", "op", "arg")
        value = env.get(name)
        present = value is not None and (value != "" or not (op or "").startswith(":"))
        if op in ("-", ":-"):
            return value if present and value is not None else arg
        if op in ("?", ":?"):
            if not present or value is None:
                raise InterpolationError(f"required variable {name} is missing a value: {arg}")
            return value
        if op in ("+", ":+"):
            return arg if present else ""
        return value or ""

    return _VARIABLE.sub(replace, text)


def _interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """Every string value of a loaded compose file, interpolated (keys stay as written)."""
    if isinstance(node, str):
        return _substitute(node, env)
    if isinstance(node, dict):
        return {key: _interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolate(value, env) for value in node]
    return node


def _dotenv(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """A ``.env`` file's KEY=VALUE lines, which Compose reads for interpolation: by default
    ``.env.example``, what every ``.env`` that ``deploy/make-env.sh`` makes starts from (the
    secrets it appends are given by each test)."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip().strip("'\"")
    return values


def _load(env: Mapping[str, str], path: Path = COMPOSE_FILE) -> dict[str, Any]:
    """The compose file as Compose resolves it: YAML merged, then interpolated with ``.env`` under ``env``."""
    return dict(_interpolate(yaml.safe_load(path.read_text()), {**_dotenv(), **env}))


def _compose_schema() -> dict[str, Any]:
    """The Compose Specification's JSON schema, vendored by check-jsonschema."""
    resource = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return dict(json.loads(resource.read_text()))


def _schema_errors(document: dict[str, Any]) -> list[str]:
    schema = _compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The resolved compose file (variables at their defaults, every profile, the test secrets)."""
    return _load({**CLEAN_ENV, **SECRETS})


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


def _yaml_file(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_the_file_as_written_validates_with_check_jsonschema() -> None:
    command = [
        sys.executable,
        "-m",
        "check_jsonschema",
        "--builtin-schema",
        "vendor.compose-spec",
        str(COMPOSE_FILE),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_the_resolved_file_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    assert _schema_errors(compose) == []


def test_the_schema_rejects_what_compose_would(compose: dict[str, Any]) -> None:
    misspelled = copy.deepcopy(compose)
    misspelled["services"]["prometheus"]["imag"] = misspelled["services"]["prometheus"].pop("image")
    assert any("imag" in error for error in _schema_errors(misspelled))
    wrong_type = copy.deepcopy(compose)
    wrong_type["services"]["tritonserver"]["cap_drop"] = "ALL"  # a list in the specification
    assert _schema_errors(wrong_type)


def test_interpolation_follows_the_compose_specification() -> None:
    env = {"SET": "x", "EMPTY": ""}
    cases = {
        "$SET ${SET}": "x x",
        "${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d}": "d d  d",
        "${SET:+alt} ${EMPTY:+alt} ${EMPTY+alt} ${UNSET+alt}": "alt  alt ",
        "$$SET $${SET}": "$SET ${SET}",
        "${SET:?message}": "x",
    }
    for text, expected in cases.items():
        assert _substitute(text, env) == expected, text
    for text in ("${UNSET:?needed}", "${EMPTY:?needed}", "${UNSET?needed}"):
        with pytest.raises(InterpolationError, match="needed"):
            _substitute(text, env)
    assert _substitute("${EMPTY?needed}", env) == ""


def _volumes(service: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """``(source, target, read_only)`` of each mount, short or long syntax."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            mode = parts[2] if len(parts) > 2 else "rw"
            mounts.append((_source(parts[0]), parts[1], "ro" in mode.split(",")))
        else:
            mounts.append(
                (_source(str(volume["source"])), str(volume["target"]), bool(volume.get("read_only")))
            )
    return mounts


def _source(source: str) -> str:
    """A bind mount's source as Compose resolves it (a path relative to the project folder made
    absolute); a named volume's name unchanged."""
    if source.startswith((".", "~")):
        return os.path.normpath(ROOT / os.path.expanduser(source))
    return source


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
    assert set(services) == {
        "tritonserver", "trt-build", "tritonserver-cpu", "perf-analyzer", "prometheus", "grafana"
    }  # fmt: skip
    # The reference load tool runs only when asked for (docker compose --profile sdk run ...).
    assert services["perf-analyzer"]["profiles"] == ["sdk"]
    assert services["perf-analyzer"]["entrypoint"] == ["perf_analyzer"]
    for name in GPU_SERVICES:
        assert services[name]["profiles"] == ["gpu"], name
    assert services["tritonserver-cpu"]["profiles"] == ["cpu"]
    for name in ("prometheus", "grafana"):
        assert "profiles" not in services[name], f"{name} runs with either profile"
    env_file = ENV_EXAMPLE.read_text()
    assert re.search(r"^COMPOSE_PROFILES=gpu$", env_file, re.MULTILINE), (
        "plain `docker compose up` is the gpu stack"
    )


def test_images_are_pinned_and_nvidia_images_share_one_release(services: dict[str, Any]) -> None:
    for name, service in services.items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"{name}: {image} has no tag"
        assert not image.endswith((":latest", ":main", ":nightly")), f"{name}: {image} is not pinned"
    release = re.compile(r"nvcr\.io/nvidia/(tritonserver|tensorrt):(\d{2}\.\d{2})-py3")
    # The servers run an image built from NGC's tritonserver image: its release is the FROM's.
    images = {name: _base_images(services[name]) for name in SERVERS}
    assert all(len(set(froms)) == 1 for froms in images.values()), images
    found = {name: release.fullmatch(images[name][0]) for name in SERVERS}
    found["trt-build"] = release.fullmatch(services["trt-build"]["image"])
    assert all(found.values()), found
    # A plan runs only under the TensorRT that built it: one NGC release for all three; and
    # perf_analyzer comes from the SDK image of the same release as the server it measures.
    releases = {match.group(2) for match in found.values() if match}
    assert len(releases) == 1
    (release_tag,) = releases
    assert services["perf-analyzer"]["image"] == f"nvcr.io/nvidia/tritonserver:{release_tag}-py3-sdk"
    assert services["trt-build"]["image"].startswith("nvcr.io/nvidia/tensorrt:")


def _dockerfile(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of each instruction, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        keyword, _, arguments = pending.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def _build_files(service: dict[str, Any]) -> tuple[Path, Path]:
    """The build context and the Dockerfile of a service, as Compose resolves them (the
    Dockerfile's path is relative to the context)."""
    context = Path(_source(str(service["build"]["context"])))
    return context, Path(os.path.normpath(context / service["build"]["dockerfile"]))


def _base_images(service: dict[str, Any]) -> list[str]:
    """The image of each ``FROM`` of the service's Dockerfile, its ``ARG``s resolved with the
    service's build args (``ARG NAME=default`` where compose gives none)."""
    _, dockerfile = _build_files(service)
    args = {**_dockerfile_args(dockerfile), **service["build"].get("args", {})}
    images = []
    for keyword, arguments in _dockerfile(dockerfile):
        if keyword == "FROM":
            images.append(_substitute(arguments.split()[0], args))
    return images


def _dockerfile_args(dockerfile: Path) -> dict[str, str]:
    defaults = (a.partition("=") for keyword, a in _dockerfile(dockerfile) if keyword == "ARG")
    return {name: value for name, _, value in defaults}


def test_servers_run_the_ngc_image_with_the_compiled_stages_built_in(services: dict[str, Any]) -> None:
    """Both servers: one image, built (never pulled) from backends by the Dockerfile, of the
    NGC release of every other NVIDIA image of the file."""
    for name in SERVERS:
        server = services[name]
        context, dockerfile = _build_files(server)
        assert context == STAGES_SOURCE, f"{name}: the build context is the stages' sources alone"
        assert dockerfile == SERVER_DOCKERFILE, name
        assert server["build"]["args"] == {"NGC_RELEASE": PINNED_RELEASE}, name
        assert server["image"] == f"ctr-bundle/tritonserver:{PINNED_RELEASE}-py3", name
        # A local name: pulling it would fetch whatever a registry holds under it.
        assert server["pull_policy"] == "build", name
        assert _base_images(server) == [f"nvcr.io/nvidia/tritonserver:{PINNED_RELEASE}-py3"] * 2, name
    assert _dockerfile_args(SERVER_DOCKERFILE) == {"NGC_RELEASE": PINNED_RELEASE}, "docker build's default"


def test_the_build_stage_builds_and_checks_the_stages_against_the_images_headers() -> None:
    instructions = _dockerfile(SERVER_DOCKERFILE)
    stages = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    assert len(stages) == 2, "a build stage, then the serving stage"
    build, serve = instructions[stages[0] : stages[1]], instructions[stages[1] :]
    build_from = build[0][1].split()
    assert build_from[0] == serve[0][1] == "nvcr.io/nvidia/tritonserver:${NGC_RELEASE}-py3"
    assert build_from[1:] == ["AS", "stages"]
    runs = " && ".join(arguments for keyword, arguments in build if keyword == "RUN")
    assert ("COPY", ". /src/stages") in build, "the context (backends) is the CMake project"
    assert "apt-get install -y --no-install-recommends cmake g++ make" in runs
    configure = re.search(r"cmake -S /src/stages -B /build/stages (.*?) &&", runs)
    assert configure, runs
    # TRITON_INCLUDE_DIR turns on common/api_check.cc: the bundle's declarations against the
    # image's tritonbackend.h and tritonserver.h.
    assert "-DTRITON_INCLUDE_DIR=/opt/tritonserver/include" in configure.group(1).split()
    assert "-DCMAKE_BUILD_TYPE=Release" in configure.group(1).split()
    # A user's image build, under the image's g++: warnings stay warnings.
    assert "-DSTAGES_WERROR=OFF" in configure.group(1).split()
    assert "cmake --build /build/stages" in runs
    assert not [keyword for keyword, _ in serve if keyword == "RUN"], "no compiler in the served image"


def _compile_commands(build: Path, *options: str) -> list[str]:
    """The compiler command of each source of the stages' CMake project, configured with ``options``."""
    subprocess.run(
        ["cmake", "-S", str(STAGES_SOURCE), "-B", str(build), "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *options],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return [entry["command"] for entry in json.loads((build / "compile_commands.json").read_text())]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_warnings_are_errors_in_the_bundles_own_builds_only(tmp_path: Path) -> None:
    """``-Werror`` comes from one option, on unless turned off: ``make stages`` (which leaves it at
    its default) fails on a warning; the serving image's build, under the image's g++, does not."""
    by_default = _compile_commands(tmp_path / "default")
    assert by_default and all("-Werror" in command.split() for command in by_default)
    turned_off = _compile_commands(tmp_path / "off", "-DSTAGES_WERROR=OFF")
    assert len(turned_off) == len(by_default)
    assert not any("-Werror" in command.split() for command in turned_off)
    assert all({"-Wall", "-Wextra"} <= set(command.split()) for command in turned_off), "warnings still shown"
    assert "STAGES_WERROR" not in (ROOT / "Makefile").read_text(), "make stages keeps the default, ON"


def test_each_compiled_stage_lands_where_its_backend_name_points() -> None:
    """``backend: "<stage>"`` makes tritonserver open ``backends/<stage>/libtriton_<stage>.so``;
    CMake builds that library as ``<build>/<stage>/libtriton_<stage>.so`` (target
    ``triton_<stage>`` of ``backends/<stage>/CMakeLists.txt``)."""
    copied: dict[str, str] = {}
    for keyword, arguments in _dockerfile(SERVER_DOCKERFILE):
        if keyword == "COPY" and arguments.startswith("--from=stages "):
            _, source, target = arguments.split()
            copied[target] = source
    assert copied == {
        f"{NGC_BACKENDS}/{stage}/": f"/build/stages/{stage}/libtriton_{stage}.so" for stage in COMPILED_STAGES
    }
    built = set()
    for cmake in STAGES_SOURCE.glob("*/CMakeLists.txt"):
        stage = cmake.parent.name
        if re.search(rf"add_library\(triton_{stage}\s+SHARED\b", cmake.read_text()):
            built.add(stage)
    assert built == COMPILED_STAGES, "each backend library the stages' CMake project builds is served"


def _docker_compose_config(env_file: Path) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` (every profile) with ``env_file`` as its .env and a clean shell, so
    that a .env of this checkout's own plays no part."""
    command = ["docker-compose", "--env-file", str(env_file), "--profile", "gpu", "--profile", "cpu",
               "--profile", "sdk", "config"]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=CLEAN_ENV, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


needs_docker_compose = pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose (1.29) is not installed"
)


@needs_docker_compose
def test_docker_compose_resolves_the_file(tmp_path: Path) -> None:
    """Compose's own reading (no daemon needed) with the .env make-env.sh makes: every profile, the
    build contexts present."""
    done, env_file = _make_env(tmp_path)
    assert done.returncode == 0, done.stderr
    resolved_run = _docker_compose_config(env_file)
    assert resolved_run.returncode == 0, resolved_run.stderr
    resolved = yaml.safe_load(resolved_run.stdout)
    for name in SERVERS:
        assert resolved["services"][name]["build"]["context"] == str(STAGES_SOURCE), name
        assert resolved["services"][name]["image"] == f"ctr-bundle/tritonserver:{PINNED_RELEASE}-py3"
        assert resolved["services"][name]["environment"] == {
            "TRITON_ADMIN_KEY": _dotenv(env_file)["TRITON_ADMIN_KEY"]
        }
    grafana = resolved["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"] == _dotenv(env_file)["GRAFANA_ADMIN_PASSWORD"]


@needs_docker_compose
@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_docker_compose_refuses_the_file_without_each_secret(tmp_path: Path, secret: str) -> None:
    env_file = tmp_path / ".env"
    others = "".join(f"{name}={value}\n" for name, value in SECRETS.items() if name != secret)
    env_file.write_text(ENV_EXAMPLE.read_text() + others)
    refused = _docker_compose_config(env_file)
    assert refused.returncode != 0
    assert f"set {secret}" in refused.stderr and "bash deploy/make-env.sh" in refused.stderr, refused.stderr


TRT_BUILD_SCRIPT = ROOT / "deploy" / "trt-build" / "build.sh"
#: A stand-in for the TensorRT image's python3: it says which Python it is, logs each pip and
#: export call, and fails a pip call when PIP_FAILS is set (as pip does without a wheel for a pin).
_FAKE_PYTHON = """#!/bin/bash
if [ "$1" = -c ]; then echo 3.12; exit 0; fi
echo "$*" >>"$CALLS"
if [ "$2" = pip ] && [ -n "${PIP_FAILS:-}" ]; then
    echo "ERROR: No matching distribution found for numpy==1.26.4" >&2; exit 1
fi
"""


def _trt_build(
    tmp_path: Path, *args: str, wheels: bool = False, pip_fails: bool = False
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """deploy/trt-build/build.sh run outside its container: the checkout, the packages' volume and
    the repository in ``tmp_path``, python3 the stand-in above. Returns the run and the calls."""
    bundle, tools = tmp_path / "bundle", tmp_path / "bin"
    for folder in (
        bundle / "deploy" / "trt-build",
        tools,
        tmp_path / "deps",
        tmp_path / "models" / "dlrm_trt",
    ):
        folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "requirements.txt", bundle / "requirements.txt")
    if wheels:
        (bundle / "deploy" / "trt-build" / "wheels").mkdir(exist_ok=True)
        (bundle / "deploy" / "trt-build" / "wheels" / "numpy-1.26.4-cp312-cp312-linux_x86_64.whl").touch()
    (tools / "python3").write_text(_FAKE_PYTHON)
    (tools / "python3").chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {
        **CLEAN_ENV, "PATH": f"{tools}:{CLEAN_ENV['PATH']}", "CALLS": str(calls),
        "TRT_BUILD_BUNDLE": str(bundle), "TRT_BUILD_DEPS": str(tmp_path / "deps"),
        "TRT_BUILD_MODELS": str(tmp_path / "models"), **({"PIP_FAILS": "1"} if pip_fails else {}),
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(TRT_BUILD_SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    return done, calls.read_text().splitlines()


def test_trt_build_installs_pinned_wheels_once_from_the_index_or_the_wheel_folder(tmp_path: Path) -> None:
    done, calls = _trt_build(tmp_path / "index", "--force")
    assert done.returncode == 0, done.stderr
    pip, export = calls
    assert pip.startswith("-m pip --disable-pip-version-check install ") and "--only-binary=:all:" in pip
    assert "--no-index" not in pip and "--constraint" in pip and pip.endswith("typer rich psutil")
    assert "for Python 3.12" in done.stdout and "https://pypi.org/simple" in done.stdout
    assert export.startswith("-m export tensorrt --repository ") and export.endswith("--force")
    again, calls = _trt_build(tmp_path / "index")
    assert again.returncode == 0 and [call.split()[:3] for call in calls] == [["-m", "export", "tensorrt"]], (
        "installed once"
    )
    offline, calls = _trt_build(tmp_path / "offline", wheels=True)
    assert offline.returncode == 0, offline.stderr
    wheels = tmp_path / "offline" / "bundle" / "deploy" / "trt-build" / "wheels"
    assert f"--no-index --find-links {wheels}" in calls[0] and "--only-binary=:all:" in calls[0]
    assert "(no network)" in offline.stdout
    assert _git("check-ignore", "--no-index", "--quiet", "deploy/trt-build/wheels/x.whl").returncode == 0


def test_trt_build_stops_in_one_line_when_a_pin_has_no_wheel_and_downloads_wheels(tmp_path: Path) -> None:
    done, calls = _trt_build(tmp_path / "fails", pip_fails=True)
    assert done.returncode == 1 and len(calls) == 1, "no build without its packages"
    assert "No matching distribution found for numpy==1.26.4" in done.stderr
    assert (
        "trt-build: error: pip could not install the pinned packages for the image's Python 3.12"
        in done.stderr
    )
    assert not list((tmp_path / "fails" / "deps").glob(".installed-*")), "a failed install is tried again"
    fetched, calls = _trt_build(tmp_path / "download", "download-wheels")
    assert fetched.returncode == 0, fetched.stderr
    wheels = tmp_path / "download" / "bundle" / "deploy" / "trt-build" / "wheels"
    (call,) = calls
    assert call.startswith(
        f"-m pip --disable-pip-version-check download --only-binary=:all: --dest {wheels} "
    )


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
        test = server["healthcheck"]["test"]
        # Not the ready endpoint alone: one tiny inference per served model, then a restart on an error.
        assert test[:3] == ["CMD", "python3", "-c"] and test[4:] == ["restart", "8000", "/models"], name
        assert "/v2/health/ready" in test[3] and "/infer" in test[3], name
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
        "ctr_embedding_lookups_total",  # hot/cold models: the embedding stage's hot/cold counters
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


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_refuses_to_resolve_without_each_secret(secret: str) -> None:
    """No default admin key and no default Grafana password: without either (unset or empty),
    Compose stops with a line naming it and how to make it."""
    text = COMPOSE_FILE.read_text()
    assert f"${{{secret}:?" in text
    assert not re.search(rf"\$\{{{secret}:?[-+]", text), f"{secret} has a default"
    others = {name: value for name, value in SECRETS.items() if name != secret}
    for env in ({**CLEAN_ENV, **others}, {**CLEAN_ENV, **others, secret: ""}):
        with pytest.raises(InterpolationError) as refused:
            _load(env)
        assert f"set {secret}" in str(refused.value) and "bash deploy/make-env.sh" in str(refused.value)
    _load({**CLEAN_ENV, **SECRETS})  # and with both, it resolves


def test_the_servers_take_the_key_and_load_every_model_under_explicit_model_control(
    services: dict[str, Any],
) -> None:
    """Explicit model control with every model loaded at start: the server starts as with ``none``,
    and a load call with the admin key reloads a model from the host-written repository. The health
    check lists the loaded models through the repository index, so it gets the key too."""
    for name in SERVERS:
        command = services[name]["command"]
        assert "--model-control-mode=explicit" in command and "--load-model=*" in command, name
        assert [arg for arg in command if arg.startswith("--load-model")] == ["--load-model=*"], (
            "Triton refuses --load-model=* beside another --load-model"
        )
        assert services[name]["environment"] == {"TRITON_ADMIN_KEY": TEST_ADMIN_KEY}, name
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == TEST_GRAFANA_PASSWORD


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)  # fmt: skip
def test_env_is_ignored_and_not_tracked() -> None:
    """The secrets live in .env, which git ignores and must not hold: only .env.example is tracked."""
    assert _git("check-ignore", "--no-index", "--quiet", ".env").returncode == 0, ".gitignore lacks .env"
    tracked = _git("ls-files", "--error-unmatch", ".env")
    assert tracked.returncode != 0, ".env is tracked: `git rm --cached .env`"
    assert _git("ls-files", "--error-unmatch", ".env.example").returncode == 0, ".env.example is not tracked"
    assert _git("check-ignore", "--no-index", "--quiet", ".env.example").returncode == 1


def _assignments(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """``(set, commented)``: the ``NAME=value`` lines of a .env file, and its ``# NAME=value`` lines."""
    set_lines = dict(re.findall(r"^([A-Z_][A-Z0-9_]*)=(.*)$", text, re.MULTILINE))
    commented = dict(re.findall(r"^#\s*([A-Z_][A-Z0-9_]*)=(.*)$", text, re.MULTILINE))
    return set_lines, commented


def test_env_example_holds_no_secret_and_names_each_setting_at_its_default() -> None:
    text = ENV_EXAMPLE.read_text()
    set_lines, commented = _assignments(text)
    assert set_lines == {"COMPOSE_PROFILES": "gpu"}, "only the profile is set; no secret, no other value"
    for secret in SECRETS:
        assert secret in text, f"{secret} is not named in .env.example"
        assert secret not in set_lines and secret not in commented, f".env.example gives {secret} a value"
    compose = COMPOSE_FILE.read_text()
    defaults = dict(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):-([^}]*)\}", compose))
    # Each setting with a default is there, commented out at the file's own default; nothing else is.
    assert commented == defaults
    assert set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", compose)) == set(defaults) | set(SECRETS)


def _make_env(folder: Path, existing: str | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """deploy/make-env.sh run in a copy of the checkout's two files it needs; ``existing`` a .env
    already there."""
    (folder / "deploy").mkdir(parents=True, exist_ok=True)
    shutil.copy(MAKE_ENV, folder / "deploy" / "make-env.sh")
    shutil.copy(ENV_EXAMPLE, folder / ".env.example")
    if existing is not None:
        (folder / ".env").write_text(existing)
    env = {key: value for key, value in os.environ.items() if key not in SECRETS}
    done = subprocess.run(
        ["bash", str(folder / "deploy" / "make-env.sh")], capture_output=True, text=True, env=env,
        check=False, timeout=60,
    )  # fmt: skip
    return done, folder / ".env"


def test_make_env_writes_both_secrets_once_and_compose_resolves_with_its_file(tmp_path: Path) -> None:
    done, env_file = _make_env(tmp_path)
    assert done.returncode == 0, done.stderr
    made = _dotenv(env_file)
    assert all(re.fullmatch(r"[0-9a-f]{64}", made.get(name, "")) for name in SECRETS), made
    assert made["TRITON_ADMIN_KEY"] != made["GRAFANA_ADMIN_PASSWORD"]
    assert env_file.stat().st_mode & 0o777 == 0o600, "readable by its owner only"
    assert env_file.read_text().startswith(ENV_EXAMPLE.read_text()), (
        "a copy of .env.example, secrets appended"
    )
    # Compose resolves the file with that .env alone (the shell sets neither secret).
    resolved = dict(_interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), {**made, **CLEAN_ENV}))
    command = resolved["services"]["tritonserver"]["command"]
    assert f"--http-restricted-api={ADMIN_APIS}:admin-key={made['TRITON_ADMIN_KEY']}" in command
    # Run again: the same key and password (a new key would recreate the server with another one).
    again, _ = _make_env(tmp_path)
    assert again.returncode == 0 and _dotenv(env_file) == made
    assert again.stdout.count("kept") == 2


def test_make_env_keeps_a_users_settings_and_fills_an_empty_secret(tmp_path: Path) -> None:
    existing = "COMPOSE_PROFILES=cpu\nTRITON_BIND=0.0.0.0\nTRITON_ADMIN_KEY=\nGRAFANA_ADMIN_PASSWORD=mine"
    done, env_file = _make_env(tmp_path, existing)
    assert done.returncode == 0, done.stderr
    made = _dotenv(env_file)
    assert made["COMPOSE_PROFILES"] == "cpu" and made["TRITON_BIND"] == "0.0.0.0"
    assert made["GRAFANA_ADMIN_PASSWORD"] == "mine"
    assert re.fullmatch(r"[0-9a-f]{64}", made["TRITON_ADMIN_KEY"])
    assert env_file.read_text().count("TRITON_ADMIN_KEY=") == 1, "the empty line is replaced, not shadowed"


# ----------------------------------------------------------- the health check, run
class _FakeTriton(http.server.BaseHTTPRequestHandler):
    """Answers like tritonserver: ready, metadata of three models, and inference on them.

    ``dlrm_onnx`` is served (the schema's inputs); ``dlrm_embedding`` (a stage) and
    ``dlrm_dense`` (a hot/cold dense model) are not, and are never sent inference. The repository
    index (with the admin key) lists them READY, and ``wide_deep_onnx``, whose folder is written
    but which is not loaded (explicit model control), UNAVAILABLE: it has no metadata to give.
    """

    infer_status = 200
    inferred: ClassVar[list[str]] = []
    INDEX: ClassVar[dict[str, str]] = {
        "dlrm_onnx": "READY",
        "dlrm_embedding": "READY",
        "dlrm_dense": "READY",
        "wide_deep_onnx": "UNAVAILABLE",
    }
    METADATA: ClassVar[dict[str, list[tuple[str, str, list[int]]]]] = {
        "dlrm_onnx": [("dense_features", "FP32", [-1, 13]), ("categorical_ids", "INT64", [-1, 26])],
        "dlrm_embedding": [("categorical_ids", "INT64", [-1, 26])],
        "dlrm_dense": [("dense_features", "FP32", [-1, 13]), ("hot_slots", "INT64", [-1, 26])],
    }

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path in ("/v2/health/ready", "/v2/health/live"):
            self._answer(200, None)
            return
        name = self.path.removeprefix("/v2/models/")
        inputs = [{"name": n, "datatype": t, "shape": d} for n, t, d in self.METADATA[name]]
        self._answer(200, {"name": name, "inputs": inputs})

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v2/repository/index":
            if self.headers.get("admin-key") != TEST_ADMIN_KEY:
                self._answer(403, {"error": "This API is restricted, expecting header 'admin-key'"})
                return
            self._answer(
                200, [{"name": name, "version": "1", "state": state} for name, state in self.INDEX.items()]
            )
            return
        name = self.path.removeprefix("/v2/models/").removesuffix("/infer")
        shapes = {tensor["name"]: (tensor["shape"], len(tensor["data"])) for tensor in request["inputs"]}
        assert shapes == {"dense_features": ([1, 13], 13), "categorical_ids": ([1, 26], 26)}
        type(self).inferred.append(name)
        if self.infer_status == 200:
            self._answer(200, {"outputs": [{"name": "click_probability", "data": [0.5]}]})
        else:
            self._answer(self.infer_status, {"error": "Stub process 'dlrm_onnx_0_0' is not healthy."})


@pytest.fixture()
def fake_triton(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    models = tmp_path / "models"
    for name in _FakeTriton.METADATA:
        (models / name).mkdir(parents=True)
        (models / name / "config.pbtxt").write_text(f'name: "{name}"\n')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeTriton)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeTriton.inferred = []
    try:
        yield server.server_address[1], models
    finally:
        server.shutdown()
        thread.join()
        _FakeTriton.infer_status = 200


def _health(
    services: dict[str, Any], mode: str, port: int, models: Path, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The compose health check's script, run here (never in mode ``restart``: it signals PID 1),
    with the environment compose gives the server (``key``: its TRITON_ADMIN_KEY)."""
    assert mode in ("ready", "live")
    script = services["tritonserver"]["healthcheck"]["test"][3]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_ADMIN_KEY"}
    if key is not None:
        env["TRITON_ADMIN_KEY"] = key
    return subprocess.run(
        [sys.executable, "-c", script, mode, str(port), str(models)],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )  # fmt: skip


def test_health_check_infers_on_each_served_model(
    services: dict[str, Any], fake_triton: tuple[int, Path]
) -> None:
    port, models = fake_triton
    done = _health(services, "ready", port, models)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _FakeTriton.inferred == ["dlrm_onnx"], "stages and dense models are reached through their ensemble"
    assert done.stdout.strip() == "healthy: dlrm_onnx"


def test_health_check_fails_naming_a_model_whose_backend_died(
    services: dict[str, Any], fake_triton: tuple[int, Path]
) -> None:
    port, models = fake_triton
    _FakeTriton.infer_status = 500
    for mode in ("ready", "live"):
        done = _health(services, mode, port, models)
        assert done.returncode == 1, mode
        assert done.stdout.strip() == (
            'model dlrm_onnx answers HTTP 500: {"error": "Stub process \'dlrm_onnx_0_0\' is not healthy."}'
        )


def test_health_check_liveness_tolerates_a_busy_model_readiness_does_not(
    services: dict[str, Any], fake_triton: tuple[int, Path]
) -> None:
    port, models = fake_triton
    _FakeTriton.infer_status = 503
    assert _health(services, "ready", port, models).returncode == 1
    assert _health(services, "live", port, models).returncode == 0
    for mode in ("ready", "live"):
        down = _health(services, mode, free_ports(1)[0], models)
        assert down.returncode == 1 and down.stdout.startswith("tritonserver not healthy:"), mode


def test_health_check_with_the_key_infers_on_the_loaded_models_only(
    services: dict[str, Any], fake_triton: tuple[int, Path]
) -> None:
    """Compose gives the servers the key, so the check lists what the server has loaded: a model
    folder written into the repository but not loaded yet (explicit model control) is no failure."""
    port, models = fake_triton
    (models / "wide_deep_onnx").mkdir()
    (models / "wide_deep_onnx" / "config.pbtxt").write_text('name: "wide_deep_onnx"\n')
    key = services["tritonserver"]["environment"]["TRITON_ADMIN_KEY"]
    done = _health(services, "ready", port, models, key=key)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _FakeTriton.inferred == ["dlrm_onnx"]
    assert done.stdout.strip() == "healthy: dlrm_onnx"
    # Without the key the check lists the folders, and the written, unloaded model fails it.
    assert _health(services, "ready", port, models).returncode == 1
