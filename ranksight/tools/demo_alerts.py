"""What `ranksight demo` watches for: the alerts each injected fault is expected to fire
(``EXPECTED``, from the triage table), the alerts seen during the run (``AlertLog``: polled
from Alertmanager, with inhibition, and Prometheus, printed as news and in the final report),
and the console line (``say``) the demo and its job's output pumps share."""
from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Set, TextIO, Tuple

from .. import catalog, config, triage
from ..common.plumbing import ApiError
from .stack import LocalStack

log = logging.getLogger("ranksight.tools.demo")  # the demo's one logger

# fault -> (triage entries whose alerts name it, does the alert sit on the faulty rank?, what was injected)
EXPECTED_ENTRIES: Dict[str, Tuple[Tuple[str, ...], bool, str]] = {
    "slow-data": (("dataloader-bound",), True, "rank {r}'s dataset sleeps on every read"),
    "straggler": (("straggler",), True, "rank {r} runs extra compute every step"),
    "kill-rank": (("rank-down", "heartbeat-missed"), True, "rank {r} SIGKILLed itself"),
    "hang": (("rank-stalled",), True, "rank {r} sleeps inside a step"),
    "slow-checkpoint": (("checkpoint-slow",), False, "rank 0 writes large O_DSYNC checkpoints"),
    "comm-heavy": (("comm-bound",), False, "a wide model on a tiny batch: gradients dominate"),
}
_ALERT_OF = {e.id: e.alert for e in triage.table(config.defaults())}
# fault -> (the alert names, on the faulty rank?, what was injected)
EXPECTED: Dict[str, Tuple[Tuple[str, ...], bool, str]] = {
    f: (tuple(_ALERT_OF[i] for i in ids), on_rank, what) for f, (ids, on_rank, what) in EXPECTED_ENTRIES.items()}
JOB = "demo"

_console = threading.Lock()


def say(line: str = "", out: Optional[TextIO] = None) -> None:
    """One line to the console, whole, under the lock the job's output pumps share."""
    out = out or sys.stdout
    with _console:
        out.write(line + "\n")
        out.flush()


@dataclass
class SeenAlert:
    name: str
    labels: Dict[str, str]
    severity: str
    summary: str
    active: bool = False  # seen firing and not muted at least once
    muted_by: Set[str] = field(default_factory=set)
    now: str = "firing"  # the latest state: "active" or "muted" in Alertmanager, "firing" in Prometheus
    # only, "resolved" once gone from both
    before_fault: bool = False  # first seen before the fault was injected
    told: Set[str] = field(default_factory=set)  # the states already printed as news

    @property
    def where(self) -> str:
        keys = ("job", "rank", "node", "gpu", "device", "path", "collector")
        return " ".join(f"{k}={self.labels[k]}" for k in keys if k in self.labels) or \
            f"instance={self.labels.get('instance', '?')}"


