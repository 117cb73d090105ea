"""Discovery of raw CODEX / PhenoCycler-Keyence cycles, read-only.

Layout (README "Raw data")::

    <raw_dir>/cyc001_reg001[_<date>_<time>]/1_00001_Z001_CH1.tif

Cycle folders may also be spelled ``cyc01_…`` or ``Cyc01_…``. The cycle number
is the whole run of digits after ``cyc``, so ``cyc1`` never matches ``cyc011``.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

CYCLE_DIR_RE = re.compile(r"^[cC]yc(?P<cycle>\d+)(?:_reg(?P<region>\d+))?(?:_.*)?$")
TILE_RE = re.compile(r"^(?P<region>\d+)_(?P<tile>\d{5})_Z(?P<z>\d{3})_CH(?P<channel>\d+)\.tif$")
#: how many missing files an error names before giving the count
SHOW_FIRST = 5


class RawDataError(ValueError):
    """Raw data that does not match the expected layout; the message names the file or key."""


def tile_filename(region: int, tile: int, z: int, channel: int) -> str:
    """File name of one raw tile (tile, z and channel numbered from 1)."""
    return f"{region}_{tile:05d}_Z{z:03d}_CH{channel}.tif"


def cycle_key(cycle: int) -> str:
    """Wildcard value and folder name used for a cycle in results: ``cyc001``."""
    return f"cyc{cycle:03d}"


def find_cycle_dirs(raw_dir: str | Path, region: int = 1) -> dict[int, Path]:
    """Map cycle number -> its folder; two folders for one cycle is an error naming both."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        raise RawDataError(f"raw_dir {raw_dir} is not a folder")
    found: dict[int, list[Path]] = {}
    try:
        entries = sorted(os.scandir(raw_dir), key=lambda e: e.name)
    except OSError as exc:
        raise RawDataError(f"raw_dir {raw_dir} cannot be listed: {exc.strerror}") from None
    for entry in entries:
        m = CYCLE_DIR_RE.match(entry.name)
        if not m:
            continue
        try:
            if not entry.is_dir():
                continue
        except OSError as exc:                         # a symlink loop, a folder this user may not enter
            raise RawDataError(f"{entry.path}: {exc.strerror} (a cycle folder plexgpu cannot open; remove or fix "
                               "it, or move it out of raw_dir)") from None
        if m["region"] is not None and int(m["region"]) != region:
            continue
        found.setdefault(int(m["cycle"]), []).append(Path(entry.path))
    for cycle, dirs in found.items():
        if len(dirs) > 1:
            names = ", ".join(d.name for d in dirs)
            raise RawDataError(f"cycle {cycle} matches {len(dirs)} folders in {raw_dir}: {names}; keep exactly one")
    return {cycle: dirs[0] for cycle, dirs in sorted(found.items())}


def select_cycle_dirs(raw_dir: str | Path, cycles: list[int] | None, region: int = 1,
                      source: str = "config key cycles") -> dict[int, Path]:
    """The folders of the requested cycles (all found ones when ``cycles`` is None); ``source``
    says where the cycle numbers came from, for the error."""
    found = find_cycle_dirs(raw_dir, region)
    if cycles is None:
        if not found:
            raise RawDataError(f"no cycle folders (cyc001_reg{region:03d}...) in raw_dir {raw_dir}")
        return found
    missing = [c for c in cycles if c not in found]
    if missing:
        raise RawDataError(
            f"cycles {missing} listed in {source} have no folder in {raw_dir} "
            f"(found cycles: {sorted(found) or 'none'})")
    return {c: found[c] for c in sorted(cycles)}


#: tile numbering of every grid order, as Fiji's Grid/Collection stitching names it:
#: ``<comb or snake, by rows or columns>-<corner of tile 1>``; ``snake`` and ``rows`` are the
#: top-left-start names kept from before
GRID_KINDS = {"rows": "row-by-row", "snake-rows": "snake by rows", "columns": "column-by-column",
              "snake-columns": "snake by columns"}
