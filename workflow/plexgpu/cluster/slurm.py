"""Thin, typed access to the SLURM commands plexgpu needs (sacctmgr, squeue, sacct, scancel)."""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess

from .. import paths


class SlurmError(RuntimeError):
    """A SLURM command this workflow needs failed (controller unreachable, refused): one line for the user."""


def available() -> bool:
    return shutil.which("sbatch") is not None


def _run(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def _ask(args: list[str]) -> str:
    """stdout of a SLURM command this workflow cannot go on without; SlurmError (one line) when it fails,
    is missing or gets no answer in time."""
    try:
        res = _run(args)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{args[0]} failed: {exc}") from None
    if res.returncode != 0:
        raise SlurmError(f"{args[0]} failed: {res.stderr.strip()}")
    return res.stdout


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


def resolve_auto_slots(config: dict) -> dict:
    """``gpu_slots: auto`` -> SLURM's GPU limit for this user on that account (its origin in
    ``gpu_slots_from``), in place; a ConfigError naming the key where SLURM sets none or cannot be
    asked. Called where SLURM is asked on purpose: the coordinator's parse of the Snakefile,
    ``plexgpu validate``, ``plan`` and ``rerun``."""
    from ..config import ConfigError

    for i, a in enumerate(config.get("accounts", [])):
        if a["gpu_slots"] != "auto":
            continue
        limit, source = gpu_limit(a["name"])
        if limit is None:
            raise ConfigError(f"config key accounts[{i}].gpu_slots = auto: SLURM sets no gres/gpu limit for account "
                              f"{a['name']} that sacctmgr shows (association or QOS GrpTRES / MaxTRESPerUser), or "
                              "SLURM cannot be asked here; give the number of GPUs the account may hold")
        a.update(gpu_slots=limit, gpu_slots_from=source)
    return config


def gpu_limit(account: str, user: str | None = None) -> tuple[int | None, str]:
    """The GPUs ``user`` may hold at once on ``account`` by SLURM's own limits: the smallest gres/gpu
    among the account's and the user's association GrpTRES and the GrpTRES / MaxTRESPerUser of
    their QOS; with where it comes from ("" and None where SLURM sets none or cannot be asked)."""
    if shutil.which("sacctmgr") is None:
        return None, ""
    user = user or getpass.getuser()
    try:
        assoc = _run(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"account={account}",
                      "format=account,user,grptres,qos"], timeout=15)
        qos = _run(["sacctmgr", "-n", "-P", "show", "qos", "format=name,grptres,maxtrespu"], timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    if assoc.returncode != 0:
        return None, ""
    found: list[tuple[int, str]] = []
    qos_names: set[str] = set()
    for line in assoc.stdout.splitlines():
        acct, who, grp, qlist = (line.split("|") + ["", "", "", ""])[:4]
        if acct != account or who not in ("", user):
            continue
        n = gres_gpus(grp, None)
        if n is not None:
            found.append((n, f"association {account}{'/' + who if who else ''} GrpTRES"))
        qos_names |= {q for q in qlist.split(",") if q}
    for line in (qos.stdout.splitlines() if qos.returncode == 0 else []):
        name, grp, per_user = (line.split("|") + ["", "", ""])[:3]
        if name not in qos_names:
            continue
        for tres, what in ((grp, "GrpTRES"), (per_user, "MaxTRESPerUser")):
            n = gres_gpus(tres, None)
            if n is not None:
                found.append((n, f"QOS {name} {what}"))
    if not found:
        return None, ""
    return min(found)


def gpus_in_use(user: str | None = None) -> dict[str, int]:
    """{account: GPUs held now by ``user``'s running jobs} (squeue's allocated TRES)."""
    if shutil.which("squeue") is None:
        return {}
    user = user or getpass.getuser()
    try:
        res = _run(["squeue", "-h", "-u", user, "-t", "RUNNING,COMPLETING", "-O", "Account:60,tres-alloc:300"])
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, int] = {}
    for line in res.stdout.splitlines() if res.returncode == 0 else []:
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = out.get(parts[0], 0) + gres_gpus(parts[1])
    return out


