"""Where the hooks' datagrams go and where the agent binds: the address grammar both sides read
(``udp://host:port``, ``unix:///absolute/path``, and ``off`` for a sender). The records themselves
are ranksight.protocol's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple, Union
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Address:
    """Where the datagrams go: the hooks send to it, the agent binds it."""

    kind: str  # "udp" | "unix" | "off" (the hooks send nothing)
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def scheme(self) -> str:
        return self.kind

    @property
    def target(self) -> Union[Tuple[str, int], str, None]:
        """(host, port) for udp, the socket path for unix, None for off."""
        return (self.host, self.port) if self.kind == "udp" else self.path if self.kind == "unix" else None

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix://{self.path}"
        if self.kind == "udp":
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"udp://{host}:{self.port}"
        return "off"


def parse_address(s: str, listen: bool = False) -> Address:
    """'udp://host:port' | 'unix:///absolute/path', and for a sender (``listen`` False) also 'off'.
    The agent (``listen`` True) may bind port 0 (any free port); a sender needs a real one.
    Raises ValueError with one clear line naming the address ("ingest address" / "agent address")."""
    what = "ingest address" if listen else "agent address"
    s = (s or "").strip()
    if not listen and s.lower() in ("off", "none", ""):
        return Address("off")
    if s.startswith("unix://"):
        path = s[len("unix://"):]
        if not path.startswith("/"):
            raise ValueError(f"{what} {s!r}: unix:// needs an absolute path (unix:///run/ranksight.sock)")
        return Address("unix", path=path)
    if s.startswith("udp://"):
        u = urlsplit(s)
        try:
            port = u.port
        except ValueError:
            port = None
        if not u.hostname or port is None or not (0 if listen else 1) <= port <= 65535 or u.path not in ("", "/"):
            raise ValueError(f"{what} {s!r}: expected udp://host:port")
        return Address("udp", host=u.hostname, port=port)
    raise ValueError(f"{what} {s!r}: expected udp://host:port, unix:///path" + ("" if listen else " or off"))
