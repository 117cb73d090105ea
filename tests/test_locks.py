"""Snakemake's locks kept per data set in one working directory (plexgpu.cluster.locks)."""

from __future__ import annotations

import yaml

from plexgpu.cluster.locks import lock_folder, remove_stale_locks, stale_locks
from workflow_api import run


def _lock(workdir, name, files):
    folder = lock_folder(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(files) + "\n")
    return folder / name


def test_a_rerun_removes_its_own_data_sets_stale_locks_only(tmp_path):
    mine = [_lock(tmp_path, "0.output.lock", ["results_a/stitched/cyc001/CH1.ome.tif"]),
            _lock(tmp_path, "0.input.lock", ["/data/raw/cyc001_reg001", "results_a/stitched/cyc001/planes.json"]),
            _lock(tmp_path, "2.output.lock", [str(tmp_path / "results_a/registered/plex.ome.tif")])]   # absolute
    theirs = [_lock(tmp_path, "1.output.lock", ["results_b/stitched/cyc001/CH1.ome.tif"]),
              _lock(tmp_path, "1.input.lock", ["/data/raw/cyc001_reg001", "results_b/edf/cyc001/CH1.ome.tif"]),
              _lock(tmp_path, "3.output.lock", ["results_ab/qc/index.html"])]       # a prefix is not a folder
    assert stale_locks(tmp_path, tmp_path / "results_a") == sorted(mine)
    assert sorted(remove_stale_locks(tmp_path, "results_a")) == sorted(mine)
    assert all(p.exists() for p in theirs) and not any(p.exists() for p in mine)


def test_a_run_that_ends_keeps_another_data_sets_lock(tmp_path, small_synth):
    """Snakemake removed the whole lock folder when a run ended: a second data set's live coordinator
    was left unlocked."""
    other = _lock(tmp_path, "0.output.lock", [str(tmp_path / "results_b/stitched/cyc001/CH1.ome.tif")])
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "results_dir": str(tmp_path / "results_a"),
                                   "compute": {"device": "cpu"}}))
    run(tmp_path, cfg, targets=("qc",), cores=1)               # a real run: it locks, works and unlocks
    assert (tmp_path / "results_a/qc/index.html").is_file()
    assert other.read_text().strip() == str(tmp_path / "results_b/stitched/cyc001/CH1.ome.tif")
    assert sorted(p.name for p in lock_folder(tmp_path).iterdir()) == ["0.output.lock"]   # its own are gone


def _fake_coordinator():
    import subprocess
    import sys

    import time
    from pathlib import Path

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "snakemake", "registration"])
    for _ in range(100):                                  # until it has exec'd: its command line is its own
        if b"snakemake" in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            break
        time.sleep(0.02)
    return proc


def test_one_coordinator_per_data_set_wherever_it_was_started(tmp_path, small_synth):
    """Snakemake's lock is per working directory: the same data set started from a second folder ran every
    GPU job twice. A live claim refuses a run with GPU jobs in one line naming it, before any job; a run
    with no GPU job (QC) is not refused; a claim whose coordinator is gone is taken over."""
    import json
    import os
    import socket

    import pytest

    from plexgpu import paths
    from plexgpu.cluster.locks import DataSetBusy, claim_data_set, release_data_set

    results = tmp_path / "results"
    claim = results / paths.COORDINATOR
    claim.parent.mkdir(parents=True)
    other = _fake_coordinator()
    try:
        claim.write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(), "workdir": "/elsewhere",
                                     "started": 0}))
        with pytest.raises(DataSetBusy) as err:
            claim_data_set(results)
        assert f"PID {other.pid} on host {socket.gethostname()}" in str(err.value) and "/elsewhere" in str(err.value)
        cfg = tmp_path / "config.yaml"
        cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "results_dir": str(results),
                                       "compute": {"device": "cpu"}}))
        with pytest.raises(Exception, match="being made by another coordinator"):
            run(tmp_path, cfg, targets=("registration",), cores=1)
        assert not (results / "stitched").exists()                    # stopped before any job
        run(tmp_path, cfg, targets=("qc",), cores=1)                    # QC runs no GPU job: not refused
        assert json.loads(claim.read_text())["pid"] == other.pid        # ... and leaves the claim alone
    finally:
        other.kill()
        other.wait()
    assert claim_data_set(results) == claim and json.loads(claim.read_text())["pid"] == os.getpid()   # gone: taken
    release_data_set(results)
    assert not claim.exists()
