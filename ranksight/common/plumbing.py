"""Process and HTTP plumbing shared by the launchers, the benchmarks and the tests (torch-free).

Ports
    ``free_port(udp=False) -> int``: a port free on 127.0.0.1 now (bind port 0).
    ``port_in_use(port, host) -> bool``: a TCP listener could not bind host:port.
Waiting
    ``wait_until(predicate, timeout, interval) -> value | None``: poll until truthy;
    ``wait_for(predicate, timeout, what)`` raises WaitTimeout (an AssertionError) naming ``what``;
    a predicate raises ``GiveUp`` to end either wait at once.
    ``wait_http(url, timeout, popen) -> (ok, exit code)``: poll a server until it answers or exits.
Processes
    ``pdeathsig(sig)``: a ``preexec_fn`` that has the child get ``sig`` when its parent dies
    (Linux PR_SET_PDEATHSIG); ``set_pdeathsig`` is ``pdeathsig(SIGTERM)`` ready to pass.
    ``spawn(argv, log_path, ...) -> Popen``: start a server with its output in a log, in its
    own session, dying with its parent unless ``daemon``; ``stop_process(popen, grace)``:
    SIGTERM, SIGKILL after ``grace`` s. ``Proc(argv, log_file, env, ...)``: the one child-process
    handle of the launchers, benchmarks and tests (start, alive, wait, signal, text, tail, stop; a
    pid file and a daemon that outlives its parent for ``ranksight stack``). ``pid_alive``,
    ``cmdline``, ``last_line``.
HTTP
    ``http_get(url, timeout) -> bytes``. ``PrometheusAPI(url, timeout)``: the one Prometheus HTTP
    client (instant and range queries, rules, alerts, targets, timed streaming queries, its own
    /metrics). ``AlertmanagerAPI(url, timeout)``: the one Alertmanager client (alerts incl.
    inhibited, posting alerts). Both raise ``ApiError`` with one line for the user.
    ``connect(url, timeout) -> PrometheusAPI``: the client for a ``--prometheus URL`` option;
    ``UsageError`` (an ApiError) names the option when the URL is not one.
"""
from __future__ import annotations

import ctypes
import json
import logging
import math
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
STOP_GRACE_SECONDS = 10.0
PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------ ports and waiting
def free_port(udp: bool = False) -> int:
    """A port free on 127.0.0.1 now (the kernel picks it). Another process may take it
    before you bind it; callers that start servers retry or report the clash."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP listener could not bind host:port (SO_REUSEADDR like Go's net.Listen)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class GiveUp(AssertionError):
    """Raised by a predicate to end wait_until/wait_for at once (the process it waits on exited)."""


def _poll(predicate: Callable[[], T], timeout: float, interval: float) -> Tuple[Optional[T], Optional[BaseException]]:
    deadline = time.monotonic() + timeout
    last: Optional[BaseException] = None
    while True:
        try:
            v = predicate()
            if v:
                return v, None
        except GiveUp:
            raise
        except Exception as e:  # noqa: BLE001 - not ready yet (connection refused, bad JSON, no series...)
            last = e
        if time.monotonic() >= deadline:
            return None, last
        time.sleep(interval)


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.2) -> Optional[T]:
    """Poll predicate until it returns something truthy (returned) or timeout (None).
    Exceptions from the predicate count as 'not yet', except GiveUp, which is raised at once."""
    return _poll(predicate, timeout, interval)[0]


class WaitTimeout(AssertionError):
    """wait_for gave up. An AssertionError: a test or benchmark check that waits fails as one."""


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.2) -> T:
    """wait_until that fails: WaitTimeout naming ``what`` (and the predicate's last error)."""
    v, last = _poll(predicate, timeout, interval)
    if not v:
        raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what}"
                           + (f" (last error: {last})" if last else ""))
    return v