class AlertLog:
    """Alerts seen during the run, from Alertmanager (with inhibition) and Prometheus."""

    def __init__(self) -> None:
        self.seen: Dict[Tuple[Tuple[str, str], ...], SeenAlert] = {}
        self.steps: Dict[str, int] = {}  # rank -> highest steps_total Prometheus saw
        self.parallel: Dict[str, str] = {}  # rank -> "deepspeed ZeRO-2", from its hello (rank_parallel_info)
        self.fault_planned = False  # a fault will be injected (not --fault none)
        self.t0: Optional[float] = None  # monotonic time of the first step
        self.fault_started = False  # set by the demo once the fault is on

    def _get(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> SeenAlert:
        key = tuple(sorted(labels.items()))
        if key not in self.seen:
            self.seen[key] = SeenAlert(labels.get("alertname", "?"), dict(labels), labels.get("severity", ""),
                                       annotations.get("summary", ""))
        return self.seen[key]

    def poll(self, stack: LocalStack) -> None:
        try:
            am_alerts = stack.am.alerts()
            prom_alerts = stack.prom.alerts()
            for r in stack.prom.query(f'max by (rank) ({catalog.STEPS}{{job="{JOB}"}})'):
                rank = r["metric"].get("rank", "?")
                self.steps[rank] = max(self.steps.get(rank, 0), int(float(r["value"][1])))
            for r in stack.prom.query(f'{catalog.RANK_PARALLEL}{{job="{JOB}"}}'):
                m = r["metric"]
                z = m.get("zero_stage", "")
                self.parallel[m.get("rank", "?")] = m.get("strategy", "?") + (f" ZeRO-{z}" if z else "")
        except (ApiError, OSError, ValueError) as e:
            log.debug("alert poll failed: %s", e)
            return
        by_fp = {a["fingerprint"]: a["labels"].get("alertname", "?") for a in am_alerts}
        present = set()
        for a in am_alerts:
            s = self._get(a["labels"], a.get("annotations", {}))
            present.add(id(s))
            muters = a["status"].get("inhibitedBy") or []
            if muters:
                s.muted_by.update(by_fp.get(fp, "another alert") for fp in muters)
                s.now = "muted"
            elif a["status"].get("state") == "active":
                s.active = True
                s.now = "active"
        for a in prom_alerts:  # firing in Prometheus but not (yet) in Alertmanager
            if a["state"] == "firing":
                present.add(id(self._get(a["labels"], a.get("annotations", {}))))
        for s in self.seen.values():
            if id(s) not in present:
                s.now = "resolved"
            if not self.fault_started:
                s.before_fault = True

    def tick(self, stack: LocalStack) -> None:
        """Poll, and print the news, stamped with the seconds since the first step (t0)."""
        self.poll(stack)
        t = f"t+{time.monotonic() - self.t0:.0f}s" if self.t0 is not None else "startup"
        for line in self.news():
            say(f"ranksight demo {t:>6}: {line}")

    def news(self) -> List[str]:
        """One line per problem alert that first fired or was first muted since the last call."""
        lines = []
        for s in self.problems():
            if s.now in s.told or s.now in ("firing", "resolved"):
                continue
            s.told.add(s.now)
            if s.now == "active":
                when = "  (healthy phase: before the fault)" if self.fault_planned and not self.fault_started else ""
                lines.append(f"FIRING  {s.name:<28} {s.where}  {s.summary}{when}".rstrip())
            else:
                lines.append(f"muted   {s.name:<28} {s.where}  (inhibited by {', '.join(sorted(s.muted_by))})")
        return lines

    def named(self, fault: str, rank: int, primary_only: bool = False) -> Optional[SeenAlert]:
        """The alert that names the injected cause: seen firing unmuted (on the faulty rank where
        the fault is a rank's). The first listed name is preferred (RankDown over HeartbeatMissed)."""
        names, on_rank, _ = EXPECTED[fault]
        for name in names[:1] if primary_only else names:
            for s in self.seen.values():
                if s.name == name and s.active and (not on_rank or s.labels.get("rank") == str(rank)):
                    return s
        return None

    def muted_by(self, cause: str) -> List[SeenAlert]:
        """Alerts this cause muted (and that did not fire unmuted again since)."""
        return [s for s in self.problems() if cause in s.muted_by and s.now != "active"]

    def unexplained(self, causes: Sequence[str]) -> List[SeenAlert]:
        """Problem alerts firing unmuted now, other than these causes."""
        return [s for s in self.problems() if s.now == "active" and s.name not in causes]

    def problems(self) -> List[SeenAlert]:
        """Alerts that flag a problem (severity info is information, e.g. the global-batch lint line)."""
        return [s for s in self.seen.values() if s.severity != "info"]

    def report(self, out: TextIO) -> None:
        info = sorted(s.name for s in self.seen.values() if s.severity == "info")
        if not self.problems():
            say("alerts: none fired" + (f" (information only: {', '.join(info)})" if info else ""), out)
            return
        say("alerts that fired (test profile):", out)
        order = {e.alert: i for i, e in enumerate(triage.table(config.load(env={})))}
        for s in sorted(self.problems(), key=lambda s: (s.now != "active", order.get(s.name, 999), s.where)):
            state = {"active": "FIRING", "muted": "muted", "resolved": "resolved"}.get(s.now, "firing")
            notes = [f"inhibited by {', '.join(sorted(s.muted_by))}"] if s.muted_by else []
            if s.active and s.muted_by:
                notes.append("it fired before its cause did")
            if s.before_fault and self.fault_planned:
                notes.append("it fired in the healthy phase, before the fault was injected")
            why = f"  [{'; '.join(notes)}]" if notes else ""
            say(f"  {state:<7} {s.name:<28} {s.severity:<8} {s.where}{why}", out)
            if s.summary and s.now == "active":
                say(f"          {s.summary}", out)
        if info:
            say(f"  information (severity info, not a problem): {', '.join(info)}", out)
