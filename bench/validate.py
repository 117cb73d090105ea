"""`plexgpu validate` on a full-size layout: 13 cycles x 63 tiles x 20 z x 4 channels (65,520 TIFFs of
1440x1920 uint16, written sparse: the header, then a hole as long as the pixels, so the disk holds
little while every file has its full size), timed as a user runs it: every header read, every file
proven whole (one page, pixel data inside the file)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile
import yaml
from common import write_result

from plexgpu.io.raw import tile_filename

CYCLES, ROWS, COLS, Z, CH = 13, 9, 7, 20, 4
tmp = Path(tempfile.mkdtemp(prefix="plexgpu-validate-"))
try:
    one = tmp / "one.tif"
    tifffile.imwrite(one, np.zeros((1440, 1920), np.uint16))
    with tifffile.TiffFile(one) as tif:
        offset = tif.pages.first.dataoffsets[0]
    header = one.read_bytes()[:offset]  # the header and IFD; the pixels are a hole
    size = one.stat().st_size
    t0 = time.perf_counter()
    for c in range(1, CYCLES + 1):
        d = tmp / "raw" / f"cyc{c:03d}_reg001"
        d.mkdir(parents=True)
        for t in range(1, ROWS * COLS + 1):
            for z in range(1, Z + 1):
                for ch in range(1, CH + 1):
                    path = d / tile_filename(1, t, z, ch)
                    path.write_bytes(header)
                    os.truncate(path, size)
    made = time.perf_counter() - t0
    cfg = tmp / "c.yaml"
    cfg.write_text(yaml.safe_dump({"raw_dir": str(tmp / "raw"), "grid": {"rows": ROWS, "cols": COLS, "overlap": 0.3},
                                   "optics": {"pixel_size_um": 0.377, "z_step_um": 1.5}}))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "plexgpu.cli", "validate", "--configfile", str(cfg)],
                         capture_output=True, text=True)
    took = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    n = CYCLES * ROWS * COLS * Z * CH
    write_result("validate", [{"what": f"plexgpu validate, {n} TIFFs (13 cyc x 63 x 20 z x 4 ch)",
                               "ours_s": took, "ours_accuracy": f"{n / took:.0f} files/s: every header read, one "
                                                                "page and the pixel data inside each file, one "
                                                                "shape/dtype per cycle"}],
                 notes=f"writing the files took {made:.1f} s")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
