"""The CuPy path on every machine: the stages the jobs run, under the strict CuPy stand-in
(tests/strict_device.py, whose docstring says what it models and what it cannot), against the
same stages on NumPy; the stand-in's own refusals; float32 kept on the device; and every
``xp.*`` / ``fft.*`` / ``ndimage.*`` call of the library checked against the installed CuPy's
names and signatures (read from the source, not from a hand-kept list)."""

from __future__ import annotations

import ast
import csv
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from plexgpu import paths, stages
from plexgpu import xp as xpmod
from plexgpu.config import validate_config
from plexgpu.experiment import cycle_spec, resolve_experiment
from plexgpu.io.tiff import read_tiff
from plexgpu.job import job_context
from strict_device import CUPY, LARGE_FLOAT64, LEDGER, STRICT, StrictDeviceError

LIBRARY = Path(__file__).resolve().parents[1] / "workflow" / "plexgpu"


# ----------------------------------------------------------------------------- the stand-in itself
def test_stand_in_refuses_what_cupy_refuses():
    a = STRICT.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    host = np.ones(4, np.float32)
    refused = {
        "np.asarray(device)": lambda: np.asarray(a),
        "device + host": lambda: a + host,
        "host + device": lambda: host + a[0],
        "xp.maximum(device, host)": lambda: STRICT.maximum(a, host),
        "host[device index]": lambda: host[a[0].astype(STRICT.int64)],
        "list[device 0-d]": lambda: [1, 2, 3][a[0, 1].astype(STRICT.int64)],
        "scipy.fft workers=": lambda: xpmod.fft(STRICT).rfft(a, workers=2),
    }
    for what, f in refused.items():
        with pytest.raises(TypeError):
            f()
            pytest.fail(f"{what} was accepted")
    # what CuPy allows: NumPy ufuncs dispatch to the device, reductions stay 0-d device arrays,
    # explicit transfers, float() of a 0-d array (counted as a synchronisation)
    assert type(np.exp(a)) is type(a) and type(a.sum()) is type(a) and a.sum().shape == ()
    before = LEDGER.syncs
    assert float(a.sum()) == 66.0 and LEDGER.syncs == before + 1
    assert isinstance(xpmod.to_host(a), np.ndarray) and xpmod.array_module(a) is STRICT
    # a host -> device transfer copies: changing the device array leaves the host array alone
    src = np.zeros(3, np.float32)
    dev = xpmod.to_device(src, STRICT)
    dev += 1
    assert src.max() == 0 and xpmod.to_host(dev).min() == 1


@pytest.mark.skipif(CUPY is None, reason="cupy (the test extra installs cupy-cuda12x) is not importable")
def test_the_ledger_counts_device_memory_traffic_and_calls():
    """Peak live device bytes follow allocation and free (views share their base), device->host bytes
    are counted at .get(), and each call its device operands and results."""
    LEDGER.reset()
    base, calls = LEDGER.live_bytes, LEDGER.device_calls
    a = STRICT.zeros((1000, 250), STRICT.float32)                  # 1 MB
    assert LEDGER.live_bytes - base == 10**6 and LEDGER.device_calls == calls + 1
    b = a * 2                                                      # another MB, 2 MB touched
    view = b[:500]                                                 # a view: no new buffer
    assert LEDGER.live_bytes - base == 2 * 10**6
    assert LEDGER.bytes_touched >= 3 * 10**6
    del b
    assert LEDGER.live_bytes - base == 2 * 10**6                   # the view keeps b's buffer alive
    host = view.get()
    del view
    assert LEDGER.live_bytes - base == 10**6 and LEDGER.d2h_bytes == host.nbytes == 500 * 1000
    STRICT.asarray(np.ones(10**5, np.float32))                     # made and dropped at once
    assert LEDGER.peak_bytes - base == 2 * 10**6 and LEDGER.h2d_bytes == 4 * 10**5
    del a
    assert LEDGER.live_bytes == base


