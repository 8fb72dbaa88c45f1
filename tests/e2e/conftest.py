"""The end-to-end fault suite's shared fixture: one Suite (stack, agents) per session."""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from netns import available
from suite import Suite


@pytest.fixture(scope="session")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Suite]:
    why = available()
    if why:
        pytest.fail(f"the end-to-end suite {why} (network namespaces, veths, iptables)", pytrace=False)
    s = Suite(tmp_path_factory.mktemp("e2e"))
    try:
        s.start()
        yield s
    finally:
        s.close()
        print(f"\ne2e suite: {time.monotonic() - s.t0:.0f} s wall (logs, triage reports: {s.dir})")
        for n, o in s.results.items():
            c = (o.triage or {}).get("cause") or {}
            print(f"  {n:16} {o.seconds:5.1f} s  first step {o.first_step_s:5.1f} s  detect {o.detect_s:5.1f} s  "
                  f"triage exit {o.triage_rc} {c.get('alert', '-')} {c.get('labels', {}).get('rank', c.get('labels', {}).get('node', ''))} "
                  f"value {c.get('value')}{'  ERROR ' + o.error.splitlines()[0] if o.error else ''}")
            if o.timeline:
                print("      alerts: " + ", ".join(o.timeline))
