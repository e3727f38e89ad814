"""The view of a repository that the local tritonserver 2.51 loads where the repository holds
``torch_aoti`` models (:mod:`server.repository_view`): such a model's config loses only its
platform, everything else is the repository's own, the repository is never changed, and a sync
follows models added, removed or re-exported since.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bundle.errors import ServerError
from bundle.repository import (
    AOTI_FILE,
    AOTI_PLATFORM,
    CONFIG_NAME,
    MODEL_FILE,
    ServingConfig,
    add_aoti_model,
    add_model,
    read_config,
    version_dir,
)
from server.config import ModelControlMode, ServerConfig
from server.installation import TritonInstallation
from server.launcher import LocalServer
from server.repository_view import ViewKeeper, local_config, sync_view


def _repository(root: Path) -> Path:
    """dlrm_onnx (a placeholder file) and dlrm_aoti over dlrm_aoti_package (a placeholder package)."""
    repository = root / "model_repository"
    serving = ServingConfig()
    onnx = version_dir(repository, "dlrm_onnx") / MODEL_FILE
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx")
    add_model(repository, "dlrm_onnx", serving)
    package = version_dir(repository, "dlrm_aoti_package") / AOTI_FILE
    package.parent.mkdir(parents=True)
    package.write_bytes(b"pt2")
    add_aoti_model(repository, "dlrm_aoti", "dlrm_aoti_package", serving, report={"model": "dlrm_aoti"})
    return repository


def test_only_the_packages_config_changes_and_only_by_its_platform(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    before = {path: path.read_bytes() for path in repository.rglob("*") if path.is_file()}
    view = tmp_path / "view"
    assert sync_view(repository, view) == ["dlrm_aoti_package"]
    for name in ("dlrm_onnx", "dlrm_aoti"):
        assert (view / name).is_symlink() and (view / name).resolve() == (repository / name).resolve()
    folder = view / "dlrm_aoti_package"
    assert folder.is_dir() and not folder.is_symlink()
    assert (folder / "1").is_symlink() and (folder / "1" / AOTI_FILE).read_bytes() == b"pt2"
    original = read_config(repository / "dlrm_aoti_package" / CONFIG_NAME)
    local = read_config(folder / CONFIG_NAME)
    assert original.platform == AOTI_PLATFORM and local.platform == ""
    original.ClearField("platform")
    assert local == original
    assert {path: path.read_bytes() for path in repository.rglob("*") if path.is_file()} == before


def test_a_sync_follows_the_repository_and_rewrites_nothing_unchanged(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    view = tmp_path / "view"
    sync_view(repository, view)
    written = (view / "dlrm_aoti_package" / CONFIG_NAME).stat().st_mtime_ns
    (repository / "dlrm_onnx_copy").mkdir()
    (repository / "dlrm_onnx_copy" / CONFIG_NAME).write_text('name: "dlrm_onnx_copy"\n')
    (repository / "dlrm_aoti_package" / "2").mkdir()
    config = repository / "dlrm_onnx" / CONFIG_NAME
    config.rename(tmp_path / "moved.pbtxt")  # dlrm_onnx is no model folder for a moment
    assert sync_view(repository, view) == ["dlrm_aoti_package"]
    assert (view / "dlrm_onnx_copy").is_symlink() and (view / "dlrm_aoti_package" / "2").is_symlink()
    assert (view / "dlrm_aoti_package" / CONFIG_NAME).stat().st_mtime_ns == written
    (repository / "dlrm_onnx_copy" / CONFIG_NAME).unlink()
    (repository / "dlrm_onnx_copy").rmdir()
    assert sync_view(repository, view) == ["dlrm_aoti_package"]
    assert not (view / "dlrm_onnx_copy").exists() and not (view / "dlrm_onnx_copy").is_symlink()


def test_a_repository_without_packages_needs_no_view_and_other_configs_stay(tmp_path: Path) -> None:
    repository = tmp_path / "model_repository"
    onnx = version_dir(repository, "dlrm_onnx") / MODEL_FILE
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"onnx")
    add_model(repository, "dlrm_onnx", ServingConfig())
    assert sync_view(repository, tmp_path / "view") == []
    text = (repository / "dlrm_onnx" / CONFIG_NAME).read_text()
    assert local_config(text) is None and local_config("not { a config") is None


def test_the_server_is_given_the_view_only_where_one_is_needed(tmp_path: Path) -> None:
    try:
        installation = TritonInstallation.locate()
    except ServerError as exc:
        pytest.skip(f"no local tritonserver: {exc}")
    plain = tmp_path / "plain"
    plain.mkdir()
    server = LocalServer(ServerConfig(plain), installation=installation)
    server._make_view(plain)
    assert f"--model-repository={plain.resolve()}" in server.command(installation, tmp_path / "backends")
    repository = _repository(tmp_path)
    files = sorted(path for path in repository.rglob("*") if path.is_file())
    server = LocalServer(ServerConfig(repository), installation=installation)
    server._make_view(repository)
    view = server._view_dir
    assert view is not None and (view / "dlrm_aoti_package" / CONFIG_NAME).is_file()
    assert f"--model-repository={view}" in server.command(installation, tmp_path / "backends")
    server._cleanup_files()
    # The view's links go with it; what they point at stays.
    assert not view.exists() and sorted(path for path in repository.rglob("*") if path.is_file()) == files


def _until(condition: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_polling_servers_view_follows_a_re_export_and_a_new_model_by_itself(tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    view = tmp_path / "view"
    sync_view(repository, view)
    keeper = ViewKeeper(repository, view, interval_s=0.05).start()
    try:
        # Re-exported with another batch limit, and a model added: the view follows with no load call.
        add_aoti_model(repository, "dlrm_aoti", "dlrm_aoti_package", ServingConfig(max_batch_size=64))
        (repository / "dlrm_onnx_copy").mkdir()
        assert _until(lambda: read_config(view / "dlrm_aoti_package" / CONFIG_NAME).max_batch_size == 64)
        assert _until(lambda: (view / "dlrm_onnx_copy").is_symlink())
        assert read_config(view / "dlrm_aoti_package" / CONFIG_NAME).platform == ""
    finally:
        keeper.stop()
    # Renames leave no temporary file behind in the view.
    assert not [path for path in view.rglob(".*")]


def test_the_launcher_keeps_the_view_in_step_where_the_server_loads_after_its_start(tmp_path: Path) -> None:
    try:
        installation = TritonInstallation.locate()
    except ServerError as exc:
        pytest.skip(f"no local tritonserver: {exc}")
    repository = _repository(tmp_path)
    modes = ((ModelControlMode.NONE, False), (ModelControlMode.POLL, True), (ModelControlMode.EXPLICIT, True))
    for mode, kept in modes:
        server = LocalServer(ServerConfig(repository, model_control_mode=mode), installation=installation)
        server._make_view(repository)
        assert (server._view_keeper is not None) is kept, mode
        server._cleanup_files()
        assert server._view_keeper is None and server._view_dir is None
