"""A strict CuPy stand-in for machines without a GPU: NumPy does the arithmetic, CuPy's rules apply.

CI has no GPU, so the CuPy path would otherwise never run. ``STRICT`` is an array namespace
that the library receives exactly where it would receive ``cupy`` (through ``plexgpu.xp``),
whose arrays (:class:`DeviceArray`) hold a NumPy array but refuse what CuPy refuses:

- **implicit conversion to host memory** -- ``np.asarray(dev)``, ``tifffile`` given a device
  array, a device array used as an index into a host array or a Python list (CuPy arrays have
  no ``__index__``): :class:`StrictDeviceError` (a ``TypeError``, as CuPy raises);
- **host arrays mixed into device calls** -- ``dev + host``, ``xp.maximum(dev, host)``,
  ``np.exp(dev)`` dispatches to ``STRICT.exp`` as CuPy's ``__array_ufunc__`` dispatches to
  ``cupy.exp`` and refuses host operands the same way; only the transfer functions
  (``asarray``, ``array``, ...) take host arrays, and they copy, as a host->device copy does;
- **API gaps** -- a name that the installed ``cupy`` / ``cupyx.scipy.fft`` /
  ``cupyx.scipy.ndimage`` does not have, or a keyword its signature does not take (e.g.
  ``workers=`` in ``scipy.fft``), raises :class:`StrictDeviceError` naming both.

Allowed because CuPy allows them, but counted in :data:`LEDGER`: ``float()``, ``int()``,
``bool()``, ``.item()``, ``.tolist()``, ``.get()`` (each one synchronises the device), and
host->device transfers. Every array the namespace creates is measured: the largest float64 /
complex128 device array and where it was made (the dtype test bounds it). What decides GPU time
and fit is counted too: device memory live and its peak (a buffer counts from the call that makes
it until NumPy frees it; views share their base's), device->host bytes, device calls and the
bytes each call reads and writes (its device operands and results).

What it cannot model: streams, asynchrony and kernel launches (everything here is synchronous);
CuPy's own numerical differences (cuFFT rounding, atomics in reductions); a library's scratch
inside one call (cuFFT's work area, a reduction's temporaries: NumPy's are not seen either) and
CuPy's memory pool rounding (blocks of 512 bytes and up); the free memory the ``cuda`` shim
reports (a fixed size); CuPy rejecting plain Python lists in some functions
(NumPy accepts them and so does this stand-in); and methods' keywords (CuPy's ndarray methods
are compiled and have no introspectable signature: only their names are checked).
"""

from __future__ import annotations

import importlib
import inspect
import traceback
import types
import weakref
from dataclasses import dataclass, field

import numpy as np
import scipy.fft
import scipy.ndimage


class StrictDeviceError(TypeError):
    """What CuPy would have raised (or where CuPy has no such function or keyword)."""


def _import(name):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


CUPY = _import("cupy")
CUPYX_FFT = _import("cupyx.scipy.fft") if CUPY else None
CUPYX_NDIMAGE = _import("cupyx.scipy.ndimage") if CUPY else None

LARGE_FLOAT64 = 4096          # elements: a float64 device array larger than this is reported


def _call_site() -> str:
    """The innermost frame outside this module: the library line that made the call."""
    for fr in reversed(traceback.extract_stack()[:-1]):
        if not fr.filename.endswith("strict_device.py"):
            return f"{fr.filename.split('/workflow/')[-1]}:{fr.lineno}"
    return "?"


@dataclass
class Ledger:
    syncs: int = 0
    h2d_bytes: int = 0
    d2h_bytes: int = 0
    device_calls: int = 0
    bytes_touched: int = 0                                # device bytes read + written, summed over calls
    live_bytes: int = 0                                   # device buffers alive now
    peak_bytes: int = 0                                   # ... and the most at once since the last reset
    largest_float64: int = 0
    float64_sites: dict = field(default_factory=dict)     # call site -> largest size made there

    def reset(self):
        """Counters to zero; the peak restarts from what is alive now (a stage's own peak)."""
        self.syncs = self.h2d_bytes = self.d2h_bytes = self.device_calls = self.bytes_touched = 0
        self.largest_float64 = 0
        self.peak_bytes = self.live_bytes
        self.float64_sites = {}

    def figures(self) -> dict:
        return {k: getattr(self, k) for k in ("syncs", "h2d_bytes", "d2h_bytes", "device_calls", "bytes_touched",
                                              "peak_bytes", "live_bytes")}


