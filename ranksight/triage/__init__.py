"""The triage table: the six signals in order, the extra causes, the lints and the
stack's own health. Alert rules, recording rules, Alertmanager inhibition, runbooks,
dashboards and `ranksight triage` are all generated from ``table(cfg)``.

Recording-rule names follow ``level:metric:operation``. They carry no window in
the name (``ratio_rate``, not ``ratio_rate5m``) because the window is a config
value the test profile shortens; dashboards and alerts must use the same names
under both profiles.

Labels, as Prometheus stores them (the scrape config sets ``honor_labels: true``):

- rank series carry ``job`` (the *training* job, exposed by the agent and kept by
  honor_labels), ``node``, ``rank``, ``local_rank`` and ``instance`` (the agent);
- node series (GPU, network, disk, the agent's own health) expose no ``job``, so
  Prometheus attaches the scrape job's: ``job="ranksight-agent"`` (SCRAPE_JOB).

So an inhibition between a node-level alert and a rank-level one can only match
on ``node``; ``equal: [job]`` is only meaningful between two rank-level alerts, or
with a node alert that joins the training job of its node's ranks onto itself
(``Entry.joined``: the TCP retransmit alert, so that loss on one host mutes the comm
share of every rank of the jobs it carries). ``tests/integration/test_alerts.py`` checks this
for every rule.

PromQL is written for Prometheus 2.42 and 3.x alike. Where a choice was made for
that, a comment says ``compat:``. In short: no ``holt_winters`` (renamed in 3.x),
no regex that relies on ``.`` (it matches newlines in 3.x), no selector on a ``le``
or ``quantile`` label value (3.x normalises "1" to "1.0"; ``histogram_quantile``
merges equal bounds, so aggregating ``by (le)`` is safe), no range-selector
arithmetic that depends on whether the left edge is included (3.x makes it open),
no 3.x-only rule-group fields (``query_offset``). Under 3.x's left-open ranges a
window holds one sample fewer: keep the scrape interval at most a third of the
shortest window (the test profile's 30s windows assume scrapes every 10 s or less).

The package: model.py (Entry, Recording, Inhibit, shared constants), names.py (every record's name
and the rule groups), records.py (the recording rules), goodput.py (goodput and the step-time
baseline: its records and alerts), alerts.py (the alerts and their PromQL), lints.py (the setup
lints), prose.py with prose/*.md (the runbook prose).
"""
from __future__ import annotations

from .model import (ACT_DRAIN, ACT_PAGE, ACT_RECOVERY, ACT_RESTART, ACTIONS, ALERT_GROUPS, CLOCK_EVENT_REASONS, DESYNC_POS, GPU_DESC, HW_COLLECTORS, NODE_DESC, RANK_DESC,
                    RDMA_TRAFFIC, RUNBOOK_BASE, SCRAPE_JOB, STALL_WHERE, THROTTLE_REASONS, THROTTLE_SHOWN, VAL,
                    WAITING_SYMPTOMS, Entry, Inhibit, Recording, with_gpu)
from .names import GROUP_INPUTS, RANK_BY, REC, RULE_GROUPS
from .records import recording_groups, recording_rules  # noqa: I001
from .lints import LINTS
from .alerts import by_alert, inhibit_pairs, signals, table

__all__ = [
    "ACT_DRAIN", "ACT_PAGE", "ACT_RECOVERY", "ACT_RESTART", "ACTIONS",
    "ALERT_GROUPS", "CLOCK_EVENT_REASONS", "DESYNC_POS", "GPU_DESC", "GROUP_INPUTS", "HW_COLLECTORS", "LINTS", "NODE_DESC",
    "RANK_BY", "RANK_DESC", "RDMA_TRAFFIC", "REC", "RULE_GROUPS", "RUNBOOK_BASE", "SCRAPE_JOB", "STALL_WHERE",
    "THROTTLE_REASONS", "THROTTLE_SHOWN", "VAL", "WAITING_SYMPTOMS", "Entry", "Inhibit", "Recording",
    "by_alert", "inhibit_pairs", "recording_groups", "recording_rules", "signals", "table", "with_gpu",
]
