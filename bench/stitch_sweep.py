"""The stitch stage on hard synthetic regimes, side by side with its peers on the same tiles.

Each regime is written as raw data by ``plexgpu synth`` (5 x 6 tiles of 128 x 160, 20 % overlap,
snake, Gaussian stage jitter 3 px (sub-pixel), camera turned 0.5 deg, vignetting 55 %, camera
offset ~100 counts with a gradient and column pattern, Poisson + read noise) and stitched by
the workflow's own stage function (``stages.stitch``, CPU). Measured against the truth:

* flatfield: relative RMS error per (channel, z) plane, mean and worst plane, with basicpy
  2.0.0 fitted on the same raw tiles (flat only, its default; and with its darkfield,
  sort_intensity, approximate fit), and no correction (a flat of ones);
* darkfield: |estimate - truth| / truth, mean over the tile, worst plane; the planes our job
  flags as uncertain (every tile carries light everywhere) are counted;
* positions: each tile's error after removing the common offset, max and median, over the tiles
  that share texture with a neighbour (a pair whose two strips both hold texture, measured on the
  data: a tile on bare slide can be placed by nothing but the stage), with ASHLAR 1.20's
  EdgeAligner given the same reference plane corrected by the *true* shading, at its default
  filter (``filter_sigma`` 0) and at its best (``--filter-sigma 1``); and the accepted pairs more
  than 1 px from the truth (a wrong pair accepted). Where bare slide parts the tissue, groups of tiles
  are linked by accepted pairs and nothing in the data places one group against another (the stage
  model does, within the stage's own error): the max is also given within each group, its own median
  error removed, for ours and for ASHLAR on our groups.

  python bench/stitch_sweep.py [--regimes dense,sparse,...] [--peers basicpy,ashlar | --no-peers]

Without basicpy (its CPU fits take minutes per regime) the rows go to ``stitch_sweep_positions``,
so the full comparison in ``stitch_sweep`` is not overwritten by a partial one.
"""

import argparse
import csv
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from common import HERE, timer, write_result

from plexgpu import stages
from plexgpu.config import validate_config
from plexgpu.experiment import cycle_spec, resolve_experiment
from plexgpu.io.raw import grid_layout
from plexgpu.io.tiff import read_tiff
from plexgpu.job import job_context
from plexgpu.image import stitching
from plexgpu.image.synth import SynthDataset, SynthSpec

BASE = dict(cycles=1, rows=5, cols=6, tile=(128, 160), overlap=0.2, z_planes=5, channels=2, jitter_px=3.0,
            rotation_deg=0.5, vignetting=0.55, dark_offset=100.0, seed=11)
REGIMES = {   # name: (what it is, SynthSpec settings over BASE)
    "dense": ("dense stain, no empty pixels", dict(nuclei_density=3.0, tissue_fraction=1.0)),
    "sparse": ("sparse marker (3 % of cells)", dict(sparse_fraction=0.03)),
    "bare": ("bare-slide tiles, half the field tissue", dict(tissue_fraction=0.5, blank_tiles=(1, 2, 7))),
    "vignet20": ("vignetting 20 %", dict(vignetting=0.2)),
    "vignet60": ("vignetting 60 %, dense", dict(vignetting=0.6, nuclei_density=2.0, tissue_fraction=1.0)),
    "dark2": ("offset 2 % of the signal", dict(dark_offset=30.0)),
    "dark30": ("offset 30 % of the signal", dict(dark_offset=450.0)),
    "rotated": ("camera turned 1.5 deg, 10 % overlap", dict(rotation_deg=1.5, overlap=0.1, tile=(192, 192))),
    "overlap5": ("5 % overlap (256 px tiles)", dict(overlap=0.05, tile=(256, 256))),
    "field": ("sparse field: tissue on 15 % of the slide", dict(tissue_fraction=0.15)),
    "hot": ("hot pixels on 0.05 % of the sensor (300-4000 counts)", dict(hot_pixels=0.0005)),
}
ASHLAR_FILTERS = (0.0, 1.0)   # its default whitening filter and its best on these regimes
VENV_BASICPY = HERE / ".venv-basicpy/bin/python"
VENV_ASHLAR = HERE / ".venv-ashlar/bin/python"


def rel_rms(flat, truth):
    flat = flat / flat.mean()
    return float(np.sqrt(np.mean((flat - truth) ** 2)))


