"""Datagrams to the node agent: a non-blocking UDP or unix datagram socket.

``send`` never blocks and never raises: a full socket buffer (EAGAIN), an agent
that is not listening (ECONNREFUSED on a connected UDP socket, ENOENT or
ECONNREFUSED on a unix socket) or any other OSError is counted in ``errors``
and the datagram is dropped. The agent is a best-effort observer; the training
loop never waits for it.

An agent that is not there at the start is said once, in one warning line
(``no agent at udp://127.0.0.1:9946 (connection refused): ...``). The UDP socket is
connected, so the kernel reports the ICMP port unreachable of one datagram as
ECONNREFUSED at a later send; a unix socket fails at once. The line is written when such
an error comes ``GRACE_SECONDS`` after the socket opened (an agent started together with
the job has that long to bind), or at ``close()`` for a run shorter than that, and only for errors
within ``STARTUP_SECONDS`` of the start: later ones are an agent restarting, which
Prometheus sees. One process per node writes it (node-local rank 0, like the self-check
line); the others log it at debug level. ``send`` runs on the hooks' background thread and
in ``close()``, never on the step path.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import time
from typing import Optional

from ranksight.address import Address, parse_address

from .identity import local_rank

log = logging.getLogger("ranksight.hooks")

__all__ = ("Address", "Transport", "parse_address")  # the address grammar is ranksight.address's

# errors that say nothing receives at the address, and how the warning names them
ABSENT = {errno.ECONNREFUSED: "connection refused", errno.ENOENT: "no such socket file",
          errno.ENOTDIR: "no such socket file", errno.EHOSTUNREACH: "host unreachable",
          errno.ENETUNREACH: "network unreachable", errno.EACCES: "permission denied",
          errno.EPERM: "permission denied"}
DENIED = "permission denied"  # an agent may be there: this process may not write to it
GRACE_SECONDS = 2.0
STARTUP_SECONDS = 30.0


class Transport:
    """One datagram socket. Create it off the step path (name resolution may block).
    ``announce``: write the no-agent warning (default: on node-local rank 0)."""

    def __init__(self, addr: Address, announce: Optional[bool] = None):
        self.addr = addr
        self.sent = 0
        self.errors = 0
        self.absent: Optional[str] = None  # why the agent seemed absent at the start ("connection refused")
        self._announce = local_rank(os.environ) == 0 if announce is None else announce
        self._warned = False
        self._t0 = time.monotonic()
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
            if e.errno in ABSENT and not self._warned:
                self._absent(e.errno, time.monotonic() - self._t0)
            return False
        except Exception:  # never raise into the caller
            self.errors += 1
            return False

    def _absent(self, err: int, age: float) -> None:
        """An error that says no agent is there, ``age`` seconds after the socket opened."""
        if age > STARTUP_SECONDS:
            self._warned = True  # an agent that went away later: not a start-up problem
            return
        self.absent = ABSENT[err]
        if age >= GRACE_SECONDS:
            self._warn()

    def _warn(self) -> None:
        self._warned = True
        if self.absent == DENIED:
            text = ("ranksight: cannot send to the agent at %s (%s): records are dropped; give this user access "
                    "to it or set RANKSIGHT_AGENT=off")
        else:
            text = "ranksight: no agent at %s (%s): records are dropped; start `ranksight exporter` or set " \
                   "RANKSIGHT_AGENT=off"
        try:
            log.log(logging.WARNING if self._announce else logging.DEBUG, text, self.addr, self.absent)
        except Exception:  # send() promises never to raise, and calls this from its error path
            pass

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if self.absent is not None and not self._warned and time.monotonic() - self._t0 < GRACE_SECONDS:
            self._warn()  # a run too short for the grace: said now (a later agent would have stopped the errors)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
