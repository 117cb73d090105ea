"""QC verdicts that follow the evidence, on faults made for each rule (tests/qc_faults.py), and a QC
page that reads what exists: written after a stage failed, never running a stage itself."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from plexgpu import qc, qc_state
from plexgpu.image import texture
from plexgpu.image.synth import SynthDataset, SynthSpec
from qc_faults import CASES, write_fault_dataset
from workflow_api import plan, run


def _config(tmp, raw):
    cfg = {"raw_dir": str(raw), "results_dir": str(tmp / "results"), "compute": {"device": "cpu"},
           "deconvolution": {"iterations": 0},
           "resources": {r: {"cpus_per_task": 1, "mem_mb": 2000, "runtime": 10}
                         for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _cells(html: str, metrics: dict) -> dict:
    """{(stage, cycle): (status, reasons)} as the page's verdict table shows them (from metrics.json's
    per-stage verdicts and stage states, the same the page is written from)."""
    out = {}
    for key, state in metrics["stage_states"].items():
        stage, cycle = key.split("/")
        if state["status"] != "done":
            out[stage, cycle] = (state["status"], [state["reason"]])
    for stage in ("stitch", "deconvolve", "edf"):
        for m in metrics.get(stage, []):
            out[stage, m["cycle"]] = (m["status"], m["reasons"])
    reg = metrics["registration"]
    if reg:
        for s in reg["shifts"]:
            reasons = [r for r in reg["reasons"] if r.startswith(s["cycle"] + ":")]
            out["registration", s["cycle"]] = ("warn" if reasons else "ok", reasons)
    return out


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    write_fault_dataset(tmp / "raw")
    cfg = _config(tmp, tmp / "raw")
    run(tmp, cfg, targets=("registration",), cores=2)
    run(tmp, cfg, targets=("qc",), cores=2)
    html = (tmp / "results/qc/index.html").read_text()
    return html, json.loads((tmp / "results/qc/metrics.json").read_text())


@pytest.mark.slow
def test_every_fault_turns_its_verdict_naming_what_and_where(faults):
    html, metrics = faults
    cells = _cells(html, metrics)
    print("\n| fault | cycle | stage | verdict | reason |\n|---|---|---|---|---|")
    for fault, (cycle, stage, level, words) in CASES.items():
        status, reasons = cells[stage, cycle]
        hit = [r for r in reasons if words in r]
        print(f"| {fault} | {cycle} | {stage} | {status} | {hit[0] if hit else reasons} |")
        assert hit, (fault, status, reasons)
        assert {"ok": 0, "warn": 1, "fail": 2}[status] >= {"warn": 1, "fail": 2}[level], (fault, status)
    # the first screen: the counts and the table above the first picture say it
    top = html[:html.index("<img")]
    assert "fail</span> " in top and "tile 6: tissue that matches none" in top
    # the clean reference cycle is ok where no fault was put (its bare tile 16 aside)
    assert cells["deconvolve", "cyc001"][0] == cells["edf", "cyc001"][0] == "ok"
    assert cells["stitch", "cyc001"][1] == [r for r in cells["stitch", "cyc001"][1] if "tile 16" in r]


@pytest.fixture(scope="module")
def failed_registration(tmp_path_factory):
    """Three cycles, the third of another specimen: registration fails naming it; then `snakemake qc`."""
    tmp = tmp_path_factory.mktemp("regfail")
    spec = SynthSpec(cycles=3, rows=3, cols=3, tile=(128, 128), z_planes=3, channels=1, seed=5, tissue_fraction=1.0)
    SynthDataset(spec).write(tmp / "raw")
    SynthDataset(SynthSpec(**{**spec.__dict__, "seed": 77, "cycles": 1})).write(tmp / "other")
    shutil.rmtree(tmp / "raw/cyc003_reg001")
    shutil.copytree(tmp / "other/cyc001_reg001", tmp / "raw/cyc003_reg001")
    cfg = _config(tmp, tmp / "raw")
    with pytest.raises(Exception, match="did not complete"):      # Snakemake's: the job failed
        run(tmp, cfg, targets=("registration",), cores=2)
    assert not (tmp / "results/registered/shifts.csv").exists()
    planned = plan(tmp, cfg, targets=("qc",))
    run(tmp, cfg, targets=("qc",), cores=2)
    return tmp, cfg, planned


@pytest.mark.slow
def test_qc_after_a_failed_registration_writes_the_page_and_runs_no_stage(failed_registration):
    tmp, cfg, planned = failed_registration
    assert planned and {r for r, _ in planned} <= {"qc", "qc_stitch", "qc_decon", "qc_edf"}, planned
    html = (tmp / "results/qc/index.html").read_text()
    metrics = json.loads((tmp / "results/qc/metrics.json").read_text())
    failed = metrics["stage_states"]["registration/cyc003"]
    assert failed["status"] == "fail" and "cyc003" in failed["reason"] and "\n" not in failed["reason"]
    assert failed["log"].endswith("logs/registration/registration.log")
    assert metrics["stage_states"]["registration/cyc001"]["reason"] == "the registration job failed on cyc003"
    assert html.index(failed["reason"].replace("'", "&#x27;")) < html.index("<img")   # on the first screen
    # a stage rerun would be outdated now (another deconvolution setting): QC still schedules none
    jobs = plan(tmp, cfg, targets=("qc",), overrides={"deconvolution": {"iterations": 3}})
    assert {r for r, _ in jobs} <= {"qc", "qc_stitch", "qc_decon", "qc_edf"}


def test_nothing_run_yet_qc_page_says_not_run(tmp_path, small_synth):
    cfg = _config(tmp_path, small_synth[0])
    assert plan(tmp_path, cfg, targets=("qc",)) == [("qc", "")]
    run(tmp_path, cfg, targets=("qc",), cores=1)
    metrics = json.loads((tmp_path / "results/qc/metrics.json").read_text())
    assert {v["status"] for v in metrics["stage_states"].values()} == {"not run"}
    assert "not run</span>" in (tmp_path / "results/qc/index.html").read_text()


def _pair(a, b, accepted="0", reason="", ta=0.0, tb=0.0, off=None):
    return {"tile_a": str(a), "tile_b": str(b), "accepted": accepted, "reason": reason, "texture_a": str(ta),
            "texture_b": str(tb), "ncc": "0.9", "off_model_dy_px": "" if off is None else str(off[0]),
            "off_model_dx_px": "" if off is None else str(off[1])}


def test_tile_rules_on_the_evidence_of_their_pairs():
    t = texture.MIN_TEXTURE_SNR
    ok = [_pair(1, 2, "1", ta=50, tb=50)]
    assert qc.tile_problems(ok) == []
    bare = qc.tile_problems([_pair(1, 2, reason="not significant", ta=t / 2, tb=t / 3)])
    assert bare == [("warn", "tiles 1, 2: no texture in any overlap (bare slide or out of focus); placed by the "
                             "stage model")]
    # tile 2 shows nothing where tile 1 and 3 show tissue; 1 and 3 match elsewhere
    empty = qc.tile_problems([_pair(1, 2, ta=40, tb=0.5), _pair(2, 3, ta=0.4, tb=30), _pair(1, 3, "1", 40, 30)])
    assert [lvl for lvl, _ in empty] == ["fail"] and empty[0][1].startswith("tile 2: no texture where a neighbour")
    # one strip just below the texture bound, its neighbour just above: the same patch, not an empty tile
    edge = qc.tile_problems([_pair(1, 2, ta=t * 0.9, tb=t * 1.2), _pair(2, 3, "1", 40, 30)])
    assert edge == [("warn", "tile 1: no texture in any overlap (bare slide or out of focus); placed by the stage "
                             "model")]
    foreign = qc.tile_problems([_pair(1, 2, ta=40, tb=35), _pair(1, 3, "1", 40, 30), _pair(2, 3, ta=35, tb=30)])
    assert foreign[0][0] == "fail" and foreign[0][1].startswith("tile 2: tissue that matches none")
    # tile 2 seen 15 px right of where the stage put it, from its left neighbour (1-2) and its right (2-3)
    off = qc.tile_problems([_pair(1, 2, ta=40, tb=40, off=(0.3, 15.2)), _pair(2, 3, ta=40, tb=30, off=(-0.1, -14.6)),
                            _pair(1, 4, "1", 40, 30), _pair(3, 4, "1", 40, 30)], window=2.0)
    assert off[0][0] == "warn" and off[0][1].startswith("tile 2: its neighbours match it 15 px from where")
    # ... chance matches at offsets that disagree: not a displaced tile (tissue that matches nothing: fail)
    chance = qc.tile_problems([_pair(1, 2, ta=40, tb=40, off=(0.3, 15.2)), _pair(2, 3, ta=40, tb=30, off=(9, 4)),
                               _pair(1, 4, "1", 40, 30), _pair(3, 4, "1", 40, 30)], window=2.0)
    assert chance[0][0] == "fail" and chance[0][1].startswith("tile 2: tissue that matches none")


def test_texture_tells_noise_from_structure_and_ignores_a_ramp():
    import numpy as np

    rng = np.random.default_rng(0)
    noise = rng.normal(0, 3, (128, 128))
    assert texture.measure(noise + np.linspace(0, 30, 128)[None]).snr < 1       # flat-field residue: no texture
    yy, xx = np.mgrid[:128, :128]
    nuclei = 20 * (np.sin(yy / 5) * np.sin(xx / 6) > 0.5)                         # blobs 20 counts above, ~7 sigmas
    k = texture.measure(noise + nuclei)
    assert k.textured and abs(k.noise - 3) < 0.5
    blank = texture.measure(rng.normal(0, 3, (128, 128)))
    assert not blank.lit and not blank.textured


def test_stage_states_from_job_records(tmp_path):
    """A stage not done: fail with its job's error line and log, or not run saying why."""
    from plexgpu import paths

    res = tmp_path
    import numpy as np
    import tifffile

    for f in paths.stage_files(res, "stitch", "cyc001", [1]):        # whole files (a damaged TIFF is not done)
        f.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".tif":
            tifffile.imwrite(f, np.zeros((4, 4), np.uint16))
        else:
            f.write_text("x")
    rec = res / paths.ACCOUNTING
    rec.mkdir(parents=True)
    (rec / "deconvolve-cyc001-1.json").write_text(json.dumps(
        {"rule": "deconvolve", "cycle": "cyc001", "status": "failed", "end": 2.0,
         "error": "MemoryError: out of memory\nmore"}))
    (rec / "deconvolve-cyc001-0.json").write_text(json.dumps(
        {"rule": "deconvolve", "cycle": "cyc001", "status": "done", "end": 1.0, "error": None}))
    log = res / paths.log_file("deconvolve", "cyc001")
    log.parent.mkdir(parents=True)
    log.write_text("...")
    states = qc_state.stage_states(res, ["cyc001"], [1])
    assert states["stitch", "cyc001"].status == "done"
    assert states["deconvolve", "cyc001"] == qc_state.StageState("fail", "MemoryError: out of memory", str(log))
    assert states["edf", "cyc001"] == qc_state.StageState("not run", "waits for deconvolve")
    assert states["registration", "cyc001"].status == "not run"


