"""`ranksight bench scale`: N nodes x G GPUs x R ranks backfilled into a real Prometheus.

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
"""
from __future__ import annotations

import argparse
import bisect
import concurrent.futures
import json
import logging
import math
import multiprocessing
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import yaml

from . import __version__
from . import catalog as C
from . import config as rconfig
from . import triage
from .tools.stack import free_port

log = logging.getLogger(__name__)

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
AGENT_PORT = 9945

BACKFILL_CPU_S_PER_SAMPLE = 4.5e-6  # generation + promtool (reads its input twice), per sample, one core
TARGET_QUERY_S = 1.0
TARGET_RULE_GROUP_S = 5.0
TARGET_SERIES_PER_NODE = 1500

# Label values the agent's collectors produce (exporter/ranks.py, exporter/ingest.py,
# exporter/collectors/*). Kept here so the generator runs without the agent installed;
# tests/test_scale.py checks them against the agent's own constants.
STALL_REASONS = ("no_progress", "waiting_in_collective")
INGEST_RESULTS = ("ok", "malformed", "oversize", "rejected", "overflow")
TCP_EXT_COUNTERS = ("TCPLostRetransmit", "TCPTimeouts", "TCPSynRetrans")
COLLECTORS = ("gpu", "network", "rdma", "disk", "ranks")
QUANTILES = ("0.5", "0.99")

# A DGX H100/H200-class node: 8 single-port ConnectX-7 HCAs on the compute fabric,
# two storage ports (RoCE), IPoIB netdevs for the eight HCAs, a bond and a management NIC.
NETDEVS = ("bond0", "eno1", "enp170s0f0np0", "enp170s0f1np1",
           "ibp154s0", "ibp192s0", "ibp206s0", "ibp220s0", "ibp24s0", "ibp64s0", "ibp79s0", "ibp94s0")
RDMA_PORTS = tuple((f"mlx5_{i}", "1") for i in range(10))
# /sys/class/infiniband/<dev>/ports/<port>/counters on mlx5 (21 files) ...
IB_PORT_COUNTERS = (
    "VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
    "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
    "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_constraint_errors",
    "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
    "unicast_rcv_packets", "unicast_xmit_packets",
)
# ... and .../hw_counters of mlx5 (drivers/infiniband/hw/mlx5/counters.c: basic, extended, congestion)
MLX5_HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "np_cnp_sent",
    "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
    "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request", "resp_cqe_error",
    "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors", "rnr_nak_retry_err",
    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_cnps",
    "roce_slow_restart_trans", "rp_cnp_handled", "rp_cnp_ignored", "rx_atomic_requests", "rx_dct_connect",
    "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests",
)
# The agent's RDMA allowlist: throughput, the link-error and congestion counters
# the runbooks name. Everything else stays readable on the node (`cat` the file).
RDMA_CURATED = C.RDMA_CURATED_COUNTERS  # the agent's default (agent.rdma_counters: curated)
DISK_PATHS = ("/", "/checkpoints", "/tmp")


@dataclass(frozen=True)
class Shape:
    """What one node's agent exposes besides the catalog itself."""

    gpus: int = 8
    ranks_per_node: int = 8
    netdevs: Tuple[str, ...] = NETDEVS
    rdma_ports: Tuple[Tuple[str, str], ...] = RDMA_PORTS
    rdma_counters: Tuple[str, ...] = RDMA_CURATED  # the agent's default (agent.rdma_counters: curated)
    disk_paths: Tuple[str, ...] = DISK_PATHS
    lints_exposed: str = "active"  # the agent: only lints at 1; "all": every lint the hooks checked, 0 or 1


DESIGNS = ("as-is", "all-series")


def shape_for(design: str, gpus: int, ranks_per_node: int) -> Shape:
    """as-is: what the agent exposes today (agent.rdma_counters: curated, lint_active only while a
    lint applies); all-series: every RDMA counter file and a 0/1 series per lint checked, the
    1,747 series per node the first scale run measured."""
    if design == "as-is":
        return Shape(gpus=gpus, ranks_per_node=ranks_per_node)
    if design == "all-series":
        return Shape(gpus=gpus, ranks_per_node=ranks_per_node, rdma_counters=IB_PORT_COUNTERS + MLX5_HW_COUNTERS,
                     lints_exposed="all")
    raise ValueError(f"unknown design {design!r} (known: {', '.join(DESIGNS)})")


@dataclass(frozen=True)
class Scenario:
    nodes: int
    shape: Shape
    t0: int  # first sample (unix seconds, a multiple of step)
    samples: int
    step: int = 15
    job: str = "llm-pretrain"
    stragglers: Tuple[int, ...] = ()  # global rank ids
    dataloader_node: int = 0
    seed: int = 9

    @property
    def t_end(self) -> int:
        """Timestamp of the last sample."""
        return self.t0 + (self.samples - 1) * self.step

    @property
    def ranks(self) -> int:
        return self.nodes * self.shape.ranks_per_node


def node_name(n: int) -> str:
    return f"node{n:04d}"


