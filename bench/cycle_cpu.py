"""One full cycle on the CPU through the real workflow: synthetic 9x7 grid, 4 channels, 8 z-planes
at 512^2 tiles; per-stage time and peak host memory (from the jobs' accounting records) against
the bound of 2x one channel's z-stack mosaic (float32)."""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import HERE, write_result

from plexgpu.cluster.accounting import load_records
from plexgpu.image.synth import SynthDataset, SynthSpec

ap = argparse.ArgumentParser()
ap.add_argument("--tile", type=int, default=512)
ap.add_argument("--z", type=int, default=8)
args = ap.parse_args()
tmp = Path(tempfile.mkdtemp(prefix="plexgpu-cycle-"))
t0 = time.perf_counter()
SynthDataset(SynthSpec(cycles=1, rows=9, cols=7, tile=(args.tile, args.tile), z_planes=args.z, channels=4,
                       seed=4)).write(tmp / "raw")
synth_s = time.perf_counter() - t0
cfg = tmp / "c.yaml"
cfg.write_text(yaml.safe_dump({"raw_dir": str(tmp / "raw"), "results_dir": str(tmp / "results"),
                               "compute": {"device": "cpu"},
                               "resources": {r: {"cpus_per_task": 2, "mem_mb": 8000, "runtime": 60}
                                             for r in ("stitch", "deconvolve", "edf", "registration", "qc")}}))
res = subprocess.run([sys.executable, "-m", "snakemake", "registration", "--configfile", str(cfg), "--cores", "2",
                      "-s", str(HERE.parent / "Snakefile"), "-d", str(tmp)], capture_output=True, text=True)
assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
recs = {r["rule"]: r for r in load_records(tmp / "results/accounting/jobs")}
import tifffile  # noqa: E402

with tifffile.TiffFile(tmp / "results/stitched/cyc001/CH1.ome.tif") as tif:
    shape = tif.series[0].shape
bound = 2 * shape[0] * shape[1] * shape[2] * 4
rows = []
for rule in ("stitch", "deconvolve", "edf"):
    r = recs[rule]
    rows.append({"what": f"{rule}: 9x7 x {args.tile}^2, 4 ch, {args.z} z (CPU, 2 cores)", "ours_s": r["elapsed_s"],
                 "peak_rss_mb": r["peak_rss_bytes"] / 2**20,
                 "ours_accuracy": f"peak RSS {r['peak_rss_bytes'] / bound:.2f}x of bound "
                                  f"({bound / 2**20:.0f} MB = 2x one channel's {shape} float32 stack)"})
disk = {kind: sum(f.stat().st_size for f in (tmp / "results" / kind).rglob("*.ome.tif"))
        for kind in ("stitched", "deconvolved")}
pixels = {"stitched": 4 * bound // 2 // 2, "deconvolved": 4 * bound // 2}      # 4 channels, uint16 and float32
sizes = "; ".join(f"{k} {disk[k] / 2**20:.0f} MB on disk = {disk[k] / pixels[k]:.2f} of its pixels" for k in disk)
write_result("cycle_cpu", rows, notes=f"synthesis {synth_s:.0f} s; mosaic {shape}; {sizes}")
print(json.dumps({"within_bound": all(recs[r]["peak_rss_bytes"] <= bound for r in ("stitch", "deconvolve", "edf"))}))
