"""A datagram receiver that validates every record with ``protocol.decode``: what tests,
benchmarks and debugging sessions use to see exactly what the hooks send.

    with Receiver() as rx:                       # a free UDP port on loopback
        os.environ["RANKSIGHT_AGENT"] = rx.url
        ...
        rx.wait_for(lambda: rx.of("step"))

``forward=("127.0.0.1", port)`` also passes every datagram on (e.g. to a real agent);
``forward_bye=False`` holds back "bye" records so the agent keeps the ranks visible.

The hooks send each step's phase times (data, fwd, bwd, ...) only when asked for step detail
(``hooks.step_detail``; by default a protocol 3 or 4 "steps" record carries each step's ``dur`` and the
totals): a watch whose steps are read here gets ``with_detail(config)``, or ``DETAIL_ENV`` in its
process's environment.
"""
from __future__ import annotations

import socket
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .. import protocol
from ..common.plumbing import wait_until

DETAIL_ENV = {"RANKSIGHT__hooks__step_detail": "1"}  # a sender's environment: every step's phase times


def with_detail(config: Mapping[str, Any]) -> Dict[str, Any]:
    """A watch's config dict with ``hooks.step_detail`` on: every step's phase times are sent."""
    return dict(config, hooks=dict(config.get("hooks") or {}, step_detail=True))


class Receiver:
    def __init__(self, forward: Optional[Tuple[str, int]] = None, forward_bye: bool = True,
                 rcvbuf: int = 1 << 22) -> None:
        self.forward = forward
        self.forward_bye = forward_bye
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port: int = self.sock.getsockname()[1]
        self.records: List[Dict[str, Any]] = []
        self.invalid: List[str] = []  # "result: why in b'...'" for each datagram decode() refused
        self._out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if forward else None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="ranksight-receiver", daemon=True)
        self._t.start()

    @property
    def url(self) -> str:
        return f"udp://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                rec = protocol.decode(data)
            except protocol.ProtocolError as e:
                self.invalid.append(f"{e.result}: {e} in {data[:300]!r}")
                continue
            if rec["t"] == "steps":  # consecutive steps in one datagram: one "step" record each
                self.records.extend(protocol.expand_steps(rec))
            else:
                self.records.append(rec)
            if self._out is not None and (self.forward_bye or rec["t"] != "bye"):
                try:
                    self._out.sendto(data, self.forward)
                except OSError:
                    pass

    def of(self, t: str, rank: Optional[int] = None) -> List[Dict[str, Any]]:
        return [r for r in self.records if r["t"] == t and (rank is None or r["rank"] == rank)]

    def steps(self) -> List[Dict[str, Any]]:
        return sorted(self.of("step"), key=lambda r: r["seq"])

    def wait_for(self, pred: Callable[[], Any], timeout: float = 5.0) -> bool:
        return wait_until(pred, timeout, 0.02) is not None

    def wait_step(self, seq: int, timeout: float = 10.0) -> bool:
        return self.wait_for(lambda: any(r["t"] == "step" and r["seq"] >= seq for r in self.records), timeout)

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=2)
        self.sock.close()
        if self._out is not None:
            self._out.close()

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
