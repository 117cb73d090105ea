"""After scancel, a killed coordinator or a crash: see where a run stands, cancel its stale
jobs, and rerun exactly what is unfinished, with nothing stale racing the new run.

A workflow's jobs are recognised by BOTH the job-name prefix of the profile and the
working directory of the run (never another run's or another user's jobs).
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import paths, slurm
from .config import REPO_ROOT

STAGES = ("stitch", "deconvolve", "edf")


def profile_prefix(profile: str | Path) -> str:
    cfg = Path(profile) / "config.v8+.yaml"
    data = yaml.safe_load(cfg.read_text()) if cfg.is_file() else {}
    return str((data or {}).get("slurm-jobname-prefix") or "")


def belongs(job: dict, prefix: str, workdir: Path) -> bool:
    name = job.get("JobName", "")
    same_dir = os.path.realpath(job.get("WorkDir", "")) == os.path.realpath(workdir)
    return same_dir and (name.startswith(prefix + "_") if prefix else True)


def workflow_jobs(prefix: str, workdir: Path) -> list[dict]:
    return [j for j in slurm.squeue_jobs() if belongs(j, prefix, workdir)]


def cancel(prefix: str, workdir: Path, timeout: float = 120) -> list[dict]:
    """scancel this workflow's jobs and wait until squeue shows none of them."""
    jobs = workflow_jobs(prefix, workdir)
    slurm.scancel([j["JobID"] for j in jobs])
    deadline = time.time() + timeout
    while workflow_jobs(prefix, workdir):
        if time.time() > deadline:
            raise RuntimeError(f"jobs of this workflow still in squeue after {timeout:.0f} s")
        time.sleep(1)
    return jobs


def incomplete_outputs(workdir: Path) -> set[str]:
    """Outputs Snakemake marked incomplete (a job that started and never finished)."""
    folder = workdir / ".snakemake" / "incomplete"
    out = set()
    if folder.is_dir():
        for marker in folder.iterdir():
            try:
                path = base64.urlsafe_b64decode(marker.name.encode()).decode()
            except Exception:
                continue
            out.add(os.path.realpath(workdir / path))
    return out


@dataclass
class StageState:
    cycle: str
    stage: str
    state: str            # done | running | failed | incomplete | not started
    detail: str = ""


def status(results_dir: Path, workdir: Path, cycles: list[str], channels: list[int], prefix: str) -> list[StageState]:
    results_dir = results_dir if results_dir.is_absolute() else workdir / results_dir
    running = {}
    history: dict[tuple[str, str], dict] = {}
    if slurm.available():
        for j in workflow_jobs(prefix, workdir):
            running[slurm.parse_comment(j["Comment"])] = j
        for r in slurm.sacct_jobs(start="now-7days"):
            if belongs(r, prefix, workdir):
                key = slurm.parse_comment(r["Comment"])
                if key not in history or int(r["JobID"]) > int(history[key]["JobID"]):
                    history[key] = r
    incomplete = incomplete_outputs(workdir)
    out = []
    for cycle in cycles:
        for stage in STAGES:
            files = paths.stage_files(results_dir, stage, cycle, channels)
            key = (stage, cycle)
            if key in running:
                j = running[key]
                out.append(StageState(cycle, stage, "running", f"job {j['JobID']}, account {j['Account']}, {j['State']}"))
            elif any(os.path.realpath(f) in incomplete for f in files):
                out.append(StageState(cycle, stage, "incomplete", "started, never finished (partial outputs)"))
            elif all(f.exists() for f in files):
                out.append(StageState(cycle, stage, "done"))
            elif key in history and history[key]["State"].split()[0] in slurm.FAILED_STATES:
                h = history[key]
                out.append(StageState(cycle, stage, "failed", f"{h['State'].split()[0]} (job {h['JobID']}, "
                                                               f"account {h['Account']})"))
            else:
                out.append(StageState(cycle, stage, "not started"))
    return out


def live_coordinators(workdir: Path) -> list[tuple[int, str]]:
    """Snakemake coordinators (not remote job processes) running in ``workdir`` on this host."""
    found = []
    me = os.getpid()
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == me:
            continue
        try:
            cmd = (pid_dir / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(pid_dir / "cwd")
        except OSError:
            continue
        text = " ".join(c.decode(errors="replace") for c in cmd)
        if "snakemake" not in text or "--target-jobs" in text or "--mode remote" in text or "slurm-jobstep" in text:
            continue
        if not any(Path(c.decode(errors="replace")).name in ("snakemake", "__main__.py") or c == b"snakemake"
                   for c in cmd) and "-m snakemake" not in text:
            continue
        workflow_dir = cwd
        args = [c.decode(errors="replace") for c in cmd]
        for flag in ("-d", "--directory"):
            if flag in args and args.index(flag) + 1 < len(args):
                workflow_dir = args[args.index(flag) + 1]
        if os.path.realpath(workflow_dir) == os.path.realpath(workdir):
            found.append((int(pid_dir.name), text))
    return found


def snakemake_args(configfiles: list[str], workdir: Path, snakefile: Path | None = None) -> list[str]:
    return ["--configfile", *configfiles, "-s", str(snakefile or REPO_ROOT / "Snakefile"), "-d", str(workdir)]


def rerun(configfiles: list[str], target: str, workdir: Path, profile: Path, jobs: int, results_dir: Path,
          cycles: list[str], channels: list[int], extra: list[str], echo=print) -> int:
    prefix = profile_prefix(profile)
    lock_dir = workdir / ".snakemake" / "locks"
    live = live_coordinators(workdir)
    if live:
        pid, cmd = live[0]
        echo(f"plexgpu rerun: refused: a live snakemake coordinator runs this workflow: PID {pid} on host "
             f"{socket.gethostname()} ({cmd[:120]}); stop it (Ctrl-C) or let it finish first")
        return 3
    before = status(results_dir, workdir, cycles, channels, prefix)
    stale = cancel(prefix, workdir) if slurm.available() else []
    for j in stale:
        echo(f"cancelled stale job {j['JobID']} ({slurm.parse_comment(j['Comment'])[0]} "
             f"{slurm.parse_comment(j['Comment'])[1]}, account {j['Account']})")
    if lock_dir.is_dir() and any(lock_dir.iterdir()):
        subprocess.run([sys.executable, "-m", "snakemake", "--unlock", *snakemake_args(configfiles, workdir)],
                       check=True, capture_output=True)
        echo("removed the stale lock of the killed coordinator (snakemake --unlock)")
    todo = [s for s in before if s.state != "done"]
    for s in todo:
        why = s.detail or s.state
        if s.state == "running":
            why = f"its job was stale and is cancelled ({s.detail})"
        echo(f"rerun {s.cycle} {s.stage}: {s.state}" + (f" - {why}" if why != s.state else ""))
    if not todo:
        echo("every cycle's stages are done; snakemake decides what else is left")
    cmd = [sys.executable, "-m", "snakemake", target, *snakemake_args(configfiles, workdir), "--profile",
           str(profile), "-j", str(jobs), "--rerun-incomplete", *extra]
    echo("running: " + " ".join(cmd[2:]))
    return subprocess.run(cmd).returncode
