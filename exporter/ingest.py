"""Datagram ingest: one receiver thread per socket (UDP or unix datagram).

Every datagram is validated by ``ranksight.protocol.decode`` and applied to the
rank table, or dropped and counted:
``ranksight_ingest_datagrams_total{result=ok|malformed|oversize|rejected|overflow}``.

The receive loop drains the socket in a tight non-blocking loop, then sleeps
before looking again, so that datagrams are handled in batches. A record handled
right after others costs a third of the CPU of one handled after a pause (warm
caches: 127 against 378 us for a 3.7 KB "steps" record after 50 ms, on the 2-core
CPU box: bench/bench_ingest_gap.py), so the agent wakes rarely: at the hooks'
rate of 8 ranks (about 30 datagrams/s) every IDLE_SLEEP_MAX, twice a second. The sleep adapts to the
arrival rate so that a batch fills at most a quarter of SO_RCVBUF (asked large:
32 MB where allowed, which holds ~7,000 full datagrams), between IDLE_SLEEP_MIN
and IDLE_SLEEP_MAX; a stop wakes it at once. A unix datagram socket queues at most
net.unix.max_dgram_qlen datagrams whatever its SO_RCVBUF (10 by the kernel's default, 512
where systemd sets it): there a batch is a quarter of that queue, and when that leaves less than
IDLE_SLEEP_MIN to sleep the receiver wakes for every arrival instead. The agent warns at startup
when the queue is shorter than UNIX_QLEN_WARN.

Sender credentials (unix socket only). UDP cannot tell who sent a datagram: any local user can
speak for any rank. On the unix socket the agent sets SO_PASSCRED and the kernel attaches the
sender's pid and uid (SCM_CREDENTIALS; a process cannot claim another's without CAP_SYS_ADMIN /
CAP_SETUID). A record is ``rejected`` when

- its ``pid`` is not the sender's: neither the pid the agent sees nor, for a sender in a nested
  PID namespace (a container), one of its pids there (``NSpid`` in /proc/PID/status, re-read at
  most once a second per sender); a sender whose pid the agent cannot see at all (pid 0) fails;
- its job belongs to another uid: the first uid to speak for a job owns it while the rank table
  tracks the job (its ranks live or linger); afterwards the name is free again. uid 0 may speak
  for every job and owns the jobs it starts, so no user can speak into a root-run job.

The socket file is made mode 0666 so every local user's ranks can send; the checks above, not the
file mode, decide whose records count.
"""
from __future__ import annotations

import errno
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from ranksight import catalog as C
from ranksight.address import Address
from ranksight.protocol import ACCEPTED, MAX_DATAGRAM, ProtocolError, decode

from .ranks import RECEIVE_DELAY_MAX, RankTable

log = logging.getLogger("ranksight.exporter.ingest")

RESULTS = C.INGEST_RESULTS
RCVBUF_BYTES = 32 << 20
IDLE_SLEEP_MIN = 0.005  # between drains, seconds: at high rates ...
IDLE_SLEEP_MAX = RECEIVE_DELAY_MAX  # ... and at low rates (records wait at most this long; the heartbeat check allows for it)
BYTES_PER_QUEUED = 8192  # a batch may fill SO_RCVBUF up to rcvbuf / this many datagrams (a full 4 KB "steps" datagram's truesize)
STOP_POLL = 0.2  # how often a waiting receiver checks for stop
UNIX_QLEN_FILE = "/proc/sys/net/unix/max_dgram_qlen"
UNIX_QLEN_DEFAULT = 10  # the kernel's default, assumed when the file cannot be read
UNIX_QLEN_WARN = 512
SOCKET_MODE = 0o666  # unix socket: every local user may send (credentials decide what counts)
MAX_OWNERS = 4096  # job -> uid entries kept (at least 2 x max_jobs); beyond it, untracked jobs are forgotten
NSPID_REFRESH = 1.0  # seconds between two reads of one sender's /proc/PID/status
MAX_NSPID = 4096  # senders whose namespace pids are remembered
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
CRED_SPACE = socket.CMSG_SPACE(_UCRED.size) if hasattr(socket, "CMSG_SPACE") else 0


class IngestError(Exception):
    """Cannot bind the ingest socket; the message is the one line for the user."""


