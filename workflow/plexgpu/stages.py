"""The four image stages of a workflow job, from files to files: stitch, deconvolve,
edf (per cycle) and registration (all cycles). Each reads its inputs, runs the
algorithms on the job's backend (NumPy or CuPy) and writes every output atomically.
Memory is bounded by one channel's z-stack mosaic: channels are streamed."""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from pathlib import Path

import numpy as np

from .image import basic, deconvolution, edf, psf, registration, shading, stitching
from . import xp as xpmod
from .experiment import CycleSpec
from .io.raw import RawDataError
from .io.tiff import StackReader, ome_writer, read_tiff, write_ome, write_plane, write_pyramidal_ome, write_text_atomic
from .job import JobContext

log = logging.getLogger("plexgpu")
RESIZE_TILES = 8   # tiles resized together in the stitch job (a plane at once: 2 float32 copies of all its tiles)


def _read_plane(ctx: JobContext, spec: CycleSpec, channel: int, z: int) -> list[np.ndarray]:
    paths = spec.tile_paths(channel, z)
    tiles = list(ctx.pool.map(read_tiff, paths))
    first = tiles[0]
    for path, t in zip(paths, tiles):
        if t.shape != first.shape or t.dtype != first.dtype or t.ndim != 2:
            raise RawDataError(f"{path}: shape {t.shape} {t.dtype} differs from {paths[0].name} "
                               f"{first.shape} {first.dtype}; one 2-D shape and dtype per cycle")
    return tiles


