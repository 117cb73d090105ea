"""The gpu-only Snakemake scheduler plugin: interface tests plus its own behaviour."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections import defaultdict
from typing import Optional, Type

import pytest
import yaml
from snakemake_interface_scheduler_plugins.base import SchedulerBase
from snakemake_interface_scheduler_plugins.settings import SchedulerSettingsBase
from snakemake_interface_scheduler_plugins.tests import TestSchedulerBase

import snakemake_scheduler_plugin_gpu_only as plugin
from plexgpu.paths import gpu_stage_rank
from conftest import REPO


class TestGpuOnlyInterface(TestSchedulerBase):
    __test__ = True

    def get_scheduler_cls(self) -> Type[SchedulerBase]:
        return plugin.Scheduler

    def get_scheduler_settings(self) -> Optional[SchedulerSettingsBase]:
        return plugin.SchedulerSettings()


class Rule:
    def __init__(self, name):
        self.name = name


class Job:
    def __init__(self, rule, cycle="", account=None, gpu=1, **res):
        self.rule = Rule(rule)
        self.wildcards = {"cycle": cycle} if cycle else {}
        self.priority = 0
        self._res = {"_cores": 1, "_nodes": 1, "_job_count": 1, **res}
        if gpu_stage_rank(rule):                       # what rules/common.smk's rule_resources declares
            self._res["gpu_stage"] = gpu_stage_rank(rule)
        if account:                                     # its account and that account's slot token
            self._res.update(slurm_account=account, gpu=gpu, **{plugin.slot_token(account): 1})
        self.input = []

    @property
    def scheduler_resources(self):
        return self._res

    def __repr__(self):
        return f"{self.rule.name}:{self.wildcards.get('cycle', '')}"


class DAG:
    def __init__(self, jobs, finished=()):
        self.jobs, self.done = jobs, set(map(id, finished))

    def needrun_jobs(self):
        return list(self.jobs)

    def finished(self, job):
        return id(job) in self.done

    def job_dependencies(self, job):
        return []


def _scheduler(jobs, finished=()):
    s = plugin.Scheduler(DAG(jobs, finished), plugin.SchedulerSettings(), logging.getLogger("t"))
    s.dag_updated()
    return s


BIG = {"_cores": 100, "_nodes": 100, "_job_count": 100, "gpu_clive": 3, "gpu_maigan": 2}


class Group:
    """A group job as Snakemake's core hands it over: its single jobs, and resources the core
    computed for it (sequential layers: the maximum of each, so one slot token)."""
    def __init__(self, jobs):
        self._jobs = jobs
        self.priority = 0
        self.scheduler_resources = {k: max(j.scheduler_resources.get(k, 0) for j in jobs)
                                    for j in jobs for k in j.scheduler_resources}

    def jobs(self):
        return list(self._jobs)


def test_account_never_exceeds_its_slots():
    jobs = [Job("stitch", f"cyc{c:03d}", "clive") for c in range(1, 6)] + \
           [Job("stitch", f"cyc{c:03d}", "maigan") for c in range(6, 10)]
    s = _scheduler(jobs)
    chosen = s.select_jobs(jobs, jobs, BIG, defaultdict(int))
    assert [j.scheduler_resources["slurm_account"] for j in chosen].count("clive") == 3
    assert [j.scheduler_resources["slurm_account"] for j in chosen].count("maigan") == 2
    # two clive jobs are running: the core holds their slot tokens, one clive slot is free
    remaining = jobs[2:]
    chosen = s.select_jobs(remaining, remaining, dict(BIG, gpu_clive=1), defaultdict(int))
    assert sum(j.scheduler_resources["slurm_account"] == "clive" for j in chosen) == 1
    # ... and once they finish (or fail: the core frees a failed job's tokens too), three again
    chosen = s.select_jobs(remaining, remaining, BIG, defaultdict(int))
    assert sum(j.scheduler_resources["slurm_account"] == "clive" for j in chosen) == 3


def test_a_cycle_group_takes_one_slot_of_its_account():
    """A cycle's stitch, deconvolve and edf in one group job hold one GPU slot, not three: with
    clive's 3 slots, three cycles' groups start at once."""
    groups = [Group([Job(r, f"cyc{c:03d}", "clive") for r in ("stitch", "deconvolve", "edf")])
              for c in range(1, 6)]
    singles = [j for g in groups for j in g.jobs()]
    chosen = _scheduler(singles).select_jobs(groups, singles, BIG, defaultdict(int))
    assert chosen == groups[:3]                                   # earliest cycles first


def test_an_account_without_a_slot_resource_is_refused():
    job = Job("stitch", "cyc001", "nobody")
    with pytest.raises(plugin.GpuOnlySchedulingError, match="account nobody, which has no slot resource gpu_nobody"):
        _scheduler([job]).select_jobs([job], [job], BIG, defaultdict(int))


@pytest.mark.parametrize("limit", [{"_cores": 2}, {"_nodes": 2}, {"_job_count": 2}, {"tokens": 2}])
def test_every_given_resource_respected(limit):
    jobs = [Job("qc_stitch", f"cyc{c:03d}", tokens=1) for c in range(1, 6)]
    avail = dict(BIG, tokens=100)
    avail.update(limit)
    chosen = _scheduler(jobs).select_jobs(jobs, jobs, avail, defaultdict(int))
    assert len(chosen) == 2


def test_gpu_work_before_qc_and_started_cycles_first():
    stitch1 = Job("stitch", "cyc001", "clive")
    decon1 = Job("deconvolve", "cyc001", "clive")
    stitch2 = Job("stitch", "cyc002", "clive")
    qc = Job("qc_stitch", "cyc001")
    s = _scheduler([stitch1, decon1, stitch2, qc], finished=[stitch1])
    # one free core: the GPU job of the started cycle wins over QC and over a new cycle
    chosen = s.select_jobs([qc, stitch2, decon1], [qc, stitch2, decon1], dict(BIG, _cores=1), defaultdict(int))
    assert chosen == [decon1]
    chosen = s.select_jobs([qc, stitch2], [qc, stitch2], dict(BIG, _cores=1), defaultdict(int))
    assert chosen == [stitch2]


def test_gpu_stage_without_gpu_refused():
    bad = Job("edf", "cyc003", "clive", gpu=0)
    with pytest.raises(plugin.GpuOnlySchedulingError, match="edf cyc003 is a GPU stage but asks for no GPU"):
        _scheduler([bad]).select_jobs([bad], [bad], BIG, defaultdict(int))


def test_harmless_for_a_single_remote_job():
    job = Job("stitch", "cyc001", "clive")
    assert _scheduler([job]).select_jobs([job], [job], BIG, defaultdict(int)) == [job]


def _workflow_copy(tmp_path):
    wf = tmp_path / "wf"
    wf.mkdir()
    for part in ("Snakefile", "rules", "scripts", "config", "envs", "workflow"):
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, wf / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(src, wf / part)
    return wf


def _cfg(tmp_path, raw):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "raw_dir": str(raw), "results_dir": str(tmp_path / "res"), "compute": {"device": "cpu"},
        "accounts": [{"name": "clive", "gpu_slots": 3, "partition": "hpg-b200"},
                     {"name": "maigan", "gpu_slots": 2, "partition": "hpg-b200"}]}))
    return cfg


def test_snakemake_accepts_scheduler_gpu_only(tmp_path, small_synth):
    res = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile",
                          str(_cfg(tmp_path, small_synth[0])), "--scheduler", "gpu-only", "-n", "-j", "5",
                          "-s", str(REPO / "Snakefile"), "-d", str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "gpu-only" not in res.stderr or "invalid choice" not in res.stderr


def test_rule_edited_to_drop_gpu_is_refused(tmp_path, small_synth):
    wf = _workflow_copy(tmp_path)
    common = wf / "rules" / "common.smk"
    text = common.read_text()
    assert "        gpu=1,\n" in text
    common.write_text(text.replace("        gpu=1,\n", ""))
    res = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile",
                          str(_cfg(tmp_path, small_synth[0])), "--scheduler", "gpu-only", "-j", "5",
                          "-s", str(wf / "Snakefile"), "-d", str(tmp_path)], capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "is a GPU stage but asks for no GPU" in out, out[-2000:]
    assert not (tmp_path / "res" / "stitched").exists()
