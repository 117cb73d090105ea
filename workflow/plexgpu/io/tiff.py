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
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import tifffile

log = logging.getLogger("plexgpu")


class TiffReadError(OSError):
    """A raw TIFF that cannot be read; the message names the file."""


#: what a damaged file plexgpu wrote needs: its stage rerun (plexgpu status does not count it done)
REWRITE = "; delete it and rerun the stage that wrote it (plexgpu rerun)"


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
    tmp = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        yield tmp
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno in DISK_FULL and not isinstance(exc, DiskFullError):
            # name the output's folder: a write() that finds the disk full names no file
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            raise DiskFullError(exc.errno, f"{path.name}: {disk_full_message(path.parent)}") from None
        raise
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def non_finite(path: str | Path, pixels: np.ndarray) -> str | None:
    """Where a floating-point tile holds NaN or infinite pixels (no camera records them, and one spreads
    through every fit it enters), one line naming the file; None where it holds none."""
    if pixels.dtype.kind != "f":
        return None
    bad = ~np.isfinite(pixels)
    if not bad.any():
        return None
    y, x = (int(v) for v in np.argwhere(bad)[0][-2:])
    return (f"{path}: {int(bad.sum())} NaN or infinite pixel(s), the first at y {y}, x {x}: not a camera's "
            "image; export the tiles again")


def read_tiff_header(path: str | Path) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a single-page TIFF, from its header, after proving the file whole: one
    page, and its pixel data (strip or tile offsets plus byte counts) inside the file's size. A
    compressed or floating-point tile's pixels are decoded too: a corrupt stream, NaN or infinity
    cannot be told from a header."""
    try:
        size = os.path.getsize(path)
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            if len(tif.pages) != 1:
                raise TiffReadError(f"{path}: holds {len(tif.pages)} pages; one plane per file is expected")
            end = max((o + c for o, c in zip(page.dataoffsets, page.databytecounts)), default=0)
            if end > size or (page.compression == 1 and sum(page.databytecounts) < page.size * page.dtype.itemsize):
                raise TiffReadError(f"{path}: truncated: its pixel data end at byte {end} but the file has {size}")
            if page.compression != 1 or page.dtype.kind == "f":
                # a compressed tile proves whole only by decoding it (a corrupt stream fits in its byte
                # counts); a float one may hold NaN. Raw tiles are mostly uncompressed integers: headers only
                try:
                    pixels = page.asarray()
                except Exception as exc:
                    raise TiffReadError(f"{path}: its compressed pixel data cannot be decoded "
                                        f"({type(exc).__name__}: {exc})") from None
                if problem := non_finite(path, pixels):
                    raise TiffReadError(problem)
            return tuple(page.shape), page.dtype.name
    except TiffReadError:
        raise
    except Exception as exc:  # tifffile raises several types for a broken file
        raise TiffReadError(f"{path}: not a readable TIFF ({exc})") from None


def damaged(path: str | Path) -> str | None:
    """Why an output TIFF cannot be whole (it does not parse, or its pixel data end past the file's
    end: a copy or a disk that cut it short), from its headers only; None for a whole file or one that
    is not a TIFF. What ``plexgpu status`` and QC check before counting a stage done."""
    path = Path(path)
    if path.suffix not in (".tif", ".tiff") or not path.is_file():
        return None
    try:
        size = path.stat().st_size
        with tifffile.TiffFile(path) as tif:
            end = max((int(o) + int(c) for page in tif.pages for o, c in zip(page.dataoffsets, page.databytecounts)),
                      default=0)
    except Exception as exc:  # tifffile raises several types for a broken file
        return f"{path}: not a readable TIFF ({type(exc).__name__}: {exc})"
    return f"{path}: truncated: its pixel data end at byte {end} but the file has {size}" if end > size else None


def first_damaged(paths) -> str | None:
    """``damaged``'s reason for the first damaged file of ``paths``, None where every one is whole."""
    return next((reason for reason in map(damaged, paths) if reason), None)


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


TILE_PX = 512                  # tiles of every image plexgpu writes: viewers read a tile, never a whole plane
COMPRESSION = "zlib"           # Adobe Deflate (8): read by Bio-Formats/QuPath, napari, libtiff, ASHLAR's peers
COMPRESSION_LEVEL = 1          # level 1: 4x faster than 6 and as small with the predictor (bench: 0.538 vs 0.545)


