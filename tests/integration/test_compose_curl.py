"""The compose page's first request and its model reload, run as written against a real local tritonserver.

No Docker and no GPU here, so the stack itself does not run; what a user types against it does:

- the first request (``docs/serving/compose.md``, the block marked ``<!-- run: served -->``): its
  JSON body, parsed out of the page's ``curl`` line, is sent with urllib to every model of the
  tensor interface on the local server, and each answer is checked against the same rows sent
  through ``tritonclient``;
- the reload (the blocks marked ``<!-- run: reload -->`` of the compose page and of
  ``docs/reliability.md``): run with bash, in a folder holding the ``.env`` that
  ``deploy/make-env.sh`` makes, against a local server started with compose's model control
  (explicit, ``--load-model=*``) and that ``.env``'s admin key, after the models' files were
  written anew (as the page's copy does), while a stream of requests goes to each reloaded model.

The local tritonserver is the wheel's (2.51), not the NGC image's 2.75.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from bundle.schema import CATEGORICAL_INPUT, DENSE_INPUT, INPUTS, OUTPUT
from server import LocalServer

pytestmark = pytest.mark.integration

StartTriton = Callable[..., LocalServer]  # the start_triton fixture of conftest.py

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PAGE = ROOT / "docs" / "serving" / "compose.md"
RELIABILITY_PAGE = ROOT / "docs" / "reliability.md"
#: Where the pages send to: compose's default HTTP port on the GPU host's loopback (or the tunnel's).
PAGE_ADDRESS = "127.0.0.1:8000"
#: urllib without the environment's proxies: every request here goes to this machine.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _blocks(page: Path, marker: str) -> list[str]:
    """The bash blocks of ``page`` marked ``<!-- run: <marker> -->``."""
    return re.findall(rf"<!-- run: {marker} -->\n```bash\n(.*?)```", page.read_text(), re.DOTALL)


def _first_request() -> tuple[str, dict[str, Any]]:
    """The compose page's first request: the model it calls and the JSON body its curl sends."""
    (block,) = _blocks(COMPOSE_PAGE, "served")
    words = shlex.split(block)
    assert words[0] == "curl" and "-d" in words and "-X" not in words, "a plain POST with a body"
    assert words[words.index("-H") + 1] == "Content-Type: application/json"
    (url,) = [word for word in words if word.startswith("http://")]
    address = urllib.parse.urlsplit(url)
    assert address.netloc == PAGE_ADDRESS, url
    found = re.fullmatch(r"/v2/models/(\w+)/infer", address.path)
    assert found, url
    return found.group(1), json.loads(words[words.index("-d") + 1])


