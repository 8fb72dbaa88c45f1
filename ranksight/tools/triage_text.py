"""The words of `ranksight triage`: values, thresholds and places as the on-call engineer reads them,
the verdict of each check, and the text report (``render_text``). The walk itself, the JSON report
and the command are in ``triage_cli.py``; both print the same verdict words (``status``).

Layout rules of the text table:

- a check's name wraps at a word boundary onto a continuation line; it is never cut;
- a label value longer than NAME_MAX characters is shortened: a host name to its host without the
  domain (``gpu-node-017``), any other (a long job name) in the middle, keeping its head and its
  distinguishing tail (``llama-70…-west4-run-0042``); the header gives each shortened name in full once;
- the ``where`` column is as wide as its widest place (at most WHERE_MAX), and wraps between labels;
- a value past its threshold never reads "ok": a check whose alert condition does not hold while
  its value is past the headline threshold reads "watch: over, not alerting: <what the alert also
  needs>" ("under" for a floor).
"""
from __future__ import annotations

import importlib.util
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .. import triage
from ..common import units
from ..triage import Entry

if TYPE_CHECKING:  # the walk's types; triage_cli imports this module
    from .triage_cli import Check, Finding, Report

SHOWN_LABELS = ("job", "node", "rank", "gpu", "device", "path", "instance", "collector", "lint", "xid", "pg")
ELLIPSIS = "…"
NAME_MAX = 24  # label values longer than this are shortened in the middle
NAME_HEAD = 8  # characters a shortened name keeps from its start (the rest of NAME_MAX from its end)
TITLE_WIDTH = 40
WHERE_MAX = 56
HOST_LABELS = ("node", "instance")  # their values are host names: shortened to the host without its domain
VALUE_WIDTH = 12
THRESHOLD_WIDTH = 11
# What one place of each scope is called in "(and 3 more ranks, 1 more job)": the scope's last label.
NOUNS = {"rank": "rank", "gpu": "GPU", "node": "node", "instance": "agent", "path": "path", "device": "device",
         "pg": "group", "collector": "collector", "job": "job"}


# ------------------------------------------------------------------ values and thresholds
def multiple(e: Entry) -> bool:
    """A ratio to a reference (the straggler's 1.2x the job median), not a share of 1."""
    return e.unit == "ratio" and e.threshold is not None and e.threshold >= 1


def fmt_threshold(e: Entry) -> str:
    if e.threshold is None:
        return "below max"
    if e.unit == "bool":
        return "== 0" if e.op == "<" else "== 1"
    return f"{e.op} {units.value(e.threshold, e.unit, multiple(e))}"


def crosses(e: Entry, v: Optional[float]) -> bool:
    """True when ``v`` is on the abnormal side of the entry's headline threshold."""
    if v is None or e.threshold is None:
        return False
    return v > e.threshold if e.op == ">" else v < e.threshold


def gate(e: Entry, cfg: Mapping[str, Any]) -> str:
    """What the entry's alert needs besides its headline threshold, in the on-call engineer's words:
    why a value past the threshold may not alert. Read off the alert's expression where it varies."""
    t, w = cfg.get("thresholds", {}), cfg.get("windows", {})

    def settled() -> str:  # read inside the try below: a config without windows.rate gets the plain line
        return f"the rank stepping for a whole {w['rate']} rate window, and no rank of the job stalled"

    def straggler() -> str:
        also = ", and the job not comm-bound by itself" if triage.REC["job_comm_min"] in e.expr else ""
        return f"also needs the extra busy time over {t['straggler_min_step_share']:.0%} of the step{also}, {settled()}"

    needs = {
        "straggler": straggler,
        "pipeline-straggler": lambda: (f"also needs the extra busy time over {t['pipeline_straggler_min_share']:.0%} "
                                       f"of wall time, {settled()}"),
        "comm-bound": lambda: f"judged once the rank has stepped for a whole {w['rate']} rate window",
        "goodput-low": lambda: f"judged once the job's goodput has {w['goodput_min_wall']} of history",
        "step-time-regression": lambda: f"judged once the job's step time has {w['step_smooth']} of history",
        "tcp-retransmits": lambda: f"also needs over {t['retransmit_min_rate']:g} retransmits/s",
        "gpu-sawtooth": lambda: f"also needs {t['gpu_swings_per_min']:g}+ high-to-low swings a minute",
        "checkpoint-stale": lambda: "judged only while the rank is up",
    }
    try:
        return needs[e.id]() if e.id in needs else "the alert's other conditions do not hold"
    except KeyError:  # a config without that key: say it plainly
        return "the alert's other conditions do not hold"