def wait_http(url: str, timeout: float, popen: Optional[subprocess.Popen] = None,
              interval: float = 0.1) -> Tuple[bool, Optional[int]]:
    """Poll url until it answers (True, None); (False, exit code) as soon as popen has exited;
    (False, None) after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if popen is not None and popen.poll() is not None:
            return False, popen.returncode
        try:
            http_get(url, min(5.0, max(timeout, 0.5)))
            return True, None
        except (OSError, urllib.error.URLError, ValueError):
            pass
        if time.monotonic() > deadline:
            return False, None
        time.sleep(interval)


# ------------------------------------------------------------------ processes
def pdeathsig(sig: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A preexec_fn: the child gets ``sig`` when the thread that started it exits (Linux
    PR_SET_PDEATHSIG; SIGKILL also covers a parent killed by SIGKILL). prctl is looked up here,
    in the parent: the child only makes the call. None where libc has no prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, sig)

    return child


def set_pdeathsig() -> None:
    """preexec_fn: the child gets SIGTERM when its parent dies (Linux). Runs between fork and exec."""
    fn = pdeathsig(signal.SIGTERM)
    if fn is not None:
        fn()


def _proc_state(pid: int) -> Optional[str]:
    """Process state letter from /proc (R, S, D, Z, ...), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True while pid is a running (non-zombie) process."""
    st = _proc_state(pid)
    return st is not None and st not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def last_line(path: Path, default: str = "") -> str:
    """Last non-empty line of a log file (for one-line error reports)."""
    try:
        lines = [ln.strip() for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return default
    return lines[-1] if lines else default


def spawn(argv: Sequence[str], log_path: Path, *, daemon: bool = False, nice: int = 0,
          deathsig: int = signal.SIGTERM, env: Optional[Mapping[str, str]] = None,
          cwd: Optional[os.PathLike] = None) -> subprocess.Popen:
    """Start a server process: stdin closed, stdout and stderr appended to log_path, its own
    session (and process group); unless ``daemon``, it gets ``deathsig`` when its parent dies.
    ``nice`` is added to its niceness."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    death = None if daemon else pdeathsig(deathsig)

    def preexec() -> None:
        if nice:
            os.nice(nice)
        if death is not None:
            death()

    with open(log_path, "ab") as logf:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True, env=dict(env) if env is not None else None, cwd=cwd,
                                close_fds=True, preexec_fn=preexec if (nice or death is not None) else None)


