"""The GPU budget of one cycle, measured on the CuPy path under the strict stand-in (no GPU here) and
extrapolated to the full-size cycle (9x7 tiles of 1440x1920, 4 channels, 20 z).

Each GPU stage of one cycle (stitch, deconvolve, edf: the functions the jobs call, with
bench/gpu_cycle.py's synthetic tiles) runs under tests/strict_device.py, whose ledger counts what
decides GPU time and fit: peak live device bytes, host->device and device->host bytes, syncs, device
calls and the bytes each call reads and writes. It runs at a base size and at four variants, each
doubling one factor (tiles, z-planes, channels, pixels per tile); a figure's growth with a factor is
its exponent, log(figure at 2x / figure at base) / log 2, and the full-size figure is the base one
times each factor's ratio to the power of its exponent (a power law per factor: what the data say,
not an assumed model; a figure that is exactly linear gives 1).

Deconvolution is planned, not extrapolated: its chunks come from the device memory free
(``deconvolution.memory_budget``: half of it) and ``deconvolution.chunk_px``, so its peak at full size
is the planner's ``working_bytes`` of the largest piece on an H200 (checked against the stand-in's
measured peak at the base size), and its traffic is the measured bytes touched per padded FFT voxel
and iteration at the base size times the full size's padded voxels (``padded_voxels``).

Lower-bound time on an H200: bytes touched / 4.8 TB/s (HBM3e) + 5 us per device call (a kernel
launch). It ignores compute (RL's FFTs are bandwidth-bound at these sizes), host<->device copies
(PCIe/NVLink-C2C, counted apart as bytes) and the stand-in's unseen scratch (cuFFT work areas).

  python bench/gpu_budget.py            # writes bench/results/gpu_budget.json (about 2 min here)
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from common import HERE, write_result

sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
from gpu_cycle import synthetic_tiles  # noqa: E402
from strict_device import LEDGER, STRICT  # noqa: E402

from plexgpu import gpu_memory, paths, stages  # noqa: E402
from plexgpu.config import validate_config  # noqa: E402
from plexgpu.experiment import CycleSpec  # noqa: E402
from plexgpu.image import deconvolution  # noqa: E402
from plexgpu.job import job_context  # noqa: E402

HBM_BYTES_PER_S = 4.8e12      # H200
H200_FREE_BYTES = 140e9       # what an H200 has free to a job (141 GB, less the CUDA context)
CALL_S = 5e-6                 # one kernel launch
FULL = {"tiles": 63, "z": 20, "channels": 4, "tile_px": 1440 * 1920}
BASE = {"rows": 3, "cols": 3, "tile": (96, 128), "channels": 2, "z": 4}
VARIANTS = {"tiles": {"cols": 6}, "z": {"z": 8}, "channels": {"channels": 4}, "tile_px": {"tile": (136, 180)}}
FIGURES = ("peak_bytes", "h2d_bytes", "d2h_bytes", "syncs", "device_calls", "bytes_touched")


def factors(size: dict) -> dict:
    return {"tiles": size["rows"] * size["cols"], "z": size["z"], "channels": size["channels"],
            "tile_px": size["tile"][0] * size["tile"][1]}


def make_spec(rows, cols, tile, channels, nz) -> CycleSpec:
    channels = tuple(range(1, channels + 1))
    return CycleSpec(cycle=1, key="cyc001", folder="/nonexistent", region=1, rows=rows, cols=cols,
                     order="snake", overlap=0.3, z_planes=nz, channels=channels,
                     markers=tuple(f"M{c}" for c in channels), pixel_size_um=0.377, z_step_um=1.5,
                     emission_nm=(450.0, 520.0, 570.0, 670.0)[:len(channels)])


def rl_plan(spec: CycleSpec, cfg: dict, tile: tuple[int, int], free_bytes: float) -> dict:
    """The deconvolution stage's own plan for ``spec`` on a device with ``free_bytes`` free (plexgpu.gpu_memory:
    chunk, halo, the largest channel's peak) and the padded voxels of all pieces of every channel."""
    peaks = gpu_memory.cycle_peaks(spec, cfg, tile, {"device": free_bytes})
    plan = peaks["deconvolve"]["device"]
    stack = (spec.z_planes, *peaks["mosaic"])
    voxels = deconvolution.padded_voxels(stack, plan["psf"], plan["chunk"], plan["halo"]) * len(spec.channels)
    return {"chunk": plan["chunk"], "halo": plan["halo"], "stack": stack, "psf": plan["psf"],
            "peak_bytes": plan["peak_bytes"], "padded_voxels": voxels}


