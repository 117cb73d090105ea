"""Resolve a validated config plus raw metadata into one Experiment: the cycles,
their folders, channels, markers, grid and optics every stage works from.

Config wins over metadata; metadata fills what config leaves out; a value that
neither gives is an error naming the config key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from .image.edf import MIN_PLANES
from .io.metadata import clean_marker_name, read_experiment_json, read_marker_file
from .io.raw import (CycleInventory, RawDataError, check_headers, cycle_key, grid_layout,
                     inventory_cycle, select_cycle_dirs)

log = logging.getLogger("plexgpu")

#: emission peaks of the usual CODEX channels (DAPI, AF488/ATTO550/Cy5-class dyes), nm
DEFAULT_EMISSION_NM = {1: 461.0, 2: 520.0, 3: 570.0, 4: 670.0}


@dataclass
class Experiment:
    raw_dir: Path
    results_dir: Path
    region: int
    cycles: list[int]
    inventories: dict[int, CycleInventory]
    channels: list[int]
    markers: dict[tuple[int, int], str]
    rows: int
    cols: int
    overlap: float
    order: str
    z_planes: int
    pixel_size_um: float
    z_step_um: float
    emission_nm: dict[int, float] = field(default_factory=dict)
    tile_shape: tuple[int, ...] | None = None
    dtype: str | None = None

    @property
    def cycle_keys(self) -> list[str]:
        return [cycle_key(c) for c in self.cycles]

    @property
    def n_tiles(self) -> int:
        return self.rows * self.cols

    def marker_names(self, cycle: int) -> list[str]:
        return [self.markers[(cycle, ch)] for ch in self.channels]


def _check_results_outside_raw(raw_dir: Path, results_dir: Path) -> None:
    try:
        raw, res = raw_dir.resolve(), results_dir.resolve()
    except (RuntimeError, OSError) as exc:                # a symlink loop
        raise RawDataError(f"config key raw_dir / results_dir: {exc}") from None
    if res == raw or raw in res.parents:
        raise RawDataError(f"config key results_dir = {results_dir} is inside raw_dir {raw_dir}: results are never "
                           "written into the raw data; choose a folder beside it")


def check_optics(optics: dict) -> None:
    """What no lens can do, before any job: an NA above the immersion's index (the deconvolve job
    would find it only after the stitch job used its GPU)."""
    if optics["na"] >= optics["immersion_index"]:
        raise RawDataError(f"config key optics.na = {optics['na']} must be below optics.immersion_index = "
                           f"{optics['immersion_index']} (NA = n sin(theta) < n)")


def _pick(config_value, meta: dict, key: str, config_key: str, required: bool = True):
    if config_value is not None:
        return config_value
    if key in meta:
        return meta[key]
    if required:
        raise RawDataError(f"config key {config_key} is not set and experiment.json does not give it")
    return None


def _resolve_markers(config: dict, meta: dict, raw_dir: Path, cycles: list[int],
                     channels: list[int]) -> dict[tuple[int, int], str]:
    names = config.get("markers")
    source = "markers"
    if names is not None:
        names = [clean_marker_name(str(n), "config key markers") for n in names]
    if names is None and config.get("markers_file"):
        names, source = read_marker_file(config["markers_file"]), "markers_file"
    if names is None and (raw_dir / "channelNames.txt").is_file():
        names, source = read_marker_file(raw_dir / "channelNames.txt"), f"{raw_dir / 'channelNames.txt'}"
    if names is None and "markers" in meta:
        names, source = meta["markers"], "experiment.json channelNames"
    nch = len(channels)
    if names is None:
        return {(c, ch): f"cyc{c:03d}_CH{ch}" for c in cycles for ch in channels}
    if len(names) == len(cycles) * nch:
        return {(c, ch): names[i * nch + j] for i, c in enumerate(cycles) for j, ch in enumerate(channels)}
    if len(names) >= max(cycles) * nch and len(names) % nch == 0:
        if len(names) > max(cycles) * nch:
            log.warning("%s gives marker names for %d cycles; cycles after %d are not processed (config key cycles)",
                        source, len(names) // nch, max(cycles))
        return {(c, ch): names[(c - 1) * nch + j] for c in cycles for j, ch in enumerate(channels)}
    raise RawDataError(
        f"config key markers: {source} gives {len(names)} marker names, but {len(cycles)} cycles x "
        f"{nch} channels need {len(cycles) * nch} (or {max(cycles) * nch} covering cycles 1..{max(cycles)})")


def resolve_experiment(config: dict, read_headers: bool = False, workers: int = 1) -> Experiment:
    """Discover the raw data a validated config points at and check it is complete.

    ``read_headers`` also reads every TIFF header (one shape and dtype per cycle) and the files the
    config names (a measured PSF, a dark frame). The steps: metadata beside the cycles -> the cycle
    folders -> each cycle's tile inventory -> markers, wavelengths and reference channels -> headers.
    """
    raw_dir = Path(config["raw_dir"])
    check_optics(config["optics"])
    meta = read_experiment_json(raw_dir) if raw_dir.is_dir() else {}
    _check_results_outside_raw(raw_dir, Path(config["results_dir"]))
    dirs = _cycle_folders(config, meta, raw_dir)
    cycles = sorted(dirs)
    grid, optics = config["grid"], config["optics"]
    rows = _pick(grid.get("rows"), meta, "rows", "grid.rows")
    cols = _pick(grid.get("cols"), meta, "cols", "grid.cols")
    if rows * cols < 2:
        raise RawDataError(f"config key grid.rows x grid.cols = {rows}x{cols}: one tile per cycle; the stitch stage "
                           "needs at least 2 tiles (it fits the flatfield over the tiles and places them by their "
                           "overlaps)")
    overlap = _pick(grid.get("overlap"), meta, "overlap", "grid.overlap")
    inventories, channels, z_planes = _inventories(config, meta, dirs, rows * cols)
    exp = Experiment(
        raw_dir=raw_dir, results_dir=Path(config["results_dir"]), region=config["region"], cycles=cycles,
        inventories=inventories, channels=channels, markers=_resolve_markers(config, meta, raw_dir, cycles, channels),
        rows=rows, cols=cols, overlap=float(overlap), order=grid["order"], z_planes=z_planes,
        pixel_size_um=float(_pick(optics.get("pixel_size_um"), meta, "pixel_size_um", "optics.pixel_size_um")),
        z_step_um=float(_pick(optics.get("z_step_um"), meta, "z_step_um", "optics.z_step_um")),
        emission_nm=_emission(optics, channels),
    )
    _check_references(config, channels, cycles)
    if read_headers:
        _read_headers(exp, config, workers)
    return exp


def _cycle_folders(config: dict, meta: dict, raw_dir: Path) -> dict[int, Path]:
    """{cycle: its one folder}: the config's cycles, else experiment.json's numCycles, else all found."""
    cycles_cfg, source = config.get("cycles"), "config key cycles"
    if cycles_cfg is None and "num_cycles" in meta:
        cycles_cfg, source = list(range(1, meta["num_cycles"] + 1)), f"{raw_dir / 'experiment.json'} numCycles"
    return select_cycle_dirs(raw_dir, cycles_cfg, config["region"], source)


def _inventories(config: dict, meta: dict, dirs: dict[int, Path], n_tiles: int):
    """Each cycle's tiles proven complete: (inventories, channels, z-planes); a later cycle must have
    the first one's channels where the config names none."""
    inventories: dict[int, CycleInventory] = {}
    channels = config.get("channels")
    z_planes = _pick(config["grid"].get("z_planes"), meta, "z_planes", "grid.z_planes", required=False)
    known = None                                   # the first cycle's channels, where config names none
    for c in sorted(dirs):
        inv = inventory_cycle(c, dirs[c], config["region"], n_tiles, channels, z_planes, known)
        if known is None and config.get("channels") is None:
            known = list(inv.channels)
        channels, z_planes = list(inv.channels), inv.z_planes
        inventories[c] = inv
    if z_planes < MIN_PLANES:
        raise RawDataError(f"{dirs[min(dirs)]}: {z_planes} z-plane(s) per tile; extended depth of field needs "
                           f"at least {MIN_PLANES} (grid.z_planes / experiment.json)")
    return inventories, channels, z_planes


