"""The additive bias of what reaches ``registered/plex.ome.tif``, per marker and cycle, against the truth,
beside basicpy on the same tiles.

A camera offset that is wrong by d counts makes every pixel of a marker read d counts too bright (or too
dark): a dim marker's cells read too bright by their ratio, and unequally per cycle where each cycle's
offset is wrong differently. This bench measures that bias where the user measures it.

Each regime is written as raw data by ``plexgpu synth`` (3 cycles of 4 x 5 tiles of 128 x 160, 5 planes,
2 channels; the camera offset ~90 / ~100 counts per channel with a gradient of 35 % of it across the
sensor and a column pattern) and run by Snakemake through ``registration`` and ``qc`` with the local
profile (CPU, deconvolution off: this is about the quantification image). Then:

* **ours, end to end**: plex.ome.tif's channel of each (cycle, marker) against the truth (the specimen
  as a perfectly focused widefield image shows it, in counts, placed where the reference cycle's mosaic
  shows it), both smoothed by a Gaussian of 6 px, inside a 24 px border: the least-squares intercept
  (counts) and slope, the truth first blurred to the image's resolution (the Gaussian of 0-3 px that fits
  best). The EDF's plane lies up to half a plane off the sheet, a defocus blur the truth has not: it keeps
  the mean and lowers the contrast, and against the sharp truth it enters the fit as slope < 1 and a
  positive intercept that is no offset (6 px of smoothing was taken to leave < 1 count of it; on the
  dense DAPI stain, mean 1537 counts, it left +5..+9). The intercept against the sharp truth is kept
  beside it (``plex_bias_sharp_truth``), and so is how far apart one channel's cycles are;
* **per plane, ours and basicpy's**: the noise-free tiles of each (cycle, channel, z) corrected by the
  method's flat- and darkfield against the light that reached the sensor: the intercept of
  (E - D^) / F^ against (E - D) / F over every tile pixel (E the noise-free tile, F, D the true flat and
  offset, with the light fixed to the sensor where the regime has it: it is added, not shaded). Ours: the
  profiles the stitch job wrote (basic/<cycle>/CH<ch>.profiles.tif); basicpy 2.0.0
  fitted on the same noisy raw tiles with its darkfield (sort_intensity, approximate), one fit per plane;
* the spread of our offset over the planes of a channel (it is one per channel: 0), the dimmest
  background (the 1st percentile of the marker's smoothed image in plex.ome.tif), and the QC verdict
  of each cycle's stitch stage with its reasons.

  python bench/plex_bias.py [--regimes dense,sparse,...] [--no-peers] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import tifffile
import yaml
from common import HERE, timer, write_result
from scipy import ndimage, optimize
from stitch_sweep import basicpy_runs

from plexgpu import qc
from plexgpu.image.synth import SynthDataset, SynthSpec
from plexgpu.io.raw import tile_filename
from plexgpu.io.tiff import read_tiff

REPO = HERE.parent
BASE = dict(cycles=3, rows=4, cols=5, tile=(128, 160), overlap=0.2, z_planes=5, channels=2, jitter_px=2.0,
            vignetting=0.45, dark_offset=100.0, seed=5)
BLANK = ("DAPI", "CD3", "DAPI", "CD8", "DAPI", "Blank")
REGIMES = {   # name: (what it is, SynthSpec settings over BASE)
    "dense": ("dense stain everywhere, no bare slide", dict(nuclei_density=3.0, tissue_fraction=1.0)),
    "sparse": ("sparse marker (3 % of cells)", dict(sparse_fraction=0.03)),
    "dim": ("dim, low counts (a tenth of the light), sparse marker", dict(brightness=0.1, sparse_fraction=0.03)),
    "ramp": ("offset 450 counts, a 160-count ramp across the sensor", dict(dark_offset=450.0)),
    "dense_dark": ("dense stain, large offset (450)", dict(nuclei_density=3.0, tissue_fraction=1.0,
                                                        dark_offset=450.0)),
    "stray": ("stray light fixed to the sensor (150 counts at one corner, not shaded), sparse marker",
              dict(sparse_fraction=0.03, stray_light=150.0)),
    "blank": ("a Blank cycle (cycle 3's marker: autofluorescence only), dense", dict(
        nuclei_density=3.0, tissue_fraction=1.0, markers=BLANK)),
}
SMOOTH = 6.0    # px: the EDF lies up to half a plane off the sheet, a defocus blur the truth has not
BORDER = 24
CELL_RING = 2   # px: a nucleus grown by this is the cell the user measures (nucleus + a ring of cytoplasm)
STAINED = 2.0   # a cell the marker stains: its truth mean at least this times the channel's dimmest cells
BASICPY = {"get_darkfield": True, "sort_intensity": True, "fitting_mode": "approximate"}


def run_workflow(raw: Path, work: Path) -> None:
    cfg = {"raw_dir": str(raw), "results_dir": str(work / "results"), "compute": {"device": "cpu"},
           "deconvolution": {"iterations": 0},
           "resources": {r: {"cpus_per_task": 2, "mem_mb": 4000, "runtime": 30}
                         for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for target in ("registration", "qc"):
        subprocess.run(["snakemake", target, "--configfile", str(work / "config.yaml"), "--profile", "profiles/local",
                        "--cores", "2", "--quiet", "all"], cwd=REPO, env=env, check=True, capture_output=True)


def intercept(image: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ``image`` against ``truth``."""
    a, b = np.polyfit(truth.ravel().astype(np.float64), image.ravel().astype(np.float64), 1)
    return float(a), float(b)


