"""ranks: exposes the agent's rank table (exporter/ranks.py) at scrape time: per-rank counters,
histograms, the step-time window quantiles, liveness, stalls, lints, goodput and the rank-to-GPU
join. Reads each rank under the table's lock one rank at a time, so ingest waits microseconds."""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional

from ranksight import catalog as C

from .. import goodput
from ..ranks import STALL_REASONS, WAITING, Kept, Rank, RankTable
from . import Context, Family, Labels, add, add_histogram, bucket_labels, family, register

log = logging.getLogger("ranksight.exporter.ranks")

QUANTILES = (0.5, 0.99)
_QLABELS = ("0.5", "0.99")
_COUNTERS = ((C.HEARTBEAT_MISSES, "misses"), (C.STEP_RECORDS_LOST, "lost"))  # (metric, Rank attribute)
_OPTIONAL = ((C.LAST_STEP, "last_step_ts"), (C.LAST_CHECKPOINT, "last_ckpt_ts"),
             (C.LAST_CHECKPOINT_DURATION, "last_ckpt_dur"))


def step_families(kept: Kept) -> tuple:
    """The step record's families, from its declaration (ranksight/record.py) as the rank table
    keeps it: (metric, key in Rank.sums) for "steps", each per-step field with a metric (its sum)
    and the checkpoint records' counts; (metric, key in Rank.cum) for the cumulative fields;
    (metric, key in Rank.cur) for the current readings; (metric, key in Rank.hists)."""
    sums = ((C.STEPS, "steps"),) + kept.layout.sums + ((C.CHECKPOINT_BYTES, "ckpt_bytes"),
                                                        (C.CHECKPOINT_FAILURES, "ckpt_fail"))
    return sums, kept.layout.cum_metrics, kept.layout.cur_metrics, tuple((m, hk) for hk, m, _ in kept.hists)


class _RankLabels:
    """Every label set one rank's series use, built once per label change."""

    __slots__ = ("base", "q", "stall", "hist", "lint", "stage")

    def __init__(self, r: Rank):
        base = self.base = Labels(zip(C.RANK_LABELS, r.labels))
        self.q = [base.plus("quantile", q) for q in _QLABELS]
        self.stall = [base.plus("reason", reason) for reason in STALL_REASONS]
        self.hist = [bucket_labels(base, m.buckets) for _, m, _ in r.kept.hists]
        self.lint: Dict[str, Labels] = {}
        self.stage: Optional[tuple] = None  # (pipeline stage, base plus its "stage" label)

    def for_stage(self, stage: int) -> Labels:
        got = self.stage
        if got is None or got[0] != stage:
            got = self.stage = (stage, self.base.plus("stage", str(stage)))
        return got[1]

    def for_lint(self, lint: str) -> Labels:
        got = self.lint.get(lint)
        if got is None:
            got = self.lint[lint] = self.base.plus("lint", lint)
        return got


