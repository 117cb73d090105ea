"""The config schema: defaults filled from the one schema, mistakes named by key."""

import subprocess
import sys

import pytest
import yaml

from plexgpu.config import ConfigError, load_config, validate_config
from conftest import REPO


def test_defaults_come_from_schema():
    cfg = validate_config({"raw_dir": "x"})
    assert cfg["compute"]["device"] == "gpu"
    assert cfg["basic"]["working_size"] == 128
    assert cfg["basic"]["flatfield_min"] == 0.1
    assert cfg["grid"]["order"] == "snake"
    assert cfg["resources"]["qc"]["cpus_per_task"] == 2


def test_partial_rule_resources_get_the_rest_filled():
    cfg = validate_config({"raw_dir": "x", "resources": {"stitch": {"cpus_per_task": 8}}})
    assert cfg["resources"]["stitch"] == {"cpus_per_task": 8, "mem_mb": 32000, "runtime": 60}


@pytest.mark.parametrize("bad,key", [
    ({"raw_dir": "x", "basic": {"max_iteration": 3}}, "basic.max_iteration"),
    ({"raw_dir": "x", "grid": {"rows": "three"}}, "grid.rows"),
    ({"raw_dir": "x", "compute": {"device": "tpu"}}, "compute.device"),
    ({"raw_dir": "x", "accounts": [{"name": "clive;rm -rf /", "gpu_slots": 3}]}, "accounts.0.name"),
    ({"raw_dir": "x", "accounts": [{"name": "clive", "gpu_slots": 3, "partition": "a b"}]}, "accounts.0.partition"),
    ({"raw_dir": "x", "resources": {"stich": {"cpus_per_task": 2}}}, "resources.stich"),
    ({"results_dir": "x"}, "raw_dir"),
])
def test_schema_rejects_with_key_named(bad, key):
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    msg = str(err.value)
    assert key in msg and "\n" not in msg


def test_emission_keys_may_be_ints():
    cfg = validate_config({"raw_dir": "x", "optics": {"emission_nm": {1: 461, 2: 520}}})
    assert cfg["optics"]["emission_nm"] == {"1": 461, "2": 520}


def test_example_configs_are_valid():
    for name in ("config.yaml", "demo.yaml"):
        cfg = load_config([REPO / "config" / name])
        assert cfg["raw_dir"]
    demo = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    assert demo["compute"]["device"] == "cpu"  # written explicitly, never chosen automatically
    real = load_config([REPO / "config" / "config.yaml"])
    assert [(a["name"], a["gpu_slots"]) for a in real["accounts"]] == [("clive", 3), ("maigan", 2)]
    assert real["compute"]["device"] == "gpu"


def test_later_configfile_wins(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("raw_dir: one\nbasic: {working_size: 64, darkfield: false}\n")
    b.write_text("raw_dir: two\nbasic: {working_size: 32}\n")
    cfg = load_config([a, b])
    assert cfg["raw_dir"] == "two" and cfg["basic"]["working_size"] == 32
    assert cfg["basic"]["darkfield"] is False


def test_cli_validate_exit_2_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("raw_dir: x\nbasic: {max_iteration: 3}\n")
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "validate", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "basic.max_iteration" in res.stderr


def test_library_defaults_are_the_schemas(small_synth):
    """The schema is the one place for defaults: every keyword default the library keeps for direct
    callers (BasicParams, the EDF's radius and sigma, the PSF model) equals the schema's default for
    that config key."""
    import dataclasses
    import inspect

    from plexgpu.image import basic, edf, psf
    from plexgpu.config import validate_config

    cfg = validate_config({"raw_dir": str(small_synth[0])})
    for f in dataclasses.fields(basic.BasicParams):
        assert f.default == cfg["basic"][f.name], f"BasicParams.{f.name}"
    sig = inspect.signature(edf.extended_depth_of_field).parameters
    assert (sig["radius"].default, sig["sigma"].default) == (cfg["edf"]["radius"], cfg["edf"]["sigma"])
    model = {f.name: f.default for f in dataclasses.fields(psf.Optics)}["model"]
    assert model == cfg["deconvolution"]["psf_model"]


def test_a_cycle_job_longer_than_the_partition_allows_is_said_before_any_job(monkeypatch):
    """A cycle's three stages share one allocation, which asks for the sum of their runtimes: each
    stage fits a 2-hour partition, the cycle's job does not."""
    from plexgpu.cluster import requests

    monkeypatch.setattr(requests.slurm, "partition_limits",
                        lambda part: {"cpus": 64, "mem_mb": 512000, "gpus": 8, "time_min": 120.0})
    cfg = validate_config({"raw_dir": "/raw", "accounts": [{"name": "clive", "gpu_slots": 2, "partition": "gpu"}],
                           "resources": {"stitch": {"runtime": 60}, "deconvolve": {"runtime": 90},
                                         "edf": {"runtime": 30}}})
    (line,), warnings = requests.request_refusals(cfg)
    assert not warnings
    assert "stitch + deconvolve + edf in one allocation" in line and "60 + 90 + 30 = 180 min" in line
    assert "partition gpu's time limit (120 min)" in line
    cfg["resources"]["deconvolve"]["runtime"] = 30
    assert requests.request_problems(cfg) == []
    # two accounts on one partition: each warning said once, not once per account
    cfg["accounts"].append({"name": "maigan", "gpu_slots": 1, "partition": "gpu"})
    cfg["resources"]["stitch"]["mem_mb"] = 600000
    (line,), _ = requests.request_refusals(cfg)
    assert line.startswith("resources.stitch.mem_mb = 600000 but the largest node of partition gpu")
