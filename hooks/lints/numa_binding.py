"""The numa_binding lint: rank CPU affinity excludes its GPU's NUMA node."""
from __future__ import annotations

import os
from typing import Iterable, List, Optional, Set

import torch

from ranksight import catalog as C

from .core import log, register


def cpulist(s: str) -> Set[int]:
    """'0-3,8,10-11' -> {0,1,2,3,8,10,11}"""
    out: Set[int] = set()
    for part in s.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def ranges(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} -> '0-3,8'"""
    s = sorted(cpus)
    out: List[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


def sysfs_bus_id(bus_id: str) -> str:
    """NVML '00000000:18:00.0' or '0000:18:00.0' -> sysfs '0000:18:00.0' (lower case)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


@register(C.LINT_NUMA_BINDING)
class NumaBinding:
    """numa_binding: rank CPU affinity excludes its GPU's NUMA node.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def gpu_bus_id(self) -> Optional[str]:
        tl = getattr(self.w, "_tl", None)
        dev = getattr(tl, "device", None)
        if dev is None:
            if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                return None  # no GPU in use: never initialise CUDA here
            dev = torch.device("cuda", torch.cuda.current_device())
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"


    def check_numa(self, sysfs: Optional[str] = None, bus_id: Optional[str] = None,
                   affinity: Optional[Set[int]] = None) -> None:
        bus = bus_id if bus_id is not None else self.gpu_bus_id()
        if not bus:
            return
        root = sysfs if sysfs is not None else self.sysfs
        bus = sysfs_bus_id(bus)
        try:
            with open(os.path.join(root, "bus/pci/devices", bus, "numa_node")) as fh:
                node = int(fh.read().strip())
            if node < 0:
                self.report(C.LINT_NUMA_BINDING, False)  # no NUMA information: one node
                return
            with open(os.path.join(root, f"devices/system/node/node{node}/cpulist")) as fh:
                cpus = cpulist(fh.read())
        except (OSError, ValueError) as e:
            log.debug("ranksight: numa_binding: cannot read sysfs for %s: %s", bus, e)
            return
        aff = affinity if affinity is not None else os.sched_getaffinity(os.getpid())
        if cpus and not (aff & cpus):
            self.report(C.LINT_NUMA_BINDING, True,
                        f"CPU affinity {ranges(aff)} excludes every CPU of NUMA node {node} ({ranges(cpus)}) where this "
                        f"rank's GPU {bus} is attached: host<->GPU copies and the DataLoader workers cross the socket "
                        f"link; bind to node {node} (numactl --cpunodebind={node} --membind={node}, or torchrun "
                        "--numa-binding=node)", key=(node, ranges(aff)))
        else:
            self.report(C.LINT_NUMA_BINDING, False)