LEDGER = Ledger()


_TRACKED: dict[int, int] = {}                     # id of a device buffer (an owning ndarray) -> its bytes


def _freed(key: int) -> None:
    LEDGER.live_bytes -= _TRACKED.pop(key, 0)


def _track(a: np.ndarray) -> None:
    """Count a buffer the device holds from now until NumPy frees it (a view holds its base alive)."""
    if not a.flags.owndata or id(a) in _TRACKED:
        return
    _TRACKED[id(a)] = a.nbytes
    LEDGER.live_bytes += a.nbytes
    LEDGER.peak_bytes = max(LEDGER.peak_bytes, LEDGER.live_bytes)
    weakref.finalize(a, _freed, id(a))


def _touched(args, kwargs, res) -> int:
    """Bytes of the device operands a call read and of the results it wrote."""
    def size(x):
        if isinstance(x, DeviceArray):
            return x._a.nbytes
        if isinstance(x, np.ndarray):
            return x.nbytes
        if isinstance(x, (list, tuple)):
            return sum(size(v) for v in x)
        return 0
    return size(list(args)) + size(list(kwargs.values())) + size(res)


def _note(a: np.ndarray) -> None:
    _track(a)
    if a.dtype in (np.float64, np.complex128) and a.size > LARGE_FLOAT64:
        site = _call_site()
        LEDGER.float64_sites[site] = max(LEDGER.float64_sites.get(site, 0), a.size)
        LEDGER.largest_float64 = max(LEDGER.largest_float64, a.size)


def _wrap(x):
    if isinstance(x, np.ndarray):
        _note(x)
        return DeviceArray(x)
    if isinstance(x, np.generic):                 # CuPy reductions return 0-d device arrays, not scalars
        return DeviceArray(np.asarray(x))
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


def _unwrap(x, where: str):
    if isinstance(x, DeviceArray):
        return x._a
    if isinstance(x, np.ndarray):
        raise StrictDeviceError(f"{where}: a host numpy.ndarray {x.shape} {x.dtype} given to a device function "
                                f"(CuPy: TypeError 'Unsupported type numpy.ndarray'); move it with xp.to_device")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, where) for v in x)
    return x


def _check_keywords(fn_name: str, counterpart, kwargs: dict, where: str) -> None:
    if counterpart is None or not kwargs:
        return
    try:
        sig = inspect.signature(counterpart)
    except (TypeError, ValueError):               # compiled ufuncs: no signature to read
        return
    params = sig.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        raise StrictDeviceError(f"{where}: {fn_name}() in CuPy takes no keyword {', '.join(unknown)} "
                                f"(signature {sig})")


TRANSFERS = {"asarray", "array", "asanyarray", "ascontiguousarray"}


class _Namespace(types.ModuleType):
    """A host module (numpy, scipy.fft, scipy.ndimage) seen through CuPy's rules."""

    def __init__(self, name: str, host, device):
        super().__init__(name)
        self._host, self._device = host, device

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(self._host, name)
        where = _call_site()
        counterpart = None
        if self._device is not None:
            if not hasattr(self._device, name):
                raise StrictDeviceError(f"{where}: {self._device.__name__}.{name} does not exist "
                                        f"(the installed CuPy has no such name)")
            counterpart = getattr(self._device, name)
        if isinstance(attr, types.ModuleType):
            return _Namespace(f"{self.__name__}.{name}", attr, counterpart)
        if isinstance(attr, type) or not callable(attr):
            return attr                           # dtypes, constants (pi, inf, newaxis)
        qual = f"{self.__name__}.{name}"

        def call(*args, **kwargs):
            site = _call_site()
            _check_keywords(qual, counterpart, kwargs, site)
            if name in TRANSFERS:
                return _transfer(attr, args, kwargs)
            res = attr(*_unwrap(list(args), f"{site}: {qual}"),
                       **{k: _unwrap(v, f"{site}: {qual}") for k, v in kwargs.items()})
            LEDGER.device_calls += 1
            LEDGER.bytes_touched += _touched(args, kwargs, res)
            return _same_out(res, kwargs.get("out"))
        call.__name__ = name
        return call


