"""Quality control: metrics and pictures per stage, collected into one HTML page.
QC only reads results; it never modifies data and never asks for a GPU."""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

import numpy as np

from .io.tiff import StackReader, atomic_path, read_tiff, write_text_atomic


def to_png(path: str | Path, img: np.ndarray, lo_hi: tuple[float, float] | None = None) -> None:
    """Grayscale (2-D) or RGB (3-D, last axis 3) PNG, contrast-stretched to the 0.5-99.5 % range."""
    from PIL import Image

    a = np.asarray(img, np.float32)
    lo, hi = lo_hi if lo_hi else (float(np.percentile(a, 0.5)), float(np.percentile(a, 99.5)))
    a = np.clip((a - lo) / max(hi - lo, 1e-12), 0, 1)
    with atomic_path(path) as tmp:
        Image.fromarray((a * 255).astype(np.uint8)).save(tmp, format="PNG")


def _thumb(img: np.ndarray, size: int = 256) -> np.ndarray:
    step = max(1, int(np.ceil(max(img.shape[-2:]) / size)))
    return img[..., ::step, ::step]


def _montage(images: list[list[np.ndarray]], pad: int = 2) -> np.ndarray:
    h = max(i.shape[0] for row in images for i in row)
    w = max(i.shape[1] for row in images for i in row)
    cols = max(len(r) for r in images)
    out = np.full((len(images) * (h + pad), cols * (w + pad)), np.nan, np.float32)
    for r, row in enumerate(images):
        for c, img in enumerate(row):
            out[r * (h + pad):r * (h + pad) + img.shape[0], c * (w + pad):c * (w + pad) + img.shape[1]] = img
    return np.nan_to_num(out, nan=float(np.nanmin(out)))


def qc_stitch(cycle: str, profiles: list[str], pairs_csv: str, png: str, out_json: str) -> dict:
    """Flatfield per z-plane (montage: channels x z) and seam scores per pair."""
    rows, flat_stats = [], {}
    for path in profiles:
        prof = read_tiff(path)                         # Z, 2, Y, X
        rows.append([_thumb(prof[z, 0], 96) for z in range(prof.shape[0])])
        name = Path(path).name.split(".")[0]
        flat_stats[name] = {"flat_min": [float(prof[z, 0].min()) for z in range(prof.shape[0])],
                            "flat_max": [float(prof[z, 0].max()) for z in range(prof.shape[0])],
                            "dark_mean": [float(prof[z, 1].mean()) for z in range(prof.shape[0])]}
    to_png(png, _montage(rows), (0.5, 1.5))
    with open(pairs_csv) as fh:
        pairs = [r for r in csv.DictReader(fh) if r.get("tile_a", "").isdigit()]
    ncc = [float(p["ncc"]) for p in pairs if p["accepted"] == "1"]
    metrics = {"cycle": cycle, "pairs": len(pairs), "pairs_accepted": sum(p["accepted"] == "1" for p in pairs),
               "seam_ncc_min": min(ncc) if ncc else None, "seam_ncc_median": float(np.median(ncc)) if ncc else None,
               "pair_table": pairs, "profiles": flat_stats}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


def qc_decon(cycle: str, stitched: list[str], deconvolved: list[str], png: str, out_json: str) -> dict:
    """Flux ratio and sharpness gain per channel; middle plane before/after."""
    rows, per_channel = [], {}
    for s_path, d_path in zip(stitched, deconvolved):
        s, d = StackReader(s_path), StackReader(d_path)          # plane by plane: stacks can exceed memory
        total = lambda r: sum(float(r[k].sum(dtype=np.float64)) for k in range(r.shape[0]))
        z = s.shape[0] // 2
        sz, dz = s[z].astype(np.float32), d[z]
        name = Path(d_path).name.split(".")[0]
        grad = lambda a: float(np.mean(np.abs(np.diff(a, axis=-1))) / max(float(np.mean(a)), 1e-12))
        per_channel[name] = {"flux_ratio": total(d) / max(total(s), 1e-12),
                             "sharpness_gain": grad(dz) / max(grad(sz), 1e-12)}
        lo, hi = float(np.percentile(sz, 0.5)), float(np.percentile(sz, 99.5))
        rows.append([(np.clip((_thumb(sz) - lo) / max(hi - lo, 1e-12), 0, 1)),
                     (np.clip((_thumb(dz) - lo) / max(hi - lo, 1e-12), 0, 1))])
    to_png(png, _montage(rows), (0, 1))
    metrics = {"cycle": cycle, "channels": per_channel}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


def qc_edf(cycle: str, edf_paths: list[str], focus_paths: list[str], png: str, out_json: str) -> dict:
    """EDF image and its focus-index map per channel."""
    rows, per_channel = [], {}
    for e_path, f_path in zip(edf_paths, focus_paths):
        e, f = read_tiff(e_path), read_tiff(f_path)
        name = Path(e_path).name.split(".")[0]
        per_channel[name] = {"focus_index_min": float(f.min()), "focus_index_max": float(f.max()),
                             "focus_index_median": float(np.median(f))}
        lo, hi = float(np.percentile(e, 0.5)), float(np.percentile(e, 99.5))
        fr = max(float(f.max() - f.min()), 1e-6)
        rows.append([np.clip((_thumb(e) - lo) / max(hi - lo, 1e-12), 0, 1), (_thumb(f) - f.min()) / fr])
    to_png(png, _montage(rows), (0, 1))
    metrics = {"cycle": cycle, "channels": per_channel}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


