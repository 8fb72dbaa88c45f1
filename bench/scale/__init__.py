"""N nodes x G GPUs x R ranks backfilled into a real Prometheus: dashboard query and rule times.

`ranksight bench scale` (or bench/scale/run.py) runs it.

What it does, in order:

1. Generates every series the node agent exposes (rank, GPU and node families of the
   catalog, with the label values the agent's collectors produce on a DGX-class node)
   for one training job of nodes x ranks-per-node ranks, in OpenMetrics text, at the
   scrape interval, with a few straggler ranks and one dataloader-bound node. Values
   come from a small synchronous data-parallel model (every rank's step is the job's
   slowest rank's busy time plus its own collective wait), so counters, histograms and
   gauges agree with each other the way a real agent's do.
2. Backfills them with ``promtool tsdb create-blocks-from openmetrics`` (several node
   slices in parallel, each one block).
3. Once the data's last sample has passed, starts a real Prometheus on the raw blocks with
   the generated rule file evaluating live (in-order writes, as on a production server) and
   reads each rule group's evaluation time.
4. Starts a Prometheus on the raw blocks and backfills the recording rules with ``promtool
   tsdb create-blocks-from rules`` (dependent rules are inlined so one pass is enough).
5. Starts Prometheus on raw + rule blocks, waits until it has compacted them into one, then
   times every dashboard query through ``/api/v1/query_range`` over the hour (Grafana's
   step and $__rate_interval, every variable set to All).

Series counts, query p50/p99, the slowest query, rule-group evaluation time and
Prometheus' memory are printed (JSON with --json). The working directory (TSDB,
rules, logs) is removed at the end unless --keep DIR is given.

Generation is plain Python: each family's value sequences are computed once per
(profile, variant) and every series is one ``str.join`` of pre-formatted
" value timestamp\\n" suffixes, so the cost is a memcpy per sample.

The package: scenario.py (shape and label values), model.py (the job model), generator.py
(OpenMetrics), server.py (Prometheus and promtool), queries.py (rules and dashboard queries),
common.py (what both engines' runs share), runner.py (the run) and cli.py (arguments, report,
entry point); live.py serves the series to live scrapers, vm.py runs the scenario in the
VictoriaMetrics layout (``--engine victoriametrics``).
"""
from __future__ import annotations

from .scenario import *  # noqa: F401,F403
from .model import *  # noqa: F401,F403
from .generator import *  # noqa: F401,F403
from .server import *  # noqa: F401,F403
from .queries import *  # noqa: F401,F403
from .runner import *  # noqa: F401,F403
from .cli import *  # noqa: F401,F403
from .cli import _duration_arg, _hours, _pos_int, add_arguments, report, run  # noqa: F401
