"""Shared by the benchmarks: timing, peak memory, result files (bench/results/*.json + README.md)."""

from __future__ import annotations

import json
import platform
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE.parent / "workflow"))


POLLEN = HERE.parents[1] / "shared" / "realdata" / "pollen"


def pollen():
    """The real pollen stack of ../shared/realdata (sdeconv's: a 3-D specimen blurred by a 1-voxel Gaussian
    PSF, plus noise): (truth, blurred noisy stack, the PSF's 9^3 around its peak, sum 1), float32; None when
    the folder is not there."""
    if not POLLEN.is_dir():
        return None
    import numpy as np

    from plexgpu.io.tiff import read_tiff

    truth, data, full = (read_tiff(POLLEN / f).astype(np.float32)
                         for f in ("pollen_truth.tif", "pollen_blurred_noisy.tif", "pollen_psf.tif"))
    c = np.unravel_index(int(np.argmax(full)), full.shape)
    kernel = full[tuple(slice(i - 4, i + 5) for i in c)]
    return truth, data, kernel / kernel.sum()


WSI_BRAIN = HERE.parents[1] / "shared" / "realdata" / "wsi_brain"


def wsi_brain_fiji() -> dict[int, tuple[float, float]]:
    """Fiji's registered positions of the real wsi_brain tiles, {tile number: (y, x)} px (tiles 1-54; its
    tile 45 is about 52 px off)."""
    import re

    pos = {}
    for line in (WSI_BRAIN / "TileConfiguration.registered.txt").read_text().splitlines():
        m = re.match(r"C3-BrainSection(\d+)\.tif; ; \(([-\d.e]+), ([-\d.e]+)\)", line)
        if m:
            pos[int(m[1])] = (float(m[3]), float(m[2]))
    return pos


def overlap_means(tiles, pairs, flat, dark):
    """The two corrected readings of each overlap: per overlap (mean a, mean b) in counts, each reading
    (raw - dark) / flat (flat of mean 1) smoothed by 3 px (whole-pixel positions such as Fiji's), 4 px trimmed at
    the overlap's rim. ``pairs``: (a, b, dy, dx) of tile b from tile a, 0-based indices into ``tiles`` (N, H, W)."""
    import numpy as np
    from scipy import ndimage

    flat = flat / flat.mean()
    h, w = tiles.shape[1:]
    out = []
    for a, b, dy, dx in pairs:
        sa = slice(max(dy, 0), h + min(dy, 0)), slice(max(dx, 0), w + min(dx, 0))
        sb = slice(max(-dy, 0), h + min(-dy, 0)), slice(max(-dx, 0), w + min(-dx, 0))
        out.append([ndimage.gaussian_filter((tiles[t][s] - dark[s]) / flat[s], 3)[4:-4, 4:-4].mean()
                    for t, s in ((a, sa), (b, sb))])
    return np.array(out, np.float64).reshape(-1, 2)


def overlap_log_ratios(tiles, pairs, flat, dark):
    """How far apart the two corrected readings of the same specimen are where tiles overlap (no truth needed;
    a wrong additive term or flatfield shows as a ratio that is not 1): per overlap |log(mean a / mean b)|
    (``overlap_means``). Shared by bench/basic_alone.py and tests/test_realdata_stitch.py.

    Between darkfields it favours the lower: one lower by c F (F the flatfield it is used with) leaves c in
    every corrected pixel, and a pedestal pulls every ratio toward 1 (on wsi_brain, ours less 150 F: 5.2 -> 4.9 %,
    basicpy's plus 150 F: 4.0 -> 4.5 %). ``overlap_differences`` does not."""
    import numpy as np

    m = np.maximum(overlap_means(tiles, pairs, flat, dark), 1e-3)      # <= 0: wholly wrong
    return np.abs(np.log(m[:, 0] / m[:, 1]))


def overlap_differences(tiles, pairs, flat, dark):
    """Per overlap |mean a - mean b| (``overlap_means``), in counts of light at flatfield 1: what a cell on the
    seam reads differently in the two tiles. A darkfield that differs by c F leaves the same c in both readings,
    so this, unlike the log ratio, does not favour the lower of two darkfields."""
    import numpy as np

    m = overlap_means(tiles, pairs, flat, dark)
    return np.abs(m[:, 0] - m[:, 1])


@contextmanager
def timer(out: dict, key: str):
    t0 = time.perf_counter()
    yield
    out[key] = time.perf_counter() - t0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_result(name: str, rows: list[dict], notes: str = "") -> Path:
    """rows: {"what", "ours_s", "peer", "peer_s", "ratio", "ours_accuracy", "peer_accuracy", "peak_rss_mb"}"""
    RESULTS.mkdir(exist_ok=True)
    data = {"benchmark": name, "machine": f"{platform.node()} {platform.machine()} python {platform.python_version()}",
            "when": time.strftime("%Y-%m-%d %H:%M"), "rows": rows, "notes": notes}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    print(json.dumps(data, indent=1))
    return path


def markdown_table() -> str:
    lines = ["| benchmark (run) | what | ours (s) | peer | peer (s) | ratio peer/ours | ours accuracy | peer accuracy | "
             "peak RSS (MB) |", "|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(RESULTS.glob("*.json")):
        d = json.loads(p.read_text())
        for r in (r for r in d.get("rows", []) if "what" in r):     # (other layouts: their own JSON)
            def f(k):
                return ("–" if r.get(k) is None else (f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])))
            lines.append(f"| {d['benchmark']} ({d.get('when', '?')}) | {r['what']} | {f('ours_s')} | {f('peer')} | "
                         f"{f('peer_s')} | {f('ratio')} | {f('ours_accuracy')} | {f('peer_accuracy')} | "
                         f"{f('peak_rss_mb')} |")
    return "\n".join(lines) + "\n"
