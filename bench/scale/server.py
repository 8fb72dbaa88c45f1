"""A real Prometheus for the benchmark (started by ranksight.common.servers, queried through
ranksight.common.plumbing) and promtool runs."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ranksight.common import servers
from ranksight.common.plumbing import ApiError, PrometheusAPI

log = logging.getLogger(__name__)


class BenchError(RuntimeError):
    """One clear line; the CLI prints it and exits 2."""


def tool_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BenchError(f"cannot run {binary}: {e}") from None
    lines = [ln.strip() for ln in (out.stdout + "\n" + out.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else "unknown (it prints no version)"


class Prometheus:
    """A real Prometheus on a loopback port, over a given TSDB directory. It is SIGKILLed when the
    benchmark dies, even by SIGKILL (a test's timeout), so that none outlives its run; the signal
    fires when the *thread* that started it exits: Prometheus is started from the main thread only."""

    def __init__(self, binary: str, data: Path, config: Path, log_path: Path, extra: Sequence[str] = ()):
        self.server = servers.prometheus(config, data, log_path, binary=binary, deathsig=signal.SIGKILL,
                                         flags=["--storage.tsdb.retention.time=3650d", "--web.enable-lifecycle",
                                                *extra])
        self.port, self.url, self.log_path = self.server.port, self.server.url, log_path
        self.api = PrometheusAPI(self.url, timeout=300.0)
        self.timing = PrometheusAPI(self.url, timeout=900.0)

    @property
    def proc(self) -> Optional[subprocess.Popen]:
        """The running Prometheus process, None before start and after stop."""
        return self.server.proc.popen if self.server.proc.alive() else None

    def start(self, timeout: float = 300.0) -> float:
        t0 = time.monotonic()
        try:
            self.server.launch(timeout)
        except servers.ServerError as e:
            raise BenchError(str(e)) from None
        return time.monotonic() - t0

    def stop(self) -> None:
        self.server.stop(120.0)

    def rules(self) -> List[Dict[str, Any]]:
        """Rule groups with their evaluation times (/api/v1/rules)."""
        try:
            return self.api.rules()
        except ApiError as e:
            raise BenchError(str(e)) from None

    def timed_query_range(self, expr: str, start: float, end: float, step: int) -> Tuple[float, Dict[str, Any]]:
        return self.timing.timed("/api/v1/query_range",
                                 {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)})

    def timed_query(self, expr: str, at: float) -> Tuple[float, Dict[str, Any]]:
        return self.timing.timed("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})

    def instant(self, expr: str, at: Optional[float] = None) -> List[Dict[str, Any]]:
        try:
            return self.api.query(expr, at)
        except ApiError as e:
            raise BenchError(f"query {expr!r}: {e}") from None

    def scalar(self, expr: str, at: Optional[float] = None) -> Optional[float]:
        res = self.instant(expr, at)
        return float(res[0]["value"][1]) if res else None

    def metrics(self) -> Dict[str, float]:
        """Prometheus' own /metrics, name{labels} -> value."""
        try:
            return PrometheusAPI(self.url, timeout=60.0).own_metrics()
        except ApiError as e:
            raise BenchError(str(e)) from None

    def rss(self) -> Tuple[int, int]:
        """(VmRSS, VmHWM) in bytes."""
        rss = hwm = 0
        if self.proc is None:
            return 0, 0
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) * 1024
                    elif line.startswith("VmHWM:"):
                        hwm = int(line.split()[1]) * 1024
        except OSError:
            pass
        return rss, hwm


def run_checked(cmd: Sequence[str], what: str, timeout: float, log_path: Optional[Path] = None,
                env: Optional[Mapping[str, str]] = None) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} did not finish in {timeout:.0f} s") from None
    except OSError as e:
        raise BenchError(f"cannot run {cmd[0]}: {e.strerror or e}") from None
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}\n")
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise BenchError(f"{what} failed (exit {out.returncode}): {' | '.join(tail)}")
    return out.stdout


