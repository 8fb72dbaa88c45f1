"""Values as people read them: the one formatter of the triage text, the run report, the
dashboards' descriptions and the benchmarks' summaries (torch-free).

``value(v, unit, multiple=False) -> str``
    A measured value in a triage unit (``ratio``, ``seconds``, ``bytes``, ``per_minute``; any
    other unit prints the number): ``12.5%``, ``3.2 s``, ``4.5 min``, ``1.2 GB``, ``3/min``; None
    is ``-``; ``multiple`` prints a ratio to a reference as ``1.20x``.
``grafana(v, unit) -> str``
    A value in a Grafana unit id (``percentunit``, ``s``, ``bytes``, ``Bps``, ``none``; others
    print the number), as a panel shows it.
``threshold(v, unit) -> str``
    A configured threshold in a sentence, at the precision it was written: ``10%``, ``60 s``,
    ``1.25 GB/s``, ``3 per minute``.
``binary_bytes(n) -> str``
    A size in powers of 1024: ``512 B``, ``1.5 GiB``.
``size(n) -> str``
    A size in a sentence with one decimal, at least in kB: ``12.3 GB``, ``4.0 MB``, ``0.5 kB``.
"""
from __future__ import annotations

from typing import Optional, Tuple

SI: Tuple[Tuple[str, float], ...] = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))
BINARY = ("B", "KiB", "MiB", "GiB", "TiB")


def _si(v: float, unit: str) -> Optional[str]:
    """v scaled by the largest SI prefix it reaches (3 significant digits), None below 1 k."""
    for prefix, div in SI:
        if abs(v) >= div:
            return f"{v / div:.3g} {prefix}{unit}"
    return None


def value(v: Optional[float], unit: str, multiple: bool = False) -> str:
    if v is None:
        return "-"
    if unit == "ratio":
        return f"{v:.2f}x" if multiple else f"{v:.1%}"
    if unit == "seconds":
        return f"{v:.3g} s" if v < 120 else f"{v / 60:.1f} min"
    if unit == "bytes":
        return _si(v, "B") or f"{v:g} B"
    if unit == "per_minute":
        return f"{v:.3g}/min"
    return f"{v:.4g}"


def grafana(v: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{v:.1%}"
    if unit == "s":
        return f"{v:.3g} s" if abs(v) < 100 else f"{v:.0f} s"
    if unit in ("bytes", "Bps"):
        return (_si(v, "B") or f"{v:.3g} B") + ("/s" if unit == "Bps" else "")
    return f"{v:.3g}"


def threshold(v: float, unit: str) -> str:
    if unit == "ratio":
        return f"{v:.0%}"
    if unit == "seconds":
        return f"{v:g} s"
    if unit == "bytes":
        return f"{v / 1e9:g} GB/s"
    if unit == "per_minute":
        return f"{v:g} per minute"
    return f"{v:g}"


def size(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB"


def binary_bytes(n: float) -> str:
    for unit in BINARY:
        if abs(n) < 1024 or unit == BINARY[-1]:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return str(n)
