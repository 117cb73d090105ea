"""TIFF and OME-TIFF I/O. Every write goes to a temporary name in the same folder
and is renamed into place, so a killed job never leaves a file that looks finished."""

from __future__ import annotations

import errno
import glob
import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import tifffile

log = logging.getLogger("plexgpu")


class TiffReadError(OSError):
    """A raw TIFF that cannot be read; the message names the file."""


class DiskFullError(OSError):
    """No space (or quota) left for an output; the message names the folder and what was needed."""


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(folder: str | Path, needed: int | None = None) -> str:
    free = shutil.disk_usage(folder).free if Path(folder).exists() else 0
    need = f": needed {needed / 1e6:.0f} MB" if needed else ""
    return f"no space left on {folder}{need}, {free / 1e6:.0f} MB free (disk full or quota)"


def _reserve(path: Path, nbytes: int) -> None:
    """Allocate a file's blocks now: writing through a memory map into blocks a full disk cannot
    give kills the process with SIGBUS and no message; this raises DiskFullError instead."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise DiskFullError(exc.errno, disk_full_message(path.parent, nbytes)) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):   # a file system that cannot: write as before
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


FILE_MODE = 0o666 & ~_umask()      # what open() gives a new file: colleagues on the cluster read results


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success, with the
    permissions the user's umask gives (``mkstemp`` makes 0600 files: a lab member's viewer got
    'Permission denied')."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.part"):
        # left by an earlier attempt at this output that was killed (scancel, OOM): a streamed
        # stack (many GB) or a scratch folder. Only one job writes an output at a time (Snakemake's lock;
        # plexgpu rerun cancels stale jobs first), so none of these is still being written.
        log.info("removing %s left by a killed attempt", stale)
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_tiff_header(path: str | Path) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a single-page TIFF, from its header, after proving the file whole: one
    page, and its pixel data (strip or tile offsets plus byte counts) inside the file's size."""
    try:
        size = os.path.getsize(path)
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            if len(tif.pages) != 1:
                raise TiffReadError(f"{path}: holds {len(tif.pages)} pages; one plane per file is expected")
            end = max((o + c for o, c in zip(page.dataoffsets, page.databytecounts)), default=0)
            if end > size or (page.compression == 1 and sum(page.databytecounts) < page.size * page.dtype.itemsize):
                raise TiffReadError(f"{path}: truncated: its pixel data end at byte {end} but the file has {size}")
            return tuple(page.shape), page.dtype.name
    except TiffReadError:
        raise
    except Exception as exc:  # tifffile raises several types for a broken file
        raise TiffReadError(f"{path}: not a readable TIFF ({exc})") from None


def read_tiff(path: str | Path) -> np.ndarray:
    """Pixels of a TIFF; opened read-only. The error names the file."""
    try:
        with open(path, "rb") as fh:
            return tifffile.imread(fh)
    except Exception as exc:
        raise TiffReadError(f"{path}: cannot read TIFF pixels ({type(exc).__name__}: {exc})") from None


def write_tiff(path: str | Path, data: np.ndarray, **kwargs) -> None:
    """Plain TIFF, atomically."""
    with atomic_path(path) as tmp:
        tifffile.imwrite(tmp, data, **kwargs)


_UUID_PLACEHOLDER = "urn:uuid:00000000-0000-0000-0000-000000000000"   # same length as every UUID