GRID_CORNERS = {"top-left": ("Right & Down", "Down & Right"), "top-right": ("Left & Down", "Down & Left"),
                "bottom-left": ("Right & Up", "Up & Right"), "bottom-right": ("Left & Up", "Up & Left")}
GRID_ALIASES = {"snake": "snake-rows-top-left", "rows": "rows-top-left"}
GRID_ORDERS = tuple(GRID_ALIASES) + tuple(f"{k}-{c}" for k in GRID_KINDS for c in GRID_CORNERS)


def fiji_name(order: str) -> str:
    """Fiji Grid/Collection's name of a grid order, e.g. 'snake by rows, Left & Down'."""
    order = GRID_ALIASES.get(order, order)
    kind = next(k for k in sorted(GRID_KINDS, key=len, reverse=True) if order.startswith(k + "-"))
    corner = order[len(kind) + 1:]
    return f"{GRID_KINDS[kind]}, {GRID_CORNERS[corner][kind.endswith('columns')]}"


def grid_layout(rows: int, cols: int, order: str) -> list[tuple[int, int]]:
    """(row, col) of each tile in acquisition order (index 0 = tile 1); row 0 is the top, col 0 the left.

    ``order``: one of GRID_ORDERS. Tiles are numbered along rows (or columns) from the corner
    named; a snake turns back at the end of each row (column), a comb starts the next one at the
    same side."""
    if order not in GRID_ORDERS:
        raise RawDataError(f"config key grid.order must be one of {', '.join(GRID_ORDERS)}; not {order!r}")
    order = GRID_ALIASES.get(order, order)
    by_columns = "columns-" in order
    snake = order.startswith("snake")
    flip_y, flip_x = "-bottom-" in order, order.endswith("-right")
    line_len = rows if by_columns else cols
    layout = []
    for i in range(rows * cols):
        line, pos = divmod(i, line_len)
        if snake and line % 2 == 1:
            pos = line_len - 1 - pos
        row, col = (pos, line) if by_columns else (line, pos)
        layout.append((rows - 1 - row if flip_y else row, cols - 1 - col if flip_x else col))
    return layout


@dataclass(frozen=True)
class CycleInventory:
    """What one cycle folder holds, after checking it is complete."""

    cycle: int
    folder: Path
    n_tiles: int
    z_planes: int
    channels: tuple[int, ...]

    def path(self, region: int, tile: int, z: int, channel: int) -> Path:
        return self.folder / tile_filename(region, tile, z, channel)


def scan_tile_names(folder: Path, region: int) -> dict[tuple[int, int, int], str]:
    """(tile, z, channel) -> file name for every tile file of ``region`` in ``folder``."""
    names = {}
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise RawDataError(f"{folder}: cannot be listed: {exc.strerror}") from None
    for entry in entries:
        m = TILE_RE.match(entry.name)
        if m and int(m["region"]) == region:
            names[(int(m["tile"]), int(m["z"]), int(m["channel"]))] = entry.name
    return names


#: a raw folder's mtime ahead of this clock by more than this is no clock skew between nodes
CLOCK_SKEW_S = 300.0