def test_stand_in_knows_cupys_names():
    with pytest.raises(StrictDeviceError, match="does not exist"):
        _ = STRICT.nanpercentile                               # NumPy has it, CuPy 14 does not
    with pytest.raises(StrictDeviceError, match="no attribute"):
        STRICT.zeros(3).resize((4,))                           # an ndarray method CuPy lacks


# ----------------------------------------------------------------------------- the stages, strict vs NumPy
def _run_stages(raw: Path, res: Path, backend) -> dict:
    config = validate_config({"raw_dir": str(raw), "results_dir": str(res)})
    config["deconvolution"]["iterations"] = 5
    exp = resolve_experiment(config)
    specs = [cycle_spec(exp, c) for c in exp.cycles[:2]]
    for spec in specs:                                     # the registry's layout, as the rules give it
        st, de, ed = (paths.outputs(name, res, spec.channels, spec.key) for name in ("stitch", "deconvolve", "edf"))
        for f in (st, de, ed):
            Path(f[next(iter(f))][0]).parent.mkdir(parents=True, exist_ok=True)
        Path(st["positions"]).parent.mkdir(parents=True, exist_ok=True)
        for rule, run in [
            ("stitch", lambda c: stages.stitch(c, spec, config["basic"], config["stitch"], st)),
            ("deconvolve", lambda c: stages.deconvolve(c, spec, config["optics"], config["deconvolution"], st, de)),
            ("edf", lambda c: stages.extended_depth(c, spec, config["edf"], {**st, **de}, ed)),
        ]:
            with job_context(rule, str(res / f"{rule}.{spec.key}.log"), {"cpus_per_task": 2}, "cpu") as ctx:
                ctx.xp = backend
                run(ctx)
    keys = [s.key for s in specs]
    reg_in = {name: [f for k in keys for f in paths.outputs(stage, res, specs[0].channels, k)[name]]
              for stage, name in (("edf", "edf"), ("edf", "edf_deconvolved"), ("stitch", "profiles"))}
    reg_in.update({name: [paths.outputs("stitch", res, specs[0].channels, k)[name] for k in keys]
                   for name in ("planes", "positions")})
    reg_out = paths.outputs("registration", res, specs[0].channels, cycles=keys)
    for f in reg_out["registered"] + reg_out["registered_deconvolved"] + [reg_out["plex"]]:
        Path(f).parent.mkdir(parents=True, exist_ok=True)
    with job_context("registration", str(res / "registration.log"), {"cpus_per_task": 2}, "cpu") as ctx:
        ctx.xp = backend
        stages.register(ctx, specs, config["registration"], reg_in, reg_out)
    first = specs[1]
    st, de, ed = (paths.outputs(name, res, first.channels, first.key) for name in ("stitch", "deconvolve", "edf"))
    with open(st["positions"]) as fh:
        positions = np.array([[float(r["y_px"]), float(r["x_px"])] for r in csv.DictReader(fh)])
    return {"stitched": read_tiff(st["stitched"][0]),
            "deconvolved": read_tiff(de["deconvolved"][0]),
            "edf": read_tiff(ed["edf"][0]),
            "positions": positions,
            "planes": json.loads(Path(st["planes"]).read_text())["recorded"],
            "shifts": Path(reg_out["shifts"]).read_text(),
            "plex": read_tiff(reg_out["plex"])}


@pytest.fixture(scope="module")
def strict_and_numpy(small_synth, tmp_path_factory):
    raw, _ = small_synth
    LEDGER.reset()
    strict = _run_stages(raw, tmp_path_factory.mktemp("strict"), STRICT)
    ledger = {"largest_float64": LEDGER.largest_float64, "sites": dict(LEDGER.float64_sites),
              "syncs": LEDGER.syncs, "h2d_bytes": LEDGER.h2d_bytes}
    host = _run_stages(raw, tmp_path_factory.mktemp("numpy"), np)
    return strict, host, ledger


