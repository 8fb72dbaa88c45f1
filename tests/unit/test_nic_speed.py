"""A NIC's negotiated speed, from the kernel to the agent's series.

veth pairs report a fixed 10000 Mb/s: the kernel's veth driver has no set_link_ksettings
(`ethtool -s VETH speed 1000` answers "Operation not supported"). A tap device's speed can be
set (`ethtool -s TAP speed N duplex full autoneg off`), so the test renegotiates a real tap
interface and reads the agent's /metrics. The alert's judgement (below its own best of the day,
below its job peers', only for a NIC carrying traffic) is tested on the rules by promtool
(alerts/tests/causes.yml).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Iterator

import pytest

from ranksight import catalog as C

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture
def tap() -> Iterator[str]:
    if os.geteuid() != 0 or not shutil.which("ethtool") or not shutil.which("ip"):
        pytest.fail("needs root, ip and ethtool (apt-get install ethtool)", pytrace=False)
    name = f"rstap{os.getpid() % 10000}"
    subprocess.run(["ip", "tuntap", "add", "dev", name, "mode", "tap"], check=True)
    try:
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], check=False)


def _set_speed(dev: str, mbps: int) -> None:
    subprocess.run(["ethtool", "-s", dev, "speed", str(mbps), "duplex", "full", "autoneg", "off"], check=True)


def _speed(text: str, dev: str):
    m = re.search(rf'^{C.NET_IF_SPEED.name}{{[^}}]*device="{dev}"[^}}]*}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_a_renegotiated_nic_shows_its_new_speed(agent, tap: str) -> None:
    _set_speed(tap, 100)
    a = agent(collectors="network")
    assert _speed(a.metrics_text(), tap) == 100 * 125_000  # Mb/s -> bytes/s
    _set_speed(tap, 10000)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _speed(a.metrics_text(), tap) != 10000 * 125_000:
        time.sleep(0.2)
    assert _speed(a.metrics_text(), tap) == 10000 * 125_000
