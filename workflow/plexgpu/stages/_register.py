"""The registration stage: every cycle's EDFs aligned to the reference cycle, registered planes and plex files."""

from __future__ import annotations

import csv
import io
import logging
import json
from pathlib import Path

import numpy as np

from .. import camera
from .. import xp as xpmod
from ..experiment import CycleSpec
from ..image import registration, stitching
from ..planes import PlanesRecord
from ..io.tiff import (read_tiff, write_plane, write_pyramidal_ome,
                      write_text_atomic)
from ..job import JobContext

log = logging.getLogger("plexgpu")


#: registration's two kinds of image: (EDF input, registered output, plex output) of the stage registry
REGISTERED_KINDS = {"quantification": ("edf", "registered", "plex"),
                    "deconvolved": ("edf_deconvolved", "registered_deconvolved", "plex_deconvolved")}


def register(ctx: JobContext, specs: list[CycleSpec], reg_cfg: dict, inputs, out, shared_camera: bool = True) -> list:
    """Align every cycle's EDFs to the reference cycle; write registered channels, shifts, plex files.

    ``inputs`` / ``out``: the stage's named inputs and outputs (the rule's snakemake.input / output):
    per-cycle-and-channel lists (cycle-major) "edf", "edf_deconvolved", "profiles" (the stitch job's
    flatfields) -> "registered", "registered_deconvolved"; per cycle "planes", "positions" (the stitch
    job's); "shifts", "camera", "markers", "plex", "plex_deconvolved" one path each. The shifts are measured
    on the quantification EDF and move both kinds. With ``shared_camera`` each cycle's channel is first
    brought to the camera offset all cycles give together (``camera``): its own offset minus the camera's,
    divided by its flatfield where each pixel came from, is added.
    """
    xp = ctx.xp
    offsets = camera_offsets(specs, inputs, shared_camera, out["camera"])
    src = {kind: by_cycle_and_channel(specs, list(inputs[i])) for kind, (i, _, _) in REGISTERED_KINDS.items()}
    dst = {kind: by_cycle_and_channel(specs, list(out[r])) for kind, (_, r, _) in REGISTERED_KINDS.items()}
    by_key = {s.key: s for s in specs}
    ref_cycle = reg_cfg.get("reference_cycle") or specs[0].cycle
    ref_key = f"cyc{ref_cycle:03d}"
    ref_ch = reg_cfg["reference_channel"]
    first = next(iter(src))
    reference = xpmod.to_device(read_tiff(src[first][ref_key][ref_ch]).astype(np.float32), xp)
    shape = tuple(reference.shape)
    profiles = by_cycle_and_channel(specs, list(inputs["profiles"]))
    positions = dict(zip((s.key for s in specs), inputs["positions"]))
    shifts, names, residual = [], [], {}
    registered: dict = {kind: [] for kind in src}
    advance = ctx.progress("register cycles", len(specs))
    for spec in specs:
        moving = reference if spec.key == ref_key else \
            xpmod.to_device(read_tiff(src[first][spec.key][ref_ch]).astype(np.float32), xp)
        if spec.key == ref_key:
            s = registration.Transform(spec.key, "translation", 0.0, 0.0, significance=float("inf"))
        else:
            s = registration.register_cycle(reference, moving, spec.key, reg_cfg["model"], reg_cfg["block_px"],
                                            reg_cfg["smoothness"], reg_cfg["max_local_px"])
        shifts.append(s)
        log.info("%s: %s model: shift (%.3f, %.3f) px, rotation %.4f deg, significance %.1f (threshold %.1f); "
                 "%d of %d blocks measured", spec.key, s.model, s.dy, s.dx, s.rotation_deg, s.significance,
                 s.threshold, s.blocks_reliable, s.blocks_total)
        for ch in spec.channels:
            names.append(spec.marker(ch))
            added = offsets[str(ch)].correction(spec.key) if str(ch) in offsets else 0.0
            per_flat = None if not added else xpmod.to_host(     # on the host while a channel is sampled
                added * inverse_flat_mosaic(xp, profiles[spec.key][ch], positions[spec.key], tuple(moving.shape)))
            for kind in src:
                img = moving if (kind == first and ch == ref_ch) else \
                    xpmod.to_device(read_tiff(src[kind][spec.key][ch]).astype(np.float32), xp)
                if per_flat is not None:             # the camera's offset
                    if img is reference:
                        img = img.copy()             # the reference stays as it is
                    img += xpmod.to_device(per_flat, xp)
                    xp.maximum(img, 0, out=img)
                moved = registration.apply_transform(img, s, shape)
                if kind == first and ch == ref_ch:          # what is left, block by block (held-out blocks)
                    covered = xpmod.to_host(registration.coverage(tuple(img.shape), s, shape, xp))
                    res, _ = registration.local_residuals(reference, moved, reg_cfg["block_px"], covered)
                    residual[spec.key] = res
                    if np.isfinite(res).any():
                        log.info("%s: local residual after registration: worst %.3f px, median %.3f px over %d "
                                 "blocks", spec.key, float(np.nanmax(res)), float(np.nanmedian(res)),
                                 int(np.isfinite(res).sum()))
                reg = xpmod.to_host(moved)
                del moved
                path = dst[kind][spec.key][ch]
                write_plane(path, reg, spec.marker(ch), spec.pixel_size_um, workers=ctx.workers)
                registered[kind].append(path)
                del img, reg
            del per_flat
        del moving
        advance()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["cycle", "dy_px", "dx_px", "score", "rotation_deg", "residual_max_px", "residual_median_px"])
    def px(v):
        return f"{v:.3f}" if np.isfinite(v) else ""
    for s in shifts:
        r = residual.get(s.cycle, np.full(1, np.nan))
        worst, med = (float(np.nanmax(r)), float(np.nanmedian(r))) if np.isfinite(r).any() else (np.nan, np.nan)
        w.writerow([s.cycle, f"{s.dy:.3f}", f"{s.dx:.3f}", "reference" if s.cycle == ref_key else f"{s.significance:.2f}",
                    f"{s.rotation_deg:.4f}", px(worst), px(med)])
    write_text_atomic(out["shifts"], buf.getvalue())
    write_text_atomic(out["transforms"], json.dumps(
        {s.cycle: {**s.as_dict(), "block_px": reg_cfg["block_px"],
                   "residual_px": [[None if not np.isfinite(v) else round(float(v), 3) for v in row]
                                   for row in residual.get(s.cycle, np.zeros((0, 0)))]} for s in shifts}))
    cycles = [spec.cycle for spec in specs for _ in spec.channels]
    unique = unique_channel_names(names, cycles)
    write_text_atomic(out["markers"], markers_csv(unique, cycles))
    for kind, paths_ in registered.items():
        plex = out[REGISTERED_KINDS[kind][2]]
        levels = write_pyramidal_ome(plex, lambda c, p=paths_: read_tiff(p[c]), len(paths_), unique,
                                     by_key[ref_key].pixel_size_um, dtype=reg_cfg.get("plex_dtype", "uint16"),
                                     workers=ctx.workers)
        log.info("%s: %d channels, %d pyramid levels (%s)", Path(plex).name, len(paths_), levels, kind)
    return shifts