def _emission(optics: dict, channels: list[int]) -> dict[int, float]:
    emission = dict(DEFAULT_EMISSION_NM)
    emission.update({int(k): float(v) for k, v in optics.get("emission_nm", {}).items()})
    missing = [ch for ch in channels if ch not in emission]
    if missing:
        raise RawDataError(f"config key optics.emission_nm has no wavelength for channel(s) {missing}")
    return {ch: emission[ch] for ch in channels}


def _check_references(config: dict, channels: list[int], cycles: list[int]) -> None:
    """The reference channels and cycle the config names exist in the data."""
    ref = config["stitch"]["reference_channel"]
    if ref not in channels:
        raise RawDataError(f"config key stitch.reference_channel = {ref} is not among channels {channels}")
    reg = config["registration"]
    if reg["reference_channel"] not in channels:
        raise RawDataError(f"config key registration.reference_channel = {reg['reference_channel']} "
                           f"is not among channels {channels}")
    if reg.get("reference_cycle") is not None and reg["reference_cycle"] not in cycles:
        raise RawDataError(f"config key registration.reference_cycle = {reg['reference_cycle']} "
                           f"is not among cycles {cycles}")


def _read_headers(exp: Experiment, config: dict, workers: int) -> None:
    """Every TIFF header (one 2-D shape and dtype per cycle), a measured PSF and a dark frame: readable
    and consistent with the tiles, before any job."""
    shapes = {c: check_headers(exp.inventories[c], exp.region, workers) for c in exp.cycles}
    exp.tile_shape, exp.dtype = shapes[exp.cycles[0]]
    for c, (shape, _dtype) in shapes.items():
        if len(shape) != 2:
            raise RawDataError(f"cycle {c}: tiles must be 2-D (Y, X) images, found shape {shape}")
    decon = config["deconvolution"]
    for ch in exp.channels if decon.get("psf_file") else []:   # a measured PSF: readable, a z-stack, its voxel size
        from .image import psf

        path = psf.file_for(decon, ch)
        if path is None:
            raise RawDataError(f"config key deconvolution.psf_file gives no PSF for channel {ch}")
        try:
            psf.measured(path, tuple(decon["psf_voxel_um"]) if decon.get("psf_voxel_um") else None,
                         exp.z_step_um, exp.pixel_size_um)
        except psf.PSFError as exc:
            raise RawDataError(str(exc)) from None
    from .image.basic import known_offset

    # a dark frame: readable and of the tiles' shape (a number or true/false: nothing to read), per channel
    for ch in exp.channels:
        known_offset(config["basic"]["darkfield"], exp.tile_shape, config["basic"]["working_size"], ch)


