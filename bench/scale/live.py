"""The scale benchmark's series served live: one loopback HTTP endpoint per node, each scrape
answering every series of that node at the newest sample time not after now, with that sample's
timestamp (Prometheus text format, milliseconds). Two scrapers (Prometheus, vmagent) that honor
timestamps store the same samples, whenever each of them scrapes.

``LiveSeries(scn, steady=True)``: ``start() -> [host:port, ...]`` (one target per node),
``stop()``, context manager. ``steady`` takes the model's noise and its job-step jitter out (every
rate constant), keeping the checkpoint writes ``checkpoints`` lists (sample times at which a
checkpoint adds its seconds), so a comparison of two engines sees only how each evaluates.
"""
from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Sequence

from .generator import Generator
from .scenario import Scenario

# the series a scraper adds itself (the generator writes them for backfills)
_SCRAPER_SERIES = ("up{", "scrape_duration_seconds{", "scrape_samples_scraped{",
                   "scrape_samples_post_metric_relabeling{", "scrape_series_added{")


def steady_generator(scn: Scenario, checkpoints: Sequence[int] = (), last_checkpoint: Optional[float] = None) -> Generator:
    """A generator whose model has constant step times (no noise, no jitter, counts not rounded to
    whole numbers, the step counters undisturbed by checkpoints) and checkpoint writes only at the sample times ``checkpoints`` (the
    checkpoint counters jump there)."""
    g = Generator(scn)
    m = g.model
    T = m.T
    d = sum(m.D) / T
    m.D = [d] * T
    m.n = [m.s / d] * T
    bursts = [m.CKPT_SECONDS if t in set(checkpoints) else 0.0 for t in m.ts]
    m.ckpt = bursts
    m.last_ckpt_ts = [float(last_checkpoint if last_checkpoint is not None else scn.t0)] * T
    m._noise = lambda key, v, sd: [0.0] * T  # type: ignore[assignment]
    # counts unrounded: an integer counter advancing 1.5 a sample would rise in steps of 1 and 2
    m._fmt_int = lambda xs: [f"{x:.4f}" for x in xs]  # type: ignore[assignment]
    step_seconds = type(m)._v_step_seconds_total

    def undisturbed(metric, profile, v):
        m.ckpt = [0.0] * T
        try:
            return step_seconds(m, metric, profile, v)
        finally:
            m.ckpt = bursts

    m._v_step_seconds_total = undisturbed  # type: ignore[assignment]
    return g


def _by_time(text: str) -> Dict[int, str]:
    """OpenMetrics text with seconds timestamps -> {time: Prometheus text of that time, ms stamps}."""
    out: Dict[int, List[str]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#" or line.startswith(_SCRAPER_SERIES):
            continue
        head, _, ts = line.rpartition(" ")
        t = int(float(ts))
        out.setdefault(t, []).append(f"{head} {t * 1000}\n")
    return {t: "".join(lines) for t, lines in out.items()}


class LiveSeries:
    """See the module doc."""

    def __init__(self, scn: Scenario, generator: Optional[Generator] = None):
        self.scn = scn
        self.generator = generator or Generator(scn)
        self._texts: List[Dict[int, str]] = []
        self._servers: List[ThreadingHTTPServer] = []

    def _render(self) -> None:
        for n in range(self.scn.nodes):
            buf = io.StringIO()
            self.generator.write(buf, [n])
            self._texts.append(_by_time(buf.getvalue()))

    def body(self, node: int, now: Optional[float] = None) -> bytes:
        """What a scrape of ``node`` answers at ``now``: the newest sample time not after it."""
        scn = self.scn
        t = (int(now if now is not None else time.time()) - scn.t0) // scn.step * scn.step + scn.t0
        t = min(max(t, scn.t0), scn.t_end)
        return self._texts[node][t].encode()

    def start(self) -> List[str]:
        self._render()
        live = self

        for n in range(self.scn.nodes):
            class Handler(BaseHTTPRequestHandler):
                node = n

                def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                    body = live.body(self.node)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def log_message(self, *args) -> None:
                    pass

            srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            threading.Thread(target=srv.serve_forever, daemon=True, name=f"live-node-{n}").start()
            self._servers.append(srv)
        return [f"127.0.0.1:{s.server_address[1]}" for s in self._servers]

    def stop(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()
        self._servers = []

    def __enter__(self) -> List[str]:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