def camera_offsets(specs: list[CycleSpec], inputs, shared_camera: bool, out_json: str) -> dict:
    """Each channel's camera offset over the cycles (``camera.across_cycles`` of the stitch jobs' fitted
    offsets), logged and written to ``out_json`` with what each cycle gets added, and the agreeing cycles whose
    stacks keep an offset noticeably off it (``stacks_apart``: the counts a dim marker reads there against
    plex.ome.tif, the QC page's warn); {} without ``shared_camera``, where each cycle keeps its own."""
    fitted = {s.key: PlanesRecord.read(p).offsets for s, p in zip(specs, inputs["planes"])}
    cams = camera.across_cycles(fitted)
    record = {"shared_camera": shared_camera, "channels": {}}
    for ch, cam in cams.items():
        record["channels"][ch] = {
            "counts": cam.counts, "standard_error": cam.standard_error, "from_cycles": cam.cycles,
            "set_aside": {c: vars(d) for c, d in cam.set_aside.items()},
            "stacks_apart": dict(cam.stacks_apart),
            "per_cycle": {c: {"counts": x, "standard_error": se,
                              "added_over_flatfield": cam.correction(c) if shared_camera else 0.0}
                          for c, (x, se) in cam.own.items()}}
        if cam.counts is None:
            log.warning("CH%s: no two cycles agree on the camera offset (%s): each cycle keeps its own; give "
                        "basic.darkfield or a dark frame", ch, ", ".join(f"{c} {x:.1f} +- {se:.1f}"
                                                                         for c, (x, se) in cam.own.items()))
            continue
        log.info("CH%s: camera offset %.1f +- %.1f counts from %s%s%s", ch, cam.counts, cam.standard_error,
                 ", ".join(cam.cycles), "".join(f"; {c} ({d.counts:.1f} +- {d.standard_error:.1f}) set aside"
                                                for c, d in cam.set_aside.items()),
                 "; each cycle brought to it: " + ", ".join(f"{c} {cam.correction(c):+.1f}" for c in cam.own)
                 if shared_camera else " (basic.shared_camera false: each cycle keeps its own)")
        for c, reads in cam.stacks_apart.items():
            log.warning("CH%s: %s's own offset %.1f +- %.1f agrees with the camera's within its error, but its "
                        "stitched and EDF stacks keep it: a dim marker reads %+.1f counts there against "
                        "plex.ome.tif", ch, c, *cam.own[c], reads)
    write_text_atomic(out_json, json.dumps(record, indent=1))
    return cams if shared_camera else {}


def inverse_flat_mosaic(xp, profiles_tif: str, positions_csv: str, shape: tuple[int, int]):
    """1 / flatfield where each mosaic pixel came from (the planes' mean; tiles blended as the stitch job
    blended them), in ``shape`` (the cycle's EDF)."""
    prof = read_tiff(profiles_tif)                                    # Z, (flat, dark), Y, X
    inverse = (1.0 / np.maximum(prof[:, 0], 1e-3)).mean(axis=0).astype(np.float32)
    model = stitching.StitchModel.from_positions_csv(Path(positions_csv).read_text(), inverse.shape)
    tile = xpmod.to_device(inverse, xp)
    mosaic = stitching.blend((tile for _ in range(len(model.positions))), model)
    h, w = min(shape[0], mosaic.shape[0]), min(shape[1], mosaic.shape[1])
    if (h, w) == tuple(shape):
        return mosaic[:h, :w]
    return xp.pad(mosaic[:h, :w], ((0, shape[0] - h), (0, shape[1] - w)), mode="edge")   # positions rounded


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