def default_stragglers(nodes: int, rpn: int) -> Tuple[int, ...]:
    """Three straggler ranks spread over the job (fewer on tiny jobs), never on the dataloader node."""
    total = nodes * rpn
    picks = sorted({(total * k) // 4 + rpn // 2 + 1 for k in (1, 2, 3)})
    return tuple(r for r in picks if rpn <= r < total)


# ------------------------------------------------------------------------------ value model
def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def _cum(xs: Iterable[float], start: float = 0.0) -> List[float]:
    out, acc = [], start
    for x in xs:
        acc += x
        out.append(acc)
    return out


def _le(b: float) -> str:
    """Bucket bound as prometheus_client writes it (floatToGoString)."""
    if b == math.inf:
        return "+Inf"
    s = repr(float(b))
    return s


@dataclass
class Series:
    """One family's values for one (profile, variant): extra label values -> value strings."""

    values: Dict[Tuple[str, ...], List[str]]


K_VARIANTS = 8  # distinct noise realisations per profile; entities pick one by index


class Model:
    """A synchronous data-parallel job: every rank's step lasts as long as the slowest
    rank's busy time plus data wait; the faster ranks spend the difference blocked in
    collectives (exposed communication). Checkpoints every 20 minutes stop every rank."""

    BUSY = 1.20  # seconds of compute per step (forward + backward + optimizer)
    DATA = 0.015  # healthy dataloader wait per step
    DATA_BOUND = 0.55  # the dataloader-bound node's ranks
    STRAGGLE = 1.35  # straggler busy-time factor
    OVERLAP = 0.35  # collective time hidden under backward
    XCOMM_MIN = 0.05  # exposed collective time of the slowest rank
    CKPT_EVERY = 1200
    CKPT_SECONDS = 12.0
    CKPT_BYTES = 2.2e9  # per rank shard
    STEPS0 = 9000.0  # the job has been running for a few hours
    MICRO = 4  # gradient accumulation

    def __init__(self, scn: Scenario):
        self.scn = scn
        self.T = scn.samples
        self.s = float(scn.step)
        self.ts = [scn.t0 + i * scn.step for i in range(self.T)]
        rnd = random.Random(scn.seed)
        self.jitter = [rnd.gauss(0.0, 1.0) for _ in range(self.T)]
        # checkpoint seconds inside each scrape interval (t-step, t]
        self.ckpt = [self.CKPT_SECONDS if (t // self.CKPT_EVERY) != ((t - scn.step) // self.CKPT_EVERY) else 0.0
                     for t in self.ts]
        self.last_ckpt_ts = [float((t // self.CKPT_EVERY) * self.CKPT_EVERY) + self.CKPT_SECONDS for t in self.ts]
        self.ckpt_count0 = 14.0
        has_straggler = bool(scn.stragglers)
        has_dl = 0 <= scn.dataloader_node < scn.nodes
        slowest = max(self.BUSY * 1.01 + self.DATA,
                      self.BUSY * self.STRAGGLE if has_straggler else 0.0,
                      self.BUSY + self.DATA_BOUND if has_dl else 0.0)
        self.D = [(slowest + self.XCOMM_MIN) * (1.0 + 0.006 * j) for j in self.jitter]  # job step per interval
        self.n = [max(self.s - c, 0.0) / d for c, d in zip(self.ckpt, self.D)]  # steps per interval
        self._cache: Dict[Tuple[str, str, int], Series] = {}

    # -- helpers
    def _noise(self, key: str, v: int, sd: float) -> List[float]:
        rnd = random.Random(f"{self.scn.seed}/{key}/{v}")
        return [rnd.gauss(0.0, sd) for _ in range(self.T)]

    def _rank_phase(self, profile: str, v: int) -> Dict[str, List[float]]:
        f = 1.0 + 0.01 * (v - (K_VARIANTS - 1) / 2) / K_VARIANTS
        if profile == "straggler":
            f *= self.STRAGGLE
        nb = self._noise("busy", v, 0.004)
        busy = [self.BUSY * f * (1 + e) for e in nb]
        d0 = self.DATA_BOUND if profile == "dataloader" else self.DATA
        nd = self._noise("data", v, 0.05)
        data = [d0 * (1 + e) for e in nd]
        xcomm = [max(D - b - d, self.XCOMM_MIN * 0.5) for D, b, d in zip(self.D, busy, data)]
        return {"busy": busy, "data": data, "xcomm": xcomm}

    @staticmethod
    def _fmt_int(xs: Sequence[float]) -> List[str]:
        return [str(int(x)) for x in xs]

    @staticmethod
    def _fmt(xs: Sequence[float], nd: int = 3) -> List[str]:
        f = f"{{:.{nd}f}}".format
        return [f(x) for x in xs]

    @staticmethod
    def _const(x: str, T: int) -> List[str]:
        return [x] * T

    def _hist(self, counts: Sequence[float], medians: Sequence[float], sigma: float, bounds: Sequence[float],
              count0: float, median0: float) -> Dict[Tuple[str, ...], List[str]]:
        """Cumulative histogram series (bucket per le, +Inf, sum, count) for per-interval
        observation counts around per-interval medians (lognormal)."""
        out: Dict[Tuple[str, ...], List[str]] = {}
        les = list(bounds) + [math.inf]
        for b in les:
            if b == math.inf:
                fr0, frs = 1.0, [1.0] * self.T
            else:
                lb = math.log(b)
                fr0 = _phi((lb - math.log(median0)) / sigma)
                frs = [_phi((lb - math.log(max(m, 1e-9))) / sigma) for m in medians]
            out[("bucket", _le(b))] = self._fmt_int(_cum((c * fr for c, fr in zip(counts, frs)), count0 * fr0))
        mean_factor = math.exp(sigma * sigma / 2)
        out[("sum",)] = self._fmt(_cum((c * m * mean_factor for c, m in zip(counts, medians)),
                                       count0 * median0 * mean_factor))
        out[("count",)] = self._fmt_int(_cum(counts, count0))
        return out

    # -- per family
    def values(self, m: C.Metric, profile: str, v: int) -> Series:
        key = (m.short, profile, v)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = Series(self._values(m, profile, v))
        return got

    def _values(self, m: C.Metric, profile: str, v: int) -> Dict[Tuple[str, ...], List[str]]:
        T, s = self.T, self.s
        fn = getattr(self, "_v_" + m.short, None)
        if fn is not None:
            return fn(m, profile, v)
        # default: a flat series of the right type (new catalog metrics are exposed, just flat)
        if m.type == "histogram":
            return self._hist([0.0] * T, [1.0] * T, 0.2, m.buckets, 0.0, 1.0)
        return {(): self._const("0", T)}

    # rank families
    def _rank_counter(self, what: str, profile: str, v: int) -> List[float]:
        p = self._rank_phase(profile, v)
        n = self.n
        per_step = {
            "steps": [1.0] * self.T,
            "micro": [float(self.MICRO)] * self.T,
            "step_s": self.D,
            "data_s": p["data"],
            "fwd_s": [0.36 * b for b in p["busy"]],
            "bwd_s": [0.56 * b for b in p["busy"]],
            "opt_s": [0.08 * b for b in p["busy"]],
            "comm_s": [x + self.OVERLAP for x in p["xcomm"]],
            "xcomm_s": p["xcomm"],
        }[what]
        start = self.STEPS0 * {"steps": 1.0, "micro": float(self.MICRO)}.get(what, statistics.fmean(per_step))
        inc = [k * x for k, x in zip(n, per_step)]
        if what == "step_s":  # the checkpoint step lasts its write too
            inc = [a + c for a, c in zip(inc, self.ckpt)]
        return _cum(inc, start)

    def _v_steps_total(self, m, profile, v):
        return {(): self._fmt_int(self._rank_counter("steps", profile, v))}

    def _v_microbatches_total(self, m, profile, v):
        return {(): self._fmt_int(self._rank_counter("micro", profile, v))}

    def _v_step_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("step_s", profile, v))}

    def _v_dataloader_wait_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("data_s", profile, v))}

    def _v_forward_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("fwd_s", profile, v))}

    def _v_backward_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("bwd_s", profile, v))}

    def _v_optimizer_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("opt_s", profile, v))}

    def _v_comm_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("comm_s", profile, v))}

    def _v_exposed_comm_seconds_total(self, m, profile, v):
        return {(): self._fmt(self._rank_counter("xcomm_s", profile, v))}

    def _v_checkpoint_seconds_total(self, m, profile, v):
        return {(): self._fmt(_cum(self.ckpt, self.ckpt_count0 * self.CKPT_SECONDS))}

    def _v_checkpoint_bytes_total(self, m, profile, v):
        return {(): self._fmt_int(_cum((self.CKPT_BYTES if c else 0.0 for c in self.ckpt),
                                       self.ckpt_count0 * self.CKPT_BYTES))}

    def _v_last_checkpoint_timestamp_seconds(self, m, profile, v):
        return {(): self._fmt(self.last_ckpt_ts, 1)}

    def _v_last_checkpoint_duration_seconds(self, m, profile, v):
        return {(): self._const(f"{self.CKPT_SECONDS + 0.01 * v:.3f}", self.T)}

    def _v_last_step_timestamp_seconds(self, m, profile, v):
        nz = self._noise("last", v, 0.3)
        return {(): self._fmt([t - abs(e) * d for t, e, d in zip(self.ts, nz, self.D)], 3)}

    def _v_step_duration_quantile_seconds(self, m, profile, v):
        return {("0.5",): self._fmt(self.D, 4), ("0.99",): self._fmt([d * 1.06 for d in self.D], 4)}

    def _v_step_duration_seconds(self, m, profile, v):
        # every step of a synchronous job lasts the job's step; the checkpoint step lasts the write too
        return self._hist(self.n, self.D, 0.03, m.buckets, self.STEPS0, self.D[0])

    def _v_dataloader_wait_seconds(self, m, profile, v):
        p = self._rank_phase(profile, v)
        return self._hist(self.n, p["data"], 0.35, m.buckets, self.STEPS0, p["data"][0])

    def _v_backward_to_optimizer_seconds(self, m, profile, v):
        p = self._rank_phase(profile, v)
        med = [0.56 * b + x for b, x in zip(p["busy"], p["xcomm"])]
        return self._hist(self.n, med, 0.05, m.buckets, self.STEPS0, med[0])

    def _v_checkpoint_write_seconds(self, m, profile, v):
        counts = [1.0 if c else 0.0 for c in self.ckpt]
        return self._hist(counts, [self.CKPT_SECONDS] * self.T, 0.08, m.buckets, self.ckpt_count0, self.CKPT_SECONDS)

    def _v_rank_up(self, m, profile, v):
        return {(): self._const("1", self.T)}

    # goodput (exporter/goodput.py): wall time since the first start; a startup of 10 minutes, no
    # disruption or stall in the hour modelled (their counters stay flat, as the agent exposes them)
    def _v_rank_wall_seconds_total(self, m, profile, v):
        start = self.STEPS0 * statistics.fmean(self.D) + 600.0
        return {(): self._fmt(_cum([self.s] * self.T, start))}

    def _v_badput_seconds_total(self, m, profile, v):
        return {(c,): self._const("600.000" if c == "startup" else "0", self.T) for c in C.BADPUT_AGENT_CATEGORIES}

    def _v_badput_overlap_seconds_total(self, m, profile, v):
        return {(c,): self._const("0", self.T) for c in C.OVERLAP_CATEGORIES}

    def _v_rank_finished(self, m, profile, v):
        return {}  # only while a cleanly exited rank lingers: none in a running job

    # only while a rank is stalled (where it is stuck) or blocked in a collective: none when healthy
    def _v_rank_stall_where(self, m, profile, v):
        return {}

    def _v_rank_collective_seq(self, m, profile, v):
        return {}

    def _v_rank_collective_wait_seconds(self, m, profile, v):
        return {}

    def _v_process_start_time_seconds(self, m, profile, v):
        return {(): self._const("%.3f" % (self.scn.t0 - 3600.0), self.T)}

    def _v_rank_gpu_info(self, m, profile, v):
        return {(): self._const("1", self.T)}  # labels: _labels_extra (the rank's GPU and its UUID)

    def _v_rank_stalled(self, m, profile, v):
        return {(r,): self._const("0", self.T) for r in STALL_REASONS}

    def _v_lint_active(self, m, profile, v):
        if self.scn.shape.lints_exposed == "active":
            return {}
        return {(lint,): self._const("0", self.T) for lint in triage.LINTS}

    def _v_cuda_memory_reserved_bytes(self, m, profile, v):
        nz = self._noise("mres", v, 0.002)
        return {(): self._fmt_int([71.5e9 * (1 + e) for e in nz])}

    def _v_cuda_memory_allocated_bytes(self, m, profile, v):
        nz = self._noise("malloc", v, 0.02)
        return {(): self._fmt_int([58.0e9 * (1 + e) for e in nz])}

    def _v_dataloader_workers_rss_bytes(self, m, profile, v):
        return {(): self._const(str(int(6.4e9 + 1e8 * v)), self.T)}

    def _v_cuda_alloc_retries_total(self, m, profile, v):
        if profile == "straggler":  # one cause among several: the allocator retries a little
            return {(): self._fmt_int(_cum([0.25] * self.T, 3))}
        return {(): self._const("0", self.T)}

    # GPU families
    def _gpu_util(self, profile: str, v: int) -> Tuple[List[float], List[float], List[float]]:
        nz = self._noise("util", v, 0.008)
        if profile == "dataloader":
            mean = [0.66 + 1.25 * e for e in nz]
            return mean, [0.0] * self.T, [1.0] * self.T
        mean = [min(0.995, 0.965 + e) for e in nz]
        return mean, [max(0.0, x - 0.09) for x in mean], [1.0] * self.T

    def _v_gpu_utilization_ratio(self, m, profile, v):
        mean, lo, hi = self._gpu_util(profile, v)
        return {("mean",): self._fmt(mean, 4), ("min",): self._fmt(lo, 4), ("max",): self._fmt(hi, 4)}

    def _v_gpu_utilization_samples(self, m, profile, v):
        mean, _, _ = self._gpu_util(profile, v)
        per = [5.0 * self.s] * self.T  # NVML samples at 5 Hz
        # a sawtooth is bimodal: model it as a wide spread around the mean
        sigma = 0.9 if profile == "dataloader" else 0.04
        return self._hist(per, mean, sigma, m.buckets, 5.0 * 3600 * 5, mean[0])

    def _v_gpu_utilization_swings_total(self, m, profile, v):
        per = [self.s / d if profile == "dataloader" else 0.0 for d in self.D]
        return {(): self._fmt_int(_cum(per, 40.0 + v))}

    def _v_gpu_busy_seconds_total(self, m, profile, v):
        mean, _, _ = self._gpu_util(profile, v)
        return {(): self._fmt(_cum((x * self.s for x in mean), 0.95 * 5 * 3600))}

    def _v_gpu_memory_used_bytes(self, m, profile, v):
        nz = self._noise("gmem", v, 0.002)
        return {(): self._fmt_int([74.2e9 * (1 + e) for e in nz])}

    def _v_gpu_memory_total_bytes(self, m, profile, v):
        return {(): self._const("150754820096", self.T)}

    def _v_gpu_temperature_celsius(self, m, profile, v):
        base = 84.0 if profile == "straggler" else 62.0 + v
        nz = self._noise("temp", v, 0.8)
        return {(): self._fmt([base + e for e in nz], 0)}

    def _v_gpu_power_watts(self, m, profile, v):
        base = 420.0 if profile == "dataloader" else 640.0
        nz = self._noise("power", v, 15.0)
        return {(): self._fmt([base + e for e in nz], 1)}

    def _v_gpu_sm_clock_hertz(self, m, profile, v):
        hz = "1590000000" if profile == "straggler" else "1980000000"
        return {(): self._const(hz, self.T)}

    def _v_gpu_clocks_event_active(self, m, profile, v):
        out = {(r,): self._const("0", self.T) for r in triage.CLOCK_EVENT_REASONS.values()}
        if profile == "straggler":
            out[("hw_thermal_slowdown",)] = self._const("1", self.T)
        return out

    def _v_gpu_pcie_link_generation(self, m, profile, v):
        return {("current",): self._const("5", self.T), ("max",): self._const("5", self.T)}

    def _v_gpu_pcie_link_width(self, m, profile, v):
        return {("current",): self._const("16", self.T), ("max",): self._const("16", self.T)}

    def _v_gpu_xid_errors_total(self, m, profile, v):
        return {}  # exposed only once an XID happened

    def _v_gpu_sm_active_ratio(self, m, profile, v):
        mean, _, _ = self._gpu_util(profile, v)
        return {(): self._fmt([0.88 * x for x in mean], 4)}

    def _v_gpu_tensor_active_ratio(self, m, profile, v):
        mean, _, _ = self._gpu_util(profile, v)
        return {(): self._fmt([0.47 * x for x in mean], 4)}

    def _v_gpu_up(self, m, profile, v):
        return {(): self._const("1", self.T)}

    def _v_gpu_info(self, m, profile, v):
        return {(): self._const("1", self.T)}

    # node families
    def _rate_counter(self, key: str, v: int, per_s: float, sd: float, start: float) -> List[str]:
        nz = self._noise(key, v, sd)
        return self._fmt_int(_cum((max(per_s * (1 + e), 0.0) * self.s for e in nz), start))

    def _v_net_tcp_retransmitted_segments_total(self, m, profile, v):
        return {(): self._rate_counter("retr", v, 18.0, 0.3, 3.1e5)}

    def _v_net_tcp_sent_segments_total(self, m, profile, v):
        return {(): self._rate_counter("sent", v, 2.2e5, 0.05, 3.9e9)}

    def _v_net_tcp_in_errors_total(self, m, profile, v):
        return {(): self._const("12", self.T)}

    def _v_net_tcp_ext_total(self, m, profile, v):
        return {("TCPLostRetransmit",): self._rate_counter("lost", v, 0.4, 0.5, 7100),
                ("TCPTimeouts",): self._rate_counter("tmo", v, 0.2, 0.5, 2900),
                ("TCPSynRetrans",): self._const("31", self.T)}

    def _v_net_interface_errors_total(self, m, profile, v):
        return {(d, x): self._const("0", self.T) for d in self.scn.shape.netdevs for x in ("receive", "transmit")}

    def _v_net_interface_drops_total(self, m, profile, v):
        return {(d, x): self._const("0" if not d.startswith("eno") else "17", self.T)
                for d in self.scn.shape.netdevs for x in ("receive", "transmit")}

    def _dev_rate(self, dev: str) -> float:
        if dev.startswith("ib"):
            return 2.0e8  # IPoIB: bootstrap and control traffic; NCCL goes over verbs
        if dev.startswith("eno"):
            return 2.0e5
        return 1.1e9  # storage: data loading and checkpoints

    def _v_net_interface_bytes_total(self, m, profile, v):
        out = {}
        for i, d in enumerate(self.scn.shape.netdevs):
            for x in ("receive", "transmit"):
                out[(d, x)] = self._rate_counter(f"b{d}{x}", v, self._dev_rate(d), 0.1, 1e12 + i * 1e10)
        return out

    def _speed(self, dev: str) -> str:
        if dev.startswith("eno"):
            return str(int(25e9 / 8))
        if dev.startswith("enp"):
            return str(int(200e9 / 8))
        return str(int(400e9 / 8))

    def _v_net_interface_speed_bytes(self, m, profile, v):
        return {(d,): self._const(self._speed(d), self.T) for d in self.scn.shape.netdevs}

    def _v_net_interface_up(self, m, profile, v):
        return {(d,): self._const("1", self.T) for d in self.scn.shape.netdevs}

    def _v_net_interface_carrier_changes_total(self, m, profile, v):
        return {(d,): self._const("2", self.T) for d in self.scn.shape.netdevs}

    def _v_rdma_port_counter_total(self, m, profile, v):
        out = {}
        for dev, port in self.scn.shape.rdma_ports:
            for c in self.scn.shape.rdma_counters:
                if c in ("port_xmit_data", "port_rcv_data"):
                    vals = self._rate_counter(f"{dev}{c}", v, 11e9 / 4, 0.05, 4e15)  # 4-byte words
                elif c.endswith("_packets"):
                    vals = self._rate_counter(f"{dev}{c}", v, 2.7e6 if "cast" not in c else 1.0, 0.05, 9e11)
                elif c == "port_xmit_wait":
                    vals = self._rate_counter(f"{dev}{c}", v, 4e4, 0.3, 2e10)
                elif c in ("np_cnp_sent", "rp_cnp_handled", "out_of_sequence"):
                    vals = self._rate_counter(f"{dev}{c}", v, 3.0, 0.5, 1e5)
                else:
                    vals = self._const("0", self.T)
                out[(dev, port, c)] = vals
        return out

    def _v_rdma_port_rate_bytes(self, m, profile, v):
        return {(d, p): self._const(str(int(400e9 / 8)), self.T) for d, p in self.scn.shape.rdma_ports}

    def _v_rdma_port_up(self, m, profile, v):
        return {(d, p): self._const("1", self.T) for d, p in self.scn.shape.rdma_ports}

    def _v_disk_free_bytes(self, m, profile, v):
        out = {}
        for p in self.scn.shape.disk_paths:
            if p == "/checkpoints":  # each checkpoint eats a shard per rank, old ones are pruned
                out[(p,)] = self._fmt_int([3.1e13 - (c % 5) * 8 * self.CKPT_BYTES for c in
                                           (t // self.CKPT_EVERY for t in self.ts)])
            else:
                out[(p,)] = self._const(str(int(1.2e12 if p == "/" else 3.3e12)), self.T)
        return out

    def _v_disk_total_bytes(self, m, profile, v):
        return {(p,): self._const(str(int(3.84e13 if p == "/checkpoints" else 3.84e12)), self.T)
                for p in self.scn.shape.disk_paths}

    def _v_collector_up(self, m, profile, v):
        return {(c,): self._const("1", self.T) for c in COLLECTORS}

    def _v_collector_duration_seconds(self, m, profile, v):
        dur = {"gpu": 0.0021, "network": 0.0009, "rdma": 0.0043, "disk": 0.0002, "ranks": 0.0011}
        return {(c,): self._fmt([dur.get(c, 0.001) * (1 + 0.1 * e) for e in self._noise(c, v, 1.0)], 6)
                for c in COLLECTORS}

    def _v_ingest_datagrams_total(self, m, profile, v):
        rpn = self.scn.shape.ranks_per_node
        ok = _cum((rpn * (n + self.s) for n in self.n), 1.4e6)  # a step record and a heartbeat a second
        out = {("ok",): self._fmt_int(ok)}
        for r in INGEST_RESULTS[1:]:
            out[(r,)] = self._const("0", self.T)
        return out

    def _v_tracked_ranks(self, m, profile, v):
        return {(): self._const(str(self.scn.shape.ranks_per_node), self.T)}

    def _v_build_info(self, m, profile, v):
        return {(): self._const("1", self.T)}


# ------------------------------------------------------------------------------ series layout
EXTRA_LABEL_VALUES = {"quantile", "reason", "lint", "stat", "state", "xid", "counter", "device", "direction",
                      "port", "path", "collector", "result", "name", "uuid", "driver", "version", "python",
                      "category", "gpu", "where", "phase", "op", "pg"}


def _scope(m: C.Metric) -> str:
    if m.labels[:len(C.RANK_LABELS)] == C.RANK_LABELS:
        return "rank"
    if m.labels[:len(C.GPU_LABELS)] == C.GPU_LABELS:
        return "gpu"
    if m.labels[:len(C.NODE_LABELS)] == C.NODE_LABELS:
        return "node"
    return "?"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def modelled(m: C.Metric) -> bool:
    """False for a family whose extra labels the generator cannot invent values for."""
    base = {"rank": C.RANK_LABELS, "gpu": C.GPU_LABELS, "node": C.NODE_LABELS}.get(_scope(m))
    if base is None:
        return False
    extra = m.labels[len(base):]
    return all(x in EXTRA_LABEL_VALUES for x in extra)


@dataclass
class Counts:
    series: int = 0
    samples: int = 0
    bytes: int = 0
    by_scope: Dict[str, int] = field(default_factory=dict)  # series per scope for ONE normal node
    families: int = 0


class Generator:
    """Writes the OpenMetrics text for a slice of nodes."""

    def __init__(self, scn: Scenario):
        self.scn = scn
        self.model = Model(scn)
        self.suffix_ts = [f" {t}\n" for t in self.model.ts]
        self._suffix: Dict[Tuple[str, str, int, Tuple[str, ...]], str] = {}
        self.metrics = [m for m in C.CATALOG.values() if modelled(m)]
        self.not_modelled = sorted(m.name for m in C.CATALOG.values() if not modelled(m))
        self.straggler_set = set(scn.stragglers)

    def _profile_rank(self, node: int, rank: int) -> str:
        if rank in self.straggler_set:
            return "straggler"
        if node == self.scn.dataloader_node:
            return "dataloader"
        return "normal"

    def _profile_gpu(self, node: int, gpu: int) -> str:
        rpn = self.scn.shape.ranks_per_node
        if node == self.scn.dataloader_node:
            return "dataloader"
        if gpu < rpn and node * rpn + gpu in self.straggler_set:
            return "straggler"
        return "normal"

    def _suffixes(self, m: C.Metric, profile: str, v: int) -> Dict[Tuple[str, ...], List[str]]:
        """extra-label key -> list of ' value ts\\n' strings (cached per profile/variant)."""
        ck = (m.short, profile, v)
        got = self._suffix.get(ck)  # type: ignore[arg-type]
        if got is None:
            ts = self.suffix_ts
            got = {k: [" " + x + t for x, t in zip(vals, ts)]
                   for k, vals in self.model.values(m, profile, v).values.items()}
            self._suffix[ck] = got  # type: ignore[index]
        return got  # type: ignore[return-value]

    @staticmethod
    def _type_line(m: C.Metric) -> str:
        if m.type == "counter":
            return f"# TYPE {m.name[:-len('_total')]} counter\n"
        if m.type == "histogram":
            return f"# TYPE {m.name} histogram\n"
        return f"# TYPE {m.name} gauge\n"

    def _uuid(self, node: int, gpu: int) -> str:
        return f"GPU-{node:08x}-{gpu:04x}-4e1c-9a1f-{self.scn.seed:012x}"

    def _labels_extra(self, m: C.Metric, node: int, gpu: int, key: Tuple[str, ...]) -> str:
        """Render the family's extra labels from the model's key."""
        base_len = {"rank": len(C.RANK_LABELS), "gpu": len(C.GPU_LABELS), "node": len(C.NODE_LABELS)}[_scope(m)]
        extra = m.labels[base_len:]
        if m.short == "gpu_info":
            vals = ("NVIDIA H200", self._uuid(node, gpu), "580.159.04")
        elif m.short == "rank_gpu_info":  # ``gpu`` is the rank's local rank here: local rank i on GPU i
            vals = (str(gpu), self._uuid(node, gpu).lower())
        elif m.short == "build_info":
            vals = (__version__, "3.11.7")
        else:
            vals = key
        return "".join(f',{k}="{_esc(x)}"' for k, x in zip(extra, vals))

    def write(self, out, nodes: Sequence[int]) -> Counts:
        scn = self.scn
        rpn, gpus = scn.shape.ranks_per_node, scn.shape.gpus
        cnt = Counts()
        probe = next((n for n in nodes if n != scn.dataloader_node), None)
        for m in self.metrics:
            scope = _scope(m)
            out.write(self._type_line(m))
            cnt.bytes += len(self._type_line(m))
            cnt.families += 1
            for n in nodes:
                node = node_name(n)
                inst = f'instance="{node}:{AGENT_PORT}"'
                if scope == "rank":
                    ents = [(self._profile_rank(n, n * rpn + lr), f'{{{inst},job="{_esc(scn.job)}",node="{node}",'
                             f'rank="{n * rpn + lr}",local_rank="{lr}"', lr, (n * rpn + lr) % K_VARIANTS)
                            for lr in range(rpn)]
                elif scope == "gpu":
                    ents = [(self._profile_gpu(n, g), f'{{{inst},job="{triage.SCRAPE_JOB}",node="{node}",gpu="{g}"',
                             g, (n * gpus + g) % K_VARIANTS) for g in range(gpus)]
                else:
                    ents = [("dataloader" if n == scn.dataloader_node else "normal",
                             f'{{{inst},job="{triage.SCRAPE_JOB}",node="{node}"', 0, n % K_VARIANTS)]
                for profile, lab, idx, v in ents:
                    for key, sufs in self._suffixes(m, profile, v).items():
                        if m.type == "histogram":
                            part = key[0]
                            if part == "bucket":
                                prefix = f'{m.bucket}{lab},le="{key[1]}"}}'
                            else:
                                prefix = f"{m.name}_{part}{lab}}}"
                        else:
                            prefix = f"{m.name}{lab}{self._labels_extra(m, n, idx, key)}}}"
                        chunk = prefix + prefix.join(sufs)
                        out.write(chunk)
                        cnt.series += 1
                        cnt.samples += len(sufs)
                        cnt.bytes += len(chunk)
                        if n == probe:
                            cnt.by_scope[scope] = cnt.by_scope.get(scope, 0) + 1
        # what Prometheus adds to every scrape of a target
        for name in ("up", "scrape_duration_seconds", "scrape_samples_scraped",
                     "scrape_samples_post_metric_relabeling", "scrape_series_added"):
            out.write(f"# TYPE {name} gauge\n")
            for n in nodes:
                prefix = f'{name}{{instance="{node_name(n)}:{AGENT_PORT}",job="{triage.SCRAPE_JOB}"}}'
                val = {"up": "1", "scrape_duration_seconds": "0.041"}.get(name, "1300")
                sufs = [" " + val + t for t in self.suffix_ts]
                chunk = prefix + prefix.join(sufs)
                out.write(chunk)
                cnt.series += 1
                cnt.samples += len(sufs)
                cnt.bytes += len(chunk)
                if n == probe:
                    cnt.by_scope["scrape"] = cnt.by_scope.get("scrape", 0) + 1
        out.write("# EOF\n")
        return cnt


def series_per_node(shape: Shape) -> Dict[str, int]:
    """Series one healthy node exposes (plus Prometheus' 5 scrape series), by scope, from the model."""
    scn = Scenario(nodes=2, shape=shape, t0=0, samples=1, dataloader_node=-1)
    g = Generator(scn)

    class _Null:
        def write(self, s: str) -> None:
            pass

    c = g.write(_Null(), [0])
    by = dict(c.by_scope)
    by["per_rank"] = by.get("rank", 0) // max(shape.ranks_per_node, 1)
    by["per_gpu"] = by.get("gpu", 0) // max(shape.gpus, 1)
    by["total"] = sum(c.by_scope.values())
    return by


# ------------------------------------------------------------------------------ Prometheus and promtool
class BenchError(RuntimeError):
    """One clear line; the CLI prints it and exits 2."""


def tool_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BenchError(f"cannot run {binary}: {e}") from None
    first = (out.stdout or out.stderr).splitlines()
    return first[0].strip() if first else "unknown"


def _pdeathsig() -> Optional[Callable[[], None]]:
    """A preexec_fn that makes the child SIGKILLed when the benchmark dies, even by SIGKILL (a test's
    timeout), so that no Prometheus outlives its run (Linux PR_SET_PDEATHSIG). prctl is looked up
    here, in the parent: the child only makes the call. The signal fires when the *thread* that
    started the child exits: Prometheus is started from the main thread only."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def child() -> None:
        prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG

    return child


class Prometheus:
    """A real Prometheus on a loopback port, over a given TSDB directory."""

    def __init__(self, binary: str, data: Path, config: Path, log_path: Path, extra: Sequence[str] = ()):
        self.binary, self.data, self.config, self.log_path = binary, data, config, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra = list(extra)
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 300.0) -> float:
        t0 = time.monotonic()
        cmd = [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.data}",
               f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=3650d",
               "--web.enable-lifecycle", *self.extra]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_pdeathsig())
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise BenchError(f"prometheus exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise BenchError(f"prometheus not ready after {timeout:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()
        self.proc = None

    def get(self, path: str, params: Optional[Mapping[str, Any]] = None, timeout: float = 300.0) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:300].decode(errors="replace")
            raise BenchError(f"prometheus {path}: HTTP {e.code}: {detail}") from None
        return json.loads(body)

    def timed_query_range(self, expr: str, start: float, end: float, step: int) -> Tuple[float, Dict[str, Any]]:
        return self._timed("/api/v1/query_range",
                           {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": str(step)})

    def timed_query(self, expr: str, at: float) -> Tuple[float, Dict[str, Any]]:
        return self._timed("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})

    def _timed(self, path: str, params: Mapping[str, str]) -> Tuple[float, Dict[str, Any]]:
        """(wall seconds until the whole body arrived, info). The body is streamed and only
        counted (a fleet-wide panel can return a gigabyte of JSON); errors come back in info."""
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        t0 = time.perf_counter()
        head = b""
        size = series = points = 0
        tail = b""
        try:
            with urllib.request.urlopen(req, timeout=900) as r:
                while True:
                    chunk = r.read(1 << 20)
                    if not chunk:
                        break
                    if len(head) < 64:
                        head += chunk[:64]
                    buf = tail + chunk
                    series += buf.count(b'"metric":')
                    points += buf.count(b'"]')  # a [ts,"value"] pair ends with "]
                    tail = buf[-16:]
                    # what `tail` overlaps was counted already; subtract matches inside it
                    series -= tail.count(b'"metric":')
                    points -= tail.count(b'"]')
                    size += len(chunk)
            series += tail.count(b'"metric":')
            points += tail.count(b'"]')
            wall = time.perf_counter() - t0
            ok = head.startswith(b'{"status":"success"')
            info = {"status": "success" if ok else "error", "error": None if ok else head.decode(errors="replace"),
                    "series": series, "points": points, "bytes": size}
        except urllib.error.HTTPError as e:
            wall = time.perf_counter() - t0
            try:
                doc = json.loads(e.read())
            except ValueError:
                doc = {"error": f"HTTP {e.code}"}
            info = {"status": "error", "error": doc.get("error"), "series": 0, "points": 0, "bytes": 0}
        except (urllib.error.URLError, OSError) as e:
            wall = time.perf_counter() - t0
            info = {"status": "error", "error": str(e), "series": 0, "points": 0, "bytes": 0}
        return wall, info

    def instant(self, expr: str, at: Optional[float] = None) -> List[Dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        doc = self.get("/api/v1/query", params)
        if doc.get("status") != "success":
            raise BenchError(f"query {expr!r}: {doc.get('error')}")
        return doc["data"]["result"]

    def scalar(self, expr: str, at: Optional[float] = None) -> Optional[float]:
        res = self.instant(expr, at)
        return float(res[0]["value"][1]) if res else None

    def metrics(self) -> Dict[str, float]:
        """Prometheus' own /metrics, name{labels} -> value."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as r:
            text = r.read().decode()
        out: Dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
        return out

    def rss(self) -> Tuple[int, int]:
        """(VmRSS, VmHWM) in bytes."""
        rss = hwm = 0
        if self.proc is None:
            return 0, 0
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1]) * 1024
                    elif line.startswith("VmHWM:"):
                        hwm = int(line.split()[1]) * 1024
        except OSError:
            pass
        return rss, hwm


def run_checked(cmd: Sequence[str], what: str, timeout: float, log_path: Optional[Path] = None,
                env: Optional[Mapping[str, str]] = None) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{what} did not finish in {timeout:.0f} s") from None
    except OSError as e:
        raise BenchError(f"cannot run {cmd[0]}: {e.strerror or e}") from None
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}\n")
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise BenchError(f"{what} failed (exit {out.returncode}): {' | '.join(tail)}")
    return out.stdout


