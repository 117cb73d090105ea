"""One full-size synthetic cycle through stitch -> deconvolve -> edf on one device, per-stage
times and peak GPU memory, printed as JSON. Target on one H200: <= 90 s per cycle.

  python bench/gpu_cycle.py                     # 9x7 tiles of 1440x1920, 4 ch, 20 z, CuPy
  python bench/gpu_cycle.py --tiny --backend numpy   # the same code path, small, on the CPU (tests)

Tiles are generated on the fly (a textured field per plane, shaded) instead of read from disk,
so the benchmark measures the device, not the file system.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

import numpy as np  # noqa: E402

from plexgpu.image import basic, deconvolution, edf, psf, stitching  # noqa: E402
from plexgpu import xp as xpmod  # noqa: E402
from plexgpu.io.raw import grid_layout  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cupy", choices=["cupy", "numpy"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--iterations", type=int, default=25)
    args = ap.parse_args(argv)
    xp = xpmod.get_xp(args.backend)
    rows, cols, (th, tw), nch, nz = (3, 3, (96, 128), 2, 4) if args.tiny else (9, 7, (1440, 1920), 4, 20)
    layout = grid_layout(rows, cols, "snake")
    overlap = 0.3
    sy, sx = stitching.nominal_step((th, tw), overlap)
    H, W = (rows - 1) * sy + th + 8, (cols - 1) * sx + tw + 8
    ndi = xpmod.ndimage(xp)
    field = ndi.gaussian_filter(xp.asarray(np.random.default_rng(1).random((H, W), np.float32)), 1.0) * 4000
    yy, xx = xp.mgrid[0:th, 0:tw].astype(xp.float32)
    flat = xp.exp(-0.4 * (((yy - th / 2) / th) ** 2 + ((xx - tw / 2) / tw) ** 2) * 2)
    flat /= flat.mean()
    pos = [(4 + r * sy, 4 + c * sx) for r, c in layout]

    def plane_tiles(ch, z):
        g = field * (1 + 0.05 * ch) * (1 - 0.02 * abs(z - nz / 2))
        return [(g[y:y + th, x:x + tw] * flat + 100).astype(xp.float32) for y, x in pos]

    times, peak = {}, 0
    pool = xp.get_default_memory_pool() if xpmod.on_device(xp) else None

    def mark():
        nonlocal peak
        xpmod.synchronize(xp)
        if pool is not None:
            peak = max(peak, pool.total_bytes())

    t0 = time.perf_counter()
    params = basic.BasicParams(max_iterations=500)
    small = xp.stack([basic.downsample(xp.stack(plane_tiles(ch, z)), params.working_size)
                      for ch in range(nch) for z in range(nz)])
    fit = basic.fit_anchored(small, [ch * nz + nz // 2 for ch in range(nch) for _ in range(nz)], params)  # as stitch
    f0, d0 = basic.upsample(fit.flatfield[0], (th, tw)), basic.upsample(fit.darkfield[0], (th, tw))
    model = stitching.compute_model([basic.correct(t, f0, d0) for t in plane_tiles(0, nz // 2)], layout, overlap)
    stacks = []
    for ch in range(nch):
        planes = []
        for z in range(nz):
            i = ch * nz + z
            f, d = basic.upsample(fit.flatfield[i], (th, tw)), basic.upsample(fit.darkfield[i], (th, tw))
            planes.append(stitching.blend([basic.correct(t, f, d) for t in plane_tiles(ch, z)], model))
        stacks.append(xp.stack(planes))
    mark()
    times["stitch_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    o = psf.Optics(0.377, 1.5, 0.75, 1.0, 1.33, 520)
    kernel = psf.psf(o, *psf.default_half_size(o, nz))
    decon = []
    for s in stacks:
        shape = tuple(s.shape)  # chunks sized as the deconvolve stage does (budget from free device memory)
        chunk = deconvolution.chunk_for_budget(shape, kernel.shape, deconvolution.memory_budget(xp, shape), 2048)
        decon.append(xpmod.to_device(deconvolution.deconvolve(xpmod.to_host(s), kernel, args.iterations, chunk, xp=xp), xp))
        mark()
    times["deconvolve_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for s in decon:
        edf.extended_depth_of_field(s)
    mark()
    times["edf_s"] = time.perf_counter() - t0
    out = {"backend": args.backend, "tiles": f"{rows}x{cols} of {th}x{tw}", "channels": nch, "z": nz,
           "rl_iterations": args.iterations, **{k: round(v, 2) for k, v in times.items()},
           "total_s": round(sum(times.values()), 2), "peak_gpu_mem_gib": round(peak / 2**30, 2) if pool else None,
           "device": xp.cuda.runtime.getDeviceProperties(0)["name"].decode() if xpmod.on_device(xp) else "cpu"}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
