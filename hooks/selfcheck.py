"""Start-up self-check: GPUs (count, name, memory, temperature), CUDA/NCCL/torch versions,
free space of the tmp, log and checkpoint directories, and how the model is parallelized
(``parallel.py``). Logged once and sent in the "hello" (sent again when the parallel strategy
becomes known later).

Runs on the hooks' background thread (NVML initialisation can take a while); every
probe is optional and a failing one just leaves its field out.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any, Dict, List, Tuple

from ranksight import protocol

log = logging.getLogger("ranksight.hooks")


def dirs(log_dir: str, checkpoint_dir: str) -> Dict[str, str]:
    return {"tmp": tempfile.gettempdir(), "log": log_dir or "", "checkpoint": checkpoint_dir or ""}


def _free(path: str) -> int:
    p = os.path.abspath(path)
    while p and not os.path.exists(p):  # a checkpoint dir that does not exist yet: its parent's disk
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return shutil.disk_usage(p).free


def _gpus() -> Tuple[List[str], List[int], List[int]]:
    names: List[str] = []
    mem: List[int] = []
    temps: List[int] = []
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                n = pynvml.nvmlDeviceGetName(h)
                names.append(n.decode() if isinstance(n, bytes) else str(n))
                mem.append(int(pynvml.nvmlDeviceGetMemoryInfo(h).total))
                try:
                    temps.append(int(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))
                except Exception:
                    temps.append(-1)
        finally:
            pynvml.nvmlShutdown()
        return names, mem, temps
    except Exception:
        pass
    try:  # no NVML: what torch can tell without touching temperatures
        import torch

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                names.append(p.name)
                mem.append(int(p.total_memory))
    except Exception:
        pass
    return names, mem, temps


def collect(d: Dict[str, str], backend: str) -> Dict[str, Any]:
    """A flat info object (at most one level of lists) that fits in one datagram."""
    info: Dict[str, Any] = {}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda or ""
        if torch.cuda.is_available():
            try:
                v = torch.cuda.nccl.version()
                info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception:
                pass
    except Exception:
        pass
    info["backend"] = backend
    names, mem, temps = _gpus()
    info["gpus"] = len(names)
    if names:
        info["gpu_names"] = sorted(set(names))
        info["gpu_mem_bytes"] = mem
        if temps:
            info["gpu_temp_c"] = temps
    for k, p in d.items():
        if p:
            try:
                info[f"free_{k}_bytes"] = int(_free(p))
            except OSError:
                info[f"free_{k}_bytes"] = -1
    return info


def fit(rec: Dict[str, Any]) -> bytes:
    """Encode a hello record, trimming per-GPU lists until it fits in one datagram."""
    data = protocol.encode(rec)
    info = rec["info"]
    for k in ("gpu_temp_c", "gpu_mem_bytes", "gpu_names"):
        if len(data) <= protocol.MAX_DATAGRAM:
            break
        info.pop(k, None)
        data = protocol.encode(rec)
    return data


def describe(info: Dict[str, Any]) -> str:
    parts = [f"torch {info.get('torch', '?')}", f"backend {info.get('backend') or 'none'}",
             f"{info.get('gpus', 0)} GPU(s)"]
    if info.get("strategy"):
        z = info.get("zero_stage")
        parts.append(f"{info['strategy']} ZeRO-{z}" if z else str(info["strategy"]))
    if info.get("gpu_names"):
        parts.append("/".join(info["gpu_names"]))
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    if info.get("nccl"):
        parts.append(f"NCCL {info['nccl']}")
    if info.get("gpu_temp_c"):
        parts.append("temp " + ",".join(map(str, info["gpu_temp_c"])) + " C")
    for k in ("tmp", "log", "checkpoint"):
        v = info.get(f"free_{k}_bytes")
        if v is not None:
            parts.append(f"{k} free {v / 1e9:.1f} GB" if v >= 0 else f"{k} free ?")
    return ", ".join(parts)
