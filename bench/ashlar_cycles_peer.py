"""Run ASHLAR 1.20's cycle alignment on two cycles of tiles saved by a benchmark, in ASHLAR's own
environment (make bench-env): EdgeAligner stitches the first cycle, LayerAligner aligns every tile of
the second to it (a translation per tile, after a coarse offset from the thumbnails), and Mosaic
assembles both in the first cycle's frame. Input: an .npz with ``tiles1``, ``tiles2`` (T, H, W) in
raster order, ``rows``, ``cols``, ``overlap``, ``max_shift`` (px), ``filter_sigma``. Output: an .npz
(second argument) with ``mosaic1``, ``mosaic2``, ``seconds`` (the second cycle's alignment) and each cycle's tile
positions in the mosaics' frame (``positions1``, ``positions2``, (y, x))."""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile
from ashlar import fileseries, reg

data = np.load(sys.argv[1])
sigma = float(data["filter_sigma"])
with tempfile.TemporaryDirectory() as tmp:
    readers = []
    for k in ("tiles1", "tiles2"):
        folder = Path(tmp) / k
        folder.mkdir()
        for i, t in enumerate(data[k]):
            tifffile.imwrite(folder / f"img_{i:04d}.tif", np.clip(t, 0, 65535).astype(np.uint16))
        readers.append(fileseries.FileSeriesReader(str(folder), "img_{series:4}.tif", overlap=float(data["overlap"]),
                                                   width=int(data["cols"]), height=int(data["rows"]),
                                                   layout="raster", direction="horizontal", pixel_size=1.0))
    edge = reg.EdgeAligner(readers[0], channel=0, max_shift=float(data["max_shift"]), filter_sigma=sigma,
                           verbose=False)
    edge.run()
    t0 = time.perf_counter()
    layer = reg.LayerAligner(readers[1], edge, channel=0, max_shift=float(data["max_shift"]), filter_sigma=sigma)
    layer.run()
    seconds = time.perf_counter() - t0
    shape = edge.mosaic_shape
    mosaics = [reg.Mosaic(a, shape, verbose=False).assemble_channel(0) for a in (edge, layer)]
np.savez(sys.argv[2], mosaic1=mosaics[0], mosaic2=mosaics[1], seconds=seconds,
         positions1=edge.positions - edge.origin, positions2=layer.positions - edge.origin)
