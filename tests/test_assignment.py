"""Cycle -> GPU account assignment."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from plexgpu.cluster.assignment import (AssignmentError, build_cycle_assignment, check_known_accounts,
                                registration_slot, total_slots)

ACCOUNTS = [{"name": "clive", "gpu_slots": 3, "partition": "hpg-b200"},
            {"name": "maigan", "gpu_slots": 2, "partition": "hpg-turin"}]
#: requests every node of a partition holds (the test cluster's too): plan and validate exit 3 otherwise
FITS = {r: {"cpus_per_task": 1, "mem_mb": 400, "runtime": 10} for r in ("stitch", "deconvolve", "edf", "registration")}
CYCLES = [f"cyc{c:03d}" for c in range(1, 10)]


def test_nine_cycles_round_robin_in_proportion_to_slots():
    a = build_cycle_assignment(CYCLES, ACCOUNTS)
    clive = [c for c, s in a.items() if s.account == "clive"]
    maigan = [c for c, s in a.items() if s.account == "maigan"]
    assert clive == ["cyc001", "cyc002", "cyc003", "cyc006", "cyc007", "cyc008"]
    assert maigan == ["cyc004", "cyc005", "cyc009"]
    assert all(s.partition == "hpg-b200" for c, s in a.items() if c in clive)
    assert registration_slot(ACCOUNTS).account == "clive"
    assert total_slots(ACCOUNTS) == 5


def test_pure_and_order_independent():
    shuffled = list(reversed(CYCLES))
    assert build_cycle_assignment(shuffled, ACCOUNTS) == build_cycle_assignment(CYCLES, ACCOUNTS)


def test_zero_slot_account_skipped_and_no_slots_is_an_error():
    a = build_cycle_assignment(CYCLES, [{"name": "idle", "gpu_slots": 0}, ACCOUNTS[1]])
    assert {s.account for s in a.values()} == {"maigan"}
    for accounts in ([], [{"name": "idle", "gpu_slots": 0}]):
        with pytest.raises(AssignmentError, match="config key accounts"):
            build_cycle_assignment(CYCLES, accounts)


def test_unknown_account_named():
    with pytest.raises(AssignmentError, match="no account nosuch"):
        check_known_accounts([{"name": "nosuch", "gpu_slots": 1}], {"clive", "maigan"})
    check_known_accounts(ACCOUNTS, None)  # SLURM cannot be asked: nothing to check


def test_plan_prints_table_total_and_command(tmp_path, small_synth):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": ACCOUNTS, "resources": FITS}))
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "cyc003" in res.stdout and "clive" in res.stdout and "maigan" in res.stdout
    main_line, qc_line = res.stdout.strip().splitlines()[-2:]
    from plexgpu.cluster.rerun import run_prefix

    run = run_prefix("plexgpu", Path("results"), Path.cwd())       # results_dir default, relative to here
    logs = Path("results").resolve() / "logs" / "slurm"
    assert main_line == (f"snakemake registration --configfile {cfg} --profile profiles/slurm --slurm-jobname-prefix "
                         f"{run} --slurm-logdir {logs} -j 5")
    # QC with the same prefix and log folder: its jobs are this data set's, never another's rerun's blocker
    assert qc_line == (f"snakemake qc --configfile {cfg} --profile profiles/slurm --slurm-jobname-prefix {run} "
                       f"--slurm-logdir {logs} -j 3")
    assert re.fullmatch(r"plexgpu-[0-9a-f]{8}", run)


def test_plan_zero_slots_fails_naming_key(tmp_path, small_synth):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": [{"name": "clive", "gpu_slots": 0}]}))
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "config key accounts" in res.stderr


def test_plan_j_is_the_slurm_limits_not_the_gpus_free_now(tmp_path, small_synth, monkeypatch, capsys):
    """A second data set planned while a first holds 4 of 5 GPUs: -j stays 5 (its extra jobs pend in SLURM
    and start as GPUs free up); it had been -j 1 for the whole run."""
    from plexgpu import cli
    from plexgpu.cluster import slurm

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": ACCOUNTS, "resources": FITS}))
    monkeypatch.setattr(slurm, "gpus_in_use", lambda: {a["name"]: a["gpu_slots"] for a in ACCOUNTS[:1]})
    monkeypatch.setattr(slurm, "gpu_limit", lambda name, user=None: (None, ""))
    monkeypatch.setattr(slurm, "user_accounts", lambda: None)
    assert cli.main(["plan", "--configfile", str(cfg)]) == 0
    out = capsys.readouterr().out
    total = sum(a["gpu_slots"] for a in ACCOUNTS)
    assert out.strip().splitlines()[-2].endswith(f"-j {total}")
    assert f"{ACCOUNTS[0]['gpu_slots']} of the {total} GPU slots are held now" in " ".join(out.split())


def test_plan_predicts_each_stages_gpu_memory_against_the_partitions_gpu(tmp_path, small_synth, monkeypatch,
                                                                          capsys):
    """The peak device memory of each GPU stage for this data (the model bench/gpu_budget.py checks under
    the stand-in), against the memory of the partition's GPU from sinfo's GRES type; one warning line
    naming the key where a stage does not fit; an unknown type says so."""
    from plexgpu import cli, gpu_memory
    from plexgpu.cluster import slurm

    assert gpu_memory.device_bytes("h200") == 141e9 and gpu_memory.device_bytes("a100_3g.40gb") == 40e9
    assert gpu_memory.device_bytes("nvidia_h100_sxm5") is None and gpu_memory.device_bytes("h100-sxm") == 80e9
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": ACCOUNTS}))
    types = {"hpg-b200": ["h200"], "hpg-turin": ["a100_1g.5gb", "mystery"]}
    monkeypatch.setattr(slurm, "partition_limits", lambda part: {"cpus": 64, "mem_mb": 10**6, "gpus": 8,
                                                                 "time_min": None, "gpu_types": types[part]})
    monkeypatch.setattr(slurm, "gpus_in_use", lambda: {})
    monkeypatch.setattr(slurm, "gpu_limit", lambda name, user=None: (None, ""))
    monkeypatch.setattr(slurm, "user_accounts", lambda: None)
    monkeypatch.setattr(gpu_memory, "STITCH_BUFFERS", 2e4)          # a stitch too large for a 5 GB MIG slice
    assert cli.main(["plan", "--configfile", str(cfg)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU h200 (141 GB): " in out and "GPU a100_1g.5gb (5 GB)" in out
    assert "GPU mystery: memory not known" in out
    mosaic = tuple(int(v) for v in re.search(r"mosaic (\d+)x(\d+)", out).groups())
    reg = gpu_memory.registration_peak(mosaic, 128) / 1e9
    assert f"│ registration │ {reg:.1f} GB │ one job for all cycles" in out
    stitch = gpu_memory.stitch_peak(9, 5 * 2, 128) / 1e9
    assert (f"warning: stitch needs {stitch:.1f} GB of GPU memory but partition hpg-turin's GPU a100_1g.5gb has 5 GB: "
            "lower basic.working_size") in out
    assert "partition hpg-b200's GPU h200" not in out                 # it fits there


def test_validate_shows_the_slots_table_the_readme_promises(tmp_path, small_synth, monkeypatch, capsys):
    from plexgpu import cli
    from plexgpu.cluster import slurm

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": ACCOUNTS}))
    monkeypatch.setattr(slurm, "gpus_in_use", lambda: {"clive": 1})
    monkeypatch.setattr(slurm, "gpu_limit", lambda name, user=None: (2, "association GrpTRES") if name == "clive"
                        else (None, ""))
    monkeypatch.setattr(slurm, "partition_limits", lambda part: None)
    assert cli.main(["validate", "--configfile", str(cfg)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU slots per account" in out and "2 (association GrpTRES)" in out
    assert "account clive: gpu_slots 3 but SLURM lets you hold 2" in out


def test_validate_and_plan_exit_3_for_a_request_sbatch_refuses(tmp_path, small_synth, monkeypatch, capsys):
    """A request no node of the partition can hold is an error, not a warning: validate and plan say it
    as one line naming the key and exit 3 (they exited 0 and the run's first jobs were refused); one
    that fits exits 0."""
    from plexgpu import cli
    from plexgpu.cluster import slurm

    limits = lambda part: {"cpus": 8, "mem_mb": 16000, "gpus": 2, "time_min": None, "gpu_types": []}  # noqa: E731
    monkeypatch.setattr(slurm, "partition_limits", limits)
    monkeypatch.setattr(slurm, "gpus_in_use", lambda: {})
    monkeypatch.setattr(slurm, "gpu_limit", lambda name, user=None: (None, ""))
    monkeypatch.setattr(slurm, "user_accounts", lambda: None)
    small = {r: {"cpus_per_task": 2, "mem_mb": 8000, "runtime": 30} for r in ("stitch", "deconvolve", "edf",
                                                                            "registration")}
    cfg = tmp_path / "c.yaml"
    for mem, status in ((8000, 0), (32000, 3)):
        cfg.write_text(yaml.safe_dump({"raw_dir": str(small_synth[0]), "accounts": ACCOUNTS,
                                       "resources": {**small, "stitch": {**small["stitch"], "mem_mb": mem}}}))
        for command in ("validate", "plan"):
            assert cli.main([command, "--configfile", str(cfg)]) == status, command
            out = " ".join(capsys.readouterr().out.split())
            refused = "error: resources.stitch.mem_mb = 32000 but the largest node of partition"
            assert (refused in out) == bool(status) and ("(exit 3)" in out) == bool(status), out[-800:]
