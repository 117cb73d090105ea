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


def parse_elapsed(text: str) -> float:
    """sacct [D-]HH:MM:SS[.fff] -> seconds."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [float(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    h, m, s = parts
    return days * 86400 + h * 3600 + m * 60 + s


def gres_gpus(alloc_tres: str) -> int:
    """Number of GPUs in an AllocTRES string (gres/gpu=N, or gres/gpu:<type>=N)."""
    total = 0
    for item in alloc_tres.split(","):
        key, _, val = item.partition("=")
        if key == "gres/gpu" and val.isdigit():
            total += int(val)
    return total


def parse_rss(text: str) -> float | None:
    if not text:
        return None
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    if text[-1] in mult:
        return float(text[:-1]) * mult[text[-1]]
    return float(text)


def sacct_by_ids(job_ids: list[str]) -> dict[str, dict]:
    """{job id: allocation record + MaxRSS over its steps} for numeric SLURM job ids."""
    ids = [j for j in job_ids if j and j.isdigit()]
    if not ids:
        return {}
    fields = ["JobID", "Account", "Partition", "NodeList", "AllocTRES", "Elapsed", "Timelimit", "State",
              "Start", "End", "MaxRSS"]
    res = _run(["sacct", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(fields)])
    if res.returncode != 0:
        raise RuntimeError(f"sacct failed: {res.stderr.strip()}")
    out: dict[str, dict] = {}
    for line in res.stdout.splitlines():
        row = dict(zip(fields, line.split("|")))
        base, _, step = row["JobID"].partition(".")
        if not step:
            out[base] = row
            out[base]["MaxRSS_bytes"] = None
        elif base in out:
            rss = parse_rss(row["MaxRSS"])
            if rss is not None:
                prev = out[base]["MaxRSS_bytes"]
                out[base]["MaxRSS_bytes"] = max(prev or 0, rss)
    return out


FAILED_STATES = ("CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                 "DEADLINE")


def parse_comment(comment: str) -> tuple[str, str]:
    """The slurm plugin's job comment ``rule_<rule>_wildcards_<values>`` -> (rule, wildcards)."""
    body = comment[len("rule_"):] if comment.startswith("rule_") else comment
    rule, _, wc = body.partition("_wildcards_")
    return rule, wc


def squeue_jobs() -> list[dict]:
    """This user's queued and running jobs."""
    fields = ["JobID", "JobName", "Account", "State", "WorkDir", "Comment"]
    res = _run(["squeue", "--me", "-h", "-o", "%i|%j|%a|%T|%Z|%k"])
    if res.returncode != 0:
        raise RuntimeError(f"squeue failed: {res.stderr.strip()}")
    return [dict(zip(fields, line.split("|", 5))) for line in res.stdout.splitlines() if line.strip()]


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        res = _run(["scancel", *job_ids])
        if res.returncode != 0:
            raise RuntimeError(f"scancel failed: {res.stderr.strip()}")