# ------------------------------------------------------------------------------ rules and queries
def rules_text(cfg: Mapping[str, Any]) -> Tuple[str, str]:
    """(rule file text, where it came from): the alerts generator's output, or the triage
    table rendered here while that generator is missing."""
    try:
        from ranksight.alerts import generate as agen
        files = agen.render(cfg)
        name = getattr(agen, "RULES_FILE", "ranksight-rules.yml")
        return files[name], "ranksight.alerts.generate.render"
    except ImportError:
        pass
    groups = [
        {"name": "ranksight.recording",
         "rules": [{"record": r.record, "expr": r.expr} for r in triage.recording_rules(cfg)]},
        {"name": "ranksight.alerts",
         "rules": [{"alert": e.alert, "expr": e.expr, "for": e.for_, "labels": {"severity": e.severity}}
                   for e in triage.table(cfg)]},
    ]
    return yaml.safe_dump({"groups": groups}, sort_keys=False), "ranksight.triage (fallback)"


def expand_recording_rules(text: str) -> Tuple[str, List[str]]:
    """A rule file with only the recording rules, each expression with the recording rules it
    reads inlined, so ``promtool tsdb create-blocks-from rules`` can backfill all of them in
    one pass (it evaluates every rule against the raw data only). Returns (yaml text, records
    that could not be inlined because they are read with a selector or range)."""
    doc = yaml.safe_load(text) or {}
    recs: Dict[str, str] = {}
    groups_out = []
    for g in doc.get("groups", []):
        rules = [r for r in g.get("rules", []) if "record" in r]
        for r in rules:
            recs[r["record"]] = r["expr"]
    names = sorted(recs, key=len, reverse=True)
    skipped: List[str] = []

    def inline(expr: str, depth: int = 0) -> Optional[str]:
        if depth > 8:
            return None
        for name in names:
            pat = re.compile(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])")
            for mm in pat.finditer(expr):
                after = expr[mm.end():].lstrip()
                if after.startswith("{") or after.startswith("["):
                    return None
            if pat.search(expr):
                sub = inline(recs[name], depth + 1)
                if sub is None:
                    return None
                expr = pat.sub(lambda _m: "(" + sub + ")", expr)
        return expr

    for g in doc.get("groups", []):
        out_rules = []
        for r in g.get("rules", []):
            if "record" not in r:
                continue
            e = inline(r["expr"])
            if e is None:
                skipped.append(r["record"])
                continue
            nr = {"record": r["record"], "expr": e}
            if r.get("labels"):
                nr["labels"] = r["labels"]
            out_rules.append(nr)
        if out_rules:
            ng = {"name": g["name"], "rules": out_rules}
            if g.get("interval"):
                ng["interval"] = g["interval"]
            groups_out.append(ng)
    return yaml.safe_dump({"groups": groups_out}, sort_keys=False), skipped