@pytest.mark.slow
def test_stages_run_under_the_strict_stand_in_and_agree_with_numpy(strict_and_numpy):
    """stitch -> deconvolve -> edf -> registration on device arrays give NumPy's results: the
    device branches (batched BaSiC fits, device FFTs) compute the same thing."""
    strict, host, _ = strict_and_numpy
    assert np.abs(strict["positions"] - host["positions"]).max() < 0.01
    assert strict["planes"] == host["planes"]
    for key in ("stitched", "deconvolved", "edf", "plex"):
        a, b = strict[key].astype(np.float64), host[key].astype(np.float64)
        assert a.shape == b.shape
        rel = np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)
        assert rel < 1e-3, f"{key}: strict vs numpy max relative difference {rel:.2e}"
    assert strict["shifts"] == host["shifts"]


@pytest.mark.slow
def test_stages_keep_float32_on_the_device(strict_and_numpy):
    """No float64 device array larger than a few thousand elements anywhere in the four stages
    (float64 doubles device memory and runs at 1/32..1/64 of float32 speed on most GPUs)."""
    _, _, ledger = strict_and_numpy
    assert ledger["largest_float64"] <= LARGE_FLOAT64, \
        f"float64 device arrays made at {ledger['sites']} (largest {ledger['largest_float64']} elements)"
    assert ledger["h2d_bytes"] > 0                       # the stages really ran on the stand-in


# ----------------------------------------------------------------------------- CuPy's API surface
NAMESPACES = {"xp": "cupy", "fft": "cupyx.scipy.fft", "ndi": "cupyx.scipy.ndimage"}


def _library_calls():
    """(file:line, namespace, dotted name, keywords) for every call of the form ``xp.a.b(...)``,
    and of ``f.name(...)`` where ``f = xpmod.fft(xp)`` / ``xpmod.ndimage(xp)`` in that function."""
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        if path.name == "xp.py":
            continue
        tree = ast.parse(path.read_text())
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
            alias = {"xp": "cupy"}
            for node in ast.walk(func):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                        and isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name) \
                        and node.value.func.value.id == "xpmod" and node.value.func.attr in ("fft", "ndimage"):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            alias[t.id] = f"cupyx.scipy.{node.value.func.attr}"
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                parts, obj = [], node.func
                while isinstance(obj, ast.Attribute):
                    parts.insert(0, obj.attr)
                    obj = obj.value
                if isinstance(obj, ast.Name) and obj.id in alias:
                    found.append((f"{path.relative_to(LIBRARY.parent)}:{node.lineno}", alias[obj.id],
                                  ".".join(parts), [k.arg for k in node.keywords if k.arg]))
    return sorted(set((s, ns, n, tuple(k)) for s, ns, n, k in found))


def test_the_library_is_read_for_its_device_calls():
    calls = _library_calls()
    names = {(ns, n) for _, ns, n, _ in calls}
    assert ("cupy", "asarray") in names and ("cupyx.scipy.fft", "rfftn") in names \
        and ("cupyx.scipy.ndimage", "gaussian_filter") in names, sorted(names)[:20]


@pytest.mark.skipif(CUPY is None, reason="cupy (the test extra installs cupy-cuda12x) is not importable")
def test_every_device_call_exists_in_cupy_with_its_keywords():
    import importlib

    problems = []
    calls = _library_calls()
    for site, ns, name, keywords in calls:
        obj = importlib.import_module(ns)
        for part in name.split("."):
            if not hasattr(obj, part):
                problems.append(f"{site}: {ns}.{name}: no {part!r} in the installed CuPy {CUPY.__version__}")
                break
            obj = getattr(obj, part)
        else:
            if not keywords or isinstance(obj, type):
                continue
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):       # compiled ufuncs: their keywords are NumPy's (out, dtype, ...)
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            bad = [k for k in keywords if k not in params]
            if bad:
                problems.append(f"{site}: {ns}.{name}() takes no keyword {', '.join(bad)}")
    assert len(calls) > 100
    assert not problems, "\n".join(problems)
