"""Richardson-Lucy deconvolution on the NumPy/CuPy seam.

The OTF is computed once per piece; FFT sizes are padded to fast lengths; edges are
extended by mirroring so borders do not ring; float32 throughout; no rescaling to the
dtype range (total flux is kept). A mosaic larger than device memory is processed in
overlapping XY chunks whose halos are discarded.
"""

from __future__ import annotations

import numpy as np

from . import xp as xpmod

EPS = 1e-12


def _fast_shape(shape) -> tuple[int, ...]:
    from scipy.fft import next_fast_len

    return tuple(next_fast_len(int(s), real=True) for s in shape)


def _otf(xp, psf, shape):
    """rFFT of the PSF placed with its centre at the origin of a ``shape`` array."""
    fft = xpmod.fft(xp)
    big = xp.zeros(shape, xp.float32)
    pz, py, px = psf.shape
    big[:pz, :py, :px] = xp.asarray(psf, dtype=xp.float32)
    big = xp.roll(big, (-(pz // 2), -(py // 2), -(px // 2)), axis=(0, 1, 2))
    return fft.rfftn(big)


def richardson_lucy(image, psf, iterations: int, workers: int | None = None):
    """RL of a ZYX stack (host or device) with a ZYX PSF (sum 1); returns float32 on the same device."""
    xp = xpmod.array_module(image)
    fft = xpmod.fft(xp)
    kw = xpmod.fft_workers(xp, workers)
    img = xp.asarray(image, dtype=xp.float32)
    if iterations <= 0:
        return img.copy()
    if img.ndim != 3 or psf.ndim != 3:
        raise ValueError(f"richardson_lucy needs ZYX image and PSF, got {img.shape} and {psf.shape}")
    # mirror-extend by the PSF half size, then up to fast FFT lengths
    halo = [s // 2 for s in psf.shape]
    need = [n + 2 * h for n, h in zip(img.shape, halo)]
    fast = _fast_shape(need)
    pads = [(h, h + f - n) for h, f, n in zip(halo, fast, need)]
    pads = [(min(a, s - 1), b) if s > 1 else (0, a + b) for (a, b), s in zip(pads, img.shape)]
    work = xp.pad(img, pads, mode="symmetric")
    if work.shape != fast:  # a dimension of 1 cannot mirror: pad with edge values
        work = xp.pad(work, [(0, f - s) for f, s in zip(fast, work.shape)], mode="edge")
    otf = _otf(xp, psf, fast)
    otf_conj = xp.conj(otf)
    estimate = xp.full(fast, float(work.mean()), xp.float32)
    floor = max(EPS, 1e-6 * float(xp.abs(work).mean()))  # float32 FFT round-off must not explode a ratio
    for _ in range(iterations):
        blurred = fft.irfftn(fft.rfftn(estimate, **kw) * otf, s=fast, **kw)
        ratio = work / xp.maximum(blurred, floor)
        estimate *= fft.irfftn(fft.rfftn(ratio, **kw) * otf_conj, s=fast, **kw)
    sl = tuple(slice(a, a + n) for (a, _), n in zip(pads, img.shape))
    return estimate[sl].astype(xp.float32)


def chunk_slices(size: int, chunk: int, halo: int) -> list[tuple[slice, slice, slice]]:
    """(read, write, keep) slices along one axis: read with halo, write into output, keep within read."""
    out = []
    for start in range(0, size, chunk):
        stop = min(size, start + chunk)
        r0, r1 = max(0, start - halo), min(size, stop + halo)
        out.append((slice(r0, r1), slice(start, stop), slice(start - r0, stop - r0)))
    return out


def deconvolve(stack, psf, iterations: int, chunk_px: int, halo_px: int | None = None,
               xp=None, workers: int | None = None, progress=None):
    """RL of a (host) ZYX stack in overlapping XY chunks on the backend ``xp``; returns host float32.

    ``halo_px`` defaults to four PSF half-widths; ``progress(done, total)`` is called per chunk.
    """
    xp = xp or np
    stack = np.asarray(stack)
    if halo_px is None:
        halo_px = 4 * (psf.shape[1] // 2)
    z, h, w = stack.shape
    out = np.empty((z, h, w), np.float32)
    ys, xs = chunk_slices(h, chunk_px, halo_px), chunk_slices(w, chunk_px, halo_px)
    total, done = len(ys) * len(xs), 0
    for ry, wy, ky in ys:
        for rx, wx, kx in xs:
            piece = xpmod.to_device(np.ascontiguousarray(stack[:, ry, rx]), xp)
            res = richardson_lucy(piece, psf, iterations, workers)
            out[:, wy, wx] = xpmod.to_host(res[:, ky, kx])
            done += 1
            if progress:
                progress(done, total)
    return out
