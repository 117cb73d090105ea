"""Bad input, as an adversarial new user gives it: every case refused before a GPU is requested,
in one line naming the file or config key, with nothing written and nothing lost."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tifffile

from plexgpu.cli import main
from plexgpu.config import ConfigError, validate_config
from plexgpu.experiment import resolve_experiment
from plexgpu.io.raw import RawDataError, tile_filename
from plexgpu.io.tiff import DiskFullError, TiffReadError, ome_writer, write_ome, write_text_atomic


def _cycle(folder: Path, tiles=4, z=3, channels=(1, 2), shape=(16, 16)):
    folder.mkdir(parents=True)
    for t in range(1, tiles + 1):
        for zz in range(1, z + 1):
            for ch in channels:
                tifffile.imwrite(folder / tile_filename(1, t, zz, ch), np.full(shape, 100 + t, np.uint16))


def _config(raw: Path, **kw) -> dict:
    cfg = {"raw_dir": str(raw), "results_dir": str(raw.parent / "results"),
           "grid": {"rows": 2, "cols": 2, "overlap": 0.3}, "optics": {"pixel_size_um": 0.377, "z_step_um": 1.5}}
    for k, v in kw.items():
        cfg[k] = v
    return validate_config(cfg)


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def _listing(folder: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ raw files that are not whole
@pytest.mark.parametrize("damage, expect", [
    ("truncate", r"1_00002_Z001_CH1.tif: truncated: its pixel data end at byte \d+ but the file has \d+ \(1 more"),
    ("pages", r"1_00002_Z001_CH1.tif: holds 3 pages; one plane per file is expected"),
])
def test_validate_proves_every_raw_tiff_whole(tmp_path, damage, expect):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    bad = raw / "cyc001_reg001" / tile_filename(1, 2, 1, 1)
    if damage == "truncate":
        for p in (bad, raw / "cyc001_reg001" / tile_filename(1, 3, 2, 2)):
            p.write_bytes(p.read_bytes()[:-100])
    else:
        tifffile.imwrite(bad, np.zeros((3, 16, 16), np.uint16), photometric="minisblack")   # 3 pages
    before = _listing(raw)
    with pytest.raises(TiffReadError) as err:
        resolve_experiment(_config(raw), read_headers=True)
    assert __import__("re").search(expect, _one_line(err)), str(err.value)
    assert _listing(raw) == before


def test_validate_reads_5000_files_fast_enough(tmp_path):
    """bench/validate.py measures files per second at scale; here: a whole cycle is checked."""
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001", tiles=4, z=5, channels=(1, 2, 3, 4))
    exp = resolve_experiment(_config(raw), read_headers=True, workers=4)
    assert exp.tile_shape == (16, 16)


# ------------------------------------------------------------------ disk full
def test_disk_full_while_writing_a_stack_is_one_line_and_leaves_no_part(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    out = tmp_path / "res" / "CH1.ome.tif"
    with pytest.raises(DiskFullError) as err:
        with ome_writer(out, (4, 64, 64), np.float32, "ZYX") as stack:    # blocks allocated before any region
            stack[0] = 1.0
    assert "no space left on" in _one_line(err) and "needed" in str(err.value)
    assert not list(out.parent.iterdir())                  # no half file, no .part


def test_disk_full_in_a_job_is_one_line_and_an_accounting_record(tmp_path):
    from plexgpu.cluster.accounting import load_records
    from plexgpu.job import job_context

    def fill(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with pytest.raises(SystemExit) as err:
        with job_context("stitch", str(tmp_path / "job.log"), {"cpus_per_task": 1}, "cpu", str(tmp_path / "acct"),
                         "cyc001"):
            fill(tmp_path / "results" / "x.tif")
    msg = str(err.value)
    assert msg.startswith("stitch: no space left on") and "\n" not in msg
    records = load_records(tmp_path / "acct")
    assert len(records) == 1 and records[0]["status"] == "failed" and "no space left" in records[0]["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_disk_full_on_a_real_small_file_system(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(DiskFullError) as err:
            noise = np.random.default_rng(0).random((8, 512, 512), np.float32)       # 8 MB, incompressible
            write_ome(mnt / "big.ome.tif", noise, "ZYX")                                 # on 1 MB
        assert "no space left on" in _one_line(err)
        assert not list(mnt.iterdir())
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# ------------------------------------------------------------------ experiment.json and optics
@pytest.mark.parametrize("key, value, config_key", [
    ("tileOverlapX", 150, "grid.overlap"), ("tileOverlapX", -0.3, "grid.overlap"),
    ("xyResolution", 0, "optics.pixel_size_um"), ("xyResolution", -377, "optics.pixel_size_um"),
    ("numCycles", 0, "cycles"), ("numCycles", -1, "cycles"), ("regionWidth", 0, "grid.cols"),
])
def test_experiment_json_values_obey_the_schema(tmp_path, key, value, config_key):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "experiment.json").write_text(json.dumps({key: value}))
    cfg = validate_config({"raw_dir": str(raw), "results_dir": str(tmp_path / "res"),
                           "grid": {"rows": 2, "cols": 2} if key != "regionWidth" else {"rows": 2, "overlap": 0.3},
                           "optics": {"z_step_um": 1.5} if key == "xyResolution" else
                           {"pixel_size_um": 0.377, "z_step_um": 1.5}})
    if key != "tileOverlapX" and key != "regionWidth":
        cfg["grid"]["overlap"] = 0.3
    with pytest.raises(RawDataError) as err:
        resolve_experiment(cfg)
    msg = _one_line(err)
    assert "experiment.json" in msg and key in msg and f"config key {config_key}" in msg


def test_impossible_optics_refused_at_validate(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw, optics={"pixel_size_um": 0.377, "z_step_um": 1.5, "na": 1.3,
                                                "immersion_index": 1.0}))
    assert "optics.na = 1.3 must be below optics.immersion_index = 1.0" in _one_line(err)


# ------------------------------------------------------------------ where results go; what synth writes
@pytest.mark.parametrize("inside", [".", "results", "a/b"])
def test_results_inside_raw_refused(tmp_path, inside):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw, results_dir=str(raw / inside)))
    assert "is inside raw_dir" in _one_line(err)


def test_synth_refuses_a_folder_that_holds_data(tmp_path, capsys):
    target = tmp_path / "data"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    assert main(["synth", str(target), "--cycles", "1", "--grid", "2x2", "--tile", "32x32", "--z", "3"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in target.iterdir()] == ["mine.txt"]
    assert main(["synth", str(target), "--cycles", "1", "--grid", "2x2", "--tile", "32x32", "--z", "3", "--force"]) == 0


@pytest.mark.parametrize("args, expect", [
    (["--grid", "3by3"], "--grid must be two positive integers like 3x3"),
    (["--tile", "0x10"], "--tile must be two positive integers"),
    (["--z", "0"], "--z must be at least 1"),
    (["--overlap", "1.5"], "--overlap must be a fraction"),
])
def test_synth_bad_arguments_one_line(tmp_path, capsys, args, expect):
    try:
        rc = main(["synth", str(tmp_path / "new"), *args])
    except SystemExit as exc:
        rc, msg = 2, str(exc)
    else:
        msg = capsys.readouterr().err
    assert rc == 2 and expect in msg and "Traceback" not in msg
    assert not (tmp_path / "new").exists()


def test_plan_bad_gpu_minutes_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "plan", "--simulate", "--configfile", "x.yaml",
                          "--gpu-minutes", "abc"], capture_output=True, text=True)
    assert res.returncode == 2
    assert "argument --gpu-minutes: 3 positive minutes, one per stage stitch,deconvolve,edf" in res.stderr
    assert "Traceback" not in res.stderr


# ------------------------------------------------------------------ marker names, messages, accounts
def test_channel_names_not_utf8_and_bom(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "channelNames.txt").write_bytes("DAPI\nCD3\xe9\n".encode("latin-1"))
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw))
    assert "channelNames.txt: not UTF-8 text" in _one_line(err)
    (raw / "channelNames.txt").write_bytes("\ufeffDAPI\nCD3\n".encode("utf-8"))
    assert resolve_experiment(_config(raw)).marker_names(1) == ["DAPI", "CD3"]


def test_cycles_from_experiment_json_named_as_such(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "experiment.json").write_text(json.dumps({"numCycles": 3}))
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw))
    msg = _one_line(err)
    assert "experiment.json numCycles" in msg and "config key cycles" not in msg


def test_one_stray_file_is_named_not_counted_as_missing(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    tifffile.imwrite(raw / "cyc001_reg001" / tile_filename(1, 2, 4, 1), np.zeros((16, 16), np.uint16))
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw))
    assert "1 file(s) beyond the 3 z-planes the other tiles have, first: 1_00002_Z004_CH1.tif" in _one_line(err)


def test_a_later_cycle_with_another_channel_refused(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    _cycle(raw / "cyc002_reg001", channels=(1, 2, 3))
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw))
    assert "cyc002_reg001: channel(s) CH3 not in the first cycle" in _one_line(err)


@pytest.mark.parametrize("accounts, expect", [
    ([{"name": "lab", "gpu_slots": 2}, {"name": "lab", "gpu_slots": 1}], "accounts: lab listed more than once"),
    ([{"name": "lab\n", "gpu_slots": 2}], "accounts.0.name = 'lab\\n': an account or partition name"),
    ([{"name": "lab; rm -rf", "gpu_slots": 2}], "letters, digits and _ . , - only"),
])
def test_accounts_named_once_and_plainly(tmp_path, accounts, expect):
    with pytest.raises(ConfigError) as err:
        validate_config({"raw_dir": str(tmp_path), "accounts": accounts})
    assert expect in _one_line(err)


def test_tables_keep_full_values_in_logs(small_synth, tmp_path):
    """validate's table in a SLURM log or a pipe (not a terminal): the resolved folder in full."""
    raw, _ = small_synth
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"raw_dir: {raw}\nresults_dir: {tmp_path / 'res'}\n")
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "validate", "--configfile", str(cfg)],
                         capture_output=True, text=True, env={**os.environ, "COLUMNS": "40"})
    assert res.returncode == 0, res.stderr
    assert "cyc001_reg001" in res.stdout and "…" not in res.stdout