def at_resolution(im: np.ndarray, sharp: np.ndarray, inner) -> tuple[float, float, float]:
    """(slope, intercept, sigma): the fit of ``im`` against the truth blurred by the Gaussian (sigma px, 0-3)
    that fits it best, both smoothed by SMOOTH. A blur keeps the mean and lowers the contrast: against a
    sharper truth it enters the fit as slope < 1 and an intercept of (1 - slope) x the mean (a 0.7 px blur
    of a dense DAPI stain averaging 1537 counts: slope 0.994, intercept +9), which is no offset."""
    target = ndimage.gaussian_filter(im, SMOOTH)[inner]

    def fit(sigma):
        tr = ndimage.gaussian_filter(ndimage.gaussian_filter(sharp, sigma) if sigma > 0 else sharp, SMOOTH)[inner]
        a, b = intercept(target, tr)
        return a, b, float(np.mean((target - a * tr - b) ** 2))
    best = optimize.minimize_scalar(lambda s: fit(s)[2], bounds=(0.0, 3.0), method="bounded",
                                    options={"xatol": 0.02})
    sigma = float(best.x) if best.fun < fit(0.0)[2] else 0.0
    a, b, _ = fit(sigma)
    return a, b, sigma


def cells_in_mosaic(ds: SynthDataset, origin: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The cells a user measures (each nucleus grown by CELL_RING px), labelled where plex.ome.tif shows them
    (the truth's placement: mosaic pixel i is canvas point i + origin + cycle 1's frame origin), and the ids of
    those whole inside the BORDER and in tissue."""
    cells = ndimage.grey_dilation(ds.nucleus_labels, size=2 * CELL_RING + 1)
    start = np.asarray(origin, float) + np.asarray(ds.frame_origin(1), float)
    cells = ndimage.affine_transform(cells, np.eye(2), offset=start, output_shape=shape, order=0, mode="constant")
    tissue = ndimage.affine_transform(ds.tissue, np.eye(2), offset=start, output_shape=shape, order=1)
    edge = np.ones(shape, bool)
    edge[BORDER:-BORDER, BORDER:-BORDER] = False
    ids = np.setdiff1d(np.unique(cells), np.unique(cells[edge]))
    ids = ids[ids > 0]
    return cells, ids[ndimage.minimum(tissue, cells, ids) > 0.95]


def per_cell(img: np.ndarray, truth: np.ndarray, cells: np.ndarray, ids: np.ndarray) -> dict:
    """Each cell's mean in ``img`` against the truth's (at the image's resolution), for the cells the marker
    stains (truth mean at least STAINED x the channel's dimmest cells, their 5th percentile): the median
    ratio and difference (counts), the ratio's 5th-95th percentile, and the median ratio of the dimmest
    quarter of them (where an offset error shows most)."""
    im = np.asarray(ndimage.mean(img, cells, ids))
    tr = np.asarray(ndimage.mean(truth, cells, ids))
    stained = tr >= STAINED * max(float(np.percentile(tr, 5)), 1.0)
    im, tr = im[stained], tr[stained]
    r = im / tr
    dim = tr <= np.percentile(tr, 25)
    return {"cells": int(stained.sum()), "ratio": float(np.median(r)), "difference": float(np.median(im - tr)),
            "ratio_5_95": [float(np.percentile(r, 5)), float(np.percentile(r, 95))],
            "dimmest_quarter_ratio": float(np.median(r[dim])), "means": dict(zip(ids[stained].tolist(), im.tolist()))}


def per_block(img: np.ndarray, truth: np.ndarray, inner, block: tuple[int, int]) -> dict:
    """The image less the truth (at the image's resolution), averaged over blocks of ``block`` px across the
    mosaic: where a local offset or flatfield error shows that one intercept over the whole mosaic hides. Its
    extremes (counts), their spread (max - min) and, relative to the truth's block means in the brighter half of
    the blocks (a flatfield error is relative), their extremes."""
    def means(a):
        gy, gx = a.shape[0] // block[0], a.shape[1] // block[1]
        return a[:gy * block[0], :gx * block[1]].reshape(gy, block[0], gx, block[1]).mean(axis=(1, 3))
    d, t = means((img - truth)[inner]), means(truth[inner])
    lit = t >= np.median(t)                   # relative where the specimen is: the brighter half of the blocks
    return {"blocks": int(d.size), "block_px": list(block), "min": float(d.min()), "max": float(d.max()),
            "spread": float(d.max() - d.min()),
            "relative_brighter_half": [float((d / t)[lit].min()), float((d / t)[lit].max())]}


def plex_bias(ds: SynthDataset, truth: dict, res: Path) -> dict:
    """(cycle, channel) -> {intercept, slope, dimmest background, intercept against the sharp truth, the blur
    matched, per_cell, per_block} of plex.ome.tif against the truth."""
    spec = ds.spec
    with tifffile.TiffFile(res / "registered/plex.ome.tif") as tif:
        plex = tif.series[0].levels[0].asarray()
    origin = np.array(truth["positions"][0], float).min(axis=0)
    o = np.floor(origin).astype(int)
    out, cells = {}, None
    for c in range(1, spec.cycles + 1):
        for ch in range(1, spec.channels + 1):
            img = plex[(c - 1) * spec.channels + ch - 1].astype(np.float32)
            counts = 3000.0 * spec.brightness / ch * ds.in_focus(c, ch, frame_of=1)
            sharp = ndimage.shift(counts, -(origin - o), order=3, mode="nearest")[o[0]:, o[1]:]
            h, w = min(sharp.shape[0], img.shape[0]), min(sharp.shape[1], img.shape[1])
            img, sharp = img[:h, :w], sharp[:h, :w]
            inner = (slice(BORDER, h - BORDER), slice(BORDER, w - BORDER))
            im = ndimage.gaussian_filter(img, SMOOTH)[inner]
            tr = ndimage.gaussian_filter(sharp, SMOOTH)[inner]
            _, b_sharp = intercept(im, tr)
            a, b, sigma = at_resolution(img, sharp, inner)
            if cells is None:
                cells = cells_in_mosaic(ds, origin, (h, w))
            truth_res = ndimage.gaussian_filter(sharp, sigma) if sigma > 0 else sharp
            out[(c, ch)] = {"bias": b, "slope": a, "dimmest": float(np.percentile(im, 1)), "bias_sharp": b_sharp,
                            "sigma": sigma, "cells": per_cell(img, truth_res, *cells),
                            "blocks": per_block(img, truth_res, inner, (spec.tile[0] // 2, spec.tile[1] // 2))}
    return out


def cycles_cell_by_cell(e2e: dict, spec: SynthSpec) -> dict:
    """The nuclear stain (channel 1, the same in every cycle) cell by cell: each later cycle's cell means over
    the first cycle's, the 5th-95th percentile over the cells (1.00-1.00: the cycles agree cell by cell)."""
    first = e2e[(1, 1)]["cells"]["means"]
    out = {}
    for c in range(2, spec.cycles + 1):
        other = e2e[(c, 1)]["cells"]["means"]
        r = np.array([other[k] / first[k] for k in first if k in other])
        out[f"cyc{c:03d}/cyc001"] = [float(np.percentile(r, 5)), float(np.median(r)), float(np.percentile(r, 95))]
    return out


def plane_bias(ds: SynthDataset, c: int, ch: int, z: int, flat_hat: np.ndarray, dark_hat: np.ndarray) -> float:
    """Intercept (counts) of the noise-free tiles corrected by (flat_hat, dark_hat) against the light."""
    flat, dark = ds.flatfield(ch, z), ds.darkfield(ch, z) + ds.stray(ch)     # the light fixed to the sensor: additive
    tiles = np.stack(ds.expected_tiles(c, ch, z))
    light = (tiles - dark) / flat
    corrected = (tiles - dark_hat) / (flat_hat / flat_hat.mean())
    return intercept(corrected, light)[1]


def raw_plane(raw: Path, spec: SynthSpec, c: int, ch: int, z: int) -> np.ndarray:
    folder = raw / f"cyc{c:03d}_reg{spec.region:03d}"
    return np.stack([read_tiff(folder / tile_filename(spec.region, t, z, ch))
                     for t in range(1, spec.rows * spec.cols + 1)]).astype(np.float32)


def qc_stitch(res: Path) -> dict:
    """cycle -> (status, reasons) of its stitch stage on the QC page: the stitch rule's, and the camera across
    cycles' warns of that cycle (qc_page merges them into the same cell)."""
    metrics = json.loads((res / "qc/metrics.json").read_text())
    camera = metrics.get("camera", {}).get("warnings", {})
    cells = {m["cycle"]: qc.with_camera(m, camera.get(m["cycle"], [])) for m in metrics["stitch"]}
    return {c: (v["status"], v["reasons"]) for c, v in cells.items()}


def run_regime(name: str, what: str, settings: dict, peers: bool, keep: Path | None, reuse: Path | None) -> dict:
    """One regime, written and run (into ``keep`` if given), or measured again where ``reuse`` holds its run."""
    ds = SynthDataset(SynthSpec(**{**BASE, **settings}))
    spec = ds.spec
    t = {"s": None}
    if reuse is not None:
        work = next(reuse.glob(f"plex_bias_{name}_????????"))   # mkdtemp's 8-character suffix: dense is not dense_dark
        raw = work / "raw"
    else:
        work = Path(tempfile.mkdtemp(prefix=f"plex_bias_{name}_", dir=keep))
        raw = ds.write(work / "raw")
        with timer(t, "s"):
            run_workflow(raw, work)
    truth = json.loads((raw / "truth/truth.json").read_text())
    res = work / "results"
    e2e = plex_bias(ds, truth, res)
    across = cycles_cell_by_cell(e2e, spec)
    names = spec.marker_names()
    rows = []
    for c in range(1, spec.cycles + 1):
        for ch in range(1, spec.channels + 1):
            prof = read_tiff(res / f"basic/cyc{c:03d}/CH{ch}.profiles.tif")        # Z, (flat, dark), Y, X
            ours = [plane_bias(ds, c, ch, z, prof[z - 1, 0], prof[z - 1, 1]) for z in range(1, spec.z_planes + 1)]
            spread = float(np.abs(prof[:, 1].mean(axis=(1, 2)) - prof[0, 1].mean()).max())
            true_off = float(np.mean([ds.darkfield(ch, z).mean() for z in range(1, spec.z_planes + 1)])
                             + ds.stray(ch).mean())                # the darkfield: offset and light fixed to the sensor
            m = e2e[(c, ch)]
            m["cells"].pop("means")
            row = {"cycle": c, "channel": ch, "marker": names[(c - 1) * spec.channels + ch - 1],
                   "plex_bias": m["bias"], "plex_slope": m["slope"], "dimmest": m["dimmest"],
                   "plex_bias_sharp_truth": m["bias_sharp"], "blur_matched_px": m["sigma"],
                   "per_cell": m["cells"], "per_block": m["blocks"],
                   "ours_plane_bias": [min(ours), max(ours)], "ours_offset": float(prof[:, 1].mean()),
                   "true_offset": true_off, "ours_offset_spread_over_planes": spread}
            if peers:
                planes = [raw_plane(raw, spec, c, ch, z) for z in range(1, spec.z_planes + 1)]
                theirs = [plane_bias(ds, c, ch, z, f, d) for z, (f, d) in
                          enumerate(basicpy_runs(planes, BASICPY), start=1)]
                row["basicpy_plane_bias"] = [min(theirs), max(theirs)]
            rows.append(row)
    qc = qc_stitch(res)
    if keep is None and reuse is None:
        shutil.rmtree(work)
    return {"regime": name, "what": what, "seconds": t["s"], "markers": rows, "qc_stitch": qc,
            "nuclear_stain_cell_by_cell": across}


def summary(r: dict) -> dict:
    ms = r["markers"]
    worst = max(ms, key=lambda m: abs(m["plex_bias"]))
    spread = max(max(m["plex_bias"] for m in ms if m["channel"] == ch) - min(m["plex_bias"] for m in ms
                                                                             if m["channel"] == ch)
                 for ch in {m["channel"] for m in ms})
    acc = (f"plex.ome.tif bias {min(m['plex_bias'] for m in ms):+.1f}..{max(m['plex_bias'] for m in ms):+.1f} counts "
           f"(worst {worst['marker']} cyc{worst['cycle']:03d}: {worst['plex_bias']:+.1f}, dimmest background "
           f"{worst['dimmest']:.0f}; truth blurred {min(m['blur_matched_px'] for m in ms):.1f}-"
           f"{max(m['blur_matched_px'] for m in ms):.1f} px to the image's resolution; against the sharp truth "
           f"{min(m['plex_bias_sharp_truth'] for m in ms):+.1f}..{max(m['plex_bias_sharp_truth'] for m in ms):+.1f}); "
           f"one channel's cycles within {spread:.1f} counts of each other; per plane "
           f"{min(m['ours_plane_bias'][0] for m in ms):+.1f}.."
           f"{max(m['ours_plane_bias'][1] for m in ms):+.1f}; offset spread over a channel's planes "
           f"{max(m['ours_offset_spread_over_planes'] for m in ms):.2f}; QC stitch: "
           + ", ".join(f"{c} {s}" for c, (s, _) in sorted(r["qc_stitch"].items())))
    cells = [m["per_cell"] for m in ms]
    blocks = [m["per_block"] for m in ms]
    across = r["nuclear_stain_cell_by_cell"]
    acc += (f"; per cell (stained): median ratio {min(c['ratio'] for c in cells):.3f}-"
            f"{max(c['ratio'] for c in cells):.3f}, dimmest quarter {min(c['dimmest_quarter_ratio'] for c in cells):.3f}-"
            f"{max(c['dimmest_quarter_ratio'] for c in cells):.3f}, 5-95 % over cells "
            f"{min(c['ratio_5_95'][0] for c in cells):.2f}-{max(c['ratio_5_95'][1] for c in cells):.2f}; "
            f"per block of half a tile: {min(b['min'] for b in blocks):+.1f}..{max(b['max'] for b in blocks):+.1f} "
            f"counts ({100 * min(b['relative_brighter_half'][0] for b in blocks):+.1f}.."
            f"{100 * max(b['relative_brighter_half'][1] for b in blocks):+.1f} % of the truth in the brighter half of "
            f"the blocks), spread within one image <= {max(b['spread'] for b in blocks):.1f}; nuclear stain cell by cell, "
            "later cycle / first (5-50-95 %): " + ", ".join(f"{k} {v[0]:.3f}/{v[1]:.3f}/{v[2]:.3f}"
                                                           for k, v in across.items()))
    peer = None
    if all("basicpy_plane_bias" in m for m in ms):
        peer = (f"basicpy 2.0.0 darkfield, per plane {min(m['basicpy_plane_bias'][0] for m in ms):+.1f}.."
                f"{max(m['basicpy_plane_bias'][1] for m in ms):+.1f} counts")
    return {"what": f"additive bias, {r['what']}", "ours_s": r["seconds"], "peer": "basicpy 2.0.0" if peer else None,
            "ours_accuracy": acc, "peer_accuracy": peer}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep each regime's raw data and results under this folder")
    ap.add_argument("--reuse", type=Path, help="measure the runs an earlier --keep left in this folder again "
                                               "(no workflow run)")
    args = ap.parse_args()
    results = []
    for name in args.regimes.split(","):
        what, settings = REGIMES[name]
        r = run_regime(name, what, settings, not args.no_peers, args.keep, args.reuse)
        results.append(r)
        print(json.dumps(summary(r)), flush=True)
    rows = [summary(r) for r in results]
    every = [m for r in results for m in r["markers"]]
    rows.append({"what": f"worst over {len(results)} regimes",
                 "ours_accuracy": f"plex.ome.tif |bias| max {max(abs(m['plex_bias']) for m in every):.1f} counts",
                 "peer_accuracy": (f"basicpy per plane |bias| max "
                                   f"{max(max(abs(v) for v in m['basicpy_plane_bias']) for m in every):.1f} counts"
                                   if all("basicpy_plane_bias" in m for m in every) else None)})
    write_result("plex_bias" if not args.no_peers else "plex_bias_ours", rows + [{"detail": results}],
                 notes=__doc__.split("\n\n")[1])


if __name__ == "__main__":
    main()
