"""One full-size synthetic cycle through the workflow's own stage functions, as its jobs call
them: ``stages.stitch`` -> ``stages.deconvolve`` -> ``stages.extended_depth``, each inside
``job_context`` (GPU guard, worker pool from cpus_per_task) with its stacks streamed to tiled,
compressed files on disk. Per-stage times, peak GPU memory and stack sizes, printed as JSON.
Target on one H200: <= 90 s per cycle.

  python bench/gpu_cycle.py                           # 9x7 tiles of 1440x1920, 4 ch, 20 z, CuPy
  python bench/gpu_cycle.py --tiny --backend numpy    # the same code path, small, on the CPU (tests)

The raw tiles (uint16 camera counts: a textured field seen through a vignetted flatfield above a
camera offset) are made once in host memory before the clock starts (full size: 5040 tiles,
about 28 GB) and handed to stitch through its ``read_plane`` seam in place of the raw files, so
the benchmark times the device and the stages' own stack I/O, not the raw data's file system.
Full size needs about 45 GB of free disk under --workdir for the stacks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow"))

import numpy as np  # noqa: E402

from plexgpu import gpu_memory, paths, stages  # noqa: E402
from plexgpu import xp as xpmod  # noqa: E402
from plexgpu.config import validate_config  # noqa: E402
from plexgpu.experiment import CycleSpec  # noqa: E402
from plexgpu.image import stitching  # noqa: E402
from plexgpu.io.raw import grid_layout  # noqa: E402
from plexgpu.io.tiff import StackReader  # noqa: E402
from plexgpu.job import job_context  # noqa: E402


def synthetic_tiles(xp, rows: int, cols: int, tile: tuple[int, int], overlap: float, channels, nz: int,
                    order: str) -> dict:
    """{(channel, z): [uint16 host tile, ...]} in tile order; made on the backend, kept on the host."""
    th, tw = tile
    sy, sx = stitching.nominal_step(tile, overlap)
    H, W = (rows - 1) * sy + th + 8, (cols - 1) * sx + tw + 8
    ndi = xpmod.ndimage(xp)
    field = ndi.gaussian_filter(xp.asarray(np.random.default_rng(1).random((H, W), np.float32)), 1.5) * 6000
    yy, xx = xp.mgrid[0:th, 0:tw].astype(xp.float32)
    flat = xp.exp(-0.8 * (((yy - th / 2) / th) ** 2 + ((xx - tw / 2) / tw) ** 2))
    flat /= flat.mean()
    jitter = np.random.default_rng(2).integers(-3, 4, (rows * cols, 2))
    pos = [(4 + r * sy + int(j[0]), 4 + c * sx + int(j[1])) for (r, c), j in zip(grid_layout(rows, cols, order), jitter)]
    tiles = {}
    for ch in channels:
        for z in range(1, nz + 1):
            g = field * (1 + 0.05 * ch) * (1 - 0.02 * abs(z - (nz + 1) / 2))
            tiles[ch, z] = [xpmod.to_host(xp.clip(xp.rint(g[y:y + th, x:x + tw] * flat + 300), 0, 65535)
                                          .astype(xp.uint16)) for y, x in pos]
    return tiles


def predicted_peaks(spec: CycleSpec, cfg: dict, tile: tuple[int, int], xp) -> dict:
    """What plexgpu.gpu_memory predicts for this cycle (plexgpu plan prints it), beside the measured peaks:
    the deconvolution's chunk plan on the device memory free after the run (about what the stage saw)."""
    free = xpmod.free_device_bytes(xp) or 0
    peaks = gpu_memory.cycle_peaks(spec, cfg, tile, {"here": free} if free else None)
    out = {"stitch": peaks["stitch"], "deconvolve": peaks["deconvolve"]["here"]["peak_bytes"] if free else None,
           "edf": peaks["edf"]}
    return {k: None if v is None else round(v / 2**30, 2) for k, v in out.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cupy", choices=["cupy", "numpy"])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--iterations", type=int, default=25)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="the jobs' cpus_per_task")
    ap.add_argument("--workdir", default=None, help="where the stacks go (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    device = "gpu" if args.backend == "cupy" else "cpu"
    rows, cols, tile, nch, nz = (3, 3, (96, 128), 2, 4) if args.tiny else (9, 7, (1440, 1920), 4, 20)
    channels = tuple(range(1, nch + 1))
    cfg = validate_config({"raw_dir": "/nonexistent", "deconvolution": {"iterations": args.iterations}})
    spec = CycleSpec(cycle=1, key="cyc001", folder="/nonexistent", region=1, rows=rows, cols=cols, order="snake",
                     overlap=0.3, z_planes=nz, channels=channels, markers=tuple(f"M{ch}" for ch in channels),
                     pixel_size_um=0.377, z_step_um=1.5, emission_nm=(450.0, 520.0, 570.0, 670.0)[:nch])
    work = Path(args.workdir or tempfile.mkdtemp(prefix="plexgpu-gpu-cycle-"))
    res = work / "results"

    st, de, ed = (paths.outputs(name, res, list(channels), spec.key) for name in ("stitch", "deconvolve", "edf"))
    for f in (st["stitched"][0], st["profiles"][0], de["deconvolved"][0], ed["edf"][0]):
        Path(f).parent.mkdir(parents=True, exist_ok=True)
    resources = {"cpus_per_task": args.workers}
    times, peaks = {}, {}
    try:
        xp = xpmod.get_xp(args.backend)
        t0 = time.perf_counter()
        raw = synthetic_tiles(xp, rows, cols, tile, spec.overlap, channels, nz, spec.order)
        synth_s = time.perf_counter() - t0
        pool = xp.get_default_memory_pool() if xpmod.on_device(xp) else None

        def stage(name, run):
            with job_context(name, str(work / f"{name}.log"), resources, device) as ctx:
                t0 = time.perf_counter()
                run(ctx)
                xpmod.synchronize(ctx.xp)
                times[f"{name}_s"] = time.perf_counter() - t0
            if pool is not None:
                peaks[name] = pool.total_bytes() / 2**30          # the pool's high-water mark for this stage
                pool.free_all_blocks()

        stage("stitch", lambda ctx: stages.stitch(ctx, spec, cfg["basic"], cfg["stitch"], st,
                                                  read_plane=lambda ch, z: raw[ch, z]))
        raw.clear()                       # the tiles are stitched: their memory back before deconvolution
        stage("deconvolve", lambda ctx: stages.deconvolve(ctx, spec, cfg["optics"], cfg["deconvolution"], st, de))
        stage("edf", lambda ctx: stages.extended_depth(ctx, spec, cfg["edf"], {**st, **de}, ed))
        pixels = int(np.prod(StackReader(st["stitched"][0]).shape)) * nch
        sizes = {kind: sum(os.path.getsize(p) for p in files) for kind, files in
                 (("stitched", st["stitched"]), ("deconvolved", de["deconvolved"]))}
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    out = {"backend": args.backend, "tiles": f"{rows}x{cols} of {tile[0]}x{tile[1]}", "channels": nch, "z": nz,
           "rl_iterations": args.iterations, "workers": args.workers, "synth_s": round(synth_s, 2),
           **{k: round(v, 2) for k, v in times.items()}, "total_s": round(sum(times.values()), 2),
           "peak_gpu_mem_gib": {k: round(v, 2) for k, v in peaks.items()} if pool is not None else None,
           "predicted_peak_gib": predicted_peaks(spec, cfg, tile, xp),
           "stack_gb": {k: round(v / 1e9, 3) for k, v in sizes.items()},
           "stack_fraction_of_pixels": {"stitched": round(sizes["stitched"] / (2 * pixels), 3),
                                        "deconvolved": round(sizes["deconvolved"] / (4 * pixels), 3)},
           "device": xp.cuda.runtime.getDeviceProperties(0)["name"].decode() if xpmod.on_device(xp) else "cpu"}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
