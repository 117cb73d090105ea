"""Thin, typed access to the SLURM commands plexgpu needs (sacctmgr, squeue, sacct, scancel)."""

from __future__ import annotations

import getpass
import shutil
import subprocess


def available() -> bool:
    return shutil.which("sbatch") is not None


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def user_accounts(user: str | None = None) -> set[str] | None:
    """Accounts SLURM associates with ``user``; None when SLURM cannot be asked."""
    if shutil.which("sacctmgr") is None:
        return None
    user = user or getpass.getuser()
    try:
        res = _run(["sacctmgr", "-n", "-P", "list", "assoc", f"user={user}", "format=account"], timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return {line.strip() for line in res.stdout.splitlines() if line.strip()}


SACCT_FIELDS = ["JobID", "JobName", "Account", "Partition", "AllocTRES", "Start", "End", "Elapsed", "State",
                "Comment", "WorkDir", "Timelimit", "MaxRSS", "NodeList"]


def sacct_jobs(name: str | None = None, start: str | None = None, fields: list[str] = SACCT_FIELDS) -> list[dict]:
    """Allocation-level records (-X) as dicts."""
    args = ["sacct", "-X", "-n", "-P", "-o", ",".join(fields)]
    if name:
        args += ["--name", name]
    if start:
        args += ["-S", start]
    res = _run(args)
    if res.returncode != 0:
        raise RuntimeError(f"sacct failed: {res.stderr.strip()}")
    return [dict(zip(fields, line.split("|"))) for line in res.stdout.splitlines() if line.strip()]
