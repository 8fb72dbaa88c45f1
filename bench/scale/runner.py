"""The benchmark run: generate, backfill, evaluate the rules live, time the dashboard queries."""
from __future__ import annotations

import logging
import concurrent.futures
import json
import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from ranksight import __version__
from ranksight import config as rconfig
from ranksight import triage
from .scenario import (BACKFILL_CPU_S_PER_SAMPLE, PROMETHEUS, PROMTOOL, Scenario, TARGET_QUERY_S,
                       TARGET_RULE_GROUP_S, TARGET_SERIES_PER_NODE, default_stragglers, node_name, shape_for)
from .generator import Counts, Generator, series_per_node
from .server import BenchError, Prometheus, run_checked, tool_version
from .common import kill_tree, node_slices, percentile, plan_window, rule_costs, work_dir, write_partial
from .queries import (Query, dashboard_queries, expand_recording_rules, load_queries_file, rules_source,
                      split_rule_file, substituted_queries)

log = logging.getLogger(__name__)


def _backfill_slice(promtool: str, scn: Scenario, nodes: Sequence[int], om_path: str, out_dir: str, block: str,
                    logs: str) -> Tuple[Counts, float]:
    """Worker: write one node slice's OpenMetrics, backfill it, delete it. (counts, generation seconds)"""
    t0 = time.monotonic()
    try:
        with open(om_path, "w", buffering=1 << 22) as fh:
            c = Generator(scn).write(fh, nodes)
        gen_s = time.monotonic() - t0
        run_checked([promtool, "tsdb", "create-blocks-from", "openmetrics", f"--max-block-duration={block}",
                     "--quiet", om_path, out_dir],
                    "promtool tsdb create-blocks-from openmetrics", timeout=3600,
                    log_path=Path(logs) / f"promtool-{Path(om_path).stem}.log",
                    # its live heap is small (one slice's head); parsing makes the garbage:
                    # a lazier GC saves ~20% CPU here
                    env={"GOGC": "400"})
    finally:
        Path(om_path).unlink(missing_ok=True)
    return c, gen_s


# ------------------------------------------------------------------------------ the run
@dataclass
class Options:
    nodes: int = 1024
    gpus: int = 8
    ranks_per_node: int = 8
    hours: float = 1.0
    step: int = 15
    design: str = "as-is"
    repeat: int = 3
    parts: int = 0  # 0: about 64 nodes a part
    jobs: int = 2
    workdir: Optional[str] = None
    keep: Optional[str] = None
    config: Optional[str] = None
    rule_evals: int = 4
    wait_compaction: bool = True
    rules_file: Optional[str] = None
    queries_file: Optional[str] = None
    baseline_queries_file: Optional[str] = None
    prometheus: str = PROMETHEUS
    promtool: str = PROMTOOL
    query_timeout: int = 120
    future: int = 0  # seconds the data reaches past now; 0: the expected generation + backfill time
    reuse: Optional[str] = None  # a --keep directory: skip generation, backfill only missing rules
    partial: Optional[str] = None  # write the result so far here at every phase (a cut run keeps it)
    # --engine victoriametrics: the live evaluation once per value of the groups' concurrency (0: all
    # of a group's rules at once), interleaved, in concurrency_rounds rounds; empty: the rule file's
    concurrency: Tuple[int, ...] = ()
    concurrency_rounds: int = 2
    rule_costs: int = 0  # time each rule alone on the backfilled data, this many times (0: not)
    seed: int = 9