class Ingest:
    """Validates and applies datagrams; counts every one under exactly one result."""

    def __init__(self, table: RankTable, clock: Callable[[], float] = time.monotonic):
        self.table = table
        self.clock = clock
        self.counts: Dict[str, int] = dict.fromkeys(RESULTS, 0)
        self.bugs = 0  # exceptions other than ProtocolError (must stay 0; counted as rejected)
        self._bug_logged = False
        self._versions_logged: set = set()  # unknown protocol versions already logged (bounded)
        self.owners: Dict[str, int] = {}  # job -> uid that speaks for it (unix socket only)
        self.max_owners = max(MAX_OWNERS, 2 * table.s.max_jobs)
        self.forged: Dict[str, int] = dict.fromkeys(C.INGEST_FORGED_REASONS, 0)  # rejected by the checks
        self._nspid: Dict[int, Tuple[float, Tuple[int, ...]]] = {}  # sender pid -> (read at, its pids)
        self._forged_logged: set = set()

    def handle(self, data: bytes, now: float, ancdata: Optional[List[Tuple[int, int, bytes]]] = None) -> str:
        """Validate and apply one datagram; returns its result label. ``ancdata`` (unix socket): the
        recvmsg ancillary data, with the kernel's SCM_CREDENTIALS of the sender, checked first."""
        try:
            rec = decode(data, phases=False)
        except ProtocolError as e:
            res = e.result
            v = e.version
            if v is not None and v not in self._versions_logged and len(self._versions_logged) < 16:
                self._versions_logged.add(v)
                log.warning("datagrams of protocol version %r rejected: this agent reads versions %s (upgrade the "
                            "agent to read newer hooks)", v, ", ".join(map(str, ACCEPTED)))
            self.counts[res] += 1
            return res
        except Exception:  # a decoder bug must cost a datagram, never the receive thread
            self._bug()
            self.counts[C.INGEST_REJECTED] += 1
            return C.INGEST_REJECTED
        why = self._forged(rec, ancdata) if ancdata is not None else ""
        if why:
            self.forged[why] += 1
            res = C.INGEST_REJECTED
            if why not in self._forged_logged:  # once per kind: a forger must not flood the log
                self._forged_logged.add(why)
                log.warning("rejected a record for job %r rank %d: %s (counted as rejected; logged once)",
                            rec["job"], rec["rank"], {"pid": "its pid is not the sender's",
                                                      "job": "the job belongs to another user",
                                                      "nocred": "no sender credentials"}[why])
        else:
            try:
                res = self.table.apply(rec, now)
            except Exception:  # an agent bug must cost a datagram, never the agent
                self._bug()
                res = C.INGEST_REJECTED
        self.counts[res] += 1
        return res

    def _bug(self) -> None:
        self.bugs += 1
        if not self._bug_logged:
            self._bug_logged = True
            log.exception("datagram handling failed (dropped, counted as rejected; logged once)")

    def _forged(self, rec: dict, ancdata: List[Tuple[int, int, bytes]]) -> str:
        """'' when the sender may send this record, else why not: 'pid', 'job' or 'nocred'."""
        cred = None
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(raw) >= _UCRED.size:
                cred = _UCRED.unpack_from(raw)
        if cred is None:
            return "nocred"
        pid, uid, _ = cred
        if pid == 0 or (rec["pid"] != pid and rec["pid"] not in self._namespace_pids(pid)):
            return "pid"
        rec["lpid"] = pid  # the pid the agent sees: the one it may signal (exporter/workers.py)
        job = rec["job"]
        owner = self.owners.get(job)
        if owner == uid:
            return ""
        if owner is not None and job in self.table.jobs:  # owned while the table tracks the job
            return "" if uid == 0 else "job"
        if len(self.owners) >= self.max_owners:
            live = self.table.jobs
            self.owners = {j: u for j, u in self.owners.items() if j in live}
        self.owners[job] = uid
        return ""

    def _namespace_pids(self, pid: int) -> Tuple[int, ...]:
        """The sender's pids in its nested PID namespaces (NSpid), re-read at most every NSPID_REFRESH."""
        now = time.monotonic()
        hit = self._nspid.get(pid)
        if hit is not None and now - hit[0] < NSPID_REFRESH:
            return hit[1]
        pids: Tuple[int, ...] = ()
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"NSpid:"):
                        pids = tuple(int(x) for x in line.split()[1:])
                        break
        except (OSError, ValueError):
            pass
        if len(self._nspid) >= MAX_NSPID:
            self._nspid.clear()
        self._nspid[pid] = (now, pids)
        return pids

    def snapshot(self) -> Dict[str, int]:
        return dict(self.counts)