class OmeStackWriter:
    """A stack filled region by region (``writer[index] = array``), in a raw scratch file.

    Each write maps the file only for that call, so only the region being written is
    resident: a stack larger than memory can be produced chunk by chunk, in any order.
    """

    def __init__(self, path: Path, shape: tuple[int, ...], dtype):
        self.path, self.shape, self.dtype = path, tuple(shape), np.dtype(dtype)

    def __setitem__(self, index, value) -> None:
        mm = np.memmap(self.path, self.dtype, "r+", 0, self.shape)
        mm[index] = value
        mm.flush()
        del mm

    def plane(self, i: int) -> np.ndarray:
        """Plane ``i`` of the leading axes taken as one (a read-only map: paged in as it is read)."""
        mm = np.memmap(self.path, self.dtype, "r", 0, self.shape)
        return mm.reshape((-1,) + self.shape[-2:])[i]


@contextmanager
def ome_writer(path: str | Path, shape: tuple[int, ...], dtype, axes: str, pixel_size_um: float | None = None,
               z_step_um: float | None = None, channel_names: list[str] | None = None,
               workers: int = 1) -> Iterator[OmeStackWriter]:
    """An OME-TIFF filled region by region: the regions go to a raw scratch file beside ``path``
    (its blocks allocated first, so a full disk is an error, not a SIGBUS); on success it is written
    tiled and Deflate-compressed (``workers`` threads), its UUID set from the pixels, and renamed
    into place. A failed or killed job leaves no file (the scratch is removed on the next attempt)."""
    path = Path(path)
    with atomic_path(path) as tmp, _scratch(path) as scratch:
        raw = scratch / "pixels.raw"
        raw.touch()
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        _reserve(raw, nbytes)
        with open(raw, "r+b") as fh:           # a file system that cannot allocate: sized all the same
            fh.truncate(nbytes)
        writer = OmeStackWriter(raw, shape, dtype)
        yield writer
        _write_tiled(tmp, path, writer.plane, tuple(shape), np.dtype(dtype), axes, pixel_size_um, z_step_um,
                     channel_names, pyramid=False, workers=workers)


def write_ome(path: str | Path, data: np.ndarray, axes: str, pixel_size_um: float | None = None,
              z_step_um: float | None = None, channel_names: list[str] | None = None, workers: int = 1) -> None:
    """OME-TIFF (tiled, Deflate) with physical sizes, atomically."""
    data = np.asarray(data)
    with atomic_path(path) as tmp:
        planes = data.reshape((-1,) + data.shape[-2:])
        _write_tiled(tmp, path, lambda i: planes[i], data.shape, data.dtype, axes, pixel_size_um, z_step_um,
                     channel_names, pyramid=False, workers=workers)


@contextmanager
def _scratch(path: Path) -> Iterator[Path]:
    """A scratch folder beside ``path``, named as ``atomic_path`` cleans after a killed attempt."""
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.", suffix=".part") as scratch:
        yield Path(scratch)