# ----------------------------------------------------------------------------- stitch
def stitch(ctx: JobContext, spec: CycleSpec, basic_cfg: dict, stitch_cfg: dict, out: dict,
           read_plane=None) -> dict:
    """BaSiC per (channel, z) in one batched fit, one stitching model, the flatfield of every
    plane refined on the tile overlaps and its camera offset, blended mosaics.

    ``out``: {"profiles": {ch: path}, "stitched": {ch: path}, "positions": path, "pairs": path,
    "planes": path}. ``read_plane(channel, z)`` gives a plane's tiles in tile order (default: the
    raw files; bench/gpu_cycle.py hands over tiles made in memory); each plane is asked for twice.
    """
    xp = ctx.xp
    read_plane = read_plane or (lambda ch, z: _read_plane(ctx, spec, ch, z))
    params = basic.BasicParams.from_config(basic_cfg)
    ref_ch = stitch_cfg["reference_channel"]
    ref_z = (spec.z_planes + 1) // 2
    planes = [(ch, z) for ch in spec.channels for z in range(1, spec.z_planes + 1)]
    t0 = time.perf_counter()
    advance = ctx.progress(f"{spec.key} read + resize {len(planes)} planes", len(planes))
    small, ref_tiles, tile_shape = None, None, None
    for i, (ch, z) in enumerate(planes):
        tiles = read_plane(ch, z)
        tile_shape = tile_shape or tiles[0].shape
        if tiles[0].shape != tile_shape:
            raise RawDataError(f"{spec.tile_paths(ch, z)[0]}: shape {tiles[0].shape} differs from {tile_shape} "
                               f"of CH{planes[0][0]} Z{planes[0][1]:03d}; one shape per cycle")
        if small is None:  # filled in place: one batch array, no list + stacked copy; integer tiles' box means
            counts = tiles[0].dtype.kind in "ui"  # kept as uint16 (within half a count): half of float32's memory
            small = xp.empty((len(planes), len(tiles), params.working_size, params.working_size),
                             xp.uint16 if counts else xp.float32)
        for j in range(0, len(tiles), RESIZE_TILES):  # a few tiles at a time: their float32 copies stay small
            resized = basic.downsample(xp.stack([xpmod.to_device(t, xp) for t in tiles[j:j + RESIZE_TILES]]),
                                       params.working_size)
            small[i, j:j + RESIZE_TILES] = xp.clip(xp.rint(resized), 0, 65535) if counts else resized
            del resized
        if (ch, z) == (ref_ch, ref_z):
            ref_tiles = tiles
        advance()
    t_read = time.perf_counter() - t0
    if spec.rows * spec.cols < basic.MIN_TILES_ADVISED:
        log.warning("BaSiC: only %d tiles per plane; below ~%d the flatfield can carry specimen structure "
                    "(see qc/stitch)", spec.rows * spec.cols, basic.MIN_TILES_ADVISED)
    # each channel's in-focus (middle) plane first; the others start from its outlier weights
    anchors = [planes.index((ch, ref_z)) for ch, _ in planes]
    fit = basic.fit_anchored(small, anchors, params, workers=ctx.workers)
    xpmod.synchronize(xp)
    t_fit = time.perf_counter() - t0 - t_read
    log.info("BaSiC: %d planes (channels x z) fitted in two passes (in-focus planes first) in %.2f s; "
             "ADMM iterations per plane %d-%d",
             len(planes), t_fit, int(fit.iterations.min()), int(fit.iterations.max()))
    index = {p: i for i, p in enumerate(planes)}
    ref = index[(ref_ch, ref_z)]
    flat0, dark0 = basic.upsample(fit.flatfield[ref], tile_shape), basic.upsample(fit.darkfield[ref], tile_shape)
    corrected = [basic.correct(xpmod.to_device(t, xp), flat0, dark0) for t in ref_tiles]
    model = stitching.compute_model(corrected, spec.layout, spec.overlap, stitch_cfg.get("max_shift_px"))
    del corrected, flat0, dark0
    n_ok = sum(p.accepted for p in model.pairs)
    log.info("stitching model from CH%d Z%03d: %d of %d pairs accepted (threshold %.1f), stage model %s, "
             "mosaic %s", ref_ch, ref_z, n_ok, len(model.pairs), model.threshold, model.stage, model.mosaic_shape)
    for p in model.pairs:
        if not p.accepted:
            log.info("  pair %d-%d rejected: %s", p.a + 1, p.b + 1, p.reason)
    write_text_atomic(out["positions"], model.positions_csv())
    write_text_atomic(out["pairs"], model.pairs_csv())
    problem = stitching.grid_problem(model.pairs)
    if problem:
        raise stitching.StitchQualityError(
            f"{spec.key}: {problem}: check grid.rows x grid.cols ({spec.rows}x{spec.cols}), grid.order "
            f"({spec.order}) and grid.overlap ({spec.overlap}) against the acquisition; pairs: {out['pairs']}")
    shades = _shade_planes(ctx, spec, basic_cfg, params, small, fit, model, tile_shape, planes)
    del small, fit
    t_shade = time.perf_counter() - t0 - t_read - t_fit
    recorded: dict = {}
    saturated: dict = {}
    advance = ctx.progress(f"{spec.key} correct + blend", len(planes))
    for ch in spec.channels:
        prof = np.empty((spec.z_planes, 2) + tuple(tile_shape), np.float32)
        below = above = 0
        with ome_writer(out["stitched"][ch], (spec.z_planes,) + model.mosaic_shape, np.uint16, "ZYX",
                        spec.pixel_size_um, spec.z_step_um, [spec.marker(ch)], workers=ctx.workers) as mosaic:
            for z in range(1, spec.z_planes + 1):
                shade = shades[index[(ch, z)]]
                flat = xpmod.to_device(basic.upsample(shade.flatfield, tile_shape), xp)
                dark = xpmod.to_device(basic.upsample(shade.darkfield, tile_shape), xp)
                tiles = read_plane(ch, z) if (ch, z) != (ref_ch, ref_z) else ref_tiles
                recorded.setdefault(str(ch), {})[str(z)] = [edf.tile_stats(t) for t in tiles]
                plane = stitching.blend((basic.correct(xpmod.to_device(t, xp), flat, dark) for t in tiles), model)
                del tiles
                u16, lo, hi = basic.to_uint16(plane)
                del plane
                below, above = below + lo, above + hi
                mosaic[z - 1] = xpmod.to_host(u16)
                prof[z - 1, 0], prof[z - 1, 1] = xpmod.to_host(flat), xpmod.to_host(dark)
                advance()
        saturated[ch] = above
        log.info("CH%d: %d pixels above 65535 saturated, %d below 0 after offset subtraction set to 0 "
                 "(of %d)", ch, above, below, spec.z_planes * model.mosaic_shape[0] * model.mosaic_shape[1])
        write_ome(out["profiles"][ch], prof, "ZCYX", spec.pixel_size_um, spec.z_step_um, ["flatfield", "darkfield"],
                  workers=ctx.workers)
    shading_record = {f"{ch}/{z}": _shading_record(shades[index[(ch, z)]]) for ch, z in planes}
    footprints = [[int(y), int(x), int(tile_shape[0]), int(tile_shape[1])] for y, x in model.placement]
    write_text_atomic(out["planes"], json.dumps({"recorded": recorded, "saturated_after_correction": saturated,
                                                 "shading": shading_record, "footprints": footprints}, indent=1))
    return {"planes": len(planes), "fit_s": t_fit, "read_s": t_read, "shading_s": t_shade, "pairs_accepted": n_ok,
            "pairs": len(model.pairs), "saturated": saturated}