def split_rule_file(text: str, out_dir: Path) -> List[Path]:
    """One rule file per recording rule (same group name and interval), for parallel backfill."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for g in (yaml.safe_load(text) or {}).get("groups", []):
        for r in g.get("rules", []):
            ng = {"name": g["name"], "rules": [r]}
            if g.get("interval"):
                ng["interval"] = g["interval"]
            path = out_dir / f"rule{len(paths):03d}.yml"
            path.write_text(yaml.safe_dump({"groups": [ng]}, sort_keys=False))
            paths.append(path)
    return paths


Query = Tuple[str, str, str, str]  # (dashboard, panel title, expr, "range" | "instant")


def dashboard_queries(cfg: Mapping[str, Any]) -> Tuple[List[Query], str, Callable[..., str]]:
    """(queries, source, substitute): every panel target of the generated dashboards, with
    "instant" for targets Grafana sends to /api/v1/query (tables), "range" otherwise; or the
    triage table's indicators while the dashboards generator is missing."""
    try:
        from ranksight.dashboards import generate as dgen
    except ImportError:
        rows = [("triage-indicators", e.title, e.indicator, "range") for e in triage.table(cfg)]

        def substitute(expr: str, **_: Any) -> str:
            return expr

        return rows, "ranksight.triage indicators (fallback)", substitute
    out: List[Query] = []
    for name, model in dgen.render(cfg).items():
        for p in dgen.panels(model):
            for t in p.get("targets", []):
                if not t.get("expr"):
                    continue
                instant = bool(t.get("instant")) and not t.get("range", False)
                out.append((name, p["title"], t["expr"], "instant" if instant else "range"))
    return out, "ranksight.dashboards.generate (every panel target)", dgen.substitute


