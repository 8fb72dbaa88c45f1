"""The GPU workload shared by tests/gpu, bench/gpu and bench/multigpu.

A real bf16 training step: ``nn.TransformerEncoder`` (pre-norm, no dropout), 8 layers,
1024 wide, 16 heads, FFN 4096, batch 8 x 512 tokens, AdamW (PyTorch's default
implementation for CUDA tensors). Roughly 100 M parameters, a step of about 21 ms on
one H200.

Also here: a UDP receiver that decodes the hooks' datagrams with ``ranksight.protocol``,
process-group helpers (NCCL world size 1 on a free loopback port) and the version block
that every result file carries.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]

# The GPU-bound variant of the step: the batch at which the GPU, not the host, paces every phase
# while the profiler and the hooks run. The profiler adds host time to each op, and backward
# launches about 540 of them (autograd, DDP's bucket copies): at batch 32 the host took 29-32 ms to
# launch 21 ms of backward kernels and the GPU idled between them (70-85% busy, H100); at 64 the
# host runs ahead (20-27 ms against 41 ms of kernels, 97% busy).
GPU_BOUND_BATCH = 64


@dataclass(frozen=True)
class ModelSpec:
    layers: int = 8
    width: int = 1024
    heads: int = 16
    ffn: int = 4096
    batch: int = 8
    seq: int = 512

    @classmethod
    def tiny(cls) -> "ModelSpec":
        """A host-bound step: the GPU work is negligible, so wall time is host time."""
        return cls(layers=1, width=64, heads=2, ffn=128, batch=1, seq=8)


def build(spec: ModelSpec, device: Any, seed: int = 0, fused: Optional[bool] = None):
    """(model, optimizer, batch) for ``spec`` on ``device``, parameters in bfloat16."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(spec.width, spec.heads, spec.ffn, dropout=0.0, batch_first=True,
                                       norm_first=True)
    model = nn.TransformerEncoder(layer, spec.layers, enable_nested_tensor=False)
    model = model.to(device=device, dtype=torch.bfloat16)
    kw = {} if fused is None else {"fused": fused}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
    x = torch.randn(spec.batch, spec.seq, spec.width, device=device, dtype=torch.bfloat16)
    return model, opt, x


def n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _null() -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


def train_step(model: Any, opt: Any, x: Any, ranges: bool = False,
               between: Optional[Callable[[], None]] = None) -> Any:
    """One optimizer step. ``ranges``: wrap forward/backward/comm/optimizer in ``record_function``
    ranges ``rs_fwd``/``rs_bwd``/``rs_comm``/``rs_opt`` for the profiler comparison. ``between``
    runs after backward and before the optimizer (explicit collectives). Returns the loss
    tensor (never read here: reading it would synchronize)."""
    if ranges:
        from torch.profiler import record_function as rf
    else:
        rf = None  # type: ignore[assignment]
    with (rf("rs_fwd") if rf else _null()):
        out = model(x)
    loss = out.float().square().mean()
    with (rf("rs_bwd") if rf else _null()):
        loss.backward()
    if between is not None:
        with (rf("rs_comm") if rf else _null()):
            between()
    with (rf("rs_opt") if rf else _null()):
        opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def flush_step(opt: Any) -> None:
    """An optimizer step with no gradients (no GPU work): closes a step for the hooks, so its
    record carries every interval that finished before it. Call after a device synchronize."""
    opt.zero_grad(set_to_none=True)
    opt.step()


# ---------------------------------------------------------------------- hooks datagrams
from ranksight.tools.receiver import Receiver, with_detail  # noqa: E402,F401  (the project's validating receiver)
from ranksight.common.plumbing import free_port  # noqa: E402,F401  (used by the GPU scripts as W.free_port)


def sum_fields(records: List[Dict[str, Any]], lo: int, hi: int,
               fields=("dur", "fwd", "bwd", "opt", "xcomm", "comm", "data")) -> Dict[str, float]:
    """Sums of the step records with lo <= seq <= hi."""
    sel = [r for r in records if lo <= r["seq"] <= hi]
    out = {f: float(sum(r.get(f, 0.0) for r in sel)) for f in fields}
    out["records"] = len(sel)
    return out


# every step's phase times: the GPU scripts sum them from the records they receive
# Every step timed with CUDA events (hooks.gpu_timing_every 1): the profiler checks compare each phase's
# seconds over a few measured steps, which only every-step timing gives exactly. The default sampled
# timing is checked against it by bench/gpu/sampled.py (tests/gpu/test_gpu_sampled.py).
QUIET_HOOKS = with_detail({"hooks": {"heartbeat_seconds": 0.05, "table_every_steps": 0, "table_every_seconds": 0,
                                     "gpu_timing_every": 1}})


def fr_dump() -> Optional[Dict[str, Any]]:
    """NCCL's Flight Recorder, whole (collectives with durations), as the scenarios read it."""
    import torch

    f = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
    if f is None:
        return None
    raw = f(includeCollectives=True, includeStackTraces=False, onlyActive=False)
    return pickle.loads(raw) if raw else {}