class Bench:
    def __init__(self, opts: Options):
        self.o = opts
        self.cfg = rconfig.load(opts.config)
        self.result: Dict[str, Any] = {}
        self.wall0 = time.monotonic()
        self.procs: List[Prometheus] = []

    # -- helpers
    def _phase(self, name: str) -> None:
        log.info("scale: %s (%.0f s)", name, time.monotonic() - self.wall0)
        write_partial(self.o.partial, self.result, name)

    def _shm_dir(self, need: int) -> Optional[str]:
        try:
            st = os.statvfs("/dev/shm")
        except OSError:
            return None
        free = st.f_bavail * st.f_frsize
        return "/dev/shm" if free > need * 2 else None

    def run(self) -> Dict[str, Any]:
        o = self.o
        for b in (o.prometheus, o.promtool):
            if not os.access(b, os.X_OK):
                raise BenchError(f"{b} not found or not executable (apt-get install prometheus)")
        if o.nodes < 1 or o.gpus < 1 or o.ranks_per_node < 1:
            raise BenchError("--nodes, --gpus and --ranks-per-node must be at least 1")
        if o.ranks_per_node > o.gpus:
            raise BenchError("--ranks-per-node cannot exceed --gpus (one rank per GPU)")
        if o.reuse:
            try:
                self.prev = json.loads((Path(o.reuse) / "result.json").read_text())
                sc = self.prev["scenario"]
            except (OSError, ValueError, KeyError) as e:
                raise BenchError(f"--reuse {o.reuse}: no result.json of a --keep run: {e}") from None
            o.nodes, o.gpus, o.ranks_per_node = sc["nodes"], sc["gpus_per_node"], sc["ranks_per_node"]
            o.hours, o.step, o.design = sc["hours"], sc["step_seconds"], sc["design"]
        shape = shape_for(o.design, o.gpus, o.ranks_per_node)
        rate_w = int(rconfig.duration_seconds(self.cfg["windows"]["rate"]))
        lead = max(rate_w, 60) + 60
        # the live rule evaluation starts once the data's last sample has passed (see _live_rules):
        # by default the data ends when generation and backfill should be done (promtool costs
        # about 2 us of CPU per sample and reads its input twice, generation 0.4 us; measured)
        est_samples = series_per_node(shape)["total"] * o.nodes * ((int(o.hours * 3600) + lead) // o.step + 1)
        future = o.future or int(max(2.0 * o.step, est_samples * BACKFILL_CPU_S_PER_SAMPLE / max(1, o.jobs)))
        t0, samples, block = plan_window(time.time(), o.hours, o.step, lead, future)
        dl_node = o.nodes // 2 if o.nodes > 1 else 0
        scn = Scenario(nodes=o.nodes, shape=shape, t0=t0, samples=samples, step=o.step,
                       stragglers=tuple(r for r in default_stragglers(o.nodes, o.ranks_per_node)
                                        if r // o.ranks_per_node != dl_node),
                       dataloader_node=dl_node, seed=o.seed)
        if o.reuse:
            sc = self.prev["scenario"]
            scn = Scenario(nodes=o.nodes, shape=shape, t0=sc["data_start"], samples=sc["samples_per_series"],
                           step=o.step, job=sc["job"], stragglers=tuple(sc["stragglers"]),
                           dataloader_node=int(sc["dataloader_node"][len("node"):]), seed=o.seed)
            t0, samples, block, dl_node = scn.t0, scn.samples, "2h", scn.dataloader_node
        q_end = scn.t_end
        q_start = q_end - int(o.hours * 3600)
        self.lead = lead
        base = work_dir(o.keep, o.reuse, o.workdir, "ranksight-scale-")
        self.result.update({
            "scenario": {"nodes": o.nodes, "gpus_per_node": o.gpus, "ranks_per_node": o.ranks_per_node,
                         "ranks": scn.ranks, "gpus": o.nodes * o.gpus, "hours": o.hours, "step_seconds": o.step,
                         "samples_per_series": samples, "job": scn.job, "stragglers": list(scn.stragglers),
                         "dataloader_node": node_name(dl_node), "design": o.design,
                         "data_start": t0, "data_end": scn.t_end, "query_start": q_start, "query_end": q_end},
            "versions": {"prometheus": tool_version(o.prometheus), "promtool": tool_version(o.promtool),
                         "python": sys.version.split()[0], "ranksight": __version__},
            "targets": {"query_seconds": TARGET_QUERY_S, "rule_group_seconds": TARGET_RULE_GROUP_S,
                        "series_per_node": TARGET_SERIES_PER_NODE},
        })
        try:
            self._run(scn, base, block, q_start, q_end)
        finally:
            for p in self.procs:
                p.stop()
            if not (o.keep or o.reuse):
                shutil.rmtree(base, ignore_errors=True)
        self.result["wall_seconds"] = round(time.monotonic() - self.wall0, 1)
        if o.keep or o.reuse:
            self.result["kept"] = str(base)
            if o.reuse:
                self.result["reused"] = str(base)
                (base / "result-reuse.json").write_text(json.dumps(self.result, indent=1))
            else:
                (base / "result.json").write_text(json.dumps(self.result, indent=1))
        return self.result

    def _run(self, scn: Scenario, base: Path, block: str, q_start: int, q_end: int) -> None:
        o = self.o
        data = base / "tsdb"
        logs = base / "logs"
        if o.reuse:
            for k in ("generate", "series"):
                self.result[k] = self.prev[k]
            # the head holds only the earlier run's live rule results, written out of order
            # (below the blocks' max time); reading those is slow and would skew the queries
            for d in ("wal", "wbl", "chunks_head"):
                shutil.rmtree(data / d, ignore_errors=True)
            self._rules_phase(scn, base, data, logs, q_start, q_end, self.prev["backfill"]["openmetrics_seconds"])
            return
        data.mkdir()
        logs.mkdir()

        # 1. generate and backfill, node slices in parallel
        self._phase("generate + backfill")
        per_node = series_per_node(scn.shape)
        est_total = per_node["total"] * scn.samples * 110 * o.nodes
        # slices of at most ~2 GB of text, at least one per promtool process
        parts = o.parts or max(o.jobs, math.ceil(est_total / 2e9))
        parts = max(1, min(parts, o.nodes))
        slices = node_slices(o.nodes, parts)
        est_part = est_total // parts
        om_root = self._shm_dir(est_part * (o.jobs + 1)) or str(base)
        om_dir = Path(tempfile.mkdtemp(prefix="ranksight-scale-om-", dir=om_root))
        totals = Counts()
        gen_s = 0.0
        t_bf = time.monotonic()
        try:
            # each worker process writes one slice and backfills it (generation is Python, promtool
            # is one core: J workers keep J cores busy and at most J slices on tmpfs)
            ctx = multiprocessing.get_context("fork")
            pool = concurrent.futures.ProcessPoolExecutor(max_workers=o.jobs, mp_context=ctx)
            try:
                futs = [pool.submit(_backfill_slice, o.promtool, scn, sl, str(om_dir / f"part{i:03d}.om"),
                                    str(data / f"part{i:03d}"), block, str(logs))
                        for i, sl in enumerate(slices)]
                for f in concurrent.futures.as_completed(futs):
                    c, g = f.result()
                    totals.series += c.series
                    totals.samples += c.samples
                    totals.bytes += c.bytes
                    gen_s += g
            except BaseException:  # a failed slice, or killed: stop the other workers and their promtool
                for pid in list(getattr(pool, "_processes", {}) or {}):
                    kill_tree(pid)
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown(wait=True)
        finally:
            shutil.rmtree(om_dir, ignore_errors=True)
        not_modelled = Generator(scn).not_modelled
        backfill_s = time.monotonic() - t_bf
        for d in sorted(data.glob("part*")):  # promtool writes blocks into its output dir
            for blk in d.iterdir():
                blk.rename(data / blk.name)
            d.rmdir()
        self.result["generate"] = {"series": totals.series, "samples": totals.samples,
                                   "openmetrics_bytes": totals.bytes, "seconds": round(gen_s, 1),
                                   "parts": parts, "promtool_jobs": o.jobs, "block_duration": block,
                                   "not_modelled": not_modelled}
        self.result["series"] = {
            "per_node": per_node["total"] - per_node.get("scrape", 0),
            "per_node_with_scrape_series": per_node["total"],
            "per_rank": per_node["per_rank"], "per_gpu": per_node["per_gpu"],
            "node_level": per_node.get("node", 0), "scrape_per_target": per_node.get("scrape", 0),
            "rank_level_per_node": per_node.get("rank", 0), "gpu_level_per_node": per_node.get("gpu", 0),
            "total_raw": totals.series,
        }

        self._rules_phase(scn, base, data, logs, q_start, q_end, backfill_s)

    def _rules_phase(self, scn: Scenario, base: Path, data: Path, logs: Path, q_start: int, q_end: int,
                     backfill_s: float) -> None:
        o = self.o
        # 2. a Prometheus on the raw blocks: backfill the recording rules against it
        rules, rules_src = rules_source(self.o.rules_file, self.cfg)
        rules_path = base / "ranksight-rules.yml"
        rules_path.write_text(rules)
        expanded, skipped = expand_recording_rules(rules)
        exp_path = base / "recording-expanded.yml"
        exp_path.write_text(expanded)
        bare_cfg = base / "prometheus-norules.yml"
        bare_cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": f"{o.step}s"}}))

        # 2a. the rules evaluating live, as a production server runs them: on the raw blocks only,
        # started once the data's last sample is in the past, so every rule result is an in-order
        # head append (a TSDB whose blocks reach past now takes rule results only as out-of-order
        # samples, and reading recorded series back from the out-of-order head is several times
        # slower than from the in-order head a real server has: it would time that, not the rules)
        if o.reuse:
            self.result["rules_warning"] = "--reuse: the kept data is in the past; live rule timing needs a fresh run"
        else:
            self._phase("rule evaluation (live, raw blocks)")
            self._live_rules(scn, base, data, logs, rules_path)

        self._phase("backfill recording rules")
        raw_view = base / "tsdb-raw-view"  # hard links: this Prometheus may compact its view, not ours
        shutil.rmtree(raw_view, ignore_errors=True)
        shutil.rmtree(base / "rules-blocks", ignore_errors=True)
        shutil.rmtree(base / "rules-split", ignore_errors=True)
        raw_view.mkdir()
        for blk in data.iterdir():
            if (blk / "meta.json").exists():  # blocks only (a reused TSDB also has wal/, chunks_head/ ...)
                shutil.copytree(blk, raw_view / blk.name, copy_function=os.link)
        # the helper Prometheus is not measured: no query timeout to trip on a fleet-wide rule
        p1 = Prometheus(o.prometheus, raw_view, bare_cfg, logs / "prometheus-backfill.log",
                        extra=["--query.timeout=1h"])
        self.procs.append(p1)
        p1.start()
        t_rules = time.monotonic()
        rules_out = base / "rules-blocks"
        # one promtool per rule, `jobs` at a time: promtool evaluates its rules one after the
        # other and each range query runs on one core
        if o.reuse:  # only the rules whose series the kept TSDB lacks
            doc = yaml.safe_load(expanded)
            for g in doc["groups"]:
                g["rules"] = [r for r in g["rules"]
                              if not p1.instant(f'count({{__name__="{r["record"]}"}})', q_end)]
            expanded = yaml.safe_dump(doc, sort_keys=False)
        one_rule_files = split_rule_file(expanded, base / "rules-split")
        with concurrent.futures.ThreadPoolExecutor(max_workers=o.jobs) as pool:
            futs = [pool.submit(run_checked,
                                [o.promtool, "tsdb", "create-blocks-from", "rules", f"--start={q_start - 4 * o.step}",
                                 f"--end={q_end + 1}", f"--url={p1.url}", f"--output-dir={rules_out / f.stem}",
                                 f"--eval-interval={o.step}s", str(f)],
                                f"promtool tsdb create-blocks-from rules ({f.stem})", 3600,
                                logs / f"promtool-{f.stem}.log")
                    for f in one_rule_files]
            for fut in concurrent.futures.as_completed(futs):
                fut.result()
        rules_bf_s = time.monotonic() - t_rules
        p1.stop()
        self.procs.remove(p1)
        shutil.rmtree(raw_view, ignore_errors=True)
        n_rule_blocks = 0
        for meta in sorted(rules_out.glob("*/*/meta.json")) if rules_out.is_dir() else []:
            meta.parent.rename(data / meta.parent.name)
            n_rule_blocks += 1
        self.result["backfill"] = {"openmetrics_seconds": round(backfill_s, 1),
                                   "rules_seconds": round(rules_bf_s, 1),
                                   "rules_source": rules_src, "rules_not_backfilled": skipped,
                                   "rule_blocks": n_rule_blocks,
                                   "method": "promtool tsdb create-blocks-from openmetrics; the rules "
                                             "evaluate live on the raw blocks; then create-blocks-from "
                                             "rules (dependent rules inlined) for the dashboards"}

        # 3. the dashboards' Prometheus: raw and backfilled rule blocks, no rules evaluating
        self._phase("start prometheus, wait for compaction")
        p = Prometheus(o.prometheus, data, bare_cfg, logs / "prometheus.log",
                       extra=[f"--query.timeout={o.query_timeout}s"])
        self.procs.append(p)
        start_s = p.start()
        comp_s = self._wait_compaction(p, data) if self.o.wait_compaction else 0.0
        self.result.setdefault("prometheus", {}).update({"startup_seconds": round(start_s, 1), "compaction_seconds": round(comp_s, 1),
                                     "blocks": sum(1 for b in data.iterdir() if (b / "meta.json").exists())})

        self._phase("series in prometheus")
        self._count_series(p, scn, q_end)
        self._checks(p, scn, q_end)

        self._phase("dashboard queries")
        self._time_queries(p, scn, q_start, q_end)
        self._memory(p)
        if self.o.baseline_queries_file:
            rows, bsrc, _ = load_queries_file(self.o.baseline_queries_file)
            self._phase("baseline queries")
            self.result["baseline_queries"] = self._time_set(p, rows, bsrc, 1, q_start, q_end)
            self._memory(p, "after_baseline_")
        if o.rule_costs:  # after the timed queries (a cold cache for them), on the data and the
            self._phase("rule costs")  # backfilled records: their whole history
            self.result["rule_costs"] = rule_costs(p, rules, scn.t_end - o.step, o.rule_costs)
        p.stop()
        self.procs.remove(p)


    def _live_rules(self, scn: Scenario, base: Path, data: Path, logs: Path, rules_path: Path) -> None:
        o = self.o
        cfg_path = base / "prometheus.yml"
        cfg_path.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{o.step}s", "evaluation_interval": f"{o.step}s"},
            "rule_files": [str(rules_path)],
        }))
        wait = scn.t_end + 1 - time.time()
        if wait > 0:  # --future larger than generation and backfill took
            log.info("scale: waiting %.0f s for the data's last sample to pass", wait)
            time.sleep(wait)
        lag = time.time() - scn.t_end
        rate_w = rconfig.duration_seconds(self.cfg["windows"]["rate"])
        if lag > rate_w / 2:
            log.warning("scale: the data ended %.0f s before the live rule evaluation; rule times understate "
                        "(raise --future)", lag)
            self.result["rules_warning"] = f"data ended {lag:.0f} s before live evaluation (raise --future)"
        view = base / "tsdb-live-view"  # hard links: the rule results stay out of the measured TSDB
        shutil.rmtree(view, ignore_errors=True)
        view.mkdir()
        for blk in data.iterdir():
            if (blk / "meta.json").exists():
                shutil.copytree(blk, view / blk.name, copy_function=os.link)
        pr = Prometheus(o.prometheus, view, cfg_path, logs / "prometheus-rules.log",
                        extra=[f"--query.timeout={o.query_timeout}s"])
        self.procs.append(pr)
        try:
            pr.start()
            self._rules(pr)
            self.result["rules"]["data_lag_seconds"] = round(lag, 1)
            self._memory(pr, "rules_")
        finally:
            pr.stop()
            self.procs.remove(pr)
            shutil.rmtree(view, ignore_errors=True)

    def _memory(self, p: Prometheus, prefix: str = "") -> None:
        rss, hwm = p.rss()
        pm = p.metrics()
        self.result.setdefault("prometheus", {}).update({
            f"{prefix}rss_bytes": rss, f"{prefix}rss_peak_bytes": hwm,
            f"{prefix}go_heap_inuse_bytes": int(pm.get("go_memstats_heap_inuse_bytes", 0)),
            f"{prefix}head_series": int(pm.get("prometheus_tsdb_head_series", 0)),
        })

    def _wait_compaction(self, p: Prometheus, data: Path, timeout: float = 1800.0) -> float:
        """Overlapping blocks (node slices, rule blocks) are merged by Prometheus' first
        compaction a minute after start; measure after it, as a long-running server is."""
        t0 = time.monotonic()
        n0 = sum(1 for b in data.iterdir() if (b / "meta.json").exists())
        if n0 <= 1:
            return 0.0
        while time.monotonic() - t0 < timeout:
            m = p.metrics()
            loaded = m.get("prometheus_tsdb_blocks_loaded", n0)
            if loaded <= 1 and m.get("prometheus_tsdb_compactions_total", 0) >= 1:
                return time.monotonic() - t0
            if m.get("prometheus_tsdb_compactions_failed_total", 0) > 0:
                raise BenchError(f"prometheus compaction failed; see {p.log_path}")
            time.sleep(2.0)
        raise BenchError(f"prometheus did not compact the blocks within {timeout:.0f} s")

    def _count_series(self, p: Prometheus, scn: Scenario, at: int) -> None:
        rpn = scn.shape.ranks_per_node
        probe_node = 1 if scn.nodes > 1 and scn.dataloader_node != 1 else 0
        nn = node_name(probe_node)
        raw = p.scalar(f'count({{__name__=~"ranksight_.+", node="{nn}"}})', at)
        rec = p.scalar(f'count({{__name__=~".+:.+:.+", node="{nn}"}})', at)
        rank = p.scalar(f'count({{__name__=~"ranksight_.+", rank="{probe_node * rpn}"}})', at)
        rec_rank = p.scalar(f'count({{__name__=~".+:.+:.+", rank="{probe_node * rpn}"}})', at)
        total = p.scalar('count({__name__=~"ranksight_.+"})', at)
        rec_total = p.scalar('count({__name__=~".+:.+:.+"})', at)
        self.result["series"].update({
            "prometheus_per_node": int(raw or 0), "prometheus_per_rank": int(rank or 0),
            "prometheus_total": int(total or 0),
            "recorded_per_node": int(rec or 0), "recorded_per_rank": int(rec_rank or 0),
            "recorded_total": int(rec_total or 0), "probe_node": nn,
        })

    def _checks(self, p: Prometheus, scn: Scenario, at: int) -> None:
        """The scenario as the rules see it: which ranks the straggler rule flags, which
        nodes wait on data (the triage table's own thresholds)."""
        t = self.cfg["thresholds"]
        strag = p.instant(f'{triage.REC["straggler"]} > {t["straggler_ratio"]:g}', at)
        data = p.instant(f'max by (node) ({triage.REC["data_share"]}) > {t["dataloader_wait_share"]:g}', at)
        self.result["checks"] = {
            "stragglers_flagged": sorted((s["metric"].get("rank", "") for s in strag), key=lambda x: int(x or -1)),
            "straggler_ratio_max": round(max((float(s["value"][1]) for s in strag), default=0.0), 3),
            "dataloader_bound_nodes": sorted(s["metric"].get("node", "") for s in data),
            "dataloader_share_max": round(max((float(s["value"][1]) for s in data), default=0.0), 3),
        }

    def _time_queries(self, p: Prometheus, scn: Scenario, q_start: int, q_end: int) -> None:
        o = self.o
        if o.queries_file:
            exprs, src, _ = load_queries_file(o.queries_file)
        else:
            src = dashboard_queries(self.cfg)[1]
            exprs = substituted_queries(self.cfg, scn.job, o.step, o.hours)
        self.result["queries"] = self._time_set(p, exprs, src, o.repeat, q_start, q_end)

    def _time_set(self, p: Prometheus, exprs: Sequence[Query], src: str, repeat: int,
                  q_start: int, q_end: int) -> Dict[str, Any]:
        o = self.o
        rate_interval = f"{max(4 * o.step, 60)}s"
        times: List[List[float]] = [[] for _ in exprs]
        infos: List[Dict[str, Any]] = [{} for _ in exprs]
        for _ in range(max(1, repeat)):  # interleaved: every query once per round
            for i, (_, _, e, kind) in enumerate(exprs):
                if kind == "instant":
                    wall, info = p.timed_query(e, q_end)
                else:
                    wall, info = p.timed_query_range(e, q_start, q_end, o.step)
                log.info("scale: query %.3f s %s series %s %s / %s", wall, info.get("series"),
                         info.get("status"), exprs[i][0], exprs[i][1])
                times[i].append(wall)
                infos[i] = info
        items = []
        for (dash, title, e, kind), ts, info in zip(exprs, times, infos):
            items.append({"dashboard": dash, "panel": title, "expr": e, "kind": kind,
                          "seconds": round(statistics.median(ts), 4),
                          "first_seconds": round(ts[0], 4), "series": info.get("series"),
                          "points": info.get("points"), "response_bytes": info.get("bytes"),
                          "status": info.get("status"), "error": info.get("error")})
        meds = [it["seconds"] for it in items]
        slowest = max(items, key=lambda it: it["seconds"]) if items else None
        return {
            "source": src, "count": len(items), "step_seconds": o.step, "rate_interval": rate_interval,
            "range_seconds": q_end - q_start, "repeat": repeat,
            "p50_seconds": round(percentile(meds, 50), 4), "p99_seconds": round(percentile(meds, 99), 4),
            "max_seconds": round(max(meds), 4) if meds else None,
            "slowest": slowest,
            "over_target": [{"panel": it["panel"], "dashboard": it["dashboard"], "seconds": it["seconds"]}
                            for it in items if it["seconds"] > TARGET_QUERY_S],
            "errors": [{"panel": it["panel"], "dashboard": it["dashboard"], "error": it["error"]}
                       for it in items if it["status"] != "success"],
            "items": items,
        }

    def _rules(self, p: Prometheus) -> None:
        """Wait for a few evaluations of every group after compaction; read evaluationTime
        from /api/v1/rules and prometheus_rule_group_last_duration_seconds."""
        o = self.o
        samples: Dict[str, List[float]] = {}
        seen: Dict[str, str] = {}
        meta: Dict[str, Dict[str, Any]] = {}
        need: Dict[str, int] = {}  # groups slower than the base interval: 2 evaluations suffice
        deadline = time.monotonic() + max(o.rule_evals, 1) * o.step * 3 + 120
        while time.monotonic() < deadline:
            for g in p.rules():
                name = g["name"]
                last = g.get("lastEvaluation", "")
                slow = sorted(((r.get("name", ""), float(r.get("evaluationTime", 0.0))) for r in g.get("rules", [])),
                              key=lambda x: -x[1])[:5]
                meta[name] = {"rules": len(g.get("rules", [])), "interval_seconds": g.get("interval"),
                              "slowest_rules": [{"rule": n, "seconds": round(t, 4)} for n, t in slow],
                              "unhealthy": sum(1 for r in g.get("rules", []) if r.get("health") not in ("ok", "unknown")),
                              "last_error": next((r.get("lastError") for r in g.get("rules", []) if r.get("lastError")), None)}
                if name not in need:
                    ival = float(g.get("interval") or o.step)
                    need[name] = max(o.rule_evals, 1) if ival <= o.step else 2
                    deadline = max(deadline, time.monotonic() + 3 * ival + 60)
                if last and last != seen.get(name) and not last.startswith("0001"):
                    seen[name] = last
                    samples.setdefault(name, []).append(float(g.get("evaluationTime", 0.0)))
            if meta and all(len(samples.get(n, [])) >= need[n] for n in meta):
                break
            time.sleep(1.0)
        pm = p.metrics()
        groups = []
        for name, md in meta.items():
            ev = samples.get(name, [])
            key = next((k for k in pm if k.startswith("prometheus_rule_group_last_duration_seconds{")
                        and name in k), None)
            missed = next((v for k, v in pm.items() if k.startswith("prometheus_rule_group_iterations_missed_total{")
                           and name in k), 0.0)
            groups.append({"name": name, **md, "evaluations": len(ev),
                           "evaluation_seconds_median": round(statistics.median(ev), 4) if ev else None,
                           "evaluation_seconds_max": round(max(ev), 4) if ev else None,
                           "last_duration_seconds_metric": round(pm[key], 4) if key else None,
                           "iterations_missed": int(missed)})
        worst = max((g["evaluation_seconds_max"] or 0.0 for g in groups), default=0.0)
        alerts = p.instant("ALERTS")
        self.result["rules"] = {"groups": groups, "max_group_seconds": round(worst, 4),
                                "alerts": sorted({f'{a["metric"].get("alertname")} ({a["metric"].get("alertstate")})'
                                                  for a in alerts})}


# ------------------------------------------------------------------------------ CLI