def load_queries_file(path: str) -> Tuple[List[Query], str, Callable[..., str]]:
    """A JSON list of [dashboard, panel, expr] or [dashboard, panel, expr, "range"|"instant"]
    whose variables are already substituted (``--dump-queries`` writes one)."""
    try:
        rows = json.loads(Path(path).read_text())
        out: List[Query] = []
        for row in rows:
            d, t, e = row[:3]
            kind = row[3] if len(row) > 3 else "range"
            if kind not in ("range", "instant"):
                raise ValueError(f"kind {kind!r}")
            out.append((str(d), str(t), str(e), kind))
    except (OSError, ValueError, TypeError) as e:
        raise BenchError(f"--queries {path}: expected a JSON list of [dashboard, panel, expr, kind]: {e}") from None

    def substitute(expr: str, **_: Any) -> str:
        return expr

    return out, path, substitute


def substitute_all(substitute: Callable[..., str], expr: str, job: str, step: int, hours: float) -> str:
    """The variables Grafana sends with every variable at All: all nodes and ranks of the job,
    $__rate_interval = max(4 x scrape interval, 1m), $__interval = the step."""
    rate_interval = f"{max(4 * step, 60)}s"
    try:
        return substitute(expr, job=[job], node=".*", rank=".*", rate_interval=rate_interval,
                          interval=f"{step}s", range_=f"{int(hours * 3600)}s")
    except TypeError:
        return substitute(expr, job=[job], node=".*", rank=".*", rate_interval=rate_interval)


