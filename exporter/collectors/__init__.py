"""Collectors of the node agent, one per file, in the node_exporter style.

Each collector is a small class with a ``name`` and a ``collect()`` method that
returns prometheus_client ``*MetricFamily`` objects built from catalog entries.
``collect()`` raises :class:`CollectorError` when the collector cannot run (no
NVML, no /sys/class/infiniband); the agent then reports
``ranksight_collector_up{collector=...} 0``, logs the reason once and carries on
with the other collectors. A collector whose inputs are partly missing exposes
what it could read and raises :class:`PartialError` so that ``collector_up`` is
0 while the readable series stay exposed.

Each collector module registers a factory under its name (``@register("gpu")``), as
node_exporter's collectors do; the agent builds the ones enabled in ``agent.collectors``
(catalog.COLLECTOR_NAMES, in that order) from a :class:`Context` with :func:`build`.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric as Family,
)
from prometheus_client.samples import Sample

from prometheus_client.utils import floatToGoString

from ranksight import catalog as C
from ranksight.catalog import Metric


class CollectorError(Exception):
    """The collector cannot run now; the message is the one log line."""


class PartialError(CollectorError):
    """Some inputs were missing; ``families`` holds what could be read."""

    def __init__(self, message: str, families: List[Family]):
        super().__init__(message)
        self.families = families


class Labels(dict):
    """An immutable-by-convention label set that caches its rendered text.

    Collectors keep one ``Labels`` per series across scrapes (built when a rank
    or GPU first appears); the text writer renders it once. To prometheus_client
    it is an ordinary dict, so its own encoders produce the same bytes.
    """

    __slots__ = ("text",)

    def __init__(self, *args: object, **kw: str) -> None:
        super().__init__(*args, **kw)
        self.text: Optional[str] = None

    def plus(self, key: str, value: str) -> "Labels":
        d = Labels(self)
        d[key] = value
        return d


def family(m: Metric) -> Family:
    """An empty MetricFamily for catalog entry ``m`` with its catalog labels.
    ``fam.sname`` is the sample name of a counter/gauge series."""
    labels = list(m.labels)
    if m.type == "counter":
        f = CounterMetricFamily(m.name, m.help, labels=labels)
        f.sname = f.name + "_total"
    elif m.type == "histogram":
        f = HistogramMetricFamily(m.name, m.help, labels=labels)
        f.sname = f.name
    else:
        f = GaugeMetricFamily(m.name, m.help, labels=labels)
        f.sname = f.name
    return f


def add(fam: Family, labels: Labels, value: float) -> None:
    """Append one counter/gauge sample (what add_metric does, minus rebuilding the label dict)."""
    fam.samples.append(Sample(fam.sname, labels, value))


def le_strings(bounds: Tuple[float, ...]) -> Tuple[str, ...]:
    """Bucket bounds as Prometheus `le` label values, +Inf appended (cached per bucket tuple)."""
    got = _LE_CACHE.get(bounds)
    if got is None:
        got = tuple(floatToGoString(b) for b in bounds) + ("+Inf",)
        _LE_CACHE[bounds] = got
    return got


_LE_CACHE: Dict[Tuple[float, ...], Tuple[str, ...]] = {}


def bucket_labels(base: Labels, bounds: Tuple[float, ...]) -> List[Labels]:
    return [base.plus("le", le) for le in le_strings(bounds)]


def add_histogram(fam: Family, base: Labels, buckets: Sequence[Labels], counts: Sequence[int], total: float) -> None:
    """One histogram series from non-cumulative ``counts`` (one per bucket, +Inf last);
    ``buckets`` are the series' per-bucket label sets (``bucket_labels``)."""
    name = fam.name
    bname = name + "_bucket"
    samples = fam.samples
    acc = 0
    for lab, c in zip(buckets, counts):
        acc += c
        samples.append(Sample(bname, lab, acc))
    samples.append(Sample(name + "_count", base, acc))
    samples.append(Sample(name + "_sum", base, total))


def read_text(path: str) -> Optional[str]:
    """A sysfs/procfs file's stripped text, or None when it is missing or unreadable
    (sysfs answers EINVAL for e.g. the speed of a down link). os.read, not open():
    a scrape reads dozens of these and a buffered file object costs 3x the syscalls' time."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace").strip()


def read_int(path: str) -> Optional[int]:
    s = read_text(path)
    if s is None:
        return None
    try:
        return int(s)
    except ValueError:
        return None


@dataclass
class Context:
    """What a collector's factory may take from the agent."""

    settings: Any  # exporter.agent.AgentSettings
    table: Any = None  # the rank table (exporter.ranks.RankTable), None without the ranks collector
    nvml: Any = None  # an NVML module or stand-in for the gpu collector; None: pynvml
    gpu: Any = None  # the gpu collector once built (the ranks collector joins on its UUID labels)


Factory = Callable[[Context], Any]
FACTORIES: Dict[str, Factory] = {}


def register(name: str) -> Callable[[Factory], Factory]:
    """Decorator: ``factory(ctx)`` builds the collector called ``name`` (one of catalog.COLLECTOR_NAMES)."""
    if name not in C.COLLECTOR_NAMES:
        raise ValueError(f"collector {name!r} is not in catalog.COLLECTOR_NAMES")

    def deco(factory: Factory) -> Factory:
        FACTORIES[name] = factory
        return factory
    return deco


def build(name: str, ctx: Context) -> Any:
    """The collector ``name``, built by the factory its module registered (importing the module)."""
    if name not in FACTORIES:
        importlib.import_module(f"{__name__}.{name}")
    return FACTORIES[name](ctx)


__all__: Iterable[str] = (
    "CollectorError", "PartialError", "Labels", "family", "add", "add_histogram", "bucket_labels", "le_strings",
    "read_text", "read_int", "Family", "Context", "register", "build", "FACTORIES",
)
