"""Ending a job's worker processes on this node: the agent's ``POST /api/v1/ranks/end`` (END_API), which
`ranksight act` (ranksight/tools/act.py) calls on the culprit's node for RanksightRankStalled.

The request is JSON: ``{"job": J, "node": N, "pids": [...], "grace": S}`` (node, pids and grace
optional). The agent signals only processes it tracks as ranks of job J on its node that have not
finished, each by the pid the kernel gave the agent for it: a unix-socket sender's credentials
(SO_PASSCRED; in a container, the pid the agent sees). Over UDP a rank's pid is only what its
datagrams claim, and any local user can claim any pid: such a rank is signalled only with
``agent.act_trust_udp_pids`` (every local user trusted). The process under the pid must have started
when the rank's hello says (``pstart``; a reused or claimed pid of another process is skipped), and
pid 1, the agent and its ancestors are never signalled. With ``pids`` in the request only those of
the job's ranks are signalled (a requested pid that is not one is refused, and a request left with
none fails: 409). ``end`` sends SIGTERM, then SIGKILL to those still alive after the grace (at most
MAX_GRACE); the elastic launcher (``torchrun --max-restarts``) sees its workers fail and restarts them.

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
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import psutil

from ranksight import catalog as C
from ranksight.common.plumbing import wait_until

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
    """Unix time the process ``pid`` started, None when it is gone: psutil's ``create_time``, the same
    reading the hooks send as the hello's ``pstart`` (hooks/sender.py), so a rank's own process matches."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def _ancestors() -> Set[int]:
    """This process and its ancestors (never signalled: the agent must not end itself or its supervisor)."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def signal_pid(r: Mapping[str, Any], trust_claimed: bool) -> Optional[int]:
    """The pid to signal for a rank (/api/v1/ranks entry): the kernel's (``local_pid``), else the claimed
    one when claimed pids are trusted; None when neither."""
    lp = r.get("local_pid")
    if type(lp) is int and lp > 0:
        return lp
    p = r.get("pid")
    return p if trust_claimed and type(p) is int and p > 0 else None


def choose(ranks: Iterable[Mapping[str, Any]], job: str, node: str, pids: Optional[Sequence[int]],
           trust_claimed: bool = False) -> Tuple[List[int], List[int]]:
    """(pids to signal, requested pids refused) among ``ranks`` (/api/v1/ranks entries): the job's ranks
    on the node that have not finished, by ``signal_pid``, restricted to ``pids`` when given, each a
    process that started when its rank's hello says. EndError when none is left."""
    where = f"job {job}" + (f" on node {node}" if node else "")
    mine: Dict[int, Mapping[str, Any]] = {}
    claimed_only = 0
    for r in ranks:
        if r.get("job") != job or (node and r.get("node") != node) or r.get("finished"):
            continue
        p = signal_pid(r, trust_claimed)
        if p is None:
            claimed_only += 1
        else:
            mine[p] = r
    if not mine:
        if claimed_only:
            raise EndError(409, C.END_NO_RANKS, f"the ranks of {where} send over UDP, where a pid is only claimed: "
                                                "this agent signals a pid the kernel gave it (unix-socket ingest) or, "
                                                "with agent.act_trust_udp_pids, a claimed one")
        raise EndError(404, C.END_NO_RANKS, f"no rank of {where} at this agent")
    want = sorted(mine) if pids is None else sorted(set(pids))
    refused = [p for p in want if p not in mine]
    protected = _ancestors()
    out = []
    for p in want:
        r = mine.get(p)
        if r is None:
            continue
        began, claimed = _started(p), float(r.get("pstart") or 0.0)
        if p <= 1 or p in protected or claimed <= 0 or began is None or abs(began - claimed) > START_SLACK:
            refused.append(p)  # gone, reused, another process than the rank's, or the agent's own line
            continue
        out.append(p)
    if not out:
        raise EndError(409, C.END_NO_RANKS, f"pids {sorted(refused)} are not running ranks of {where}")
    return out, sorted(refused)


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


def end(pids: Sequence[int], grace: float) -> Tuple[List[int], List[int], List[str]]:
    """SIGTERM every pid, SIGKILL those still alive after ``grace``: (terminated, killed, errors). A pid
    that cannot be signalled is an error line and the others go on."""
    alive: List[int] = []
    errors: List[str] = []
    for p in pids:
        try:
            if _signal(p, signal.SIGTERM):
                alive.append(p)
        except EndError as e:
            errors.append(str(e))
    if not alive:
        raise EndError(500 if errors else 410, C.END_FAILED, "; ".join(errors) or f"none of the pids {list(pids)} is running")
    wait_until(lambda: not any(_alive(p) for p in alive), grace, 0.05)
    killed: List[int] = []
    for p in alive:
        if _alive(p):
            try:
                if _signal(p, signal.SIGKILL):
                    killed.append(p)
            except EndError as e:
                errors.append(str(e))
    return alive, killed, errors


def serve(body: bytes, ranks: Iterable[Mapping[str, Any]],
          trust_claimed: bool = False) -> Tuple[int, Dict[str, Any], str]:
    """One authorized request against the agent's ranks: (status, JSON answer, result label)."""
    try:
        job, node, pids, grace = parse(body)
        chosen, refused = choose(ranks, job, node, pids, trust_claimed)
        termed, killed, errors = end(chosen, grace)
    except EndError as e:
        return e.code, {"error": str(e)}, e.result
    detail = f"SIGTERM to {termed}" + (f", SIGKILL to {killed} after {grace:g} s" if killed else "")
    if refused:
        detail += f"; not signalled (not running ranks of job {job}): {refused}"
    if errors:
        detail += "; " + "; ".join(errors)
    return 200, {"job": job, "node": node, "terminated": termed, "killed": killed, "refused": refused,
                 "errors": errors, "detail": detail}, C.END_OK
