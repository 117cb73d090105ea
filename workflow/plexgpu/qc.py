"""Quality control per stage: pictures, metrics and a verdict (ok / warn / fail with the reason).

QC only reads results; it never modifies data and never asks for a GPU. Each function writes
its pictures and one JSON of metrics; ``qc_page.write_index`` puts them on one page. The
verdict rules say what a scientist would look for, each with the physical reason:

- stitch: seams that match (NCC of accepted pairs), how many pairs matched, a plausible
  flatfield (vignetting within 0.5..1.5 of the mean), an offset that could be fitted, and no
  pixels saturated by the correction;
- deconvolve: the flux kept (RL conserves it; a ratio far from 1 is a PSF or boundary problem);
- edf: planes left out by the quality gate, and focus found at the stack's end (the specimen may
  reach beyond the z range);
- registration: each cycle's reference channel, once moved, resembles the reference cycle's.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from . import camera
from .image import edf, texture
from .image.shading import MIN_UNCERTAINTY, UNCERTAIN_OF_FLOOR
from .io.tiff import StackReader, atomic_path, read_tiff, write_text_atomic
from .planes import PlanesRecord

THUMB_PX = 900                    # longest side of a mosaic picture
# intensities 10 .. 100000 on a log axis, the same bins for every stage; from 10 up, every bin is at
# least one count wide, so integer data (stitched, uint16) shows no comb of empty bins
HIST_EDGES = np.logspace(1, 5, 49)

# verdict thresholds (each one's reason is in the module docstring)
MIN_SEAM_NCC = 0.5
MIN_ACCEPTED_FRACTION = 0.5
FLAT_RANGE = (0.5, 1.5)
FLUX_WARN, FLUX_FAIL = 0.05, 0.2
FOCUS_AT_END_FRACTION = 0.25
MIN_REGISTERED_NCC = 0.5
MAX_BLOCK_RESIDUAL_PX = 0.75       # a block further off than this after registration: warn (cells ~25 px)
EMPTY_CONTRAST = 3.0               # a strip's structure over its neighbour's, beyond vignetting (<= 3x light:
                                   # <= 1.7x structure under shot noise) and its scatter: not the same patch
MIN_SHARPNESS_TO_REFERENCE = 0.7   # a cycle's reference channel with less detail than this of the reference
                                   # cycle's, on the same tissue: defocused (or a z range that misses it)


# ----------------------------------------------------------------------------- pictures
def _stretch(a: np.ndarray, lo_hi: tuple[float, float] | None = None) -> np.ndarray:
    """0..1, contrast-stretched to the 0.5-99.5 % range (or ``lo_hi``); NaN stays NaN."""
    a = np.asarray(a, np.float32)
    finite = a[np.isfinite(a)]
    lo, hi = lo_hi if lo_hi else ((float(np.percentile(finite, 0.5)), float(np.percentile(finite, 99.5)))
                                  if finite.size else (0.0, 1.0))
    return np.clip((a - lo) / max(hi - lo, 1e-12), 0, 1)


# viridis at 6 stops: perceptually even, readable by colour-blind viewers
_VIRIDIS = np.array([[68, 1, 84], [65, 68, 135], [42, 120, 142], [34, 168, 132], [122, 209, 81], [253, 231, 37]],
                    np.float32)


def colormap(a01: np.ndarray) -> np.ndarray:
    """0..1 -> RGB uint8 (viridis); NaN -> mid grey."""
    x = np.nan_to_num(a01, nan=-1.0) * (len(_VIRIDIS) - 1)
    i = np.clip(np.floor(x), 0, len(_VIRIDIS) - 2).astype(int)
    t = np.clip(x - i, 0, 1)[..., None]
    rgb = _VIRIDIS[i] * (1 - t) + _VIRIDIS[i + 1] * t
    rgb[np.asarray(a01 != a01)] = 128
    return rgb.astype(np.uint8)


def _gray_rgb(a01: np.ndarray) -> np.ndarray:
    g = (np.nan_to_num(a01, nan=0.0) * 255).astype(np.uint8)
    return np.stack([g, g, g], axis=-1)


def _save_png(path: str | Path, rgb: np.ndarray) -> None:
    from PIL import Image

    with atomic_path(path) as tmp:
        Image.fromarray(rgb).save(tmp, format="PNG")


def _thumb(img, size: int = 256) -> np.ndarray:
    step = max(1, int(np.ceil(max(img.shape[-2:]) / size)))
    return np.asarray(img[..., ::step, ::step])


def _row(images: list[np.ndarray], pad: int = 4) -> np.ndarray:
    """RGB images side by side on white."""
    h = max(i.shape[0] for i in images)
    out = np.full((h, sum(i.shape[1] for i in images) + pad * (len(images) - 1), 3), 255, np.uint8)
    x = 0
    for img in images:
        out[:img.shape[0], x:x + img.shape[1]] = img
        x += img.shape[1] + pad
    return out


def _grid(rows: list[list[np.ndarray]], pad: int = 4) -> np.ndarray:
    lines = [_row(r, pad) for r in rows]
    w = max(r.shape[1] for r in lines)
    out = np.full((sum(r.shape[0] for r in lines) + pad * (len(lines) - 1), w, 3), 255, np.uint8)
    y = 0
    for r in lines:
        out[y:y + r.shape[0], :r.shape[1]] = r
        y += r.shape[0] + pad
    return out


def ncc_colour(ncc: float) -> tuple[int, int, int]:
    """Seam NCC -> red (<= 0.5) .. yellow (0.75) .. green (1.0)."""
    t = float(np.clip((ncc - 0.5) / 0.5, 0, 1))
    return (int(230 * min(1, 2 - 2 * t)), int(200 * min(1, 2 * t)), 40)


def histogram(img: np.ndarray) -> dict:
    """Counts on HIST_EDGES (the fraction below its first edge apart): comparable across stages."""
    a = np.asarray(img, np.float32).ravel()
    counts, _ = np.histogram(a, HIST_EDGES)
    return {"below_first_edge": float((a < HIST_EDGES[0]).mean()), "counts": counts.tolist()}


def _verdict(problems: list[tuple[str, str]]) -> dict:
    """[(level, reason)] -> {"status": worst level, "reasons": [...]}."""
    order = {"ok": 0, "warn": 1, "fail": 2}
    status = max([lvl for lvl, _ in problems], key=order.get, default="ok")
    return {"status": status, "reasons": [r for _, r in problems]}


# ----------------------------------------------------------------------------- stitch
def _pairs(pairs_csv: str) -> list[dict]:
    with open(pairs_csv) as fh:
        return [r for r in csv.DictReader(fh) if r.get("tile_a", "").isdigit()]


def _stage_window(pairs_csv: str) -> float:
    """The stage model's window (px) pairs.csv records, 0 where it records none."""
    with open(pairs_csv) as fh:
        for row in csv.reader(fh):
            if row and row[0].startswith("# stage model: spread"):
                return float(row[2])
    return 0.0


