"""The repository as the local tritonserver 2.51 can load it, where it holds AOTInductor packages.

Seen with the local server: tritonserver 2.51 (the nvidia-pytriton wheel, Triton 24.10) refuses a
model whose config says ``platform: "torch_aoti"`` with ``backend: "pytorch"`` ("unexpected 'platform' and
'backend' pair, got:torch_aoti, pytorch"): the platform came with 26.03. The same config without
its ``platform`` line loads, on the backend it names: locally the bundle's Python-based
``pytorch`` backend (``backends/pytorch/model.py``), which recognises the package by its
``.pt2`` file. The repository itself must stay what the NGC image serves, so the launcher gives
tritonserver a view of it instead: a folder of symbolic links to every entry of the repository,
except that the folder of a ``torch_aoti`` model holds its config without the platform (nothing
else changed) and links to the folder's other entries (version folders, report).

The view exists only while the repository holds such a model; any other repository is served
as it is. :func:`sync_view` brings a view up to date with its repository: the launcher calls it
at start, before each load through :meth:`server.launcher.LocalServer.load_model`, and, where
tritonserver loads models after its start (model control ``poll`` or ``explicit``), every
:data:`KEEP_INTERVAL_S` seconds (:class:`ViewKeeper`).
Between two syncs tritonserver sees every change inside a linked model folder (new versions,
configs), but not a model folder created since, nor a changed ``torch_aoti`` config. Each
change a sync makes is one rename, so a polling server never reads a part of one.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import threading
from pathlib import Path

log = logging.getLogger(__name__)

#: The platform the local tritonserver refuses (``bundle.repository.AOTI_PLATFORM``).
AOTI_PLATFORM = "torch_aoti"
#: A model folder's config file.
CONFIG_NAME = "config.pbtxt"
#: Seconds between two syncs of a view that a tritonserver loading models after its start serves:
#: well inside its poll interval (15 s unless told), so that a change reaches the view before its
#: next look.
KEEP_INTERVAL_S = 2.0

_SYNCING = threading.Lock()


def local_config(text: str) -> str | None:
    """The config ``text`` as the local tritonserver loads it: without ``platform: "torch_aoti"``.

    Returns:
        The config without its platform; None when ``text`` is no ``torch_aoti`` config (or does
        not parse, which tritonserver then reports with the model's name).
    """
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError:
        return None
    if config.platform != AOTI_PLATFORM:
        return None
    config.ClearField("platform")
    return text_format.MessageToString(config)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _temporary(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")


def _link(source: Path, target: Path) -> None:
    """Make ``target`` a symbolic link to ``source`` (an absolute path, so that a folder the
    repository's writers replace by a rename is followed), unless it is one already; a link is
    replaced by a rename."""
    if target.is_symlink() and Path(target.readlink()) == source:
        return
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    temporary = _temporary(target)
    temporary.symlink_to(source)
    os.replace(temporary, target)


def _mirror(source: Path, target: Path, config: str) -> None:
    """Make ``target`` a folder of ``config`` as its config and a link to each other entry of ``source``."""
    if target.is_symlink() or target.is_file():
        target.unlink()
    target.mkdir(exist_ok=True)
    entries = {entry.name for entry in source.iterdir() if entry.name != CONFIG_NAME}
    for stale in target.iterdir():
        if stale.name not in entries and stale.name != CONFIG_NAME:
            _remove(stale)
    for name in sorted(entries):
        _link(source / name, target / name)
    written = target / CONFIG_NAME
    # Rewritten only when it changed (in poll mode a new file would reload the model), in one rename.
    if not written.is_file() or written.read_text() != config:
        temporary = _temporary(written)
        temporary.write_text(config)
        os.replace(temporary, written)


def sync_view(repository: Path, view: Path) -> list[str]:
    """Bring ``view`` up to date as the view of ``repository`` (see the module's docstring).

    Args:
        repository: the model repository.
        view: the view's folder (created when missing).

    Returns:
        The ``torch_aoti`` models whose config the view changes; when empty, the repository
        needs no view.
    """
    with _SYNCING:  # the launcher's loads and the keeper's thread
        return _sync(repository.resolve(), view)


def _sync(source: Path, view: Path) -> list[str]:
    view.mkdir(parents=True, exist_ok=True)
    entries = {entry.name: entry for entry in source.iterdir()}
    for stale in view.iterdir():
        if stale.name not in entries:
            _remove(stale)
    changed = []
    for name, entry in sorted(entries.items()):
        try:
            text = (entry / CONFIG_NAME).read_text() if entry.is_dir() else None
        except OSError:
            text = None  # tritonserver reports a config it cannot read, with the model's name
        config = None if text is None else local_config(text)
        if config is None:
            _link(entry, view / name)
        else:
            _mirror(entry, view / name, config)
            changed.append(name)
    return changed


class ViewKeeper:
    """Syncs a view with its repository every ``interval_s`` seconds, in a daemon thread, while a
    tritonserver that loads models after its start serves it; a sync that fails is logged and
    tried again at the next.

    Args:
        repository: the model repository.
        view: its view (:func:`sync_view`).
        interval_s: seconds between two syncs.
    """

    def __init__(self, repository: Path, view: Path, interval_s: float = KEEP_INTERVAL_S) -> None:
        self._repository = repository
        self._view = view
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="repository-view", daemon=True)

    def start(self) -> ViewKeeper:
        """Start syncing; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop syncing and wait for a sync under way to finish."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                sync_view(self._repository, self._view)
            except OSError as exc:  # a writer's rename under way: the next sync sees its result
                log.warning("could not sync the repository view %s: %s", self._view, exc)
