"""EDF vs maximum projection on a synthetic widefield stack with truth.

  python bench/edf.py [--z 20] [--size 1024]
"""

import argparse

import numpy as np
from common import peak_rss_mb, timer, write_result

from plexgpu.image import edf
from plexgpu.image.synth import SynthDataset, SynthSpec

ap = argparse.ArgumentParser()
ap.add_argument("--z", type=int, default=20)
ap.add_argument("--size", type=int, default=1024)
args = ap.parse_args()
ds = SynthDataset(SynthSpec(cycles=1, rows=1, cols=1, tile=(args.size, args.size), z_planes=args.z, channels=1,
                            seed=3, jitter_px=0, cycle_shift_px=0))
stack = ds.stack(1, 1)
truth = ds.in_focus(1, 1)
t = {}
with timer(t, "edf"):
    res = edf.extended_depth_of_field(stack)
with timer(t, "max"):
    mip = edf.max_projection(stack)
def c(a):
    return float(np.corrcoef(a.ravel(), truth.ravel())[0, 1])
write_result("edf", [{"what": f"EDF {args.z}x{stack.shape[1]}x{stack.shape[2]}", "ours_s": t["edf"],
                      "peer": "maximum projection", "peer_s": t["max"], "ratio": t["max"] / t["edf"],
                      "ours_accuracy": f"corr {c(res.image):.4f}", "peer_accuracy": f"corr {c(mip):.4f}",
                      "peak_rss_mb": peak_rss_mb()}])
