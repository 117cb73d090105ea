"""The Snakemake workflow end to end on synthetic data, through the Snakemake API."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil

import numpy as np
import pytest
import tifffile
import yaml
from scipy import ndimage

from plexgpu.io.raw import tile_filename
from plexgpu.io.tiff import atomic_path, read_tiff
from plexgpu.image.synth import SynthDataset, SynthSpec, load_truth
from workflow_api import plan, run


def _config(tmp, raw, **extra):
    cfg = {"raw_dir": str(raw), "results_dir": str(tmp / "results"), "compute": {"device": "cpu"},
           "deconvolution": {"iterations": 5},
           "resources": {r: {"cpus_per_task": 1, "mem_mb": 2000, "runtime": 10}
                         for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}
    for k, v in extra.items():
        cfg[k] = v
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _digest(folder):
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*.tif")):
        h.update(p.read_bytes())
        h.update(str(p.stat().st_mtime_ns).encode())
    return h.hexdigest()


def test_dry_run_13_cycles_three_jobs_each_and_no_qc(tmp_path):
    raw = tmp_path / "raw"
    SynthDataset(SynthSpec(cycles=13, rows=2, cols=2, tile=(32, 32), z_planes=3, channels=2, seed=1)).write(raw)
    jobs = plan(tmp_path, _config(tmp_path, raw), targets=("registration",))
    rules = [r for r, _ in jobs]
    assert len(jobs) == 13 * 3 + 1
    for rule in ("stitch", "deconvolve", "edf"):
        assert sorted(c for r, c in jobs if r == rule) == [f"cyc{c:03d}" for c in range(1, 14)]
    assert rules.count("registration") == 1
    assert not [r for r in rules if r.startswith("qc")]


def test_gpu_jobs_carry_one_gpu_their_account_and_one_slot_token(tmp_path, small_synth):
    """With accounts, every GPU-stage job asks for one GPU on its assigned account, carries its
    gpu_stage rank and exactly one gpu_<account> slot token (1 for its account, 0 for the others:
    `--resources gpu_clive=3` caps clive with Snakemake's built-in schedulers); QC jobs hold none."""
    from plexgpu.paths import gpu_stage_rank

    accounts = [{"name": "clive", "gpu_slots": 2, "partition": "hpg-b200"},
                {"name": "maigan", "gpu_slots": 1, "partition": "hpg-b200"}]
    cfg = _config(tmp_path, small_synth[0], accounts=accounts)
    jobs = plan(tmp_path, cfg, targets=("all", "qc"), resources=True)
    gpu_jobs = {k: r for k, r in jobs.items() if gpu_stage_rank(k[0])}
    assert len(gpu_jobs) == 3 * 3 + 1
    for (rule, cycle), r in gpu_jobs.items():
        assert r["gpu"] == 1 and r["gpu_stage"] == gpu_stage_rank(rule), (rule, cycle, r)
        assert (r["gpu_clive"], r["gpu_maigan"]) == ((1, 0) if r["slurm_account"] == "clive" else (0, 1))
    by_cycle = {c: r["slurm_account"] for (rule, c), r in gpu_jobs.items() if rule == "stitch"}
    assert sorted(by_cycle.values()) == ["clive", "clive", "maigan"]        # in proportion to gpu_slots 2 : 1
    for (rule, _cycle), r in jobs.items():
        if rule.startswith("qc"):
            assert "gpu" not in r and "gpu_stage" not in r and "gpu_clive" not in r, (rule, r)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    """One full run (registration, then qc) on 3 cycles x 4x4 tiles, with stitch on 3 cpus_per_task.

    Deconvolution runs with 0 iterations here: the synthetic specimen is a thin sheet already
    resolved in focus, where RL cannot bring the EDF closer to the truth (RL itself is tested
    against scikit-image in test_deconvolution.py; 5 iterations run in the keep-going test).
    """
    tmp = tmp_path_factory.mktemp("e2e")
    raw = tmp / "raw"
    SynthDataset(SynthSpec(cycles=3, rows=4, cols=4, tile=(128, 128), z_planes=5, channels=2, seed=11)).write(raw)
    before = _digest(raw)
    cfg = _config(tmp, raw)
    data = yaml.safe_load(cfg.read_text())
    data["resources"]["stitch"]["cpus_per_task"] = 3
    data["deconvolution"]["iterations"] = 0
    cfg.write_text(yaml.safe_dump(data))
    run(tmp, cfg, targets=("registration",), cores=3)
    qc_before = (tmp / "results" / "qc").exists()
    run(tmp, cfg, targets=("qc",), cores=2)
    return tmp, raw, cfg, before, qc_before


@pytest.mark.slow
def test_outputs_are_real_files_matching_truth(e2e):
    tmp, raw, cfg, before, qc_before = e2e
    res = tmp / "results"
    ds, truth = load_truth(raw)
    assert not qc_before  # target registration pulled in no QC rule
    # positions <= 0.5 px in every cycle
    for c in (1, 2, 3):
        with open(res / f"stitched/cyc{c:03d}/positions.csv") as fh:
            pos = np.array([[float(r["y_px"]), float(r["x_px"])] for r in csv.DictReader(fh)])
        true = np.array(truth["positions"][c - 1], float)
        err = pos - (true - true.min(axis=0))
        print(f"cyc{c:03d}: max stitching error {np.abs(err).max():.3f} px")
        assert np.abs(err).max() <= 0.5
    # registration <= 0.5 px: expected shift = specimen shift + difference of mosaic origins
    with open(res / "registered/shifts.csv") as fh:
        shifts = {r["cycle"]: (float(r["dy_px"]), float(r["dx_px"])) for r in csv.DictReader(fh)}
    origin = [np.array(p, float).min(axis=0) for p in truth["positions"]]
    for c in (2, 3):
        expect = -(np.array(ds.cycle_shifts[c - 1]) - ds.cycle_shifts[0] + origin[c - 1] - origin[0])
        got = np.array(shifts[f"cyc{c:03d}"])
        print(f"cyc{c:03d}: registration error {np.abs(got - expect).max():.3f} px")
        assert np.abs(got - expect).max() <= 0.5
    # EDF correlates with the in-focus truth
    edf_img = read_tiff(res / "edf/cyc001/CH1.ome.tif")
    o = np.floor(origin[0]).astype(int)              # the mosaic starts at the first tile's sub-pixel position
    sharp = ndimage.shift(ds.in_focus(1, 1), -(origin[0] - o), order=3, mode="nearest")
    sharp = sharp[o[0]:o[0] + edf_img.shape[0], o[1]:o[1] + edf_img.shape[1]]
    h, w = min(sharp.shape[0], edf_img.shape[0]), min(sharp.shape[1], edf_img.shape[1])
    m = 8
    r = np.corrcoef(edf_img[m:h - m, m:w - m].ravel(), sharp[m:h - m, m:w - m].ravel())[0, 1]
    print(f"EDF correlation with sharp truth: {r:.4f}")
    assert r >= 0.99
    # every output of the layout (plexgpu.paths) is a real image
    for c in ("cyc001", "cyc002", "cyc003"):
        for ch in (1, 2):
            assert read_tiff(res / f"stitched/{c}/CH{ch}.ome.tif").ndim == 3
            assert read_tiff(res / f"deconvolved/{c}/CH{ch}.ome.tif").dtype == np.uint16   # iterations 0: a copy
            assert read_tiff(res / f"basic/{c}/CH{ch}.profiles.tif").shape[:2] == (5, 2)
            assert read_tiff(res / f"registered/{c}/CH{ch}.ome.tif").shape == edf_img.shape
            assert read_tiff(res / f"registered/{c}/CH{ch}.deconvolved.ome.tif").shape == edf_img.shape
            for name in ("edf/{c}/CH{ch}.ome.tif", "edf/{c}/CH{ch}.deconvolved.ome.tif", "registered/{c}/CH{ch}.ome.tif"):
                assert read_tiff(res / name.format(c=c, ch=ch)).min() >= 0      # no negatives the data did not have
    # raw data untouched
    assert _digest(raw) == before


@pytest.mark.slow
@pytest.mark.parametrize("plex", ["plex.ome.tif", "plex_deconvolved.ome.tif"])
def test_plex_is_pyramidal_ome_with_markers(e2e, plex):
    tmp, raw, *_ = e2e
    with tifffile.TiffFile(tmp / "results/registered" / plex) as tif:
        assert tif.is_ome
        assert len(tif.series[0].levels) >= 2
        ome = tif.ome_metadata
        assert "PhysicalSizeX=\"0.377\"" in ome
        names = (raw / "channelNames.txt").read_text().split()
        for name in names:
            assert f'Name="{name}"' in ome
        in_file = re.findall(r'<Channel [^>]*Name="([^"]+)"', ome)
        assert len(in_file) == len(names) and len(set(in_file)) == len(in_file)     # unique: DAPI, DAPI_cyc002, ...
        assert tif.series[0].shape[0] == 6
        assert tif.series[0].dtype == np.uint16 and tif.pages.first.compression == 8   # counts, deflate
    with open(tmp / "results/registered/markers.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["marker_name"] for r in rows] == in_file                            # MCMICRO's columns, same order
    assert [int(r["channel_number"]) for r in rows] == list(range(1, len(rows) + 1))
    assert {int(r["cycle_number"]) for r in rows} == {1, 2, 3}


@pytest.mark.slow
def test_every_ome_output_validates_and_the_browsable_ones_are_tiled_pyramids(e2e):
    """Each *.ome.tif of the run: its OME-XML validates against the OME 2016-06 schema (ome-types, as
    readers do), its pixel size agrees with the TIFF resolution tags, and the 2-D images users browse
    (edf/, registered/) are 512 px tiles, deflate, with reduced levels."""
    import ome_types

    tmp, *_ = e2e
    res = tmp / "results"
    files = sorted(res.rglob("*.ome.tif"))
    assert len(files) >= 3 * 2 * 5 + 2
    for path in files:
        ome = ome_types.from_tiff(path, validate=True)
        px = ome.images[0].pixels
        assert px.physical_size_x == pytest.approx(0.377), path
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            per_cm = page.tags["XResolution"].value
            assert page.tags["ResolutionUnit"].value == 3 and per_cm[0] / per_cm[1] == pytest.approx(1e4 / 0.377), path
            if path.parent.parent.name in ("edf", "registered") and path.parent.name.startswith("cyc"):
                assert page.is_tiled and page.compression == 8 and len(tif.series[0].levels) >= 1, path
                assert tif.series[0].ndim == 2, path


@pytest.mark.slow
def test_worker_pool_logged_from_cpus_per_task(e2e):
    tmp, *_ = e2e
    log = (tmp / "results/logs/stitch/cyc001.log").read_text()
    assert "worker pool = 3 (cpus_per_task = 3)" in log
    assert "worker pool = 1 (cpus_per_task = 1)" in (tmp / "results/logs/edf/cyc001.log").read_text()


@pytest.mark.slow
def test_qc_page_and_metrics(e2e):
    tmp, *_ = e2e
    qc = tmp / "results/qc"
    metrics = json.loads((qc / "metrics.json").read_text())
    assert len(metrics["stitch"]) == 3 and metrics["registration"]["shifts"]
    assert "qc finished in" in (tmp / "results/logs/qc/qc.log").read_text()     # the rule's declared log
    html = (qc / "index.html").read_text()
    for png in ("stitch/cyc001.png", "stitch/cyc001.shading.png", "edf/cyc002.png", "deconvolve/cyc003.png",
                "registration/cyc002.png"):
        assert png in html and (qc / png).stat().st_size > 100
    # a verdict for every cycle x stage, at the top, before the first picture
    assert html.index("<th>registration</th>") < html.index("<img")
    for m in metrics["stitch"] + metrics["deconvolve"] + metrics["edf"] + [metrics["registration"]]:
        assert m["status"] == "ok" and m["reasons"] == [], m         # clean data: no verdict turns
    assert {v["status"] for v in metrics["stage_states"].values()} == {"done"}
    assert metrics["stitch"][0]["pairs_accepted"] > 0 and len(metrics["stitch"][0]["histogram"]["counts"]) == 48
    assert all(s["ncc_to_reference"] > 0.5 for s in metrics["registration"]["shifts"])
    assert "<details>" in html and "pairs.csv" in html


@pytest.mark.slow
def test_second_run_nothing_to_do_and_param_change_reruns_downstream_only(e2e):
    tmp, raw, cfg, *_ = e2e
    assert plan(tmp, cfg, targets=("registration",)) == []
    jobs = plan(tmp, cfg, targets=("registration",), overrides={"deconvolution": {"iterations": 3}})
    rules = sorted({r for r, _ in jobs})
    assert rules == ["deconvolve", "edf", "registration"]
    assert len(jobs) == 3 + 3 + 1


def test_missing_tile_stops_before_any_job(tmp_path, small_synth):
    raw = tmp_path / "raw"
    shutil.copytree(small_synth[0], raw)
    (raw / "cyc002_reg001" / tile_filename(1, 4, 2, 1)).unlink()
    with pytest.raises(Exception, match="1_00004_Z002_CH1.tif"):
        plan(tmp_path, _config(tmp_path, raw))
    assert not (tmp_path / "results").exists()


def test_wrong_marker_count_stops_naming_key(tmp_path, small_synth):
    with pytest.raises(Exception, match="config key markers"):
        plan(tmp_path, _config(tmp_path, small_synth[0], markers=["DAPI", "CD3", "CD20"]))


@pytest.mark.slow
def test_corrupt_tiff_fails_that_cycle_only(tmp_path, small_synth, capsys):
    raw = tmp_path / "raw"
    shutil.copytree(small_synth[0], raw)
    bad = raw / "cyc002_reg001" / tile_filename(1, 3, 1, 2)
    data = bytearray(bad.read_bytes())
    bad.write_bytes(bytes(data[:200]))  # truncated: header survives, pixels do not
    cfg = _config(tmp_path, raw)
    with pytest.raises(Exception):  # noqa: B017 (whatever the Snakemake API raises for a failed job)
        run(tmp_path, cfg, targets=("registration",), keep_going=True)
    res = tmp_path / "results"
    log = (res / "logs/stitch/cyc002.log").read_text()
    assert "1_00003_Z001_CH2.tif" in log
    assert not list((res / "stitched").glob("cyc002/*"))        # nothing that looks finished
    assert not list((res / "stitched" / "cyc002").glob(".*part")) if (res / "stitched/cyc002").exists() else True
    for c in ("cyc001", "cyc003"):                               # --keep-going: the other cycles finish
        assert (res / f"edf/{c}/CH1.ome.tif").exists() and (res / f"edf/{c}/CH2.ome.tif").exists()
        stitched = read_tiff(res / f"stitched/{c}/CH1.ome.tif").astype(np.float64)
        decon = read_tiff(res / f"deconvolved/{c}/CH1.ome.tif")  # 5 RL iterations: RL's fit holds the light
        fit = json.loads((res / f"deconvolved/{c}/flux.json").read_text())["1"]
        assert abs(fit["explained_ratio"] - 1) < 0.02 and fit["flux_ratio"] == pytest.approx(
            decon.sum() / stitched.sum(), rel=1e-3)
    assert not (res / "registered/plex.ome.tif").exists()
    # the run's end names what is not done and the next step, once
    err = capsys.readouterr().err
    assert "stage(s) not done:" in err and "cyc002: stitch, deconvolve, edf" in err, err[-2000:]
    assert "    stitch failed: " in err and "1_00003_Z001_CH2.tif" in err.split("stage(s) not done:")[1]
    assert f"plexgpu rerun registration --configfile {cfg}" in err and "cyc001:" not in err


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.tif"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half a file")
            raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_zero_iterations_skip_the_deconvolution_work(e2e):
    """deconvolution.iterations: 0 is a supported choice: the deconvolved stack is the stitched one, copied
    (no Richardson-Lucy, no device work), and the job log says so."""
    tmp, *_ = e2e
    res = tmp / "results"
    for c in ("cyc001", "cyc002", "cyc003"):
        for ch in (1, 2):
            stitched = (res / f"stitched/{c}/CH{ch}.ome.tif").read_bytes()
            assert (res / f"deconvolved/{c}/CH{ch}.ome.tif").read_bytes() == stitched
        assert "iterations = 0: the stitched stacks are copied" in (res / f"logs/deconvolve/{c}.log").read_text()