def _ome_uuid(path: str | Path, digest: str) -> str:
    """A UUID fixed by the file's name and the SHA-1 of its pixels: the same result gives the same bytes."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'plexgpu/{Path(path).name}/{digest}')}"


def _set_uuid(tmp: Path, path: str | Path, digest: str) -> None:
    """Replace the placeholder UUID in ``tmp``'s OME-XML (in place: same length) by ``path``'s."""
    with tifffile.TiffFile(tmp) as tif:
        description = tif.pages.first.description
    tifffile.tiffcomment(tmp, description.replace(_UUID_PLACEHOLDER, _ome_uuid(path, digest), 1).encode())


def _resolution(pixel_size_um: float | None) -> dict:
    """TIFF resolution tags matching PhysicalSizeX/Y (pixels per cm), for readers that skip OME-XML."""
    if not pixel_size_um:
        return {}
    per_cm = 1e4 / pixel_size_um
    return {"resolution": (per_cm, per_cm), "resolutionunit": "CENTIMETER"}


def _ome_metadata(axes: str, pixel_size_um: float | None, z_step_um: float | None,
                  channel_names: list[str] | None) -> dict:
    metadata: dict = {"axes": axes, "UUID": _UUID_PLACEHOLDER}
    if pixel_size_um:
        metadata.update(PhysicalSizeX=pixel_size_um, PhysicalSizeXUnit="µm",
                        PhysicalSizeY=pixel_size_um, PhysicalSizeYUnit="µm")
    if z_step_um and "Z" in axes:
        metadata.update(PhysicalSizeZ=z_step_um, PhysicalSizeZUnit="µm")
    if channel_names:
        metadata["Channel"] = {"Name": list(channel_names)}
    return metadata


STRIP_BYTES = 1 << 20


def _rows_per_strip(shape: tuple[int, ...], dtype) -> int:
    """Rows of ~1 MiB strips: still one contiguous block (memory-mapped region by region), but a
    viewer (Bio-Formats/QuPath, napari) reads a strip at a time instead of the whole plane."""
    return max(1, min(shape[-2], STRIP_BYTES // max(1, shape[-1] * np.dtype(dtype).itemsize)))


class OmeStackWriter:
    """An uncompressed OME-TIFF filled region by region (``writer[index] = array``).

    Each write maps the file only for that call, so only the region being written is
    resident: a stack larger than memory can be produced chunk by chunk.
    """

    def __init__(self, path: Path, shape: tuple[int, ...], dtype, offset: int):
        self.path, self.shape, self.dtype, self.offset = path, tuple(shape), np.dtype(dtype), offset

    def __setitem__(self, index, value) -> None:
        mm = np.memmap(self.path, self.dtype, "r+", self.offset, self.shape)
        mm[index] = value
        mm.flush()
        del mm

    def pixels_sha1(self, block: int = 1 << 26) -> str:
        h = hashlib.sha1()
        left = int(np.prod(self.shape)) * self.dtype.itemsize
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            while left:
                buf = fh.read(min(block, left))
                if not buf:
                    raise OSError(f"{self.path}: truncated while hashing")
                h.update(buf)
                left -= len(buf)
        return h.hexdigest()


@contextmanager
def ome_writer(path: str | Path, shape: tuple[int, ...], dtype, axes: str, pixel_size_um: float | None = None,
               z_step_um: float | None = None, channel_names: list[str] | None = None) -> Iterator[OmeStackWriter]:
    """OME-TIFF written region by region at a temporary name; on success its UUID is set from
    the pixels and it is renamed into place (a failed or killed job leaves no file)."""
    with atomic_path(path) as tmp:
        mm = tifffile.memmap(tmp, shape=tuple(shape), dtype=dtype, ome=True, photometric="minisblack",
                             metadata=_ome_metadata(axes, pixel_size_um, z_step_um, channel_names),
                             rowsperstrip=_rows_per_strip(shape, dtype), **_resolution(pixel_size_um))
        offset = mm.offset
        del mm
        _reserve(tmp, os.path.getsize(tmp))
        writer = OmeStackWriter(tmp, shape, dtype, offset)
        yield writer
        _set_uuid(tmp, path, writer.pixels_sha1())


def write_ome(path: str | Path, data: np.ndarray, axes: str, pixel_size_um: float | None = None,
              z_step_um: float | None = None, channel_names: list[str] | None = None) -> None:
    """OME-TIFF with physical sizes, atomically."""
    with ome_writer(path, data.shape, data.dtype, axes, pixel_size_um, z_step_um, channel_names) as out:
        out[...] = data


class StackReader:
    """Lazy read access to a TIFF's first series: ``reader[index]`` returns a copy of just
    that region. Uncompressed contiguous files (everything plexgpu writes) are mapped per
    call, so nothing stays resident; other files are read whole once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with tifffile.TiffFile(self.path) as tif:
                series = tif.series[0]
                self.shape, self.dtype = tuple(series.shape), np.dtype(series.dtype)
                self.offset = series.dataoffset
        except Exception as exc:
            raise TiffReadError(f"{path}: cannot read TIFF ({type(exc).__name__}: {exc})") from None
        self._whole = None if self.offset is not None else read_tiff(self.path)
        self.ndim = len(self.shape)

    def __getitem__(self, index) -> np.ndarray:
        if self._whole is not None:
            return np.array(self._whole[index])
        mm = np.memmap(self.path, self.dtype, "r", self.offset, self.shape)
        try:
            return np.array(mm[index])
        finally:
            del mm


def _halve(plane: np.ndarray) -> np.ndarray:
    """2x2 mean (odd edge dropped), same dtype (float32 arithmetic: a quarter plane of temporaries)."""
    h, w = (plane.shape[0] // 2) * 2, (plane.shape[1] // 2) * 2
    return plane[:h, :w].reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3), dtype=np.float32).astype(plane.dtype)


def _tiles(plane: np.ndarray, tile: tuple[int, int] | None) -> Iterator[np.ndarray]:
    if tile is None:
        yield plane
        return
    for y in range(0, plane.shape[0], tile[0]):
        for x in range(0, plane.shape[1], tile[1]):
            yield plane[y:y + tile[0], x:x + tile[1]].copy()     # a view would keep the whole plane alive


