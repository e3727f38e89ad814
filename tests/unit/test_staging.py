"""All-or-nothing writes into a repository (bundle.staging): commit, undo, recovery after SIGKILL at
every rename of a commit, a full disk, and a live run left alone by recovery."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bundle.errors import DiskFullError
from bundle.staging import RepositoryWrite, recover, staging_root, write_file_atomically


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its text (hidden temporary files would show too)."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def _model(root: Path, name: str, text: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}" # {text}\n')
    (root / name / "1" / "model.onnx").write_text(f"{name} weights {text}")


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "model_repository"
    for name in ("a", "b", "other"):
        _model(repo, name, "old")
    return repo


def _stage_new(write: RepositoryWrite, repo: Path) -> None:
    """a replaced, b removed, c added; other untouched."""
    _model(write.staged, "a", "new")
    _model(write.staged, "c", "new")
    write.put(write.staged / "a", repo / "a")
    write.put(write.staged / "c", repo / "c")
    write.remove(repo / "b")


def _new_state(repo: Path, before: dict[str, str]) -> dict[str, str]:
    after = {k: v for k, v in before.items() if not k.startswith(("a/", "b/"))}
    after.update({"a/config.pbtxt": 'name: "a" # new\n', "a/1/model.onnx": "a weights new"})
    after.update({"c/config.pbtxt": 'name: "c" # new\n', "c/1/model.onnx": "c weights new"})
    return after


def test_a_commit_replaces_adds_and_removes_and_leaves_no_staging(repository: Path) -> None:
    before = _tree(repository)
    with RepositoryWrite(repository, "test") as write:
        _stage_new(write, repository)
        write.commit()
    assert _tree(repository) == _new_state(repository, before)
    assert not staging_root(repository).exists()


def test_an_exception_before_the_decision_leaves_the_repository_as_it_was(repository: Path) -> None:
    before = _tree(repository)
    with pytest.raises(RuntimeError, match="check failed"), RepositoryWrite(repository, "test") as write:
        _stage_new(write, repository)
        raise RuntimeError("check failed")
    assert _tree(repository) == before
    assert not staging_root(repository).exists()


def test_an_exception_after_some_moves_undoes_them_files_included(repository: Path) -> None:
    before = _tree(repository)
    with pytest.raises(RuntimeError, match="server refused"), RepositoryWrite(repository, "test") as write:
        _stage_new(write, repository)
        staged = write_file_atomically(write.staged / "other" / "config.pbtxt", "switched\n")
        write.put(staged, repository / "other" / "config.pbtxt")  # a file replacing a file
        write.decide()
        write.apply(2)
        assert (repository / "c").is_dir()
        write.apply()
        assert (repository / "other" / "config.pbtxt").read_text() == "switched\n"
        raise RuntimeError("server refused the load")
    assert _tree(repository) == before
    assert not staging_root(repository).exists()


# The commit of a child process, killed with SIGKILL at its k-th rename (os.rename and os.replace).
_KILLED_COMMIT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_staging import _stage_new
    from bundle.staging import RepositoryWrite

    repo, kill_at = Path(sys.argv[1]), int(sys.argv[2])
    calls = [0]
    def killing(real):
        def call(*args, **kwargs):
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return call
    with RepositoryWrite(repo, "test") as write:
        _stage_new(write, repo)
        write.decide()  # the journal's own rename is os.replace call 1
        os.rename, os.replace = killing(os.rename), killing(os.replace)
        calls[0] = 1
        write.finish()
    """
)


def _run_killed(repo: Path, kill_at: int) -> int:
    script = _KILLED_COMMIT.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", script, str(repo), str(kill_at)], env=env, check=False)
    return done.returncode


@pytest.mark.parametrize("kill_at", [2, 3, 4, 5])
def test_a_commit_killed_at_any_rename_is_finished_by_recovery(repository: Path, kill_at: int) -> None:
    before = _tree(repository)
    assert _run_killed(repository, kill_at) == -signal.SIGKILL
    assert staging_root(repository).exists()
    lines = recover(repository)
    assert len(lines) == 1 and "finished its" in lines[0], lines
    assert _tree(repository) == _new_state(repository, before)
    assert not staging_root(repository).exists()


def test_an_undecided_run_of_a_dead_process_is_removed_and_a_live_one_kept(repository: Path) -> None:
    before = _tree(repository)
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from pathlib import Path
        from bundle.staging import RepositoryWrite
        write = RepositoryWrite(Path(sys.argv[1]), "test").__enter__()
        (write.staged / "half").mkdir()
        (write.staged / "half" / "model.onnx").write_text("half")
        print(write.run, flush=True)
        if sys.argv[2] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    live = subprocess.Popen(
        [sys.executable, "-c", script, str(repository), "live"], env=env, stdout=subprocess.PIPE
    )
    try:
        assert live.stdout is not None
        live_run = Path(live.stdout.readline().decode().strip())
        dead = subprocess.run(
            [sys.executable, "-c", script, str(repository), "die"], env=env, capture_output=True
        )
        dead_run = Path(dead.stdout.decode().strip())
        assert dead_run.is_dir() and live_run.is_dir()
        lines = recover(repository)
        assert len(lines) == 1 and "had not moved anything" in lines[0]
        assert not dead_run.exists()
        assert live_run.is_dir(), "a run whose process is alive must be left alone"
    finally:
        live.kill()
        live.wait()
    recover(repository)
    assert _tree(repository) == before
    assert not staging_root(repository).exists()


def test_a_write_that_runs_out_of_space_says_so_and_changes_nothing(repository: Path) -> None:
    before = _tree(repository)
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from bundle.errors import DiskFullError
        from bundle.staging import RepositoryWrite
        repo = Path(sys.argv[1])
        try:
            with RepositoryWrite(repo, "test") as write:
                (write.staged / "a" / "1").mkdir(parents=True)
                (write.staged / "a" / "1" / "model.onnx").write_bytes(bytes(1 << 20))
                write.put(write.staged / "a", repo / "a")
                write.commit()
        except DiskFullError as exc:
            print(exc)
            sys.exit(3)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    done = subprocess.run(
        [sys.executable, "-c", script, str(repository)], env=env, capture_output=True, text=True,
        preexec_fn=limit, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("no space left on the device"), done.stdout
    assert "the repository is as it was" in done.stdout
    assert _tree(repository) == before
    assert not staging_root(repository).exists()
    assert issubclass(DiskFullError, Exception)


def test_write_file_atomically_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = write_file_atomically(tmp_path / "m" / "config.pbtxt", "one\n")
    write_file_atomically(path, b"two\n")
    assert path.read_text() == "two\n"
    assert [p.name for p in path.parent.iterdir()] == ["config.pbtxt"]


def test_the_journal_lists_the_moves_before_any_is_made(repository: Path) -> None:
    with RepositoryWrite(repository, "test") as write:
        _stage_new(write, repository)
        write.decide()
        journal = json.loads((write.run / "commit.json").read_text())
        assert journal["what"] == "test" and len(journal["moves"]) == 3
        assert (repository / "b").is_dir(), "deciding moves nothing"
        write.finish()
    assert not (repository / "b").exists()
