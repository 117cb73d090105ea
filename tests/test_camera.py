"""One camera across cycles: the cycles' fitted offsets combined (``camera``), and registration bringing every
cycle of plex.ome.tif to the camera's value (a Blank cycle's offset, fitted on autofluorescence alone, was 35
counts off and made its marker read 33 counts too dark; bench/plex_bias.py)."""

import json

import numpy as np
import pytest
from scipy import ndimage

from plexgpu import camera, paths, stages
from plexgpu.experiment import CycleSpec
from plexgpu.image import stitching
from plexgpu.io.tiff import read_tiff, write_ome, write_plane
from plexgpu.job import job_context
from plexgpu.planes import PlanesRecord


def rec(counts, se=1.0, floor=100.0):
    return {"counts": counts, "standard_error": se, "light_floor": floor, "uncertain": False, "per_plane": []}


def test_a_cycle_that_contradicts_the_others_is_set_aside_and_the_rest_give_the_camera():
    cams = camera.across_cycles({"cyc001": {"2": rec(112.0)}, "cyc002": {"2": rec(113.0)},
                                 "cyc003": {"2": rec(152.0, se=2.0)}, "cyc004": {"2": rec(140.0, se=15.0)}})
    cam = cams["2"]
    assert cam.cycles == ["cyc001", "cyc002", "cyc004"] and list(cam.set_aside) == ["cyc003"]
    w = 1 / np.array([2.0, 2.0, 15.0]) ** 2                    # standard errors floored at 2 counts
    assert cam.counts == pytest.approx((w * [112, 113, 140]).sum() / w.sum())
    assert cam.set_aside["cyc003"].others == pytest.approx(cam.counts)
    assert cam.correction("cyc003") == pytest.approx(152.0 - cam.counts)      # what registration adds / F
    assert abs(cam.correction("cyc001")) < 1.0


def test_two_cycles_that_disagree_give_no_camera_and_keep_their_own():
    cam = camera.across_cycles({"cyc001": {"1": rec(100.0)}, "cyc002": {"1": rec(160.0)}})["1"]
    assert cam.counts is None and cam.correction("cyc001") == 0 and cam.correction("cyc002") == 0
    one = camera.across_cycles({"cyc001": {"1": rec(100.0)}})["1"]            # one cycle: its own
    assert one.counts == 100.0 and one.correction("cyc001") == 0


def test_a_difference_within_a_tenth_of_the_light_floor_is_not_set_aside():
    """The errors say 'differs', but a dim marker reads < 10 % of its floor off: not worth a warn."""
    cam = camera.across_cycles({"cyc001": {"1": rec(100.0, se=0.1, floor=500.0)},
                                "cyc002": {"1": rec(101.0, se=0.1, floor=500.0)},
                                "cyc003": {"1": rec(130.0, se=0.1, floor=500.0)}})["1"]
    assert not cam.set_aside and len(cam.cycles) == 3


TILE, GRID, STEP = (48, 64), (2, 3), (38, 50)


def _cycle_inputs(tmp, key: str, truth: np.ndarray, flat: np.ndarray, offset_error: float) -> dict:
    """What the stitch and EDF jobs of one cycle leave for registration: the EDF of tiles corrected with an
    offset ``offset_error`` counts too high ((raw - D - error) / F = light - error / F), blended as the
    stitch job blends; its flatfields (two planes alike), tile positions and fitted offset."""
    layout = [(r, c) for r in range(GRID[0]) for c in range(GRID[1])]
    model = stitching.StitchModel(layout, TILE, np.array([[r * STEP[0], c * STEP[1]] for r, c in layout], float))
    tiles = [truth[y:y + TILE[0], x:x + TILE[1]] - offset_error / flat for y, x in model.placement]
    folder = tmp / key
    folder.mkdir()
    edf = stitching.blend(tiles, model)
    out = {"edf": folder / "CH1.edf.ome.tif", "edf_deconvolved": folder / "CH1.edfd.ome.tif",
           "profiles": folder / "CH1.profiles.tif", "positions": folder / "positions.csv",
           "planes": folder / "planes.json"}
    write_plane(out["edf"], edf, "M", 0.5)
    write_plane(out["edf_deconvolved"], edf, "M", 0.5)
    prof = np.stack([np.stack([flat, np.full(TILE, 100.0 + offset_error)])] * 2).astype(np.float32)
    write_ome(out["profiles"], prof, "ZCYX", 0.5, 1.0, ["flatfield", "darkfield"])
    out["positions"].write_text(model.positions_csv())
    PlanesRecord(recorded={}, offsets={"1": rec(100.0 + offset_error)}).write(out["planes"])
    return {k: str(v) for k, v in out.items()}


