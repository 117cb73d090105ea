"""Snakemake's locks, kept per data set when several data sets run from one working directory.

Snakemake (9.x, ``persistence/file.py``) keeps every coordinator's locks in one folder,
``.snakemake/locks/<n>.input.lock`` and ``<n>.output.lock``, each listing the files of that run. Two
things there remove every lock, another live run's included: ``snakemake --unlock`` (it deletes the
folder), and a run that ends (it deletes its own lock files, then the folder with whatever else is
in it). A second data set's live coordinator then runs unlocked, and a third run of its outputs
would not be stopped.

- ``keep_other_runs_locks()`` (installed by the Snakefile in the coordinator): a run that ends
  deletes its own lock files only; ``snakemake --unlock`` still clears the folder.
- ``stale_locks(workdir, results_dir)`` / ``remove_stale_locks``: the lock files of one data set
  (a file they list lies under its results folder), what ``plexgpu rerun`` removes after a killed
  coordinator instead of ``snakemake --unlock``. An input lock that lists raw folders only is left:
  it blocks nothing (raw data are never an output).
"""

from __future__ import annotations

import os
from pathlib import Path


def lock_folder(workdir: Path) -> Path:
    return Path(workdir) / ".snakemake" / "locks"


def keep_other_runs_locks() -> bool:
    """Make a run that ends (with or without work done) delete its own lock files only, not the folder
    other runs' locks are in; ``snakemake --unlock`` (``cleanup_locks``) still clears the folder. False
    where Snakemake's file persistence is not the one patched (nothing changed)."""
    try:
        from snakemake.persistence.file import FilePersistence
    except ImportError:
        return False
    delete_all, cleanup = FilePersistence._delete_locks, FilePersistence.cleanup_locks
    if getattr(delete_all, "plexgpu", False):
        return True

    def _delete_locks(self) -> None:
        if getattr(self, "_plexgpu_unlock_all", False):
            return delete_all(self)
        for lockfile in self._lockfile.values():
            try:
                os.remove(lockfile)
            except FileNotFoundError:
                pass
        self._lockfile.clear()

    def cleanup_locks(self) -> None:              # snakemake --unlock: the user asked for every lock gone
        self._plexgpu_unlock_all = True
        cleanup(self)

    _delete_locks.plexgpu = True
    FilePersistence._delete_locks, FilePersistence.cleanup_locks = _delete_locks, cleanup_locks
    return True


def _under(path: str, folder: str, workdir: Path) -> bool:
    p = os.path.realpath(path if os.path.isabs(path) else os.path.join(workdir, path))
    return p == folder or p.startswith(folder + os.sep)


def stale_locks(workdir: Path, results_dir: Path) -> list[Path]:
    """The lock files in ``workdir`` that belong to the data set writing to ``results_dir``."""
    folder = lock_folder(workdir)
    results = os.path.realpath(results_dir if Path(results_dir).is_absolute() else Path(workdir) / results_dir)
    out = []
    for lock in sorted(folder.glob("*.lock")) if folder.is_dir() else []:
        try:
            lines = [ln.strip() for ln in lock.read_text().splitlines() if ln.strip()]
        except OSError:
            continue
        if any(_under(ln, results, workdir) for ln in lines):
            out.append(lock)
    return out


def remove_stale_locks(workdir: Path, results_dir: Path) -> list[Path]:
    locks = stale_locks(workdir, results_dir)
    for lock in locks:
        lock.unlink(missing_ok=True)
    return locks
