"""Helpers of the tests that run the workflow on the real local SLURM cluster."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml

from conftest import REPO
from plexgpu.cluster.rerun import profile_run, run_options
from plexgpu.cluster.slurm import job_stages, parse_comment, sacct_jobs

ACCOUNTS = [{"name": "clive", "gpu_slots": 3, "partition": "hpg-b200"},
            {"name": "maigan", "gpu_slots": 2, "partition": "hpg-b200"}]
SMALL = {"cpus_per_task": 1, "mem_mb": 400, "runtime": 10}
# short status polling only: retries and everything else come from the project's profile, as users get them
TEST_FLAGS = ["--slurm-init-seconds-before-status-checks", "3", "--latency-wait", "5"]


def write_config(tmp: Path, raw: Path, device: str = "cpu", name: str = "config.yaml", results: str = "results",
                 **extra) -> Path:
    cfg = {"raw_dir": str(raw), "results_dir": str(tmp / results), "compute": {"device": device},
           "accounts": ACCOUNTS, "deconvolution": {"iterations": 2},
           "resources": {r: dict(SMALL) for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}
    cfg["resources"]["stitch"]["cpus_per_task"] = 2
    cfg.update(extra)
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def profile_with_prefix(tmp: Path, prefix: str) -> Path:
    """The project's SLURM profile with a job-name prefix of this test's own."""
    prof = tmp / "profile"
    prof.mkdir(exist_ok=True)
    data = yaml.safe_load((REPO / "profiles/slurm/config.v8+.yaml").read_text())
    data["slurm-jobname-prefix"] = prefix
    (prof / "config.v8+.yaml").write_text(yaml.safe_dump(data))
    return prof


def run_of(tmp: Path, cfg: Path, profile: Path) -> str:
    """The run's job-name prefix, as `plexgpu plan` prints it."""
    results = Path(yaml.safe_load(cfg.read_text())["results_dir"])
    return profile_run(profile, results, tmp)


def run_options_of(tmp: Path, cfg: Path, profile: Path) -> list[str]:
    """The run's options (job-name prefix, SLURM log folder), as `plexgpu plan` prints them."""
    results = Path(yaml.safe_load(cfg.read_text())["results_dir"])
    return run_options(run_of(tmp, cfg, profile), results, tmp)


def snakemake_cmd(tmp: Path, cfg: Path, target: str, profile: Path) -> list[str]:
    """The user's command as `plexgpu plan` prints it (targets first, the run's job-name prefix), with
    short status polling for tests."""
    return [sys.executable, "-m", "snakemake", target, "--configfile", str(cfg), "--profile", str(profile),
            *run_options_of(tmp, cfg, profile),
            "-j", "5", "-s", str(REPO / "Snakefile"), "-d", str(tmp), *TEST_FLAGS]


def snakemake_on_slurm(tmp: Path, cfg: Path, target: str, prefix: str, timeout: float = 900):
    return subprocess.run(snakemake_cmd(tmp, cfg, target, profile_with_prefix(tmp, prefix)), capture_output=True,
                          text=True, timeout=timeout)


def records(prefix: str) -> list[dict]:
    """sacct allocations of jobs whose name starts with ``prefix`` (a test's own profile prefix: its runs'
    prefixes follow it), with rule and cycle parsed."""
    recs = [r for r in sacct_jobs(start=datetime.now().strftime("%Y-%m-%d")) if r["JobName"].startswith(prefix)]
    for r in recs:
        r["rule"], r["cycle"] = parse_comment(r["Comment"])
    return recs


def stage_records(prefix: str) -> list[dict]:
    """``records`` with one entry per stage a job ran (a cycle's group job gives one per stage, each
    with the job's sacct row), ``rule`` being that stage."""
    return [dict(r, rule=stage, cycle=cycle) for r in records(prefix) for stage, cycle in job_stages(r["Comment"])]


def ts(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def max_concurrent(recs: list[dict]) -> int:
    events = sorted([(ts(r["Start"]), 1) for r in recs] + [(ts(r["End"]), -1) for r in recs])
    n = peak = 0
    for _, d in events:
        n += d
        peak = max(peak, n)
    return peak