def _tiles(numbers: list[int]) -> str:
    return f"tile {numbers[0]}" if len(numbers) == 1 else "tiles " + ", ".join(map(str, numbers))


def _texture(p: dict, tile: int) -> tuple[float, float]:
    """(structure of ``tile``'s strip, of its neighbour's) in pair ``p`` (pairs.csv)."""
    a, b = float(p.get("texture_a") or 0), float(p.get("texture_b") or 0)
    return (a, b) if int(p["tile_a"]) == tile else (b, a)


def _displaced(ps: list[dict], tile: int, window: float) -> float | None:
    """At least two of the tile's pairs match clearly outside the stage model's window, and they agree
    on where the tile is (within the window the neighbours themselves may be off by): a displaced tile,
    not chance matches, which land anywhere."""
    shifts = []
    for p in ps:
        if p.get("off_model_dy_px"):
            d = np.array([float(p["off_model_dy_px"]), float(p["off_model_dx_px"])])
            shifts.append(d if int(p["tile_b"]) == tile else -d)
    if len(shifts) < 2:
        return None
    centre = np.median(shifts, axis=0)
    agree = np.all(np.abs(np.array(shifts) - centre).max(axis=1) <= max(window, 1.0))
    return float(np.hypot(*centre)) if agree else None


def tile_problems(pairs: list[dict], window: float = 0.0) -> list[tuple[str, str]]:
    """The tiles none of whose pairs was accepted, each judged on the evidence pairs.csv holds (every
    pair's match and the structure above noise of its two strips, which image the same patch of slide),
    one line per kind naming the tiles; each was placed by the stage model alone:

    - two or more neighbours match it, all at one offset beyond the model's ``window`` (px) from
      where the stage put it: warn (a stage error: the tile sits off by that much in the mosaic);
    - a neighbour shows clear texture (EMPTY_CONTRAST x the texture bound: more than vignetting or
      noise can explain) where this tile shows none: fail (a blank frame, or a tile of another field
      or of bare slide);
    - texture on both sides that matches at no offset: fail (a tile of another field or specimen);
    - no texture on either side of any overlap: warn (bare slide or out of focus: nothing to align
      on, expected at the edge of a section)."""
    by_tile: dict[int, list[dict]] = {}
    for p in pairs:
        for t in (int(p["tile_a"]), int(p["tile_b"])):
            by_tile.setdefault(t, []).append(p)
    kinds: dict[str, list] = {"off": [], "empty": [], "foreign": [], "bare": []}
    for t, ps in sorted(by_tile.items()):
        if any(p["accepted"] == "1" for p in ps):
            continue
        own_other = [_texture(p, t) for p in ps]
        off = _displaced(ps, t, window)
        if off is not None:
            kinds["off"].append((t, off))
        elif any(own < texture.MIN_TEXTURE_SNR <= other / EMPTY_CONTRAST for own, other in own_other):
            kinds["empty"].append(t)
        elif any(min(own, other) >= texture.MIN_TEXTURE_SNR for own, other in own_other):
            kinds["foreign"].append(t)
        else:
            kinds["bare"].append(t)
    out = []
    if kinds["empty"]:
        out.append(("fail", f"{_tiles(kinds['empty'])}: no texture where a neighbour shows tissue in the same overlap "
                            "(a blank frame: shutter, lamp, a dropped frame; or a tile of another field); placed by "
                            "the stage model"))
    if kinds["foreign"]:
        out.append(("fail", f"{_tiles(kinds['foreign'])}: tissue that matches none of its neighbours at any offset "
                            "(a tile of another field or specimen?); placed by the stage model"))
    for t, off in kinds["off"]:
        out.append(("warn", f"tile {t}: its neighbours match it {off:.0f} px from where the stage put it, beyond the "
                            f"stage model's window ({window:.1f} px): a stage error, so it sits off by that much "
                            "(stitch.max_shift_px widens the window); placed by the stage model"))
    if kinds["bare"]:
        out.append(("warn", f"{_tiles(kinds['bare'])}: no texture in any overlap (bare slide or out of focus); "
                            "placed by the stage model"))
    return out


