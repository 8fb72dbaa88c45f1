"""network: TCP counters (/proc/net/snmp, /proc/net/netstat), per-interface
errors, drops and bytes (/proc/net/dev), link speed, operstate and carrier
changes (/sys/class/net/<dev>/). Every path goes through the procfs/sysfs roots.

An interface's speed of -1 or an unreadable speed file (sysfs answers EINVAL
for a down link) means "unknown": the series is absent, never 0.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from ranksight import catalog as C
from ranksight import config

from . import Context, Family, PartialError, family, read_int, read_text, register

TCP_EXT_COUNTERS = ("TCPLostRetransmit", "TCPTimeouts", "TCPSynRetrans")
DEFAULT_EXCLUDE: str = config.defaults()["agent"]["nic_exclude"]  # the config's agent.nic_exclude

# /proc/net/dev columns after the interface name
_DEV_FIELDS = ("rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame", "rx_compressed", "rx_multicast",
               "tx_bytes", "tx_packets", "tx_errs", "tx_drop", "tx_fifo", "tx_colls", "tx_carrier", "tx_compressed")


def parse_snmp(text: str, sections: Optional[Tuple[str, ...]] = None) -> Dict[str, Dict[str, int]]:
    """/proc/net/snmp and /proc/net/netstat: pairs of 'Section: names' / 'Section: values' lines
    (only ``sections`` when given)."""
    out: Dict[str, Dict[str, int]] = {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2]):
        sec, _, n = names.partition(":")
        if sections is not None and sec not in sections:
            continue
        sec2, _, v = values.partition(":")
        if sec != sec2:
            raise ValueError(f"mismatched sections {sec!r} and {sec2!r}")
        keys, vals = n.split(), v.split()
        if len(keys) != len(vals):
            raise ValueError(f"section {sec}: {len(keys)} names, {len(vals)} values")
        out[sec] = {k: int(x) for k, x in zip(keys, vals)}
    return out


def parse_net_dev(text: str) -> Dict[str, Dict[str, int]]:
    out: Dict[str, Dict[str, int]] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        vals = rest.split()
        if len(vals) < len(_DEV_FIELDS):
            raise ValueError(f"/proc/net/dev: short line for {name.strip()}")
        out[name.strip()] = {k: int(x) for k, x in zip(_DEV_FIELDS, vals)}
    return out


class NetworkCollector:
    name = "network"

    def __init__(self, node: str, procfs: str = "/proc", sysfs: str = "/sys",
                 include: str = "", exclude: str = DEFAULT_EXCLUDE):
        self.node = node
        self.procfs = procfs
        self.sysfs = sysfs
        self.include = re.compile(include) if include else None
        self.exclude = re.compile(exclude) if exclude else None

    def wanted(self, dev: str) -> bool:
        if self.include is not None and not self.include.search(dev):
            return False
        return not (self.exclude is not None and self.exclude.search(dev))

    def _read(self, rel: str, problems: List[str]) -> Optional[str]:
        path = f"{self.procfs}/{rel}"
        text = read_text(path)
        if text is None:
            problems.append(f"cannot read {path}")
        return text

    def collect(self) -> List[Family]:
        node = [self.node]
        problems: List[str] = []
        fams: List[Family] = []

        snmp_text = self._read("net/snmp", problems)
        if snmp_text is not None:
            try:
                tcp = parse_snmp(snmp_text, ("Tcp",)).get("Tcp", {})
            except ValueError as e:
                problems.append(f"net/snmp: {e}")
                tcp = {}
            for m, k in ((C.NET_TCP_RETRANS, "RetransSegs"), (C.NET_TCP_SENT, "OutSegs"), (C.NET_TCP_IN_ERRORS, "InErrs")):
                if k in tcp:
                    f = family(m)
                    f.add_metric(node, tcp[k])
                    fams.append(f)

        netstat_text = self._read("net/netstat", problems)
        if netstat_text is not None:
            try:
                ext = parse_snmp(netstat_text, ("TcpExt",)).get("TcpExt", {})
            except ValueError as e:
                problems.append(f"net/netstat: {e}")
                ext = {}
            f = family(C.NET_TCP_EXT)
            for k in TCP_EXT_COUNTERS:
                if k in ext:  # older kernels lack some (TCPSynRetrans): absent, not 0
                    f.add_metric(node + [k], ext[k])
            fams.append(f)

        dev_text = self._read("net/dev", problems)
        devs: Dict[str, Dict[str, int]] = {}
        if dev_text is not None:
            try:
                devs = parse_net_dev(dev_text)
            except ValueError as e:
                problems.append(str(e))
        f_err, f_drop, f_bytes = family(C.NET_IF_ERRORS), family(C.NET_IF_DROPS), family(C.NET_IF_BYTES)
        for dev in sorted(devs):
            if not self.wanted(dev):
                continue
            d = devs[dev]
            for direction, p in (("receive", "rx"), ("transmit", "tx")):
                lab = node + [dev, direction]
                f_err.add_metric(lab, d[p + "_errs"])
                f_drop.add_metric(lab, d[p + "_drop"])
                f_bytes.add_metric(lab, d[p + "_bytes"])
        fams += [f_err, f_drop, f_bytes]

        fams += self._sysfs(node, problems)
        if problems:
            raise PartialError("; ".join(problems), fams)
        return fams

    def _sysfs(self, node: List[str], problems: List[str]) -> List[Family]:
        base = os.path.join(self.sysfs, "class", "net")
        try:
            names = sorted(os.listdir(base))
        except OSError as e:
            problems.append(f"cannot list {base}: {e.strerror or e}")
            return []
        f_speed, f_up, f_cc = family(C.NET_IF_SPEED), family(C.NET_IF_UP), family(C.NET_IF_CARRIER_CHANGES)
        for dev in names:
            if not self.wanted(dev):
                continue
            d = f"{base}/{dev}"
            if not os.path.isdir(d):  # bonding_masters is a file; dangling links are skipped
                continue
            lab = node + [dev]
            speed = read_int(d + "/speed")
            if speed is not None and speed > 0:
                f_speed.add_metric(lab, speed * 125_000)  # Mb/s -> bytes/s
            oper = read_text(d + "/operstate")
            if oper is not None:
                f_up.add_metric(lab, 1.0 if oper == "up" else 0.0)
            cc = read_int(d + "/carrier_changes")
            if cc is not None:
                f_cc.add_metric(lab, cc)
        return [f_speed, f_up, f_cc]


@register("network")
def _build(ctx: Context) -> NetworkCollector:
    s = ctx.settings
    return NetworkCollector(s.node, s.procfs, s.sysfs, s.nic_include, s.nic_exclude)