def position_errors(pos, truth, textured, blank=()):
    """Max and median error over the tiles that share texture with a neighbour (``textured``: 0-based);
    max over the blank tiles (placed by the stage model alone: nothing in them can say where they are)."""
    err = np.asarray(pos, float) - np.asarray(truth, float)
    err -= np.median(err, axis=0)
    e = np.abs(err).max(axis=1)
    content = [i for i in textured if i + 1 not in blank]
    return float(e[content].max()), float(np.median(e[content])), float(max((e[t - 1] for t in blank), default=0))


def linked_groups(pairs, n: int) -> list[int]:
    """Each tile's group (0-based tiles): tiles joined by accepted pairs (pairs.csv rows). Nothing in the
    data places one group against another (bare slide between them): the stage model does, as well as
    the stage's own error lets it."""
    group = list(range(n))

    def root(t):
        while group[t] != t:
            group[t] = group[group[t]]
            t = group[t]
        return t
    for r in pairs:
        if r["accepted"] == "1":
            group[root(int(r["tile_a"]) - 1)] = root(int(r["tile_b"]) - 1)
    return [root(t) for t in range(n)]


def within_groups(pos, truth, textured, groups) -> float:
    """Max error over the textured tiles of groups of two or more tiles, each group's own median error
    removed: what the tile overlaps determine."""
    err = np.asarray(pos, float) - np.asarray(truth, float)
    worst = 0.0
    for g in set(groups):
        members = [i for i in range(len(groups)) if groups[i] == g]
        inside = [i for i in members if i in textured]
        if len(members) < 2 or not inside:
            continue
        e = err[members] - np.median(err[members], axis=0)
        worst = max(worst, float(np.abs(e[[members.index(i) for i in inside]]).max()))
    return worst


def textured_tiles(pairs) -> list[int]:
    """Tiles (0-based) with a neighbour pair whose two strips both hold texture (pairs.csv rows)."""
    from plexgpu.image.texture import MIN_TEXTURE_SNR

    return sorted({int(r[k]) - 1 for r in pairs if min(float(r["texture_a"]), float(r["texture_b"])) >= MIN_TEXTURE_SNR
                   for k in ("tile_a", "tile_b")})


def wrong_pairs(pairs, truth, step) -> int:
    """Accepted pairs whose offset is more than 1 px from the truth."""
    truth = np.asarray(truth, float)
    wrong = 0
    for r in pairs:
        a, b = int(r["tile_a"]) - 1, int(r["tile_b"]) - 1
        nominal = np.array([0, step[1]]) if r["direction"] == "h" else np.array([step[0], 0])
        dev = np.array([float(r["dy_px"]), float(r["dx_px"])])
        wrong += r["accepted"] == "1" and np.abs(truth[b] - truth[a] - nominal - dev).max() > 1
    return wrong


def run_ours(ds: SynthDataset, tmp: Path):
    raw = ds.write(tmp / "raw")
    config = validate_config({"raw_dir": str(raw), "results_dir": str(tmp / "results"), "compute": {"device": "cpu"}})
    spec = cycle_spec(resolve_experiment(config), 1)
    res = tmp / "results"
    out = {"stitched": [str(res / f"CH{ch}.ome.tif") for ch in spec.channels],
           "profiles": [str(res / f"CH{ch}.profiles.tif") for ch in spec.channels],
           "positions": str(res / "positions.csv"), "pairs": str(res / "pairs.csv"), "planes": str(res / "planes.json"),
           "defects": str(res / "defects.csv")}
    res.mkdir(parents=True)
    t = {}
    with job_context("stitch", str(tmp / "stitch.log"), {"cpus_per_task": 2}, "cpu") as ctx, timer(t, "s"):
        stages.stitch(ctx, spec, config["basic"], config["stitch"], out)
    with open(out["positions"]) as fh:
        pos = [(float(r["y_px"]), float(r["x_px"])) for r in csv.DictReader(fh)]
    shading = json.loads(Path(out["planes"]).read_text())["shading"]
    with open(out["pairs"]) as fh:
        pairs = [r for r in csv.DictReader(fh) if r["tile_a"].isdigit()]
    return raw, {ch: read_tiff(p) for ch, p in zip(spec.channels, out["profiles"])}, pos, shading, pairs, t["s"]