class StackReader:
    """Lazy read access to a TIFF's first series: ``reader[index]`` (integers and slices, one
    per axis) returns a copy of just that region. Tiled files (everything plexgpu writes) decode
    only the tiles the region touches, on ``workers`` threads; uncompressed contiguous files are
    mapped per call; other files are read whole once."""

    def __init__(self, path: str | Path, workers: int = 1):
        self.path, self.workers = Path(path), max(1, int(workers))
        self._whole = self.offset = self._pages = None
        try:
            with tifffile.TiffFile(self.path) as tif:
                series = tif.series[0]
                self.shape, self.dtype = tuple(series.shape), np.dtype(series.dtype)
                key = series.keyframe
                if (key.is_tiled and key.tiledepth == 1 and key.samplesperpixel == 1 and len(self.shape) >= 2
                        and key.shape == self.shape[-2:] and len(series.pages) == int(np.prod(self.shape[:-2]))):
                    self._pages = [_TiledPage(p, key) for p in series.pages]
                    end = max((int(o) + int(c) for pg in self._pages for o, c in zip(pg.offsets, pg.counts)),
                              default=0)
                else:
                    self.offset = series.dataoffset
                    end = (self.offset or 0) + int(np.prod(self.shape)) * self.dtype.itemsize
        except Exception as exc:
            raise TiffReadError(f"{path}: cannot read TIFF ({type(exc).__name__}: {exc}){REWRITE}") from None
        size = self.path.stat().st_size
        if self.offset is not None or self._pages is not None:
            if end > size:
                raise TiffReadError(f"{path}: truncated: its pixel data end at byte {end} but the file has {size}"
                                    f"{REWRITE}")
        if self._pages is None and self.offset is None:
            self._whole = read_tiff(self.path)
        self.ndim = len(self.shape)

    def __getitem__(self, index) -> np.ndarray:
        if self._whole is not None:
            return np.array(self._whole[index])
        if self._pages is not None:
            return self._read_tiles(index)
        mm = np.memmap(self.path, self.dtype, "r", self.offset, self.shape)
        try:
            return np.array(mm[index])
        finally:
            del mm

    def _read_tiles(self, index) -> np.ndarray:
        index = (index if isinstance(index, tuple) else (index,))
        index = index + (slice(None),) * (self.ndim - len(index))
        if len(index) != self.ndim:
            raise IndexError(f"{self.path.name}: {len(index)} indices for {self.ndim} axes")
        pages = np.arange(len(self._pages)).reshape(self.shape[:-2])[index[:-2]]  # shaped as the result's lead
        (y0, y1), (x0, x1) = (_span(i, n) for i, n in zip(index[-2:], self.shape[-2:]))
        out = np.zeros(pages.shape + (y1 - y0, x1 - x0), self.dtype)
        planes, pages = out.reshape((-1, y1 - y0, x1 - x0)), pages.ravel()
        work = [(k, t) for k, p in enumerate(pages) for t in self._pages[p].tiles(y0, y1, x0, x1)]
        with open(self.path, "rb") as fh:               # reads in file order, one thread; decoding in parallel
            blobs = [self._pages[pages[k]].read(fh, t) for k, t in work]

        def place(i: int) -> None:
            k, t = work[i]
            try:
                self._pages[pages[k]].place(blobs[i], t, planes[k], y0, y1, x0, x1)
            except Exception as exc:                    # a codec's error names no file
                raise TiffReadError(f"{self.path}: a tile cannot be decoded ({type(exc).__name__}: {exc})"
                                    f"{REWRITE}") from None
            blobs[i] = None

        if self.workers > 1 and len(work) > 1:
            with ThreadPoolExecutor(min(self.workers, len(work))) as pool:
                list(pool.map(place, range(len(work))))
        else:
            for i in range(len(work)):
                place(i)
        return out[(Ellipsis,) + tuple(0 if not isinstance(i, slice) else slice(None) for i in index[-2:])]


def _span(index, size: int) -> tuple[int, int]:
    """[start, stop) of an integer or a step-1 slice along an axis of ``size``."""
    if isinstance(index, slice):
        start, stop, step = index.indices(size)
        if step != 1:
            raise IndexError("StackReader reads step-1 slices")
        return start, max(start, stop)
    i = int(index) + (size if int(index) < 0 else 0)
    if not 0 <= i < size:
        raise IndexError(f"index {index} out of range for size {size}")
    return i, i + 1