def inventory_cycle(cycle: int, folder: Path, region: int, n_tiles: int,
                    channels: list[int] | None, z_planes: int | None,
                    known_channels: list[int] | None = None) -> CycleInventory:
    """Check that every (tile, z, channel) file exists, and nothing beyond the grid: no stray
    z-plane, and (``known_channels``: the first cycle's, for the later ones) no channel the first
    cycle does not have."""
    future = folder.stat().st_mtime - time.time()
    if future > CLOCK_SKEW_S:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(folder.stat().st_mtime))
        raise RawDataError(f"{folder}: modified {when}, {future / 3600:.1f} h in the future by this machine's clock: "
                           "Snakemake would find every output older than it and redo every stage on every run; fix "
                           "the clock of the machine that wrote it, or reset the folder's time (touch -m "
                           "<folder>: its files are not changed)")
    names = scan_tile_names(folder, region)
    if not names:
        raise RawDataError(f"no tile files {tile_filename(region, 1, 1, 1)}... in {folder}")
    seen_tiles = {t for t, _, _ in names}
    seen_channels = sorted({c for _, _, c in names})
    chans = list(channels) if channels is not None else seen_channels
    if z_planes is not None:
        nz = z_planes
    else:                    # the z-planes most tiles have: one stray file must not invent a plane
        per_tile = {}
        for t, z, _ in names:
            per_tile[t] = max(per_tile.get(t, 0), z)
        counts: dict[int, int] = {}
        for v in per_tile.values():
            counts[v] = counts.get(v, 0) + 1
        nz = max(counts, key=lambda v: (counts[v], -v))
    extra = sorted(t for t in seen_tiles if t > n_tiles or t < 1)
    if extra:
        raise RawDataError(
            f"{folder}: tile {extra[0]} found ({tile_filename(region, extra[0], 1, chans[0])}) but the grid "
            f"rows x cols holds {n_tiles} tiles ({len(extra)} tile number(s) beyond it); check grid.rows/grid.cols")
    stray = sorted(name for (t, z, c), name in names.items() if z > nz)
    if stray:
        raise RawDataError(f"{folder}: {len(stray)} file(s) beyond the {nz} z-planes the other tiles have, first: "
                           f"{stray[0]}; move them out or set grid.z_planes")
    if known_channels is not None:
        new = sorted(set(seen_channels) - set(known_channels))
        if new:
            raise RawDataError(f"{folder}: channel(s) {', '.join(f'CH{c}' for c in new)} not in the first cycle "
                               f"({', '.join(f'CH{c}' for c in known_channels)}); set config key channels")
    # counted, not listed: a grid far larger than the tiles present (regionWidth 100000) must cost
    # what the files present cost, not rows x cols x z x channels names
    present = sum(1 for (t, z, c) in names if 1 <= t <= n_tiles and 1 <= z <= nz and c in chans)
    expected = n_tiles * nz * len(chans)
    if present < expected:
        import itertools

        first = itertools.islice((tile_filename(region, t, z, c) for t in range(1, n_tiles + 1)
                                  for z in range(1, nz + 1) for c in chans if (t, z, c) not in names), SHOW_FIRST)
        shown = ", ".join(first)
        hint = (f"; the grid rows x cols holds {n_tiles} tiles but {len(seen_tiles)} tile numbers are present: "
                "check grid.rows / grid.cols (or experiment.json regionWidth / regionHeight)"
                if n_tiles > 2 * len(seen_tiles) else "")
        raise RawDataError(f"{folder}: {expected - present} tile file(s) missing, first: {shown}{hint}")
    return CycleInventory(cycle, folder, n_tiles, nz, tuple(chans))


def check_headers(inv: CycleInventory, region: int, workers: int = 1) -> tuple[tuple[int, ...], str]:
    """Read every tile's TIFF header (not its pixels); one shape and dtype per cycle.

    Returns (shape, dtype name). A file that is not a readable TIFF is named in the error.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .tiff import TiffReadError, read_tiff_header

    def header(path):
        try:
            return read_tiff_header(path)
        except TiffReadError as exc:
            return exc

    paths = [inv.path(region, t, z, c) for t in range(1, inv.n_tiles + 1)
             for z in range(1, inv.z_planes + 1) for c in inv.channels]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        headers = list(pool.map(header, paths))
    broken = [h for h in headers if isinstance(h, Exception)]
    if broken:
        more = f" ({len(broken) - 1} more broken in {inv.folder.name})" if len(broken) > 1 else ""
        raise TiffReadError(f"{broken[0]}{more}")
    first_shape, first_dtype = headers[0]
    for path, (shape, dtype) in zip(paths, headers):
        if shape != first_shape or dtype != first_dtype:
            raise RawDataError(f"{path}: shape {shape} {dtype} differs from {paths[0].name} "
                               f"{first_shape} {first_dtype}; one shape and dtype per cycle")
    return first_shape, first_dtype
