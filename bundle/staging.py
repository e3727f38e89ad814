"""All-or-nothing writes into a model repository: stage beside it, decide, move in, recover.

A server may be reading the repository while it is written (poll or explicit model
control), and the writing process may die at any moment (SIGKILL, out of memory, a full
disk). So no write touches a served folder until everything it writes is complete and
checked:

1. :class:`RepositoryWrite` opens a *run*: ``<parent>/.<repository>.staging/<run id>/``,
   beside the repository and on its filesystem, so that every move in is one
   ``rename(2)``. The run holds an ``flock`` on its ``lock`` file for as long as its
   process lives (the kernel drops it when the process dies, SIGKILL included).
   The staging folder is beside the repository, not inside it, because tritonserver 2.51
   loads every folder of a repository, hidden ones too (a ``.staging`` folder inside
   it is reported as a model that failed to load).
2. The caller writes complete model folders (or version folders, or files) under
   :attr:`RepositoryWrite.staged`, checks them there, and lists the moves
   (:meth:`~RepositoryWrite.put`, :meth:`~RepositoryWrite.remove`).
3. :meth:`~RepositoryWrite.decide` writes the run's journal (``commit.json``, written to a
   temporary file, fsync'd, renamed into place): from then on the write is decided, and
   :meth:`~RepositoryWrite.apply` makes the moves in order. A folder that replaces a
   folder moves the old one into the run first (a folder cannot replace a non-empty folder
   in one rename); a file replaces a file in one ``os.replace``.
4. :meth:`~RepositoryWrite.finish` removes the journal, then the run (and the folders it
   replaced).

:func:`recover` runs at the start of every write and of the local server: a decided run
whose process is gone is finished (rolled forward: its staged files are complete and were
checked before the decision), and an undecided one is removed (the repository was never
touched). Each move is idempotent on replay: it is done when its source is gone.

So an interrupted write leaves each folder of the repository in its complete earlier or
its complete new state. Between the two renames of a replaced folder the folder is absent
for a few microseconds; a server polling the repository at that instant sees the model
gone (and loads it again at its next poll), never a half-written one.

A write that runs out of space (``ENOSPC``, ``EDQUOT``, or ``EFBIG`` under a file-size
limit) raises :class:`~bundle.errors.DiskFullError` and leaves the repository as it was.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from bundle.errors import ConfigError, DiskFullError

log = logging.getLogger(__name__)

JOURNAL = "commit.json"
LOCK = "lock"
STAGED = "new"
REPLACED = "old"
#: errno values that mean the disk (or the process's file-size limit) has no room.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def staging_root(repository: Path) -> Path:
    """Where the runs of writes into ``repository`` stage: ``<parent>/.<name>.staging``."""
    repository = Path(repository).absolute()
    return repository.parent / f".{repository.name}.staging"


def no_space(exc: BaseException | None) -> OSError | None:
    """The OSError that says the disk is full, in ``exc`` or its chain of causes (else None)."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE:
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def no_space_line(error: OSError) -> str:
    """``no space left on the device writing <file> (<strerror>)``: what a full disk says, in one line."""
    where = f" writing {error.filename}" if error.filename else ""
    return f"no space left on the device{where} ({os.strerror(error.errno or errno.ENOSPC)})"