def runbook_path(e: Entry) -> Optional[Path]:
    """The entry's runbook in this checkout or install (alerts/runbooks/<id>.md, shipped as package data
    of ranksight.alerts), None where it is absent."""
    try:
        spec = importlib.util.find_spec("ranksight.alerts")
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec is not None else []:
        p = Path(d) / "runbooks" / f"{e.id}.md"
        if p.is_file():
            return p.resolve()
    return None


# ------------------------------------------------------------------ names and places
def shorten(value: str, tail: int = NAME_MAX - NAME_HEAD - 1) -> str:
    """``value`` cut in the middle to NAME_HEAD + 1 + ``tail`` characters (unchanged when it fits)."""
    if len(value) <= NAME_HEAD + 1 + tail:
        return value
    return f"{value[:NAME_HEAD]}{ELLIPSIS}{value[-tail:]}"


def host_part(value: str) -> str:
    """A host name without its domain, the port kept (``gpu-017.dc.example.com:9945`` -> ``gpu-017:9945``);
    ``value`` itself when it has no domain or is an address."""
    host, colon, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    if "." not in host or host.replace(".", "").isdigit():
        return value
    return host.split(".", 1)[0] + colon + port


class Names:
    """Label values as the text shows them: long ones shortened, each short form unique among the
    values given; ``legend`` lists the shortened ones that were shown, in full. A host name (labels
    of HOST_LABELS) loses its domain; any other long value is cut in the middle."""

    def __init__(self, values: Iterable[Tuple[str, str]] = (), shorten_names: bool = True) -> None:
        """``values``: (label, value) pairs."""
        self.short: Dict[str, str] = {}
        self.used: Dict[str, str] = {}
        pairs = list(values) if shorten_names else []
        longs = sorted({v for _, v in pairs if len(v) > NAME_MAX})
        hosts = {v: host_part(v) for k, v in pairs if k in HOST_LABELS and v in longs}
        taken = {v for _, v in pairs}
        counts: Dict[str, int] = {}
        for h in hosts.values():
            counts[h] = counts.get(h, 0) + 1
        for v, h in hosts.items():  # a domain-less name that is short and names one host only
            if h != v and len(h) <= NAME_MAX and counts[h] == 1 and h not in taken:
                self.short[v] = h
        rest = [v for v in longs if v not in self.short]
        tail = NAME_MAX - NAME_HEAD - 1
        while rest:
            forms = {v: shorten(v, tail) for v in rest}
            if len(set(forms.values()) | set(self.short.values())) == len(forms) + len(self.short):
                self.short.update(forms)
                break
            tail += 4  # two names share head and tail: keep more of the tail

    parallel: Mapping[Tuple[str, str], Tuple[str, str]] = {}  # (job, rank) -> (strategy, ZeRO stage)

    def __call__(self, value: str) -> str:
        s = self.short.get(value, value)
        if s != value:
            self.used[value] = s
        return s

    def legend(self, skip: Iterable[str] = ()) -> List[str]:
        """Lines giving the shortened names that were shown, in full (none when nothing was shortened)."""
        skipped = set(skip)
        shown = sorted((s, v) for v, s in self.used.items() if v not in skipped)
        return ["names shortened below:"] + [f"  {s} = {v}" for s, v in shown] if shown else []


FULL = Names(shorten_names=False)


def fmt_labels(labels: Mapping[str, str], names: Names = FULL) -> str:
    return " ".join(f"{k}={names(labels[k])}" for k in SHOWN_LABELS if labels.get(k, "") != "")


def parallel_text(strategy: str, zero_stage: str) -> str:
    """"deepspeed ZeRO-2", "ddp": how a rank's model is parallelized, as the report names it."""
    return f"{strategy} ZeRO-{zero_stage}" if zero_stage else strategy


def where(e: Entry, labels: Mapping[str, str], show_job: bool = True, names: Names = FULL) -> str:
    """The labels that say where: the entry's scope (job only when not triaging one job); a rank
    followed by how its model is parallelized, when its hello said ("rank=3 (deepspeed ZeRO-2)")."""
    keep = [k for k in e.scope if show_job or k != "job"]
    text = fmt_labels({k: v for k, v in labels.items() if k in keep}, names)
    par = names.parallel.get((labels.get("job", ""), labels.get("rank", ""))) if "rank" in keep else None
    return f"{text} ({parallel_text(*par)})" if par and text else text


