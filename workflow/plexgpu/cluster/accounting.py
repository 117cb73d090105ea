"""Per-job GPU accounting records.

Every GPU-stage job writes ``accounting/jobs/<rule>-<cycle>-<jobid>.json``, also when it
fails: the SLURM facts (job id, account, partition, node, cpus_per_task, requested memory
and time), start/end/elapsed, the device (vendor, model, UUID, whole device or MIG slice
and its profile, memory), GPU utilisation and memory sampled through NVML on a background
thread (mean, p95, peak), CPU efficiency and peak host RSS. Without a GPU the record says
plainly that no device was used.
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..io.tiff import write_text_atomic

SAMPLE_SECONDS = 1.0
MIG_PROFILE = re.compile(r"(\d+g\.\d+gb)")


def slurm_facts() -> dict:
    env = os.environ
    gpus = env.get("SLURM_GPUS") or env.get("SLURM_GPUS_ON_NODE") or env.get("SLURM_JOB_GPUS")
    return {
        "job_id": env.get("SLURM_JOB_ID"),
        "job_name": env.get("SLURM_JOB_NAME"),
        "account": env.get("SLURM_JOB_ACCOUNT"),
        "partition": env.get("SLURM_JOB_PARTITION"),
        "node": env.get("SLURMD_NODENAME") or socket.gethostname(),
        "gpus_env": gpus,
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
    }


def allocated_gpus(facts: dict) -> int:
    cvd = facts.get("cuda_visible_devices")
    if cvd:
        return len([d for d in cvd.split(",") if d.strip()])
    g = facts.get("gpus_env")
    if g and g.isdigit():
        return int(g)
    return 0


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q / 100 * (len(v) - 1)))))
    return v[k]


class NvmlSampler:
    """GPU utilisation and memory of this job's device, sampled on a background thread."""

    def __init__(self, interval: float = SAMPLE_SECONDS):
        self.interval = interval
        self.util: list[float] = []
        self.mem: list[float] = []
        self.device: dict = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._nvml = None

    def start(self) -> "NvmlSampler":
        try:
            import pynvml as nvml

            nvml.nvmlInit()
            self._nvml = nvml
            cvd = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
            if cvd.startswith("MIG-") or cvd.startswith("GPU-"):
                self._handle = nvml.nvmlDeviceGetHandleByUUID(cvd)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(0)
            name = nvml.nvmlDeviceGetName(self._handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            uuid = nvml.nvmlDeviceGetUUID(self._handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            mem = nvml.nvmlDeviceGetMemoryInfo(self._handle)
            is_mig = uuid.startswith("MIG-") or "MIG" in name
            m = MIG_PROFILE.search(name)
            self.device = {"used": True, "vendor": "NVIDIA", "model": re.sub(r"\s*MIG\s*\S*$", "", name),
                           "uuid": uuid, "kind": "MIG slice" if is_mig else "whole device",
                           "mig_profile": m.group(1) if (is_mig and m) else None,
                           "memory_total_bytes": int(mem.total)}
        except Exception as exc:  # no NVML: the device facts come from the GPU guard alone
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"
            return self
        self._thread = threading.Thread(target=self._run, name="plexgpu-nvml", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                self.mem.append(float(nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
                self.util.append(float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            except Exception:
                pass  # MIG slices report no utilisation; memory samples still count
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        total = self.device.get("memory_total_bytes")
        return {
            "samples": len(self.mem), "interval_s": self.interval,
            "gpu_util_mean_pct": sum(self.util) / len(self.util) if self.util else None,
            "gpu_util_p95_pct": _percentile(self.util, 95),
            "gpu_util_peak_pct": max(self.util) if self.util else None,
            "gpu_mem_peak_bytes": max(self.mem) if self.mem else None,
            "gpu_mem_mean_bytes": sum(self.mem) / len(self.mem) if self.mem else None,
            "gpu_mem_peak_pct": (100 * max(self.mem) / total) if (self.mem and total) else None,
            "error": self.error,
        }


@dataclass
class JobRecorder:
    """Collects one job's record; ``finish()`` writes it atomically (success or failure)."""

    rule: str
    cycle: str
    folder: Path
    device_setting: str
    requested: dict = field(default_factory=dict)
    start: float = field(default_factory=time.time)
    device: dict = field(default_factory=dict)
    sampler: NvmlSampler | None = None

    def begin_gpu(self, guard_facts: dict | None) -> None:
        self.sampler = NvmlSampler().start()
        self.device = dict(self.sampler.device) or {
            "used": True, "vendor": "NVIDIA", "model": (guard_facts or {}).get("name"),
            "uuid": (guard_facts or {}).get("uuid"),
            "kind": "MIG slice" if (guard_facts or {}).get("mig") else "whole device",
            "mig_profile": None, "memory_total_bytes": (guard_facts or {}).get("total_memory_bytes")}

    def path(self, job_id: str) -> Path:
        return self.folder / f"{self.rule}-{self.cycle or 'all'}-{job_id}.json"

    def finish(self, status: str, error: str | None = None) -> Path:
        end = time.time()
        facts = slurm_facts()
        job_id = facts["job_id"] or f"local{os.getpid()}"
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = usage.ru_utime + usage.ru_stime
        cpus = int(self.requested.get("cpus_per_task") or 1)
        elapsed = end - self.start
        gpu = self.sampler.stop() if self.sampler else None
        device = self.device or {"used": False, "note": f"no GPU device was used (compute.device = "
                                                        f"{self.device_setting}); the record holds the "
                                                        "SLURM facts only"}
        record = {
            "schema": "plexgpu.accounting/1",
            "rule": self.rule, "cycle": self.cycle, "status": status, "error": error,
            "slurm": dict(facts, job_id=job_id), "allocated_gpus": allocated_gpus(facts),
            "requested": self.requested,
            "start": self.start, "end": end, "elapsed_s": elapsed,
            "start_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.start)),
            "end_iso": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)),
            "device": device, "gpu_samples": gpu,
            "cpu_time_s": cpu_s,
            "cpu_efficiency_pct": 100 * cpu_s / max(elapsed * cpus, 1e-9),
            "peak_rss_bytes": usage.ru_maxrss * 1024,
        }
        path = self.path(job_id)
        write_text_atomic(path, json.dumps(record, indent=1))
        return path


def load_records(folder: str | Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
