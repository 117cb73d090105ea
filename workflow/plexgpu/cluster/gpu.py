"""The GPU guard: a GPU job checks, before any work, that it really has a usable GPU.

``require_gpu()`` passes only when CuPy imports, at least one CUDA device is visible,
``CUDA_VISIBLE_DEVICES`` agrees with what CUDA reports, and a host -> device -> host
round trip returns the right numbers. Otherwise it raises ``GPUUnavailable`` with one
line naming what is missing. plexgpu never falls back to the CPU on its own.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass


class GPUUnavailable(RuntimeError):
    """No usable GPU in a job that must run on one."""


@dataclass(frozen=True)
class DeviceFacts:
    index: int
    name: str
    total_memory_bytes: int
    cuda_visible_devices: str | None
    uuid: str | None = None
    mig: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _visible_ids() -> list[str] | None:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [v for v in raw.split(",") if v.strip() != ""]


def require_gpu() -> DeviceFacts:
    """Verify the GPU of this job or raise GPUUnavailable (one line)."""
    visible = _visible_ids()
    if visible is not None and not visible:
        raise GPUUnavailable("no usable GPU: CUDA_VISIBLE_DEVICES is set but empty (the job was given no GPU)")
    try:
        import cupy as cp
    except Exception as exc:
        raise GPUUnavailable(f"no usable GPU: CuPy is not importable ({type(exc).__name__}: {exc}); "
                             "install plexgpu[gpu] (cupy-cuda12x)") from None
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GPUUnavailable(f"no usable GPU: CUDA reports no device ({first}); "
                             f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}") from None
    if count < 1:
        raise GPUUnavailable("no usable GPU: CUDA sees 0 devices")
    if visible is not None and len(visible) != count:
        raise GPUUnavailable(f"no usable GPU: CUDA_VISIBLE_DEVICES={','.join(visible)} names {len(visible)} "
                             f"device(s) but CUDA sees {count}")
    try:
        host = cp.arange(4096, dtype=cp.float32)
        back = (host * 2 + 1).get()
        import numpy as np

        if not np.array_equal(back, np.arange(4096, dtype=np.float32) * 2 + 1):
            raise GPUUnavailable("no usable GPU: host -> device -> host round trip returned wrong values")
        props = cp.cuda.runtime.getDeviceProperties(0)
    except GPUUnavailable:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GPUUnavailable(f"no usable GPU: the host -> device -> host round trip failed ({first})") from None
    name = props.get("name", b"")
    name = name.decode() if isinstance(name, bytes) else str(name)
    uuid = props.get("uuid")
    if isinstance(uuid, (bytes, bytearray)):
        uuid = "GPU-" + bytes(uuid).hex()
    return DeviceFacts(index=0, name=name, total_memory_bytes=int(props.get("totalGlobalMem", 0)),
                       cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                       uuid=uuid, mig="MIG" in name)