def partition_limits(partition: str) -> dict | None:
    """The largest node of ``partition`` as sinfo reports it: {"cpus", "mem_mb", "gpus", "time_min"}
    (time_min None: no limit); None where SLURM cannot be asked or the partition has no nodes."""
    if shutil.which("sinfo") is None:
        return None
    try:
        res = _run(["sinfo", "-h", "-p", partition, "-o", "%c|%m|%G|%l"], timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split("|") for line in res.stdout.splitlines() if line.count("|") == 3] if res.returncode == 0 else []
    if not rows:
        return None
    def gpus(g):
        return max([int(m) for m in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", g)] or [0])
    types = sorted({t for r in rows for t in re.findall(r"gpu:([A-Za-z][\w.-]*):\d+", r[2])})
    return {"cpus": max(int(r[0].rstrip("+")) for r in rows), "mem_mb": max(int(r[1].rstrip("+")) for r in rows),
            "gpus": max(gpus(r[2]) for r in rows), "time_min": _minutes(rows[0][3]), "gpu_types": types}


def _minutes(limit: str) -> float | None:
    """sinfo's time limit ([D-]HH:MM:SS, MM:SS, 'infinite') -> minutes."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    return parse_elapsed(limit) / 60


SACCT_FIELDS = ["JobID", "JobName", "Account", "Partition", "AllocTRES", "Start", "End", "Elapsed", "State",
                "Comment", "WorkDir", "Timelimit", "MaxRSS", "NodeList"]


def sacct_jobs(name: str | None = None, start: str | None = None, fields: list[str] = SACCT_FIELDS) -> list[dict]:
    """Allocation-level records (-X) as dicts."""
    args = ["sacct", "-X", "-n", "-P", "-o", ",".join(fields)]
    if name:
        args += ["--name", name]
    if start:
        args += ["-S", start]
    return [dict(zip(fields, line.split("|"))) for line in _ask(args).splitlines() if line.strip()]


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


def gres_gpus(alloc_tres: str, missing: int | None = 0) -> int | None:
    """Number of GPUs in a TRES string ('cpu=4,gres/gpu=3,mem=1G' -> 3); ``missing`` where it names none
    (a limit string without gres/gpu sets no GPU limit: pass None)."""
    total, seen = 0, False
    for item in (alloc_tres or "").split(","):
        key, _, val = item.partition("=")
        if key.strip() == "gres/gpu" and val.strip().isdigit():
            total += int(val)
            seen = True
    return total if seen else missing


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
    stdout = _ask(["sacct", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(fields)])
    out: dict[str, dict] = {}
    for line in stdout.splitlines():
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


#: the Snakemake job group of one cycle's stages (rules/cycle.smk): one SLURM allocation per cycle
CYCLE_GROUP = "cycle_{cycle}"
#: Snakemake names a group job ``<group id>_<its rule names, sorted, joined by _>``
_GROUP_JOB = re.compile(r"cycle_(?P<cycle>[^_]+)_(?P<rules>[a-z0-9_]+)")


def parse_comment(comment: str) -> tuple[str, str]:
    """The slurm plugin's job comment -> (rule, wildcards): ``rule_<rule>_wildcards_<values>`` for one
    job, ``rule_<group job name>`` for a cycle's group job, whose stages come back in pipeline order
    joined by ``+`` (``rule_cycle_cyc001_deconvolve_edf_stitch`` -> ("stitch+deconvolve+edf", "cyc001"))."""
    body = comment[len("rule_"):] if comment.startswith("rule_") else comment
    rule, _, wc = body.partition("_wildcards_")
    group = _GROUP_JOB.fullmatch(rule) if not wc else None
    if group:
        names = set(group["rules"].split("_"))
        stages = [s for s in paths.cycle_stages() if s in names]
        if stages and len(stages) == len(names):
            return "+".join(stages), group["cycle"]
    return rule, wc


def job_stages(comment: str) -> list[tuple[str, str]]:
    """(stage, cycle) of every stage a job runs: one for a single job, each of a cycle's group."""
    rule, cycle = parse_comment(comment)
    return [(stage, cycle) for stage in rule.split("+")]


def squeue_jobs() -> list[dict]:
    """This user's queued and running jobs."""
    fields = ["JobID", "JobName", "Account", "State", "WorkDir", "Comment"]
    stdout = _ask(["squeue", "--me", "-h", "-o", "%i|%j|%a|%T|%Z|%k"])
    return [dict(zip(fields, line.split("|", 5))) for line in stdout.splitlines() if line.strip()]


def scancel(job_ids: list[str]) -> None:
    if job_ids:
        _ask(["scancel", *job_ids])
