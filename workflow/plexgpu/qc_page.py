"""The QC page (qc/index.html), pictures first: a verdict per cycle and stage at the top, then per
cycle the mosaic with its tile graph, flat- and darkfield with their colour scales, EDF and focus
map, the registration overlay and intensity histograms of every stage; long tables fold away
and link to their CSV files. Plain HTML + inline SVG: it opens from the cluster's file system
in any browser, no server, no scripts."""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

import numpy as np

from . import paths, qc
from .io.tiff import write_text_atomic

COLOURS = {"ok": "#2e7d32", "warn": "#f9a825", "fail": "#c62828", "no QC": "#757575"}
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
            "</span> 1.0; thin dark red: pair rejected (placed by the stage model)</div>")


def _table(rows: list[dict], keys: list[str]) -> str:
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(k, '')))}</td>" for k in keys) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _histogram_svg(series: dict[str, dict], width: int = 460, height: int = 170) -> str:
    """Log-count histograms on the shared log-intensity bins, one polyline per stage."""
    colours = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a"]
    edges = np.log10(qc.HIST_EDGES)
    def x(v):
        return 40 + (v - edges[0]) / (edges[-1] - edges[0]) * (width - 50)
    peak = max([max(np.log10(np.asarray(h["counts"]) + 1)) for h in series.values() if h] + [1.0])
    def y(c):
        return height - 25 - np.log10(c + 1) / peak * (height - 40)
    parts = [f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg' font-size='11'>",
             f"<line x1='40' y1='{height - 25}' x2='{width - 10}' y2='{height - 25}' stroke='#888'/>"]
    for k in range(int(edges[0]), int(edges[-1]) + 1):
        parts.append(f"<text x='{x(k) - 8:.0f}' y='{height - 10}'>1e{k}</text>")
    legend = []
    for i, (name, h) in enumerate(series.items()):
        if not h:
            continue
        mids = (edges[:-1] + edges[1:]) / 2
        pts = " ".join(f"{x(m):.1f},{y(c):.1f}" for m, c in zip(mids, h["counts"]))
        parts.append(f"<polyline fill='none' stroke='{colours[i % 4]}' stroke-width='1.5' points='{pts}'/>")
        legend.append(f"<span style='color:{colours[i % 4]}'>&#9632; {html.escape(name)}</span> "
                      f"({h['below_first_edge']:.0%} below {qc.HIST_EDGES[0]:.0f})")
    parts.append("<text x='2' y='12'>log count</text></svg>")
    return "".join(parts) + "<div class='small'>" + ", ".join(legend) + "</div>"