def _same_out(res, out):
    if isinstance(out, DeviceArray) and res is out._a:
        return out
    return _wrap(res)


def _transfer(fn, args, kwargs):
    a, rest = args[0], args[1:]
    if isinstance(a, DeviceArray):
        res = fn(a._a, *rest, **kwargs)
        return a if res is a._a else _wrap(res)
    host = np.array(_unwrap_host_lists(a), copy=True)      # host -> device: always a copy
    LEDGER.h2d_bytes += host.nbytes
    return _wrap(fn(host, *rest, **kwargs))


def _unwrap_host_lists(a):
    if isinstance(a, (list, tuple)):
        return type(a)(_unwrap_host_lists(v) for v in a)
    if isinstance(a, DeviceArray):
        return a._a
    return a


class _Cuda:
    """The slice of ``cupy.cuda`` the library uses: synchronise and ask for free memory."""

    FREE_BYTES = 2 * 2**30

    class Stream:
        class null:
            @staticmethod
            def synchronize():
                LEDGER.syncs += 1

    class Device:
        @property
        def mem_info(self):
            return (_Cuda.FREE_BYTES, 4 * _Cuda.FREE_BYTES)


class _Pool:
    def free_bytes(self):
        return 0


class _Strict(_Namespace):
    cuda = _Cuda

    def get_default_memory_pool(self):
        return _Pool()

    def asnumpy(self, a):
        return a.get() if isinstance(a, DeviceArray) else np.asarray(a)


STRICT = _Strict("strict_device", np, CUPY)
STRICT_FFT = _Namespace("strict_device.fft", scipy.fft, CUPYX_FFT)
STRICT_NDIMAGE = _Namespace("strict_device.ndimage", scipy.ndimage, CUPYX_NDIMAGE)
STRICT.plexgpu_fft = STRICT_FFT                 # the companions xp.fft(xp) / xp.ndimage(xp) return
STRICT.plexgpu_ndimage = STRICT_NDIMAGE


def _binary(name):
    ufunc = getattr(np, name)

    def op(self, other):
        return getattr(STRICT, name)(self, other)

    def rop(self, other):
        return getattr(STRICT, name)(other, self)

    def iop(self, other):
        ufunc(self._a, _unwrap(other, f"{_call_site()}: in-place {name}"), out=self._a)
        LEDGER.device_calls += 1
        LEDGER.bytes_touched += 2 * self._a.nbytes + _touched([other], {}, None)
        return self
    return op, rop, iop


