"""Prometheus and Alertmanager as child processes: the one launcher of ``ranksight stack`` (its
LocalStack, which the demo and the tests use), the tests' own servers and the benchmarks
(torch-free, standard library only).

``find_binary(name) -> str``
    Path of "prometheus" / "alertmanager" / "promtool" / "amtool" (and "victoria-metrics" /
    "vmagent" / "vmalert", $RANKSIGHT_VICTORIA_METRICS_BIN and so on); raises ``MissingBinary``
    whose message names the Debian package to install. ``$RANKSIGHT_PROMETHEUS_BIN``,
    ``$RANKSIGHT_ALERTMANAGER_BIN``, ``$RANKSIGHT_PROMTOOL_BIN``, ``$RANKSIGHT_AMTOOL_BIN`` override.
``prometheus(config, data, log_file, port=0, flags=(), ...) -> Server``
``alertmanager(config, data, log_file, port=0, flags=(), ...) -> Server``
    One server on 127.0.0.1 with that config file and data directory, its output in
    ``log_file``; port 0 picks a free one. Alertmanager runs with clustering off. ``flags`` are
    added to the command line; ``binary`` overrides ``find_binary``; ``pid_file`` lets another
    process find a daemon again (``Server.proc`` is its ``plumbing.Proc``).
``Server``
    ``launch(timeout=30, daemon=False)``: start and wait until ``/-/ready`` answers, or stop it
    and raise ``ServerError`` with one line (the log's most telling line and its path);
    ``start(daemon)`` and ``wait_ready(timeout)`` apart; ``stop(grace)``; ``port``, ``url``,
    ``api`` (``PrometheusAPI`` or ``AlertmanagerAPI``), ``pid()``.
``error_line(log_path) -> str``: the last error-level line of a server log, else its last line.
``wait_serving(proc, url, name, left, timeout)``: until a server's readiness URL answers, or one
ServerError line naming it (also for the VictoriaMetrics binaries of ``tools/vmstack.py``).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from .plumbing import STOP_GRACE_SECONDS, AlertmanagerAPI, PrometheusAPI, Proc, free_port, wait_http

# binary -> (names looked up on PATH, env override, Debian package)
BINARIES: Dict[str, tuple] = {
    "prometheus": (("prometheus",), "RANKSIGHT_PROMETHEUS_BIN", "prometheus"),
    "alertmanager": (("prometheus-alertmanager", "alertmanager"), "RANKSIGHT_ALERTMANAGER_BIN",
                     "prometheus-alertmanager"),
    "promtool": (("promtool",), "RANKSIGHT_PROMTOOL_BIN", "prometheus"),
    "amtool": (("amtool",), "RANKSIGHT_AMTOOL_BIN", "prometheus-alertmanager"),
    # the VictoriaMetrics layout of ``ranksight stack --engine victoriametrics`` (ranksight.tools.vmstack)
    "victoria-metrics": (("victoria-metrics",), "RANKSIGHT_VICTORIA_METRICS_BIN", "victoria-metrics"),
    "vmagent": (("vmagent",), "RANKSIGHT_VMAGENT_BIN", "victoria-metrics"),
    "vmalert": (("vmalert",), "RANKSIGHT_VMALERT_BIN", "victoria-metrics"),
}
PathLike = Union[str, "os.PathLike[str]"]


class ServerError(RuntimeError):
    """One clear line for the user: a server could not start or did not become ready."""


class MissingBinary(ServerError):
    pass


def find_binary(name: str) -> str:
    names, env_var, package = BINARIES[name]
    override = os.environ.get(env_var)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise MissingBinary(f"{env_var}={override} is not an executable file "
                            f"(install the Debian package: apt-get install {package})")
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    raise MissingBinary(f"{names[0]} not found on PATH: install the Debian package "
                        f"'{package}' (apt-get install {package})")


def error_line(path: Path) -> str:
    """The most telling line of a server log: the last error-level line, else the last line."""
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if "level=error" in ln or "level=ERROR" in ln or "err=" in ln:
            return ln
    return lines[-1] if lines else ""


def wait_serving(proc: Proc, url: str, name: str, left: float, timeout: float) -> None:
    """Until ``url`` answers (``left`` seconds at most): ServerError naming ``name``, its log's
    error line and the log when ``proc`` exits first or ``url`` does not answer in time
    (``timeout``: the wait the message names)."""
    ok, code = wait_http(url, max(left, 0.0), proc.popen)
    if code is not None:
        raise ServerError(f"{name} exited with code {code}: {error_line(proc.log_file)} (log: {proc.log_file})")
    if not ok:
        raise ServerError(f"{name} not ready after {timeout:.0f} s: {error_line(proc.log_file)} "
                          f"(log: {proc.log_file})")


class Server:
    """Prometheus or Alertmanager on 127.0.0.1 (``kind``); built by ``prometheus()`` or
    ``alertmanager()``. See the module doc."""

    def __init__(self, kind: str, config: PathLike, data: PathLike, log_file: PathLike, *, port: int = 0,
                 flags: Sequence[str] = (), binary: Optional[str] = None, pid_file: Optional[PathLike] = None,
                 nice: int = 0, deathsig: int = signal.SIGTERM, api_timeout: float = 5.0):
        assert kind in ("prometheus", "alertmanager"), kind
        self.kind = kind
        self.config, self.data = Path(config), Path(data)
        self.port = port or free_port()
        self.flags = list(flags)
        self.binary = binary
        self.api_timeout = api_timeout
        self.proc = Proc([], Path(log_file), name=kind, pid_file=None if pid_file is None else Path(pid_file),
                         marker=str(self.config), nice=nice, deathsig=deathsig)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api(self) -> Union[PrometheusAPI, AlertmanagerAPI]:
        cls = PrometheusAPI if self.kind == "prometheus" else AlertmanagerAPI
        return cls(self.url, self.api_timeout)

    @property
    def log_file(self) -> Path:
        return self.proc.log_file

    def argv(self) -> List[str]:
        binary = self.binary or find_binary(self.kind)
        listen = f"--web.listen-address=127.0.0.1:{self.port}"
        if self.kind == "prometheus":
            return [binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}", listen, *self.flags]
        return [binary, f"--config.file={self.config}", f"--storage.path={self.data}", listen,
                "--cluster.listen-address=", *self.flags]

    def pid(self) -> Optional[int]:
        return self.proc.pid()

    def start(self, daemon: bool = False) -> "Server":
        self.proc.argv = self.argv()
        self.proc.start(daemon)
        return self

    def wait_ready(self, timeout: float, deadline: Optional[float] = None) -> None:
        """Until /-/ready answers: ``timeout`` seconds, or until the monotonic ``deadline`` when one
        is given (a wait shared with another server; the message still says ``timeout``)."""
        left = (deadline if deadline is not None else time.monotonic() + timeout) - time.monotonic()
        wait_serving(self.proc, f"{self.url}/-/ready", self.kind, left, timeout)

    def launch(self, timeout: float = 30.0, daemon: bool = False) -> "Server":
        self.start(daemon)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        self.proc.stop(grace)


def prometheus(config: PathLike, data: PathLike, log_file: PathLike, **kw) -> Server:
    return Server("prometheus", config, data, log_file, **kw)


def alertmanager(config: PathLike, data: PathLike, log_file: PathLike, **kw) -> Server:
    return Server("alertmanager", config, data, log_file, **kw)
