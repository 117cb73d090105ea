"""BaSiC: per-plane fit time, batched vs sequential over many planes, and basicpy 2.0.0 side
by side on the same tiles with synthetic truth.

  python bench/basic.py [--planes 80] [--tile 512] [--basicpy bench/.venv-basicpy/bin/python]

Fit time does not depend on the tile size (tiles are resized to working_size first); the
resize cost per 1024^2 tile is measured separately.
"""

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from common import peak_rss_mb, timer, write_result

from plexgpu.image import basic
from plexgpu.image.synth import SynthDataset, SynthSpec

ap = argparse.ArgumentParser()
ap.add_argument("--planes", type=int, default=80)
ap.add_argument("--tile", type=int, default=512)
ap.add_argument("--basicpy", default=str(Path(__file__).parent / ".venv-basicpy/bin/python"))
args = ap.parse_args()

ds = SynthDataset(SynthSpec(cycles=1, rows=9, cols=7, tile=(args.tile, args.tile), z_planes=3, channels=2, seed=5))
rng = np.random.default_rng(0)
base = []
for ch in (1, 2):
    for z in (1, 2, 3):
        dark = ds.darkfield(ch, z)
        tiles = ds.expected_tiles(1, ch, z)
        base.append((ch, z, np.stack([rng.poisson(np.clip(t - dark, 0, None)) + dark + rng.normal(0, 3, t.shape)
                                      for t in tiles]).astype(np.float32)))
truth = [(ds.flatfield(ch, z), ds.darkfield(ch, z)) for ch, z, _ in base]
params = basic.BasicParams()
t = {}
with timer(t, "resize_1024_tile"):
    basic.downsample(np.zeros((1, 1024, 1024), np.float32), 128)
small = [basic.downsample(tiles, 128) for _, _, tiles in base]
# 80 planes: the six (channel, z) problems with fresh noise, as a cycle of 4 ch x 20 z would give
D = np.stack([small[i % len(small)] * rng.normal(1, 0.01, (63, 1, 1)).astype(np.float32) for i in range(args.planes)])
with timer(t, "batched"):
    res = basic.fit_batch(D, params, group=args.planes)       # every plane advanced together (the GPU path)
with timer(t, "sequential"):
    for i in range(args.planes):
        basic.fit_batch(D[i:i + 1], params)
with timer(t, "default"):
    basic.fit_batch(D, params, workers=2)                     # the CPU default: one plane per group, 2 threads


def errors(flats, darks):
    fe, de = [], []
    for (tf, td), f, d in zip(truth, flats, darks):
        f = basic.upsample(f, tf.shape) if f.shape != tf.shape else f
        d = basic.upsample(d, td.shape) if d.shape != td.shape else d
        fe.append(float(np.sqrt(np.mean((f / f.mean() - tf) ** 2))))
        de.append(float(abs(d.mean() - td.mean()) / td.mean()))
    return fe, de


ours = basic.fit_batch(np.stack(small), params)
with timer(t, "ours_six"):
    basic.fit_batch(np.stack(small), params)
fe, de = errors(ours.flatfield, ours.darkfield)
anchored = basic.fit_anchored(np.stack(small), [3 * (i // 3) + 1 for i in range(len(small))], params)  # z2 of each ch
fa, _ = errors(anchored.flatfield, anchored.darkfield)
rows = [{"what": f"BaSiC all {args.planes} planes x 63 tiles in one batch (CPU)", "ours_s": t["batched"],
         "peer": "same code, one plane at a time", "peer_s": t["sequential"], "ratio": t["sequential"] / t["batched"],
         "peak_rss_mb": peak_rss_mb()},
        {"what": f"BaSiC fit_batch CPU default ({args.planes} planes, 1 per group, 2 threads)", "ours_s": t["default"],
         "peer": "same code, one plane at a time", "peer_s": t["sequential"], "ratio": t["sequential"] / t["default"]},
        {"what": "BaSiC per-plane fit (63 tiles, darkfield on)", "ours_s": t["ours_six"] / len(small),
         "ours_accuracy": f"flat RMS {np.mean(fe):.2%} (worst plane {max(fe):.2%}; anchored on the in-focus "
                          f"plane as the stitch stage fits: {np.mean(fa):.2%}, worst {max(fa):.2%}), "
                          f"dark offset {np.mean(de):.1%}", "peak_rss_mb": peak_rss_mb()}]

def basicpy_fits(planes):
    """basicpy 2.0.0 fitted on each (N, H, W) array one after another, in its own environment:
    (seconds per fit, flatfields, darkfields)."""
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/planes.npz", **{f"p{i:03d}": plane for i, plane in enumerate(planes)})
        out = subprocess.run([args.basicpy, str(Path(__file__).parent / "basicpy_peer.py"), f"{tmp}/planes.npz",
                              f"{tmp}/prof.npz"], capture_output=True, text=True, check=True)
        prof = np.load(f"{tmp}/prof.npz")
        return json.loads(out.stdout.strip().splitlines()[-1])["seconds"], prof["flat"], prof["dark"]


if Path(args.basicpy).exists():
    secs, flats, darks = basicpy_fits([tiles for _, _, tiles in base])
    pfe, pde = errors(list(flats), list(darks))
    rows[2].update(peer="basicpy 2.0.0 (darkfield, sort_intensity)", peer_s=float(np.mean(secs)),
                   ratio=float(np.mean(secs)) / (t["ours_six"] / len(small)),
                   peer_accuracy=f"flat RMS {np.mean(pfe):.2%}, dark offset {np.mean(pde):.1%}")
    # the per-plane loop users run today: basicpy fitted plane after plane on the same working-size
    # arrays the batch fitted (its internal resize to 128^2 is then a no-op), in the same run
    loop = float(np.sum(basicpy_fits(D)[0]))
    rows.insert(2, {"what": f"BaSiC fit_batch CPU default, {args.planes} planes x 63 tiles (working size 128)",
                    "ours_s": t["default"], "peer": f"basicpy 2.0.0, {args.planes} fits one after another, same arrays",
                    "peer_s": loop, "ratio": loop / t["default"]})
write_result("basic", rows, notes=f"resize of one 1024^2 tile to 128^2: {t['resize_1024_tile']:.3f} s")