# ---------------------------------------------------------------------- process groups
def init_nccl_world1(device: Any) -> None:
    """A one-rank NCCL process group on a free loopback TCP port (eager NCCL init)."""
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=device)


def destroy_pg() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------- environment
def versions() -> Dict[str, Any]:
    """torch / CUDA / NCCL / driver / GPU, for every result file."""
    out: Dict[str, Any] = {"python": platform.python_version(), "host": platform.node(),
                           "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
            out["gpu_count"] = torch.cuda.device_count()
            try:
                v = torch.cuda.nccl.version()
                out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except Exception as e:  # no NCCL in this build
                out["nccl"] = f"unavailable ({e})"
    except ImportError:
        out["torch"] = None
    try:
        import pynvml

        pynvml.nvmlInit()
        d = pynvml.nvmlSystemGetDriverVersion()
        out["driver"] = d.decode() if isinstance(d, bytes) else str(d)
        pynvml.nvmlShutdown()
    except Exception as e:
        out["driver"] = f"unavailable ({type(e).__name__})"
    for k in ("NCCL_NVLS_ENABLE", "TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"):
        if k in os.environ:
            out.setdefault("env", {})[k] = os.environ[k]
    return out


NO_CUDA = ("needs CUDA: torch.cuda.is_available() is False on this machine; the GPU tests run on the "
           "GPU machine (bash bench/gpu/run_all.sh)")


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def write_json(path: Optional[str], obj: Any) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def spec_dict(spec: ModelSpec) -> Dict[str, int]:
    return asdict(spec)


def timing_every(v: str) -> int:
    """An argparse type for hooks.gpu_timing_every: "auto" or 0 (the gap from the events' cost,
    the hooks' default), 1 (every step timed) or N (one step in N on average)."""
    import argparse

    if v == "auto":
        return 0
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{v!r}: give auto (or 0), or a step count of at least 1")
    return n


def median(xs: List[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def quantile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def abba(pairs: int) -> List[tuple]:
    """The arms' order of each interleaved pair: (plain, watched), then (watched, plain), ..."""
    return [(False, True) if i % 2 == 0 else (True, False) for i in range(pairs)]


def median_ci95(values: List[float], resamples: int = 2000, seed: int = 0) -> Tuple[float, float]:
    """A 95% bootstrap interval of the median of ``values`` (resampled with replacement, a fixed
    seed so a result file reads the same each time): where it lies wholly under a target, the
    pairs resolve that target; where it straddles it, more pairs are needed."""
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    return meds[int(0.025 * resamples)], meds[min(resamples - 1, int(0.975 * resamples))]


def ci_text(r: Dict[str, Any], width: int) -> str:
    """``ratio_summary``'s median interval as ``lo..hi``, ``width`` characters (blank where the result
    has none)."""
    ci = r.get("ratio_median_ci95")
    return f"{ci[0]:>{width - 8}.4f}..{ci[1]:<6.4f}" if ci else " " * width


def ratio_summary(plain_s: List[float], watched_s: List[float]) -> Dict[str, Any]:
    """The per-pair ratios (watched / plain step time) of interleaved pairs: their median with its
    95% bootstrap interval, p25, p75, min and max, the ratio of the medians, and each arm's median
    and every pair in ms."""
    ratios = [b / a for a, b in zip(plain_s, watched_s)]
    mp, mi = median(plain_s), median(watched_s)
    lo, hi = median_ci95(ratios)
    return {"plain_ms_median": mp * 1e3, "instrumented_ms_median": mi * 1e3,
            "ratio_median_of_pairs": median(ratios), "ratio_median_ci95": [lo, hi], "ratio_of_medians": mi / mp,
            "ratio_p25": quantile(ratios, 0.25), "ratio_p75": quantile(ratios, 0.75),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratios": ratios, "plain_ms": [p * 1e3 for p in plain_s], "instrumented_ms": [i * 1e3 for i in watched_s]}


def batches(x: Any, n: int) -> List[Any]:
    """A loader of ``n`` steps over one pre-made device batch (no input pipeline in these runs)."""
    return [x] * n


def log(msg: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


DEVBIN = REPO / ".devbin"


def with_deepspeed(env: Dict[str, str]) -> Dict[str, str]:
    """``env`` with deepspeed importable by ``sys.executable``: as it is where deepspeed is installed,
    else with ``.devbin/py-deepspeed`` (``bench/gpu/deepspeed_prepare.sh``: deepspeed and the
    pure-Python packages it imports) on ``PYTHONPATH``, and, where this Python has no pydantic of
    its own, ``.devbin/py-deepspeed-cpXY`` (pydantic with its compiled core for this CPython X.Y)."""
    import subprocess

    def imports(mod: str, e: Dict[str, str]) -> bool:
        return subprocess.run([sys.executable, "-c", f"import {mod}"], env=e, capture_output=True).returncode == 0

    env = dict(env)
    if imports("deepspeed", env):
        return env
    extra = [str(DEVBIN / "py-deepspeed")]
    core = DEVBIN / f"py-deepspeed-cp{sys.version_info[0]}{sys.version_info[1]}"
    if core.is_dir() and not imports("pydantic", env):
        extra.append(str(core))
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in (env.get("PYTHONPATH"),) if p])
    return env

