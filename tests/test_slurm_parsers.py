"""The SLURM output parsers on recorded text (SLURM 22.05 formats), without a cluster: sacct's
elapsed/TRES/RSS fields and per-step MaxRSS, the plugin's job comment, sacctmgr's limits
(association and QOS), squeue's allocated GPUs and sinfo's node sizes."""

from __future__ import annotations

import subprocess

import pytest

from plexgpu.cluster import slurm


@pytest.fixture
def recorded(monkeypatch):
    """slurm._run answers from a table of recorded outputs, keyed by the command's first words."""
    table: dict[tuple, str] = {}

    def fake(args, timeout=30):
        for key, out in table.items():
            if tuple(args[:len(key)]) == key:
                return subprocess.CompletedProcess(args, 0, out, "")
        return subprocess.CompletedProcess(args, 1, "", "not recorded")
    monkeypatch.setattr(slurm, "_run", fake)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    return table


def test_fields():
    assert slurm.parse_elapsed("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert slurm.parse_elapsed("05:06") == 306 and slurm.parse_elapsed("00:00:01.500") == 1.5
    assert slurm.gres_gpus("billing=2,cpu=2,gres/gpu=1,mem=400M,node=1") == 1
    assert slurm.gres_gpus("cpu=2,mem=400M") == 0 and slurm.gres_gpus("cpu=2", None) is None
    assert slurm.gres_gpus("gres/gpu=0", None) == 0                    # a limit of 0 is a limit
    assert slurm.parse_rss("1024K") == 2**20 and slurm.parse_rss("") is None
    assert slurm.parse_comment("rule_stitch_wildcards_cyc002") == ("stitch", "cyc002")
    assert slurm.parse_comment("rule_registration") == ("registration", "")
    # a cycle's group job (Snakemake: "<group id>_<its rules, sorted>"): its stages in pipeline order
    assert slurm.parse_comment("rule_cycle_cyc004_deconvolve_edf_stitch") == ("stitch+deconvolve+edf", "cyc004")
    assert slurm.job_stages("rule_cycle_cyc004_deconvolve_edf") == [("deconvolve", "cyc004"), ("edf", "cyc004")]
    assert slurm.job_stages("rule_qc_stitch_wildcards_cyc001") == [("qc_stitch", "cyc001")]


def test_sacct_by_ids_joins_steps_max_rss(recorded):
    recorded[("sacct", "-n", "-P", "-j")] = (
        "161|maigan|hpg-b200|vm|billing=2,cpu=2,gres/gpu=1,mem=400M,node=1|00:00:12|00:10:00|COMPLETED|"
        "2026-12-02T04:22:02|2026-12-02T04:22:14|\n"
        "161.batch|maigan||vm|cpu=2,gres/gpu=1,mem=400M,node=1|00:00:12||COMPLETED|"
        "2026-12-02T04:22:02|2026-12-02T04:22:14|250M\n"
        "161.0|maigan||vm|cpu=2,gres/gpu=1,mem=400M,node=1|00:00:11||COMPLETED|"
        "2026-12-02T04:22:02|2026-12-02T04:22:13|300M\n"
        "162|clive|hpg-b200|vm||00:00:00|00:10:00|CANCELLED by 0|Unknown|2026-12-02T04:22:20|\n")
    out = slurm.sacct_by_ids(["161", "162", "local123"])
    assert set(out) == {"161", "162"}
    assert out["161"]["MaxRSS_bytes"] == 300 * 2**20 and slurm.gres_gpus(out["161"]["AllocTRES"]) == 1
    assert out["162"]["State"].startswith("CANCELLED") and out["162"]["MaxRSS_bytes"] is None


def test_gpu_limit_smallest_of_association_and_qos(recorded):
    recorded[("sacctmgr", "-n", "-P", "show", "assoc")] = (
        "clive||gres/gpu=3|normal\nclive|root||normal,gpu1\nclive|someone|gres/gpu=1|normal\n")
    recorded[("sacctmgr", "-n", "-P", "show", "qos")] = "normal||\ngpu1|gres/gpu=8|gres/gpu=2\nother|gres/gpu=1|\n"
    assert slurm.gpu_limit("clive", "root") == (2, "QOS gpu1 MaxTRESPerUser")    # another user's row: not ours
    recorded[("sacctmgr", "-n", "-P", "show", "qos")] = "normal||\n"
    assert slurm.gpu_limit("clive", "root") == (3, "association clive GrpTRES")
    recorded[("sacctmgr", "-n", "-P", "show", "assoc")] = "clive||cpu=100|normal\n"
    assert slurm.gpu_limit("clive", "root") == (None, "")


def test_gpus_in_use_and_partition_limits(recorded):
    recorded[("squeue", "-h", "-u")] = (
        "maigan   cpu=2,mem=400M,node=1,billing=2,gres/gpu=1\n"
        "clive    cpu=2,mem=400M,node=1,billing=2,gres/gpu=1\n"
        "clive    cpu=8,mem=4G,node=1,billing=8,gres/gpu=2\n")
    assert slurm.gpus_in_use("root") == {"maigan": 1, "clive": 3}
    recorded[("sinfo", "-h", "-p")] = "8|16000|gpu:6|infinite\n64+|512000|gpu:h200:4(S:0-1)|2-00:00:00\n"
    assert slurm.partition_limits("hpg-b200") == {"cpus": 64, "mem_mb": 512000, "gpus": 6, "time_min": None,
                                                  "gpu_types": ["h200"]}
    recorded[("sinfo", "-h", "-p")] = "32|256000|gpu:a100:4|12:00:00\n"
    assert slurm.partition_limits("gpu") == {"cpus": 32, "mem_mb": 256000, "gpus": 4, "time_min": 720.0,
                                             "gpu_types": ["a100"]}
    recorded[("sinfo", "-h", "-p")] = "32|256000|gpu:a100_3g.40gb:2,gpu:a100_1g.10gb:3|12:00:00\n"   # MIG profiles
    assert slurm.partition_limits("mig")["gpu_types"] == ["a100_1g.10gb", "a100_3g.40gb"]