def _shade_planes(ctx: JobContext, spec: CycleSpec, basic_cfg: dict, params, small, fit, model, tile_shape,
                  planes) -> list:
    """Every plane's flatfield refined on the accepted pairs' overlaps, and its camera offset (host)."""
    ws = params.working_size
    pairs = [(p.a, p.b, model.positions[p.b] - model.positions[p.a]) for p in model.pairs if p.accepted]
    scale = (ws / tile_shape[0], ws / tile_shape[1])
    given = basic.known_offset(basic_cfg.get("darkfield", True), tile_shape, ws)

    def one(i):
        envelope = xpmod.to_host(fit.darkfield[i]).astype(np.float64) if params.darkfield else None
        return shading.shade_plane(xpmod.to_host(small[i]).astype(np.float64), xpmod.to_host(fit.flatfield[i]),
                                   envelope, pairs, scale, None if given is None else given[1])

    shades = list(ctx.pool.map(one, range(len(planes))))
    for (ch, z), sh in zip(planes, shades):
        r = sh.refinement
        if r.degree is None:
            log.warning("CH%d Z%03d: too few overlap samples to refine the flatfield; BaSiC's kept", ch, z)
        else:
            log.info("CH%d Z%03d: flatfield refined on %d overlap samples (degree %d, %s subtracted): seams "
                     "%.1f%% -> %.1f%%; offset %s, mean %.1f", ch, z, r.samples, r.degree, r.additive,
                     100 * r.seam_before, 100 * r.seam_after, sh.offset, float(sh.darkfield.mean()))
        if sh.offset_uncertain:
            log.warning("CH%d Z%03d: every tile carries light at every pixel (about %.0f counts above the offset "
                        "estimate %.0f): the camera offset is uncertain; give it as basic.darkfield: <counts> "
                        "or a dark frame", ch, z, sh.light_floor, float(sh.darkfield.mean()))
    return shades


def _shading_record(sh) -> dict:
    r = sh.refinement
    def finite(v):
        return v if v == v else None          # NaN (not refined) is null in JSON
    return {"offset": sh.offset, "offset_mean": float(sh.darkfield.mean()), "offset_uncertain": sh.offset_uncertain,
            "light_floor": sh.light_floor, "refined": r.degree is not None, "degree": r.degree,
            "additive": r.additive, "overlap_samples": r.samples, "seam_before": finite(r.seam_before),
            "seam_after": finite(r.seam_after)}


# ----------------------------------------------------------------------------- deconvolve
def optics_for(spec: CycleSpec, optics_cfg: dict, decon_cfg: dict, channel: int) -> psf.Optics:
    return psf.Optics(pixel_size_um=spec.pixel_size_um, z_step_um=spec.z_step_um, na=optics_cfg["na"],
                      immersion_index=optics_cfg["immersion_index"], sample_index=optics_cfg["sample_index"],
                      emission_nm=spec.emission(channel), model=decon_cfg["psf_model"],
                      depth_um=(spec.z_planes - 1) * spec.z_step_um / 2)


def kernel_for(spec: CycleSpec, o: psf.Optics, decon_cfg: dict, channel: int, n_planes: int):
    """The channel's PSF: measured (deconvolution.psf_file) on the data's grid, or computed from the optics."""
    path = psf.file_for(decon_cfg, channel)
    if path:
        voxel = decon_cfg.get("psf_voxel_um")
        return psf.measured(path, tuple(voxel) if voxel else None, spec.z_step_um, spec.pixel_size_um,
                            max_planes=2 * n_planes - 1)
    return psf.psf(o, *psf.default_half_size(o, n_planes))


