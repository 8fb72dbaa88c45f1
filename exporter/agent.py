"""The node agent: wires ingest, the rank table, the collectors and the HTTP server.

Threads: one ingest receiver, one checker (heartbeat misses, stalls, TTL; it
runs four times per heartbeat interval), the GPU sampler and XID threads, and
the HTTP server (one thread per connection, so a slow client cannot block
Prometheus; with a web config the TLS handshake and basic auth run on that thread too,
see webconfig.py; so does a request to end a job's workers, grace included, see
workers.py). A scrape runs every enabled collector in turn; the GPU collector
only reads what its sampler stored.
"""
from __future__ import annotations

import errno
import gzip
import hmac
import json
import logging
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry

from ranksight import catalog as C
from ranksight import config
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from .collectors import CollectorError, Context, Family, PartialError, build
from .collectors.agent_health import AgentHealthCollector
from .collectors.gpu import GpuCollector
from .exposition import TextWriter
from ranksight.address import parse_address

from .ingest import Ingest, IngestError, Receiver
from .ranks import RANKS_API, RankSettings, RankTable
from .webconfig import Gate, WebConfig, WebConfigError
from .workers import END_API, MAX_BODY, REFUSED_CODE, Access, Counts, bearer
from . import workers

log = logging.getLogger("ranksight.exporter")

COLLECTORS = C.COLLECTOR_NAMES
CHECK_MIN_PERIOD = 0.02
CHECK_MAX_PERIOD = 1.0


class AgentError(Exception):
    """The agent cannot start (port in use, bad address); the message is the one line."""


_AGENT = config.defaults()["agent"]  # every default below is the config's (ranksight/config.py)
_THRESHOLDS = config.defaults()["thresholds"]


@dataclass
class AgentSettings:
    node: str
    listen: str = _AGENT["listen"]
    ingest: str = _AGENT["ingest"]
    procfs: str = _AGENT["procfs"]
    sysfs: str = _AGENT["sysfs"]
    collectors: Tuple[str, ...] = tuple(c.strip() for c in _AGENT["collectors"].split(","))
    watch_paths: List[str] = field(default_factory=lambda: list(_AGENT["watch_paths"]))
    ranks: RankSettings = field(default_factory=RankSettings)
    gpu_poll_seconds: float = _AGENT["gpu_poll_seconds"]
    gpu_state_seconds: float = _AGENT["gpu_state_seconds"]
    gpu_window_seconds: float = _AGENT["gpu_window_seconds"]
    gpu_swing_high: float = _THRESHOLDS["gpu_swing_high"]
    gpu_swing_low: float = _THRESHOLDS["gpu_swing_low"]
    nic_include: str = _AGENT["nic_include"]
    nic_exclude: str = _AGENT["nic_exclude"]
    rdma_counters: Union[str, List[str]] = _AGENT["rdma_counters"]  # agent.rdma_counters: curated | all | names
    peak_flops_dtype: str = _AGENT["peak_flops_dtype"]  # the MFU denominator (exporter/peak.py)
    peak_tflops: float = _AGENT["peak_tflops"]
    peak_tflops_by_name: Dict[str, float] = field(default_factory=lambda: dict(_AGENT["peak_tflops_by_name"]))
    web_config: Optional[WebConfig] = None  # --web.config.file: TLS and basic auth; None: plain HTTP
    act_token: Optional[bytes] = None  # agent.act_token_file's token: POST /api/v1/ranks/end (exporter/workers.py)
    act_client_sans: Optional[List[str]] = None  # agent.act_client_sans


def parse_listen(s: str) -> Tuple[str, int]:
    """'host:port', '[v6]:port' or ':port' (all interfaces)."""
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {s!r}: expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up or fails the TLS handshake costs one debug line, not a traceback."""
        e = sys.exc_info()[1]
        if isinstance(e, (OSError, ssl.SSLError)):
            log.debug("http %s: %s", client_address[0] if client_address else "?", e)
        else:
            log.exception("http request from %s failed", client_address[0] if client_address else "?")


class _Server6(_Server):
    address_family = socket.AF_INET6


class _RegistryBridge:
    """The one custom prometheus_client collector: runs the agent's collectors at scrape time."""

    def __init__(self, agent: "Agent"):
        self.agent = agent

    def collect(self) -> Iterator[Family]:
        yield from self.agent.collect_all()


