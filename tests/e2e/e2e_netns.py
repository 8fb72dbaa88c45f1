"""Two "hosts" on one machine: network namespaces joined by a veth, with real packet loss.

Each host is an ``ip netns`` namespace with its own hostname (a UTS namespace per
process started through :meth:`Hosts.argv`), its own loopback (so each host's
ranks talk to their own agent on 127.0.0.1) and its own TCP counters
(``/proc/net/snmp`` is per network namespace). The hosts share one point-to-point
link (``10.213.X.0/30``) that the training job's gloo traffic uses; each host also
has a management link to the root namespace so that Prometheus (in the root
namespace) can scrape the host's agent. Only addresses inside 10.213.0.0/16 are
used and nothing is routed anywhere else.

Packet loss: ``tc netem`` does not exist here, and an iptables DROP in the
sender's OUTPUT chain is not loss at all (the local stack sees the error and
simply sends again, without a retransmission). So the loss is a DROP in the
*receiving* host's INPUT chain on the link interface
(``-m statistic --mode random --probability P``): for the sender the segment
vanished on the wire, and it retransmits. Dropping what host B receives from A
makes host A the one that retransmits.

Everything (processes inside the namespaces, the namespaces, their veths and
iptables rules, which live inside the namespaces) is removed on exit, even when
the test fails. Namespaces left by a killed earlier run are swept at start.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import List, Sequence

log = logging.getLogger("tests.e2e.netns")

PREFIX = "rse2e"  # namespace and interface name prefix (interface names <= 15 chars)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def available() -> str:
    """'' when namespaces, veths and iptables work here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "iptables", "unshare"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"needs {tool}"
    return ""


def sweep_stale() -> None:
    """Delete namespaces of earlier runs whose owning process is gone."""
    out = _ip("netns", "list", check=False).stdout
    for m in re.finditer(rf"^({PREFIX}(\d+)[a-z])\b", out, re.M):
        name, pid = m.group(1), int(m.group(2))
        if not os.path.exists(f"/proc/{pid}"):
            log.warning("removing stale namespace %s", name)
            _kill_netns_pids(name)
            _ip("netns", "del", name, check=False)


def _kill_netns_pids(ns: str) -> None:
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}")]
        time.sleep(0.05)


@dataclass(frozen=True)
class Host:
    ns: str  # network namespace name
    hostname: str  # its hostname (the `node` label of its agent and ranks)
    link_if: str  # interface on the shared link, inside the namespace
    link_addr: str  # address on the shared link
    mgmt_addr: str  # address reachable from the root namespace (the agent's scrape address)


class Hosts:
    """Context manager: ``with Hosts(["a", "b"]) as h: ...`` (two hosts, one link)."""

    def __init__(self, names: Sequence[str] = ("a", "b"), net: int = 0) -> None:
        if len(names) != 2:
            raise ValueError("two hosts, one link")
        self.tag = f"{PREFIX}{os.getpid()}"
        # 10.213.<net>.0/30: the link; 10.213.<net+1>.0/30 and <net+2>: management links
        self.net = net if net else 10 + (os.getpid() % 80) * 3
        self.hosts: List[Host] = []
        for i, n in enumerate(names):
            self.hosts.append(Host(
                ns=f"{self.tag}{'ab'[i]}", hostname=n, link_if=f"{PREFIX}l{'ab'[i]}",
                link_addr=f"10.213.{self.net}.{i + 1}", mgmt_addr=f"10.213.{self.net + 1 + i}.2"))
        self._root_ifs: List[str] = []

    def __enter__(self) -> "Hosts":
        sweep_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create(self) -> None:
        a, b = self.hosts
        for h in self.hosts:
            _ip("netns", "add", h.ns)
            _ip("-n", h.ns, "link", "set", "lo", "up")
        _ip("link", "add", f"{self.tag[-9:]}x", "type", "veth", "peer", "name", f"{self.tag[-9:]}y")
        # the shared link between the two hosts
        _ip("link", "set", f"{self.tag[-9:]}x", "netns", a.ns, "name", a.link_if)
        _ip("link", "set", f"{self.tag[-9:]}y", "netns", b.ns, "name", b.link_if)
        for h in self.hosts:
            _ip("-n", h.ns, "addr", "add", f"{h.link_addr}/30", "dev", h.link_if)
            _ip("-n", h.ns, "link", "set", h.link_if, "up")
        # management links root <-> host, for scraping the host's agent
        for i, h in enumerate(self.hosts):
            root_if, in_if = f"{self.tag[-9:]}m{i}", f"{self.tag[-9:]}n{i}"
            _ip("link", "add", root_if, "type", "veth", "peer", "name", in_if)
            self._root_ifs.append(root_if)
            _ip("link", "set", in_if, "netns", h.ns, "name", f"{PREFIX}m")
            mgmt_net = h.mgmt_addr.rsplit(".", 1)[0]
            _ip("addr", "add", f"{mgmt_net}.1/30", "dev", root_if)
            _ip("link", "set", root_if, "up")
            _ip("-n", h.ns, "addr", "add", f"{h.mgmt_addr}/30", "dev", f"{PREFIX}m")
            _ip("-n", h.ns, "link", "set", f"{PREFIX}m", "up")

    def argv(self, host: Host, cmd: Sequence[str]) -> List[str]:
        """Run ``cmd`` on ``host``: in its network namespace, with its own hostname."""
        return ["ip", "netns", "exec", host.ns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host.hostname, *cmd]

    def drop_incoming(self, host: Host, probability: float) -> None:
        """Lose a random share of the packets ``host`` receives on the link (the peer retransmits)."""
        subprocess.run(["ip", "netns", "exec", host.ns, "iptables", "-A", "INPUT", "-i", host.link_if,
                        "-m", "statistic", "--mode", "random", "--probability", f"{probability:g}", "-j", "DROP"],
                       check=True, capture_output=True, text=True, timeout=10)

    def clear_drops(self, host: Host) -> None:
        subprocess.run(["ip", "netns", "exec", host.ns, "iptables", "-F", "INPUT"],
                       check=True, capture_output=True, text=True, timeout=10)

    def dropped(self, host: Host) -> int:
        out = subprocess.run(["ip", "netns", "exec", host.ns, "iptables", "-L", "INPUT", "-v", "-n", "-x"],
                             capture_output=True, text=True, timeout=10).stdout
        return sum(int(line.split()[0]) for line in out.splitlines() if "DROP" in line)

    def tcp_counters(self, host: Host) -> tuple:
        """(OutSegs, RetransSegs) of the host's namespace."""
        with open(f"/proc/{self._some_pid(host)}/net/snmp") as f:
            rows = [l.split() for l in f if l.startswith("Tcp:")]
        d = dict(zip(rows[0], rows[1]))
        return int(d["OutSegs"]), int(d["RetransSegs"])

    def _some_pid(self, host: Host) -> str:
        pids = _ip("netns", "pids", host.ns).stdout.split()
        if not pids:
            raise RuntimeError(f"no process in {host.ns}")
        return pids[0]

    def close(self) -> None:
        for h in self.hosts:
            _kill_netns_pids(h.ns)
            _ip("netns", "del", h.ns, check=False)  # its veth ends (and so the pairs) and iptables rules go with it
        for i in self._root_ifs:
            _ip("link", "del", i, check=False)  # normally gone with its peer already
        self._root_ifs = []
