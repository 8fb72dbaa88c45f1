"""Datagrams to the node agent: a non-blocking UDP or unix datagram socket.

``send`` never blocks and never raises: a full socket buffer (EAGAIN), an agent
that is not listening (ECONNREFUSED on a connected UDP socket, ENOENT or
ECONNREFUSED on a unix socket) or any other OSError is counted in ``errors``
and the datagram is dropped. The agent is a best-effort observer; the training
loop never waits for it.
"""
from __future__ import annotations

import logging
import socket
from typing import Optional

from ranksight.address import Address, parse_address

log = logging.getLogger("ranksight.hooks")

__all__ = ("Address", "Transport", "parse_address")  # the address grammar is ranksight.address's


class Transport:
    """One datagram socket. Create it off the step path (name resolution may block)."""

    def __init__(self, addr: Address):
        self.addr = addr
        self.sent = 0
        self.errors = 0
        self._last_errno: Optional[int] = None
        self._sock: Optional[socket.socket] = None
        if addr.scheme == "off":
            return
        try:
            if addr.scheme == "udp":
                host, port = addr.target  # type: ignore[misc]
                family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
                sock = socket.socket(family, socket.SOCK_DGRAM)
                sock.setblocking(False)
                # connect() so the kernel reports ECONNREFUSED (no agent) instead of dropping silently
                sock.connect(sockaddr)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
            self._sock = sock
        except OSError as e:
            self.errors += 1
            log.warning("ranksight: cannot open a socket to the agent at %s (%s); datagrams are dropped", addr, e)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, data: bytes) -> bool:
        sock = self._sock
        if sock is None:
            return False
        try:
            if self.addr.scheme == "udp":
                sock.send(data)
            else:
                sock.sendto(data, self.addr.target)  # type: ignore[arg-type]
            self.sent += 1
            return True
        except OSError as e:  # EAGAIN, ECONNREFUSED, ENOENT, EMSGSIZE ...
            self.errors += 1
            if e.errno != self._last_errno:
                self._last_errno = e.errno
                log.debug("ranksight: send to %s failed: %s (counted, dropped)", self.addr, e)
            return False
        except Exception:  # never raise into the caller
            self.errors += 1
            return False

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
