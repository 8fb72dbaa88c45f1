"""The job model the generated series follow: a synchronous data-parallel job with stragglers."""
from __future__ import annotations

import math
import random
import statistics
from typing import Dict, List, Sequence, Tuple

from ranksight import catalog as C
from ranksight import triage
from .scenario import COLLECTORS, INGEST_RESULTS, K_VARIANTS, STALL_REASONS, Scenario, Series, _cum, _le, _phi


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

    # the step's work and loss: 8 samples of 4,096 tokens a step, an 8 B-parameter model's 6N FLOPs
    # per token, a loss of about 2 (every rank reads one a step), so the efficiency and loss rules
    # have series to evaluate at scale
    SAMPLES_PER_STEP, TOKENS_PER_SAMPLE, FLOPS_PER_TOKEN, LOSS = 8, 4096, 48_000_000_000, 2.0

    def _v_samples_total(self, m, profile, v):
        return {(): self._fmt_int([x * self.SAMPLES_PER_STEP for x in self._rank_counter("steps", profile, v)])}

    def _v_tokens_total(self, m, profile, v):
        per = self.SAMPLES_PER_STEP * self.TOKENS_PER_SAMPLE
        return {(): self._fmt_int([x * per for x in self._rank_counter("steps", profile, v)])}

    def _v_model_flops_per_token(self, m, profile, v):
        return {(): self._const(str(self.FLOPS_PER_TOKEN), self.T)}

    def _v_total_steps(self, m, profile, v):  # a declared run length past the steps taken: the ETA is evaluated
        return {(): self._const(str(int(self.STEPS0 * 10)), self.T)}

    def _v_loss_readings_total(self, m, profile, v):
        return {(): self._fmt_int(self._rank_counter("steps", profile, v))}

    def _v_loss_sum_total(self, m, profile, v):
        return {(): self._fmt([x * self.LOSS for x in self._rank_counter("steps", profile, v)], 3)}

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

    def _v_gpu_timing_every_steps(self, m, profile, v):
        return {}  # only for a rank that samples its GPU timing: the default automatic gap times every one of
        # these 1.2 s steps (the events cost far under 0.5% of them)

    def _v_rank_gpu_info(self, m, profile, v):
        return {(): self._const("1", self.T)}  # labels: _labels_extra (the rank's GPU and its UUID)

    def _v_rank_versions_info(self, m, profile, v):
        return {(): self._const("1", self.T)}  # labels: _labels_extra (one build on every rank)

    def _v_rank_parallel_info(self, m, profile, v):
        return {(): self._const("1", self.T)}  # labels: _labels_extra (a DDP job)

    # a pipeline stage's families: only for ranks watched as a stage (record.Field.gate), none here
    def _v_pipeline_busy_seconds_total(self, m, profile, v):
        return {}

    _v_pipeline_step_seconds_total = _v_pipeline_wait_prev_seconds_total = _v_pipeline_busy_seconds_total
    _v_pipeline_wait_next_seconds_total = _v_pipeline_stage = _v_pipeline_busy_seconds_total
    _v_pipeline_stages = _v_pipeline_microbatches = _v_pipeline_busy_seconds_total

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

    def _v_cuda_memory_allocated_peak_bytes(self, m, profile, v):
        nz = self._noise("mpeak", v, 0.01)
        return {(): self._fmt_int([66.0e9 * (1 + e) for e in nz])}

    def _v_cuda_memory_reserved_peak_bytes(self, m, profile, v):
        nz = self._noise("mrpeak", v, 0.002)
        return {(): self._fmt_int([72.0e9 * (1 + e) for e in nz])}

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

    def _v_gpu_peak_flops(self, m, profile, v):  # an H200's dense BF16 peak (exporter/peak.py)
        return {("bf16",): self._const("989000000000000", self.T)}

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