class Agent:
    def __init__(self, settings: AgentSettings, nvml: Any = None):
        self.s = settings
        self.nvml = nvml
        self.table = RankTable(settings.ranks)
        self.ingest = Ingest(self.table)
        self.receiver: Optional[Receiver] = None
        self.http: Optional[ThreadingHTTPServer] = None
        self.collectors: List[Any] = []
        self.gpu: Optional[GpuCollector] = None
        self.runs: Dict[str, Tuple[bool, float]] = {}
        self._errors: Dict[str, str] = {}
        self._runs_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.listen_address = ""
        self.gate: Optional[Gate] = None
        self.access = Access(settings.act_token, settings.act_client_sans)
        self.end_counts = Counts()
        self._end_logged: set = set()
        self.started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind the sockets and start every thread. Raises AgentError with one line on failure."""
        s = self.s
        enabled = set(s.collectors)
        try:
            if "ranks" in enabled:
                self.receiver = Receiver(parse_address(s.ingest, listen=True), self.ingest)
                self.receiver.bind()
            self._bind_http()
        except (IngestError, ValueError) as e:  # WebConfigError is a ValueError
            self._close_sockets()
            raise AgentError(str(e)) from None
        ctx = Context(s, table=self.table if "ranks" in enabled else None, nvml=self.nvml)
        for name in COLLECTORS:  # registered by name in exporter/collectors/ (gpu first: ranks joins on it)
            if name in enabled:
                c = build(name, ctx)
                if name == "gpu":
                    self.gpu = ctx.gpu = c
                self.collectors.append(c)
        self.health = AgentHealthCollector(
            s.node, self._runs_snapshot,
            self.ingest.snapshot if self.receiver else None,
            self.table.__len__ if "ranks" in enabled else None,
            (lambda: self.end_counts.snapshot(self.access.enabled)) if "ranks" in enabled else None,
        )
        self.registry.register(_RegistryBridge(self))
        list(self.collect_all())  # a first pass logs what cannot run, before the first scrape
        if self.receiver is not None:
            self.receiver.start()
            self._spawn(self._check_loop, "rank-checker")
        assert self.http is not None
        self._spawn(self.http.serve_forever, "http")
        self.started = True
        scheme = "https" if self.gate is not None and self.gate.tls else "http"
        web = f" ({self.s.web_config.describe()})" if self.s.web_config is not None else ""
        log.info("serving %s://%s/metrics%s", scheme, self.listen_address, web)
        if self.access.enabled:
            log.info("ending a job's workers on request: %s%s (%s)", END_API, "" if "ranks" in enabled else
                     " (no ranks tracked: the ranks collector is off)", " and ".join(
                         w for w, on in (("bearer token", self.access.token is not None),
                                         ("client certificate SAN", self.access.sans is not None)) if on))
        if self.receiver is not None:
            creds = "" if self.receiver.bound.kind != "unix" else \
                f"; sender credentials checked, queue {self.receiver.qlen} datagrams"
            log.info("ingest on %s (SO_RCVBUF %d bytes%s)", self.receiver.bound, self.receiver.rcvbuf, creds)

    def _bind_http(self) -> None:
        host, port = parse_listen(self.s.listen)
        cls = _Server6 if ":" in host else _Server
        if self.s.web_config is not None:
            self.gate = Gate(self.s.web_config)  # the files may have changed since the config was checked
        handler = _make_handler(self)
        try:
            self.http = cls((host, port), handler)
        except OSError as e:
            why = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise AgentError(f"cannot listen on {self.s.listen}: {why}") from None
        h, p = self.http.server_address[:2]
        self.listen_address = f"[{h}]:{p}" if ":" in str(h) else f"{h}:{p}"

    def _spawn(self, target, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        if self.http is not None and self.started:
            self.http.shutdown()
        if self.receiver is not None:
            self.receiver.stop()
        if self.gpu is not None:
            self.gpu.stop()
        for t in self._threads:
            t.join(timeout=5)
        self._close_sockets()
        self.started = False

    def _close_sockets(self) -> None:
        if self.http is not None:
            self.http.server_close()
        if self.receiver is not None and self.receiver.sock is not None:
            self.receiver.stop()

    def _check_loop(self) -> None:
        table = self.table
        while True:
            table.check(time.monotonic())
            period = min(CHECK_MAX_PERIOD, max(CHECK_MIN_PERIOD, table.min_interval() / 4.0))
            if self._stop.wait(period):
                return

    def healthy(self) -> Tuple[bool, str]:
        if self.receiver is not None and not self.receiver.alive():
            return False, "ingest thread is not running"
        return True, "ok"

    # ------------------------------------------------------------------ ending a job's workers
    def end_workers(self, header: Optional[str], cert: Optional[Dict[str, Any]], tls: bool, peer: str,
                    body: bytes) -> Tuple[int, Dict[str, Any]]:
        """POST /api/v1/ranks/end on its connection's thread (exporter/workers.py): (status, JSON answer)."""
        refused = self.access.check(header, cert, tls, peer)
        if not refused and self.access.token is None and self.gate is not None and not self.gate.authorized(header):
            refused = C.END_UNAUTHORIZED  # client SANs alone: the web config's basic auth still applies
        if refused:
            self.end_counts.add(refused)
            if refused not in self._end_logged:  # once per kind: a flood must not flood the log
                self._end_logged.add(refused)
                log.warning("refused to end workers for %s: %s (counted; logged once)", peer, Access.why(refused))
            return REFUSED_CODE[refused], {"error": Access.why(refused)}
        code, doc, result = workers.serve(body, self.table.describe(time.monotonic()))
        self.end_counts.add(result)
        log.log(logging.WARNING if code == 200 else logging.INFO, "end workers for %s: %s", peer,
                doc.get("detail") or doc.get("error"))
        return code, doc

    # ------------------------------------------------------------------ scrape
    def _runs_snapshot(self) -> Dict[str, Tuple[bool, float]]:
        with self._runs_lock:
            return dict(self.runs)

    def collect_all(self) -> Iterator[Family]:
        for c in self.collectors:
            t0 = time.perf_counter()
            ok = True
            fams: List[Family] = []
            try:
                fams = c.collect()
            except PartialError as e:
                ok, fams = False, e.families
                self._note(c.name, str(e))
            except CollectorError as e:
                ok = False
                self._note(c.name, str(e))
            except Exception as e:  # a collector bug must not take the scrape down
                ok = False
                if self._note(c.name, f"failed: {type(e).__name__}: {e}"):
                    log.exception("collector %s raised", c.name)
            else:
                self._note(c.name, "")
            dur = time.perf_counter() - t0
            if c is self.gpu:
                dur = c.poll_duration  # its real work runs on the sampler thread
            with self._runs_lock:
                self.runs[c.name] = (ok, dur)
            yield from fams
        yield from self.health.collect()

    def _note(self, name: str, error: str) -> bool:
        """Log a collector's failure once per distinct message (and its recovery); True when logged."""
        with self._runs_lock:  # concurrent scrapes: log a change once
            prev = self._errors.get(name, "")
            if error == prev:
                return False
            self._errors[name] = error
        if error:
            log.warning("collector %s down: %s", name, error)
        else:
            log.info("collector %s up", name)
        return True