def _as(plane: np.ndarray, dtype, strip_px: int = 1 << 18) -> np.ndarray:
    """A plane in the file's dtype: counts rounded and kept within uint16 (never wrapped). Converted
    in strips of about ``strip_px`` pixels, so the only full-size allocation is the result."""
    dtype = np.dtype(dtype)
    plane = np.asarray(plane)
    if plane.dtype == dtype:
        return plane
    rows = max(1, strip_px // max(1, plane.shape[-1]))
    out = np.empty(plane.shape, dtype)
    for y in range(0, plane.shape[0], rows):
        strip = plane[y:y + rows]
        out[y:y + rows] = np.clip(np.rint(strip), 0, 65535) if dtype == np.uint16 else strip
    return out


def write_pyramidal_ome(path: str | Path, read_plane, n_planes: int, channel_names: list[str],
                        pixel_size_um: float, min_size: int = 128, dtype=None, compression: str | None = "zlib",
                        tile_px: int = 512) -> int:
    """CYX pyramidal OME-TIFF (reduced levels in SubIFDs, 2x2 means), readable by Bio-Formats:
    ``tile_px`` tiles, lossless ``compression`` (zlib = Adobe Deflate, with the horizontal predictor
    for integers; QuPath/Bio-Formats read it), ``dtype`` (default: the planes' own; uint16 rounds
    and saturates).

    ``read_plane(c)`` returns channel ``c`` (YX) and is called once per channel: the full
    resolution is streamed into the file while the reduced levels go to scratch files beside
    it, so memory holds one plane as read and one in the file's dtype, never the whole multiplex
    (tests/test_tiff_io.py measures it). Returns the number of levels.
    """
    first = np.asarray(read_plane(0))
    dtype = np.dtype(dtype or first.dtype)
    first = [_as(first, dtype)]                      # handed to the writer once, then dropped
    shape = first[0].shape
    sizes = [shape]
    while min(sizes[-1]) // 2 >= min_size:
        sizes.append((sizes[-1][0] // 2, sizes[-1][1] // 2))
    tile = (tile_px, tile_px) if min(shape) >= tile_px else (256, 256) if min(shape) >= 256 else None
    opts = dict(dtype=dtype, tile=tile, photometric="minisblack", compression=compression)
    if compression and dtype.kind in "ui":
        opts["predictor"] = 2
    metadata = _ome_metadata("CYX", pixel_size_um, None, channel_names)
    sha1 = hashlib.sha1()
    nbytes = n_planes * shape[0] * shape[1] * dtype.itemsize
    path = Path(path)
    with atomic_path(path) as tmp, tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.",
                                                                suffix=".part") as scratch:  # cleaned like tmp
        lower = [Path(scratch) / f"level{k}.raw" for k in range(1, len(sizes))]

        def full_resolution():
            for c in range(n_planes):
                plane = first.pop() if c == 0 else _as(read_plane(c), dtype)
                if plane.shape != shape:
                    raise ValueError(f"plane {c} has shape {plane.shape}, plane 0 {shape}")
                sha1.update(np.ascontiguousarray(plane).view(np.uint8).ravel())
                cur = plane
                for level in lower:
                    cur = _halve(cur)
                    with open(level, "ab") as fh:
                        fh.write(cur.tobytes())
                yield from _tiles(plane, tile)
                del plane, cur                      # before the next plane is read

        def reduced(level: Path, size: tuple[int, int]):
            count = size[0] * size[1]
            for c in range(n_planes):
                plane = np.fromfile(level, dtype, count=count, offset=c * count * dtype.itemsize).reshape(size)
                yield from _tiles(plane, tile)

        with tifffile.TiffWriter(tmp, ome=True, bigtiff=nbytes * 4 // 3 > 2**31) as tif:
            tif.write(full_resolution(), shape=(n_planes,) + shape, subifds=len(lower), metadata=metadata,
                      **_resolution(pixel_size_um), **opts)
            for k, (level, size) in enumerate(zip(lower, sizes[1:]), start=1):
                tif.write(reduced(level, size), shape=(n_planes,) + size, subfiletype=1,
                          **_resolution(pixel_size_um * 2 ** k if pixel_size_um else None), **opts)
        _set_uuid(tmp, path, sha1.hexdigest())
    return len(sizes)


def write_plane(path: str | Path, plane: np.ndarray, name: str, pixel_size_um: float | None, dtype=None) -> int:
    """One YX image (an EDF, a registered channel, a focus map) as a tiled, deflate-compressed,
    pyramidal OME-TIFF, as the plex file: QuPath and napari browse it without loading it whole."""
    return write_pyramidal_ome(path, lambda c: plane, 1, [name], pixel_size_um, dtype=dtype)
