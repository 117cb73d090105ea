"""TIFF and OME-TIFF I/O. Every write goes to a temporary name in the same folder
and is renamed into place, so a killed job never leaves a file that looks finished."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import tifffile


class TiffReadError(OSError):
    """A raw TIFF that cannot be read; the message names the file."""


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_tiff_header(path: str | Path) -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a TIFF's first series, from its header only."""
    try:
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            return tuple(page.shape), page.dtype.name
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


def _ome_uuid(path: str | Path, data: np.ndarray) -> str:
    """A UUID fixed by the file's name and content: the same result gives the same bytes."""
    import hashlib
    import uuid

    digest = hashlib.sha1(np.ascontiguousarray(data).view(np.uint8).ravel()).hexdigest()
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'plexgpu/{Path(path).name}/{digest}')}"


def write_ome(path: str | Path, data: np.ndarray, axes: str, pixel_size_um: float | None = None,
              z_step_um: float | None = None, channel_names: list[str] | None = None) -> None:
    """OME-TIFF with physical sizes, atomically."""
    metadata: dict = {"axes": axes, "UUID": _ome_uuid(path, data)}
    if pixel_size_um:
        metadata.update(PhysicalSizeX=pixel_size_um, PhysicalSizeXUnit="µm",
                        PhysicalSizeY=pixel_size_um, PhysicalSizeYUnit="µm")
    if z_step_um and "Z" in axes:
        metadata.update(PhysicalSizeZ=z_step_um, PhysicalSizeZUnit="µm")
    if channel_names:
        metadata["Channel"] = {"Name": list(channel_names)}
    with atomic_path(path) as tmp:
        tifffile.imwrite(tmp, data, ome=True, metadata=metadata, photometric="minisblack")


def write_pyramidal_ome(path: str | Path, data: np.ndarray, channel_names: list[str],
                        pixel_size_um: float, min_size: int = 128) -> int:
    """CYX pyramidal OME-TIFF (reduced levels in SubIFDs), readable by Bio-Formats.

    Returns the number of levels written.
    """
    levels = [data]
    while min(levels[-1].shape[-2:]) // 2 >= min_size:
        prev = levels[-1]
        h, w = (prev.shape[-2] // 2) * 2, (prev.shape[-1] // 2) * 2
        levels.append(prev[:, :h, :w].reshape(prev.shape[0], h // 2, 2, w // 2, 2).mean(axis=(2, 4))
                      .astype(data.dtype))
    metadata = {
        "axes": "CYX", "UUID": _ome_uuid(path, data),
        "PhysicalSizeX": pixel_size_um, "PhysicalSizeXUnit": "µm",
        "PhysicalSizeY": pixel_size_um, "PhysicalSizeYUnit": "µm",
        "Channel": {"Name": list(channel_names)},
    }
    tile = (256, 256) if min(data.shape[-2:]) >= 256 else None
    with atomic_path(path) as tmp:
        with tifffile.TiffWriter(tmp, ome=True, bigtiff=data.nbytes > 2**31) as tif:
            tif.write(levels[0], subifds=len(levels) - 1, metadata=metadata, tile=tile,
                      photometric="minisblack")
            for level in levels[1:]:
                tif.write(level, subfiletype=1, tile=tile, photometric="minisblack")
    return len(levels)