def write_index(out_html: str, out_json: str, inputs) -> None:
    """Collect every stage's metrics into qc/metrics.json and qc/index.html (pictures beside it).

    ``inputs``: the qc rule's snakemake.input, one entry per stage of the registry (paths.PIPELINE)
    that has QC metrics, named after it: a list of per-cycle JSON files for a per-cycle stage, one
    file for a stage over all cycles. The verdict table has a column for every stage of the
    registry; a stage without QC metrics says so."""
    def load(p):
        return json.loads(Path(p).read_text())
    stages = [s.name for s in paths.PIPELINE]
    data = {s.name: ([load(p) for p in inputs[s.name]] if s.per_cycle else load(inputs[s.name]))
            for s in paths.PIPELINE if s.name in inputs.keys()}
    stitch, decon, edf_ = list(inputs["stitch"]), list(inputs["deconvolve"]), list(inputs["edf"])
    write_text_atomic(out_json, json.dumps(data, indent=1))
    here = Path(out_html).parent
    def rel(p):
        return Path(p).relative_to(here).as_posix()
    cycles = [m["cycle"] for m in data["stitch"]]
    reg_m = data["registration"]
    reg_reasons = {c: [r for r in reg_m["reasons"] if r.startswith(c + ":")] for c in cycles}
    no_qc = {"status": "no QC", "reasons": ["no QC rule for this stage"]}
    verdict = {c: {s: data[s][i] if isinstance(data.get(s), list) else no_qc for s in stages} for i, c in enumerate(cycles)}
    for c in cycles:
        verdict[c]["registration"] = {"status": "warn" if reg_reasons[c] else "ok", "reasons": reg_reasons[c]}
    counts = {s: sum(v[st]["status"] == s for v in verdict.values() for st in stages) for s in COLOURS}
    counts = {s: n for s, n in counts.items() if n or s != "no QC"}

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
    # -- registration across cycles
    parts.append(f"<h2>Registration (reference {html.escape(reg_m['reference_cycle'])})</h2>"
                 f"<p class='small'>{html.escape(reg_m['overlay'])}</p>"
                 + _table(reg_m["shifts"], ["cycle", "dy_px", "dx_px", "rotation_deg", "score", "ncc_to_reference",
                                            "residual_worst_px", "residual_median_px", "blocks_rigid_only"]))
    # -- per cycle
    for i, c in enumerate(cycles):
        st, de, ed = data["stitch"][i], data["deconvolve"][i], data["edf"][i]
        p_stitch = Path(stitch[i])
        parts.append(f"<h2 id='{c}'>{c}</h2><div class='pics'>")
        parts.append(f"<figure><img src='{rel(p_stitch.with_suffix('.png'))}' width='460'><figcaption>"
                     f"Mosaic (middle plane) and tile graph: {st['pairs_accepted']} of {st['pairs']} pairs matched, "
                     f"seam NCC median {_fmt(st['seam_ncc_median'])}, min {_fmt(st['seam_ncc_min'])}. "
                     f"{_defects_line(st.get('defective_pixels', {}), c)}"
                     f"{_ncc_legend()}</figcaption></figure>")
        parts.append(f"<figure><img src='{rel(p_stitch.with_suffix('.shading.png'))}' width='460'><figcaption>"
                     "Flatfield (upper rows: one per channel) and darkfield (lower rows) per z-plane (columns)."
                     + _scale("flatfield", *st["flat_colour_range"])
                     + _scale("darkfield (counts)", *st["dark_colour_range"], ".0f")
                     + _offsets_line(st.get("offsets", {})) + "</figcaption></figure>")
        parts.append(f"<figure><img src='{rel(Path(edf_[i]).with_suffix('.png'))}' width='460'><figcaption>"
                     "Per channel: EDF | focus map (plane of best focus)."
                     f"{_scale('focus plane', 1, max(v['planes'] for v in ed['channels'].values()), '.0f')}"
                     "</figcaption></figure>")
        parts.append(f"<figure><img src='registration/{c}.png' width='460'><figcaption>Reference channel after "
                     f"registration on the reference cycle: {html.escape(reg_m['overlay'])}. Right: the local residual "
                     "block by block after registration (viridis 0-0.75 px, brighter is worse; grey: not measurable)."
                     "</figcaption></figure>")
        parts.append(f"<figure><img src='{rel(Path(decon[i]).with_suffix('.png'))}' width='460'><figcaption>"
                     "Middle plane before | after deconvolution (one contrast per channel).</figcaption></figure>")
        parts.append("<figure>" + _histogram_svg({"stitched": st.get("histogram"), "deconvolved": de.get("histogram"),
                                                  "EDF": ed.get("histogram")})
                     + "<figcaption>Intensity histograms of the first channel (log intensity, log count): "
                       "stitched middle plane, deconvolved middle plane, EDF.</figcaption></figure></div>")
        pairs_csv = Path(stitch[i]).parents[2] / "stitched" / c / "pairs.csv"
        rows = _read_pairs(pairs_csv)
        parts.append(f"<details><summary>pairs ({len(rows)}; <a href='{_up(here, pairs_csv)}'>pairs.csv</a>)"
                     "</summary>" + _table(rows, ["tile_a", "tile_b", "direction", "dy_px", "dx_px", "significance",
                                                 "ncc", "accepted", "reason"]) + "</details>")
        parts.append("<details><summary>per channel</summary>"
                     + _table([{"channel": k, **v} for k, v in de["channels"].items()],
                              ["channel", "fit_ratio", "flux_ratio", "sharpness_gain"])
                     + _table([{"channel": k, **v} for k, v in ed["channels"].items()],
                              ["channel", "planes", "planes_kept", "tiles_left_out", "focus_at_stack_end",
                               "focus_index_median"])
                     + _table([{"channel": k, "flat min..max": "{:.3f}..{:.3f}".format(*v["flat_range"]),
                                "dark min..max": "{:.1f}..{:.1f}".format(*v["dark_range"])}
                               for k, v in st["shading"].items()], ["channel", "flat min..max", "dark min..max"])
                     + "</details>")
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
