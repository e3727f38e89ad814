"""The compose page's quickstart holds from export to a served request, read without Docker.

No Docker daemon and no GPU here, so the path is checked statically, as a user would walk it:

- every variable ``docker-compose.yml`` requires (``${VAR:?...}``) is set in the ``.env`` that the
  quickstart's ``bash deploy/make-env.sh`` makes (run here, in a copy), or exported on the page,
  and named in the quickstart;
- a client on another machine reaches the published loopback ports through the quickstart's SSH
  tunnel, which forwards the ports the page sends to;
- the quickstart's own export commands, run as written (only the checkpoint, SavedModel and
  repository paths swapped for tiny trained models and a temporary folder), write a repository
  that its own ``check-release`` line passes for the pinned release;
- each ``docker compose`` command is one Compose has, naming services the file has, and the
  ports the page sends to are the file's defaults.

The ``python -m`` commands' options are checked for every page by ``test_documented_commands``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bundle.ngc import PINNED_RELEASE

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "serving" / "compose.md"
COMPOSE_FILE = ROOT / "docker-compose.yml"
#: The Compose subcommands a quickstart may use.
COMPOSE_COMMANDS = {"up", "ps", "build", "run", "down", "logs", "config", "pull", "stop", "restart"}


def _quickstart() -> tuple[str, list[list[str]]]:
    """The quickstart section's text and the commands of its first bash block (continuations
    joined, comments dropped), each split as the shell would."""
    text = PAGE.read_text()
    section = text[text.index("## Quickstart") :]
    section = section[: section.index("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the quickstart has no bash block"
    joined = block.group(1).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return section, commands


def _env_file(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _made_env(folder: Path, commands: list[list[str]]) -> dict[str, str]:
    """The .env that the quickstart's own ``bash deploy/make-env.sh`` makes, run in a copy of the
    files it reads (the shell's own secrets left out); empty when the page does not run it."""
    if ["bash", "deploy/make-env.sh"] not in commands:
        return {}
    (folder / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "make-env.sh", folder / "deploy")
    shutil.copy(ROOT / ".env.example", folder)
    env = {key: value for key, value in os.environ.items() if not key.endswith(("_ADMIN_KEY", "_PASSWORD"))}
    done = subprocess.run(["bash", "deploy/make-env.sh"], cwd=folder, env=env, capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return _env_file(folder / ".env")


def test_every_variable_compose_requires_is_set_or_named_on_the_page(tmp_path: Path) -> None:
    section, commands = _quickstart()
    required = set(re.findall(r"\$\{(\w+):?\?", COMPOSE_FILE.read_text()))
    assert {"TRITON_ADMIN_KEY", "GRAFANA_ADMIN_PASSWORD"} <= required, (
        "compose requires the key and a password"
    )
    exported = {word.split("=", 1)[0] for words in commands if words[0] == "export" for word in words[1:]}
    made = _made_env(tmp_path, commands)
    for variable in sorted(required):
        assert made.get(variable) or variable in exported, (
            f"{variable}: neither in the .env the page makes nor set on the page"
        )
        assert f"`{variable}`" in section or variable in exported, variable
    # The secrets come from the made .env, never from the tracked example.
    assert not required & set(_env_file(ROOT / ".env.example"))


def test_a_client_elsewhere_reaches_the_ports_the_page_sends_to_through_its_tunnel() -> None:
    """Compose publishes on the GPU host's loopback only; the quickstart's ``ssh -L`` forwards each
    port the page's requests (and its client block) go to, to that loopback."""
    section, commands = _quickstart()
    tunnels = [words for words in commands if words[0] == "ssh"]
    assert len(tunnels) == 1, commands
    forwarded = {
        tunnels[0][i + 1].split(":", 1)[0]: tunnels[0][i + 1].split(":", 1)[1]
        for i, word in enumerate(tunnels[0])
        if word == "-L"
    }
    sent = set(re.findall(r"127\.0\.0\.1:(\d+)", section))
    assert sent and sent <= set(forwarded), f"ports sent to {sent}, forwarded {forwarded}"
    for port in sent:
        assert forwarded[port] == f"127.0.0.1:{port}", "to the same port on the GPU host's loopback"
    assert "`TRITON_BIND=" in section, "the page also says how to publish the ports instead"


def test_compose_commands_and_ports_are_the_files() -> None:
    _, commands = _quickstart()
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    services = set(compose["services"])
    seen = 0
    for words in commands:
        if words[:2] != ["docker", "compose"]:
            continue
        seen += 1
        rest = [word for word in words[2:] if not word.startswith("-")]
        assert rest and rest[0] in COMPOSE_COMMANDS, words
        named = [word for word in rest[1:] if not word.startswith(("/", "."))]
        assert set(named) <= services, f"{words}: no such service in docker-compose.yml"
    assert seen >= 2, "the quickstart starts no stack"
    text = COMPOSE_FILE.read_text()
    ports = {"http": "8000", "grpc": "8001"}
    for name, port in ports.items():
        assert f"${{TRITON_{name.upper()}_PORT:-{port}}}" in text, name
    urls = [word for words in commands for word in words if "127.0.0.1:" in word]
    assert urls and all(re.search(r"127\.0\.0\.1:(8000|8001)\b", url) for url in urls), urls


def _run(words: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, check=False)


@pytest.mark.integration
def test_the_pages_export_passes_its_check_release_for_the_pinned_release(
    tmp_path: Path, labeled_file: Path
) -> None:
    _, commands = _quickstart()
    exports = [words for words in commands if words[:3] == ["python", "-m", "export"]]
    families = [words for words in exports if words[3] in ("dlrm", "wide-deep")]
    checks = [words for words in exports if words[3] == "check-release"]
    assert len(families) == 2 and len(checks) == 1, exports
    train = ["--data", str(labeled_file), "--preset", "tiny", "--table-size", "500"]
    models = {"--checkpoint": tmp_path / "dlrm", "--saved-model": tmp_path / "wide_deep"}
    for family, out in (("dlrm", models["--checkpoint"]), ("wide-deep", models["--saved-model"])):
        trained = _run(["python", "-m", "models", "train", family, *train, "--out", str(out)])
        assert trained.returncode == 0, trained.stderr[-2000:]
    swap = {**{flag: str(path) for flag, path in models.items()}, "--repository": str(tmp_path / "repo")}

    def swapped(words: list[str]) -> list[str]:
        return [swap[words[i - 1]] if i and words[i - 1] in swap else word for i, word in enumerate(words)]

    for words in families:
        done = _run(swapped(words))
        assert done.returncode == 0, f"{' '.join(words)}:\n{done.stderr[-3000:]}"
    checked = _run(swapped(checks[0]))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"fits NGC {PINNED_RELEASE}" in checked.stdout
    assert any((tmp_path / "repo").glob("*/1/model.onnx"))