class Receiver:
    """Owns one bound datagram socket and its receive thread."""

    def __init__(self, address: Address, ingest: Ingest):
        self.address = address
        self.ingest = ingest
        self.sock: Optional[socket.socket] = None
        self.bound: Address = address
        self.rcvbuf = 0
        self.qlen = 0  # unix socket: the most datagrams its queue holds (net.unix.max_dgram_qlen)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def bind(self) -> None:
        a = self.address
        try:
            if a.kind == "udp":
                fam = socket.AF_INET6 if ":" in a.host else socket.AF_INET
                sock = socket.socket(fam, socket.SOCK_DGRAM)
                try:
                    sock.bind((a.host, a.port))
                except BaseException:
                    sock.close()
                    raise
                host, port = sock.getsockname()[:2]
                self.bound = Address("udp", host=host, port=port)
            else:
                self._clear_stale_unix(a.path)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                    sock.bind(a.path)
                    os.chmod(a.path, SOCKET_MODE)
                except BaseException:
                    sock.close()
                    raise
        except socket.gaierror as e:
            raise IngestError(f"cannot bind ingest {a}: {e.strerror or e}") from None
        except OSError as e:
            why = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise IngestError(f"cannot bind ingest {a}: {why}") from None
        self.rcvbuf = _big_rcvbuf(sock)
        if a.kind == "unix":
            self.qlen = _unix_qlen()
            if self.qlen < UNIX_QLEN_WARN:
                log.warning("the unix ingest socket queues only %d datagrams (net.unix.max_dgram_qlen): ranks drop "
                            "records in bursts; raise it with sysctl -w net.unix.max_dgram_qlen=%d",
                            self.qlen, UNIX_QLEN_WARN)
        sock.setblocking(False)
        self.sock = sock

    @staticmethod
    def _clear_stale_unix(path: str) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise IngestError(f"cannot bind ingest unix://{path}: a file that is not a socket is in the way")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # stale socket of a dead agent
            return
        except OSError:
            return  # let bind() report it
        finally:
            probe.close()
        raise IngestError(f"cannot bind ingest unix://{path}: address already in use")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"ingest-{self.address.kind}", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.address.kind == "unix":
            try:
                os.unlink(self.address.path)
            except OSError:
                pass

    def _loop(self) -> None:
        sock = self.sock
        assert sock is not None
        recv = sock.recv
        handle = self.ingest.handle
        creds = self.address.kind == "unix"  # with the sender's credentials: see the module doc
        recvmsg, space = sock.recvmsg, CRED_SPACE
        clock = self.ingest.clock
        bufsize = MAX_DATAGRAM + 1  # one byte more tells an oversize datagram (the rest is truncated)
        stop = self._stop
        batch_target = max(16, self.rcvbuf // BYTES_PER_QUEUED) if not creds else max(1, self.qlen // 4)
        min_sleep = IDLE_SLEEP_MIN
        last = time.monotonic()
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        wait_ms = int(STOP_POLL * 1000)
        while not stop.is_set():
            try:
                if not poller.poll(wait_ms):
                    continue
            except OSError:
                return  # socket closed under us: stopping
            now = clock()
            n = 0
            while True:
                try:
                    if creds:
                        data, anc, _, _ = recvmsg(bufsize, space)
                        handle(data, now, anc)
                    else:
                        handle(recv(bufsize), now)
                except BlockingIOError:
                    break
                except OSError as e:  # e.g. ECONNREFUSED echoes on UDP: not a datagram
                    log.debug("recv: %s", e)
                    break
                n += 1
                if n & 1023 == 0:
                    now = clock()
                    if stop.is_set():  # a sender faster than us must not keep us from stopping
                        return
            t = time.monotonic()
            rate = n / max(t - last, 1e-3)
            last = t
            pause = min(IDLE_SLEEP_MAX, batch_target / rate if rate else IDLE_SLEEP_MAX)
            if (pause >= min_sleep or not creds) and stop.wait(max(min_sleep, pause)):
                return


def _unix_qlen() -> int:
    try:
        with open(UNIX_QLEN_FILE) as f:
            return max(1, int(f.read().strip()))
    except (OSError, ValueError):
        return UNIX_QLEN_DEFAULT


def _big_rcvbuf(sock: socket.socket) -> int:
    """Ask for a large receive buffer (SO_RCVBUFFORCE as root passes net.core.rmem_max)."""
    force = getattr(socket, "SO_RCVBUFFORCE", None)
    if force is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, RCVBUF_BYTES)
            return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        except OSError:
            pass
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    except OSError:
        pass
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