def _post(url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})})
    with OPENER.open(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def _get(url: str) -> Any:
    with OPENER.open(url, timeout=30) as answer:
        return json.loads(answer.read())


def _index(server: LocalServer) -> list[dict[str, Any]]:
    """The server's repository index (an admin API: with its key where it has one)."""
    key = server.config.admin_key
    return list(_post(f"http://{server.http_url}/v2/repository/index", {}, {"admin-key": key} if key else {}))


def _interface_models(server: LocalServer) -> list[str]:
    """The models the server has loaded whose inputs are the tensor interface's two."""
    interface = sorted(spec.name for spec in INPUTS)
    names = sorted({m["name"] for m in _index(server) if m.get("state") == "READY"})
    return [
        name
        for name in names
        if sorted(i["name"] for i in _get(f"http://{server.http_url}/v2/models/{name}")["inputs"])
        == interface
    ]


def _rows(body: dict[str, Any]) -> dict[str, np.ndarray]:
    """The body's tensors as arrays of their declared dtype and shape."""
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    rows = {}
    for tensor in body["inputs"]:
        array = np.asarray(tensor["data"], dtype=dtypes[tensor["datatype"]])
        assert list(array.shape) == tensor["shape"], f"{tensor['name']}: data of shape {array.shape}"
        rows[tensor["name"]] = array
    return rows


def _grpc_answer(server: LocalServer, model: str, rows: dict[str, np.ndarray]) -> np.ndarray:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        tensors = []
        for name, array in rows.items():
            tensor = grpcclient.InferInput(
                name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64"
            )
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer(model, tensors, outputs=[grpcclient.InferRequestedOutput(OUTPUT)])
        return np.asarray(result.as_numpy(OUTPUT))


def test_the_first_request_is_the_tensor_interface() -> None:
    """The page's body: ``dense_features`` FP32 ``B x 13`` and ``categorical_ids`` INT64 ``B x 26``, in
    row-major nested rows, asking for ``click_probability``."""
    _, body = _first_request()
    rows = _rows(body)
    batch = len(body["inputs"][0]["data"])
    assert batch >= 2, "more than one row, so the batch dimension shows"
    assert {name: (array.dtype, array.shape[1:]) for name, array in rows.items()} == {
        spec.name: (np.dtype(spec.dtype), spec.shape) for spec in INPUTS
    }
    assert all(array.shape[0] == batch for array in rows.values())
    assert body["outputs"] == [{"name": OUTPUT}]
    assert np.isfinite(rows[DENSE_INPUT]).all() and (rows[DENSE_INPUT] >= 0).all(), "log1p of counts"
    assert (rows[CATEGORICAL_INPUT] >= 0).all()


def test_the_first_request_is_answered_by_every_model_of_the_tensor_interface(
    exported_server: LocalServer,
) -> None:
    """The body as written, to the model the page names and to every other model of the interface
    (the page says the same body goes to each): one probability per row, as tritonclient gets it."""
    model, body = _first_request()
    models = _interface_models(exported_server)
    assert model in models, f"the page calls {model}, which the exported repository does not serve"
    rows = _rows(body)
    batch = rows[DENSE_INPUT].shape[0]
    for name in models:
        answer = _post(f"http://{exported_server.http_url}/v2/models/{name}/infer", body)
        assert answer["model_name"] == name
        (output,) = answer["outputs"]
        assert (output["name"], output["datatype"], output["shape"]) == (OUTPUT, "FP32", [batch, 1]), name
        probabilities = np.asarray(output["data"], dtype=np.float32).reshape(batch, 1)
        assert ((probabilities > 0) & (probabilities < 1)).all(), (name, probabilities)
        np.testing.assert_allclose(
            probabilities, _grpc_answer(exported_server, name, rows), rtol=0, atol=1e-6
        )


# ------------------------------------------------------------------ the reload
@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding ``.env`` as ``deploy/make-env.sh`` makes it (what the reload reads its key from)."""
    folder = tmp_path_factory.mktemp("checkout")
    (folder / "deploy").mkdir()
    shutil.copy(ROOT / "deploy" / "make-env.sh", folder / "deploy")
    shutil.copy(ROOT / ".env.example", folder)
    done = subprocess.run(["bash", "deploy/make-env.sh"], cwd=folder, capture_output=True, text=True,
                          check=True, timeout=60, env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    assert "TRITON_ADMIN_KEY added" in done.stdout
    return folder


def _admin_key(checkout: Path) -> str:
    (key,) = re.findall(r"^TRITON_ADMIN_KEY=(.+)$", (checkout / ".env").read_text(), re.MULTILINE)
    return key


@pytest.fixture(scope="module")
def compose_like_server(
    start_triton: StartTriton,
    exported_repository: Path,
    checkout: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalServer, Path]]:
    """A copy of the exported repository served as compose serves: explicit model control, every
    model loaded at start, the admin key of the checkout's ``.env``."""
    repository = tmp_path_factory.mktemp("served") / "model_repository"
    shutil.copytree(exported_repository, repository)
    server = start_triton(
        repository, model_control_mode="explicit", load_models=("*",), admin_key=_admin_key(checkout)
    )
    yield server, repository
    server.stop()


def _rewrite(folder: Path) -> None:
    """Each file of a model folder written anew, as a copy from the export machine writes it: the
    same bytes in a new file renamed over the old one."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        partial = path.with_name(path.name + ".partial")
        shutil.copy2(path, partial)
        partial.replace(path)
        path.touch()


class _Traffic:
    """Requests (the page's first request) sent to each model, one after another, until stopped."""

    def __init__(self, server: LocalServer, models: list[str], body: dict[str, Any]) -> None:
        self.answered: dict[str, int] = dict.fromkeys(models, 0)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server.http_url, models, body), daemon=True)

    def _run(self, address: str, models: list[str], body: dict[str, Any]) -> None:
        while not self._stop.is_set():
            for model in models:
                try:
                    answer = _post(f"http://{address}/v2/models/{model}/infer", body)
                    assert answer["outputs"][0]["name"] == OUTPUT
                    self.answered[model] += 1
                except (OSError, AssertionError, KeyError, ValueError) as error:
                    detail = (
                        error.read().decode() if isinstance(error, urllib.error.HTTPError) else repr(error)
                    )
                    self.failures.append(f"{model}: {detail}")

    def __enter__(self) -> _Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _loads(log: Path, model: str) -> int:
    return log.read_text(errors="replace").count(f"successfully loaded '{model}'")


def test_compose_model_control_loads_every_model_at_start(
    compose_like_server: tuple[LocalServer, Path],
) -> None:
    """``--load-model=*``: every model of the repository is loaded, as with model control ``none``."""
    server, repository = compose_like_server
    folders = {path.parent.name for path in repository.glob("*/config.pbtxt")}
    assert {m["name"] for m in _index(server) if m.get("state") == "READY"} == folders


def test_the_pages_reload_answers_every_request_and_needs_the_key(
    compose_like_server: tuple[LocalServer, Path], checkout: Path
) -> None:
    server, repository = compose_like_server
    _, body = _first_request()
    served = set(_interface_models(server))
    blocks = [(page, block) for page in (COMPOSE_PAGE, RELIABILITY_PAGE) for block in _blocks(page, "reload")]
    assert len(blocks) == 2, "one reload block on each page"
    for page, block in blocks:
        assert PAGE_ADDRESS in block, page
        listed = re.search(r'^models="([^"]+)"$', block, re.MULTILINE)
        if listed:
            page_models = listed.group(1).split()
            models = [name for name in page_models if name in served]
            # Only the TensorRT model is the GPU's alone; the others are served here.
            assert [name for name in page_models if name not in served] == [
                name for name in page_models if name.endswith("_trt")
            ], page_models
            script = block.replace(listed.group(0), f'models="{" ".join(models)}"')
        else:
            models = re.findall(r"/v2/repository/models/(\w+)/load", block)
            script = block
        assert models and set(models) <= served, (page, models)
        script = script.replace(PAGE_ADDRESS, server.http_url)
        before = {model: _loads(server.log_file, model) for model in models}
        for model in models:
            _rewrite(repository / model)
        with _Traffic(server, models, body) as traffic:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=checkout, capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.split()
        assert lines.count("200") == len(models) and "HTTP" in lines, done.stdout
        assert traffic.failures == [], traffic.failures[:5]
        assert all(count > 0 for count in traffic.answered.values()), traffic.answered
        for model in models:
            assert _loads(server.log_file, model) > before[model], f"{model} was not loaded again"
    # Without the key the same call is refused, and nothing is loaded.
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(f"http://{server.http_url}/v2/repository/models/{next(iter(served))}/load")
    assert refused.value.code in (401, 403), refused.value.code
