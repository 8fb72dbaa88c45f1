"""Every multi-GPU run, launched with torchrun on this machine's GPUs, checked, summarized.

    python3 bench/multigpu/orchestrate.py --out DIR [--gpus N] [--only comm,fr,straggler,hang,overhead]

Runs (each a torchrun job of ``bench/multigpu/train.py``, NCCL, one process per GPU):

  comm_ddp, comm_fsdp2   hooks' comm and exposed comm vs the profiler trace of the same steps, per
                         rank: comm vs the union of NCCL kernels, exposed comm vs HTA's exposed
                         communication (NCCL kernel time not overlapped by compute kernels).
                         Target: within 15%.
  comm_ddp_fr            the same DDP job with TORCH_NCCL_ENABLE_TIMING=1: hooks' comm (from the
                         Flight Recorder) vs the Flight Recorder's own durations and vs comm_ddp.
  straggler              a real agent (``ranksight exporter``, profile test) receives every rank's
                         datagrams; rank 1 sleeps 20% of its own step (0.25 x the plain step) inside
                         the step. With a Prometheus binary (``$RANKSIGHT_PROMETHEUS``,
                         ``.devbin/prometheus`` or PATH) the generated rules run in a real Prometheus
                         scraping the agent and the straggler alert must name rank 1 only.
                         Without one, the straggler recording rule (``triage.REC["straggler"]``) is
                         computed from two scrapes of the agent's /metrics, 30 s apart (the test
                         profile's rate window), with the rule's own arithmetic.
  hang                   rank 1 stops inside step 30; the others block in NCCL. Within 60 s the
                         agent must report rank 1 stalled (reason no_progress) and must not blame
                         the others (no stall, or reason waiting_in_collective).
  overhead_2, overhead_N plain vs instrumented phases in one job (two model copies), 2 GPUs and all.

Writes ``DIR/summary.json`` (every figure, pass/fail per check) and the per-rank JSON files.
NCCL_NVLS_ENABLE=0 stays set for every process.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "gpu"))

import gpu_workload as W  # noqa: E402

TOL = 0.15
ENV_BASE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "4"}


def log(msg: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


class Orchestrator:
    def __init__(self, out: Path, gpus: int, deadline: float):
        self.out = out
        self.gpus = gpus
        self.deadline = deadline
        self.summary: Dict[str, Any] = {"gpus": gpus, "versions": W.versions(), "checks": {}, "runs": {}}

    # ------------------------------------------------------------------ helpers
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, name: str, ok: bool, detail: Any) -> None:
        self.summary["checks"][name] = {"ok": bool(ok), "detail": detail}
        log(f"check {name}: {'PASS' if ok else 'FAIL'} {json.dumps(detail, default=str)[:400]}")
        self.save()

    def save(self) -> None:
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1, default=str) + "\n")

    def env(self, **extra: str) -> Dict[str, str]:
        e = dict(os.environ)
        for k in ("TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"):
            e.pop(k, None)
        e.update(ENV_BASE)
        e.update(extra)
        return e

    def torchrun(self, nproc: int, args: List[str], timeout: float, env: Optional[Dict[str, str]] = None,
                 wait: bool = True) -> Any:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(HERE / "train.py"), *args, "--out-dir", str(self.out)]
        logf = open(self.out / f"{args[args.index('--tag') + 1]}.log", "w")
        log("torchrun " + " ".join(cmd[3:]))
        p = subprocess.Popen(cmd, env=env or self.env(), stdout=logf, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=str(REPO))
        if not wait:
            return p
        try:
            p.wait(timeout=max(10.0, min(timeout, self.left())))
        except subprocess.TimeoutExpired:
            self.kill(p)
            return None
        return p.returncode

    @staticmethod
    def kill(p: subprocess.Popen) -> None:
        """torchrun, its process group and every descendant (the elastic agent may start the
        workers in sessions of their own, so the group alone can leave a hung rank behind)."""
        import psutil

        try:
            kids = psutil.Process(p.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for k in kids:
            try:
                k.kill()
            except psutil.Error:
                pass
        p.wait(timeout=30)
        psutil.wait_procs(kids, timeout=10)

    def ranks(self, tag: str, n: int) -> List[Dict[str, Any]]:
        out = []
        for r in range(n):
            p = self.out / f"{tag}_rank{r}.json"
            out.append(json.loads(p.read_text()) if p.exists() else {"rank": r, "missing": True})
        return out

    # ------------------------------------------------------------------ comm
    def comm(self, mode: str, tag: str, fr: bool = False) -> List[Dict[str, Any]]:
        env = self.env(**({"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"} if fr else {}))
        rc = self.torchrun(self.gpus, ["comm", "--mode", mode, "--tag", tag, "--steps", "20"], 240, env)
        rs = self.ranks(tag, self.gpus)
        self.summary["runs"][tag] = {"rc": rc, "ranks": rs}
        self.save()
        return rs

    def comm_checks(self, tag: str, rs: List[Dict[str, Any]]) -> None:
        for r in rs:
            if "hooks" not in r:
                self.check(f"{tag}_rank{r.get('rank')}_ran", False, r.get("crashed", "missing")[-800:])
                continue
            h, p = r["hooks"], r["profiler"]
            d_comm = W_rel(h["comm"], p["comm_s"])
            d_x = W_rel(h["xcomm"], p["exposed_s"])
            self.check(f"{tag}_rank{r['rank']}_comm", d_comm <= TOL,
                       {"hooks_ms": h["comm"] * 1e3, "profiler_nccl_union_ms": p["comm_s"] * 1e3, "rel": d_comm,
                        "nccl_kernels": p["comm_kernels"]})
            self.check(f"{tag}_rank{r['rank']}_exposed", d_x <= TOL,
                       {"hooks_xcomm_ms": h["xcomm"] * 1e3, "hta_exposed_ms": p["exposed_s"] * 1e3, "rel": d_x,
                        "hta_overlap_ratio": p["overlap_ratio"]})
            self.check(f"{tag}_rank{r['rank']}_clean", r.get("herr", 1) == 0 and r.get("records_complete", False),
                       {"herr": r.get("herr"), "stats": r.get("stats")})

    # ------------------------------------------------------------------ agent / prometheus
    def agent(self, name: str):
        from ranksight.tools.stack import AgentProcess

        a = AgentProcess(self.out / name, collectors="ranks" if os.environ.get("RANKSIGHT_MG_SMOKE") == "1" else "gpu,ranks", args=("--profile", "test"), name=name,
                         env={"RANKSIGHT__agent__stall_min_seconds": "20"})
        return a.start(timeout=60)

    @staticmethod
    def prometheus_binary() -> Optional[str]:
        for c in (os.environ.get("RANKSIGHT_PROMETHEUS"), str(REPO / ".devbin" / "prometheus"), shutil.which("prometheus")):
            if c and os.path.isfile(c) and os.access(c, os.X_OK):
                return c
        return None

    def start_prometheus(self, target: str) -> Any:
        """Prometheus over the test-profile rules, scraping ``target`` every second (a Server)."""
        from ranksight.common import servers
        from ranksight.tools.stack_files import rules_prometheus

        server = rules_prometheus(self.out / "prometheus", [target], binary=self.prometheus_binary()).start()
        try:
            server.wait_ready(20.0)
        except servers.ServerError as e:  # the straggler check reads no rule and fails with the rest
            log(str(e))
        return server

    # ------------------------------------------------------------------ straggler
    def straggler(self, rank: int = 1, frac: float = 0.2, seconds: float = 80.0) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        from ranksight import catalog as C
        agent = self.agent("agent_straggler")
        prom = None
        try:
            binary = self.prometheus_binary()
            if binary:
                prom = self.start_prometheus(agent.target)
            p = self.torchrun(self.gpus, ["run", "--tag", "straggler", "--seconds", str(seconds), "--agent", agent.ingest,
                                          "--straggler-rank", str(rank), "--straggler-frac", str(frac / (1 - frac))],
                              seconds + 60, wait=False)
            time.sleep(min(45.0, seconds / 2))

            def scrape() -> Dict[Tuple[str, str], float]:
                fams = text_string_to_metric_families(agent.metrics_text())
                vals: Dict[Tuple[str, str], float] = {}
                for f in fams:
                    for s in f.samples:
                        if "rank" in s.labels:
                            vals[(s.name, s.labels["rank"])] = s.value
                return vals

            m1, t1 = scrape(), time.monotonic()
            time.sleep(30.0)
            m2, t2 = scrape(), time.monotonic()
            ranks = sorted({r for (_, r) in m2}, key=int)

            def delta(metric: Any, r: str) -> float:
                name = str(metric)
                return m2.get((name, r), 0.0) - m1.get((name, r), 0.0)

            busy = {}
            for r in ranks:
                steps = delta(C.STEPS, r)
                if steps > 0:
                    b = delta(C.STEP_SECONDS, r) - delta(C.DATALOADER_WAIT, r) - delta(C.EXPOSED_COMM_SECONDS, r) \
                        - delta(C.CHECKPOINT_SECONDS, r)
                    busy[r] = max(b, 0.0) / steps
            vals = sorted(busy.values())
            if len(vals) == 2:
                med = vals[0]
            elif vals:
                med = W.median(vals)
            else:
                med = 0.0
            ratio = {r: (b / med if med > 0 else None) for r, b in busy.items()}
            from ranksight import config

            thr = config.load(None, "test")["thresholds"]["straggler_ratio"]
            flagged = sorted(r for r, v in ratio.items() if v is not None and v > thr)
            detail: Dict[str, Any] = {"busy_s_per_step": busy, "ratio_from_metrics": ratio, "threshold": thr,
                                      "flagged_from_metrics": flagged, "window_s": t2 - t1}
            if prom is not None:
                from ranksight import triage
                from ranksight.common.plumbing import ApiError, PrometheusAPI

                prom_api = PrometheusAPI(prom.url)
                straggler_alert = next(e.alert for e in triage.table(config.load(None, "test")) if e.id == "straggler")
                deadline = time.monotonic() + 40
                firing: List[str] = []
                rule: Dict[str, float] = {}
                while time.monotonic() < deadline:
                    try:
                        rule = {x["metric"].get("rank", "?"): float(x["value"][1])
                                for x in prom_api.query(triage.REC["straggler"])}
                        firing = sorted(a["labels"].get("rank", "?") for a in prom_api.alerts()
                                        if a["labels"].get("alertname") == straggler_alert and a["state"] == "firing")
                    except ApiError:
                        pass
                    if firing:
                        break
                    time.sleep(2)
                detail.update(prometheus=binary, rule_ratio=rule, alert_firing_ranks=firing)
                ok = firing == [str(rank)]
            else:
                detail["prometheus"] = "not available on this machine: rule computed from /metrics"
                ok = flagged == [str(rank)]
            self.check("straggler_named_alone", ok, detail)
            try:
                p.wait(timeout=max(10.0, seconds + 60))
            except subprocess.TimeoutExpired:
                self.kill(p)
            self.summary["runs"]["straggler"] = {"ranks": self.ranks("straggler", self.gpus)}
        finally:
            if prom is not None:
                prom.stop(10.0)
            agent.stop()

    # ------------------------------------------------------------------ hang
    def hang(self, rank: int = 1, step: int = 30, fr: bool = False) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        from ranksight import catalog as C

        tag = "hang_fr" if fr else "hang"
        agent = self.agent(f"agent_{tag}")
        env = self.env(**({"TORCH_NCCL_ENABLE_TIMING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"} if fr else {}))
        p = self.torchrun(self.gpus, ["run", "--tag", tag, "--seconds", "600", "--agent", agent.ingest,
                                      "--hang-rank", str(rank), "--hang-step", str(step), "--item-every", "10"],
                          600, env, wait=False)
        marker = self.out / f"hang_rank{rank}.json"
        try:
            t_hang = None
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and t_hang is None:
                if marker.exists():
                    t_hang = json.loads(marker.read_text())["at"]
                time.sleep(0.5)
            if t_hang is None:
                self.check(f"{tag}_detected_within_60s", False, "rank never reached the hang step")
                return
            seen: Dict[str, Any] = {}
            found = None
            while time.time() - t_hang < 75:
                stalls: Dict[str, str] = {}
                for f in text_string_to_metric_families(agent.metrics_text()):
                    if f.name == str(C.RANK_STALLED):
                        for s in f.samples:
                            if s.value == 1:
                                stalls[s.labels["rank"]] = s.labels.get("reason", "")
                seen = stalls
                if str(rank) in stalls:
                    found = time.time() - t_hang
                    break
                time.sleep(1.0)
            time.sleep(3.0)  # let the others' verdicts settle a few checks more
            final: Dict[str, str] = {}
            for f in text_string_to_metric_families(agent.metrics_text()):
                if f.name == str(C.RANK_STALLED):
                    for s in f.samples:
                        if s.value == 1:
                            final[s.labels["rank"]] = s.labels.get("reason", "")
            others_blamed = {r: why for r, why in final.items() if r != str(rank) and why != C.STALL_WAITING}
            self.check(f"{tag}_detected_within_60s", found is not None and found <= 60,
                       {"seconds_to_detect": found, "stalled_at_detection": seen, "stalled_after": final})
            self.check(f"{tag}_blocked_ranks_not_blamed", found is not None and not others_blamed,
                       {"stalled_after": final, "blamed": others_blamed,
                        "hung_rank_reason": final.get(str(rank))})
        finally:
            self.kill(p)
            agent.stop()
            marker.unlink(missing_ok=True)

    # ------------------------------------------------------------------ overhead
    def overhead(self, nproc: int, mode: str = "ddp") -> None:
        tag = f"overhead_{mode}_{nproc}gpu"
        rc = self.torchrun(nproc, ["overhead", "--mode", mode, "--tag", tag, "--reps", "6", "--steps", "25"], 300)
        rs = self.ranks(tag, nproc)
        self.summary["runs"][tag] = {"rc": rc, "ranks": rs}
        r0 = rs[0]
        self.check(f"{tag}_measured", "ratio_median_of_pairs" in r0,
                   {k: r0.get(k) for k in ("plain_ms_median", "instrumented_ms_median", "ratio_median_of_pairs",
                                           "ratio_p25", "ratio_p75")} if "ratio_median_of_pairs" in r0 else r0)


def W_rel(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return abs(a - b) / abs(b)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all)")
    p.add_argument("--only", default="comm,fr,straggler,hang,overhead")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds for everything")
    a = p.parse_args(argv)
    smoke = os.environ.get("RANKSIGHT_MG_SMOKE") == "1"
    if not W.cuda_available() and not smoke:
        print("bench/multigpu/orchestrate.py: CUDA is not available on this machine; skipped "
              "(RANKSIGHT_MG_SMOKE=1 runs the same flow on CPU with gloo, to check the scripts)")
        return 0
    import torch

    n = a.gpus or (2 if smoke else torch.cuda.device_count())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    o = Orchestrator(out, n, time.monotonic() + a.deadline)
    only = set(a.only.split(","))
    if n < 2:
        log(f"only {n} GPU: the multi-GPU checks need 2 or more; running what a single rank can show")
    steps = [
        ("comm", lambda: o.comm_checks("comm_ddp", o.comm("ddp", "comm_ddp"))),
        ("comm", lambda: o.comm_checks("comm_fsdp2", o.comm("fsdp2", "comm_fsdp2"))),
        ("fr", lambda: fr_checks(o)),
        ("straggler", lambda: o.straggler() if n >= 2 else None),
        ("hang", lambda: o.hang() if n >= 2 else None),
        ("overhead", lambda: o.overhead(min(2, n))),
        ("overhead", lambda: o.overhead(n) if n > 2 else None),
    ]
    for key, fn in steps:
        if key not in only:
            continue
        if o.left() < 30:
            log(f"deadline: {key} not run")
            o.summary.setdefault("not_run", []).append(key)
            continue
        try:
            fn()
        except Exception as e:
            import traceback

            o.check(f"{key}_crashed", False, traceback.format_exc()[-1500:])
    o.save()
    fails = [k for k, v in o.summary["checks"].items() if not v["ok"]]
    print(json.dumps({"gpus": n, "checks": len(o.summary["checks"]), "failed": fails}))
    return 0


def fr_checks(o: Orchestrator) -> None:
    rs = o.comm("ddp", "comm_ddp_fr", fr=True)
    ev = o.summary["runs"].get("comm_ddp", {}).get("ranks", [])
    for r in rs:
        if "hooks" not in r:
            o.check(f"comm_ddp_fr_rank{r.get('rank')}_ran", False, str(r.get("crashed", "missing"))[-800:])
            continue
        fr = r.get("flight_recorder") or {}
        o.check(f"comm_ddp_fr_rank{r['rank']}_hooks_vs_recorder", fr.get("sum_s", 0) > 0 and
                W_rel(r["hooks"]["comm"], fr.get("sum_s", 0)) <= 0.02,
                {"hooks_ms": r["hooks"]["comm"] * 1e3, "recorder_ms": fr.get("sum_s", 0) * 1e3, "fr": fr})
        e = next((x for x in ev if x.get("rank") == r["rank"] and "hooks" in x), None)
        if e is not None:
            a_, b_ = fr.get("sum_s", 0) / r["steps"], e["hooks"]["comm"] / e["steps"]
            o.check(f"comm_ddp_fr_rank{r['rank']}_recorder_vs_events", W_rel(a_, b_) <= TOL,
                    {"recorder_ms_per_step": a_ * 1e3, "events_ms_per_step": b_ * 1e3,
                     "profiler_nccl_ms_per_step": r["profiler"]["comm_s"] / r["steps"] * 1e3})


if __name__ == "__main__":
    sys.exit(main())