class _TiledPage:
    """One tiled plane of a TIFF: where its tiles lie in the file and how to decode one (tifffile)."""

    def __init__(self, page, keyframe):
        self.offsets, self.counts = page.dataoffsets, page.databytecounts
        self.th, self.tw = keyframe.tilelength, keyframe.tilewidth
        self.across = -(-keyframe.imagewidth // self.tw)
        self.decode = keyframe.decode

    def tiles(self, y0: int, y1: int, x0: int, x1: int) -> list[int]:
        return [r * self.across + c for r in range(y0 // self.th, -(-y1 // self.th))
                for c in range(x0 // self.tw, -(-x1 // self.tw))]

    def read(self, fh, t: int) -> bytes | None:
        if not self.counts[t]:
            return None                                     # an empty tile: zeros
        fh.seek(self.offsets[t])
        return fh.read(self.counts[t])

    def place(self, blob: bytes | None, t: int, out: np.ndarray, y0: int, y1: int, x0: int, x1: int) -> None:
        if blob is None:
            return
        tile = self.decode(blob, t, _fullsize=True)[0].reshape(self.th, self.tw)
        ty, tx = (t // self.across) * self.th, (t % self.across) * self.tw
        a0, a1, b0, b1 = max(y0, ty), min(y1, ty + self.th), max(x0, tx), min(x1, tx + self.tw)
        out[a0 - y0:a1 - y0, b0 - x0:b1 - x0] = tile[a0 - ty:a1 - ty, b0 - tx:b1 - tx]


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
                        pixel_size_um: float, dtype=None, workers: int = 1, **options) -> int:
    """CYX pyramidal OME-TIFF (reduced levels in SubIFDs, 2x2 means), readable by Bio-Formats,
    in ``dtype`` (default: the planes' own; uint16 rounds and saturates).

    ``read_plane(c)`` returns channel ``c`` (YX) and is called once per channel: the full
    resolution is streamed into the file while the reduced levels go to scratch files beside
    it, so memory holds one plane as read and one in the file's dtype, never the whole multiplex
    (tests/test_tiff_io.py measures it). Returns the number of levels. ``options``: see ``_write_tiled``.
    """
    first = np.asarray(read_plane(0))
    dtype = np.dtype(dtype or first.dtype)
    held = [first]
    del first

    def planes(c):
        return held.pop() if c == 0 else read_plane(c)     # plane 0 handed over once, then dropped

    with atomic_path(path) as tmp:
        return _write_tiled(tmp, path, planes, (n_planes,) + held[0].shape, dtype, "CYX", pixel_size_um, None,
                            channel_names, pyramid=True, workers=workers, **options)


def _tile_for(shape: tuple[int, int], tile_px: int) -> tuple[int, int]:
    """Square tiles of ``tile_px``, or the plane rounded up to 16 (TIFF's tile unit) if it is smaller."""
    side = min(tile_px, -(-max(shape) // 16) * 16)
    return side, side


def _write_tiled(tmp: Path, path: str | Path, read_plane, shape: tuple[int, ...], dtype, axes: str,
                 pixel_size_um: float | None, z_step_um: float | None, channel_names: list[str] | None,
                 pyramid: bool, workers: int = 1, compression: str | None = COMPRESSION, tile_px: int = TILE_PX,
                 min_size: int = 128) -> int:
    """Write ``tmp`` as ``path``'s OME-TIFF: planes ``read_plane(i)`` for every index of the leading
    axes of ``shape`` (in order, once each), ``tile_px`` tiles, lossless ``compression`` (Deflate with
    the horizontal predictor for integers; tiles compressed on ``workers`` threads), TIFF resolution
    tags, and with ``pyramid`` reduced levels in SubIFDs down to ``min_size``. Its UUID comes from
    the pixels (same result, same bytes). Returns the number of levels."""
    dtype = np.dtype(dtype)
    plane_shape, lead = tuple(shape[-2:]), tuple(shape[:-2])
    n_planes = int(np.prod(lead))
    sizes = [plane_shape]
    while pyramid and min(sizes[-1]) // 2 >= min_size:
        sizes.append((sizes[-1][0] // 2, sizes[-1][1] // 2))
    tile = _tile_for(plane_shape, tile_px)
    opts = dict(dtype=dtype, tile=tile, photometric="minisblack", compression=compression,
                maxworkers=max(1, int(workers)))
    if compression:
        opts["compressionargs"] = {"level": COMPRESSION_LEVEL}
        if dtype.kind in "ui":
            opts["predictor"] = 2
    metadata = _ome_metadata(axes, pixel_size_um, z_step_um, channel_names)
    sha1 = hashlib.sha1()
    nbytes = n_planes * plane_shape[0] * plane_shape[1] * dtype.itemsize
    with _scratch(Path(path)) as scratch:
        lower = [scratch / f"level{k}.raw" for k in range(1, len(sizes))]

        def full_resolution():
            for i in range(n_planes):
                plane = _as(read_plane(i), dtype)
                if plane.shape != plane_shape:
                    raise ValueError(f"plane {i} has shape {plane.shape}, plane 0 {plane_shape}")
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
            for i in range(n_planes):
                plane = np.fromfile(level, dtype, count=count, offset=i * count * dtype.itemsize).reshape(size)
                yield from _tiles(plane, tile)

        try:
            with tifffile.TiffWriter(tmp, ome=True, bigtiff=nbytes * 4 // 3 > 2**31) as tif:
                tif.write(full_resolution(), shape=lead + plane_shape, subifds=len(lower), metadata=metadata,
                          **_resolution(pixel_size_um), **opts)
                for k, (level, size) in enumerate(zip(lower, sizes[1:]), start=1):
                    tif.write(reduced(level, size), shape=lead + size, subfiletype=1,
                              **_resolution(pixel_size_um * 2 ** k if pixel_size_um else None), **opts)
        except OSError as exc:
            if exc.errno in DISK_FULL:                    # the caller's atomic_path removes the part file
                raise DiskFullError(exc.errno, disk_full_message(Path(path).parent, nbytes)) from None
            raise
    _set_uuid(tmp, path, sha1.hexdigest())
    return len(sizes)


def write_plane(path: str | Path, plane: np.ndarray, name: str, pixel_size_um: float | None, dtype=None,
                workers: int = 1) -> int:
    """One YX image (an EDF, a registered channel, a focus map) as a tiled, deflate-compressed,
    pyramidal OME-TIFF, as the plex file: QuPath and napari browse it without loading it whole."""
    return write_pyramidal_ome(path, lambda c: plane, 1, [name], pixel_size_um, dtype=dtype, workers=workers)