def test_nothing_written_when_validate_refuses(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    write_text_atomic(raw / "note.txt", "x")
    before = _listing(tmp_path)
    with pytest.raises(RawDataError):
        resolve_experiment(_config(raw, optics={"pixel_size_um": 0.377, "z_step_um": 1.5, "na": 1.3}))
    assert _listing(tmp_path) == before


def test_gpu_slots_auto_without_a_slurm_limit_is_one_line(monkeypatch, small_synth):
    """gpu_slots: auto where SLURM cannot be asked (or sets no GPU limit): one line naming the key."""
    from plexgpu.cluster import slurm
    from plexgpu.config import ConfigError, validate_config

    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    config = validate_config({"raw_dir": str(small_synth[0]), "accounts": [{"name": "clive", "gpu_slots": "auto"}]})
    assert config["accounts"][0]["gpu_slots"] == "auto"         # validation asks no cluster
    with pytest.raises(ConfigError) as err:
        slurm.resolve_auto_slots(config)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("config key accounts[0].gpu_slots = auto") and "clive" in msg


# ------------------------------------------------------------------ the edges (#32): no crash, hang or unreadable file
def test_a_grid_far_larger_than_the_tiles_costs_what_the_files_cost(tmp_path):
    """regionWidth/regionHeight 3000 for 4 tiles: one line, in bounded time and memory (the missing files
    were listed one by one: 54 million names)."""
    import time
    import tracemalloc

    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "experiment.json").write_text(json.dumps({"regionWidth": 3000, "regionHeight": 3000, "tileOverlapX": 30}))
    cfg = validate_config({"raw_dir": str(raw), "results_dir": str(tmp_path / "res"),
                           "optics": {"pixel_size_um": 0.377, "z_step_um": 1.5}})
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(RawDataError) as err:
        resolve_experiment(cfg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    msg = _one_line(err)
    assert time.perf_counter() - t0 < 5 and peak < 50 * 2**20, (time.perf_counter() - t0, peak)
    assert "9000000 tiles but 4 tile numbers are present" in msg and "regionWidth" in msg


def test_control_characters_in_a_marker_name_are_removed_and_said(tmp_path, caplog):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "channelNames.txt").write_bytes(b"DAPI\nCD\x013\n")
    exp = resolve_experiment(_config(raw))
    assert exp.marker_names(1) == ["DAPI", "CD3"]
    assert any("control characters" in r.getMessage() and "'CD3'" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("grid, key", [({"rows": 1, "cols": 1, "overlap": 0.3}, "grid.rows x grid.cols = 1x1"),
                                       ({"rows": 2, "cols": 2, "overlap": 0.0}, "grid.overlap")])
def test_a_grid_that_cannot_be_stitched_is_refused_naming_the_key(tmp_path, grid, key):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001", tiles=grid["rows"] * grid["cols"])
    with pytest.raises((RawDataError, ConfigError)) as err:
        resolve_experiment(_config(raw, grid=grid))
    assert key in _one_line(err)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_experiment_json_are_refused(tmp_path, value):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "experiment.json").write_text(f'{{"xyResolution": {value}}}')
    cfg = validate_config({"raw_dir": str(raw), "results_dir": str(tmp_path / "res"),
                           "grid": {"rows": 2, "cols": 2, "overlap": 0.3}, "optics": {"z_step_um": 1.5}})
    with pytest.raises(RawDataError) as err:
        resolve_experiment(cfg)
    assert f"xyResolution = {float(value)!r} is not a finite number" in _one_line(err)