def more(first: "Finding", others: Sequence["Finding"]) -> str:
    """' (and 3 more ranks, 1 more job)': the other places of the same alert than ``first``."""
    e = first.entry
    noun = NOUNS.get(e.scope[-1], "place") if e.scope else "place"
    key = lambda f: tuple(f.labels.get(k, "") for k in e.scope)  # noqa: E731
    places = {key(f) for f in others} - {key(first)}
    job = lambda f: f.labels.get("job", "")  # noqa: E731
    jobs = {job(f) for f in others if job(f) not in ("", triage.SCRAPE_JOB)} - {job(first)}
    parts = [f"{len(places)} more {noun}{'s' if len(places) > 1 else ''}"] if places else []
    if noun != "job" and jobs:
        parts.append(f"{len(jobs)} more job{'s' if len(jobs) > 1 else ''}")
    return f" (and {', '.join(parts)})" if parts else ""


def by_alert(findings: Sequence["Finding"]) -> List[Tuple["Finding", List["Finding"]]]:
    """The findings grouped by alert, in their order: (the first of each alert, the rest)."""
    out: Dict[str, Tuple["Finding", List["Finding"]]] = {}
    for f in findings:
        if f.entry.alert in out:
            out[f.entry.alert][1].append(f)
        else:
            out[f.entry.alert] = (f, [])
    return list(out.values())


def finding_line(first: "Finding", others: Sequence["Finding"], show_job: bool, names: Names = FULL) -> str:
    return f"{first.entry.alert} on {where(first.entry, first.labels, show_job, names) or 'the job'}" \
           f"{more(first, others)}"


# ------------------------------------------------------------------ the verdict of one check
def status(c: "Check", show_job: bool = True, names: Names = FULL) -> str:
    """The verdict column: what holds, in words (JSON's ``status`` is the same string)."""
    e = c.entry
    if c.verdict == "no data":
        return "no data"
    side = "over" if e.op == ">" else "under"
    if c.verdict == "ok":
        return f"watch: {side}, not alerting: {c.not_alerting}" if c.not_alerting else "ok"
    if c.verdict == "firing":
        if c.crossed:
            return f"alert firing; still {side}, but its condition no longer holds: {c.not_alerting}"
        return "alert firing, indicator back to normal"
    shown = c.findings[0]
    n = len(c.findings)
    if c.verdict == "explained":
        g = shown.explained_by[0]
        text = f"explained by {g.entry.alert} ({where(g.entry, g.labels, show_job, names)})"
        if n > 1:
            text += f" ({n} series)"
    else:
        text = "ABNORMAL" + (f" ({n} series)" if n > 1 else "")
        ex = sum(1 for f in c.findings if f.explained_by)
        if ex:
            text += f", {ex} explained"
    if c.firing:
        text += f"  [{len(c.firing)} firing]"
    elif c.pending:
        text += f"  [alert pending (for: {e.for_})]"
    return text


# ------------------------------------------------------------------ the text report
def wrap(text: str, width: int) -> List[str]:
    """``text`` in lines of at most ``width``, broken between words; a longer word is broken inside."""
    lines: List[str] = []
    cur = ""
    for word in text.split(" "):
        while len(word) > width:
            if cur:
                lines.append(cur)
                cur = ""
            lines.append(word[:width])
            word = word[width:]
        if not cur:
            cur = word
        elif len(cur) + 1 + len(word) <= width:
            cur += " " + word
        else:
            lines.append(cur)
            cur = word
    lines.append(cur)
    return lines


def _label_values(r: "Report") -> List[Tuple[str, str]]:
    """(label, value) of every place the report can show."""
    out: List[Tuple[str, str]] = []
    for c in r.checks:
        for labels in ([c.worst.labels] if c.worst else []) + [f.labels for f in c.findings] + \
                [g.labels for f in c.findings for g in f.explained_by]:
            out += [(k, labels[k]) for k in SHOWN_LABELS if labels.get(k)]
    return out


