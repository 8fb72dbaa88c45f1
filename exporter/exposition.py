"""Text exposition of prometheus_client metric families, byte-identical to
``prometheus_client.generate_latest`` and about four times faster.

``generate_latest`` validates and escapes every label name of every sample and
sorts each sample's labels; on a 2-core CI machine that is ~7 us per sample,
so ~1,100 samples (8 ranks, 8 GPUs, the network) cost ~8 ms. The agent's label
sets repeat from one scrape to the next, so this writer caches each label set's
rendered form. A test renders the same registry both ways and compares bytes.
The agent always answers in this classic text format (version 0.0.4), as
node_exporter does by default.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from prometheus_client.core import Metric as Family
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString

from .collectors import Labels

CACHE_LIMIT = 200_000  # label sets; cleared when exceeded (label churn: ranks coming and going)

_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram", "summary": "summary",
          "info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


def _value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _render_labels(items: Iterable[Tuple[str, str]]) -> str:
    items = sorted(items)
    if not items:
        return ""
    return "{" + ",".join(f'{escape_label_name(k)}="{_value(v)}"' for k, v in items) + "}"


class TextWriter:
    """Renders families to the Prometheus text format; keeps a label-set cache between scrapes."""

    def __init__(self) -> None:
        self._labels: Dict[Tuple[Tuple[str, str], ...], str] = {}
        self._names: Dict[Tuple[str, str], Tuple[str, Optional[str]]] = {}

    def _labelstr(self, items: Tuple[Tuple[str, str], ...]) -> str:
        s = self._labels.get(items)
        if s is None:
            if len(self._labels) >= CACHE_LIMIT:
                self._labels.clear()
            s = self._labels[items] = _render_labels(items)
        return s

    def render(self, families: Iterable[Family]) -> bytes:
        out: List[str] = []
        append = out.append
        labelstr = self._labelstr
        cache = self._labels
        fmt = floatToGoString
        names = self._names
        for metric in families:
            mname = metric.name
            mtype = metric.type
            if mtype == "counter":
                mname = mname + "_total"
            elif mtype == "info":
                mname = mname + "_info"
            ename = escape_metric_name(mname)
            if len(names) > CACHE_LIMIT:
                names.clear()
            doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
            append(f"# HELP {ename} {doc}\n# TYPE {ename} {_TYPES.get(mtype, mtype)}\n")
            om: Dict[str, List[str]] = {}
            base = metric.name
            for s in metric.samples:
                name, lab, value, ts, ex = s[0], s[1], s[2], s[3], s[4]
                if ts is not None or ex is not None:
                    raise ValueError("timestamps and exemplars are not rendered by this writer")
                if lab.__class__ is Labels:
                    ls = lab.text
                    if ls is None:
                        ls = lab.text = _render_labels(lab.items())
                else:
                    items = tuple(lab.items())
                    ls = cache.get(items)
                    if ls is None:
                        ls = labelstr(items)
                got = names.get((base, name))
                if got is None:
                    suffix = name[len(base):] if name.startswith(base) else ""
                    got = names[(base, name)] = (escape_metric_name(name), suffix if suffix in _OM_SUFFIXES else None)
                en, om_suffix = got
                v = float(value)
                # floatToGoString, inlined for the common case: below 1e6 in magnitude it is repr()
                line = f"{en}{ls} {repr(v) if -1e6 < v < 1e6 else fmt(v)}\n"
                if om_suffix is None:
                    append(line)
                else:
                    om.setdefault(om_suffix, []).append(line)
            for suffix, lines in sorted(om.items()):
                en = escape_metric_name(base + suffix)
                append(f"# HELP {en} {doc}\n# TYPE {en} gauge\n")
                out.extend(lines)
        return "".join(out).encode("utf-8")
