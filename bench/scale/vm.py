"""``ranksight bench scale --engine victoriametrics``: the same scenario in the VictoriaMetrics
layout (docs/SCALING.md), reporting the same figures as the Prometheus run.

1. Generates the scenario's OpenMetrics (as the Prometheus run does) and imports it into a real
   single-node store (``/api/v1/import/prometheus``, millisecond timestamps), ``--jobs`` worker
   processes at once, a slice of nodes each.
2. Backfills the recording rules over the data with ``vmalert -replay.*`` (the rule file of
   ``ranksight rules --engine victoriametrics``), writing through the store's remote write.
3. Times every dashboard query against the store (its Prometheus query API), interleaved rounds,
   the median of each; p50/p99 and the slowest, per query.
4. Runs vmalert live against the store for a few evaluations of every group and reads each group's
   evaluation duration from vmalert's own metrics (``vmalert_iteration_duration_seconds``). It
   evaluates back in time (``-datasource.lookback``), over the data's last minutes, so each rule
   reads windows as full as at the data's end however long the import and backfill took. With
   ``--concurrency``, once per value of the groups' ``concurrency``, interleaved in rounds on the
   same data, each group's medians kept per value (``rules_by_concurrency``).
5. Reports dropped samples (rows the store ignored, rows vmalert failed to write), the store's RSS
   (peak too) and its data size on disk.
"""
from __future__ import annotations

import concurrent.futures
import io
import json
import logging
import multiprocessing
import re
import shutil
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from ranksight import config as rconfig
from ranksight.alerts import engines
from ranksight.common import servers
from ranksight.common.plumbing import PrometheusAPI, Proc, free_port, wait_http
from ranksight.common.units import binary_bytes
from ranksight.tools import vmstack

from .generator import Generator
from .queries import dashboard_queries, rules_source, substituted_queries
from .common import node_slices, rule_cost_lines, rule_costs, work_dir, write_partial
from .runner import Options
from .scenario import Scenario, default_stragglers, shape_for
from .server import BenchError, Prometheus, run_checked, tool_version

log = logging.getLogger(__name__)

IMPORT_CHUNK = 8 << 20  # bytes a POST to /api/v1/import/prometheus
SCENARIO_FILE = "scenario.json"  # in a --keep directory: the scenario --reuse measures again


def _import_slice(url: str, scn: Scenario, nodes: List[int]) -> Tuple[int, int]:
    """Generate ``nodes`` one at a time and POST Prometheus text (ms timestamps) in chunks of about
    IMPORT_CHUNK bytes; (samples, bytes sent)."""
    gen = Generator(scn)
    samples = sent = size = 0
    buf: List[str] = []

    def flush() -> None:
        nonlocal buf, size, sent
        if not buf:
            return
        body = "".join(buf).encode()
        req = urllib.request.Request(f"{url}/api/v1/import/prometheus", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=600):  # noqa: S310 - our loopback store
            pass
        sent += len(body)
        buf, size = [], 0

    for n in nodes:
        out = io.StringIO()
        samples += gen.write(out, [n]).samples
        for line in out.getvalue().splitlines():
            if not line or line[0] == "#":
                continue
            head, _, ts = line.rpartition(" ")
            buf.append(f"{head} {int(float(ts) * 1000)}\n")
            size += len(line)
        if size >= IMPORT_CHUNK:
            flush()
    flush()
    return samples, sent


class _Store:
    """The store as the query timer sees Prometheus (timed_query, timed_query_range)."""

    timed_query = Prometheus.timed_query
    timed_query_range = Prometheus.timed_query_range

    def __init__(self, url: str, timeout: float):
        self.url = url
        self.timing = PrometheusAPI(url, timeout=timeout)


def _metrics(url: str) -> Dict[str, float]:
    return PrometheusAPI(url, timeout=60.0).own_metrics()


def _sum(m: Dict[str, float], name: str) -> float:
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def _rss(pid: Optional[int]) -> Tuple[int, int]:
    rss = hwm = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    except (OSError, TypeError):
        pass
    return rss, hwm