REJECTED_COLOUR = (255, 0, 255)   # magenta: apart from the NCC scale and from grey tissue, dark or bright


def _dashed(draw, a, b, fill, width, dash: float = 6.0) -> None:
    (ax, ay), (bx, by) = a, b
    n = max(1, int(np.hypot(bx - ax, by - ay) // dash))
    for k in range(0, n, 2):
        t0, t1 = k / n, min(1.0, (k + 1) / n)
        draw.line([(ax + t0 * (bx - ax), ay + t0 * (by - ay)), (ax + t1 * (bx - ax), ay + t1 * (by - ay))],
                  fill=fill, width=width)


def tile_graph_picture(mosaic_plane, footprints: list, pairs: list[dict]) -> np.ndarray:
    """The mosaic (grey) with a line between the centres of every pair: coloured by NCC where
    accepted, dashed magenta where rejected; each tile's number at its centre, white on a dark box."""
    from PIL import Image, ImageDraw, ImageFont

    step = max(1, int(np.ceil(max(mosaic_plane.shape) / THUMB_PX)))
    img = Image.fromarray(_gray_rgb(_stretch(np.asarray(mosaic_plane[::step, ::step]))))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=max(12, max(img.size) // 40))   # ~11 px where the page shows it 460 wide
    centre = [((x + w / 2) / step, (y + h / 2) / step) for y, x, h, w in footprints]
    for p in pairs:
        a, b = centre[int(p["tile_a"]) - 1], centre[int(p["tile_b"]) - 1]
        if p["accepted"] == "1":
            draw.line([a, b], fill=ncc_colour(float(p["ncc"])), width=3)
        else:
            _dashed(draw, a, b, REJECTED_COLOUR, 3)
    for t, (cx, cy) in enumerate(centre, start=1):
        label = str(t)
        x0, y0, x1, y1 = draw.textbbox((cx, cy), label, font=font, anchor="mm")
        draw.rectangle([x0 - 2, y0 - 1, x1 + 2, y1 + 1], fill=(0, 0, 0))
        draw.text((cx, cy), label, fill=(255, 255, 255), font=font, anchor="mm")
    return np.asarray(img)


def uncertain_offset(channel: str, offset: dict) -> str:
    """The warn for a channel's camera offset the stitch job flagged uncertain (its planes.json record), with why:
    the light every tile carries where a tenth of that floor is what it was held to, else the spread of its
    estimate over the field's regions and the planes (a floor of a few counts is no reason)."""
    why = ("every tile carries light" if offset["light_floor"] * UNCERTAIN_OF_FLOOR > MIN_UNCERTAINTY
           else "its estimate differs between regions of the field and between planes")
    return (f"CH{channel}: camera offset uncertain, {offset['counts']:.0f} +- {offset['standard_error']:.0f} counts "
            f"against a dimmest light floor of {offset['light_floor']:.0f} ({why}): give basic.darkfield: "
            f"{{{channel}: <counts>}} or a dark frame")


def unrefined_planes(shading: dict) -> str | None:
    """The fallback a plane gets when too few overlap samples are left to refine its flatfield (pairs
    rejected, tissue on too few overlaps): BaSiC's statistics alone, which take the specimen's own
    structure for shading (7-10 % on dense nuclei, 15-48 % on sparse or large-offset fields, where
    the refined flatfield errs 0.3-2 %). None where every plane was refined."""
    alone = sorted((k for k, v in shading.items() if not v.get("refined", True)),
                   key=lambda k: tuple(int(v) for v in k.split("/")))
    if not alone:
        return None
    names = ", ".join(f"CH{c} Z{int(z):03d}" for c, z in (k.split("/") for k in alone[:6]))
    more = f" and {len(alone) - 6} more" if len(alone) > 6 else ""
    return (f"flatfield from BaSiC alone on {len(alone)} of {len(shading)} planes ({names}{more}): too few "
            "matched overlaps to refine it; BaSiC alone can take the specimen for shading (several %)")


def qc_stitch(cycle: str, profiles: list[str], pairs_csv: str, planes_json: str, stitched: str,
              png: str, shading_png: str, out_json: str) -> dict:
    """Mosaic with its tile graph; flat- and darkfield per channel and z (colour-mapped, ranges in
    the metrics); seam scores and the verdict."""
    planes = PlanesRecord.read(planes_json)
    pairs = _pairs(pairs_csv)
    stack = StackReader(stitched)
    mid = stack.shape[0] // 2
    plane = stack[mid]
    _save_png(png, tile_graph_picture(plane, planes.footprints, pairs))
    flats, darks, shading = [], [], {}
    for path in profiles:
        prof = read_tiff(path)                                   # Z, 2 (flat, dark), Y, X
        name = Path(path).name.split(".")[0]
        ch = name.removeprefix("CH")
        light = [v.get("added_light", 0.0) for k, v in planes.shading.items() if k.split("/")[0] == ch]
        shading[name] = {"flat_range": [float(prof[:, 0].min()), float(prof[:, 0].max())],
                         "dark_range": [float(prof[:, 1].min()), float(prof[:, 1].max())],
                         "added_light": max(light, default=0.0)}   # mean counts, its largest plane
        flats.append(prof[:, 0])
        darks.append(prof[:, 1])
    flat_lo = min(v["flat_range"][0] for v in shading.values())
    flat_hi = max(v["flat_range"][1] for v in shading.values())
    dark_lo = min(v["dark_range"][0] for v in shading.values())
    dark_hi = max(v["dark_range"][1] for v in shading.values())
    rows = [[colormap(_stretch(_thumb(f[z], 96), (flat_lo, flat_hi))) for z in range(f.shape[0])] for f in flats]
    rows += [[colormap(_stretch(_thumb(d[z], 96), (dark_lo, dark_hi + 1e-6))) for z in range(d.shape[0])]
             for d in darks]
    _save_png(shading_png, _grid(rows))

    accepted = [p for p in pairs if p["accepted"] == "1"]
    ncc = [float(p["ncc"]) for p in accepted]
    problems = tile_problems(pairs, _stage_window(pairs_csv))
    if pairs and len(accepted) < MIN_ACCEPTED_FRACTION * len(pairs):
        problems.append(("warn", f"{len(accepted)} of {len(pairs)} pairs matched: the other tiles are placed by "
                                 "the stage model (expected on bare slide, not in tissue)"))
    if ncc and min(ncc) < MIN_SEAM_NCC:
        worst = min(accepted, key=lambda p: float(p["ncc"]))
        problems.append(("warn", f"seam {worst['tile_a']}-{worst['tile_b']} matches with NCC {float(worst['ncc']):.2f}"))
    if flat_lo < FLAT_RANGE[0] or flat_hi > FLAT_RANGE[1]:
        problems.append(("warn", f"flatfield {flat_lo:.2f}..{flat_hi:.2f} of its mean: strong vignetting or a fit "
                                 "gone wrong (look at the shading picture)"))
    problems += [("warn", uncertain_offset(ch, o)) for ch, o in sorted(planes.offsets.items()) if o["uncertain"]]
    if problem := unrefined_planes(planes.shading):
        problems.append(("warn", problem))
    saturated = {k: v for k, v in planes.saturated_after_correction.items() if v}
    if saturated:
        problems.append(("warn", f"pixels saturated by the correction in channel(s) {', '.join(saturated)}"))
    metrics = {"cycle": cycle, "pairs": len(pairs), "pairs_accepted": len(accepted),
               "defective_pixels": planes.defective_pixels, "offsets": planes.offsets,
               "planes_unrefined": sorted(k for k, v in planes.shading.items() if not v.get("refined", True)),
               "seam_ncc_min": min(ncc) if ncc else None, "seam_ncc_median": float(np.median(ncc)) if ncc else None,
               "flat_colour_range": [flat_lo, flat_hi], "dark_colour_range": [dark_lo, dark_hi],
               "shading": shading, "histogram": histogram(plane), "histogram_of": f"{Path(stitched).name} z{mid + 1}",
               **_verdict(problems)}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


def camera_across_cycles(offsets: dict[str, dict]) -> tuple[list[dict], dict[str, list[str]]]:
    """One camera offset per channel for every cycle: the cycles' fitted offsets compared (``camera``).

    ``offsets``: {cycle: {channel: the stitch's offset record (counts, standard_error, light_floor, ..)}}.
    A cycle set aside (its offset contradicts the other cycles') is a warn naming the value the other cycles
    give together: registration brings plex.ome.tif to it, the cycle's stitched and EDF stacks keep their
    own. So is a cycle that agrees within its error but whose own offset, which its stacks keep, lies
    noticeably (``camera.noticeable``) from the camera's that plex.ome.tif is brought to: a Blank cycle
    (autofluorescence only, dense) fitted 97 +- 7 counts against the camera's 112 +- 1.5, its stacks 15-21
    counts too bright per plane with its stitch QC ok (bench/plex_bias.py). Returns the rows (channel, cycles'
    offsets, the camera's) and {cycle: [reasons]}."""
    rows, reasons = [], {}
    for ch, cam in camera.across_cycles(offsets).items():
        for c, reads in cam.stacks_apart.items():       # its own offset too low: its stacks read too bright
            own, se = cam.own[c]
            reasons.setdefault(c, []).append(
                f"CH{ch}: camera offset {own:.0f} ± {se:.0f} counts, within its error of the camera's "
                f"{cam.counts:.0f} ± {cam.standard_error:.0f} ({len(cam.cycles)} cycles) that plex.ome.tif "
                f"is brought to; this cycle's stitched and EDF stacks keep their own: a dim marker reads "
                f"{reads:+.0f} counts there against plex.ome.tif. Give basic.darkfield: "
                f"{{{ch}: {cam.counts:.0f}}} or a dark frame for the same values in both")
        rows.append({"channel": ch, **{c: f"{x:.1f} ± {se:.1f}" for c, (x, se) in cam.own.items()},
                     "the camera": ("no two cycles agree" if cam.counts is None else
                                    f"{cam.counts:.1f} ± {cam.standard_error:.1f} ({len(cam.cycles)} cycles)")})
        for c, d in cam.set_aside.items():
            reads = d.others - d.counts                  # an offset too high takes light away
            reasons.setdefault(c, []).append(
                f"CH{ch}: camera offset {d.counts:.0f} ± {d.standard_error:.0f} counts, the other cycles' "
                f"{d.others:.0f}: one camera, one offset; a dim marker reads {reads:+.0f} counts here"
                + (" (plex.ome.tif is brought to the other cycles' value; this cycle's stitched and EDF stacks "
                   "keep their own)" if cam.counts is not None else "")
                + f". Give basic.darkfield: {{{ch}: {d.others:.0f}}} (the other cycles together) or a dark frame")
    return rows, reasons


def with_camera(verdict: dict, camera_reasons: list[str]) -> dict:
    """A cycle's stitch verdict ({status, reasons, ..}) with the warns ``camera_across_cycles`` gives that cycle:
    warn, unless it already fails; the QC page's stitch cell."""
    if not camera_reasons:
        return verdict
    return {**verdict, "status": "fail" if verdict["status"] == "fail" else "warn",
            "reasons": verdict["reasons"] + camera_reasons}


# ----------------------------------------------------------------------------- deconvolve
def _total(r: StackReader) -> float:
    return sum(float(r[k].sum(dtype=np.float64)) for k in range(r.shape[0]))


def _gradient(a: np.ndarray) -> float:
    return float(np.mean(np.abs(np.diff(a, axis=-1))) / max(float(np.mean(a)), 1e-12))


def qc_decon(cycle: str, stitched: list[str], deconvolved: list[str], flux_json: str, png: str, out_json: str) -> dict:
    """Per channel RL's fit (the result blurred again against the recorded light: 1 is what RL
    guarantees; far from it, a PSF or boundary problem), the flux of the recorded planes before and
    after (they differ by the light that left or entered through the stack's ends) and the sharpness
    gain; the middle plane before | after, same contrast."""
    fit = json.loads(Path(flux_json).read_text())
    rows, per_channel, problems, hist = [], {}, [], None
    for s_path, d_path in zip(stitched, deconvolved):
        s, d = StackReader(s_path), StackReader(d_path)          # plane by plane: stacks can exceed memory
        z = s.shape[0] // 2
        sz, dz = s[z].astype(np.float32), d[z]
        name = Path(d_path).name.split(".")[0]
        ratio = fit[name[2:]]["explained_ratio"]
        per_channel[name] = {"fit_ratio": ratio, "flux_ratio": _total(d) / max(_total(s), 1e-12),
                             "sharpness_gain": _gradient(dz) / max(_gradient(sz), 1e-12)}
        if abs(ratio - 1) > FLUX_FAIL:
            problems.append(("fail", f"{name}: the deconvolved stack blurred again holds {ratio:.3f} of the recorded "
                                     "light (RL fits it to 1: PSF or boundary problem)"))
        elif abs(ratio - 1) > FLUX_WARN:
            problems.append(("warn", f"{name}: the deconvolved stack blurred again holds {ratio:.3f} of the "
                                     "recorded light"))
        lo, hi = float(np.percentile(sz, 0.5)), float(np.percentile(sz, 99.5))
        rows.append([_gray_rgb(_stretch(_thumb(sz), (lo, hi))), _gray_rgb(_stretch(_thumb(dz), (lo, hi)))])
        if hist is None:
            hist = histogram(dz)
    _save_png(png, _grid(rows))
    metrics = {"cycle": cycle, "channels": per_channel, "histogram": hist, **_verdict(problems)}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


# ----------------------------------------------------------------------------- edf
def qc_edf(cycle: str, edf_paths: list[str], focus_paths: list[str], planes_json: str, png: str,
           out_json: str) -> dict:
    """Per channel the EDF and its focus map (viridis over the stack's planes); planes the quality
    gate left out (the same gate the EDF job applied) and focus found at the stack's end."""
    record = PlanesRecord.read(planes_json)
    rows, per_channel, problems, hist = [], {}, [], None
    for e_path, f_path in zip(edf_paths, focus_paths):
        e, f = read_tiff(e_path), read_tiff(f_path)
        name = Path(e_path).name.split(".")[0]
        ch = name[2:]
        stats = record.tile_stats(ch)
        nz = len(stats)
        kept, bad = edf.quality_gate(stats)
        at_end = float(((f <= 0.5) | (f >= nz - 1.5)).mean()) if nz > 2 else 0.0
        structure = texture.measure(e).snr
        per_channel[name] = {"planes": nz, "planes_kept": len(kept), "tiles_left_out": sum(len(b) for b in bad),
                             "focus_at_stack_end": at_end, "focus_index_median": float(np.median(f)),
                             "structure_snr": structure}
        if structure < texture.MIN_TEXTURE_SNR:
            problems.append(("warn", f"{name}: no structure above the noise ({structure:.1f} noise sigmas): a bleached "
                                     "or absent marker, or an empty channel"))
        if len(kept) < nz:
            problems.append(("warn", f"{name}: {nz - len(kept)} of {nz} planes left out (dropped frames or saturation)"))
        if any(bad):
            problems.append(("warn", f"{name}: {sum(len(b) for b in bad)} tile-planes left out where they lie"))
        if at_end > FOCUS_AT_END_FRACTION:
            problems.append(("warn", f"{name}: in focus at the stack's first or last plane over {at_end:.0%} of the "
                                     "image: the specimen may reach beyond the z range"))
        rows.append([_gray_rgb(_stretch(_thumb(e))), colormap(_stretch(_thumb(f), (0, max(nz - 1, 1))))])
        if hist is None:
            hist = histogram(e)
    _save_png(png, _grid(rows))
    metrics = {"cycle": cycle, "channels": per_channel, "histogram": hist, **_verdict(problems)}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


# ----------------------------------------------------------------------------- registration
def _ncc(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / den if den > 0 else 0.0


def sharpness(img: np.ndarray) -> float:
    """Detail at the scale of cells: mean gradient magnitude of the image smoothed by one pixel (pixel
    noise left out), over its mean intensity (so exposure and stain strength do not count)."""
    from scipy import ndimage

    a = ndimage.gaussian_filter(np.asarray(img, np.float32), 1.0)
    gy, gx = np.gradient(a)
    return float(np.mean(np.hypot(gy, gx)) / max(float(np.mean(a)), 1e-12))


def residual_picture(residual: list[list], height: int) -> np.ndarray:
    """The local residual after registration on its block grid, viridis over 0..MAX_BLOCK_RESIDUAL_PX
    (brighter: worse), grey where a block could not be measured, scaled to ``height`` rows."""
    r = np.array([[np.nan if v is None else v for v in row] for row in residual], float) if residual else \
        np.full((1, 1), np.nan)
    k = max(1, height // max(r.shape[0], 1))
    rgb = colormap(np.clip(r / MAX_BLOCK_RESIDUAL_PX, 0, 1))
    return np.repeat(np.repeat(rgb, k, axis=0), k, axis=1)


def qc_registration(shifts_csv: str, transforms_json: str, registered_ref: list[str], cycles: list[str],
                    overlays: list[str], out_json: str) -> dict:
    """Per cycle: the two-colour overlay of its reference channel (green) on the reference cycle's
    (magenta; white where they agree) after registration, their NCC, and beside it the map of the local
    residual block by block; the verdict follows the worst block, not the whole image."""
    with open(shifts_csv) as fh:
        shifts = list(csv.DictReader(fh))
    transforms = json.loads(Path(transforms_json).read_text())
    ref_cycle = next(s["cycle"] for s in shifts if s["score"] == "reference")
    images = dict(zip(cycles, registered_ref))
    ref_full = read_tiff(images[ref_cycle])
    ref, ref_sharpness = _thumb(ref_full, THUMB_PX), sharpness(ref_full)
    del ref_full
    ref01 = _stretch(ref)
    problems, per_cycle = [], {}
    for cycle, png in zip(cycles, overlays):
        full = read_tiff(images[cycle])
        img = _thumb(full, THUMB_PX)
        per_cycle[cycle] = {"ncc_to_reference": _ncc(img, ref),
                            "sharpness_to_reference": sharpness(full) / max(ref_sharpness, 1e-12)}
        del full
        sharp = per_cycle[cycle]["sharpness_to_reference"]
        if sharp < MIN_SHARPNESS_TO_REFERENCE and cycle != ref_cycle:
            problems.append(("warn", f"{cycle}: its reference channel holds {sharp:.0%} "
                                     "of the reference cycle's detail on the same tissue: defocused, or a z range "
                                     "that misses the section"))
        if per_cycle[cycle]["ncc_to_reference"] < MIN_REGISTERED_NCC and cycle != ref_cycle:
            problems.append(("warn", f"{cycle}: reference channel resembles the reference cycle with NCC "
                                     f"{per_cycle[cycle]['ncc_to_reference']:.2f} after registration"))
        t = transforms.get(cycle, {})
        res = [v for row in t.get("residual_px", []) for v in row if v is not None]
        per_cycle[cycle].update(residual_worst_px=max(res) if res else None,
                                residual_median_px=float(np.median(res)) if res else None,
                                blocks_rigid_only=int(np.sum(t.get("rigid_only", []))))
        if res and max(res) > MAX_BLOCK_RESIDUAL_PX and cycle != ref_cycle:
            problems.append(("warn", f"{cycle}: after registration a block is still {max(res):.2f} px off (median "
                                     f"{np.median(res):.2f} px over {len(res)} blocks; map beside the overlay)"))
        if per_cycle[cycle]["blocks_rigid_only"] and cycle != ref_cycle:
            problems.append(("warn", f"{cycle}: {per_cycle[cycle]['blocks_rigid_only']} blocks with no measurable "
                                     "local shift near them (blank or bleached): rigid model only there (grey on "
                                     "the map)"))
        g = _stretch(img)
        rgb = (np.nan_to_num(np.stack([ref01, g, ref01], axis=-1)) * 255).astype(np.uint8)
        _save_png(png, _row([rgb, residual_picture(t.get("residual_px", []), rgb.shape[0])]))
    for s in shifts:
        s.update(per_cycle.get(s["cycle"], {}))
    metrics = {"shifts": shifts, "reference_cycle": ref_cycle,
               "overlay": "magenta = reference cycle, green = this cycle, white where they agree",
               **_verdict(problems)}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics
