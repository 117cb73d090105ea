"""What every workflow job sets up before its stage runs: a log file, the worker pool
sized from ``cpus_per_task`` (never a hard-coded number), the array backend from
``compute.device`` with the GPU guard first when that is ``gpu``, and progress bars."""

from __future__ import annotations

import logging
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from . import xp as xpmod
from .io.tiff import DISK_FULL, DiskFullError, disk_full_message

log = logging.getLogger("plexgpu")


@dataclass
class JobContext:
    rule: str
    workers: int
    device: str
    xp: ModuleType
    pool: ThreadPoolExecutor
    device_facts: dict | None = None
    started: float = field(default_factory=time.time)

    def progress(self, description: str, total: int):
        """A rich progress bar in the job's log; returns an ``advance()`` callable."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=sys.stderr, width=100)
        bar = Progress(TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=False)
        task = bar.add_task(description, total=total)
        bar.start()

        def advance(n: int = 1):
            bar.advance(task, n)
            if bar.tasks[0].completed >= total:
                bar.stop()
        return advance


def workers_from_resources(resources) -> int:
    """The worker pool size: the job's ``cpus_per_task``."""
    value = getattr(resources, "cpus_per_task", None)
    if value is None and isinstance(resources, dict):
        value = resources.get("cpus_per_task")
    if value is None:
        raise ValueError("the job has no cpus_per_task resource; every plexgpu rule sets one")
    return max(1, int(value))


def _requested(resources) -> dict:
    get = (lambda k: resources.get(k)) if isinstance(resources, dict) else (lambda k: getattr(resources, k, None))
    return {k: get(k) for k in ("cpus_per_task", "mem_mb", "runtime", "gpu", "slurm_account", "slurm_partition")}


def _failed(rule: str, ctx: JobContext, recorder, exc: BaseException) -> None:
    log.exception("%s failed after %.1f s", rule, time.time() - ctx.started)
    if recorder:
        recorder.finish("failed", f"{type(exc).__name__}: {exc}".splitlines()[0])


def _disk_message(exc: OSError) -> str:
    folder = Path(exc.filename).parent if exc.filename else Path.cwd()
    return disk_full_message(folder)


@contextmanager
def job_context(rule: str, log_path: str | None, resources, device: str, accounting_dir: str | None = None,
                cycle: str = ""):
    """Set up logging, the GPU guard (device gpu), the worker pool and, for GPU-stage jobs
    (``accounting_dir`` given), the accounting record, written also when the job fails."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    stderr = sys.stderr
    if log_path:
        handlers = [logging.FileHandler(log_path, mode="a")]
        sys.stderr = open(log_path, "a", buffering=1)  # progress bars and tracebacks land in the log too
    previous = _on_sigterm(rule)
    try:
        yield from _job(rule, resources, device, accounting_dir, cycle, handlers)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if sys.stderr is not stderr:                   # back to the caller's stderr (tests run many jobs)
            sys.stderr.close()
            sys.stderr = stderr


class JobCancelled(SystemExit):
    """SIGTERM (scancel, SLURM's time limit): raised where the job is, so that its partial outputs are
    removed (atomic_path) and its accounting record is written, as for any failure."""


def _on_sigterm(rule: str):
    """SIGTERM becomes JobCancelled in the main thread (the default ends the process at once: a '.part'
    file left and no record). Returns the handler it replaced (None where it cannot: another thread)."""
    def cancelled(signum, frame):
        raise JobCancelled(f"{rule}: cancelled (SIGTERM: scancel or the job's time limit)")
    try:
        return signal.signal(signal.SIGTERM, cancelled)
    except ValueError:                                  # not the main thread
        return None


def _job(rule, resources, device, accounting_dir, cycle, handlers):
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(message)s")
    workers = workers_from_resources(resources)
    recorder = None
    if accounting_dir:
        from .cluster.accounting import JobRecorder

        recorder = JobRecorder(rule, cycle, Path(accounting_dir), device, requested=_requested(resources))
    facts = None
    if device == "gpu":
        from .cluster.gpu import GPUUnavailable, require_gpu

        try:
            facts = require_gpu().as_dict()
        except GPUUnavailable as exc:
            log.error("%s: %s", rule, exc)
            if recorder:
                recorder.finish("failed", str(exc))
            raise SystemExit(f"{rule}: {exc}") from None
        if recorder:
            recorder.begin_gpu(facts)
        log.info("GPU: %s (%s MiB), CUDA_VISIBLE_DEVICES=%s", facts["name"],
                 facts["total_memory_bytes"] // 2**20, facts["cuda_visible_devices"])
    xp = xpmod.get_xp(xpmod.backend_for_device(device))
    log.info("%s: worker pool = %d (cpus_per_task = %d), compute.device = %s, backend = %s",
             rule, workers, workers, device, xp.__name__)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ctx = JobContext(rule=rule, workers=workers, device=device, xp=xp, pool=pool, device_facts=facts)
        try:
            yield ctx
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                _failed(rule, ctx, recorder, exc)
                raise
            # the outputs' partial files are gone (atomic_path), so the record has room to be written
            message = f"{rule}: {exc.strerror if isinstance(exc, DiskFullError) else _disk_message(exc)}"
            log.error(message)
            if recorder:
                recorder.finish("failed", message)
            raise SystemExit(message) from None
        except BaseException as exc:
            _failed(rule, ctx, recorder, exc)
            raise
        log.info("%s finished in %.1f s", rule, time.time() - ctx.started)
        if recorder:
            log.info("accounting record: %s", recorder.finish("completed"))