def deconvolve(ctx: JobContext, spec: CycleSpec, optics_cfg: dict, decon_cfg: dict, inputs: dict, out: dict):
    """Richardson-Lucy per channel with a PSF from the optics; float32, flux kept.

    Streamed: each XY chunk is read from the stitched stack and its result written straight
    into the output file, so host memory holds one chunk's work, not the stacks."""
    for ch in spec.channels:
        stack = StackReader(inputs[ch], ctx.workers)   # ZYX, >= MIN_PLANES planes (checked with the raw data)
        shape = stack.shape
        o = optics_for(spec, optics_cfg, decon_cfg, ch)
        kernel = kernel_for(spec, o, decon_cfg, ch, shape[0])
        budget = deconvolution.memory_budget(ctx.xp, shape)
        chunk = deconvolution.chunk_for_budget(shape, kernel.shape, budget, decon_cfg["chunk_px"])
        halo = deconvolution.default_halo(kernel.shape)
        n_chunks = len(deconvolution.chunk_slices(shape[1], chunk, 0)) * len(deconvolution.chunk_slices(shape[2], chunk, 0))
        log.info("CH%d: %s stack in %d chunks of <= %d px (halo %d px; RL work per chunk <= %.0f MB, budget %.0f MB)",
                 ch, shape, n_chunks, chunk, halo, deconvolution.working_bytes(
                     deconvolution.piece_shape(shape, chunk, halo), kernel.shape) / 2**20, budget / 2**20)
        advance = ctx.progress(f"{spec.key} CH{ch} RL x{decon_cfg['iterations']}", n_chunks)
        t0 = time.perf_counter()
        flux: dict = {}
        with ome_writer(out[ch], shape, np.float32, "ZYX", spec.pixel_size_um, spec.z_step_um,
                        [spec.marker(ch)], workers=ctx.workers) as result:
            deconvolution.deconvolve(stack, kernel, decon_cfg["iterations"], chunk, xp=ctx.xp, workers=ctx.workers,
                                     progress=lambda d, t: advance(), out=result, flux=flux)
        log.info("CH%d: PSF %s (%s), %d iterations in %.1f s, flux ratio %.4f", ch, kernel.shape,
                 psf.file_for(decon_cfg, ch) or f"{o.model}, {o.emission_nm:.0f} nm", decon_cfg["iterations"],
                 time.perf_counter() - t0, flux["out"] / max(flux["in"], 1e-12))


# ----------------------------------------------------------------------------- edf
def extended_depth(ctx: JobContext, spec: CycleSpec, edf_cfg: dict, stacks: dict, planes_json: str,
                   out: dict, focus_out: dict):
    """EDF per channel of each stack in ``stacks`` ({"quantification": {ch: stitched path},
    "deconvolved": {ch: path}}), into ``out`` (same keys); the focus map of the first. The quality
    gate judges what the camera recorded in each tile of each plane, and a faulty tile is left out
    of its plane where it lies in the mosaic only.

    Two images because one cannot be both (bench/decon_edf.py): Richardson-Lucy stopped after tens
    of iterations sharpens but leaves each cell's integrated intensity uneven, while the EDF of the
    stitched stack keeps it; the first is for quantification, the second for display and segmentation."""
    planes = json.loads(Path(planes_json).read_text())
    recorded, footprints = planes["recorded"], planes["footprints"]
    for ch in spec.channels:
        stats = [recorded[str(ch)][str(z)] for z in range(1, spec.z_planes + 1)]
        kept, bad = edf.quality_gate(stats, label=f"{spec.key} CH{ch}: ")
        for z, faults in enumerate(bad):
            for t, why in faults.items():
                log.warning("CH%d Z%03d: tile %d left out of the EDF where it lies: %s", ch, z + 1, t + 1, why)
        for i, (kind, paths_) in enumerate(stacks.items()):
            stack = StackReader(paths_[ch], ctx.workers)    # read plane by plane, never whole
            res = edf.extended_depth_of_field(stack, edf_cfg["radius"], edf_cfg["sigma"], kept, xp=ctx.xp,
                                              invalid=_fault_masks(bad, footprints, stack.shape[1:]))
            write_plane(out[kind][ch], xpmod.to_host(res.image), spec.marker(ch), spec.pixel_size_um,
                        workers=ctx.workers)
            if i == 0:
                write_plane(focus_out[ch], xpmod.to_host(res.focus_index), "focus index", spec.pixel_size_um,
                            workers=ctx.workers)
            del res
            log.info("CH%d: EDF (%s) from %d of %d planes", ch, kind, len(kept), stack.shape[0])


def _fault_masks(bad: list[dict], footprints: list, shape):
    """invalid(z) for the EDF: the mosaic footprints of plane z's faulty tiles (None: none)."""
    def invalid(z):
        if not bad[z]:
            return None
        mask = np.zeros(shape, bool)
        for t in bad[z]:
            y, x, h, w = footprints[t]
            mask[y:y + h, x:x + w] = True
        return mask
    return invalid


