"""rdma: every counter file under /sys/class/infiniband/<dev>/ports/<port>/counters
and hw_counters, plus the port rate and state.

Values are exposed raw, as the kernel reports them: per the InfiniBand spec,
``port_xmit_data`` and ``port_rcv_data`` count 4-byte words, so bytes are 4x
the counter. A hw_counters file named like a counters file is exposed as
``hw_<name>`` so the two never collide.
"""
from __future__ import annotations

import os
import re
from typing import List, Optional

from ranksight import catalog as C

from . import CollectorError, Family, family, read_text

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


class RdmaCollector:
    name = "rdma"

    def __init__(self, node: str, sysfs: str = "/sys"):
        self.node = node
        self.base = os.path.join(sysfs, "class", "infiniband")

    def collect(self) -> List[Family]:
        if not os.path.isdir(self.base):
            raise CollectorError(f"no RDMA devices ({self.base} does not exist)")
        node = [self.node]
        f_cnt, f_rate, f_up = family(C.RDMA_PORT_COUNTER), family(C.RDMA_PORT_RATE), family(C.RDMA_PORT_UP)
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
                seen = set()
                for sub in ("counters", "hw_counters"):
                    d = os.path.join(p, sub)
                    for name in _listdir(d):
                        text = read_text(os.path.join(d, name))
                        if text is None:
                            continue
                        try:
                            v = int(text)
                        except ValueError:  # "N/A" and friends
                            continue
                        label = name if name not in seen else "hw_" + name
                        seen.add(label)
                        f_cnt.add_metric(lab + [label], v)
        return [f_cnt, f_rate, f_up]