class RanksCollector:
    """Exposes the rank table (collector name "ranks")."""

    name = "ranks"

    def __init__(self, table: RankTable, clock=time.monotonic,
                 gpu_labels: Optional[Callable[[], Dict[str, str]]] = None):
        self.table = table
        self.clock = clock
        self.gpu_labels = gpu_labels  # GPU UUID -> gpu label (the GPU collector's), for rank_gpu_info
        self.sums, self.cums, self.gauges, self.hists = step_families(table.kept)
        gate = table.kept.layout.gate  # a series exposed only for ranks whose gate reading is not 0
        self._gated = tuple((i, gate[a]) for i, (_, a) in enumerate(self.sums) if a in gate)
        self._gated_g = tuple((i, gate[a]) for i, (_, a) in enumerate(self.gauges) if a in gate)
        # the sums whose metric carries the rank's pipeline stage as a label ("pstage")
        self._staged = frozenset(i for i, (m, _) in enumerate(self.sums) if "stage" in m.labels)

    def collect(self) -> List[Family]:
        now = self.clock()
        counters = [(family(m), a) for m, a in self.sums + _COUNTERS]
        n_sums = len(self.sums)
        cums = [(family(m), a) for m, a in self.cums]
        gauges = [(family(m), a) for m, a in self.gauges]
        optional = [(family(m), a) for m, a in _OPTIONAL]
        hists = [(family(m), a) for m, a in self.hists]
        f_q = family(C.STEP_QUANTILE)
        f_up = family(C.RANK_UP)
        f_stall = family(C.RANK_STALLED)
        f_ckpt_now = family(C.CHECKPOINT_IN_PROGRESS)
        f_lint = family(C.LINT_ACTIVE)
        f_fin = family(C.RANK_FINISHED)
        f_pstart = family(C.PROCESS_START)
        f_gev = family(C.GPU_TIMING_EVERY)
        f_gpu = family(C.RANK_GPU_INFO)
        f_ver = family(C.RANK_VERSIONS)
        f_par = family(C.RANK_PARALLEL)
        f_gp = goodput.Families()
        f_where = family(C.RANK_STALL_WHERE)
        f_cseq, f_cwait = family(C.RANK_COLLECTIVE_SEQ), family(C.RANK_COLLECTIVE_WAIT)
        uuids: Dict[str, str] = {}
        if self.gpu_labels is not None:
            try:
                uuids = self.gpu_labels()
            except Exception as e:  # the GPU collector's trouble must not cost the rank series
                log.debug("gpu labels: %s", e)
        table = self.table
        with table.lock:
            ranks = list(table.ranks.values())
        for r in ranks:
            with table.lock:  # one rank at a time: ingest waits microseconds, not a whole scrape
                if r.pid == -1 or not r.labels:
                    continue
                L = r.expo
                if L is None:
                    L = r.expo = _RankLabels(r)
                sums = r.sums
                vals = [sums[a] if i < n_sums else getattr(r, a) for i, (_, a) in enumerate(counters)]
                cvals = [r.cum[a][0] for _, a in cums]
                gvals = [r.cur[a] for _, a in gauges]
                stage = r.cur.get("pstage", 0) if self._staged else 0
                for i, g in self._gated:
                    if not r.cur[g]:
                        vals[i] = None
                for i, g in self._gated_g:
                    if not r.cur[g]:
                        gvals[i] = None
                ovals = [getattr(r, a) for _, a in optional]
                hvals = [(list(h.counts), h.sum) for h in (r.hists[a] for _, a in hists)]
                qs = r.win.quantiles(QUANTILES, now)
                up = r.up
                stalled = r.stalled
                ckpt_now = now - r.ckpt_since if r.ckpt_since is not None else 0.0
                lints = sorted(r.lints)
                finished = r.finished is not None
                pstart = r.pstart
                gpu = uuids.get(r.gpu_uuid) if r.gpu_uuid else None
                uuid = r.gpu_uuid
                gev = r.gpu_every
                vers = r.versions
                par = r.parallel
                gp = goodput.Snapshot(r.gp, now)
                st = r.stack if stalled else None
            base = L.base
            staged = self._staged
            sl = L.for_stage(stage) if staged else base
            for i, ((f, _), v) in enumerate(zip(counters, vals)):
                if v is not None:
                    add(f, sl if i in staged else base, v)
            for (f, _), v in zip(cums, cvals):
                add(f, base, v)
            for (f, _), v in zip(gauges, gvals):
                if v is not None:
                    add(f, base, v)
            for (f, _), v in zip(optional, ovals):
                if v is not None:
                    add(f, base, v)
            for (f, _), les, (counts, total) in zip(hists, L.hist, hvals):
                add_histogram(f, base, les, counts, total)
            if qs is not None:
                for lab, v in zip(L.q, qs):
                    add(f_q, lab, v)
            add(f_up, base, 1.0 if up else 0.0)
            for lab, reason in zip(L.stall, STALL_REASONS):
                add(f_stall, lab, 1.0 if stalled == reason else 0.0)
            add(f_ckpt_now, base, ckpt_now)
            for lint in lints:  # only while active: a cleared lint's series goes stale
                add(f_lint, L.for_lint(lint), 1.0)
            if finished:
                add(f_fin, base, 1.0)
            if pstart > 0:
                add(f_pstart, base, pstart)
            if gev > 1:  # (sampling only: a rank timed every step has no series)
                add(f_gev, base, float(gev))
            if gpu is not None:
                add(f_gpu, base.plus("gpu", gpu).plus("uuid", uuid), 1.0)
            if vers is not None:
                add(f_ver, base.plus("torch", vers[0]).plus("cuda", vers[1]).plus("nccl", vers[2]), 1.0)
            if par is not None:
                add(f_par, base.plus("strategy", par[0]).plus("zero_stage", par[1]), 1.0)
            f_gp.add(base, gp)
            if st is not None and st.where:  # one series per stalled rank, gone when it recovers
                add(f_where, base.plus("where", st.where).plus("phase", st.phase), st.idle + max(0.0, now - st.at))
            if st is not None and st.cw is not None and stalled == WAITING:
                cl = base.plus("op", st.cw["op"]).plus("pg", st.cw["pg"])
                add(f_cseq, cl, float(st.cw["seq"]))
                add(f_cwait, cl, st.cw["wait"] + max(0.0, now - st.at))
        return ([f for f, _ in counters] + [f for f, _ in cums] + [f for f, _ in gauges] + [f for f, _ in optional]
                + [f for f, _ in hists] + [f_q, f_up, f_stall, f_ckpt_now, f_lint, f_fin, f_pstart, f_gev, f_gpu, f_ver, f_par,
                                           f_where, f_cseq, f_cwait] + f_gp.all())


@register("ranks")
def _build(ctx: Context) -> RanksCollector:
    return RanksCollector(ctx.table, gpu_labels=ctx.gpu.uuid_labels if ctx.gpu is not None else None)
