"""Plumbing for the framework integration tests: run a worker under a real launcher (torchrun,
Lightning's own launcher, ``accelerate launch``), read RESULT lines, and read one rank's series
from a real agent's /metrics."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

from prometheus_client.parser import text_string_to_metric_families

from ranksight import catalog
from ranksight.common.plumbing import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def worker_env(agent: str, job: str, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSIGHT", "TORCHELASTIC", "SLURM"))}
    env.update(OFFLINE)
    env.update(OMP_NUM_THREADS="1", RANKSIGHT_AGENT=agent, RANKSIGHT_JOB=job, PYTHONUNBUFFERED="1",
               RANKSIGHT__hooks__table_every_steps="0", RANKSIGHT__hooks__table_every_seconds="0",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p))
    env.update(extra or {})
    return env


def torchrun(nproc: int, max_restarts: int = 0) -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts",
            str(max_restarts)]


def accelerate_launch(nproc: int) -> List[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
            str(nproc), "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no",
            "--dynamo_backend", "no"]


def launch(cmd: Sequence[str], env: Mapping[str, str], timeout: float = 240.0) -> Dict[str, Any]:
    """Run a launcher to its end; rc, output and every RESULT line's JSON (one per rank process)."""
    try:
        p = subprocess.run(list(cmd), env=dict(env), capture_output=True, text=True, timeout=timeout, cwd=REPO)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")) + "\n[killed: timeout]"
        rc = -9
    results = [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]
    return {"rc": rc, "out": out, "err": err, "results": results}


def rank_series(text: str, job: str) -> Dict[int, Dict[str, float]]:
    """rank -> {sample name: value} for the job's rank series without labels beyond the identity
    (counters as ``<name>_total``, histograms as ``<name>_count``/``_sum``); also the rank's
    ``local_rank`` label as "local_rank" (and a pipeline stage's ``stage`` label as "stage"). Fails on any datagram the agent did not take."""
    out: Dict[int, Dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == catalog.INGEST_DATAGRAMS.name and s.labels.get("result") != "ok":
                assert s.value == 0, f"the agent dropped datagrams: {s}"
            if s.labels.get("job") != job or "rank" not in s.labels:
                continue
            extra = set(s.labels) - {"job", "rank", "local_rank", "node", "le", "quantile", "stage"}
            if extra or "le" in s.labels or "quantile" in s.labels:
                continue
            r = out.setdefault(int(s.labels["rank"]), {})
            r[s.name] = s.value
            r["local_rank"] = float(s.labels.get("local_rank", -1))
            if "stage" in s.labels:  # a pipeline stage's series: the stage label, as the series' value reads it
                r["stage"] = float(s.labels["stage"])
    return out


def check_rank(series: Dict[str, float], steps: int, accum: int, wait_per_step: float, ckpts: int,
               writer: bool) -> None:
    """One rank's series after the run: steps, micro-batches, data wait per step within 25% of the
    injected delay, and the framework's checkpoint writes (timed on every rank; the bytes on the
    rank that writes the checkpoint, ``writer``)."""
    assert series.get(catalog.STEPS.name) == steps, series
    assert series.get(catalog.MICROBATCHES.name) == steps * accum, series
    wait = series[catalog.DATALOADER_WAIT.name] / steps
    assert abs(wait - wait_per_step) <= 0.25 * wait_per_step, (wait, wait_per_step)
    assert series.get(catalog.CHECKPOINT_WRITE.count) == ckpts, series
    assert series.get(catalog.CHECKPOINT_SECONDS.name, 0) > 0
    assert (series.get(catalog.CHECKPOINT_BYTES.name, 0) > 0) == writer, series
    assert series.get(catalog.HOOK_ERRORS.name) == 0, series
    assert series.get(catalog.RANK_FINISHED.name) == 1, series  # read after a clean exit: the linger