def test_a_plane_left_to_basic_alone_is_named():
    """The fallback a plane gets when its overlaps cannot refine the flatfield is said, plane by plane."""
    refined = {"refined": True}
    assert qc.unrefined_planes({"1/1": refined, "1/2": refined}) is None
    msg = qc.unrefined_planes({"1/1": refined, "2/3": {"refined": False}, "2/10": {"refined": False}})
    assert msg.startswith("flatfield from BaSiC alone on 2 of 3 planes (CH2 Z003, CH2 Z010)")


def test_an_uncertain_offset_says_why():
    """A dense stain (every tile carries light) and a field whose regions disagree are told apart; both name
    the config key that settles it."""
    def rec(floor, se):
        return {"counts": 110.0, "standard_error": se, "light_floor": floor, "uncertain": True}
    dense, field = qc.uncertain_offset("2", rec(300.0, 45.0)), qc.uncertain_offset("2", rec(2.0, 3.5))
    assert "(every tile carries light)" in dense and "every tile" not in field
    assert "differs between regions of the field" in field
    assert all("give basic.darkfield: {2: <counts>} or a dark frame" in m for m in (dense, field))


def test_one_camera_one_offset_across_cycles():
    """A cycle whose fitted camera offset differs from the other cycles' beyond their errors is named, with the
    value all cycles give together; cycles that agree within their errors are not, unless their own offset, which
    their stacks keep, lies noticeably from the camera's that plex.ome.tif is brought to (cyc004's CH2: 140 +- 15
    against 120, more than a tenth of its light floor of 100; before, it was not named)."""
    def rec(counts, se=1.0, floor=100.0):
        return {"counts": counts, "standard_error": se, "light_floor": floor, "uncertain": False, "per_plane": []}
    rows, reasons = qc.camera_across_cycles({"cyc001": {"1": rec(105), "2": rec(120)},
                                             "cyc002": {"1": rec(106), "2": rec(121)},
                                             "cyc003": {"1": rec(131), "2": rec(119.5)},
                                             "cyc004": {"1": rec(104), "2": rec(140, se=15)}})
    assert list(reasons) == ["cyc003", "cyc004"] and len(reasons["cyc003"]) == 1 and len(reasons["cyc004"]) == 1
    assert reasons["cyc004"][0].startswith("CH2: camera offset 140 ± 15 counts, within its error of the camera's "
                                           "120 ± 1 (4 cycles) that plex.ome.tif is brought to")
    assert "a dim marker reads -20 counts there against plex.ome.tif" in reasons["cyc004"][0]
    assert "basic.darkfield: {2: 120}" in reasons["cyc004"][0]
    assert reasons["cyc003"][0].startswith("CH1: camera offset 131 ± 1 counts, the other cycles' 105")
    assert "a dim marker reads -26 counts here" in reasons["cyc003"][0]      # its offset too high: too dark
    assert "plex.ome.tif is brought to the other cycles' value" in reasons["cyc003"][0]
    assert "basic.darkfield: {1: 105} (the other cycles together)" in reasons["cyc003"][0]
    assert [r["channel"] for r in rows] == ["1", "2"] and rows[0]["cyc003"] == "131.0 ± 1.0"
    assert rows[0]["the camera"] == "105.0 ± 1.2 (3 cycles)"