def run_cycle(size: dict, work: Path, decon: dict) -> dict:
    """{stage: ledger figures} for one cycle of ``size`` under the stand-in, plus raw and output bytes;
    ``decon``: the deconvolution settings (iterations, method)."""
    cfg = validate_config({"raw_dir": "/nonexistent", "deconvolution": decon})
    spec = make_spec(size["rows"], size["cols"], size["tile"], size["channels"], size["z"])
    channels = spec.channels
    res = work / "results"
    st, de, ed = (paths.outputs(n, res, list(channels), spec.key) for n in ("stitch", "deconvolve", "edf"))
    raw = synthetic_tiles(np, size["rows"], size["cols"], size["tile"], spec.overlap, channels, size["z"], "snake")
    raw_bytes = sum(t.nbytes for tiles in raw.values() for t in tiles)
    out = {}

    def stage(name, fn, outputs):
        with job_context(name, str(work / f"{name}.log"), {"cpus_per_task": 1}, "cpu") as ctx:
            ctx.xp = STRICT
            LEDGER.reset()
            start_live = LEDGER.live_bytes
            fn(ctx)
            figures = LEDGER.figures()
        figures["peak_bytes"] -= start_live
        figures["output_bytes"] = sum(Path(f).stat().st_size for f in outputs)
        out[name] = figures

    stage("stitch", lambda ctx: stages.stitch(ctx, spec, cfg["basic"], cfg["stitch"], st,
                                              read_plane=lambda ch, z: raw[ch, z]), st["stitched"])
    stage("deconvolve", lambda ctx: stages.deconvolve(ctx, spec, cfg["optics"], cfg["deconvolution"], st, de),
          de["deconvolved"])
    stage("edf", lambda ctx: stages.extended_depth(ctx, spec, cfg["edf"], {**st, **de}, ed),
          ed["edf"] + ed["edf_deconvolved"])
    out["raw_bytes"] = raw_bytes
    out["rl_plan"] = rl_plan(spec, cfg, size["tile"], STRICT.cuda.FREE_BYTES)
    mosaic = gpu_memory.mosaic_shape(size["rows"], size["cols"], size["tile"], spec.overlap)
    predicted = {"stitch": gpu_memory.stitch_peak(size["rows"] * size["cols"], len(channels) * size["z"],
                                                  cfg["basic"]["working_size"]),
                 "deconvolve": out["rl_plan"]["peak_bytes"], "edf": gpu_memory.edf_peak(mosaic)}
    out["peak_measured_over_predicted"] = {st: round(out[st]["peak_bytes"] / predicted[st], 3) for st in predicted}
    return out