def _row(c: "Check", show_job: bool, names: Names) -> Tuple[str, str, str, str, str, str]:
    """(number, title, value, where, threshold, verdict) of one check."""
    e = c.entry
    shown = c.findings[0] if c.findings else None
    value = shown.value if shown else (c.worst.value if c.worst else None)
    labels = shown.labels if shown else (c.worst.labels if c.worst else {})
    place = where(e, labels, show_job, names)
    if c.verdict == "no data":
        val = "no data"
    elif e.unit == "bool":  # how many of the series are in the bad state
        val = f"{len(c.findings)}/{c.series}"
        place = place if c.findings else ""
    else:
        val = units.value(value, e.unit, multiple(e))
    return str(e.order) if e.order else "", e.title, val, place, fmt_threshold(e), status(c, show_job, names)


def _table(r: "Report", names: Names) -> List[str]:
    show_job = r.job is None
    rows = [(c, _row(c, show_job, names)) for c in r.checks]
    ww = min(max([len("where")] + [len(row[3]) for _, row in rows]), WHERE_MAX)
    head = f"{'#':>2}  {'check':<{TITLE_WIDTH}} {'value':<{VALUE_WIDTH}} {'where':<{ww}} " \
           f"{'threshold':<{THRESHOLD_WIDTH}} verdict"
    titles = {"signal": "the six signals, in triage order", "cause": "extra causes", "symptom": "symptoms"}
    lines: List[str] = []
    section = None
    for c, (num, title, val, place, thr, verdict) in rows:
        if c.entry.kind != section:
            section = c.entry.kind
            lines += [f"{titles[section]}:", head] if section == "signal" else ["", f"{titles[section]}:"]
        tl, wl = wrap(title, TITLE_WIDTH), wrap(place, ww)
        for i in range(max(len(tl), len(wl))):
            t, w = (tl[i] if i < len(tl) else ""), (wl[i] if i < len(wl) else "")
            if i == 0:
                lines.append(f"{num:>2}  {t:<{TITLE_WIDTH}} {val:<{VALUE_WIDTH}} {w:<{ww}} "
                             f"{thr:<{THRESHOLD_WIDTH}} {verdict}")
            else:
                lines.append(f"{'':>2}  {t:<{TITLE_WIDTH}} {'':<{VALUE_WIDTH}} {w}".rstrip())
    return lines


def _cause(r: "Report", names: Names) -> List[str]:
    show_job = r.job is None
    groups = by_alert(r.causes)
    f, same = groups[0]
    e = f.entry
    value = "" if e.unit == "bool" else f": {units.value(f.value, e.unit, multiple(e))} (threshold {fmt_threshold(e)})"
    lines = [
        f"cause: {e.alert}: {e.title} on {where(e, f.labels, True, names)}{more(f, same)}{value}",
        f"  meaning:  {e.meaning}",
        f"  runbook:  {e.runbook}",
    ]
    local = runbook_path(e)
    if local is not None:
        lines.append(f"            {local} (local copy)")
    lines.append(f"  next:     {e.next_check}")
    if r.places:
        lines.append("  where:    " + "; ".join(r.places))
    explains = by_alert([g for c in r.checks for g in c.findings if any(x in g.explained_by for x in [f] + same)])
    if explains:
        lines.append("  explains: " + "; ".join(finding_line(g, rest, show_job, names) for g, rest in explains))
    if len(groups) > 1:
        lines.append("also abnormal and unexplained:")
        lines += [f"  {finding_line(g, rest, show_job, names)}" for g, rest in groups[1:]]
    return lines


def render_text(r: "Report") -> str:
    names = Names(_label_values(r))
    names.parallel = r.parallel
    body = _table(r, names) + [""]
    if r.cause is None:
        watch = [c.entry.title for c in r.checks if c.not_alerting]
        if watch:
            body.append(f"verdict: healthy: no alert condition holds; {len(watch)} "
                        f"{'check is' if len(watch) == 1 else 'checks are'} past the threshold but not alerting "
                        f"(watch: {', '.join(watch)})")
        else:
            body.append("verdict: healthy: every check is within its threshold")
    else:
        body += _cause(r, names)
    body += [f"note: {n}" for n in r.notes]
    when = datetime.fromtimestamp(r.at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    span = f"worst over the last {r.since}" if r.since else ("as of the job's last data" if r.ended else "now")
    head = [f"ranksight triage  {r.prometheus}  job={r.job or '(all)'}  {when} ({span})"]
    if r.ended:
        head.append(r.ended)
    head += names.legend(skip=[r.job] if r.job else [])
    return "\n".join(head + [""] + body)
