"""The four image stages of a workflow job, from files to files: stitch, deconvolve,
edf (per cycle) and registration (all cycles). Each reads its inputs, runs the
algorithms on the job's backend (NumPy or CuPy) and writes every output atomically.
Memory is bounded by one channel's z-stack mosaic: channels are streamed.

One module per stage, imported when its name is first used (``stages.stitch(...)``): a job imports
what its own stage needs, not the algorithms of the others (each import is seconds of start-up in a
GPU allocation, billed)."""

from __future__ import annotations

import importlib

#: public name -> the module of this package that defines it
_WHERE = {
    "per_channel": "_common",
    "stitch": "_stitch", "RESIZE_TILES": "_stitch", "_shading_record": "_stitch",
    "deconvolve": "_deconvolve", "optics_for": "_deconvolve", "kernel_for": "_deconvolve",
    "extended_depth": "_edf",
    "register": "_register", "REGISTERED_KINDS": "_register", "unique_channel_names": "_register",
    "markers_csv": "_register", "by_cycle_and_channel": "_register", "camera_offsets": "_register",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
