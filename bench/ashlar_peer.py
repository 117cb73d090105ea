"""Run ASHLAR 1.20's EdgeAligner on tiles saved by a benchmark, in ASHLAR's own environment
(make bench-env). Input: an .npz with ``tiles`` (T, H, W) in raster order (row-major from the
top-left), ``rows``, ``cols``, ``overlap``, ``max_shift`` (px), optionally ``filter_sigma`` (its
whitening filter, 0 by default; 1 is its best setting on our regimes). Prints JSON: the positions
(y, x per tile, raster order) and the seconds the alignment took."""

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile
from ashlar import fileseries, reg

data = np.load(sys.argv[1])
tiles = data["tiles"]
with tempfile.TemporaryDirectory() as tmp:
    for i, t in enumerate(tiles):
        tifffile.imwrite(Path(tmp) / f"img_{i:04d}.tif", np.clip(t, 0, 65535).astype(np.uint16))
    reader = fileseries.FileSeriesReader(tmp, "img_{series:4}.tif", overlap=float(data["overlap"]),
                                         width=int(data["cols"]), height=int(data["rows"]), layout="raster",
                                         direction="horizontal", pixel_size=1.0)
    t0 = time.perf_counter()
    sigma = float(data["filter_sigma"]) if "filter_sigma" in data else 0.0
    aligner = reg.EdgeAligner(reader, channel=0, max_shift=float(data["max_shift"]), filter_sigma=sigma,
                              verbose=False, do_make_thumbnail=False)
    aligner.run()
    seconds = time.perf_counter() - t0
print(json.dumps({"positions": np.asarray(aligner.positions).tolist(), "seconds": seconds}))
