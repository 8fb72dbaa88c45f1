"""The stalled rank's place: the main thread's Python stack, read by the background thread.

While the main thread makes progress this costs nothing. Once it has made none for
``hooks.stack_after_seconds`` (no step finished, or its frame and line stood still), the
background thread reads the main thread's frames with ``sys._current_frames()`` (no
signal, no device sync, no extra process) and sends them to the agent as a ``"stack"``
record: the innermost frames as ``file:line function``, capped to fit one datagram. It
sends again when the stack changes, at most every ``hooks.stack_every_seconds``, and one
empty record when the rank makes progress again.

``where`` names the place: the innermost frame outside the Python standard library,
torch and ranksight itself (the user's code that called into them), with the call on
its source line (``train.py:53 in load_batch <- time.sleep``).
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ranksight import protocol

Frame = Tuple[str, int, str]  # (file, line, function)
MAX_WALK = 200  # frames walked from the innermost outwards
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _library_roots() -> Tuple[str, ...]:
    """Directory prefixes that are not the user's code: the standard library, torch, ranksight."""
    paths = sysconfig.get_paths()
    roots = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k)}
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    roots.update(os.path.join(here, sub) + os.sep for sub in ("hooks", "ranksight", "exporter"))
    torch = sys.modules.get("torch")
    tf = getattr(torch, "__file__", None) if torch is not None else None
    if tf:
        roots.add(os.path.dirname(os.path.realpath(tf)) + os.sep)
    return tuple(sorted(roots))


def read(tid: int, limit: int = MAX_WALK) -> List[Frame]:
    """The thread's frames, innermost first ([] when the thread is gone)."""
    f: Any = sys._current_frames().get(tid)
    out: List[Frame] = []
    while f is not None and len(out) < limit:
        co = f.f_code
        out.append((co.co_filename, f.f_lineno or 0, co.co_name))
        f = f.f_back
    del f
    return out


def _short(path: str, parts: int = 2) -> str:
    p = path.replace(os.sep, "/").split("/")
    return "/".join(p[-parts:])


def fmt(fr: Frame) -> str:
    return f"{_short(fr[0])}:{fr[1]} {fr[2]}"[:protocol.MAX_STACK_FRAME]


class Places:
    """Which frames are the user's (outside the standard library, torch and ranksight)."""

    def __init__(self, roots: Optional[Sequence[str]] = None) -> None:
        self.roots = tuple(roots) if roots is not None else _library_roots()
        self._memo: Dict[str, bool] = {}

    def is_user(self, path: str) -> bool:
        got = self._memo.get(path)
        if got is None:
            if path.startswith("<"):  # <frozen ...>, <string>: not a file the user wrote
                got = False
            else:
                real = os.path.realpath(path)
                got = not any(real.startswith(r) for r in self.roots) and "site-packages" not in real
            self._memo[path] = got
        return got

    def where(self, frames: Sequence[Frame]) -> str:
        """``file:line in function <- call`` of the innermost user frame ("" without frames)."""
        if not frames:
            return ""
        fr = next((f for f in frames if self.is_user(f[0])), frames[0])
        call = ""
        m = _CALL.search(linecache.getline(fr[0], fr[1]).strip())
        if m:
            call = f" <- {m.group(1)}"
        return f"{os.path.basename(fr[0])}:{fr[1]} in {fr[2]}{call}"[:protocol.MAX_STACK_WHERE]


@dataclass
class StackWatch:
    """Decides, on the background thread, when to send the main thread's stack."""

    tid: int
    after_s: float  # no progress for this long: send the stack
    every_s: float  # at most this often (unless it changed after at least this long)
    places: Optional[Places] = None
    _sent: Optional[Tuple[Tuple[str, ...], Optional[Tuple[Any, ...]]]] = None  # (frames, cw position) sent
    _sent_at: float = -1e18

    def tick(self, now: float, idle_s: float, phase: str,
             waiting: Optional[Callable[[], Optional[Dict[str, Any]]]] = None) -> Optional[Dict[str, Any]]:
        """The "stack" record's fields to send now, or None. ``idle_s``: seconds without progress.
        ``waiting()``, called only when the stack is read, gives the collective the rank waits in
        (``cw``); a record goes out when the frames or that collective changed. A rank blocked in
        one collective keeps its frames while the position can still move (the Flight Recorder
        retires an earlier collective from another thread, after the rank went on)."""
        if self.after_s <= 0:
            return None
        if idle_s < self.after_s:
            if self._sent is not None:  # progress again: one empty record clears the agent's stack
                self._sent, self._sent_at = None, now
                return {"frames": [], "where": "", "idle": 0.0, "phase": phase}
            return None
        if now - self._sent_at < self.every_s:
            return None
        if self.places is None:
            self.places = Places()
        frames = read(self.tid)
        shown = tuple(fmt(f) for f in frames[:protocol.MAX_STACK_FRAMES])
        cw = waiting() if waiting is not None and shown else None
        key = (shown, None if cw is None else (cw.get("op"), cw.get("pg"), cw.get("seq")))
        if key == self._sent:
            return None
        self._sent, self._sent_at = key, now
        body: Dict[str, Any] = {"frames": list(shown), "where": self.places.where(frames), "idle": round(idle_s, 3),
                                "phase": phase}
        if cw is not None:
            body["cw"] = cw
        return body


def fit(base: Dict[str, Any], body: Dict[str, Any]) -> bytes:
    """Encode ``base + body`` as one datagram, dropping the outermost frames until it fits
    ``protocol.STACK_DATAGRAM``."""
    rec = dict(base, **body)
    data = protocol.encode(rec)
    frames = list(body.get("frames", []))
    while len(data) > protocol.STACK_DATAGRAM and frames:
        frames.pop()
        rec["frames"] = frames
        data = protocol.encode(rec)
    return data