def _signal(popen: subprocess.Popen, sig: int, group: bool) -> None:
    try:
        if group:
            os.killpg(popen.pid, sig)  # spawn() made the child a group leader
        else:
            popen.send_signal(sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_process(popen: subprocess.Popen, grace: float = STOP_GRACE_SECONDS, name: str = "",
                 group: bool = False) -> Optional[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds; waits for it and returns its exit code.
    ``group``: signal its whole process group (its workers and helpers too), and SIGKILL what of
    the group is left once the leader has exited."""
    if popen.poll() is None:
        _signal(popen, signal.SIGTERM, group)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", name or popen.args, popen.pid, grace)
    if group or popen.poll() is None:
        _signal(popen, signal.SIGKILL, group)
    try:
        popen.wait(5.0)
    except subprocess.TimeoutExpired:
        log.error("%s (pid %d) did not die", name or popen.args, popen.pid)
    return popen.returncode


@dataclass
class Proc:
    """One child process with its output in a log file, started by ``start`` (``spawn``: its own
    session, dying with the thread that started it unless started as a daemon). A daemon's pid
    file, and the ``marker`` its command line must contain (against pid reuse), find it again
    from another process (``ranksight stack down``)."""
    argv: List[str]
    log_file: Path
    env: Optional[Mapping[str, str]] = None  # the child's whole environment; None: this process's
    name: str = ""  # in log lines; the command line when empty
    pid_file: Optional[Path] = None
    marker: str = ""
    cwd: Optional[Path] = None
    nice: int = 0  # added to the child's niceness
    deathsig: int = signal.SIGTERM  # what it gets when the starting thread dies
    group: bool = False  # stop() signals its whole process group (its workers and helpers too)
    fresh_log: bool = False  # start() empties the log instead of appending to it
    popen: Optional[subprocess.Popen] = field(default=None, repr=False)

    def start(self, daemon: bool = False) -> "Proc":
        if self.fresh_log:
            Path(self.log_file).parent.mkdir(parents=True, exist_ok=True)
            Path(self.log_file).write_bytes(b"")
        self.popen = spawn(self.argv, self.log_file, daemon=daemon, nice=self.nice, deathsig=self.deathsig,
                           env=self.env, cwd=self.cwd)
        if self.pid_file is not None:
            self.pid_file.write_text(f"{self.popen.pid}\n")
        return self

    def pid(self) -> Optional[int]:
        """The live pid of this process (from Popen or the pid file), None when not running."""
        if self.popen is not None:
            return self.popen.pid if self.popen.poll() is None else None
        try:
            pid = int(self.pid_file.read_text().strip()) if self.pid_file is not None else 0
        except (OSError, ValueError):
            return None
        if pid and pid_alive(pid) and self.marker in cmdline(pid):
            return pid
        return None

    def alive(self) -> bool:
        return self.pid() is not None

    def exited(self) -> Optional[int]:
        """Exit code when the process we started has exited, else None."""
        return None if self.popen is None else self.popen.poll()

    def wait(self, timeout: float) -> int:
        """Its exit code once it exits (subprocess.TimeoutExpired after ``timeout`` s)."""
        assert self.popen is not None, f"{self.name or self.argv} was not started"
        return self.popen.wait(timeout=timeout)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process (not its group) while it runs."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)

    def text(self) -> str:
        """Its whole log."""
        return Path(self.log_file).read_text(errors="replace")

    def tail(self, n: int = 2000) -> str:
        """The last ``n`` bytes of its log ("" when there is none)."""
        try:
            return Path(self.log_file).read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM (to its group with ``group``), SIGKILL after ``grace`` seconds; a daemon found by
        its pid file is signalled by pid. The pid file is removed."""
        if self.popen is not None:
            stop_process(self.popen, grace, self.name, group=self.group)
        else:
            pid = self.pid()
            for sig in (signal.SIGTERM, signal.SIGKILL) if pid is not None else ():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                if wait_until(lambda: not pid_alive(pid), grace, 0.05):
                    break
                log.warning("%s (pid %d) ignored SIGTERM for %.0f s; killing it", self.name, pid, grace)
        if self.pid_file is not None:
            try:
                self.pid_file.unlink()
            except FileNotFoundError:
                pass


# ------------------------------------------------------------------ HTTP
class ApiError(RuntimeError):
    """One line for the user: the server is unreachable, refused the request or is not what we expected."""


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - URLs we were given or built
        return r.read()


def _check_url(url: str, what: str) -> str:
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ApiError(f"expected an http(s) URL for {what} like http://localhost:9090, got {url!r}")
    return url.rstrip("/")


@dataclass(frozen=True)
class Sample:
    """One sample of an instant vector."""
    labels: Dict[str, str]
    value: float

    def key(self, names: Sequence[str]) -> Tuple[str, ...]:
        return tuple(self.labels.get(n, "") for n in names)


class PrometheusAPI:
    """Prometheus' HTTP API over urllib. Queries are POSTed (long expressions fit)."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = _check_url(url, "Prometheus")
        self.timeout = timeout

    # ------------------------------------------------------------ requests
    def _request(self, path: str, params: Optional[Mapping[str, Any]] = None, post: bool = False,
                 expr: str = "") -> Any:
        q = urllib.parse.urlencode(params or {})
        if post:
            req = urllib.request.Request(f"{self.url}{path}", data=q.encode(),
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        else:
            req = urllib.request.Request(f"{self.url}{path}" + (f"?{q}" if q else ""))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 - the given Prometheus
                doc = json.load(r)
        except urllib.error.HTTPError as e:
            raise ApiError(self._http_error(e, path, expr)) from None
        except (urllib.error.URLError, OSError) as e:
            raise ApiError(f"cannot reach Prometheus at {self.url}: {getattr(e, 'reason', e)}") from None
        except ValueError:
            raise ApiError(f"{self.url} did not answer with Prometheus API JSON (is it Prometheus?)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            err = doc.get("error") if isinstance(doc, dict) else doc
            raise ApiError(f"Prometheus at {self.url} refused {path}: {err}")
        return doc.get("data", {})

    def _http_error(self, e: urllib.error.HTTPError, path: str, expr: str) -> str:
        try:
            msg = json.load(e).get("error", "")
        except (ValueError, AttributeError, OSError):
            msg = ""
        if expr and e.code in (400, 422):
            return f"Prometheus at {self.url} rejected the query ({msg or e.reason}): {expr[:200]}"
        return f"Prometheus at {self.url} answered HTTP {e.code} {e.reason} for {path}{': ' + msg if msg else ''}"

    # ------------------------------------------------------------ calls
    def ready(self) -> bool:
        try:
            return b"Ready" in http_get(f"{self.url}/-/ready", min(self.timeout, 5.0))
        except (OSError, urllib.error.URLError):
            return False

    def query(self, expr: str, at: Optional[float] = None) -> List[Dict[str, Any]]:
        """Instant query: [{"metric": {...}, "value": [t, "v"]}] (a scalar comes back as one such)."""
        params: Dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._request("/api/v1/query", params, post=True, expr=expr)
        kind = data.get("resultType")
        if kind in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        if kind != "vector":
            raise ApiError(f"Prometheus at {self.url} returned a {kind} for an instant query")
        return data.get("result", [])

    def samples(self, expr: str, at: Optional[float] = None) -> List[Sample]:
        """Instant query as finite samples (NaN and Inf dropped)."""
        out = []
        for r in self.query(expr, at):
            v = float(r["value"][1])
            if math.isfinite(v):
                out.append(Sample(dict(r.get("metric", {})), v))
        return out

    def value(self, expr: str, at: Optional[float] = None) -> Optional[float]:
        """The first sample's value, None when the result is empty."""
        res = self.query(expr, at)
        return float(res[0]["value"][1]) if res else None

    def query_range(self, expr: str, start: float, end: float,
                    step: float) -> List[Tuple[Dict[str, str], List[Tuple[float, float]]]]:
        """Range query: [(labels, [(t, v), ...]), ...], non-finite values dropped."""
        data = self._request("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                     "step": f"{step:g}"}, post=True, expr=expr)
        out = []
        for r in data.get("result", []):
            pts = [(float(t), float(v)) for t, v in r.get("values", [])]
            out.append((dict(r.get("metric", {})), [(t, v) for t, v in pts if math.isfinite(v)]))
        return out

    def rules(self, type: Optional[str] = None) -> List[Dict[str, Any]]:
        """Rule groups as /api/v1/rules returns them (``type``: "alert" or "record")."""
        return self._request("/api/v1/rules", {"type": type} if type else None)["groups"]

    def rule_names(self) -> List[str]:
        return [r["name"] for g in self.rules() for r in g["rules"]]

    def alerts(self) -> List[Dict[str, Any]]:
        """Pending and firing alerts: [{"labels", "annotations", "state", "activeAt", "value"}] (vmalert,
        and VictoriaMetrics proxying it, answer null for none)."""
        return self._request("/api/v1/alerts")["alerts"] or []

    def targets(self) -> List[Dict[str, Any]]:
        return self._request("/api/v1/targets", {"state": "active"})["activeTargets"]

    def own_metrics(self) -> Dict[str, float]:
        """Prometheus' own /metrics: 'name{labels}' -> value."""
        try:
            text = http_get(self.url + "/metrics", self.timeout).decode()
        except (OSError, urllib.error.URLError) as e:
            raise ApiError(f"cannot read {self.url}/metrics: {getattr(e, 'reason', e)}") from None
        out: Dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
        return out

    def timed(self, path: str, params: Mapping[str, str]) -> Tuple[float, Dict[str, Any]]:
        """POST a query and time it: (wall seconds until the whole body arrived, info). The body is
        streamed and only counted (a fleet-wide panel can return a gigabyte of JSON); info holds
        status, error, series, points and bytes. Errors come back in info, never raised."""
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        t0 = time.perf_counter()
        head = b""
        size = series = points = 0
        tail = b""
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 - the given Prometheus
                while True:
                    chunk = r.read(1 << 20)
                    if not chunk:
                        break
                    if len(head) < 64:
                        head += chunk[:64]
                    buf = tail + chunk
                    series += buf.count(b'"metric":')
                    points += buf.count(b'"]')  # a [ts,"value"] pair ends with "]
                    tail = buf[-16:]
                    # what `tail` overlaps was counted already; subtract matches inside it
                    series -= tail.count(b'"metric":')
                    points -= tail.count(b'"]')
                    size += len(chunk)
            series += tail.count(b'"metric":')
            points += tail.count(b'"]')
            wall = time.perf_counter() - t0
            ok = head.startswith(b'{"status":"success"')
            info = {"status": "success" if ok else "error", "error": None if ok else head.decode(errors="replace"),
                    "series": series, "points": points, "bytes": size}
        except urllib.error.HTTPError as e:
            wall = time.perf_counter() - t0
            try:
                doc = json.loads(e.read())
            except ValueError:
                doc = {"error": f"HTTP {e.code}"}
            info = {"status": "error", "error": doc.get("error"), "series": 0, "points": 0, "bytes": 0}
        except (urllib.error.URLError, OSError) as e:
            wall = time.perf_counter() - t0
            info = {"status": "error", "error": str(e), "series": 0, "points": 0, "bytes": 0}
        return wall, info


class UsageError(ApiError):
    """One line about an option the user gave (a URL that is not one); exit 2."""


def connect(url: str, timeout: float) -> PrometheusAPI:
    """The Prometheus client for --prometheus URL; UsageError (one line) on a bad URL."""
    try:
        return PrometheusAPI(url, timeout)
    except ApiError as e:
        raise UsageError(f"--prometheus: {e}") from None


class AlertmanagerAPI:
    """Alertmanager's v2 HTTP API over urllib."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = _check_url(url, "Alertmanager")
        self.timeout = timeout

    def ready(self) -> bool:
        try:
            http_get(f"{self.url}/-/ready", min(self.timeout, 2.0))
            return True
        except (OSError, urllib.error.URLError):
            return False

    def alerts(self) -> List[Dict[str, Any]]:
        """/api/v2/alerts incl. inhibited and silenced ones: each has labels, fingerprint and
        status {state: active|suppressed, inhibitedBy: [fingerprints], silencedBy: [...]}."""
        q = urllib.parse.urlencode({"active": "true", "inhibited": "true", "silenced": "true",
                                    "unprocessed": "true"})
        try:
            return json.loads(http_get(f"{self.url}/api/v2/alerts?{q}", self.timeout))
        except (OSError, urllib.error.URLError, ValueError) as e:
            raise ApiError(f"cannot read alerts from Alertmanager at {self.url}: {getattr(e, 'reason', e)}") from None

    def inhibited_names(self) -> List[str]:
        return sorted({a["labels"].get("alertname", "") for a in self.alerts() if a["status"].get("inhibitedBy")})

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """POST /api/v2/alerts: [{"labels": {...}, "annotations": {...}, "startsAt": ..., ...}]."""
        req = urllib.request.Request(f"{self.url}/api/v2/alerts", data=json.dumps(list(alerts)).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout):  # noqa: S310 - the given Alertmanager
                pass
        except (OSError, urllib.error.URLError) as e:
            raise ApiError(f"cannot post alerts to Alertmanager at {self.url}: {getattr(e, 'reason', e)}") from None