def test_the_printed_command_survives_spaces_and_shell_characters(tmp_path):
    import shlex

    from plexgpu.cli import snakemake_command

    opts = ["--slurm-logdir", "/data/my results/$(rm -rf ~)/logs/slurm"]
    line = snakemake_command(["/data/my config.yaml"], "registration", 5, opts)
    assert shlex.split(line) == ["snakemake", "registration", "--configfile", "/data/my config.yaml", "--profile",
                                 "profiles/slurm", *opts, "-j", "5"]


def test_an_unreadable_config_file_is_one_line(tmp_path, monkeypatch):
    from plexgpu.config import read_config_files

    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ConfigError) as err:
        read_config_files([tmp_path / "folder.yaml"])
    assert "is a folder" in _one_line(err)
    path = tmp_path / "config.yaml"
    path.write_text("raw_dir: x\n")
    def denied(self, *a, **k):                             # what a file of another user gives (CI runs as root)
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ConfigError) as err:
        read_config_files([path])
    assert _one_line(err) == f"config file {path} cannot be read: Permission denied"


def test_a_symlink_loop_in_raw_dir_is_one_line(tmp_path):
    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    (raw / "cyc002_reg001").symlink_to(raw / "cyc002_reg001")     # a folder that points at itself
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw, cycles=[1]))
    assert "cyc002_reg001" in _one_line(err)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(loop))
    assert "raw_dir" in _one_line(err)


