"""Run basicpy 2.0.0 on tiles saved by a benchmark, in basicpy's own environment (make bench-env).
Arguments: planes .npz, output .npz, optional JSON of BaSiC settings (default: darkfield,
sort_intensity, approximate fit). Prints JSON: seconds per fit; writes the flat/dark-fields."""

import json
import sys
import time

import numpy as np
from basicpy import BaSiC

data = np.load(sys.argv[1])
settings = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {"get_darkfield": True, "sort_intensity": True,
                                                                 "fitting_mode": "approximate"}
flats, darks, times = [], [], []
for k in sorted(data.files):
    b = BaSiC(**settings)
    t0 = time.perf_counter()
    b.fit(data[k])
    times.append(time.perf_counter() - t0)
    flats.append(b.flatfield.astype(np.float32))
    darks.append(b.darkfield.astype(np.float32))
np.savez(sys.argv[2], flat=np.stack(flats), dark=np.stack(darks))
print(json.dumps({"seconds": times}))
