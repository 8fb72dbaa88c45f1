"""Ending a job's worker processes on this node: the agent's ``POST /api/v1/ranks/end`` (END_API), which
`ranksight act` (ranksight/tools/act.py) calls on the culprit's node for RanksightRankStalled.

The request is JSON: ``{"job": J, "node": N, "pids": [...], "grace": S}`` (node, pids and grace
optional). The agent signals only processes it tracks as ranks of job J on its node (their hellos'
pids, for a unix-socket sender the pid the agent sees; never a rank that finished), and of those only
the requested pids when the request lists some: a requested pid that is not such a rank is never
signalled, and a request left with none fails (409). A pid whose process started at another time than
the rank's hello says (``pstart``) is a reused pid and is skipped. ``end`` sends SIGTERM, then SIGKILL
to those still alive after the grace (at most MAX_GRACE); the elastic launcher (``torchrun
--max-restarts``) sees its workers fail and restarts them.

Off unless configured: ``agent.act_token_file`` (the request carries ``Authorization: Bearer <token>``)
and/or ``agent.act_client_sans`` (the request comes over the agent's TLS, ``--web.config.file``, with a
verified client certificate carrying one of these SANs); with both, both are required. Without TLS only
a loopback client may ask. Anything else signals nothing and is answered 401 (no or a wrong token) or
403 (not enabled, a certificate without a listed SAN, plain HTTP from another host), and every request
is counted in ``ranksight_end_workers_requests_total{result}``.

A request runs on its own connection's thread (the agent's HTTP server has one per connection) and
holds the rank table's lock only to copy the job's ranks: ingest and scrapes never wait for the grace.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ranksight import catalog as C

from .webconfig import has_san

END_API = "/api/v1/ranks/end"
MAX_GRACE = 600.0  # seconds: the longest SIGTERM grace a request may ask for
MAX_BODY = 1 << 16
START_SLACK = 2.0  # seconds: a process started further than this from the rank's pstart is another one
REFUSED_CODE = {C.END_DISABLED: 403, C.END_FORBIDDEN: 403, C.END_UNAUTHORIZED: 401}


class EndError(Exception):
    """A request that cannot be served: its HTTP status, its result label and one line."""

    def __init__(self, code: int, result: str, message: str) -> None:
        super().__init__(message)
        self.code, self.result = code, result


def bearer(header: Optional[str]) -> bytes:
    """The token of an ``Authorization: Bearer`` header, or b""."""
    header = header or ""
    return header[7:].strip().encode() if header[:7].lower() == "bearer " else b""


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


@dataclass
class Access:
    """Who may end workers: the token of agent.act_token_file, the SANs of agent.act_client_sans."""
    token: Optional[bytes] = None
    sans: Optional[List[str]] = None

    @property
    def enabled(self) -> bool:
        return self.token is not None or self.sans is not None

    def check(self, header: Optional[str], cert: Optional[Mapping[str, Any]], tls: bool, peer: str) -> str:
        """'' when the request may end workers, else the result label it is refused with."""
        if not self.enabled:
            return C.END_DISABLED
        if not tls and not _loopback(peer):
            return C.END_FORBIDDEN
        if self.token is not None and not hmac.compare_digest(bearer(header), self.token):
            return C.END_UNAUTHORIZED
        if self.sans is not None and not (tls and has_san(cert, self.sans)):
            return C.END_FORBIDDEN
        return ""

    @staticmethod
    def why(result: str) -> str:
        return {C.END_DISABLED: "ending workers is not enabled on this agent (agent.act_token_file, "
                                "agent.act_client_sans)",
                C.END_FORBIDDEN: "this client may not end workers (a client certificate without one of "
                                 "agent.act_client_sans, or plain HTTP from another host)",
                C.END_UNAUTHORIZED: "no or a wrong bearer token"}[result]


class Counts:
    """ranksight_end_workers_requests_total by result."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Dict[str, int] = dict.fromkeys(C.END_RESULTS, 0)

    def add(self, result: str) -> None:
        with self.lock:
            self.counts[result] += 1

    def snapshot(self, every: bool = True) -> Dict[str, int]:
        """The counts; with ``every`` False only those above 0 (an agent without the endpoint exposes no
        series until a request comes)."""
        with self.lock:
            return {k: n for k, n in self.counts.items() if every or n}


