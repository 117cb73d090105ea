"""The run manifest: a SLURM job's parse reads what the coordinator resolved, and notices a change."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from plexgpu import experiment, manifest
from plexgpu.cluster import slurm
from plexgpu.config import validate_config
from plexgpu.io.raw import RawDataError, tile_filename
from workflow_api import plan, run


def _config(tmp_path, raw, **extra):
    """A validated config as each parse of the Snakefile makes it from the same config file."""
    return validate_config(copy.deepcopy({"raw_dir": str(raw), "results_dir": str(tmp_path / "results"),
                                          "compute": {"device": "cpu"}, **extra}))


def _no_resolving(*_a, **_k):
    raise AssertionError("the job resolved the raw data again instead of reading the manifest")


def test_a_job_reads_the_coordinators_manifest_and_asks_slurm_nothing(tmp_path, small_synth, monkeypatch):
    accounts = [{"name": "clive", "gpu_slots": "auto"}]
    monkeypatch.setattr(slurm, "gpu_limit", lambda account, user=None: (3, "association GrpTRES"))
    coordinator = _config(tmp_path, small_synth[0], accounts=accounts)
    exp, key = manifest.resolve_run(coordinator, coordinator=True)
    assert coordinator["accounts"][0]["gpu_slots"] == 3
    manifest.write_manifest(coordinator, key, exp)
    # the job's parse: same config files, so the same validated config with gpu_slots still "auto"
    monkeypatch.setattr(slurm, "gpu_limit", lambda *a, **k: pytest.fail("a job asked sacctmgr"))
    monkeypatch.setattr(manifest, "resolve_experiment", _no_resolving)
    job = _config(tmp_path, small_synth[0], accounts=accounts)
    found, job_key = manifest.resolve_run(job, coordinator=False)
    assert job_key == key and found.cycle_keys == exp.cycle_keys == ["cyc001", "cyc002", "cyc003"]
    assert found.inventories.keys() == exp.inventories.keys() and found.channels == exp.channels
    assert job["accounts"][0]["gpu_slots"] == 3


def test_a_changed_raw_folder_or_config_is_resolved_again(tmp_path, small_synth):
    raw = tmp_path / "raw"
    shutil.copytree(small_synth[0], raw)
    cfg = _config(tmp_path, raw)
    exp, key = manifest.resolve_run(cfg, coordinator=True)
    manifest.write_manifest(cfg, key, exp)
    other = _config(tmp_path, raw, cycles=[1, 2])
    assert manifest.resolve_run(other, coordinator=False)[0].cycle_keys == ["cyc001", "cyc002"]
    (raw / "cyc002_reg001" / tile_filename(1, 4, 2, 1)).unlink()     # the folder's mtime moves on
    with pytest.raises(RawDataError, match="1_00004_Z002_CH1.tif"):
        manifest.resolve_run(_config(tmp_path, raw), coordinator=False)


def test_a_half_written_manifest_is_not_trusted(tmp_path, small_synth, monkeypatch):
    cfg = _config(tmp_path, small_synth[0])
    path = manifest.manifest_path(cfg)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x80\x04truncated")
    calls = []
    monkeypatch.setattr(manifest, "resolve_experiment",
                        lambda c: calls.append(1) or experiment.resolve_experiment(c))
    assert manifest.resolve_run(cfg, coordinator=False)[0].cycle_keys == ["cyc001", "cyc002", "cyc003"]
    assert calls == [1]


def test_written_when_a_run_starts_never_on_a_dry_run(tmp_path, small_synth):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "results_dir": str(tmp_path / "results"),
                                   "compute": {"device": "cpu"}, "cycles": [1]}))
    plan(tmp_path, cfg)
    assert not (tmp_path / "results").exists()
    run(tmp_path, cfg, targets=(str(tmp_path / "results/stitched/cyc001/CH1.ome.tif"),))
    config = validate_config(yaml.safe_load(cfg.read_text()))
    found = manifest.read_manifest(config, manifest.run_key(config))
    assert found is not None and found.experiment.cycle_keys == ["cyc001"]