def substituted_queries(cfg: Mapping[str, Any], job: str, step: int, hours: float) -> List[Query]:
    rows, _, substitute = dashboard_queries(cfg)
    return [(d, t, substitute_all(substitute, e, job, step, hours), k) for d, t, e, k in rows]


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (our own workers and the promtool they run)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        kids = []
    for k in kids:
        _kill_tree(k)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


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
    seed: int = 9


def _percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def plan_window(now: float, hours: float, step: int, lead: int, future: int) -> Tuple[int, int, str]:
    """(t0, samples, block duration for promtool): the measured hour ends `future` seconds
    from now (so the live rule evaluation still has data), the data starts `lead` earlier
    (rate windows), and the whole window sits in one aligned promtool block, so promtool
    reads its input twice, not three times."""
    length = int(hours * 3600) + lead
    for block_h in (2, 6, 18, 54):
        bd = block_h * 3600
        for shift in range(0, future // 5 + 1, step):
            t1 = (int(now) + future - shift) // step * step
            t0 = t1 - length
            if t0 // bd == t1 // bd:
                return t0, length // step + 1, f"{block_h}h"
    t1 = (int(now) + future) // step * step
    return t1 - length, length // step + 1, "2h"


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
        base = Path(o.keep) if o.keep else Path(tempfile.mkdtemp(prefix="ranksight-scale-", dir=o.workdir))
        if o.reuse:
            base = Path(o.reuse)
        elif o.keep:
            if base.exists() and any(base.iterdir()):
                raise BenchError(f"--keep {base}: directory exists and is not empty")
            base.mkdir(parents=True, exist_ok=True)
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
        slices = [list(range(i * o.nodes // parts, (i + 1) * o.nodes // parts)) for i in range(parts)]
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
                    _kill_tree(pid)
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
        if self.o.rules_file:
            try:
                rules, rules_src = Path(self.o.rules_file).read_text(), self.o.rules_file
            except OSError as e:
                raise BenchError(f"--rules {self.o.rules_file}: {e.strerror or e}") from None
        else:
            rules, rules_src = rules_text(self.cfg)
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
        # slower than from the in-order head a real server has: round 3 measured that, not the rules)
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
            "p50_seconds": round(_percentile(meds, 50), 4), "p99_seconds": round(_percentile(meds, 99), 4),
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
            doc = p.get("/api/v1/rules")
            for g in doc.get("data", {}).get("groups", []):
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
def _duration_arg(s: str) -> int:
    if not rconfig.is_duration(s):
        raise argparse.ArgumentTypeError(f"expected a duration like 15s or 1m, got {s!r}")
    v = rconfig.duration_seconds(s)
    if v < 1 or v != int(v):
        raise argparse.ArgumentTypeError(f"step must be a whole number of seconds >= 1, got {s!r}")
    return int(v)


def _pos_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {s!r}")
    return v


def _hours(s: str) -> float:
    try:
        v = rconfig.duration_seconds(s) / 3600.0 if rconfig.is_duration(s) else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected hours (1.5) or a duration (10m), got {s!r}") from None
    if not (1 / 60 <= v <= 24):
        raise argparse.ArgumentTypeError(f"--hours must be between 1/60 and 24, got {s!r}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=_pos_int, default=1024, help="nodes (default 1024)")
    p.add_argument("--gpus", type=_pos_int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--ranks-per-node", type=_pos_int, default=8, help="ranks per node, one per GPU (default 8)")
    p.add_argument("--hours", type=_hours, default=1.0, help="data the dashboards query: hours (1) or a duration (10m) (default 1)")
    p.add_argument("--step", type=_duration_arg, default=15, help="scrape interval and query step (default 15s)")
    p.add_argument("--design", choices=DESIGNS, default="as-is",
                   help="as-is: the series the agent exposes today; all-series: every RDMA counter "
                        "file and a 0/1 series per lint (the first scale run's agent)")
    p.add_argument("--repeat", type=_pos_int, default=3, help="rounds of every query; the median is reported (default 3)")
    p.add_argument("--parts", type=int, default=0, help="node slices backfilled as separate blocks (default: 64 nodes each)")
    p.add_argument("--jobs", type=_pos_int, default=2, help="promtool processes at once (default 2)")
    p.add_argument("--rule-evals", type=_pos_int, default=4, help="live evaluations of every rule group to read (default 4)")
    p.add_argument("--no-compaction-wait", dest="wait_compaction", action="store_false",
                   help="measure right away instead of after Prometheus has merged the backfilled blocks "
                        "(its first compaction runs a minute after start; for quick runs)")
    p.add_argument("--config", metavar="FILE", default=None, help="ranksight config YAML (rules and dashboards from it)")
    p.add_argument("--rules", metavar="FILE", default=None,
                   help="rule file to backfill and evaluate (default: `ranksight rules` output for --config)")
    p.add_argument("--queries", metavar="FILE", default=None,
                   help="JSON list of [dashboard, panel, expr] to time (default: every query of the generated "
                        "dashboards, variables set to All)")
    p.add_argument("--baseline-queries", metavar="FILE", default=None,
                   help="a second query list (same format), timed once after --queries and reported as "
                        "baseline_queries: e.g. the dashboards before a change")
    p.add_argument("--dump-queries", metavar="FILE", default=None,
                   help="write the substituted dashboard queries (the --queries format) and exit")
    p.add_argument("--workdir", metavar="DIR", default=None, help="where the temporary TSDB goes (default: $TMPDIR)")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep the TSDB, rules and logs in DIR (new or empty)")
    p.add_argument("--future", type=_duration_arg, default=0, metavar="DURATION",
                   help="how far past now the generated data reaches: the rules evaluate live once its "
                        "last sample has passed (so their windows are full and their results in-order); "
                        "default: the expected generation + backfill time; raise it on a busy machine")
    p.add_argument("--reuse", metavar="DIR", default=None,
                   help="a --keep directory of an earlier run: skip generation and backfill, backfill only "
                        "the recording rules it lacks, then measure (iterate on rules and dashboards at scale)")
    p.add_argument("--query-timeout", type=_pos_int, default=120, metavar="SECONDS",
                   help="Prometheus --query.timeout for the measured queries (default 120, Prometheus' own)")
    p.add_argument("--prometheus", metavar="PATH", default=PROMETHEUS, help=f"Prometheus binary (default {PROMETHEUS})")
    p.add_argument("--promtool", metavar="PATH", default=PROMTOOL, help=f"promtool binary (default {PROMTOOL})")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024.0
    return str(n)


def report(r: Mapping[str, Any]) -> str:
    sc, se, q, ru, pr = r["scenario"], r["series"], r["queries"], r["rules"], r["prometheus"]
    lines = [
        f"ranksight bench scale: {sc['nodes']} nodes x {sc['gpus_per_node']} GPUs, {sc['ranks']} ranks, "
        + (f"{sc['hours']:g} h" if sc["hours"] >= 1 else f"{sc['hours'] * 60:.0f} min")
        + f" at {sc['step_seconds']} s ({sc['design']})",
        f"series per node: {se['per_node']} (+{se['scrape_per_target']} scrape series; target <= "
        f"{r['targets']['series_per_node']}); per rank {se['per_rank']}, per GPU {se['per_gpu']}, "
        f"node-level {se['node_level']}; in Prometheus: {se.get('prometheus_per_node')} per node, "
        f"{se.get('prometheus_total')} in all, recorded {se.get('recorded_per_node')} per node",
        f"slowest query: {q['slowest']['seconds']:.3f} s  {q['slowest']['dashboard']} / {q['slowest']['panel']}"
        if q.get("slowest") else "slowest query: none",
        f"queries: {q['count']} from {q['source']}; p50 {q['p50_seconds']:.3f} s, p99 {q['p99_seconds']:.3f} s; "
        f"{len(q['over_target'])} over {r['targets']['query_seconds']:g} s; {len(q['errors'])} errors",
    ]
    for it in sorted(q["items"], key=lambda x: -x["seconds"])[:10]:
        lines.append(f"  {it['seconds']:8.3f} s  {it['series'] or 0:6d} series  {it['dashboard']} / {it['panel']}")
    for g in ru["groups"]:
        lines.append(f"rule group {g['name']}: {g['rules']} rules, evaluation median "
                     f"{g['evaluation_seconds_median']} s, max {g['evaluation_seconds_max']} s "
                     f"({g['evaluations']} evaluations)")
    lines.append(f"prometheus: RSS {_fmt_bytes(pr['rss_bytes'])} (peak {_fmt_bytes(pr['rss_peak_bytes'])}), "
                 f"Go heap {_fmt_bytes(pr['go_heap_inuse_bytes'])}; compaction {pr['compaction_seconds']} s")
    g = r["generate"]
    b = r["backfill"]
    lines.append(f"generated {g['samples']:,} samples in {g['series']:,} series ({_fmt_bytes(g['openmetrics_bytes'])}); "
                 f"backfill {b['openmetrics_seconds']} s, rules backfill {b['rules_seconds']} s; "
                 f"total {r['wall_seconds']} s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.dump_queries:
        try:
            rows = substituted_queries(rconfig.load(args.config), Scenario.job, args.step, args.hours)
            Path(args.dump_queries).write_text(json.dumps([list(r) for r in rows], indent=1) + "\n")
        except OSError as e:
            print(f"ranksight: error: cannot write {args.dump_queries}: {e.strerror or e}", file=sys.stderr)
            return 2
        print(f"wrote {len(rows)} queries to {args.dump_queries}")
        return 0
    def _term(signum: int, frame: Any) -> None:  # stop Prometheus and clean up on kill too
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _term)
    opts = Options(nodes=args.nodes, gpus=args.gpus, ranks_per_node=args.ranks_per_node, hours=args.hours,
                   step=args.step, design=args.design, repeat=args.repeat, parts=max(0, args.parts),
                   jobs=args.jobs, workdir=args.workdir, keep=args.keep, config=args.config,
                   rule_evals=args.rule_evals, wait_compaction=args.wait_compaction,
                   rules_file=args.rules, queries_file=args.queries,
                   baseline_queries_file=args.baseline_queries, prometheus=args.prometheus,
                   promtool=args.promtool, query_timeout=args.query_timeout, future=args.future,
                   reuse=args.reuse)
    bench = Bench(opts)
    try:
        result = bench.run()
    except SystemExit:  # killed (timeout): print what was measured
        bench.result["incomplete"] = True
        print(json.dumps(bench.result, indent=2) if args.json else json.dumps(bench.result))
        return 143
    except BenchError as e:
        print(f"ranksight: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"ranksight: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(report(result))
    return 0
