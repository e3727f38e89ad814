"""tritonserver's process tree: its python stubs, their memory and shared-memory regions.

Each model instance of the python backend runs in a ``triton_python_backend_stub``
process that talks to tritonserver through a POSIX shared-memory region
(``/dev/shm/triton_<backend>_backend_shm_region_<uuid>``, about 1 MB and
growing). tritonserver removes them when it stops; when it is killed with
SIGKILL they stay in ``/dev/shm`` (RAM) for good. The region's name is the
stub's second argument, so the launcher reads the names before it kills and
removes exactly those regions afterwards, never another server's.

A stub's argv also names what it serves: its first argument is the model file
(``<repository>/<model>/<version>/model.onnx`` or ``model.py``), its eighth the
instance (``<model>_<group>_<index>``). tritonserver 2.51 never reaps a stub that
died on its own (killed, out of memory): it stays a zombie child while the model
still reports READY. :func:`stub_processes` reports both, which is what
:mod:`server.dead_models` watches.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
_STUB_NAME = "triton_python_backend_stub"
_REGION_NAME = re.compile(r"triton_[A-Za-z0-9_]+_shm_region_[0-9a-f-]+")


def stub_regions(pid: int) -> list[str]:
    """Names of the shared-memory regions of tritonserver ``pid``'s python stubs.

    The stubs are looked for among its descendants and in its process group (the launcher
    starts it as the leader of a session of its own), so the stubs of a tritonserver that
    died, orphans by then, are found too.

    Args:
        pid: tritonserver's process id.

    Returns:
        Region names (files in ``/dev/shm``); empty when no stub of it is left.
    """
    try:
        candidates = {child.pid: child for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        candidates = {}
    for process in psutil.process_iter():
        with contextlib.suppress(OSError):
            if process.pid != pid and os.getpgid(process.pid) == pid:
                candidates.setdefault(process.pid, process)
    names = []
    for child in candidates.values():
        with contextlib.suppress(psutil.Error):
            argv = child.cmdline()
            if len(argv) > 2 and Path(argv[0]).name == _STUB_NAME and _REGION_NAME.fullmatch(argv[2]):
                names.append(argv[2])
    return names


@dataclass(frozen=True)
class StubProcess:
    """One python-backend stub of a tritonserver, as its argv describes it.

    Args:
        pid: the stub's process id.
        model: the model it serves (the model file's grandparent folder).
        version: the model version (the model file's folder).
        instance: the model instance's name, e.g. ``dlrm_onnx_0_0``; the model's own name for
            the stub that completes its config while it loads (:attr:`completes_config`).
        region: its shared-memory region's name (in ``/dev/shm``).
    """

    pid: int
    model: str
    version: str
    instance: str
    region: str

    @property
    def completes_config(self) -> bool:
        """The stub the python backend starts while the model loads, to complete its config
        (``auto_complete_config``), which exits once done: it serves no instance. The backend
        names it after the model, where an instance's stub carries the instance's name, which
        Triton always suffixes with its index (``<group>_<index>``)."""
        return self.instance == self.model


def _stub_from_argv(pid: int, argv: list[str]) -> StubProcess | None:
    # argv: stub, model file, region, shm sizes (2), parent pid, lib dir, ipc handle, instance, ...
    if len(argv) < 9 or Path(argv[0]).name != _STUB_NAME or not _REGION_NAME.fullmatch(argv[2]):
        return None
    model_file = Path(argv[1])
    return StubProcess(pid, model_file.parent.parent.name, model_file.parent.name, argv[8], argv[2])


def exit_status(pid: int) -> int | None:
    """A zombie's exit status as ``waitpid`` would report it (``/proc/<pid>/stat``'s last
    field, Linux 3.5 and later); ``None`` when it cannot be read (reaped meanwhile)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[-1]) if len(fields) >= 50 else None


def killed_by_signal(status: int | None) -> bool:
    """Whether an exit status says the process was killed by a signal (``WIFSIGNALED``)."""
    return status is not None and os.WIFSIGNALED(status)


def stub_processes(pid: int) -> tuple[list[StubProcess], dict[int, int | None]]:
    """tritonserver ``pid``'s python stubs: the running ones, and its dead children.

    Args:
        pid: tritonserver's process id.

    Returns:
        The running stubs (argv read), and its children that are zombies (processes
        that exited and that tritonserver has not reaped: their argv can no longer be
        read, so a caller matches them with stubs it saw running), by pid, with their
        :func:`exit_status`. Both empty when tritonserver is gone.
    """
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return [], {}
    running: list[StubProcess] = []
    zombies: dict[int, int | None] = {}
    for child in children:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                zombies[child.pid] = exit_status(child.pid)
                continue
            stub = _stub_from_argv(child.pid, child.cmdline())
        except psutil.ZombieProcess:
            zombies[child.pid] = exit_status(child.pid)
            continue
        except psutil.Error:
            continue  # exited while being read: the next look sees how
        if stub is not None:
            running.append(stub)
    return running, zombies


def unlink_regions(names: Iterable[str], directory: Path = SHM_DIR) -> list[str]:
    """Remove the regions ``names`` from ``directory``; the names removed.

    Only names of the python backend's form are touched; missing ones are skipped.
    """
    removed = []
    for name in names:
        if not _REGION_NAME.fullmatch(name):
            logger.warning("not removing %r: not a python backend region name", name)
            continue
        try:
            (directory / name).unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not remove shared-memory region %s: %s", name, exc)
            continue
        removed.append(name)
    if removed:
        logger.info("removed %d shared-memory region(s) of killed python stubs", len(removed))
    return removed


def _tree(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and all its descendants, itself first; empty when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds so far (user + system, every thread) of tritonserver ``pid`` and of each of
    its descendants (the stubs), by process id, tritonserver first; empty when it is gone.
    Processes that exit while being read are left out."""
    seconds = {}
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            seconds[process.pid] = float(times.user + times.system)
    return seconds


def tree_read_bytes(pid: int) -> int:
    """Bytes that tritonserver ``pid`` and its descendants have had read from storage so far
    (the kernel's ``read_bytes``, every thread's: reads through the page cache that missed it,
    and O_DIRECT reads; never a copy from a cached page). 0 when it is gone; processes that exit
    while being read are left out."""
    total = 0
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += int(process.io_counters().read_bytes)
    return total


def tree_rss(pid: int, anonymous: bool = False) -> dict[int, int]:
    """Resident memory of tritonserver ``pid`` and of each of its descendants (the stubs).

    Args:
        pid: tritonserver's process id.
        anonymous: count only anonymous pages (RSS less the resident pages of mapped files
            and shared memory, psutil's ``shared``): what the processes themselves hold, not
            the page cache of a memory-mapped row store, nor the loaded libraries.

    Returns:
        Bytes by process id, tritonserver first; empty when it is gone.
        Processes that exit while being read are left out.
    """
    rss = {}
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):
            info = process.memory_info()
            shared = int(getattr(info, "shared", 0)) if anonymous else 0
            rss[process.pid] = int(info.rss) - shared
    return rss