@dataclass(frozen=True)
class CycleSpec:
    """What a stage needs to know about its cycle, JSON-able: a job's script gets it as a param and
    needs nothing else of the experiment. (The tile listing behind it, ``resolve_experiment``, runs
    whenever the Snakefile is parsed: in the coordinating run and again in each SLURM job; the TIFF
    headers are read only by ``plexgpu validate``.)"""

    cycle: int
    key: str
    folder: str
    region: int
    rows: int
    cols: int
    order: str
    overlap: float
    z_planes: int
    channels: tuple[int, ...]
    markers: tuple[str, ...]
    pixel_size_um: float
    z_step_um: float
    emission_nm: tuple[float, ...]

    @classmethod
    def from_dict(cls, d: dict) -> "CycleSpec":
        d = dict(d)
        for k in ("channels", "markers", "emission_nm"):
            d[k] = tuple(d[k])
        return cls(**d)

    def as_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        for k in ("channels", "markers", "emission_nm"):
            d[k] = list(d[k])
        return d

    @property
    def layout(self) -> list[tuple[int, int]]:
        return grid_layout(self.rows, self.cols, self.order)

    def tile_paths(self, channel: int, z: int) -> list[Path]:
        from .io.raw import tile_filename

        return [Path(self.folder) / tile_filename(self.region, t, z, channel)
                for t in range(1, self.rows * self.cols + 1)]

    def marker(self, channel: int) -> str:
        return self.markers[self.channels.index(channel)]

    def emission(self, channel: int) -> float:
        return self.emission_nm[self.channels.index(channel)]


def cycle_spec(exp: Experiment, cycle: int) -> CycleSpec:
    return CycleSpec(
        cycle=cycle, key=cycle_key(cycle), folder=str(exp.inventories[cycle].folder), region=exp.region,
        rows=exp.rows, cols=exp.cols, order=exp.order, overlap=exp.overlap, z_planes=exp.z_planes,
        channels=tuple(exp.channels), markers=tuple(exp.marker_names(cycle)),
        pixel_size_um=exp.pixel_size_um, z_step_um=exp.z_step_um,
        emission_nm=tuple(exp.emission_nm[ch] for ch in exp.channels))
