"""Rerunning after scancel and killed coordinators, with real faults on the real local SLURM."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO
from slurm_helpers import (TEST_FLAGS, records, run_of, snakemake_cmd, profile_with_prefix, stage_records, ts,
                           write_config)
from plexgpu import paths
from plexgpu.image.synth import SynthDataset, SynthSpec
from plexgpu.cluster import report
from plexgpu.cluster.rerun import run_prefix
from plexgpu.cluster.slurm import gres_gpus, parse_elapsed, sacct_jobs, squeue_jobs

pytestmark = pytest.mark.slurm
CYCLES = [f"cyc{c:03d}" for c in range(1, 5)]
#: enough Richardson-Lucy work that a cycle's deconvolve lasts seconds: a scancel can land in it (3-D RL;
#: the default, each plane with the in-focus PSF, is over too soon)
DECON = {"iterations": 30, "method": "volume"}


@pytest.fixture(scope="module")
def four_cycles(tmp_path_factory):
    """4 cycles of synthetic raw data and an uninterrupted reference run (local executor)."""
    tmp = tmp_path_factory.mktemp("rerun")
    raw = tmp / "raw"
    SynthDataset(SynthSpec(cycles=4, rows=4, cols=4, tile=(96, 96), z_planes=5, channels=1, seed=31)).write(raw)
    ref = tmp / "reference"
    ref.mkdir()
    cfg = write_config(ref, raw, deconvolution=DECON)
    res = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile", str(cfg), "--cores", "2",
                          "-s", str(REPO / "Snakefile"), "-d", str(ref)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    return raw, ref / "results"


def _digests(results: Path) -> dict:
    return {p.relative_to(results).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(results.rglob("*")) if p.suffix in (".tif", ".csv") and p.is_file()}


def _wait(cond, timeout=240, what=""):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _plexgpu(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "plexgpu.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=900)


def _my_jobs(prefix):
    return [j for j in squeue_jobs() if j["JobName"].startswith(prefix)]


def _start_run(tmp_path, raw, tag):
    """A coordinator on SLURM in the background: (prefix, profile, config, process)."""
    prefix = f"plexgpu-{tag}{uuid.uuid4().hex[:8]}"
    profile = profile_with_prefix(tmp_path, prefix)
    cfg = write_config(tmp_path, raw, deconvolution=DECON)
    coord = subprocess.Popen(snakemake_cmd(tmp_path, cfg, "registration", profile), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    return prefix, profile, cfg, coord


def _rerun(tmp_path, cfg, profile):
    res = _plexgpu("rerun", "registration", "--configfile", str(cfg), "-d", str(tmp_path), "--profile", str(profile),
                   "--", *TEST_FLAGS)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def test_killed_coordinator_rerun_resumes_only_unfinished(slurm_cluster, four_cycles, tmp_path):
    raw, reference = four_cycles
    prefix, profile, cfg, coord = _start_run(tmp_path, raw, "k")
    def edf_done():     # every output of one cycle's edf stage: that cycle is done
        return any(all(f.exists() for f in paths.stage_files(tmp_path / "results", "edf", c, [1])) for c in CYCLES)
    _wait(lambda: edf_done() and _my_jobs(prefix), what="a finished cycle while GPU jobs run")
    os.kill(coord.pid, signal.SIGKILL)
    coord.wait()
    # what was done when the coordinator died: each stage's outputs are written atomically, so a stage
    # whose files all exist is finished, even where its cycle's allocation had not ended yet
    done = {(st, c) for c in CYCLES for st in paths.cycle_stages()
            if all(f.exists() for f in paths.stage_files(tmp_path / "results", st, c, [1]))}
    assert any(stage == "edf" for stage, _ in done)               # a whole cycle was done
    assert _my_jobs(prefix), "stale jobs keep running after the coordinator died"
    st = _plexgpu("status", "--configfile", str(cfg), "-d", str(tmp_path), "--profile", str(profile))
    if "running" in st.stdout:         # its jobs still in squeue: status says that nothing submits the next
        assert "no coordinator of this data set runs on this host" in " ".join(st.stdout.split()), st.stdout
    before = {r["JobID"] for r in records(prefix)}
    # a plain relaunch is refused by Snakemake (lock); plexgpu rerun recovers
    res = _rerun(tmp_path, cfg, profile)
    assert "cancelled stale job" in res.stdout
    recs = stage_records(prefix)       # per stage: a cycle's group job is one sacct row for three stages
    rerun_stages = {(r["rule"], r["cycle"]) for r in recs if r["JobID"] not in before}
    assert rerun_stages and not rerun_stages & done, (sorted(done), sorted(rerun_stages))  # nothing done twice
    by_key: dict = {}
    for r in recs:
        by_key.setdefault((r["rule"], r["cycle"]), []).append(r)
    for key, rs in by_key.items():  # no two jobs of one rule + cycle ever overlapped
        rs.sort(key=lambda r: ts(r["Start"]))
        for a, b in zip(rs, rs[1:]):
            assert ts(a["End"]) <= ts(b["Start"]), (key, a["JobID"], b["JobID"])
    assert _digests(tmp_path / "results") == _digests(reference)


def test_scancel_mid_deconvolve_other_cycles_finish_and_rerun_only_what_was_not_done(slurm_cluster, four_cycles,
                                                                                      tmp_path):
    """A cycle's stages share one allocation; a scancel after its stitch finished (deconvolve running)
    loses only what was not done: the rerun's one allocation for that cycle runs deconvolve and edf,
    never stitch again."""
    raw, reference = four_cycles
    prefix, profile, cfg, coord = _start_run(tmp_path, raw, "s")
    victim = {}
    stitched = paths.stage_files(tmp_path / "results", "stitch", "cyc002", [1])     # every output of it

    def cyc002_past_its_stitch():
        for j in _my_jobs(prefix):
            if j["Comment"] == "rule_cycle_cyc002_deconvolve_edf_stitch" and j["State"] == "RUNNING" \
                    and all(f.exists() for f in stitched):
                victim.update(j)
                return True
        return False

    _wait(cyc002_past_its_stitch, what="cyc002's job running after its stitch")
    subprocess.run(["scancel", victim["JobID"]], check=True)
    assert coord.wait(timeout=600) != 0  # keep-going: the others finish, the run reports the failure
    for c in ("cyc001", "cyc003", "cyc004"):
        assert (tmp_path / f"results/edf/{c}/CH1.ome.tif").exists()
    assert not (tmp_path / "results/edf/cyc002/CH1.ome.tif").exists()
    st = _plexgpu("status", "--configfile", str(cfg), "-d", str(tmp_path), "--profile", str(profile))
    states = {s: next(ln for ln in st.stdout.splitlines() if "cyc002" in ln and f" {s} " in ln)
              for s in ("stitch", "deconvolve", "edf")}
    assert "done" in states["stitch"], st.stdout
    assert "failed" in states["edf"] and "CANCELLED" in states["edf"], st.stdout
    lost = [s for s in ("deconvolve", "edf") if "done" not in states[s]]
    assert all("done" in ln for ln in st.stdout.splitlines() if "cyc001" in ln)
    # the user's scancel stayed a cancel: the profile resubmitted nothing of cyc002
    assert [r["rule"] for r in records(prefix) if r["cycle"] == "cyc002"] == ["stitch+deconvolve+edf"]
    # every allocation sacct knows is in the report, the cancelled one included; GPU-seconds to the second
    rep = _plexgpu("report", "--configfile", str(cfg), "-d", str(tmp_path), "--profile", str(profile))
    assert rep.returncode == 0, rep.stderr
    allocs = report.collect(tmp_path / "results/accounting/jobs", run=run_of(tmp_path, cfg, profile), workdir=tmp_path)
    recs = records(prefix)
    assert sorted(a.job_id for a in allocs) == sorted(r["JobID"] for r in recs)
    assert sum(a.gpus * a.elapsed_s for a in allocs) == sum(gres_gpus(r["AllocTRES"]) * parse_elapsed(r["Elapsed"])
                                                           for r in recs)
    cancelled = next(a for a in allocs if a.job_id == victim["JobID"])
    assert cancelled.state.startswith("CANCELLED") and cancelled.gpus == 1
    assert [u.rule for u in cancelled.stages][0] == "stitch"     # the record its finished stitch wrote
    before = {r["JobID"] for r in records(prefix)}
    _rerun(tmp_path, cfg, profile)
    new = [r for r in records(prefix) if r["JobID"] not in before]
    assert sorted((r["rule"], r["cycle"]) for r in new) == sorted([("+".join(lost), "cyc002"), ("registration", "")])
    assert _digests(tmp_path / "results") == _digests(reference)


def test_hard_killed_job_partial_files_cleaned_and_recomputed(slurm_cluster, four_cycles, tmp_path):
    raw, reference = four_cycles
    prefix, profile, cfg, coord = _start_run(tmp_path, raw, "h")
    _wait(lambda: any(j["State"] == "RUNNING" for j in _my_jobs(prefix)), what="a running job")
    os.kill(coord.pid, signal.SIGKILL)   # the coordinator and ...
    coord.wait()
    for pid_dir in Path("/proc").iterdir():  # ... the jobs' own processes, hard
        if pid_dir.name.isdigit():
            try:
                cmd = (pid_dir / "cmdline").read_bytes()
                if b"snakemake" in cmd and str(tmp_path).encode() in cmd:
                    os.kill(int(pid_dir.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass
    # a half-written file where a killed job was writing (what a non-atomic writer would leave)
    incomplete = tmp_path / ".snakemake" / "incomplete"
    markers = list(incomplete.iterdir()) if incomplete.is_dir() else []
    assert markers, "the killed jobs left Snakemake's incomplete markers"
    partial = tmp_path / base64.urlsafe_b64decode(markers[0].name.encode()).decode()
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"II*\x00half")
    plain = subprocess.run(snakemake_cmd(tmp_path, cfg, "registration", profile), capture_output=True, text=True)
    assert plain.returncode != 0 and "locked" in plain.stdout + plain.stderr  # the dead coordinator's lock
    _rerun(tmp_path, cfg, profile)
    assert _digests(tmp_path / "results") == _digests(reference)


def test_cancel_leaves_other_working_directories_alone(slurm_cluster, tmp_path, small_synth):
    prefix = f"plexgpu-c{uuid.uuid4().hex[:8]}"
    profile = profile_with_prefix(tmp_path, prefix)
    other = tmp_path / "other"
    other.mkdir()
    mine = tmp_path / "mine"
    mine.mkdir()
    cfg = write_config(mine, small_synth[0])
    run = run_prefix(prefix, mine / "results", mine)
    def sub(d):
        return subprocess.run(["sbatch", "--parsable", "-A", "clive", "-p", "hpg-turin", "-J",
                                        f"{run}_run", "--chdir", str(d), "-o", "/dev/null", "--mem", "100",
                                        "--wrap", "sleep 120"], capture_output=True, text=True, check=True).stdout.strip()
    mine_id, other_id = sub(mine), sub(other)
    try:
        res = _plexgpu("cancel", "--configfile", str(cfg), "-d", str(mine), "--profile", str(profile))
        assert res.returncode == 0, res.stderr
        assert f"cancelled job {mine_id}" in res.stdout and other_id not in res.stdout
        left = {j["JobID"] for j in squeue_jobs()}
        assert mine_id not in left and other_id in left
    finally:
        subprocess.run(["scancel", mine_id, other_id])


def test_two_data_sets_from_one_checkout_cancel_one_the_other_finishes(slurm_cluster, four_cycles, tmp_path):
    """Data sets A and B run from the same working directory and profile: `plexgpu cancel` for A
    cancels A's jobs only; B finishes with B's results; `plexgpu rerun` for A is not refused because
    B's coordinator is alive, and completes A."""
    raw, reference = four_cycles
    prefix = f"plexgpu-t{uuid.uuid4().hex[:8]}"
    profile = profile_with_prefix(tmp_path, prefix)
    cfg_a = write_config(tmp_path, raw, name="a.yaml", results="results_a", deconvolution=DECON)
    cfg_b = write_config(tmp_path, raw, name="b.yaml", results="results_b", deconvolution=DECON)
    run_a, run_b = run_of(tmp_path, cfg_a, profile), run_of(tmp_path, cfg_b, profile)
    assert run_a != run_b
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 60))
    # started as from `&` or nohup in a script: SIGINT ignored (Python keeps it so)
    coords = {k: subprocess.Popen(snakemake_cmd(tmp_path, c, "registration", profile), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
              for k, c in (("a", cfg_a), ("b", cfg_b))}
    def jobs_of(run):
        return [j for j in squeue_jobs() if j["JobName"].startswith(run + "_")]
    _wait(lambda: jobs_of(run_a) and jobs_of(run_b), what="both data sets with jobs in squeue")
    res = _plexgpu("cancel", "--configfile", str(cfg_a), "-d", str(tmp_path), "--profile", str(profile))
    assert res.returncode == 0, res.stdout + res.stderr
    assert not jobs_of(run_a)
    # cancelled, not waited for: on SIGTERM alone Snakemake lets its running jobs finish first (30 RL
    # iterations here; a GPU cycle for real: many minutes), and SIGINT alone is ignored by a coordinator
    # started in the background: either way cancel timed out or A's jobs ended COMPLETED
    states = {j["JobID"]: j["State"] for j in sacct_jobs(start=started) if j["JobName"].startswith(run_a + "_")}
    assert any(s.startswith("CANCELLED") for s in states.values()), states
    # A's live coordinator was stopped first (it would have submitted A's next job once its jobs were cancelled)
    assert f"stopping this data set's coordinator first: PID {coords['a'].pid}" in res.stdout, res.stdout
    assert coords["a"].poll() is not None and coords["a"].returncode != 0
    assert str(coords["b"].pid) not in res.stdout and coords["b"].poll() in (None, 0)      # B's left alone
    assert coords["b"].poll() is None or coords["b"].returncode == 0
    res = _plexgpu("rerun", "registration", "--configfile", str(cfg_a), "-d", str(tmp_path), "--profile",
                   str(profile), "--", *TEST_FLAGS)
    assert res.returncode == 0 and "refused" not in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
    assert coords["b"].wait(timeout=600) == 0
    for results in ("results_a", "results_b"):
        assert _digests(tmp_path / results) == _digests(reference), results


def test_rerun_of_a_killed_data_set_leaves_two_live_ones_locked_and_running(slurm_cluster, four_cycles, tmp_path):
    """Three data sets from one checkout; C's coordinator is killed and `plexgpu rerun` recovers it while
    A and B run. Snakemake's --unlock (what rerun ran) deleted every lock in the folder, A's and B's too,
    and a run that ended did the same: now A's and B's locks stay as long as they run, all three finish
    with the reference results."""
    from plexgpu.cluster.locks import stale_locks

    raw, reference = four_cycles
    prefix = f"plexgpu-l{uuid.uuid4().hex[:8]}"
    profile = profile_with_prefix(tmp_path, prefix)
    cfgs = {k: write_config(tmp_path, raw, name=f"{k}.yaml", results=f"results_{k}", deconvolution=DECON)
            for k in "abc"}
    runs = {k: run_of(tmp_path, c, profile) for k, c in cfgs.items()}
    coords = {k: subprocess.Popen(snakemake_cmd(tmp_path, c, "registration", profile), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for k, c in cfgs.items()}

    def jobs_of(k):
        return [j for j in squeue_jobs() if j["JobName"].startswith(runs[k] + "_")]
    _wait(lambda: all(jobs_of(k) for k in "abc"), what="three data sets with jobs in squeue")
    os.kill(coords["c"].pid, signal.SIGKILL)
    coords["c"].wait()
    assert all(stale_locks(tmp_path, tmp_path / f"results_{k}") for k in "abc")      # each run's lock files
    rerun_c = subprocess.Popen([sys.executable, "-m", "plexgpu.cli", "rerun", "registration", "--configfile",
                                str(cfgs["c"]), "-d", str(tmp_path), "--profile", str(profile), "--", *TEST_FLAGS],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    # once C's rerun has removed C's stale lock and started again, A's and B's locks are still there while they run
    _wait(lambda: not stale_locks(tmp_path, tmp_path / "results_c") or rerun_c.poll() is not None, what="rerun start")
    checked = 0
    for k in "ab":
        if coords[k].poll() is None:
            assert stale_locks(tmp_path, tmp_path / f"results_{k}"), f"the live data set {k} lost its lock"
            checked += 1
    assert checked, "A and B had both finished before C's rerun began: nothing was checked"
    out = rerun_c.communicate(timeout=900)[0]
    assert rerun_c.returncode == 0, out[-3000:]
    assert "removed the stale lock of this data set's killed coordinator" in out and "other data sets' locks kept" in out
    for k in "ab":
        assert coords[k].wait(timeout=900) == 0
    for k in "abc":
        assert _digests(tmp_path / f"results_{k}") == _digests(reference), k