class VMBench:
    def __init__(self, opts: Options):
        self.o = opts
        self.cfg = rconfig.load(opts.config)
        self.result: Dict[str, Any] = {"engine": vmstack.ENGINE}

    def _import(self, url: str, scn: Scenario) -> Dict[str, Any]:
        """Generate and POST the scenario in ``--jobs`` worker processes, a slice of nodes each
        (generation is Python, one core a worker; the store ingests the POSTs in parallel)."""
        t0 = time.monotonic()
        jobs = max(1, min(self.o.jobs, scn.nodes))
        slices = node_slices(scn.nodes, jobs)
        samples = sent = 0
        if jobs == 1:
            samples, sent = _import_slice(url, scn, slices[0])
        else:
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                for c, b in pool.map(_import_slice, [url] * jobs, [scn] * jobs, slices):
                    samples += c
                    sent += b
        with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=120):  # noqa: S310
            pass
        return {"samples": samples, "bytes": sent, "jobs": jobs, "seconds": round(time.monotonic() - t0, 2)}

    def run(self) -> Dict[str, Any]:
        o = self.o
        t_start = self.t_start = time.monotonic()
        for name in ("victoria-metrics", "vmalert"):
            try:
                servers.find_binary(name)
            except servers.MissingBinary as e:
                raise BenchError(str(e)) from None
        if o.reuse:  # a --keep run's store: its scenario, no import and no backfill
            try:
                sc = json.loads((Path(o.reuse) / SCENARIO_FILE).read_text())
                o.nodes, o.gpus, o.ranks_per_node = sc["nodes"], sc["gpus_per_node"], sc["ranks_per_node"]
                o.hours, o.step, o.design = sc["hours"], sc["step_seconds"], sc["design"]
                end, t0 = int(sc["data_end"]), int(sc["data_start"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise BenchError(f"--reuse {o.reuse}: no {SCENARIO_FILE} of a --engine victoriametrics --keep run: "
                                 f"{getattr(e, 'strerror', None) or e}") from None
            samples = (end - t0) // o.step + 1
        else:
            # the data starts a rate window (and a minute) before the queried hours, as the Prometheus
            # run's does, and ends now; the live evaluation reads it back in time (_live_rules)
            lead = max(int(rconfig.duration_seconds(self.cfg["windows"]["rate"])), 60) + 60
            samples = (int(o.hours * 3600) + lead) // o.step + 1
            end = int(time.time()) // o.step * o.step
        shape = shape_for(o.design, o.gpus, o.ranks_per_node)
        dl = o.nodes // 2 if o.nodes > 1 else 0
        scn = Scenario(nodes=o.nodes, shape=shape, t0=end - (samples - 1) * o.step,
                       samples=samples, step=o.step, dataloader_node=dl,
                       stragglers=tuple(r for r in default_stragglers(o.nodes, o.ranks_per_node)
                                        if r // o.ranks_per_node != dl))
        self.scn = scn
        self.result["scenario"] = {"nodes": o.nodes, "gpus_per_node": o.gpus, "ranks_per_node": o.ranks_per_node,
                                   "ranks": scn.ranks, "hours": o.hours, "step_seconds": o.step, "design": o.design,
                                   "data_start": scn.t0, "data_end": scn.t_end}
        base = work_dir(o.keep, o.reuse, o.workdir, "ranksight-scale-vm-")
        try:
            self._run(scn, base)
            if o.keep and not o.reuse:  # what --reuse reads: written once the store holds the records
                (base / SCENARIO_FILE).write_text(json.dumps(self.result["scenario"], indent=1))
        finally:
            if not (o.keep or o.reuse):
                shutil.rmtree(base, ignore_errors=True)
        self.result["wall_seconds"] = round(time.monotonic() - t_start, 1)
        return self.result

    def _run(self, scn: Scenario, base: Path) -> None:
        o = self.o
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        store = Proc(vmstack.store_argv(servers.find_binary("victoria-metrics"), str(base / "store"),
                                        f"127.0.0.1:{port}", retention="100y"), base / "store.log", name="victoria-metrics")
        store.start()
        try:
            ok, code = wait_http(f"{url}/health", 60, store.popen)
            if not ok:
                raise BenchError(f"victoria-metrics did not start (exit {code}): {servers.error_line(base / 'store.log')}")
            self.result["versions"] = {"victoria-metrics": tool_version(servers.find_binary("victoria-metrics")),
                                       "vmalert": tool_version(servers.find_binary("vmalert"))}
            rules = base / "rules.yml"
            text, self.result["rules_source"] = rules_source(o.rules_file, self.cfg)
            try:
                rules.write_text(engines.victoriametrics(text))
            except engines.EngineError as e:  # the file's shape was checked by rules_source
                raise BenchError(f"rules from {self.result['rules_source']}: not a rule file vmalert can be given: "
                                 f"{str(e).splitlines()[0]}") from None
            if o.reuse:  # the kept store already holds the data and the backfilled records
                self.result["import"] = self.result["backfill"] = {"reused": str(base)}
            else:
                self._phase("import", url, store)
                self.result["import"] = self._import(url, scn)
                self._phase("backfill", url, store)
                t0 = time.monotonic()
                self._replay(url, scn, rules, base)
                self.result["backfill"] = {"rules_seconds": round(time.monotonic() - t0, 2)}
            self._phase("queries", url, store)
            self._queries(url, scn)
            if o.rule_costs:
                self._phase("rule costs", url, store)
                self.result["rule_costs"] = rule_costs(_Store(url, o.query_timeout), rules.read_text(),
                                                       scn.t_end - o.step, o.rule_costs)
            self._phase("live rules", url, store)
            if o.concurrency:
                self._live_by_concurrency(url, text, base)
            else:
                self.result["rules"] = self._live_rules(url, rules, base)
            self._store_stats(url, store)
        finally:
            store.stop()

    def _store_stats(self, url: str, store: Proc) -> None:
        m = _metrics(url)
        rss, hwm = _rss(store.pid())
        self.result["store"] = {"rss_bytes": rss, "rss_peak_bytes": hwm,
                                "disk_bytes": int(_sum(m, "vm_data_size_bytes")),
                                # (series the store created since it started: none of the data's on a --reuse)
                                "series": None if self.o.reuse else int(_sum(m, "vm_new_timeseries_created_total")),
                                "rows_ignored": int(_sum(m, "vm_rows_ignored_total"))}

    def _phase(self, name: str, url: str, store: Proc) -> None:
        """Log the phase; with ``--partial``, the result so far with the store's figures now."""
        log.info("scale: %s (%.0f s)", name, time.monotonic() - self.t_start)
        if not self.o.partial:
            return
        try:
            self._store_stats(url, store)
        except (OSError, ValueError) as e:  # the store's metrics unreadable: the result without them
            log.warning("scale: the store's figures: %s", getattr(e, "strerror", None) or e)
        write_partial(self.o.partial, self.result, name)

    def _replay(self, url: str, scn: Scenario, rules: Path, base: Path) -> None:
        """``vmalert -replay`` one recording group at a time, in the file's order (a group reads
        only the groups before it), the store flushed after each so the next one reads it."""
        iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
        start = scn.t_end - int(self.o.hours * 3600) - 4 * self.o.step  # the queried hours (as the Prometheus run)
        groups = [g for g in yaml.safe_load(rules.read_text())["groups"] if all("record" in r for r in g["rules"])]
        for i, group in enumerate(groups):
            one = base / f"replay-{i:02d}.yml"
            one.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False, width=100000))
            run_checked([servers.find_binary("vmalert"), f"-rule={one}", f"-datasource.url={url}",
                         f"-remoteWrite.url={url}", f"-replay.timeFrom={iso(start)}", f"-replay.timeTo={iso(scn.t_end)}",
                         "-replay.disableProgressBar", f"-evaluationInterval={self.o.step}s", "-loggerLevel=WARN",
                         # the range queries' step (its default, 5m, would record one point in 5 minutes)
                         f"-datasource.queryStep={self.o.step}s",
                         # no rule reads an earlier rule of its group (engines.py): no wait between rules
                         "-replay.rulesDelay=0"],
                        f"vmalert -replay of {group['name']}", 3600, base / "replay.log")
            with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=120):  # noqa: S310
                pass
            time.sleep(1.0)  # rows become searchable about a second after the flush

    def _queries(self, url: str, scn: Scenario) -> None:
        from .runner import Bench

        o = self.o
        exprs = substituted_queries(self.cfg, scn.job, o.step, o.hours)
        timer = Bench.__new__(Bench)
        timer.o = o
        q_end = scn.t_end
        q_start = max(scn.t0, q_end - int(o.hours * 3600))
        self.result["queries"] = Bench._time_set(timer, _Store(url, o.query_timeout), exprs,
                                                 dashboard_queries(self.cfg)[1], o.repeat, q_start, q_end)

    def _live_by_concurrency(self, url: str, text: str, base: Path) -> None:
        """The live evaluation once per ``--concurrency`` value, interleaved in rounds; ``rules`` is the
        first value's first round, ``rules_by_concurrency`` each value's rounds and, per group, the
        median of their medians and the largest max."""
        o = self.o
        paths = {}
        for c in o.concurrency:
            paths[c] = base / f"rules-concurrency-{c or 'all'}.yml"
            paths[c].write_text(engines.victoriametrics(text, c))
        runs: Dict[int, List[Dict[str, Any]]] = {c: [] for c in o.concurrency}
        for rnd in range(o.concurrency_rounds):
            for c in (o.concurrency if rnd % 2 == 0 else o.concurrency[::-1]):  # ABBA: no order bias
                log.info("scale: live rules, concurrency %s, round %d", c or "all", rnd + 1)
                runs[c].append(self._live_rules(url, paths[c], base, minute_groups_twice=True))
                write_partial(o.partial, dict(self.result, rules_by_concurrency=_by_concurrency(runs)), "live rules")
        self.result["rules"] = runs[o.concurrency[0]][0]
        self.result["rules_by_concurrency"] = _by_concurrency(runs)

    def _live_rules(self, url: str, rules: Path, base: Path, minute_groups_twice: bool = False) -> Dict[str, Any]:
        """vmalert live against the store; each group's evaluation duration from its metrics. The
        groups with their own (longer) interval need one evaluation; with ``minute_groups_twice``
        those of up to a minute need as many as the others.

        The data ended when the run started, minutes ago. vmalert evaluates at now minus
        ``-datasource.lookback``, set so that its evaluations run over the data's last ``budget``
        seconds (the run's longest wait): every window the rules read is as full as at the data's
        end, and each run of a ``--concurrency`` comparison reads the same stretch of data."""
        o = self.o
        port = free_port()
        va_url = f"http://127.0.0.1:{port}"
        budget = max(o.rule_evals, 1) * o.step * 3 + 120
        lookback = int(time.time() - self.scn.t_end) + budget
        argv = vmstack.vmalert_argv(servers.find_binary("vmalert"), str(rules), url, "http://127.0.0.1:1",
                                    f"127.0.0.1:{port}", f"{o.step}s", va_url)
        proc = Proc(argv + [f"-datasource.lookback={lookback}s"], base / "vmalert.log", name="vmalert")
        proc.start()
        try:
            ok, code = wait_http(f"{va_url}/health", 60, proc.popen)
            if not ok:
                raise BenchError(f"vmalert did not start (exit {code}): {servers.error_line(base / 'vmalert.log')}")
            deadline = time.monotonic() + budget
            # groups with a longer interval than `most` seconds: one evaluation suffices
            most = 60 if minute_groups_twice else o.step
            slow = {g["name"] for g in yaml.safe_load(rules.read_text())["groups"]
                    if g.get("interval") and rconfig.duration_seconds(g["interval"]) > most}
            groups: Dict[str, Dict[str, Any]] = {}
            while time.monotonic() < deadline:
                m = _metrics(va_url)
                groups = {}
                for k, v in m.items():
                    g = re.search(r'group="([^"]+)"', k)
                    if not g or not k.startswith("vmalert_iteration_"):
                        continue
                    d = groups.setdefault(g.group(1), {"name": g.group(1)})
                    if k.startswith("vmalert_iteration_duration_seconds_count"):
                        d["evaluations"] = int(v)
                    elif k.startswith("vmalert_iteration_duration_seconds_sum"):
                        d["seconds_sum"] = v
                    elif k.startswith("vmalert_iteration_duration_seconds{") and 'quantile="0.5"' in k:
                        d["evaluation_seconds_median"] = round(v, 4)
                    elif k.startswith("vmalert_iteration_duration_seconds{") and 'quantile="1"' in k:
                        d["evaluation_seconds_max"] = round(v, 4)
                    elif k.startswith("vmalert_iteration_missed_total"):
                        d["iterations_missed"] = int(v)
                if groups and all(d.get("evaluations", 0) >= (1 if n in slow else min(o.rule_evals, 2))
                                  for n, d in groups.items()):
                    break
                time.sleep(1.0)
            m = _metrics(va_url)
            dropped = int(_sum(m, "vmalert_remotewrite_dropped_rows_total"))
            # what the recording rules wrote at their last evaluation: rules over windows the data
            # no longer reaches write nothing, and cost nothing
            written = int(_sum(m, "vmalert_recording_rules_last_evaluation_samples"))
        finally:
            proc.stop()
        left = self.scn.t_end - (time.time() - lookback)  # the data past the last evaluation's time
        if left < -rconfig.duration_seconds(self.cfg["windows"]["rate"]) / 2:  # (vmalert outlived its budget)
            log.warning("scale: the live evaluation read %.0f s past the data's end; rule times understate", -left)
            self.result["rules_warning"] = f"the live evaluation read {-left:.0f} s past the data's end"
        for d in groups.values():
            n, s = d.pop("evaluations", 0), d.pop("seconds_sum", 0.0)
            d["evaluations"] = n
            d.setdefault("evaluation_seconds_median", round(s / n, 4) if n else None)
            d.setdefault("evaluation_seconds_max", d["evaluation_seconds_median"])
        worst = max((d.get("evaluation_seconds_max") or 0.0 for d in groups.values()), default=0.0)
        return {"groups": sorted(groups.values(), key=lambda d: d["name"]), "max_group_seconds": worst,
                "vmalert_dropped_rows": dropped, "records_last_evaluation_samples": written,
                "lookback_seconds": lookback, "data_left_seconds": round(left, 1)}


def _by_concurrency(runs: Dict[int, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """Per ``--concurrency`` value ("all" for 0): its rounds, and per group the median of the rounds'
    medians and the largest max."""
    out: Dict[str, Any] = {}
    for c, rounds in runs.items():
        per: Dict[str, Dict[str, List[float]]] = {}
        for r in rounds:
            for g in r["groups"]:
                d = per.setdefault(g["name"], {"medians": [], "maxes": []})
                if g.get("evaluation_seconds_median") is not None:
                    d["medians"].append(g["evaluation_seconds_median"])
                    d["maxes"].append(g["evaluation_seconds_max"])
        out[str(c or "all")] = {
            "rounds": rounds,
            "groups": {n: {"median": round(statistics.median(d["medians"]), 4) if d["medians"] else None,
                           "max": max(d["maxes"], default=None), "round_medians": d["medians"]}
                       for n, d in sorted(per.items())}}
    return out


def report(r: Dict[str, Any]) -> str:
    sc, q, ru, st = r["scenario"], r["queries"], r["rules"], r["store"]
    lines = [f"ranksight bench scale --engine victoriametrics: {sc['nodes']} nodes x {sc['gpus_per_node']} GPUs, "
             f"{sc['ranks']} ranks, {sc['hours']:g} h at {sc['step_seconds']} s ({sc['design']})",
             f"queries: {q['count']}; p50 {q['p50_seconds']:.3f} s, p99 {q['p99_seconds']:.3f} s; "
             f"{len(q['over_target'])} over target; {len(q['errors'])} errors"]
    for it in sorted(q["items"], key=lambda x: -x["seconds"])[:10]:
        lines.append(f"  {it['seconds']:8.3f} s  {it['series'] or 0:6d} series  {it['dashboard']} / {it['panel']}")
    for g in ru["groups"]:
        lines.append(f"rule group {g['name']}: evaluation median {g['evaluation_seconds_median']} s, max "
                     f"{g['evaluation_seconds_max']} s ({g['evaluations']} evaluations, "
                     f"{g.get('iterations_missed', 0)} missed)")
    lines += rule_cost_lines(r)
    by = r.get("rules_by_concurrency")
    if by:
        keys = list(by)
        lines.append("rule groups by concurrency, median of the rounds' medians / largest max, s: "
                     + ", ".join(f"concurrency {k} ({len(by[k]['rounds'])} rounds)" for k in keys))
        for name in sorted({n for k in keys for n in by[k]["groups"]}):
            cells = []
            for k in keys:
                g = by[k]["groups"].get(name) or {}
                cells.append(f"{g.get('median')} / {g.get('max')}")
            lines.append(f"  {name:40s} " + "   ".join(f"{c:>16s}" for c in cells))
    lines.append(f"live evaluation: the recording rules wrote {ru.get('records_last_evaluation_samples')} samples at "
                 f"their last evaluation, {ru.get('data_left_seconds')} s of data before its end"
                 + (f"; {r['rules_warning']}" if r.get("rules_warning") else ""))
    lines.append(f"dropped samples: store ignored {st['rows_ignored']} rows, vmalert dropped {ru['vmalert_dropped_rows']}")
    lines.append(f"store: RSS {binary_bytes(st['rss_bytes'])} (peak {binary_bytes(st['rss_peak_bytes'])}), "
                 f"disk {binary_bytes(st['disk_bytes'])}; "
                 + (f"the store of {r['import']['reused']} reused" if "reused" in r["import"] else
                    f"import {r['import']['samples']:,} samples in {r['import']['seconds']} s, rules backfill "
                    f"{r['backfill']['rules_seconds']} s")
                 + f"; total {r['wall_seconds']} s")
    return "\n".join(lines)