# ----------------------------------------------------------------------------- registration
def register(ctx: JobContext, specs: list[CycleSpec], reg_cfg: dict, inputs: dict, out: dict) -> list:
    """Align every cycle's EDFs to the reference cycle; write registered channels, shifts, plex files.

    ``inputs``: {kind: {cycle_key: {ch: path}}}, the first kind (quantification) measures the shifts
    and every kind is moved by them; ``out``: {"registered": {kind: {cycle_key: {ch: path}}},
    "shifts": path, "plex": {kind: path}}.
    """
    xp = ctx.xp
    by_key = {s.key: s for s in specs}
    ref_cycle = reg_cfg.get("reference_cycle") or specs[0].cycle
    ref_key = f"cyc{ref_cycle:03d}"
    ref_ch = reg_cfg["reference_channel"]
    first = next(iter(inputs))
    reference = xpmod.to_device(read_tiff(inputs[first][ref_key][ref_ch]).astype(np.float32), xp)
    shape = tuple(reference.shape)
    shifts, names = [], []
    registered: dict = {kind: [] for kind in inputs}
    advance = ctx.progress("register cycles", len(specs))
    for spec in specs:
        moving = reference if spec.key == ref_key else \
            xpmod.to_device(read_tiff(inputs[first][spec.key][ref_ch]).astype(np.float32), xp)
        if spec.key == ref_key:
            s = registration.Shift(spec.key, 0.0, 0.0, float("inf"), 0.0)
        else:
            s = registration.measure_shift(reference, moving, spec.key)
        shifts.append(s)
        log.info("%s: shift (%.3f, %.3f) px, significance %.1f (threshold %.1f)", spec.key, s.dy, s.dx,
                 s.significance, s.threshold)
        for ch in spec.channels:
            names.append(spec.marker(ch))
            for kind in inputs:
                img = moving if (kind == first and ch == ref_ch) else \
                    xpmod.to_device(read_tiff(inputs[kind][spec.key][ch]).astype(np.float32), xp)
                reg = xpmod.to_host(registration.apply_shift(img, s, shape))
                path = out["registered"][kind][spec.key][ch]
                write_plane(path, reg, spec.marker(ch), spec.pixel_size_um, workers=ctx.workers)
                registered[kind].append(path)
                del img, reg
        del moving
        advance()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["cycle", "dy_px", "dx_px", "score"])
    for s in shifts:
        w.writerow([s.cycle, f"{s.dy:.3f}", f"{s.dx:.3f}", "reference" if s.cycle == ref_key else f"{s.significance:.2f}"])
    write_text_atomic(out["shifts"], buf.getvalue())
    cycles = [spec.cycle for spec in specs for _ in spec.channels]
    unique = unique_channel_names(names, cycles)
    if "markers" in out:
        write_text_atomic(out["markers"], markers_csv(unique, cycles))
    for kind, paths_ in registered.items():
        levels = write_pyramidal_ome(out["plex"][kind], lambda c, p=paths_: read_tiff(p[c]), len(paths_), unique,
                                     by_key[ref_key].pixel_size_um, dtype=reg_cfg.get("plex_dtype", "uint16"),
                                     workers=ctx.workers)
        log.info("%s: %d channels, %d pyramid levels (%s)", Path(out["plex"][kind]).name, len(paths_), levels, kind)
    return shifts


def unique_channel_names(names: list[str], cycles: list[int]) -> list[str]:
    """Channel names of the plex file, unique: a marker that repeats (DAPI in every cycle) keeps
    its name the first time and gets its cycle after it (DAPI_cyc002) every later time, so QuPath
    and MCMICRO can match channels by name."""
    seen: set[str] = set()
    out = []
    for name, cycle in zip(names, cycles):
        unique = name if name not in seen else f"{name}_cyc{cycle:03d}"
        k = 2
        while unique in seen:                       # the same marker twice in one cycle
            unique, k = f"{name}_cyc{cycle:03d}_{k}", k + 1
        seen.add(unique)
        out.append(unique)
    return out


def markers_csv(names: list[str], cycles: list[int]) -> str:
    """MCMICRO's markers.csv: channel_number (from 1, the plex file's order), cycle_number, marker_name."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["channel_number", "cycle_number", "marker_name"])
    for i, (name, cycle) in enumerate(zip(names, cycles), start=1):
        w.writerow([i, cycle, name])
    return buf.getvalue()


def by_cycle_and_channel(specs: list[CycleSpec], paths: list[str]) -> dict:
    """{cycle_key: {channel: path}} from a cycle-major, channel-minor list of paths."""
    it = iter(paths)
    out = {s.key: {ch: next(it) for ch in s.channels} for s in specs}
    if next(it, None) is not None:
        raise ValueError("more paths than cycles x channels")
    return out