class DeviceArray:
    """A device array: NumPy storage, CuPy's refusals."""

    __slots__ = ("_a",)
    __array_priority__ = 1000

    def __init__(self, a: np.ndarray):
        self._a = a

    # -- what CuPy refuses ----------------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise StrictDeviceError(f"{_call_site()}: implicit conversion of a device array {self.shape} "
                                f"{self.dtype} to NumPy (CuPy: TypeError 'Implicit conversion to a NumPy "
                                f"array is not allowed'); use xp.to_host")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__":
            return NotImplemented
        return getattr(STRICT, ufunc.__name__)(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        ns = STRICT
        for part in func.__module__.split(".")[1:]:
            ns = getattr(ns, part, None)
            if ns is None:
                return NotImplemented
        try:
            fn = getattr(ns, func.__name__)
        except (AttributeError, StrictDeviceError):
            return NotImplemented
        return fn(*args, **kwargs)

    def __array_namespace__(self, api_version=None):
        return STRICT

    # -- explicit transfers and synchronising conversions (allowed, counted) ---------------
    def get(self):
        LEDGER.syncs += 1
        LEDGER.d2h_bytes += self._a.nbytes
        return self._a.copy()

    def item(self, *args):
        LEDGER.syncs += 1
        return self._a.item(*args)

    def tolist(self):
        LEDGER.syncs += 1
        return self._a.tolist()

    def __float__(self):
        LEDGER.syncs += 1
        return float(self._a)

    def __int__(self):
        LEDGER.syncs += 1
        return int(self._a)

    def __complex__(self):
        LEDGER.syncs += 1
        return complex(self._a)

    def __bool__(self):
        LEDGER.syncs += 1
        return bool(self._a)

    # -- array behaviour ------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    real = property(lambda self: _wrap(self._a.real))
    imag = property(lambda self: _wrap(self._a.imag))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (DeviceArray(v) if isinstance(v, np.ndarray) else DeviceArray(np.asarray(v)) for v in self._a)

    def __repr__(self):
        return f"DeviceArray({self._a!r})"

    def __getitem__(self, key):
        return _wrap(self._a[_index(key)])

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray):          # host -> device copy into a slice: CuPy allows it
            LEDGER.h2d_bytes += value.nbytes
        self._a[_index(key)] = value._a if isinstance(value, DeviceArray) else value
        LEDGER.device_calls += 1
        LEDGER.bytes_touched += 2 * self._a[_index(key)].nbytes

    def __getattr__(self, name):
        if name.startswith("__"):                 # __array_interface__, __array_struct__: none, as on CuPy
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if CUPY is not None and not hasattr(CUPY.ndarray, name):
            raise StrictDeviceError(f"{_call_site()}: cupy.ndarray has no attribute {name!r}")
        if not callable(attr):
            return _wrap(attr)

        def method(*args, **kwargs):
            where = f"{_call_site()}: .{name}()"
            res = attr(*_unwrap(list(args), where), **{k: _unwrap(v, where) for k, v in kwargs.items()})
            LEDGER.device_calls += 1
            LEDGER.bytes_touched += self._a.nbytes + _touched(args, kwargs, res)
            return _same_out(res, kwargs.get("out"))
        return method

    def __neg__(self):
        return STRICT.negative(self)

    def __pos__(self):
        return STRICT.positive(self)

    def __abs__(self):
        return STRICT.absolute(self)

    def __invert__(self):
        return STRICT.invert(self)

    for _name, _dunder in [("add", "add"), ("subtract", "sub"), ("multiply", "mul"), ("true_divide", "truediv"),
                           ("floor_divide", "floordiv"), ("remainder", "mod"), ("power", "pow"),
                           ("matmul", "matmul"), ("bitwise_and", "and"), ("bitwise_or", "or"),
                           ("bitwise_xor", "xor"), ("left_shift", "lshift"), ("right_shift", "rshift")]:
        _op, _rop, _iop = _binary(_name)
        locals()[f"__{_dunder}__"], locals()[f"__r{_dunder}__"], locals()[f"__i{_dunder}__"] = _op, _rop, _iop
    for _name, _dunder in [("less", "lt"), ("less_equal", "le"), ("greater", "gt"), ("greater_equal", "ge"),
                           ("equal", "eq"), ("not_equal", "ne")]:
        locals()[f"__{_dunder}__"] = _binary(_name)[0]
    del _name, _dunder, _op, _rop, _iop
    __hash__ = None


def _index(key):
    """Device arrays as indices into a device array are fine; host index arrays are copied over."""
    if isinstance(key, DeviceArray):
        return key._a
    if isinstance(key, tuple):
        return tuple(k._a if isinstance(k, DeviceArray) else k for k in key)
    return key


def to_device(a) -> DeviceArray:
    return STRICT.asarray(a)


__all__ = ["STRICT", "DeviceArray", "LEDGER", "StrictDeviceError", "to_device"]