def qc_registration(shifts_csv: str, registered_ref: list[str], png: str, out_json: str) -> dict:
    """Shift per cycle; overlay of the reference channel of the first and last cycle."""
    with open(shifts_csv) as fh:
        shifts = list(csv.DictReader(fh))
    a, b = read_tiff(registered_ref[0]), read_tiff(registered_ref[-1])
    norm = lambda x: np.clip((x - np.percentile(x, 0.5)) / max(np.percentile(x, 99.5) - np.percentile(x, 0.5), 1e-12), 0, 1)
    rgb = np.stack([norm(_thumb(a, 512)), norm(_thumb(b, 512)), np.zeros_like(_thumb(a, 512))], axis=-1)
    to_png(png, rgb, (0, 1))
    metrics = {"shifts": shifts, "overlay": "red = first cycle, green = last cycle (yellow where they agree)"}
    write_text_atomic(out_json, json.dumps(metrics, indent=1))
    return metrics


def _table(rows: list[dict], keys: list[str]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>" for k in keys) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _shift_svg(shifts: list[dict]) -> str:
    w, bar = 420, 18
    vals = [(s["cycle"], float(s["dy_px"]), float(s["dx_px"])) for s in shifts]
    m = max([1.0] + [max(abs(dy), abs(dx)) for _, dy, dx in vals])
    parts = [f'<svg width="{w}" height="{bar * len(vals) + 10}" xmlns="http://www.w3.org/2000/svg">']
    for i, (c, dy, dx) in enumerate(vals):
        y = 5 + i * bar
        mag = (dy ** 2 + dx ** 2) ** 0.5
        parts.append(f'<text x="0" y="{y + 12}" font-size="12">{html.escape(c)}</text>')
        parts.append(f'<rect x="70" y="{y + 2}" width="{300 * mag / (m * 1.5):.1f}" height="12" fill="#4a7"/>')
        parts.append(f'<text x="{75 + 300 * mag / (m * 1.5):.1f}" y="{y + 12}" font-size="11">{mag:.2f} px</text>')
    parts.append("</svg>")
    return "".join(parts)


def write_index(out_html: str, out_json: str, stitch: list[str], decon: list[str], edf_: list[str],
                reg: str) -> None:
    """Collect every stage's metrics into qc/metrics.json and qc/index.html (pictures beside it)."""
    load = lambda p: json.loads(Path(p).read_text())
    data = {"stitch": [load(p) for p in stitch], "deconvolve": [load(p) for p in decon],
            "edf": [load(p) for p in edf_], "registration": load(reg)}
    write_text_atomic(out_json, json.dumps(data, indent=1))
    rel = lambda p: Path(p).with_suffix(".png").relative_to(Path(out_html).parent).as_posix()
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>plexgpu QC</title><style>"
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%;border:1px solid #999}"
             "</style></head><body><h1>plexgpu QC</h1>"]
    parts.append("<h2>Stitching: flatfield per z-plane (rows: channels, columns: z) and seam scores</h2>")
    for p, m in zip(stitch, data["stitch"]):
        parts.append(f"<h3>{m['cycle']}: {m['pairs_accepted']} of {m['pairs']} pairs accepted, "
                     f"seam NCC median {m['seam_ncc_median']}</h3><img src='{rel(p)}'>")
        parts.append(_table(m["pair_table"], ["tile_a", "tile_b", "direction", "dy_px", "dx_px", "significance",
                                              "ncc", "accepted", "reason"]))
    parts.append("<h2>Deconvolution: middle plane before | after</h2>")
    for p, m in zip(decon, data["deconvolve"]):
        rows = [{"channel": k, **v} for k, v in m["channels"].items()]
        parts.append(f"<h3>{m['cycle']}</h3>" + _table(rows, ["channel", "flux_ratio", "sharpness_gain"])
                     + f"<img src='{rel(p)}'>")
    parts.append("<h2>EDF: image | focus-index map</h2>")
    for p, m in zip(edf_, data["edf"]):
        rows = [{"channel": k, **v} for k, v in m["channels"].items()]
        parts.append(f"<h3>{m['cycle']}</h3>" + _table(rows, ["channel", "focus_index_min", "focus_index_median",
                                                              "focus_index_max"]) + f"<img src='{rel(p)}'>")
    r = data["registration"]
    parts.append("<h2>Registration: shift per cycle</h2>" + _shift_svg(r["shifts"])
                 + _table(r["shifts"], ["cycle", "dy_px", "dx_px", "score"])
                 + f"<p>{html.escape(r['overlay'])}</p><img src='{rel(reg)}'>")
    parts.append("</body></html>")
    write_text_atomic(out_html, "\n".join(parts))
