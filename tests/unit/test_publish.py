"""Publishing a model repository to S3-compatible storage and fetching it back, against moto's S3
server on loopback; the ``s3://`` URL forms tritonserver takes; one clear error line per bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundle.errors import ConfigError, StorageError
from bundle.s3 import S3Url
from export.publish import fetch_repository, publish_repository
from export.stage.hot_cold_lookup import PARAM_ROW_STORE
from server import ServerConfig
from tests.s3_server import CREDENTIALS, files, keys, s3_endpoint, two_model_repository

BUCKET = "models"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_endpoint(BUCKET) as address:
        yield address


def _repository(root: Path, store: str = "") -> Path:
    """A two-model repository (configs and model files; no server reads it here)."""
    return two_model_repository(root / "model_repository", {PARAM_ROW_STORE: store} if store else None)


@pytest.mark.parametrize(
    ("url", "bucket", "prefix", "endpoint_url"),
    [
        ("s3://models/ctr/repo", "models", "ctr/repo", None),
        ("s3://models", "models", "", None),
        ("s3://127.0.0.1:9000/models/ctr", "models", "ctr", "http://127.0.0.1:9000"),
        ("s3://https://minio.internal:9443/models/ctr", "models", "ctr", "https://minio.internal:9443"),
    ],
)
def test_url_forms_of_tritonserver(url: str, bucket: str, prefix: str, endpoint_url: str | None) -> None:
    parsed = S3Url.parse(url)
    assert (parsed.bucket, parsed.prefix, parsed.endpoint_url) == (bucket, prefix, endpoint_url)
    assert str(parsed) == url, "the URL published to is the URL tritonserver serves from"
    assert S3Url.parse(url + "/") == parsed


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/models/ctr", "is not an S3 URL"),
        ("s3://", "names no bucket"),
        ("s3://127.0.0.1:9000/", "names no bucket"),
        ("s3://Models/ctr", "not a valid S3 bucket name"),
        ("s3://https://models/ctr", "needs host:port"),
        ("s3://models/a//b", "double '/'"),
        ("s3://models/a/../b", "'..'"),
    ],
)
def test_bad_urls_are_one_clear_error(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        S3Url.parse(url)


def test_server_config_passes_s3_urls_on_as_they_are(tmp_path: Path) -> None:
    remote = ServerConfig(repository="s3://127.0.0.1:9000/models/ctr/")
    assert remote.remote and remote.repository == "s3://127.0.0.1:9000/models/ctr"
    assert remote.repository_argument == "s3://127.0.0.1:9000/models/ctr"
    local = ServerConfig(repository=str(tmp_path))
    assert not local.remote and local.repository == tmp_path
    assert local.repository_argument == str(tmp_path.resolve())
    with pytest.raises(ConfigError, match="names no bucket"):
        ServerConfig(repository="s3://")


def test_publish_uploads_every_file_and_fetch_brings_them_back(endpoint: str, tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    url = S3Url.parse(f"s3://{endpoint}/{BUCKET}/roundtrip/model_repository")
    result = publish_repository(repository, url)
    local = files(repository)
    assert result.files == len(local) == 4 and result.bytes == sum(map(len, local.values()))
    assert keys(endpoint, BUCKET, "roundtrip/") == sorted(f"roundtrip/model_repository/{k}" for k in local)
    fetched = fetch_repository(url, tmp_path / "fetched")
    assert fetched.files == 4
    assert files(tmp_path / "fetched") == local


def test_publish_delete_removes_what_the_folder_no_longer_holds(endpoint: str, tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    url = S3Url.parse(f"s3://{endpoint}/{BUCKET}/sync")
    publish_repository(repository, url)
    (repository / "wide_deep_onnx" / "1" / "model.onnx").unlink()
    kept = publish_repository(repository, url)
    assert kept.deleted == 0 and "sync/wide_deep_onnx/1/model.onnx" in keys(endpoint, BUCKET, "sync/")
    synced = publish_repository(repository, url, delete=True)
    assert synced.deleted == 1
    assert keys(endpoint, BUCKET, "sync/") == sorted(f"sync/{k}" for k in files(repository))


def test_publish_warns_of_a_row_store_outside_the_repository(
    endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = _repository(tmp_path, store="/data/row_store")
    publish_repository(repository, S3Url.parse(f"s3://{endpoint}/{BUCKET}/hot_cold"))
    assert "dlrm_onnx reads its row store from /data/row_store" in caplog.text


def test_errors_name_what_to_fix(endpoint: str, tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        publish_repository(tmp_path / "missing", S3Url.parse(f"s3://{endpoint}/{BUCKET}/x"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"holds no <model>/config\.pbtxt"):
        publish_repository(tmp_path / "empty", S3Url.parse(f"s3://{endpoint}/{BUCKET}/x"))
    with pytest.raises(StorageError, match=f"bucket 'no-such-bucket' does not exist at http://{endpoint}"):
        publish_repository(repository, S3Url.parse(f"s3://{endpoint}/no-such-bucket/x"))
    with pytest.raises(StorageError, match="holds no objects"):
        fetch_repository(S3Url.parse(f"s3://{endpoint}/{BUCKET}/never-published"), tmp_path / "out")
    closed = "127.0.0.1:1"
    with pytest.raises(StorageError, match=f"cannot reach the S3 endpoint http://{closed}"):
        publish_repository(repository, S3Url.parse(f"s3://{closed}/{BUCKET}/x"))


def test_cli_publishes_and_reports_errors_in_one_line(endpoint: str, tmp_path: Path) -> None:
    repository = _repository(tmp_path)
    env = {**os.environ, **CREDENTIALS}

    def run(*args: str, environ: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "export", *args]
        return subprocess.run(command, capture_output=True, text=True, env=environ, timeout=120, check=False)

    url = f"s3://{endpoint}/{BUCKET}/cli"
    done = run("publish", "--repository", str(repository), "--to", url)
    assert done.returncode == 0, done.stderr
    assert "published 4 files" in done.stdout and f"python -m server serve --repository {url}" in done.stdout
    done = run("publish", "--repository", str(repository), "--to", f"s3://{endpoint}/missing-bucket/x")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: bucket 'missing-bucket' does not exist at http://{endpoint}"
    )
    anonymous = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    anonymous["AWS_CONFIG_FILE"] = anonymous["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    done = run("publish", "--repository", str(repository), "--to", url, environ=anonymous)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: no S3 credentials to publish to {url}")