def lower_bound_s(fig: dict) -> float:
    return fig["bytes_touched"] / HBM_BYTES_PER_S + fig["device_calls"] * CALL_S


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=None, help="Richardson-Lucy iterations (default: the config's)")
    ap.add_argument("--method", default=None, help="deconvolution.method (default: the config's)")
    args = ap.parse_args(argv)
    defaults = validate_config({"raw_dir": "/nonexistent"})["deconvolution"]
    decon = {"iterations": defaults["iterations"] if args.iterations is None else args.iterations,
             "method": defaults["method"] if args.method is None else args.method}
    sizes = {"base": BASE, **{k: {**BASE, **v} for k, v in VARIANTS.items()}}
    measured = {}
    with tempfile.TemporaryDirectory(prefix="plexgpu-budget-") as tmp:
        for name, size in sizes.items():
            (Path(tmp) / name).mkdir()
            measured[name] = run_cycle(size, Path(tmp) / name, decon)
    base_f = factors(BASE)
    rows, model, rl_model = [], {}, {}
    for st in ("stitch", "deconvolve", "edf"):
        exps, full = {}, {}
        for fig in FIGURES + ("output_bytes",):
            b = measured["base"][st][fig]
            exps[fig] = {k: (math.log(max(measured[k][st][fig], 1) / max(b, 1))
                             / math.log(factors(sizes[k])[k] / base_f[k])) for k in VARIANTS}
            full[fig] = b * math.prod((FULL[k] / base_f[k]) ** exps[fig][k] for k in VARIANTS)
        raw_full = measured["base"]["raw_bytes"] * math.prod(FULL[k] / base_f[k] for k in VARIANTS)
        if st == "deconvolve":        # planned (module docstring), not extrapolated
            cfg = validate_config({"raw_dir": "/nonexistent", "deconvolution": decon})
            full_plan = rl_plan(make_spec(9, 7, (1440, 1920), 4, 20), cfg, (1440, 1920), H200_FREE_BYTES)
            base_plan = measured["base"]["rl_plan"]
            per_voxel = measured["base"][st]["bytes_touched"] / (base_plan["padded_voxels"] * decon["iterations"])
            full["peak_bytes"] = full_plan["peak_bytes"]
            full["bytes_touched"] = per_voxel * full_plan["padded_voxels"] * decon["iterations"]
            rl_model = {"base": base_plan, "full_h200": full_plan,
                                "measured_peak_over_planned_base": measured["base"][st]["peak_bytes"]
                                / base_plan["peak_bytes"], "touched_bytes_per_padded_voxel_iteration": per_voxel}
        model[st] = {"exponents": {f: {k: round(v, 2) for k, v in e.items()} for f, e in exps.items()},
                     "base": measured["base"][st], "full": {f: round(v) for f, v in full.items()}}
        bound = lower_bound_s(full)
        rows.append({
            "what": f"{st}: full-size cycle (9x7 x 1440x1920, 4 ch, 20 z), extrapolated from the stand-in",
            "ours_s": round(bound, 2), "peer": "-", "peer_s": None, "ratio": None,
            "ours_accuracy": (f"peak device {full['peak_bytes'] / 2**30:.1f} GiB; H2D {full['h2d_bytes'] / 2**30:.1f} "
                              f"GiB = {full['h2d_bytes'] / raw_full:.2f} x raw; D2H {full['d2h_bytes'] / 2**30:.1f} "
                              f"GiB; syncs {full['syncs']:.0f}; calls {full['device_calls']:.0f}; touched "
                              f"{full['bytes_touched'] / 1e12:.2f} TB; lower bound {bound:.1f} s"),
            "peer_accuracy": "-", "peak_rss_mb": None})
    total = sum(lower_bound_s(model[s]["full"]) for s in model)
    notes = (f"Lower bound per cycle (stitch + deconvolve + edf) on an H200: {total:.1f} s = bytes touched / 4.8 "
             "TB/s + 5 us per device call. Exponents per factor (tiles, z, channels, tile_px) for each figure in "
             "the JSON's model; raw = 2 bytes per pixel of every tile, plane and channel. Deconvolution: "
             f"{decon['method']} RL, {decon['iterations']} iterations.")
    write_result("gpu_budget", rows, notes)
    path = HERE / "results" / "gpu_budget.json"
    import json

    data = json.loads(path.read_text())
    data["model"] = model
    data["deconvolution_plan"] = rl_model
    data["peak_measured_over_predicted"] = {k: v["peak_measured_over_predicted"] for k, v in measured.items()}
    data["raw_bytes_base"] = measured["base"]["raw_bytes"]
    data["lower_bound_cycle_s"] = round(total, 2)
    path.write_text(json.dumps(data, indent=1))
    return data


if __name__ == "__main__":
    main()
