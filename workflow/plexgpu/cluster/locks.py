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
- ``claim_data_set`` / ``release_data_set``: one coordinator with GPU jobs per data set, wherever it
  was started. Snakemake's lock is per working directory: the same data set started from two
  folders ran every GPU job twice. The claim is a file in the results folder naming the
  coordinator (host, PID, working directory); a second one is refused in one line naming it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from .. import paths
from ..io.tiff import write_text_atomic


class DataSetBusy(RuntimeError):
    """Another live coordinator runs this data set's GPU jobs."""


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


def _is_snakemake(pid: int) -> bool:
    try:
        return b"snakemake" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def claim_data_set(results_dir: Path) -> Path:
    """Mark this coordinator as the one running ``results_dir``'s GPU jobs, or raise DataSetBusy
    naming the live one (on this host: its PID is alive; on another host it cannot be checked from
    here: the message says how to clear the claim where that run has ended)."""
    path = Path(results_dir) / paths.COORDINATOR
    me = {"pid": os.getpid(), "host": socket.gethostname(), "workdir": os.getcwd(), "started": time.time()}
    if path.is_file():
        try:
            other = json.loads(path.read_text())
        except (OSError, ValueError):
            other = {}
        same = other.get("host") == me["host"]
        if other and not (same and other.get("pid") == me["pid"]) and (not same or _is_snakemake(other["pid"])):
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(other.get("started", 0)))
            raise DataSetBusy(f"{results_dir} is being made by another coordinator: PID {other.get('pid')} on host "
                              f"{other.get('host')}, started {since} in {other.get('workdir')}; two runs of one data "
                              f"set would run every GPU job twice: wait for it, or stop it"
                              + ("" if same else f" (if it has ended, delete {path})"))
    write_text_atomic(path, json.dumps(me))
    return path


def release_data_set(results_dir: Path) -> None:
    """Remove this coordinator's claim (not another's)."""
    path = Path(results_dir) / paths.COORDINATOR
    try:
        mine = json.loads(path.read_text()).get("pid") == os.getpid()
    except (OSError, ValueError):
        return
    if mine:
        path.unlink(missing_ok=True)