def parse(body: bytes) -> Tuple[str, str, Optional[List[int]], float]:
    """(job, node, pids or None, grace) of a request body; EndError 400 when it is not that shape."""
    try:
        doc = json.loads(body or b"null")
    except ValueError:
        doc = None
    pids = doc.get("pids") if isinstance(doc, dict) else None
    grace = doc.get("grace", 5.0) if isinstance(doc, dict) else None
    if (not isinstance(doc, dict) or not isinstance(doc.get("job"), str) or not doc["job"]
            or not isinstance(doc.get("node", ""), str)
            or not (pids is None or (isinstance(pids, list) and all(type(p) is int and p > 0 for p in pids)))
            or type(grace) not in (int, float) or not 0 <= grace <= MAX_GRACE):
        raise EndError(400, C.END_MALFORMED, 'expected {"job": NAME, "node": NAME, "pids": [PID, ...], "grace": '
                                             f'SECONDS up to {MAX_GRACE:g}}} (node, pids and grace optional)')
    return doc["job"], doc.get("node", ""), pids, float(grace)


def _started(pid: int) -> Optional[float]:
    """Unix time the process ``pid`` started (as psutil's create_time), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def choose(ranks: Iterable[Mapping[str, Any]], job: str, node: str,
           pids: Optional[Sequence[int]]) -> Tuple[List[int], List[int]]:
    """(local pids to signal, requested pids refused) among ``ranks`` (/api/v1/ranks entries): the job's
    ranks on the node that have not finished, restricted to ``pids`` when given. EndError when none."""
    mine = {int(r["pid"]): r for r in ranks
            if r.get("job") == job and (not node or r.get("node") == node) and not r.get("finished")
            and int(r.get("pid", -1)) > 0}
    where = f"job {job}" + (f" on node {node}" if node else "")
    if not mine:
        raise EndError(404, C.END_NO_RANKS, f"no rank of {where} at this agent")
    want = sorted(mine) if pids is None else sorted(set(pids))
    refused = [p for p in want if p not in mine]
    out = []
    for p in want:
        r = mine.get(p)
        if r is None:
            continue
        local = int(r.get("local_pid") or p)
        began, claimed = _started(local), float(r.get("pstart") or 0.0)
        if claimed > 0 and began is not None and abs(began - claimed) > START_SLACK:
            refused.append(p)  # the pid was reused: another process than the rank's
            continue
        out.append(local)
    if not out:
        raise EndError(409, C.END_NO_RANKS, f"pids {refused} are no longer ranks of {where}")
    return out, refused


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as e:
        raise EndError(500, C.END_FAILED, f"cannot signal pid {pid}: {e.strerror}") from None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def end(pids: Sequence[int], grace: float) -> Tuple[List[int], List[int]]:
    """SIGTERM every pid, SIGKILL those still alive after ``grace``: (terminated, killed)."""
    alive = [p for p in pids if _signal(p, signal.SIGTERM)]
    if not alive:
        raise EndError(410, C.END_FAILED, f"none of the pids {list(pids)} is running")
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in alive) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive, [p for p in alive if _alive(p) and _signal(p, signal.SIGKILL)]


def serve(body: bytes, ranks: Iterable[Mapping[str, Any]]) -> Tuple[int, Dict[str, Any], str]:
    """One authorized request against the agent's ranks: (status, JSON answer, result label)."""
    try:
        job, node, pids, grace = parse(body)
        chosen, refused = choose(ranks, job, node, pids)
        termed, killed = end(chosen, grace)
    except EndError as e:
        return e.code, {"error": str(e)}, e.result
    detail = f"SIGTERM to {termed}" + (f", SIGKILL to {killed} after {grace:g} s" if killed else "")
    if refused:
        detail += f"; not signalled (not ranks of job {job}): {refused}"
    return 200, {"job": job, "node": node, "terminated": termed, "killed": killed, "refused": refused,
                 "detail": detail}, C.END_OK
