"""GPU-only scheduling proven on the real local SLURM cluster (slurmctld + slurmd + slurmdbd).

The fake GPUs are character devices: jobs hold real gres/gpu allocations but compute with
`compute.device: cpu` (written in the test config), except in the guard test.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from conftest import REPO
from slurm_helpers import ACCOUNTS, max_concurrent, records, snakemake_on_slurm, stage_records, ts, write_config
from plexgpu.cluster import report
from plexgpu.cluster.assignment import build_cycle_assignment
from plexgpu.cluster.slurm import parse_elapsed
from plexgpu.image.synth import SynthDataset, SynthSpec

pytestmark = pytest.mark.slurm

@pytest.fixture(scope="module")
def nine_cycles(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurm9")
    raw = tmp / "raw"
    SynthDataset(SynthSpec(cycles=9, rows=4, cols=4, tile=(96, 96), z_planes=5, channels=1, seed=21)).write(raw)
    return tmp, raw


def test_nine_cycles_gpu_only_on_real_slurm(slurm_cluster, nine_cycles):
    tmp, raw = nine_cycles
    cfg = write_config(tmp, raw)
    prefix = f"plexgpu-t{uuid.uuid4().hex[:8]}"
    plan = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(cfg)],
                          capture_output=True, text=True, cwd=REPO)
    assert plan.returncode == 0, plan.stderr
    assert re.search(r"--profile profiles/slurm --slurm-jobname-prefix plexgpu-[0-9a-f]{8} --slurm-logdir "
                     rf"{re.escape(str(tmp.resolve()))}/results/logs/slurm -j 5$",
                     plan.stdout.strip().splitlines()[-2])              # the last line: the QC command
    res = snakemake_on_slurm(tmp, cfg, "registration", prefix)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    recs = records(prefix)
    expect = build_cycle_assignment([f"cyc{c:03d}" for c in range(1, 10)], ACCOUNTS)
    gpu_recs = [r for r in recs if r["rule"] in ("stitch+deconvolve+edf", "registration")]
    # one allocation per cycle (its three stages, one after another on one GPU) + registration
    assert len(gpu_recs) == 9 + 1 and all(r["State"] == "COMPLETED" for r in gpu_recs), \
        [(r["rule"], r["cycle"], r["State"]) for r in recs]
    assert sorted(r["cycle"] for r in gpu_recs if r["cycle"]) == [f"cyc{c:03d}" for c in range(1, 10)]
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
        peak = max_concurrent([r for r in gpu_recs if r["Account"] == account])
        print(f"{account}: at most {peak} GPU jobs at once (slots {slots})")
        assert peak <= slots
    log = (tmp / "results/logs/stitch/cyc001.log").read_text()
    assert "worker pool = 2 (cpus_per_task = 2)" in log
    # accounting: one record per GPU job; the report's counts and elapsed are sacct's
    rep = subprocess.run([sys.executable, "-m", "plexgpu.cli", "report", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    allocs = report.collect(tmp / "results/accounting/jobs")
    by_id = {r["JobID"]: r for r in gpu_recs}
    assert sorted(a.job_id for a in allocs) == sorted(by_id)
    for a in allocs:
        assert a.source == "sacct" and a.gpus == 1 and a.account == by_id[a.job_id]["Account"]
        assert a.elapsed_s == parse_elapsed(by_id[a.job_id]["Elapsed"])
        if a.cycle:    # each stage wrote its own record in the cycle's one allocation, in order
            assert [u.rule for u in a.stages] == ["stitch", "deconvolve", "edf"], a
            assert all(u.end <= v.start for u, v in zip(a.stages, a.stages[1:])), a
            assert sum(u.elapsed_s for u in a.stages) <= a.elapsed_s + 1, a
    total = sum(parse_elapsed(r["Elapsed"]) for r in gpu_recs)
    assert f"10 allocations held 1 GPU each (SLURM gres/gpu) for {total / 3600:.3f} h" in rep.stdout
    assert "no GPU device was used" in rep.stdout
    # QC apart, on SLURM too: it holds no GPU
    res = snakemake_on_slurm(tmp, cfg, "qc", prefix + "q")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    qc_recs = [r for r in records(prefix + "q") if r["rule"].startswith("qc")]
    assert qc_recs and all("gres/gpu" not in r["AllocTRES"] for r in qc_recs)


def test_gpu_device_on_fake_gpus_fails_fast_and_writes_nothing(slurm_cluster, tmp_path):
    raw = tmp_path / "raw"
    SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(64, 64), z_planes=3, channels=1, seed=2)).write(raw)
    cfg = write_config(tmp_path, raw, device="gpu")
    prefix = f"plexgpu-g{uuid.uuid4().hex[:8]}"
    t0 = time.time()
    res = snakemake_on_slurm(tmp_path, cfg, "registration", prefix, timeout=300)
    assert res.returncode != 0
    log = (tmp_path / "results/logs/stitch/cyc001.log").read_text()
    assert "no usable GPU" in log
    assert not list((tmp_path / "results").glob("stitched/*/*.tif"))
    recs = [r for r in stage_records(prefix) if r["rule"] == "stitch"]
    assert recs and recs[0]["State"] == "FAILED"
    elapsed = ts(recs[0]["End"]) - ts(recs[0]["Start"])
    print(f"guard failed the job after {elapsed:.0f} s (whole run {time.time() - t0:.0f} s)")
    assert elapsed < 60


def test_unknown_account_fails_at_plan_and_dag(slurm_cluster, tmp_path, small_synth):
    cfg = write_config(tmp_path, small_synth[0], accounts=[{"name": "nosuch", "gpu_slots": 2}])
    plan = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(cfg)],
                          capture_output=True, text=True)
    assert plan.returncode == 2 and "no account nosuch" in plan.stderr
    dry = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile", str(cfg), "-n",
                          "-s", str(REPO / "Snakefile"), "-d", str(tmp_path)], capture_output=True, text=True)
    assert dry.returncode != 0 and "no account nosuch" in dry.stdout + dry.stderr


def test_gpu_slots_auto_and_plan_read_slurms_limits(slurm_cluster, small_synth, tmp_path):
    """gpu_slots: auto takes SLURM's limit (association GrpTRES; a QOS MaxTRESPerUser below it wins);
    plan shows config, limit, in use and free, warns where the config exceeds the limit and where a
    request does not fit the partition's nodes, and prints -j = free slots."""
    from plexgpu.config import validate_config
    from plexgpu.cluster.slurm import gpu_limit, resolve_auto_slots

    assert gpu_limit("clive") == (3, "association clive GrpTRES")
    qos = f"plexgpu{uuid.uuid4().hex[:6]}"
    def sh(*a):
        return subprocess.run(["sacctmgr", "-i", *a], capture_output=True, text=True)
    assert sh("add", "qos", qos, "MaxTRESPerUser=gres/gpu=1").returncode == 0
    try:
        assert sh("modify", "user", "where", "name=root", "account=maigan", "set", f"qos+={qos}").returncode == 0
        assert gpu_limit("maigan") == (1, f"QOS {qos} MaxTRESPerUser")
        cfg = resolve_auto_slots(validate_config({"raw_dir": str(small_synth[0]), "accounts": [
            {"name": "clive", "gpu_slots": "auto", "partition": "hpg-b200"},
            {"name": "maigan", "gpu_slots": "auto", "partition": "hpg-b200"}]}))
        assert [a["gpu_slots"] for a in cfg["accounts"]] == [3, 1]
        path = tmp_path / "c.yaml"
        import yaml

        path.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": [
            {"name": "clive", "gpu_slots": 4, "partition": "hpg-b200"},
            {"name": "maigan", "gpu_slots": "auto", "partition": "hpg-b200"}],
            "resources": {"deconvolve": {"cpus_per_task": 4, "mem_mb": 64000, "runtime": 60}}}))
        plan = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(path)],
                              capture_output=True, text=True, cwd=REPO)
        assert plan.returncode == 3, plan.stdout + plan.stderr           # a request sbatch refuses: exit 3
        out = " ".join(plan.stdout.split())
        assert "gpu_slots 4 but SLURM lets you hold 3" in out
        assert "auto → 1" in out
        assert "error: resources.deconvolve.mem_mb = 64000 but the largest node of partition hpg-b200 has 16000 MB" in out
        command = next(line for line in plan.stdout.splitlines() if line.startswith("snakemake registration"))
        assert command.endswith("-j 4")            # min(4, 3) + 1: the limits, not what is free
    finally:
        sh("modify", "user", "where", "name=root", "account=maigan", "set", f"qos-={qos}")
        sh("delete", "qos", qos)
