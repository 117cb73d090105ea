"""Raw CODEX discovery: cycle folders, tile completeness, metadata."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tifffile

from plexgpu.config import validate_config
from plexgpu.experiment import resolve_experiment
from plexgpu.io.raw import RawDataError, find_cycle_dirs, grid_layout, tile_filename


def _write_cycle(folder, tiles=4, z=3, channels=(1, 2), region=1, shape=(8, 8)):
    folder.mkdir(parents=True)
    for t in range(1, tiles + 1):
        for zz in range(1, z + 1):
            for ch in channels:
                tifffile.imwrite(folder / tile_filename(region, t, zz, ch), np.zeros(shape, np.uint16))


def _config(raw, **kw):
    cfg = {"raw_dir": str(raw), "grid": {"rows": 2, "cols": 2, "overlap": 0.3},
           "optics": {"pixel_size_um": 0.377, "z_step_um": 1.5}}
    cfg.update(kw)
    return validate_config(cfg)


def test_cycle_folder_spellings(tmp_path):
    for name in ("cyc001_reg001_20240101_101010", "cyc02_reg001", "Cyc03_reg001", "cyc011_reg001",
                 "cyc004_reg002", "notes"):
        (tmp_path / name).mkdir()
    dirs = find_cycle_dirs(tmp_path, region=1)
    assert sorted(dirs) == [1, 2, 3, 11]
    assert dirs[1].name == "cyc001_reg001_20240101_101010"
    assert dirs[11].name == "cyc011_reg001"  # cyc1 never matches cyc011


def test_cyc1_does_not_match_cyc011(tmp_path):
    (tmp_path / "cyc011_reg001").mkdir()
    with pytest.raises(RawDataError, match="cycles \\[1\\]"):
        resolve_experiment(_config(tmp_path, cycles=[1]))


def test_two_folders_for_one_cycle_names_both(tmp_path):
    (tmp_path / "cyc001_reg001_20240101_101010").mkdir()
    (tmp_path / "cyc1_reg001").mkdir()
    with pytest.raises(RawDataError) as err:
        find_cycle_dirs(tmp_path)
    assert "cyc001_reg001_20240101_101010" in str(err.value) and "cyc1_reg001" in str(err.value)


def test_missing_tile_named(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001")
    (tmp_path / "cyc001_reg001" / tile_filename(1, 3, 2, 2)).unlink()
    with pytest.raises(RawDataError) as err:
        resolve_experiment(_config(tmp_path))
    assert "1 tile file(s) missing" in str(err.value) and "1_00003_Z002_CH2.tif" in str(err.value)


def test_many_missing_shows_first_and_count(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001", tiles=1)
    with pytest.raises(RawDataError, match="18 tile file\\(s\\) missing, first: 1_00002_Z001_CH1.tif"):
        resolve_experiment(_config(tmp_path))


def test_extra_tile_and_wrong_grid(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001", tiles=5)
    with pytest.raises(RawDataError, match="tile 5 found"):
        resolve_experiment(_config(tmp_path))
    with pytest.raises(RawDataError, match="missing"):
        resolve_experiment(_config(tmp_path, grid={"rows": 2, "cols": 3, "overlap": 0.3}))


def test_shape_mismatch_and_corrupt_header(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001")
    bad = tmp_path / "cyc001_reg001" / tile_filename(1, 2, 1, 1)
    tifffile.imwrite(bad, np.zeros((9, 8), np.uint16))
    with pytest.raises(RawDataError, match="1_00002_Z001_CH1.tif: shape"):
        resolve_experiment(_config(tmp_path), read_headers=True)
    bad.write_bytes(b"not a tiff")
    with pytest.raises(Exception, match="1_00002_Z001_CH1.tif: not a readable TIFF"):
        resolve_experiment(_config(tmp_path), read_headers=True)


def test_too_few_z_planes_refused_before_any_job(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001", z=2)
    with pytest.raises(RawDataError, match="2 z-plane\\(s\\) per tile; extended depth of field needs at least 3"):
        resolve_experiment(_config(tmp_path))


# tile numbers on a 2 x 3 grid (row 0 on top), as Fiji's Grid/Collection numbers them for each order
GRID_TABLE = {
    "rows-top-left": ["1 2 3", "4 5 6"],             # row-by-row, Right & Down
    "rows-top-right": ["3 2 1", "6 5 4"],            # row-by-row, Left & Down
    "rows-bottom-left": ["4 5 6", "1 2 3"],          # row-by-row, Right & Up
    "rows-bottom-right": ["6 5 4", "3 2 1"],         # row-by-row, Left & Up
    "snake-rows-top-left": ["1 2 3", "6 5 4"],       # snake by rows, Right & Down
    "snake-rows-top-right": ["3 2 1", "4 5 6"],      # snake by rows, Left & Down (wsi_brain)
    "snake-rows-bottom-left": ["6 5 4", "1 2 3"],    # snake by rows, Right & Up
    "snake-rows-bottom-right": ["4 5 6", "3 2 1"],   # snake by rows, Left & Up
    "columns-top-left": ["1 3 5", "2 4 6"],          # column-by-column, Down & Right
    "columns-top-right": ["5 3 1", "6 4 2"],         # column-by-column, Down & Left
    "columns-bottom-left": ["2 4 6", "1 3 5"],       # column-by-column, Up & Right
    "columns-bottom-right": ["6 4 2", "5 3 1"],      # column-by-column, Up & Left
    "snake-columns-top-left": ["1 4 5", "2 3 6"],    # snake by columns, Down & Right
    "snake-columns-top-right": ["5 4 1", "6 3 2"],   # snake by columns, Down & Left
    "snake-columns-bottom-left": ["2 3 6", "1 4 5"], # snake by columns, Up & Right
    "snake-columns-bottom-right": ["6 3 2", "5 4 1"],  # snake by columns, Up & Left
    "snake": ["1 2 3", "6 5 4"],
    "rows": ["1 2 3", "4 5 6"],
}


@pytest.mark.parametrize("order", list(GRID_TABLE))
def test_grid_order_table(order):
    table = [[int(t) for t in row.split()] for row in GRID_TABLE[order]]
    expect = {table[r][c]: (r, c) for r in range(2) for c in range(3)}
    assert grid_layout(2, 3, order) == [expect[t] for t in range(1, 7)]


def test_every_grid_order_is_in_the_schema_and_named_for_fiji():
    import yaml

    from plexgpu.config import SCHEMA_PATH
    from plexgpu.io.raw import GRID_ORDERS, fiji_name

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    assert set(schema["properties"]["grid"]["properties"]["order"]["enum"]) == set(GRID_ORDERS) == set(GRID_TABLE)
    assert fiji_name("snake-rows-top-right") == "snake by rows, Left & Down"
    assert fiji_name("columns-bottom-left") == "column-by-column, Up & Right"
    with pytest.raises(RawDataError, match="grid.order must be one of"):
        grid_layout(2, 3, "zigzag")


def test_metadata_fills_what_config_leaves_out(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001", tiles=6)
    _write_cycle(tmp_path / "cyc002_reg001", tiles=6)
    (tmp_path / "experiment.json").write_text(json.dumps({
        "numCycles": 2, "regionWidth": 3, "regionHeight": 2, "tileOverlapX": 30,
        "xyResolution": 377.44, "zPitch": 1500, "numZPlanes": 3,
        "channelNames": {"channelNamesArray": ["DAPI", "CD3", "DAPI", "CD20"]}}))
    exp = resolve_experiment(validate_config({"raw_dir": str(tmp_path), "grid": {"cols": 3}}))
    assert (exp.rows, exp.cols, exp.overlap, exp.z_planes) == (2, 3, 0.3, 3)
    assert exp.pixel_size_um == pytest.approx(0.37744) and exp.z_step_um == 1.5
    assert exp.marker_names(2) == ["DAPI", "CD20"]
    # config wins over metadata
    exp = resolve_experiment(validate_config({"raw_dir": str(tmp_path), "optics": {"pixel_size_um": 0.5},
                                              "markers": ["a", "b", "c", "d"]}))
    assert exp.pixel_size_um == 0.5 and exp.marker_names(1) == ["a", "b"]


def test_bad_experiment_json_value_names_file_and_key(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001")
    (tmp_path / "experiment.json").write_text(json.dumps({"numZPlanes": "three"}))
    with pytest.raises(RawDataError, match="experiment.json: numZPlanes = 'three' is not a number"):
        resolve_experiment(_config(tmp_path))
    (tmp_path / "experiment.json").write_text("[1, 2]")
    with pytest.raises(RawDataError, match="experiment.json: expected a JSON object"):
        resolve_experiment(_config(tmp_path))


def test_marker_count_mismatch_names_key(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001")
    with pytest.raises(RawDataError, match="config key markers: markers gives 3 marker names"):
        resolve_experiment(_config(tmp_path, markers=["a", "b", "c"]))


def test_no_overlap_anywhere_names_key(tmp_path):
    _write_cycle(tmp_path / "cyc001_reg001")
    cfg = validate_config({"raw_dir": str(tmp_path), "grid": {"rows": 2, "cols": 2}})
    with pytest.raises(RawDataError, match="config key grid.overlap"):
        resolve_experiment(cfg)


def test_raw_files_never_modified(small_synth, tmp_path):
    raw, _ = small_synth
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in raw.rglob("*.tif")}
    cfg = validate_config({"raw_dir": str(raw)})
    resolve_experiment(cfg, read_headers=True)
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in raw.rglob("*.tif")}
    assert before == after


def test_cli_validate_prints_summary(small_synth, tmp_path):
    raw, _ = small_synth
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"raw_dir: {raw}\ncompute: {{device: cpu}}\n")
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "validate", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "cyc003_reg001" in res.stdout and "DAPI" in res.stdout


def test_cli_validate_missing_tile_exit_2(small_synth, tmp_path):
    raw, _ = small_synth
    copy = tmp_path / "raw"
    shutil.copytree(raw, copy)
    (copy / "cyc002_reg001" / tile_filename(1, 4, 3, 2)).unlink()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"raw_dir: {copy}\n")
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "validate", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "1_00004_Z003_CH2.tif" in res.stderr