def disk_full(repository: Path, error: OSError) -> DiskFullError:
    """The one-line error of a write into ``repository`` that ran out of space."""
    return DiskFullError(
        f"{no_space_line(error)}: the write into {repository} stopped and the repository is as it was"
    )


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it and one ``os.replace``: a reader
    sees the old file or the new one, never a part. The temporary file's name starts with a dot,
    so tritonserver (which reads ``config.pbtxt`` and numbered folders) never reads it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    try:
        with temporary.open("wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


@dataclass(frozen=True)
class Move:
    """One rename of a decided write: ``source`` (staged, or a served folder to remove) to ``target``."""

    source: str
    target: str

    def done(self) -> bool:
        return not os.path.lexists(self.source)


def _hold(path: Path) -> IO[bytes]:
    """An exclusive ``flock`` on ``path``, waited for; released when the handle closes or the process dies."""
    handle = path.open("a+b")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _try_hold(path: Path) -> IO[bytes] | None:
    """:func:`_hold` without waiting: None when another process holds it."""
    handle = path.open("a+b")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


class RepositoryWrite:
    """One all-or-nothing write into a model repository (see the module docstring).

    Example::

        with RepositoryWrite(repository, "export dlrm") as write:
            build(write.staged / "dlrm_onnx")              # complete and checked there
            write.put(write.staged / "dlrm_onnx", repository / "dlrm_onnx")
            write.remove(repository / "dlrm_torch")         # a stale model of the family
            write.commit()

    Leaving the block without :meth:`commit` (an exception, or no call) removes the run and
    leaves the repository as it was; an exception after :meth:`decide` first undoes the
    moves already made, in reverse.

    Args:
        repository: the model repository (created at the first move when absent).
        what: what writes, for the journal and the log (``export dlrm``).
    """

    def __init__(self, repository: Path, what: str) -> None:
        self.repository = Path(repository).absolute()
        self.what = what
        self.run_id = (
            time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self._moves: list[Move] = []
        self._applied: list[tuple[Move, Move | None]] = []
        self._decided = False
        self._finished = False
        self._run_lock: IO[bytes] | None = None
        self._commit_lock: IO[bytes] | None = None
        self.run = staging_root(self.repository) / self.run_id
        self.staged = self.run / STAGED

    def __enter__(self) -> RepositoryWrite:
        recover(self.repository)
        try:
            self.run.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if no_space(exc) is not None:
                raise disk_full(self.repository, exc) from None
            raise ConfigError(
                f"cannot create the staging folder {self.run.parent} beside {self.repository} "
                f"({exc.strerror}): a write into a repository needs its parent folder to be writable"
            ) from None
        commit_lock = _hold(self.run.parent / LOCK)  # so that recover() never sees a run without its lock
        try:
            self.run.mkdir()
            self._run_lock = _hold(self.run / LOCK)
        finally:
            commit_lock.close()
        self.staged.mkdir()
        self._check_filesystem()
        log.debug("%s: staging in %s", self.what, self.run)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            if not self._finished:
                if self._decided:
                    self._undo()
                self._discard()
        finally:
            self._release()
        full = no_space(exc)
        if full is not None and not isinstance(exc, DiskFullError):
            raise disk_full(self.repository, full) from exc

    def _check_filesystem(self) -> None:
        target = self.repository if self.repository.exists() else self.repository.parent
        if os.stat(target).st_dev != os.stat(self.run).st_dev:
            self._discard()
            self._release()
            raise ConfigError(
                f"{self.repository} is on another filesystem than its staging folder {self.run.parent} "
                "(a mount point?): export into a folder inside the mount, or beside it, so that a "
                "finished model can move in with one rename"
            )

    # ------------------------------------------------------------ planning
    def put(self, source: Path, target: Path) -> None:
        """Plan: the staged ``source`` (file or folder) becomes ``target`` in the repository."""
        self._plan(Move(str(Path(source).absolute()), str(Path(target).absolute())))

    def remove(self, target: Path) -> None:
        """Plan: ``target`` leaves the repository (moved into the run, deleted with it)."""
        target = Path(target).absolute()
        self._plan(Move(str(target), str(self._replaced_path(target))))

    def _plan(self, move: Move) -> None:
        if self._decided:
            raise RuntimeError("a decided write takes no more moves")
        self._moves.append(move)

    def _replaced_path(self, target: Path) -> Path:
        relative = target.relative_to(self.repository)
        return self.run / REPLACED / relative

    @property
    def moves(self) -> list[Move]:
        """The moves planned so far."""
        return list(self._moves)

    # ------------------------------------------------------------ committing
    def decide(self) -> None:
        """Write the journal: from now on, an interrupted write is finished by :func:`recover`."""
        self._commit_lock = _hold(staging_root(self.repository) / LOCK)
        journal = {
            "run": self.run_id,
            "what": self.what,
            "repository": str(self.repository),
            "decided": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "moves": [[m.source, m.target] for m in self._moves],
        }
        write_file_atomically(self.run / JOURNAL, json.dumps(journal, indent=1) + "\n")
        self._decided = True
        log.info("%s: moving %d staged entries into %s", self.what, len(self._moves), self.repository)

    def apply(self, count: int | None = None) -> None:
        """Make the next ``count`` planned moves (all the rest by default)."""
        if not self._decided:
            raise RuntimeError("decide() before apply()")
        pending = self._moves[len(self._applied) :]
        for move in pending if count is None else pending[:count]:
            self._applied.append((move, _move(move, self.run)))

    def finish(self) -> None:
        """Every move made: remove what the run replaced, then its journal, then the run."""
        self.apply()
        # The journal goes after the folders it names: a process that dies in between leaves a
        # decided run whose moves are all done, which recover() finishes without a move.
        for folder in (self.run / REPLACED, self.staged):
            shutil.rmtree(folder, ignore_errors=True)
        (self.run / JOURNAL).unlink()
        self._finished = True
        self._discard()
        self._release()

    def commit(self) -> None:
        """:meth:`decide`, :meth:`apply` and :meth:`finish` in one call."""
        self.decide()
        self.finish()

    # ------------------------------------------------------------ undoing
    def _undo(self) -> None:
        """Reverse the moves made so far (an exception in this process after the decision)."""
        for move, displaced in reversed(self._applied):
            if displaced is not None and not Path(displaced.target).is_dir():
                os.replace(displaced.target, move.target)  # a file: the old one back in one rename
                continue
            if os.path.lexists(move.target) and not os.path.lexists(move.source):
                os.rename(move.target, move.source)
            if displaced is not None and os.path.lexists(displaced.target):
                os.rename(displaced.target, displaced.source)
        (self.run / JOURNAL).unlink(missing_ok=True)
        self._applied.clear()

    def _discard(self) -> None:
        shutil.rmtree(self.run, ignore_errors=True)
        _remove_empty(staging_root(self.repository))

    def _release(self) -> None:
        for handle in (self._run_lock, self._commit_lock):
            if handle is not None:
                handle.close()
        self._run_lock = self._commit_lock = None


def _move(move: Move, run: Path) -> Move | None:
    """Make ``move`` (done already: nothing); returns the move of the folder it displaced, if any."""
    if move.done():
        return None
    source, target = Path(move.source), Path(move.target)
    displaced = None
    if os.path.lexists(target):
        aside = run / REPLACED / f"{target.name}.{secrets.token_hex(3)}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        displaced = Move(str(target), str(aside))
        if target.is_dir() and not target.is_symlink():
            # A folder cannot replace a folder in one rename: the old one moves into the run first.
            os.rename(target, aside)
        else:
            os.link(
                target, aside, follow_symlinks=False
            )  # a file is replaced in one rename; kept for an undo
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, target)
    fsync_dir(target.parent)
    return displaced


def _remove_empty(folder: Path) -> None:
    """Remove the staging root when no run is left in it (its lock file aside)."""
    try:
        entries = [entry.name for entry in folder.iterdir()]
    except FileNotFoundError:
        return
    if set(entries) <= {LOCK}:
        shutil.rmtree(folder, ignore_errors=True)


def recover(repository: Path) -> list[str]:
    """Finish the decided writes into ``repository`` whose process died; remove the undecided ones.

    Runs whose process is alive (their lock is held) are left alone.

    Returns:
        One line per run handled, for the caller to log.
    """
    root = staging_root(repository)
    if not root.is_dir():
        return []
    done: list[str] = []
    commit_lock = _hold(root / LOCK)
    try:
        for run in sorted(p for p in root.iterdir() if p.is_dir()):
            run_lock = _try_hold(run / LOCK) if (run / LOCK).exists() else None
            if run_lock is None and (run / LOCK).exists():
                continue  # its process is still writing
            try:
                done.append(_recover_run(run))
            finally:
                if run_lock is not None:
                    run_lock.close()
    finally:
        commit_lock.close()
    _remove_empty(root)
    for line in done:
        log.warning("%s", line)
    return done


def _recover_run(run: Path) -> str:
    journal_path = run / JOURNAL
    if not journal_path.is_file():
        shutil.rmtree(run, ignore_errors=True)
        return f"{run.name}: an interrupted write that had not moved anything in was removed"
    journal: dict[str, Any] = json.loads(journal_path.read_text())
    moves = [Move(source, target) for source, target in journal["moves"]]
    pending = [move for move in moves if not move.done()]
    for move in pending:
        _move(move, run)
    journal_path.unlink()
    shutil.rmtree(run, ignore_errors=True)
    return (
        f"{journal['what']} (run {journal['run']}) was interrupted after it had decided: "
        f"finished its {len(pending)} remaining of {len(moves)} moves into {journal['repository']}"
    )
