"""The stitch stage: raw tiles -> BaSiC per z-plane, tile positions, stitched z-stack mosaics per channel."""

from __future__ import annotations

import errno
import logging
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import xp as xpmod
from ..experiment import CycleSpec
from ..image import basic, defects, edf, shading, stitching
from ..io.raw import RawDataError
from ..io.tiff import (DiskFullError, disk_full_message, non_finite, ome_writer, read_tiff, write_ome,
                       write_text_atomic)
from ..job import JobContext
from ..planes import PlanesRecord
from ._common import per_channel

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
        if problem := non_finite(path, t):
            raise RawDataError(problem)
    return tiles



def stitch(ctx: JobContext, spec: CycleSpec, basic_cfg: dict, stitch_cfg: dict, out, read_plane=None) -> dict:
    """BaSiC per (channel, z) in one batched fit, one stitching model, the flatfield of every
    plane refined on the tile overlaps and its camera offset, blended mosaics.

    ``out``: the stage's named outputs (paths.PIPELINE; the rule's ``snakemake.output``): "stitched"
    and "profiles" one path per channel of ``spec.channels``, "positions", "pairs", "planes" one path
    each. ``read_plane(channel, z)`` gives a plane's tiles in tile order (default: the
    raw files; bench/gpu_cycle.py hands over tiles made in memory); each plane is asked for twice.

    The steps, each timed: the sensor's defective pixels (then repaired in every tile read) -> read
    every plane at working size -> BaSiC fit of all planes -> the stitching model from the reference
    plane -> every plane's flatfield refined on the overlaps and its offset -> correct and blend every
    plane into its channel's mosaic -> the planes record.
    """
    read_plane = read_plane or (lambda ch, z: _read_plane(ctx, spec, ch, z))
    params = basic.BasicParams.from_config(basic_cfg)
    planes = [(ch, z) for ch in spec.channels for z in range(1, spec.z_planes + 1)]
    reference = (stitch_cfg["reference_channel"], (spec.z_planes + 1) // 2)     # in-focus (middle) plane
    times: dict = {}
    with _timed(times, "defects_s"):
        bad_pixels, columns = _find_sensor_pattern(ctx, spec, basic_cfg, read_plane, reference[1], out)
    read_plane = _repaired(read_plane, bad_pixels)
    with _timed(times, "read_s"):
        small, ref_tiles, tile_shape = _read_working_size(ctx, spec, params, planes, reference, read_plane, columns)
    _check_space(spec, tile_shape, out)
    with _timed(times, "fit_s"):
        fit = _fit_basic(ctx, spec, params, small, planes, reference[1])
    model = _stitching_model(ctx, spec, stitch_cfg, fit, planes.index(reference), ref_tiles, tile_shape, reference,
                             columns, out)
    with _timed(times, "shading_s"):
        shades, offsets = _shade_planes(ctx, spec, basic_cfg, params, small, fit, model, tile_shape, planes)
    for ch, record in offsets.items():
        record["column_offsets_rms"] = float(columns[int(ch)].std())
    del small, fit
    recorded, saturated = _blend_mosaics(ctx, spec, model, shades, planes, tile_shape, read_plane,
                                         {reference: ref_tiles}, columns, out)
    footprints = [[int(y), int(x), int(tile_shape[0]), int(tile_shape[1])] for y, x in model.placement]
    PlanesRecord(recorded, saturated, {f"{ch}/{z}": _shading_record(sh) for (ch, z), sh in zip(planes, shades)},
                 footprints, offsets, bad_pixels.counts()).write(out["planes"])
    return {"planes": len(planes), **times, "pairs_accepted": sum(p.accepted for p in model.pairs),
            "pairs": len(model.pairs), "saturated": saturated, "defective_pixels": len(bad_pixels)}


def _check_space(spec: CycleSpec, tile_shape, out) -> None:
    """Before the stitch computes: room for one channel's stack while it is written (its uncompressed
    scratch, channels are written one after another), with the mosaic's size at the nominal step."""
    sy, sx = stitching.nominal_step(tile_shape, spec.overlap)
    nbytes = spec.z_planes * ((spec.rows - 1) * sy + tile_shape[0]) * ((spec.cols - 1) * sx + tile_shape[1]) * 2
    folder = Path(per_channel(spec, out["stitched"])[spec.channels[0]]).parent
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.disk_usage(folder).free < nbytes:
        raise DiskFullError(errno.ENOSPC, f"{disk_full_message(folder, nbytes)}: one channel's stack while it is "
                                          "written, checked before the stitch computes")


def _find_sensor_pattern(ctx: JobContext, spec: CycleSpec, basic_cfg: dict, read_plane, ref_z: int,
                         out) -> tuple[defects.Defects, dict]:
    """The sensor's defective pixels: from a dark frame the user gave, and from their persistence across
    the tiles of each channel's middle plane (one camera: the union over channels); written to
    ``out["defects"]``. And each channel's column offsets (W,), part of its camera offset: measured where
    the offset is fitted or given as a number (a dark frame holds them; zeros where the offset is off)."""
    found, columns = None, {}
    for ch in spec.channels:
        tiles = read_plane(ch, ref_z)
        stack = defects.stack_tiles(tiles, ctx.xp)                   # one copy to the device for both
        d = defects.find_defects(stack, ctx.xp)
        log.info("CH%d Z%03d: %d defective sensor pixels persist across the %d tiles (%s)", ch, ref_z, len(d),
                 len(tiles), ", ".join(f"{k} {n}" for k, n in d.counts().items() if n) or "none")
        found = d if found is None else found.union(d)
        columns[ch] = np.zeros(tiles[0].shape[-1], np.float32)
        if basic.DarkfieldSetting.from_config(basic_cfg["darkfield"], ch).mode in ("fit", "counts"):
            columns[ch] = defects.column_offsets(stack, ctx.xp)
            log.info("CH%d Z%03d: column offsets of the sensor %.2f counts rms (largest %.1f), part of the offset "
                     "subtracted", ch, ref_z, float(columns[ch].std()), float(np.abs(columns[ch]).max()))
        shape = tuple(tiles[0].shape)
        del tiles, stack
    frames = {basic.DarkfieldSetting.from_config(basic_cfg["darkfield"], ch).frame for ch in spec.channels} - {None}
    for path in sorted(frames):                  # one camera: the union of its dark frames' hot pixels
        frame = basic.known_offset(path, shape, basic_cfg["working_size"])[0]
        from_frame = defects.defects_in_dark_frame(frame)
        log.info("dark frame %s: %d hot pixels", path, len(from_frame))
        found = from_frame.union(found)
    write_text_atomic(out["defects"], found.csv())
    if len(found):
        log.info("%s: %d defective sensor pixels replaced by their neighbours' median in every tile (%s)", spec.key,
                 len(found), out["defects"])
    return found, columns


def _repaired(read_plane, bad_pixels: defects.Defects):
    """``read_plane`` whose tiles have the sensor's defective pixels replaced."""
    if not len(bad_pixels):
        return read_plane
    return lambda ch, z: [defects.repair(t, bad_pixels) for t in read_plane(ch, z)]


@contextmanager
def _timed(times: dict, key: str):
    """``with _timed(times, "fit_s"):`` records the block's seconds in ``times``."""
    t0 = time.perf_counter()
    yield
    times[key] = time.perf_counter() - t0


def _read_working_size(ctx: JobContext, spec: CycleSpec, params, planes, reference, read_plane, columns: dict):
    """Every plane's tiles box-downsampled to BaSiC's working size, less their channel's column offsets,
    into one batch array (planes x tiles x ws x ws; integer tiles kept as uint16, within half a count:
    half of float32's memory); the reference plane's full tiles are kept for the stitching model."""
    xp = ctx.xp
    advance = ctx.progress(f"{spec.key} read + resize {len(planes)} planes", len(planes))
    small, ref_tiles, tile_shape, patterns = None, None, None, {}
    for i, (ch, z) in enumerate(planes):
        tiles = read_plane(ch, z)
        tile_shape = tile_shape or tiles[0].shape
        if tiles[0].shape != tile_shape:
            raise RawDataError(f"{spec.tile_paths(ch, z)[0]}: shape {tiles[0].shape} differs from {tile_shape} "
                               f"of CH{planes[0][0]} Z{planes[0][1]:03d}; one shape per cycle")
        if small is None:  # filled in place: one batch array, no list + stacked copy
            counts = tiles[0].dtype.kind in "ui"
            small = xp.empty((len(planes), len(tiles), params.working_size, params.working_size),
                             xp.uint16 if counts else xp.float32)
        if ch not in patterns:                        # the channel's column offsets at working size, once
            patterns[ch] = basic.downsample(xpmod.to_device(_columns_image(columns[ch], tile_shape), xp)[None],
                                            params.working_size)
        for j in range(0, len(tiles), RESIZE_TILES):  # a few tiles at a time: their float32 copies stay small
            resized = basic.downsample(xp.stack([xpmod.to_device(t, xp) for t in tiles[j:j + RESIZE_TILES]]),
                                       params.working_size) - patterns[ch]
            small[i, j:j + RESIZE_TILES] = xp.clip(xp.rint(resized), 0, 65535) if counts else resized
            del resized
        if (ch, z) == reference:
            ref_tiles = tiles
        advance()
    return small, ref_tiles, tile_shape


def _columns_image(columns: np.ndarray, tile_shape) -> np.ndarray:
    """A channel's column offsets as an image of the tile's shape (every row the same)."""
    return np.broadcast_to(columns[None, :], tuple(tile_shape)).astype(np.float32)


def _fit_basic(ctx: JobContext, spec: CycleSpec, params, small, planes, ref_z: int):
    """BaSiC over all planes in one batch: each channel's in-focus (middle) plane first, the others
    starting from its outlier weights."""
    if spec.rows * spec.cols < basic.MIN_TILES_ADVISED:
        log.warning("BaSiC: only %d tiles per plane; below ~%d the flatfield can carry specimen structure "
                    "(see qc/stitch)", spec.rows * spec.cols, basic.MIN_TILES_ADVISED)
    t0 = time.perf_counter()
    anchors = [planes.index((ch, ref_z)) for ch, _ in planes]
    fit = basic.fit_anchored(small, anchors, params, workers=ctx.workers)
    xpmod.synchronize(ctx.xp)
    log.info("BaSiC: %d planes (channels x z) fitted in two passes (in-focus planes first) in %.2f s; "
             "ADMM iterations per plane %d-%d",
             len(planes), time.perf_counter() - t0, int(fit.iterations.min()), int(fit.iterations.max()))
    return fit


def _stitching_model(ctx: JobContext, spec: CycleSpec, stitch_cfg: dict, fit, ref: int, ref_tiles, tile_shape,
                     reference, columns: dict, out):
    """One stitching model for the cycle from the reference plane, corrected by its BaSiC fit; writes
    positions.csv and pairs.csv, and stops the job in one line where the grid cannot be right."""
    xp = ctx.xp
    flat0 = basic.upsample(fit.flatfield[ref], tile_shape)
    dark0 = basic.upsample(fit.darkfield[ref], tile_shape) + xpmod.to_device(columns[reference[0]], xp)
    corrected = [basic.correct(xpmod.to_device(t, xp), flat0, dark0) for t in ref_tiles]
    model = stitching.compute_model(corrected, spec.layout, spec.overlap, stitch_cfg.get("max_shift_px"))
    del corrected, flat0, dark0
    log.info("stitching model from CH%d Z%03d: %d of %d pairs accepted (threshold %.1f), stage model %s, "
             "mosaic %s", *reference, sum(p.accepted for p in model.pairs), len(model.pairs), model.threshold,
             model.stage, model.mosaic_shape)
    for p in model.pairs:
        if not p.accepted:
            log.info("  pair %d-%d rejected: %s", p.a + 1, p.b + 1, p.reason)
    write_text_atomic(out["positions"], model.positions_csv())
    write_text_atomic(out["pairs"], model.pairs_csv())
    problem = stitching.focus_problem(model.pairs)
    if problem:
        raise stitching.StitchQualityError(f"{spec.key}: {problem}; pairs: {out['pairs']}")
    problem = stitching.grid_problem(model.pairs)
    if problem:
        raise stitching.StitchQualityError(
            f"{spec.key}: {problem}: check grid.rows x grid.cols ({spec.rows}x{spec.cols}), grid.order "
            f"({spec.order}) and grid.overlap ({spec.overlap}) against the acquisition; pairs: {out['pairs']}")
    return model


def _blend_mosaics(ctx: JobContext, spec: CycleSpec, model, shades, planes, tile_shape, read_plane, kept_tiles: dict,
                   columns: dict, out) -> tuple[dict, dict]:
    """Every plane corrected by its own flat- and darkfield (with its channel's column offsets) and blended
    into its channel's mosaic (uint16), written plane by plane; the profiles per channel. Returns each
    tile's raw statistics per plane (for the EDF's quality gate) and the pixels saturated by the correction
    per channel."""
    xp = ctx.xp
    stitched_out, profiles_out = per_channel(spec, out["stitched"]), per_channel(spec, out["profiles"])
    index = {p: i for i, p in enumerate(planes)}
    recorded: dict = {}
    saturated: dict = {}
    advance = ctx.progress(f"{spec.key} correct + blend", len(planes))
    for ch in spec.channels:
        prof = np.empty((spec.z_planes, 2) + tuple(tile_shape), np.float32)
        below = above = 0
        with ome_writer(stitched_out[ch], (spec.z_planes,) + model.mosaic_shape, np.uint16, "ZYX",
                        spec.pixel_size_um, spec.z_step_um, [spec.marker(ch)], workers=ctx.workers) as mosaic:
            for z in range(1, spec.z_planes + 1):
                shade = shades[index[(ch, z)]]
                flat = xpmod.to_device(basic.upsample(shade.flatfield, tile_shape), xp)
                dark = xpmod.to_device(basic.upsample(shade.darkfield, tile_shape) + columns[ch], xp)
                tiles = kept_tiles.get((ch, z)) or read_plane(ch, z)
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
        write_ome(profiles_out[ch], prof, "ZCYX", spec.pixel_size_um, spec.z_step_um, ["flatfield", "darkfield"],
                  workers=ctx.workers)
    return recorded, saturated


def _shade_planes(ctx: JobContext, spec: CycleSpec, basic_cfg: dict, params, small, fit, model, tile_shape,
                  planes) -> tuple[list, dict]:
    """Every plane's flatfield refined on the accepted pairs' overlaps, and its camera offset (host):
    one per channel for all its planes where it is fitted. Returns the shadings and, per channel, the
    fitted offset's record."""
    ws = params.working_size
    pairs = [(p.a, p.b, model.positions[p.b] - model.positions[p.a]) for p in model.pairs if p.accepted]
    scale = (ws / tile_shape[0], ws / tile_shape[1])
    given = {ch: basic.known_offset(basic_cfg["darkfield"], tile_shape, ws, ch) for ch in spec.channels}
    fitted = [ch for ch in spec.channels if params.darkfield and given[ch] is None]

    def envelope(i):
        return xpmod.to_host(fit.darkfield[i]).astype(np.float64) if params.darkfield else None

    def inputs(i):
        return xpmod.to_host(small[i]).astype(np.float64), xpmod.to_host(fit.flatfield[i]), envelope(i)

    mine = {ch: [i for i, (c, _) in enumerate(planes) if c == ch] for ch in fitted}
    offsets, lows = shading.channel_offsets(mine, inputs, pairs, scale, ctx.pool.map, envelope)
    for ch, off in offsets.items():
        log.info("CH%d: camera offset %.1f counts (%s; standard error %.1f over %d planes and the field; each "
                 "plane alone %s), dimmest light floor %.0f counts", ch, float(off.image.mean()), off.model,
                 off.uncertainty, len(mine[ch]), " ".join(f"{v:.0f}" for v in off.per_plane), off.light_floor)
        if off.uncertain:
            log.warning("CH%d: the camera offset is uncertain: %.1f +- %.1f counts (about %.0f-%.0f) against a "
                        "dimmest light floor of %.0f counts; give it as basic.darkfield: {%d: <counts>} or a dark "
                        "frame", ch, float(off.image.mean()), off.uncertainty,
                        float(off.image.mean()) - 2 * off.uncertainty, float(off.image.mean()) + 2 * off.uncertainty,
                        off.light_floor, ch)

    def one(i):
        ch = planes[i][0]
        if ch in offsets:
            return shading.shade_with_offset(*inputs(i), pairs, scale, offsets[ch], lows[i])
        return shading.shade_plane(*inputs(i), pairs, scale, None if given[ch] is None else given[ch][1])

    shades = list(ctx.pool.map(one, range(len(planes))))
    record = {str(ch): {"counts": float(o.image.mean()), "standard_error": o.uncertainty,
                        "per_plane": list(o.per_plane), "light_floor": o.light_floor, "uncertain": o.uncertain,
                        "model": o.model}
              for ch, o in offsets.items()}
    for (ch, z), sh in zip(planes, shades):
        r = sh.refinement
        if r.degree is None:
            log.warning("CH%d Z%03d: too few overlap samples to refine the flatfield; BaSiC's kept", ch, z)
        else:
            log.info("CH%d Z%03d: flatfield refined on %d overlap samples (degree %d, %s subtracted): seams "
                     "%.1f%% -> %.1f%%; offset %s, mean %.1f", ch, z, r.samples, r.degree, r.additive,
                     100 * r.seam_before, 100 * r.seam_after, sh.offset, sh.offset_mean)
        if sh.added_light:
            log.info("CH%d Z%03d: the envelope's excess over the offset (light fixed to the sensor, such as stray "
                     "light) subtracted with it, as the flatfield was fitted: mean %.1f counts (its shape: the QC "
                     "page's darkfield)", ch, z, sh.added_light)
    return shades, record


def _shading_record(sh) -> dict:
    r = sh.refinement
    def finite(v):
        return v if v == v else None          # NaN (not refined) is null in JSON
    return {"offset": sh.offset, "offset_mean": sh.offset_mean, "offset_uncertain": sh.offset_uncertain,
            "light_floor": sh.light_floor, "added_light": sh.added_light, "refined": r.degree is not None,
            "degree": r.degree,
            "additive": r.additive, "overlap_samples": r.samples, "seam_before": finite(r.seam_before),
            "seam_after": finite(r.seam_after)}
