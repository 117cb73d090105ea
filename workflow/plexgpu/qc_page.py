"""The QC page (qc/index.html), pictures first: a verdict per cycle and stage at the top, then per
cycle the mosaic with its tile graph, flat- and darkfield with their colour scales, EDF and focus
map, the registration overlay and intensity histograms of every stage; long tables fold away
and link to their CSV files. Plain HTML + inline SVG: it opens from the cluster's file system
in any browser, no server, no scripts."""

from __future__ import annotations

import csv
import html
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from . import paths, qc, qc_state
from .io.tiff import write_text_atomic

COLOURS = {"ok": "#2e7d32", "warn": "#f9a825", "fail": "#c62828", "not run": "#616161", "no QC": "#9e9e9e"}
CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px;color:#222}
h1{margin:0 0 .3em}h2{margin-top:1.6em;border-bottom:2px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;color:#fff;font-weight:600;font-size:12px}
.pics{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}.pics figure{margin:0}
figcaption{font-size:12px;color:#555;max-width:460px}img{border:1px solid #999;max-width:100%}
.bar{height:12px;width:220px;border:1px solid #999;display:inline-block;vertical-align:middle}
.small{font-size:12px;color:#555}details{margin:.4em 0}
"""
VIRIDIS_CSS = "linear-gradient(to right," + ",".join(f"rgb({r:.0f},{g:.0f},{b:.0f})" for r, g, b in qc._VIRIDIS) + ")"


def _badge(status: str) -> str:
    return f"<span class='badge' style='background:{COLOURS[status]}'>{status}</span>"


def _scale(label: str, lo: float, hi: float, fmt: str = ".2f") -> str:
    return (f"<div class='small'>{html.escape(label)}: {lo:{fmt}} <span class='bar' style='background:{VIRIDIS_CSS}'>"
            f"</span> {hi:{fmt}}</div>")


def _ncc_legend() -> str:
    stops = ",".join("rgb({},{},{})".format(*qc.ncc_colour(v)) for v in (0.5, 0.75, 1.0))
    return (f"<div class='small'>pair NCC: 0.5 <span class='bar' style='background:linear-gradient(to right,{stops})'>"
            "</span> 1.0; dashed magenta: pair rejected (reason in pairs.csv); numbers: tiles in acquisition "
            "order</div>")


def _table(rows: list[dict], keys: list[str]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(k, '')))}</td>" for k in keys) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _histogram_svg(series: dict[str, dict], width: int = 460, panel: int = 70) -> str:
    """Log-count histograms on the shared log-intensity bins, one panel per stage, one above the other
    on the same intensity axis (overlaid curves of similar images hide each other); every label inside
    the picture."""
    colours = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a"]
    edges = np.log10(qc.HIST_EDGES)
    left, right, top, bottom = 44, 16, 8, 34
    shown = [(name, h) for name, h in series.items() if h]
    height = top + panel * len(shown) + bottom
    def x(v):
        return left + (v - edges[0]) / (edges[-1] - edges[0]) * (width - left - right)
    peak = max([max(np.log10(np.asarray(h["counts"]) + 1)) for _, h in shown] + [1.0])
    parts = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg' font-size='11' "
             "font-family='sans-serif'>"]
    mids = (edges[:-1] + edges[1:]) / 2
    for i, (name, h) in enumerate(shown):
        y0, y1 = top + i * panel, top + (i + 1) * panel - 6          # the panel's top and its baseline
        def y(c):
            return y1 - np.log10(c + 1) / peak * (y1 - y0 - 4)
        pts = " ".join(f"{x(m):.1f},{y(c):.1f}" for m, c in zip(mids, h["counts"]))
        colour = colours[i % 4]
        parts.append(f"<line x1='{left}' y1='{y1}' x2='{width - right}' y2='{y1}' stroke='#bbb'/>")
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.5' points='{pts}'/>")
        parts.append(f"<text x='{width - right}' y='{y0 + 12}' text-anchor='end' fill='{colour}'>"
                     f"{html.escape(name)} ({h['below_first_edge']:.0%} below {qc.HIST_EDGES[0]:.0f})</text>")
    base = top + panel * len(shown) - 6
    for k in range(int(edges[0]), int(edges[-1]) + 1):
        parts.append(f"<line x1='{x(k):.1f}' y1='{base}' x2='{x(k):.1f}' y2='{base + 4}' stroke='#888'/>"
                     f"<text x='{x(k):.1f}' y='{base + 16}' text-anchor='middle'>1e{k}</text>")
    parts.append(f"<text x='{(left + width - right) / 2:.0f}' y='{height - 3}' text-anchor='middle'>intensity "
                 "(counts, log)</text>")
    parts.append(f"<text transform='translate(12,{top + panel * len(shown) / 2:.0f}) rotate(-90)' "
                 "text-anchor='middle'>count (log)</text></svg>")
    return "".join(parts)


def write_index(out_html: str, out_json: str, inputs, cycles: list[str], channels) -> None:
    """Collect every stage's metrics into qc/metrics.json and qc/index.html (pictures beside it).

    ``inputs``: the qc rule's snakemake.input, one entry per stage of the registry (paths.PIPELINE)
    that has QC metrics, named after it: the per-cycle JSON files of the cycles whose stage is done, for
    a stage over all cycles its one file (or none). The verdict table has a cell for every cycle and
    stage of the registry: a stage not done says fail (its job's error line) or not run, with its log
    (``qc_state``); a stage without QC metrics says so. ``out_html`` is results_dir/paths.QC_INDEX."""
    results_dir = Path(out_html).parents[len(Path(paths.QC_INDEX).parts) - 1]
    def load(p):
        return json.loads(Path(p).read_text())
    stages = [s.name for s in paths.PIPELINE]
    states = qc_state.stage_states(results_dir, cycles, channels)
    qc_of = {s.name: {m["cycle"]: m for m in map(load, inputs[s.name])}
             for s in paths.PIPELINE if s.per_cycle and s.name in inputs.keys()}
    reg_m = load(inputs["registration"][0]) if "registration" in inputs.keys() and inputs["registration"] else None
    camera_rows, camera_reasons = qc.camera_across_cycles({c: m.get("offsets", {})
                                                           for c, m in qc_of.get("stitch", {}).items()})
    data = {**{s: list(by_cycle.values()) for s, by_cycle in qc_of.items()}, "registration": reg_m,
            "camera": {"offsets": camera_rows, "warnings": camera_reasons},
            "stage_states": {f"{st}/{c}": asdict(v) for (st, c), v in states.items()}}
    write_text_atomic(out_json, json.dumps(data, indent=1))
    here = Path(out_html).parent
    def rel(p):
        return Path(p).relative_to(here).as_posix()
    no_qc = {"status": "no QC", "reasons": ["no QC rule for this stage"]}

    def cell(c, s):
        if states[s, c].status != "done":
            return states[s, c].verdict()
        if s == "registration":
            if reg_m is None:
                return no_qc
            reasons = [r for r in reg_m["reasons"] if r.startswith(c + ":")]
            return {"status": "warn" if reasons else "ok", "reasons": reasons}
        return qc_of[s][c] if c in qc_of.get(s, {}) else no_qc

    def with_camera(c, s, v):
        if s != "stitch" or c not in camera_reasons or states[s, c].status != "done":
            return v
        return qc.with_camera(v, camera_reasons[c])
    verdict = {c: {s: with_camera(c, s, cell(c, s)) for s in stages} for c in cycles}
    counts = {s: sum(v[st]["status"] == s for v in verdict.values() for st in stages) for s in COLOURS}
    counts = {s: n for s, n in counts.items() if n or s in ("ok", "warn", "fail")}

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>plexgpu QC</title><style>{CSS}</style>"
             "</head><body><h1>plexgpu QC</h1>",
             f"<p>{len(cycles)} cycles &times; {len(stages)} stages: "
             + ", ".join(f"{_badge(s)} {n}" for s, n in counts.items()) + ". Metrics: <a href='metrics.json'>"
             "metrics.json</a>.</p>"]
    # -- summary: cycle x stage
    parts.append("<table><tr><th>cycle</th>" + "".join(f"<th>{s}</th>" for s in stages) + "</tr>")
    for c in cycles:
        cells = "".join(f"<td>{_badge(verdict[c][s]['status'])}<div class='small'>"
                        + "<br>".join(html.escape(r) for r in verdict[c][s]["reasons"]) + "</div></td>"
                        for s in stages)
        parts.append(f"<tr><th><a href='#{c}'>{c}</a></th>{cells}</tr>")
    parts.append("</table>")
    # -- the camera across cycles
    if camera_rows:
        parts.append("<h2>Camera offset across cycles</h2><p class='small'>One camera, one offset: each cycle's "
                     "fitted offset per channel (counts, standard error) and the camera's, the weighted mean of the "
                     "cycles that agree (a cycle that contradicts them is set aside and warned of). Registration "
                     "brings every cycle of plex.ome.tif to the camera's value (basic.shared_camera; "
                     "registered/camera.json).</p>"
                     + _table(camera_rows, ["channel"] + [c for c in cycles if any(c in r for r in camera_rows)]
                              + ["the camera"]))
    # -- registration across cycles
    if reg_m is not None:
        parts.append(f"<h2>Registration (reference {html.escape(reg_m['reference_cycle'])})</h2>"
                     f"<p class='small'>{html.escape(reg_m['overlay'])}</p>"
                     + _table(reg_m["shifts"], ["cycle", "dy_px", "dx_px", "rotation_deg", "score",
                                                "ncc_to_reference", "sharpness_to_reference", "residual_worst_px",
                                                "residual_median_px", "blocks_rigid_only"]))
    # -- per cycle
    for c in cycles:
        st, de, ed = (qc_of.get(s, {}).get(c) for s in ("stitch", "deconvolve", "edf"))
        parts.append(f"<h2 id='{c}'>{c}</h2>")
        missing = [f"{s}: {verdict[c][s]['status']}: " + "; ".join(verdict[c][s]["reasons"])
                   for s in stages if states[s, c].status != "done"]
        if missing:
            parts.append("<p class='small'>" + "<br>".join(html.escape(m) for m in missing) + "</p>")
        parts.append("<div class='pics'>")
        if st:
            parts.append(f"<figure><img src='stitch/{c}.png' width='460'><figcaption>"
                         f"Mosaic (middle plane) and tile graph: {st['pairs_accepted']} of {st['pairs']} pairs "
                         f"matched, seam NCC median {_fmt(st['seam_ncc_median'])}, min {_fmt(st['seam_ncc_min'])}. "
                         f"{_defects_line(st.get('defective_pixels', {}), c)}"
                         f"{_ncc_legend()}</figcaption></figure>")
            parts.append(f"<figure><img src='stitch/{c}.shading.png' width='460'><figcaption>"
                         "Flatfield (upper rows: one per channel) and darkfield (lower rows: the camera offset and "
                         "any light added on the sensor, such as stray light, both subtracted) per z-plane (columns)."
                         + _scale("flatfield", *st["flat_colour_range"])
                         + _scale("darkfield (counts)", *st["dark_colour_range"], ".0f")
                         + _offsets_line(st.get("offsets", {})) + "</figcaption></figure>")
        if ed:
            parts.append(f"<figure><img src='edf/{c}.png' width='460'><figcaption>"
                         "Per channel: EDF | focus map (plane of best focus)."
                         f"{_scale('focus plane', 1, max(v['planes'] for v in ed['channels'].values()), '.0f')}"
                         "</figcaption></figure>")
        if reg_m is not None:
            parts.append(f"<figure><img src='registration/{c}.png' width='460'><figcaption>Reference channel "
                         f"after registration on the reference cycle: {html.escape(reg_m['overlay'])}. Right: the "
                         "local residual block by block after registration (viridis 0-0.75 px, brighter is worse; "
                         "grey: not measurable).</figcaption></figure>")
        if de:
            parts.append(f"<figure><img src='deconvolve/{c}.png' width='460'><figcaption>"
                         "Middle plane before | after deconvolution (one contrast per channel).</figcaption></figure>")
        series = {k: m.get("histogram") for k, m in (("stitched", st), ("deconvolved", de), ("EDF", ed)) if m}
        if series:
            parts.append("<figure>" + _histogram_svg(series)
                         + "<figcaption>Intensity histograms of the first channel (log intensity, log count): "
                           "stitched middle plane, deconvolved middle plane, EDF.</figcaption></figure>")
        parts.append("</div>")
        pairs_csv = Path(results_dir) / paths.output_pattern("stitch", "pairs").format(cycle=c)
        rows = _read_pairs(pairs_csv)
        if rows:
            parts.append(f"<details><summary>pairs ({len(rows)}; <a href='{_up(here, pairs_csv)}'>pairs.csv</a>)"
                         "</summary>" + _table(rows, ["tile_a", "tile_b", "direction", "dy_px", "dx_px",
                                                     "significance", "ncc", "accepted", "reason"]) + "</details>")
        tables = []
        if de:
            tables.append(_table([{"channel": k, **v} for k, v in de["channels"].items()],
                                 ["channel", "fit_ratio", "flux_ratio", "sharpness_gain"]))
        if ed:
            tables.append(_table([{"channel": k, **v} for k, v in ed["channels"].items()],
                                 ["channel", "planes", "planes_kept", "tiles_left_out", "focus_at_stack_end",
                                  "focus_index_median", "structure_snr"]))
        if st:
            tables.append(_table([{"channel": k, "flat min..max": "{:.3f}..{:.3f}".format(*v["flat_range"]),
                                   "dark min..max": "{:.1f}..{:.1f}".format(*v["dark_range"]),
                                   "added light (mean counts)": "{:.1f}".format(v.get("added_light", 0))}
                                  for k, v in st["shading"].items()],
                                 ["channel", "flat min..max", "dark min..max", "added light (mean counts)"]))
        if tables:
            parts.append("<details><summary>per channel</summary>" + "".join(tables) + "</details>")
    parts.append("</body></html>")
    write_text_atomic(out_html, "\n".join(parts))


def _offsets_line(offsets: dict) -> str:
    """The camera offset of each channel, one for all its planes, with its standard error and what each
    plane alone would have given (diagnostics)."""
    if not offsets:
        return ""
    parts = [f"CH{ch} {o['counts']:.0f} &plusmn; {o['standard_error']:.1f}"
             + (" <b>uncertain</b>" if o["uncertain"] else "")
             + f" (each plane alone: {' '.join(f'{v:.0f}' for v in o['per_plane'])})"
             for ch, o in sorted(offsets.items())]
    return "<div class='small'>Camera offset, one per channel for all its planes (counts): " + "; ".join(parts) + "</div>"


def _defects_line(counts: dict, cycle: str) -> str:
    n = sum(counts.values())
    if not n:
        return "No defective sensor pixels found."
    kinds = ", ".join(f"{k} {v}" for k, v in counts.items() if v)
    return (f"{n} defective sensor pixels ({html.escape(kinds)}) replaced by their neighbours' median in every tile: "
            f"<a href='../basic/{cycle}/defects.csv'>defects.csv</a>.")


def _read_pairs(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path) as fh:
        return [r for r in csv.DictReader(fh) if r.get("tile_a", "").isdigit()]


def _up(here: Path, target: Path) -> str:
    """A relative link from qc/ to a file elsewhere under results/."""
    try:
        return "../" + target.relative_to(here.parent).as_posix()
    except ValueError:
        return target.as_posix()