def _make_handler(agent: Agent):
    registry = agent.registry
    writer = TextWriter()
    gate = agent.gate
    extra_headers = gate.headers if gate is not None else []

    class Handler(BaseHTTPRequestHandler):
        server_version = "ranksight-agent"
        protocol_version = "HTTP/1.1"
        timeout = 30  # a client that stalls mid-request holds only its own thread, and not for long

        def setup(self) -> None:
            if gate is not None and gate.tls:
                # The handshake runs here, on this connection's thread, under the request timeout:
                # a client that never finishes it holds only its own thread.
                raw = self.request
                raw.settimeout(self.timeout)
                conn = gate.context().wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                try:
                    conn.do_handshake()
                    if not gate.san_ok(conn.getpeercert()):
                        raise ssl.SSLError("client certificate has none of client_allowed_sans")
                except BaseException:
                    conn.close()
                    raise
                self.request = conn
            super().setup()
            # headers and body are two writes: without NODELAY, Nagle + delayed ACK add 40 ms
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def finish(self) -> None:
            try:
                super().finish()
            finally:
                if isinstance(self.request, ssl.SSLSocket):  # the server closes only the raw socket it accepted
                    self.request.close()

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            if gate is not None:
                if not gate.allow():
                    self._send(429, b"Too Many Requests\n", "text/plain; charset=utf-8")
                    return
                if not self._authorized():
                    self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8", auth=True)
                    return
            path = urlsplit(self.path).path
            if path == "/metrics":
                # Always the classic text format (as node_exporter serves by default): nothing here needs
                # OpenMetrics (no exemplars, no _created), and its encoder costs ~4x the time.
                ctype = CONTENT_TYPE_PLAIN_0_0_4
                body = writer.render(registry.collect())
                enc = None
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body, compresslevel=1)
                    enc = "gzip"
                self._send(200, body, ctype, enc)
            elif path == "/healthz":
                ok, why = agent.healthy()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
            elif path == RANKS_API:  # each rank's state and its last stack (the stalled rank's place)
                doc = {"ranks": agent.table.describe(time.monotonic())}
                self._send(200, json.dumps(doc).encode(), "application/json")
            elif path == "/":
                self._send(200, b'<html><body><h1>ranksight agent</h1><a href="/metrics">/metrics</a> '
                                b'<a href="/healthz">/healthz</a></body></html>\n', "text/html")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _authorized(self) -> bool:
            """The web config's basic auth, or the bearer token of agent.act_token_file in its place."""
            header = self.headers.get("Authorization")
            token = agent.access.token
            return (token is not None and hmac.compare_digest(bearer(header), token)) or gate.authorized(header)

        def do_POST(self) -> None:  # noqa: N802 (http.server naming)
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self.close_connection = True
                self._send(413 if length > MAX_BODY else 400, b"bad Content-Length\n", "text/plain; charset=utf-8")
                return
            body = self.rfile.read(length)
            if urlsplit(self.path).path != END_API:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
                return
            if gate is not None and not gate.allow():
                self._send(429, b"Too Many Requests\n", "text/plain; charset=utf-8")
                return
            tls = isinstance(self.request, ssl.SSLSocket)
            code, doc = agent.end_workers(self.headers.get("Authorization"), self.request.getpeercert() if tls else None,
                                          tls, self.client_address[0], body)
            self._send(code, json.dumps(doc).encode(), "application/json")

        def _send(self, code: int, body: bytes, ctype: str, encoding: Optional[str] = None,
                  auth: bool = False) -> None:
            self.send_response(code)
            for k, v in extra_headers:
                self.send_header(k, v)
            if auth:
                self.send_header("WWW-Authenticate", "Basic")
            self.send_header("Content-Type", ctype)
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("http %s - %s", self.address_string(), format % args)

    return Handler
