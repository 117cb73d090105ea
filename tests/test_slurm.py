"""GPU-only scheduling proven on the real local SLURM cluster (slurmctld + slurmd + slurmdbd).

The fake GPUs are character devices: jobs hold real gres/gpu allocations but compute with
`compute.device: cpu` (written in the test config), except in the guard test.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import datetime

import pytest
import yaml

from conftest import REPO
from plexgpu.assignment import build_cycle_assignment
from plexgpu.slurm import sacct_jobs
from plexgpu.synth import SynthDataset, SynthSpec

pytestmark = pytest.mark.slurm

ACCOUNTS = [{"name": "clive", "gpu_slots": 3, "partition": "hpg-b200"},
            {"name": "maigan", "gpu_slots": 2, "partition": "hpg-b200"}]
SMALL = {"cpus_per_task": 1, "mem_mb": 400, "runtime": 10}


def _config(tmp, raw, device="cpu", **extra):
    cfg = {"raw_dir": str(raw), "results_dir": str(tmp / "results"), "compute": {"device": device},
           "accounts": ACCOUNTS, "deconvolution": {"iterations": 2},
           "resources": {r: dict(SMALL) for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}
    cfg["resources"]["stitch"]["cpus_per_task"] = 2
    cfg.update(extra)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def snakemake_on_slurm(tmp, cfg, target, prefix, timeout=900):
    """The user's command (targets first), with short status polling for tests."""
    args = [sys.executable, "-m", "snakemake", target, "--configfile", str(cfg),
            "--profile", str(REPO / "profiles/slurm"), "-j", "5", "-s", str(REPO / "Snakefile"), "-d", str(tmp),
            "--slurm-init-seconds-before-status-checks", "3", "--slurm-jobname-prefix", prefix, "--retries", "0",
            "--latency-wait", "5"]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def _records(prefix):
    recs = [r for r in sacct_jobs(start=(datetime.now().strftime("%Y-%m-%d")))
            if r["JobName"].startswith(prefix)]
    for r in recs:
        comment = r["Comment"]                        # rule_<rule>_wildcards_<cycle>
        rule_wc = comment[len("rule_"):] if comment.startswith("rule_") else comment
        rule, _, wc = rule_wc.partition("_wildcards_")
        r["rule"], r["cycle"] = rule, wc
    return recs


def _t(s):
    return datetime.fromisoformat(s).timestamp()


def _max_concurrent(recs):
    events = sorted([(_t(r["Start"]), 1) for r in recs] + [(_t(r["End"]), -1) for r in recs])
    n = peak = 0
    for _, d in events:
        n += d
        peak = max(peak, n)
    return peak


@pytest.fixture(scope="module")
def nine_cycles(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurm9")
    raw = tmp / "raw"
    SynthDataset(SynthSpec(cycles=9, rows=4, cols=4, tile=(96, 96), z_planes=5, channels=1, seed=21)).write(raw)
    return tmp, raw


def test_nine_cycles_gpu_only_on_real_slurm(slurm_cluster, nine_cycles):
    tmp, raw = nine_cycles
    cfg = _config(tmp, raw)
    prefix = f"plexgpu-t{uuid.uuid4().hex[:8]}"
    plan = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(cfg)],
                          capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.strip().splitlines()[-1].endswith("--profile profiles/slurm -j 5")
    res = snakemake_on_slurm(tmp, cfg, "registration", prefix)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = _records(prefix)
    expect = build_cycle_assignment([f"cyc{c:03d}" for c in range(1, 10)], ACCOUNTS)
    gpu_recs = [r for r in recs if r["rule"] in ("stitch", "deconvolve", "edf", "registration")]
    assert len(gpu_recs) == 9 * 3 + 1 and all(r["State"] == "COMPLETED" for r in gpu_recs)
    for r in gpu_recs:
        assert "gres/gpu=1" in r["AllocTRES"], r
        if r["rule"] == "registration":
            assert r["Account"] == "clive"
        else:
            assert r["Account"] == expect[r["cycle"]].account, r
            assert r["Partition"] == expect[r["cycle"]].partition, r
    table = {c: expect[c].account for c in expect}
    assert [c for c, a in table.items() if a == "clive"] == ["cyc001", "cyc002", "cyc003", "cyc006", "cyc007",
                                                           "cyc008"]
    for account, slots in (("clive", 3), ("maigan", 2)):
        peak = _max_concurrent([r for r in gpu_recs if r["Account"] == account])
        print(f"{account}: at most {peak} GPU jobs at once (slots {slots})")
        assert peak <= slots
    log = (tmp / "results/logs/stitch/cyc001.log").read_text()
    assert "worker pool = 2 (cpus_per_task = 2)" in log
    # QC apart, on SLURM too: it holds no GPU
    res = snakemake_on_slurm(tmp, cfg, "qc", prefix + "q")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    qc_recs = [r for r in _records(prefix + "q") if r["rule"].startswith("qc")]
    assert qc_recs and all("gres/gpu" not in r["AllocTRES"] for r in qc_recs)


def test_gpu_device_on_fake_gpus_fails_fast_and_writes_nothing(slurm_cluster, tmp_path):
    raw = tmp_path / "raw"
    SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(64, 64), z_planes=3, channels=1, seed=2)).write(raw)
    cfg = _config(tmp_path, raw, device="gpu")
    prefix = f"plexgpu-g{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    res = snakemake_on_slurm(tmp_path, cfg, "registration", prefix, timeout=300)
    assert res.returncode != 0
    log = (tmp_path / "results/logs/stitch/cyc001.log").read_text()
    assert "no usable GPU" in log
    assert not list((tmp_path / "results").glob("stitched/*/*.tif"))
    recs = [r for r in _records(prefix) if r["rule"] == "stitch"]
    assert recs and recs[0]["State"] == "FAILED"
    elapsed = _t(recs[0]["End"]) - _t(recs[0]["Start"])
    print(f"guard failed the job after {elapsed:.0f} s (whole run {time.time() - t0:.0f} s)")
    assert elapsed < 60


def test_unknown_account_fails_at_plan_and_dag(slurm_cluster, tmp_path, small_synth):
    cfg = _config(tmp_path, small_synth[0], accounts=[{"name": "nosuch", "gpu_slots": 2}])
    plan = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(cfg)],
                          capture_output=True, text=True)
    assert plan.returncode == 2 and "no account nosuch" in plan.stderr
    dry = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile", str(cfg), "-n",
                          "-s", str(REPO / "Snakefile"), "-d", str(tmp_path)], capture_output=True, text=True)
    assert dry.returncode != 0 and "no account nosuch" in dry.stdout + dry.stderr