def test_a_raw_folder_dated_in_the_future_is_refused_naming_it(tmp_path):
    """Every run would redo every stage (Snakemake finds the outputs older than their input) for ever."""
    import time

    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001")
    ahead = time.time() + 365 * 86400
    os.utime(raw / "cyc001_reg001", (ahead, ahead))
    before = _listing(raw)
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(raw))
    msg = _one_line(err)
    assert "cyc001_reg001: modified" in msg and "in the future" in msg and "touch -m" in msg
    assert _listing(raw) == before
    os.utime(raw / "cyc001_reg001", (time.time() + 60, time.time() + 60))      # clock skew between nodes: fine
    resolve_experiment(_config(raw))


def test_nan_pixels_in_a_float_tile_are_named_at_validate_and_in_the_job(tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from plexgpu.experiment import cycle_spec
    from plexgpu.stages._stitch import _read_plane

    raw = tmp_path / "raw"
    folder = raw / "cyc001_reg001"
    folder.mkdir(parents=True)
    for t in range(1, 5):
        for z in range(1, 4):
            tile = np.full((16, 16), 100.0 + t, np.float32)
            if (t, z) == (3, 2):
                tile[5, 7] = np.nan
                tile[9, 1] = np.inf
            tifffile.imwrite(folder / tile_filename(1, t, z, 1), tile)
    with pytest.raises(TiffReadError) as err:
        resolve_experiment(_config(raw), read_headers=True)
    assert _one_line(err) == (f"{folder / tile_filename(1, 3, 2, 1)}: 2 NaN or infinite pixel(s), the first at y 5, "
                              "x 7: not a camera's image; export the tiles again")
    spec = cycle_spec(resolve_experiment(_config(raw)), 1)          # without validate: the stitch job says it
    with ThreadPoolExecutor(1) as pool, pytest.raises(RawDataError) as err:
        _read_plane(SimpleNamespace(pool=pool), spec, 1, 2)
    assert _one_line(err).startswith(f"{folder / tile_filename(1, 3, 2, 1)}: 2 NaN or infinite pixel(s)")


def test_a_full_disk_names_the_folder_being_written(tmp_path, monkeypatch):
    """A write() that finds the disk full names no file: the message named the working directory."""
    from plexgpu.job import job_context

    out = tmp_path / "results" / "qc" / "stitch" / "cyc001.json"

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(DiskFullError) as err:
        write_text_atomic(out, "{}")
    assert err.value.strerror.startswith(f"cyc001.json: no space left on {out.parent}, ") and "\n" not in str(err.value)
    assert not list(out.parent.iterdir())                                        # no .part left
    with pytest.raises(SystemExit) as err:
        with job_context("qc_stitch", None, {"cpus_per_task": 1}, "cpu"):
            write_text_atomic(out, "{}")
    assert str(err.value).startswith(f"qc_stitch: cyc001.json: no space left on {out.parent}, ")


@pytest.mark.slurm     # the rerun asks squeue which jobs still run: a cluster must answer
@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_a_damaged_intermediate_is_named_not_counted_done_and_remade(tmp_path, damage, slurm_cluster):
    """`truncate -s` of a stitched stack: deconvolve died in the codec naming no file while status said
    stitch done. Now the read names the file, status says damaged, rerun removes it (so Snakemake
    remakes it) and QC shows the stage failed."""
    from plexgpu import paths, qc_state
    from plexgpu.cluster import rerun
    from plexgpu.io.tiff import StackReader, damaged

    res = tmp_path / "results"
    files = paths.stage_files(res, "stitch", "cyc001", [1])
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x")
    stack = next(f for f in files if f.name == "CH1.ome.tif")
    write_ome(stack, np.random.default_rng(0).integers(0, 4000, (4, 300, 300)).astype(np.uint16), "ZYX")
    data = bytearray(stack.read_bytes())
    if damage == "truncate":
        stack.write_bytes(data[:len(data) * 2 // 3])
    else:
        data[len(data) // 2:len(data) // 2 + 4000] = bytes(4000)               # zeros in the middle of a tile
        stack.write_bytes(bytes(data))
    if damage == "truncate":
        with pytest.raises(TiffReadError) as err:
            StackReader(stack)
        assert "truncated" in _one_line(err)
        assert damaged(stack).startswith(f"{stack}: truncated")
    else:
        with pytest.raises(TiffReadError) as err:
            reader = StackReader(stack)
            for z in range(reader.shape[0]):
                reader[z]
        assert "a tile cannot be decoded" in _one_line(err)
    msg = str(err.value)
    assert msg.startswith(str(stack)) and msg.endswith("delete it and rerun the stage that wrote it (plexgpu rerun)")
    if damage == "truncate":
        state = next(s for s in rerun.status(res, tmp_path, ["cyc001"], [1], "plexgpu-x") if s.stage == "stitch")
        assert state.state == "damaged" and state.detail.startswith(str(stack))
        assert qc_state.stage_states(res, ["cyc001"], [1])["stitch", "cyc001"].status == "fail"


def test_stitch_checks_the_disk_before_it_computes(tmp_path, monkeypatch):
    """Room for one channel's stack is known from the tiles read: a disk without it stops the job before
    the BaSiC fit, naming the results folder and what it needs."""
    import shutil
    from collections import namedtuple

    from plexgpu import stages
    from plexgpu.experiment import cycle_spec
    from plexgpu.image import basic
    from plexgpu.image.synth import SynthDataset, SynthSpec
    from plexgpu.job import job_context

    SynthDataset(SynthSpec(cycles=1, rows=2, cols=2, tile=(64, 64), z_planes=3, channels=1, seed=3)).write(
        tmp_path / "raw")
    config = validate_config({"raw_dir": str(tmp_path / "raw"), "results_dir": str(tmp_path / "res")})
    spec = cycle_spec(resolve_experiment(config), 1)
    res = tmp_path / "res" / "stitched"
    out = {"stitched": [str(res / "CH1.ome.tif")], "profiles": [str(res / "CH1.profiles.tif")],
           "positions": str(res / "positions.csv"), "pairs": str(res / "pairs.csv"), "planes": str(res / "planes.json"),
           "defects": str(res / "defects.csv")}
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 1000, 1000))

    def no_fit(*a, **k):
        raise AssertionError("the fit ran before the disk was checked")
    monkeypatch.setattr(basic, "fit_anchored", no_fit)
    with pytest.raises(SystemExit) as err:
        with job_context("stitch", None, {"cpus_per_task": 1}, "cpu", str(tmp_path / "acct"), "cyc001") as ctx:
            stages.stitch(ctx, spec, config["basic"], config["stitch"], out)
    msg = str(err.value)
    assert msg.startswith(f"stitch: no space left on {res}: needed ") and "before the stitch computes" in msg
    assert "\n" not in msg and not list(res.glob("*.tif"))


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """Aliases of aliases: 9^7 = 4.8 million values from 8 lines; validating them took minutes."""
    import time

    from plexgpu.config import load_config

    lines = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdef", "bcdefg")] + ["raw_dir: /raw"]
    (tmp_path / "bomb.yaml").write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config([tmp_path / "bomb.yaml"])
    assert time.perf_counter() - t0 < 5
    assert "expands to more than 100000 values (YAML aliases" in _one_line(err)


def test_a_value_that_fits_no_alternative_says_what_each_wants(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate_config({"raw_dir": "/raw", "accounts": [{"name": "clive", "gpu_slots": -1}]})
    assert _one_line(err) == ("config key accounts.0.gpu_slots = -1: it is less than the minimum of 0; or 'auto' was "
                              "expected")


def test_a_compressed_tile_with_corrupt_bytes_is_named_at_validate(tmp_path):
    raw = tmp_path / "raw"
    folder = raw / "cyc001_reg001"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for t in range(1, 5):
        for z in range(1, 4):
            tifffile.imwrite(folder / tile_filename(1, t, z, 1), rng.integers(0, 4000, (64, 64)).astype(np.uint16),
                             compression="zlib")
    bad = folder / tile_filename(1, 2, 3, 1)
    data = bytearray(bad.read_bytes())
    data[len(data) // 2:len(data) // 2 + 200] = bytes(200)          # within its byte counts: the header is fine
    bad.write_bytes(bytes(data))
    with pytest.raises(TiffReadError) as err:
        resolve_experiment(_config(raw), read_headers=True)
    assert _one_line(err).startswith(f"{bad}: its compressed pixel data cannot be decoded")


def test_sigterm_mid_write_leaves_no_part_file_and_a_record(tmp_path):
    """What scancel sends: the write's .part file was left and no accounting record written."""
    import signal
    import time

    from plexgpu.cluster.accounting import load_records

    out = tmp_path / "res" / "registered" / "plex.ome.tif"
    script = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'workflow')!r})
from plexgpu.io.tiff import atomic_path
from plexgpu.job import job_context
with job_context("registration", None, {{"cpus_per_task": 1}}, "cpu", {str(tmp_path / 'acct')!r}):
    with atomic_path({str(out)!r}) as tmp:
        tmp.write_bytes(b"half a plex")
        print("writing", flush=True)
        time.sleep(60)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert list(out.parent.glob(".*.part"))
    proc.send_signal(signal.SIGTERM)
    t0 = time.time()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and time.time() - t0 < 10
    assert not list(out.parent.iterdir())                                    # no half file, no .part
    (record,) = load_records(tmp_path / "acct")
    assert record["status"] == "failed" and "cancelled (SIGTERM" in record["error"]


def test_rerun_says_which_deleted_intermediates_it_will_not_remake():
    """Deleted stitched stacks under a finished cycle: rerun announced rebuilding them, then Snakemake
    (whose target is up to date) did nothing."""
    from plexgpu.cluster.rerun import StageState, fed_stages_done

    states = [StageState("cyc001", "stitch", "not started"), StageState("cyc001", "deconvolve", "done"),
              StageState("cyc001", "edf", "done"), StageState("cyc002", "stitch", "not started"),
              StageState("cyc002", "deconvolve", "not started"), StageState("cyc002", "edf", "done"),
              StageState("cyc003", "stitch", "failed"), StageState("cyc003", "deconvolve", "not started"),
              StageState("cyc003", "edf", "not started"), StageState("all", "registration", "done")]
    # registration done: nothing before it runs again, whatever was deleted
    assert fed_stages_done(states) == {("cyc001", "stitch"), ("cyc002", "stitch"), ("cyc002", "deconvolve"),
                                       ("cyc003", "stitch"), ("cyc003", "deconvolve"), ("cyc003", "edf")}
    # registration to do: it runs cyc003's edf, which needs its deconvolve and stitch; cyc001's and cyc002's
    # edf are there, so their deleted stitch (and cyc002's deconvolve) are not remade
    states[-1] = StageState("all", "registration", "not started")
    assert fed_stages_done(states) == {("cyc001", "stitch"), ("cyc002", "stitch"), ("cyc002", "deconvolve")}


@pytest.mark.skipif(not shutil.which("squeue"), reason="SLURM's commands not installed here")
def test_status_when_slurm_cannot_be_asked_is_one_line(tmp_path, monkeypatch, capsys):
    """The real squeue, pointed at a controller that is not there (as on a login node whose controller is
    down): `plexgpu status` says so in one line, no traceback, nothing written."""
    import yaml

    raw = tmp_path / "raw"
    _cycle(raw / "cyc001_reg001", z=5)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(raw), "results_dir": str(tmp_path / "results"),
                                   "grid": {"rows": 2, "cols": 2, "overlap": 0.3},
                                   "optics": {"pixel_size_um": 0.377, "z_step_um": 1.5}}))
    conf = tmp_path / "slurm.conf"                     # nothing listens on this port
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=6999\n"
                    "NodeName=localhost CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=localhost Default=YES\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    before = _listing(raw)
    rc = main(["status", "--configfile", str(cfg), "--directory", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    line = err.strip()
    assert line.startswith("plexgpu: error: squeue failed") and "controller" in line and "\n" not in line, err
    assert _listing(raw) == before
