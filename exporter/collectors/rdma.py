"""rdma: the counter files under /sys/class/infiniband/<dev>/ports/<port>/counters
and hw_counters, plus the port rate and state.

Which counters (``agent.rdma_counters``): ``curated`` (the default) exposes only
``catalog.RDMA_CURATED_COUNTERS``: throughput and the link-error and congestion
counters the runbooks and dashboards name, 17 of the ~51 files an mlx5 port has
(at 10 ports a node that is 340 series less); ``all`` exposes every
file; a list exposes exactly those names. Files not exposed are not read.

Values are exposed raw, as the kernel reports them: per the InfiniBand spec,
``port_xmit_data`` and ``port_rcv_data`` count 4-byte words, so bytes are 4x
the counter. A hw_counters file named like a file in counters is exposed as
``hw_<name>`` so the two never collide (allowlists name it that way too).
"""
from __future__ import annotations

import logging
import os
import re
from typing import FrozenSet, List, Optional, Sequence, Set, Union

from ranksight import catalog as C

from . import CollectorError, Context, Family, family, read_text, register

log = logging.getLogger("ranksight.exporter.rdma")

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([GM])b/sec")


def parse_rate(text: str) -> Optional[float]:
    """'100 Gb/sec (4X EDR)' -> 12.5e9 bytes/s; None when unparsable."""
    m = _RATE.match(text)
    if not m:
        return None
    mult = 1e9 if m.group(2) == "G" else 1e6
    return float(m.group(1)) * mult / 8.0


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


CURATED = "curated"
ALL = "all"


def allowlist(counters: Union[str, Sequence[str]]) -> Optional[FrozenSet[str]]:
    """agent.rdma_counters -> the exposed counter names; None means every file."""
    if counters == ALL:
        return None
    if counters == CURATED:
        return frozenset(C.RDMA_CURATED_COUNTERS)
    if isinstance(counters, str):
        raise ValueError(f"rdma counters {counters!r}: expected {CURATED}, {ALL} or a list of counter names")
    return frozenset(counters)


class RdmaCollector:
    name = "rdma"

    def __init__(self, node: str, sysfs: str = "/sys", counters: Union[str, Sequence[str]] = CURATED):
        self.node = node
        self.base = os.path.join(sysfs, "class", "infiniband")
        self.allow = allowlist(counters)
        self.explicit = counters not in (CURATED, ALL)
        self.checked = False  # an explicit list is checked once against the files that exist (typos)

    def collect(self) -> List[Family]:
        if not os.path.isdir(self.base):
            raise CollectorError(f"no RDMA devices ({self.base} does not exist)")
        node = [self.node]
        allow = self.allow
        f_cnt, f_rate, f_up = family(C.RDMA_PORT_COUNTER), family(C.RDMA_PORT_RATE), family(C.RDMA_PORT_UP)
        # every counter label a port has a file for: only until an explicit list has been checked
        present: Optional[Set[str]] = set() if self.explicit and not self.checked else None
        for dev in _listdir(self.base):
            ports = os.path.join(self.base, dev, "ports")
            for port in _listdir(ports):
                p = os.path.join(ports, port)
                lab = node + [dev, port]
                rate = read_text(os.path.join(p, "rate"))
                bps = parse_rate(rate) if rate is not None else None
                if bps is not None:
                    f_rate.add_metric(lab, bps)
                state = read_text(os.path.join(p, "state"))
                if state is not None:
                    f_up.add_metric(lab, 1.0 if state.split(":")[-1].strip() == "ACTIVE" else 0.0)
                d_cnt, d_hw = os.path.join(p, "counters"), os.path.join(p, "hw_counters")
                plain = _listdir(d_cnt)
                taken = set(plain)  # the label depends on the file names only, never on a file's content
                files = [(d_cnt, name, name) for name in plain]
                files += [(d_hw, name, "hw_" + name if name in taken else name) for name in _listdir(d_hw)]
                for d, name, label in files:
                    if present is not None:
                        present.add(label)
                    if allow is not None and label not in allow:
                        continue
                    text = read_text(os.path.join(d, name))
                    if text is None:
                        continue
                    try:
                        v = int(text)
                    except ValueError:  # "N/A (no PMA)" and friends
                        continue
                    f_cnt.add_metric(lab + [label], v)
        if present:
            self.checked = True
            missing = sorted(allow - present) if allow is not None else []
            if missing:
                log.warning("agent.rdma_counters names counters no RDMA port has: %s", ", ".join(missing))
        return [f_cnt, f_rate, f_up]


@register("rdma")
def _build(ctx: Context) -> RdmaCollector:
    return RdmaCollector(ctx.settings.node, ctx.settings.sysfs, ctx.settings.rdma_counters)