def noisy_planes(raw: Path, ds: SynthDataset, ch: int, z: int):
    from plexgpu.io.raw import tile_filename

    n = ds.spec.rows * ds.spec.cols
    return np.stack([read_tiff(raw / "cyc001_reg001" / tile_filename(1, t, z, ch)) for t in range(1, n + 1)])


def basicpy_runs(planes: list[np.ndarray], settings: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/planes.npz", **{f"p{i:03d}": p.astype(np.float32) for i, p in enumerate(planes)})
        subprocess.run([str(VENV_BASICPY), str(HERE / "basicpy_peer.py"), f"{tmp}/planes.npz", f"{tmp}/out.npz",
                        json.dumps(settings)], capture_output=True, text=True, check=True)
        prof = np.load(f"{tmp}/out.npz")
        return list(zip(prof["flat"], prof["dark"]))


def ashlar_positions(ds: SynthDataset, raw: Path, filter_sigma: float = 0.0):
    """ASHLAR on the reference plane (CH1, middle z) corrected by the true shading, at its whitening
    filter ``filter_sigma``; positions in acquisition order."""
    spec = ds.spec
    z = (spec.z_planes + 1) // 2
    tiles = (noisy_planes(raw, ds, 1, z).astype(np.float32) - ds.darkfield(1, z)) / ds.flatfield(1, z)
    layout = grid_layout(spec.rows, spec.cols, spec.order)
    raster = sorted(range(len(layout)), key=lambda i: layout[i])        # acquisition index of each raster slot
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/tiles.npz", tiles=np.stack([tiles[i] for i in raster]), rows=spec.rows, cols=spec.cols,
                 overlap=spec.overlap, max_shift=30.0, filter_sigma=filter_sigma)
        out = subprocess.run([str(VENV_ASHLAR), str(HERE / "ashlar_peer.py"), f"{tmp}/tiles.npz"],
                             capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    pos = np.empty((len(layout), 2))
    for slot, i in enumerate(raster):
        pos[i] = res["positions"][slot]
    return pos, res["seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--peers", default="basicpy,ashlar", help="peers to run beside ours")
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    wanted = set() if args.no_peers else set(args.peers.split(","))
    run_basicpy = "basicpy" in wanted and VENV_BASICPY.exists()
    run_ashlar = "ashlar" in wanted and VENV_ASHLAR.exists()
    rows, worst = [], {}
    for key in args.regimes.split(","):
        name, settings = REGIMES[key]
        spec = SynthSpec(**{**BASE, **settings})
        ds = SynthDataset(spec)
        with tempfile.TemporaryDirectory() as tmp:
            raw, profiles, pos, shading, pairs, seconds = run_ours(ds, Path(tmp))
            textured = textured_tiles(pairs)
            step = stitching.nominal_step(spec.tile, spec.overlap)
            keys = [(ch, z) for ch in range(1, spec.channels + 1) for z in range(1, spec.z_planes + 1)]
            truth = {k: (ds.flatfield(*k), ds.darkfield(*k)) for k in keys}
            ours_f = [rel_rms(profiles[ch][z - 1, 0], truth[(ch, z)][0]) for ch, z in keys]
            ours_d = [float(np.abs(profiles[ch][z - 1, 1] - truth[(ch, z)][1]).mean() / truth[(ch, z)][1].mean())
                      for ch, z in keys]
            bias = [float(profiles[ch][z - 1, 1].mean() - truth[(ch, z)][1].mean()) for ch, z in keys]
            flagged = sum(shading[f"{ch}/{z}"]["offset_uncertain"] for ch, z in keys)
            ones = [rel_rms(np.ones_like(truth[k][0]), truth[k][0]) for k in keys]
            pmax, pmed, pblank = position_errors(pos, ds.positions[0], textured, spec.blank_tiles)
            wrong = wrong_pairs(pairs, ds.positions[0], step)
            groups = linked_groups(pairs, spec.rows * spec.cols)
            n_groups = len({groups[i] for i in textured})
            pwithin = within_groups(pos, ds.positions[0], textured, groups)
            row = {"what": f"stitch stage, {name}", "ours_s": seconds,
                   "ours_accuracy": f"flatfield {np.mean(ours_f):.2%} / worst {max(ours_f):.2%}; offset worst "
                                    f"{max(ours_d):.0%} (mean offset {min(bias):+.1f} to {max(bias):+.1f} counts from "
                                    "the truth; "
                                    f"{flagged} of {len(keys)} planes flagged uncertain); "
                                    f"positions ({len(textured)} tiles sharing texture) max {pmax:.2f} / median "
                                    f"{pmed:.2f} px, within the {n_groups} groups the accepted pairs "
                                    f"link max {pwithin:.2f} px"
                                    + (f" (blank tiles, by the stage model: {pblank:.2f} px)" if spec.blank_tiles else "")
                                    + f"; {sum(r['accepted'] == '1' for r in pairs)} of {len(pairs)} pairs "
                                    f"accepted, {wrong} more than 1 px wrong",
                   "no_correction": f"flat of ones {np.mean(ones):.2%} / worst {max(ones):.2%}"}
            worst.setdefault("ours_flat_mean", []).append(np.mean(ours_f))
            worst.setdefault("ours_flat_worst", []).append(max(ours_f))
            worst.setdefault("ours_pos_max", []).append(pmax)
            worst.setdefault("ours_pos_within_max", []).append(pwithin)
            worst.setdefault("ours_wrong_pairs", []).append(wrong)
            unflagged = [d for (ch, z), d in zip(keys, ours_d) if not shading[f"{ch}/{z}"]["offset_uncertain"]]
            worst.setdefault("ours_offset_unflagged", []).append(max(unflagged, default=0.0))
            peer_text = []
            if run_basicpy:
                planes = [noisy_planes(raw, ds, ch, z) for ch, z in keys]
                for label, settings in (("default (flat only)", {}),
                                        ("darkfield, sort_intensity, approximate",
                                         {"get_darkfield": True, "sort_intensity": True,
                                          "fitting_mode": "approximate"})):
                    prof = basicpy_runs(planes, settings)
                    f = [rel_rms(fl, truth[k][0]) for k, (fl, _) in zip(keys, prof)]
                    peer_text.append(f"basicpy {label}: flatfield {np.mean(f):.2%} / worst {max(f):.2%}")
                    worst.setdefault(f"basicpy {label} mean", []).append(np.mean(f))
                    worst.setdefault(f"basicpy {label} worst", []).append(max(f))
            if run_ashlar:
                for sigma in ASHLAR_FILTERS:
                    apos, aseconds = ashlar_positions(ds, raw, sigma)
                    amax, amed, ablank = position_errors(apos, ds.positions[0], textured, spec.blank_tiles)
                    awithin = within_groups(apos, ds.positions[0], textured, groups)
                    peer_text.append(f"ASHLAR 1.20 --filter-sigma {sigma:g} (true shading given): positions max "
                                     f"{amax:.2f} / median {amed:.2f} px, within our groups max {awithin:.2f} px"
                                     + (f" (blank tiles {ablank:.2f} px)" if spec.blank_tiles else ""))
                    worst.setdefault(f"ashlar_filter{sigma:g}_pos_max", []).append(amax)
                    worst.setdefault(f"ashlar_filter{sigma:g}_pos_within_max", []).append(awithin)
            if peer_text:
                row.update(peer="; ".join(n for n, on in (("basicpy 2.0.0", run_basicpy), ("ASHLAR 1.20", run_ashlar))
                                          if on), peer_accuracy="; ".join(peer_text))
                if run_ashlar:
                    row["peer_s"] = aseconds
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {k: float(max(v)) for k, v in worst.items()}
    rows.append({"what": f"worst case over {len(rows)} regimes",
                 "ours_accuracy": f"flatfield mean {summary['ours_flat_mean']:.2%}, worst plane "
                                  f"{summary['ours_flat_worst']:.2%}; offset (unflagged planes) "
                                  f"{summary['ours_offset_unflagged']:.0%}; positions max "
                                  f"{summary['ours_pos_max']:.2f} px (within linked groups "
                                  f"{summary['ours_pos_within_max']:.2f} px); "
                                  f"wrong pairs accepted {summary['ours_wrong_pairs']:.0f}",
                 "peer_accuracy": "; ".join(f"{k} {v:.2%}" if "basicpy" in k else f"{k} {v:.2f} px"
                                            for k, v in summary.items() if not k.startswith("ours"))})
    write_result("stitch_sweep" if run_basicpy and run_ashlar else "stitch_sweep_positions", rows,
                 notes="synthetic regimes written by plexgpu synth; ours = stages.stitch (CPU); "
                       "peers on the same raw tiles (basicpy) or the same reference plane with true shading (ASHLAR)")


if __name__ == "__main__":
    main()
