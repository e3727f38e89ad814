"""Damaged files in a repository: each must be refused in one line while the other models serve.

Each runner copies a complete export (a model repository, and the row store its
hot/cold stage maps when that lies outside it), damages one file of the copy with
plain file operations, starts the bundle's local tritonserver on it
(:class:`server.LocalServer`, its default start options: every model of the
repository, ``--exit-on-error=false``) and measures what a user sees:

- ``seen``: the launcher's start-up line (:meth:`server.LocalServer.wait_ready`'s
  error), which must name the damaged file;
- ``requests``/``failed``: requests to every model that serves the schema, and
  those that failed among the models that should still serve;
- ``wrong``: answers that differ from the healthy answer (ONNX Runtime in this
  process for a model with an ONNX file; else what the undamaged copy served
  before the damage): must be 0, the damaged model's included.

``ok`` holds when the damaged model (and the ensembles over it) are refused, the
line names the file, every other model is READY and answers, and nothing wrong was
answered.

The faults (:data:`DAMAGES`):

- the hot/cold stage's row store (``rows.bin``) truncated, or with one bit flipped;
- a row store of another content under the stage's path (valid checksums, other
  values): refused only where the stage's config records the store's fingerprint
  (``row_store_fingerprint``);
- a plain ONNX model's ``model.onnx`` and a TorchScript model's ``model.pt``
  truncated to half;
- a ``config.pbtxt`` that does not parse.

A case whose file the repository lacks (no hot/cold model, no TorchScript model) is
skipped. The copies are made in a temporary folder and removed; the repository itself
is never written. Each case copies the repository and its store: meant for test-size
exports, not a 48 GB store.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from bundle.errors import BundleError, ConfigError, ServerError
from bundle.repository import (
    CONFIG_NAME,
    MODEL_FILE,
    ONNX_BACKEND,
    TORCH_PLATFORM,
    TORCHSCRIPT_FILE,
    read_config,
)
from bundle.schema import INPUTS
from clients.options import Protocol
from clients.reference import OnnxReference
from clients.triton import TritonClient
from clients.verify import sample_rows
from criteo.tsv import Batch
from export.stage import hot_cold_lookup as stage_format
from lab.faults import FaultResult
from server import LocalServer, ServerConfig, TritonInstallation

logger = logging.getLogger(__name__)

#: The backend Triton maps ``platform: "pytorch_libtorch"`` to.
TORCH_BACKEND = "pytorch"
ENSEMBLE_PLATFORM = "ensemble"
#: Served vs the healthy answer: one ONNX Runtime build on both sides.
TOLERANCE = 1e-5
#: Rows of each request, and requests per model and protocol.
ROWS = 16
ROUNDS = 2
#: Seconds the other models get to finish loading once the damaged one failed.
SETTLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Target:
    """A file of the copy to damage.

    Attributes:
        model: the model whose load must fail.
        path: the file.
    """

    model: str
    path: Path


@dataclass(frozen=True)
class Damage:
    """One fault: how to find its file in a repository copy and how to damage it.

    Attributes:
        fault: the fault, in words (``FaultResult.fault``).
        find: the file in a repository copy, or None where the repository has none.
        damage: damages the file in place.
    """

    fault: str
    find: Callable[[Path], Target | None]
    damage: Callable[[Path], None]


def _read_config(path: Path) -> mc.ModelConfig | None:
    try:
        return read_config(path)
    except ConfigError:
        return None


def _configs(repository: Path) -> list[tuple[str, mc.ModelConfig]]:
    """``(name, config)`` of every model whose config parses, by name."""
    found = []
    for path in sorted(repository.glob(f"*/{CONFIG_NAME}")):
        config = _read_config(path)
        if config is not None:
            found.append((path.parent.name, config))
    return found


def _versions(model_dir: Path) -> list[Path]:
    """The numbered version folders of a model, newest first."""
    return sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: -int(p.name)
    )


def _serves_schema(config: mc.ModelConfig) -> bool:
    return sorted(t.name for t in config.input) == sorted(spec.name for spec in INPUTS)


def _stage_store(repository: Path, name: str, config: mc.ModelConfig) -> Path | None:
    """The row store folder a hot/cold stage maps (its newest version's view), or None."""
    raw = config.parameters[stage_format.PARAM_ROW_STORE].string_value
    versions = _versions(repository / name)
    if not raw or not versions:
        return None
    return (versions[0] / raw).resolve()


def find_row_store(repository: Path) -> Target | None:
    """The ``rows.bin`` of the first hot/cold stage."""
    for name, config in _configs(repository):
        if stage_format.PARAM_ROW_STORE in config.parameters:
            store = _stage_store(repository, name, config)
            if store is not None and (store / stage_format.STORE_ROWS_FILE).is_file():
                return Target(name, store / stage_format.STORE_ROWS_FILE)
    return None


def _find_file(repository: Path, backends: tuple[str, ...], filename: str) -> Target | None:
    for name, config in _configs(repository):
        if (config.backend in backends or config.platform in backends) and _serves_schema(config):
            for version in _versions(repository / name):
                path = version / (config.default_model_filename or filename)
                if path.is_file():
                    return Target(name, path)
    return None


def find_onnx_model(repository: Path) -> Target | None:
    """The ``model.onnx`` of the first plain ONNX model (one that serves the schema itself)."""
    return _find_file(repository, (ONNX_BACKEND,), MODEL_FILE)


def find_torchscript_model(repository: Path) -> Target | None:
    """The ``model.pt`` of the first TorchScript model."""
    return _find_file(repository, (TORCH_BACKEND, TORCH_PLATFORM), TORCHSCRIPT_FILE)


def find_config(repository: Path) -> Target | None:
    """The ``config.pbtxt`` of the first plain ONNX model (else of the first model)."""
    target = find_onnx_model(repository)
    if target is not None:
        return Target(target.model, repository / target.model / CONFIG_NAME)
    configs = _configs(repository)
    return Target(configs[0][0], repository / configs[0][0] / CONFIG_NAME) if configs else None


def truncate(path: Path) -> None:
    """Cut ``path`` to half its size (an interrupted copy)."""
    os.truncate(path, path.stat().st_size // 2)


def flip_bit(path: Path) -> None:
    """Flip one bit in the middle of ``path`` (a bad sector, a bad copy)."""
    with path.open("r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x10]))


def break_config(path: Path) -> None:
    """Leave ``path`` a config.pbtxt that does not parse (an editor's half-saved file)."""
    text = path.read_text()
    path.write_text(text[: len(text) // 2] + "\n  dims: [ 1,\n")


def other_store(path: Path) -> None:
    """Turn the store of ``rows.bin`` into a valid store of other values (every value negated),
    with its checksums and fingerprint rewritten as an export of them would write them."""
    meta_path = path.parent / stage_format.STORE_META_FILE
    meta = json.loads(meta_path.read_text())
    itemsize = 2 if meta["spec"]["dtype"] == "float16" else 4
    values = np.memmap(path, dtype=f"<u{itemsize}", mode="r+")
    np.bitwise_xor(values, np.array(1 << (8 * itemsize - 1), dtype=values.dtype), out=values)
    values.flush()
    del values
    checksums = stage_format.ChunkChecksums()
    with path.open("rb") as handle:
        while piece := handle.read(16 << 20):
            checksums.update(piece)
    meta[stage_format.STORE_CHECKSUMS_KEY] = checksums.to_json()
    meta[stage_format.STORE_FINGERPRINT_KEY] = stage_format.store_fingerprint(
        meta["spec"], checksums.to_json()
    )
    meta["sha256"] = None
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


#: Every fault this module measures, in order.
DAMAGES: tuple[Damage, ...] = (
    Damage("row store truncated (rows.bin cut to half)", find_row_store, truncate),
    Damage("row store with one bit flipped (rows.bin)", find_row_store, flip_bit),
    Damage("row store of another content under the stage's path", find_row_store, other_store),
    Damage("model.onnx truncated to half", find_onnx_model, truncate),
    Damage("model.pt truncated to half", find_torchscript_model, truncate),
    Damage("config.pbtxt that does not parse", find_config, break_config),
)


def copy_repository(repository: Path, destination: Path) -> Path:
    """Copy ``repository`` to ``destination/model_repository``, and every stage's row store
    that lies outside it to ``destination/stores/<stage>`` (the copy's config then names the copy).

    Returns:
        The copy's root.
    """
    copy = destination / "model_repository"
    shutil.copytree(repository, copy, symlinks=False)
    for name, config in _configs(copy):
        if stage_format.PARAM_ROW_STORE not in config.parameters:
            continue
        store = _stage_store(repository, name, config)
        if store is None or store.is_relative_to(repository.resolve()):
            continue
        target = destination / "stores" / name
        shutil.copytree(store, target)
        config.parameters[stage_format.PARAM_ROW_STORE].string_value = str(target)
        (copy / name / CONFIG_NAME).write_text(text_format.MessageToString(config))
    return copy


def _dependents(repository: Path, model: str) -> set[str]:
    """``model`` and every ensemble that runs it, directly or through another ensemble."""
    steps = {
        name: {step.model_name for step in config.ensemble_scheduling.step}
        for name, config in _configs(repository)
        if config.platform == ENSEMBLE_PLATFORM
    }
    found = {model}
    while True:
        more = {name for name, uses in steps.items() if uses & found} - found
        if not more:
            return found
        found |= more


def _schema_models(repository: Path) -> list[str]:
    return [name for name, config in _configs(repository) if _serves_schema(config)]


@contextmanager
def _running(repository: Path, logs: Path, installation: TritonInstallation | None) -> Iterator[LocalServer]:
    """A local tritonserver on ``repository`` (not waited for), stopped on the way out."""
    config = ServerConfig.with_free_ports(
        repository, log_file=logs / f"tritonserver-{time.monotonic_ns()}.log"
    )
    server = LocalServer(config, installation=installation)
    server.start(wait=False)
    try:
        yield server
    finally:
        server.stop()


def _settle(server: LocalServer, timeout_s: float) -> dict[str, str]:
    """Each model's state once none is loading any more (``name -> READY | UNAVAILABLE | ...``).

    An ensemble over a model that failed is never loaded (state ""): settled too. Two
    polls in a row must agree, so a model about to start loading is waited for.
    """
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    previous: dict[str, str] | None = None
    while time.monotonic() < deadline:
        try:
            index = server.models()
        except ServerError:
            index = []
        states = {status.name: status.state for status in index}
        settled = any(states.values()) and not {"LOADING", "UNLOADING"} & set(states.values())
        if settled and states == previous:
            return states
        previous = states if settled else None
        time.sleep(0.25)
    logger.warning("models still loading after %.0f s: %s", timeout_s, states)
    return states


def _log_error(log_file: Path, model: str) -> str:
    """tritonserver's first error line about ``model`` in its log ("" when none)."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith("E") and f"'{model}'" in line), "")


def _startup_line(server: LocalServer) -> str:
    """The launcher's start-up line: why the server is not ready ("" when it is)."""
    try:
        server.wait_ready(timeout=1.0)
    except ServerError as exc:
        return str(exc)
    return ""


def healthy_answers(
    repository: Path, batch: Batch, logs: Path, installation: TritonInstallation | None = None
) -> dict[str, np.ndarray]:
    """What each schema model of an undamaged ``repository`` answers for ``batch`` (``B x 1``).

    A model with an ONNX file is run by ONNX Runtime in this process; the others (an
    ensemble, a TorchScript model) are asked of a server on the undamaged repository.

    Raises:
        ServerError: the undamaged repository does not start, or a model there fails.
    """
    answers: dict[str, np.ndarray] = {}
    served = []
    for name in _schema_models(repository):
        versions = _versions(repository / name)
        onnx_file = versions[0] / MODEL_FILE if versions else None
        if onnx_file is not None and onnx_file.is_file():
            answers[name] = OnnxReference(onnx_file).predict(batch)
        else:
            served.append(name)
    if served:
        with _running(repository, logs, installation) as server:
            server.wait_ready()
            with TritonClient(server.grpc_url, "grpc") as client:
                for name in served:
                    answers[name] = client.infer(name, batch.inputs())
    return answers


def _ask(
    server: LocalServer, models: list[str], batch: Batch, expected: dict[str, np.ndarray]
) -> dict[str, tuple[int, int, int]]:
    """``model -> (requests, failed, wrong)`` of ``ROUNDS`` requests per protocol to each model."""
    counts: dict[str, tuple[int, int, int]] = {}
    endpoints: tuple[tuple[Protocol, str], ...] = (("http", server.http_url), ("grpc", server.grpc_url))
    for protocol, url in endpoints:
        with TritonClient(url, protocol) as client:
            for name in models:
                requests, failed, wrong = counts.get(name, (0, 0, 0))
                for _ in range(ROUNDS):
                    requests += 1
                    try:
                        answer = client.infer(name, batch.inputs())
                    except BundleError as exc:
                        logger.debug("%s over %s: %s", name, protocol, exc)
                        failed += 1
                        continue
                    reference = expected[name]
                    if answer.shape != reference.shape or not np.allclose(
                        answer, reference, rtol=0.0, atol=TOLERANCE
                    ):
                        wrong += 1
                counts[name] = (requests, failed, wrong)
    return counts


def run_damage(
    repository: Path,
    damage: Damage,
    *,
    batch: Batch | None = None,
    expected: dict[str, np.ndarray] | None = None,
    installation: TritonInstallation | None = None,
    work_dir: Path | None = None,
) -> FaultResult | None:
    """Damage one file of a copy of ``repository``, start the server on it, and measure.

    Args:
        repository: a complete export (never written).
        damage: the fault.
        batch: the rows sent (default: :data:`ROWS` synthetic rows).
        expected: each schema model's healthy answer to ``batch`` (default:
            :func:`healthy_answers`, which may start a server of its own).
        installation: the tritonserver to run (default: the one found).
        work_dir: where the copy goes (default: a temporary folder, removed).

    Returns:
        The measurement, or None where the repository has no file of the kind.
    """
    repository = Path(repository)
    if damage.find(repository) is None:
        logger.info("skipped '%s': %s has no such file", damage.fault, repository)
        return None
    batch = batch if batch is not None else sample_rows(None, ROWS)
    with tempfile.TemporaryDirectory(prefix="damaged-", dir=work_dir) as folder:
        root = Path(folder)
        if expected is None:
            expected = healthy_answers(repository, batch, root, installation)
        copy = copy_repository(repository, root)
        target = damage.find(copy)
        if target is None:
            return None
        damage.damage(target.path)
        refused = _dependents(copy, target.model)
        models = _schema_models(copy)
        with _running(copy, root, installation) as server:
            states = _settle(server, SETTLE_TIMEOUT_S)
            seen = _startup_line(server)
            if not seen and states.get(target.model) != "READY":
                # tritonserver left the model out without a reason the launcher reads (its
                # index says state ""), and reported ready: only its log says why.
                logged = _log_error(server.log_file, target.model)
                seen = (
                    f"nothing: the server started without '{target.model}' (its log: {logged or 'nothing'})"
                )
            counts = _ask(server, [name for name in models if name in expected], batch, expected)
    serving = [name for name in models if name not in refused]
    requests = sum(counts[name][0] for name in counts)
    failed = sum(counts[name][1] for name in serving if name in counts)
    wrong = sum(counts[name][2] for name in counts)
    not_refused = sorted(name for name in refused if states.get(name) == "READY")
    not_serving = sorted(name for name in serving if states.get(name) != "READY")
    # The line is checked against the file's path in the copy (what tritonserver saw).
    names_file = not seen.startswith("nothing") and str(target.path) in seen
    ok = (
        not not_refused and not not_serving and names_file and failed == 0 and wrong == 0 and "\n" not in seen
    )
    if not ok:
        logger.warning(
            "'%s': loaded though damaged %s, not serving %s, line names the file: %s, failed %d, wrong %d",
            damage.fault,
            not_refused,
            not_serving,
            names_file,
            failed,
            wrong,
        )
    return FaultResult(
        fault=f"{damage.fault} ({target.model})",
        seen=seen.replace(str(root), "COPY") or "nothing: the server started with every model READY",
        requests=requests,
        failed=failed,
        wrong=wrong,
        recovery_s=None,
        ok=ok,
    )


def damaged_files(
    repository: Path, installation: TritonInstallation | None = None, work_dir: Path | None = None
) -> list[FaultResult]:
    """Every fault of :data:`DAMAGES` that ``repository`` has a file for, one :class:`FaultResult` each.

    Raises:
        ServerError: the undamaged repository does not serve (nothing to compare with).
    """
    batch = sample_rows(None, ROWS)
    results = []
    with tempfile.TemporaryDirectory(prefix="damaged-healthy-", dir=work_dir) as folder:
        expected = healthy_answers(Path(repository), batch, Path(folder), installation)
    for damage in DAMAGES:
        result = run_damage(
            repository, damage, batch=batch, expected=expected, installation=installation, work_dir=work_dir
        )
        if result is not None:
            results.append(result)
    return results