@pytest.mark.parametrize("shared", [True, False])
def test_registration_brings_every_cycle_to_the_camera_offset(tmp_path, shared):
    rng = np.random.default_rng(3)
    shape = (STEP[0] + TILE[0], 2 * STEP[1] + TILE[1])
    truth = 200 + 400 * ndimage.gaussian_filter(rng.random(shape), 3) ** 2 * 30
    yy, xx = np.mgrid[:TILE[0], :TILE[1]]
    flat = 1.3 - 0.6 * (((yy - 24) / 24) ** 2 + ((xx - 32) / 32) ** 2) / 2      # vignetting 0.7..1.3
    errors = {"cyc001": 0.0, "cyc002": 0.8, "cyc003": 40.0}                   # cyc003: a Blank cycle's fit
    made = {k: _cycle_inputs(tmp_path, k, truth, flat, e) for k, e in errors.items()}
    keys = list(errors)
    specs = [CycleSpec(i + 1, k, k, 1, *GRID, "row-major", 0.2, 2, (1,), ("M",), 0.5, 1.0, (520.0,))
             for i, k in enumerate(keys)]
    inputs = {name: [made[k][name] for k in keys] for name in made["cyc001"]}
    out = paths.outputs("registration", tmp_path / "res", [1], cycles=keys)
    for f in out["registered"] + out["registered_deconvolved"]:
        (tmp_path / "res" / f).parent.mkdir(parents=True, exist_ok=True)
    reg_cfg = {"reference_cycle": 1, "reference_channel": 1, "model": "translation", "block_px": 64,
               "smoothness": 1.0, "max_local_px": 20.0, "plex_dtype": "float32"}
    with job_context("registration", str(tmp_path / "registration.log"), {"cpus_per_task": 1}, "cpu") as ctx:
        stages.register(ctx, specs, reg_cfg, inputs, out, shared_camera=shared)
    record = json.loads(open(out["camera"]).read())["channels"]["1"]
    assert record["from_cycles"] == ["cyc001", "cyc002"] and list(record["set_aside"]) == ["cyc003"]
    inner = (slice(8, -8), slice(8, -8))
    off = {k: float(np.median((read_tiff(p) - truth)[inner]))
           for k, p in zip(keys, out["registered"])}
    camera_value = 100.4                                                       # cyc001 and cyc002 together
    if shared:              # every cycle at the camera's offset: (own - camera) / F added back
        for k in errors:
            assert off[k] == pytest.approx(-(camera_value - 100.0), abs=0.3), (k, off)
        assert record["per_cycle"]["cyc003"]["added_over_flatfield"] == pytest.approx(40.0 - 0.4)
    else:                   # each cycle keeps its own: cyc003 reads 40 / F counts too dark
        assert off["cyc003"] < -30 and abs(off["cyc001"]) < 0.3
        assert record["per_cycle"]["cyc003"]["added_over_flatfield"] == 0.0


def test_a_cycle_whose_stacks_keep_an_offset_off_the_camera_is_named_in_camera_json_and_the_log(tmp_path):
    """A Blank cycle's fit agrees with the camera within its (large) error, but its stacks keep its own offset:
    registration records what a dim marker reads there against plex.ome.tif, as the QC page warns."""
    own = {"cyc001": rec(112.0, 1.5, 40.0), "cyc002": rec(111.0, 1.5, 40.0), "cyc003": rec(97.0, 7.0, 40.0)}
    specs, planes = [], []
    for i, (k, r) in enumerate(own.items()):
        specs.append(CycleSpec(i + 1, k, k, 1, *GRID, "row-major", 0.2, 2, (1,), ("M",), 0.5, 1.0, (520.0,)))
        planes.append(str(tmp_path / f"{k}.planes.json"))
        PlanesRecord(recorded={}, offsets={"1": r}).write(planes[-1])
    out = tmp_path / "camera.json"
    with job_context("registration", str(tmp_path / "registration.log"), {"cpus_per_task": 1}, "cpu"):
        stages.camera_offsets(specs, {"planes": planes}, True, str(out))
    record = json.loads(out.read_text())["channels"]["1"]
    assert record["from_cycles"] == ["cyc001", "cyc002", "cyc003"] and not record["set_aside"]
    assert list(record["stacks_apart"]) == ["cyc003"]
    assert record["stacks_apart"]["cyc003"] == pytest.approx(record["counts"] - 97.0)
    assert record["stacks_apart"]["cyc003"] > 10                                # reads too bright in its stacks
    log = (tmp_path / "registration.log").read_text()
    assert "cyc003's own offset 97.0" in log and "reads +" in log
