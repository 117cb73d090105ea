"""The one seam between NumPy/SciPy and CuPy/cupyx.

Every algorithm takes arrays and asks this module for the matching namespaces, so
the same code runs on NumPy in CI and on CuPy on a GPU. Apart from the GPU guard
(cluster/gpu.py), no other module imports cupy. cupyx submodules are imported lazily: some
fail to import without a GPU (missing libcublasLt), and a CPU run must never touch them.

A device namespace other than CuPy -- the tests' strict stand-in (tests/strict_device.py),
which runs CuPy's rules on NumPy storage in CI -- is recognised by what it offers: its
arrays name it through ``__array_namespace__`` and come back with ``.get()``, and it
brings its own fft/ndimage companions as ``plexgpu_fft`` / ``plexgpu_ndimage``.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

BACKENDS = ("numpy", "cupy")


def _cupy() -> ModuleType | None:
    try:
        return importlib.import_module("cupy")
    except Exception:
        return None


def cupy_available() -> bool:
    """True when CuPy imports and a CUDA device answers."""
    cp = _cupy()
    if cp is None:
        return False
    try:
        return bool(cp.is_available())
    except Exception:
        return False


def get_xp(name: str) -> ModuleType:
    """Array module by backend name ('numpy' or 'cupy')."""
    if name == "numpy":
        return np
    if name == "cupy":
        cp = _cupy()
        if cp is None:
            raise RuntimeError("backend 'cupy' requested but CuPy is not installed (pip install .[gpu])")
        return cp
    raise ValueError(f"unknown array backend {name!r}; expected one of {BACKENDS}")


def backend_for_device(device: str) -> str:
    """config compute.device -> array backend name."""
    return {"gpu": "cupy", "cpu": "numpy"}[device]


def array_module(*arrays: Any) -> ModuleType:
    """NumPy or the device namespace (CuPy), whichever holds the arrays."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            return _cupy()
        if not isinstance(a, (np.ndarray, np.generic)) and hasattr(a, "__array_namespace__"):
            return a.__array_namespace__()
    return np


def on_device(xp: ModuleType) -> bool:
    """True for a device namespace (CuPy, or the tests' stand-in of it); False for NumPy."""
    return xp is not np


def to_device(a: Any, xp: ModuleType) -> Any:
    """Move a host array to the backend of ``xp`` (no copy for NumPy)."""
    return xp.asarray(a)


def to_host(a: Any) -> np.ndarray:
    """A NumPy array, copying back from the GPU where needed."""
    if array_module(a) is not np:
        return a.get()
    return np.asarray(a)


def fft(xp: ModuleType) -> ModuleType:
    """``scipy.fft`` or ``cupyx.scipy.fft`` (both have dctn/idctn with norm='ortho')."""
    if on_device(xp):
        return getattr(xp, "plexgpu_fft", None) or importlib.import_module("cupyx.scipy.fft")
    return importlib.import_module("scipy.fft")


def ndimage(xp: ModuleType) -> ModuleType:
    """``scipy.ndimage`` or ``cupyx.scipy.ndimage``."""
    if on_device(xp):
        return getattr(xp, "plexgpu_ndimage", None) or importlib.import_module("cupyx.scipy.ndimage")
    return importlib.import_module("scipy.ndimage")


def fft_workers(xp: ModuleType, workers: int | None) -> dict:
    """Keyword arguments for fft calls: scipy takes ``workers=``, cupyx does not."""
    if on_device(xp) or not workers:
        return {}
    return {"workers": workers}


def synchronize(xp: ModuleType) -> None:
    """Wait for queued GPU work (for honest timings); no-op on NumPy."""
    if on_device(xp):
        xp.cuda.Stream.null.synchronize()


def free_device_bytes(xp: ModuleType) -> int | None:
    """Free memory of the current GPU plus what CuPy's pool holds for reuse; None on NumPy."""
    if not on_device(xp):
        return None
    free, _total = xp.cuda.Device().mem_info
    return int(free + xp.get_default_memory_pool().free_bytes())
