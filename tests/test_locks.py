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
