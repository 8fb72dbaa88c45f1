"""The one config: every threshold, window and `for:` duration, plus agent and hooks settings.

Load order: built-in defaults -> profile overrides (``test`` shortens durations
and windows only) -> YAML file (``--config`` or ``RANKSIGHT_CONFIG``) -> env
overrides ``RANKSIGHT__<section>__<key>=value``. Every value is validated;
a bad one raises ConfigError with one clear line.
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import yaml

from . import oncall
from .errors import ConfigError  # noqa: F401 (public here: ranksight.config.ConfigError)


@dataclass(frozen=True)
class Opt:
    default: Any
    help: str
    lo: Optional[float] = None
    hi: Optional[float] = None


DURATION_RE = re.compile(r"(\d+(ms|s|m|h|d))+")  # the Prometheus duration grammar, used everywhere
_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d)")
_DURATION_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def is_duration(s: Any) -> bool:
    """True for a Prometheus duration such as 30s, 5m, 1h30m."""
    return isinstance(s, str) and DURATION_RE.fullmatch(s) is not None


# section -> key -> Opt. Comments name the alert a value drives.
SCHEMA: Dict[str, Dict[str, Opt]] = {
    "thresholds": {
        "dataloader_wait_share": Opt(0.10, "RanksightDataloaderBound: data wait / step time above this", 0, 1),
        "gpu_util_mean": Opt(0.80, "RanksightGpuSawtooth: window mean utilization below this ...", 0, 1),
        "gpu_swings_per_min": Opt(6.0, "... together with at least this many high->low swings per minute", 0, 1e6),
        "gpu_swing_high": Opt(0.80, "agent: a swing starts above this utilization", 0, 1),
        "gpu_swing_low": Opt(0.50, "agent: ... and ends below this utilization", 0, 1),
        "comm_share": Opt(0.30, "RanksightCommBound: collective time / step time above this", 0, 1),
        "retransmit_ratio": Opt(0.01, "RanksightTcpRetransmits: retransmitted / sent segments above this", 0, 1),
        "retransmit_min_rate": Opt(1.0, "RanksightTcpRetransmits: ... and at least this many retransmits/s", 0, 1e9),
        "checkpoint_write_seconds": Opt(60.0, "RanksightCheckpointSlow: one write above this", 0, 1e6),
        "checkpoint_wall_share": Opt(0.05, "RanksightCheckpointSlow: checkpoint time / wall time above this", 0, 1),
        "checkpoint_max_age_seconds": Opt(4 * 3600.0, "RanksightCheckpointStale: no checkpoint for this long", 1, 1e8),
        "heartbeat_misses": Opt(1.0, "RanksightHeartbeatMissed: misses within the heartbeat window", 1, 1e6),
        "straggler_ratio": Opt(1.1, "RanksightStraggler: rank busy time / its peers' median busy time above this", 1, 100),
        "straggler_min_step_share": Opt(0.05, "RanksightStraggler: ... and the extra busy time is at least this share of the step", 0, 1),
        # pipeline parallelism (ranksight/triage/pipeline.py)
        "pipeline_bubble_excess": Opt(0.15, "RanksightPipelineBubble: a stage's bubble share minus the schedule's "
                                            "ideal (p-1)/(m+p-1) above this", 0, 1),
        "pipeline_straggler_ratio": Opt(1.2, "RanksightPipelineStraggler: a stage's busy time / its peers' median "
                                             "above this", 1, 100),
        "pipeline_straggler_min_share": Opt(0.05, "RanksightPipelineStraggler: ... and the extra busy time is at least "
                                                  "this share of wall time", 0, 1),
        "alloc_retries_per_min": Opt(1.0, "RanksightCudaAllocRetries: allocator retries per minute above this", 0, 1e9),
        "memory_imbalance_ratio": Opt(1.25, "RanksightMemoryImbalance: a rank's peak allocated CUDA memory / its "
                                            "peers' median peak above this", 1, 100),
        "memory_imbalance_min_bytes": Opt(1e9, "RanksightMemoryImbalance: ... and above it by at least this many "
                                                "bytes", 0, 1e15),
        "memory_near_oom_ratio": Opt(0.92, "RanksightMemoryNearOom: a rank's peak reserved CUDA memory / its GPU's "
                                           "total memory above this", 0, 1),
        "step_creep_ratio": Opt(1.2, "RanksightCudaAllocRetries: (with retries) step p50 now / 1 h ago above this", 1, 100),
        "nic_min_speed_bytes": Opt(1.25e9, "reference line on the link-speed panels (bytes/s; 10 Gb/s); "
                                           "RanksightNicSpeedLow judges a NIC by its own best and its peers'", 0, 1e13),
        "nic_min_traffic_share": Opt(0.1, "RanksightNicSpeedLow: only NICs carrying at least this share of their "
                                          "node's interface bytes", 0, 1),
        "disk_free_ratio": Opt(0.10, "RanksightDiskFilling: free share below this", 0, 1),
        "disk_predict_free_ratio": Opt(0.40, "RanksightDiskFilling: the prediction pages only under this free share", 0, 1),
        "disk_full_horizon_seconds": Opt(3600.0, "RanksightDiskFilling: predicted full within this", 1, 1e8),
        "ingest_drop_ratio": Opt(0.01, "RanksightIngestDropping: dropped / received datagrams above this", 0, 1),
        "lint_workers_host_mem_share": Opt(0.5, "lint dataloader_workers_rss: workers of all ranks above this share of host memory", 0, 1),
        "lint_min_free_bytes": Opt(10e9, "lint disk_headroom: minimum free bytes before the first checkpoint", 0, 1e15),
        # goodput and step-time regression (ranksight/triage/goodput.py)
        "step_regression_ratio": Opt(1.2, "RanksightStepTimeRegression: the job's step p50 (averaged over "
                                          "windows.step_smooth) / its baseline above this", 1, 100),
        "report_share_delta": Opt(0.02, "ranksight report: a share (goodput or a badput category) that moved by more than "
                                        "this against the baseline run is flagged", 0, 1),
        # throughput and MFU (ranksight/triage/efficiency.py); the bands: under mfu_low a serious
        # problem, then normal, good, excellent, and over mfu_near_limit near the hardware limit
        "mfu_low": Opt(0.15, "RanksightMfuLow: the job's MFU below this (and the dashboard's first band edge)", 0, 1),
        "mfu_good": Opt(0.30, "MFU panel: good from this MFU (reference band, no alert)", 0, 1),
        "mfu_excellent": Opt(0.45, "MFU panel: excellent from this MFU (reference band, no alert)", 0, 1),
        "mfu_near_limit": Opt(0.55, "MFU panel: near the hardware limit from this MFU (reference band, no alert)", 0, 1),
        "mfu_drop_ratio": Opt(0.8, "RanksightMfuDrop: the job's MFU now / its MFU windows.mfu_drop_offset ago "
                                   "below this", 0, 1),
        # the training loss (ranksight.loss; ranksight/triage/alerts.py, _loss_signals)
        "loss_spike_ratio": Opt(2.0, "RanksightLossSpike: a rank's mean loss over windows.loss_short / its mean over "
                                     "the windows.loss_long before it, above this", 1, 1e6),
        "loss_divergence_ratio": Opt(1.5, "RanksightLossDivergence: the job's highest / lowest rank mean loss over "
                                          "windows.loss_short, above this", 1, 1e6),
        "loss_resume_jump_ratio": Opt(1.3, "RanksightLossJumpAfterResume: a rank's mean loss since its checkpoint "
                                           "restore / its mean over windows.loss_short before the restart, above "
                                           "this", 1, 1e6),
        "loss_resume_min_readings": Opt(10, "RanksightLossJumpAfterResume: ... once the rank recorded at least this "
                                            "many finite losses since the restore", 1, 1e9),
        "goodput_floor": Opt(0.8, "RanksightGoodputLow: the job's goodput (productive share of its wall time) below this", 0, 1),
    },
    "durations": {  # `for:` of each alert
        "dataloader_bound": Opt("10m", "RanksightDataloaderBound for:"),
        "gpu_sawtooth": Opt("10m", "RanksightGpuSawtooth for:"),
        "comm_bound": Opt("10m", "RanksightCommBound for:"),
        "tcp_retransmits": Opt("5m", "RanksightTcpRetransmits for:"),
        "checkpoint_slow": Opt("0m", "RanksightCheckpointSlow for:"),
        "checkpoint_stale": Opt("10m", "RanksightCheckpointStale for:"),
        "heartbeat_missed": Opt("0m", "RanksightHeartbeatMissed for:"),
        "rank_down": Opt("15s", "RanksightRankDown for: (after agent.down_after_misses heartbeats: a dead rank pages within 30 s)"),
        "rank_stalled": Opt("1m", "RanksightRankStalled for:"),
        "collective_desync": Opt("30s", "RanksightCollectiveDesync for:"),
        "straggler": Opt("10m", "RanksightStraggler for:"),
        "pipeline_straggler": Opt("10m", "RanksightPipelineStraggler for:"),
        "pipeline_bubble": Opt("15m", "RanksightPipelineBubble for:"),
        "alloc_retries": Opt("15m", "RanksightCudaAllocRetries for:"),
        "memory_imbalance": Opt("10m", "RanksightMemoryImbalance for:"),
        "memory_near_oom": Opt("2m", "RanksightMemoryNearOom for:"),
        "nic_speed_low": Opt("5m", "RanksightNicSpeedLow for:"),
        "version_skew": Opt("5m", "RanksightVersionSkew for:"),
        "disk_filling": Opt("5m", "RanksightDiskFilling for:"),
        "pcie_degraded": Opt("5m", "RanksightGpuPcieDegraded for:"),
        "xid": Opt("0m", "RanksightGpuXidError for:"),
        "throttling": Opt("10m", "RanksightGpuThrottling for:"),
        "exporter_down": Opt("5m", "RanksightExporterDown for:"),
        "collector_down": Opt("10m", "RanksightCollectorDown for:"),
        "ingest_dropping": Opt("10m", "RanksightIngestDropping for:"),
        "lint": Opt("0m", "RanksightLint* for:"),
        "step_regression": Opt("1h", "RanksightStepTimeRegression for:"),
        "goodput_low": Opt("30m", "RanksightGoodputLow for:"),
        "mfu_low": Opt("30m", "RanksightMfuLow for:"),
        "mfu_drop": Opt("15m", "RanksightMfuDrop for: (a shorter dip, e.g. an evaluation pass, does not page)"),
        "loss_nonfinite": Opt("0m", "RanksightLossNonFinite for:"),
        "loss_spike": Opt("5m", "RanksightLossSpike for:"),
        "loss_divergence": Opt("10m", "RanksightLossDivergence for:"),
        "loss_resume_jump": Opt("1m", "RanksightLossJumpAfterResume for:"),
        "baseline_rule_interval": Opt("5m", "evaluation interval of the step-time baseline group (hour averages and "
                                            "their minimum over windows.step_baseline)"),
        "slow_rule_interval": Opt("1m", "evaluation interval of the recording groups of large families that only "
                                        "dashboards read (step histograms, node RDMA/interface/GPU-sample counters)"),
        "am_group_wait": Opt("30s", "Alertmanager route group_wait (alerts/alertmanager.yml)"),
        "am_group_interval": Opt("5m", "Alertmanager route group_interval"),
        "am_repeat_interval": Opt("4h", "Alertmanager route repeat_interval"),
    },
    "windows": {  # PromQL range windows
        "rate": Opt("5m", "rate() window of recording rules"),
        "heartbeat": Opt("5m", "RanksightHeartbeatMissed: window for increase() of misses"),
        "disk_predict": Opt("1h", "RanksightDiskFilling: predict_linear() lookback"),
        "creep_offset": Opt("1h", "RanksightCudaAllocRetries: step-time creep compared with this long ago"),
        "checkpoint_share": Opt("1h", "RanksightCheckpointSlow: window of the checkpoint share of wall time "
                                      "(longer than the checkpoint interval, or every write looks like a big share)"),
        "step_smooth": Opt("1h", "RanksightStepTimeRegression: the job's step p50 and step components are averaged over this"),
        "step_baseline": Opt("7d", "RanksightStepTimeRegression: the baseline is the lowest such average within this "
                                   "lookback (the job's best hour), so a slow creep over days still fires"),
        "mfu_drop_offset": Opt("1h", "RanksightMfuDrop: the job's MFU is compared with its value this long ago"),
        "goodput_min_wall": Opt("1h", "RanksightGoodputLow: judged only once the job's goodput has been recorded this "
                                      "long (startup dominates a young job)"),
        "loss_short": Opt("5m", "RanksightLossSpike, RanksightLossDivergence: the recent mean loss of a rank is over this"),
        "loss_long": Opt("1h", "RanksightLossSpike: ... and its reference, the mean over this window before the short one"),
        "loss_resume": Opt("15m", "RanksightLossJumpAfterResume: a rank is judged this long after its checkpoint "
                                  "restore, on its mean loss since the restore"),
        "loss_resume_lookback": Opt("3h", "RanksightLossJumpAfterResume: the mean before the restart is the rank's "
                                          "last windows.loss_short mean, held this long after its steady series "
                                          "were last seen (longer than a restart)"),
    },
    "agent": {
        "listen": Opt("0.0.0.0:9945", "HTTP listen address for /metrics and /healthz"),
        "ingest": Opt("udp://127.0.0.1:9946", "datagram ingest address: udp://host:port or unix:///path"),
        "procfs": Opt("/proc", "procfs root"),
        "sysfs": Opt("/sys", "sysfs root"),
        "collectors": Opt("gpu,network,rdma,disk,ranks", "enabled collectors"),
        "watch_paths": Opt([], "extra paths whose filesystem free space is watched"),
        "max_ranks": Opt(4096, "cap on tracked ranks (all jobs)", 1, 1_000_000),
        "max_jobs": Opt(64, "cap on tracked jobs", 1, 100_000),
        "quantile_window_seconds": Opt(300.0, "sliding window for step p50/p99", 1, 86400),
        "rank_ttl_seconds": Opt(900.0, "forget a rank silent this long", 1, 1e7),
        "rank_linger_seconds": Opt(60.0, "keep a cleanly exited rank's final series this long (marked finished; at "
                                         "least two scrape intervals, so a job shorter than one scrape still lands)",
                                   0, 1e6),
        "down_after_misses": Opt(3, "rank_up drops to 0 after this many missed heartbeats", 1, 1000),
        "stall_min_seconds": Opt(30.0, "stalled: no step for max(this, stall_p99_factor x p99)", 0.1, 1e6),
        "stall_p99_factor": Opt(5.0, "see stall_min_seconds", 1, 1000),
        "gpu_poll_seconds": Opt(1.0, "NVML utilization samples: drained this often", 0.05, 60),
        "gpu_state_seconds": Opt(5.0, "NVML device state (memory, temperature, power, SM clock, clocks-event reasons, "
                                      "PCIe link, GPM activity): read this often", 0.05, 600),
        "gpu_window_seconds": Opt(15.0, "GPU waveform window", 1, 3600),
        "nic_include": Opt("", "regex of interfaces to include (empty: all)"),
        "nic_exclude": Opt(r"^(lo|veth.*|docker.*|br-.*|virbr.*)$", "regex of interfaces to exclude"),
        "rdma_counters": Opt("curated", "RDMA port counters exposed: curated (throughput, link errors, congestion: "
                                        "catalog.RDMA_CURATED_COUNTERS) | all (every counters/hw_counters file) | "
                                        "a list of counter names (a hw_counters file named like a counters file is hw_<name>)"),
        "peak_flops_dtype": Opt("bf16", "dtype of the GPUs' peak FLOP/s gauge, the denominator of MFU: bf16 | fp16 | "
                                        "tf32 | fp8 (dense tensor-core figures, exporter/peak.py)"),
        "peak_tflops": Opt(0.0, "one peak (dense TFLOPS) for every GPU of the node; 0: the table by device name",
                           0, 1e6),
        "peak_tflops_by_name": Opt({}, "NVML device name -> peak dense TFLOPS for peak_flops_dtype, over the "
                                       "table and peak_tflops (a device missing from the table gets no MFU)"),
        "web_config_file": Opt("", "exporter-toolkit web config file (TLS, client certificates, basic auth) for "
                                   "/metrics and /healthz; empty: plain HTTP (--web.config.file)"),
        "act_token_file": Opt("", "file holding the bearer token `ranksight act` sends to end a job's workers on this "
                                  "node (POST /api/v1/ranks/end; the same token as act.agent_token_file); empty and "
                                  "no act_client_sans: the endpoint is off"),
        "act_client_sans": Opt([], "SANs (DNS, IP, email, URI) of the client certificates that may end a job's workers "
                                   "on this node, verified through web_config_file's RequireAndVerifyClientCert; "
                                   "with act_token_file both are required"),
        "act_trust_udp_pids": Opt(False, "let POST /api/v1/ranks/end signal the pid a rank sending over UDP claims "
                                         "(any local user can claim any pid: only where every local user is trusted); "
                                         "off: only pids the kernel vouches for (unix-socket ingest)"),
    },
    "hooks": {
        "agent": Opt("udp://127.0.0.1:9946", "where to send: udp://host:port | unix:///path | off (env RANKSIGHT_AGENT)"),
        "heartbeat_seconds": Opt(1.0, "heartbeat period", 0.05, 60),
        "table_every_steps": Opt(100, "rank 0's console table every N steps (0: this trigger off)", 0, 1e9),
        "table_every_seconds": Opt(60.0, "... or every this many seconds (0: this trigger off; both 0: no table)",
                                   0, 1e9),
        "table_min_seconds": Opt(30.0, "... but at most one table per this many seconds (0: no limit)", 0, 1e9),
        "table_share_move": Opt(0.1, "... or sooner when a share of step time moved by this fraction since the "
                                     "last table (0: off)", 0, 1),
        "memory_peak_seconds": Opt(0.0, "CUDA memory peaks (ranksight_cuda_memory_*_peak_bytes): 0 (default) never "
                                        "resets the allocator's peaks, so the gauge is the process's high-water mark "
                                        "and the training code's own max_memory_allocated() keeps its meaning; N > 0 "
                                        "resets them every N seconds and the gauge holds the higher of the last two "
                                        "windows (keep N at least the scrape interval), at the cost of the training "
                                        "code's own peak readings covering only the time since the last reset", 0, 1e6),
        "max_pending_events": Opt(256, "bound of the pending CUDA event queue", 8, 1e6),
        "gpu_timing_every": Opt(0, "CUDA: time one step in N on average with CUDA events (sampled timing, gaps "
                                   "drawn from 1 to 2N-1 steps; the agent exposes N per rank); every step's forward, "
                                   "backward, optimizer, communication and pipeline times are then the shares of the "
                                   "GPU time over the timed steps of the last 30 s (at most 1,024) times its own host "
                                   "duration. 0 (default): N chosen as the steps go, so that the CUDA events cost the "
                                   "step path about hooks.gpu_timing_budget of the step time on average (every step "
                                   "timed where they cost less, as on long steps; N at most 256). 1: every step timed, each step's GPU seconds "
                                   "carried into the records as they resolve (no shares). Sampling cuts the hooks' "
                                   "CUDA events per step N-fold; where rare long steps (host stalls) hold much of "
                                   "the time, the shares scatter more than every-step timing's (bench/RESULTS.md)",
                                0, 1e6),
        "gpu_timing_seconds": Opt(1.0, "... and, when N > 1 or 0, at least one step each this many seconds (slow steps "
                                       "are all timed; 0: every step)", 0, 1e6),
        "gpu_timing_budget": Opt(0.005, "with hooks.gpu_timing_every 0: the share of the host step time the "
                                        "CUDA events may cost on average (their records and queries, measured on "
                                        "each timed step; the shares' own bookkeeping on every step is not in it)",
                                 1e-5, 1.0),
        "ddp_stats_every": Opt(20, "gloo DDP: read DDP's reducer timer every N synchronized iterations "
                                   "(1: every one); the others are estimated from it", 1, 1e6),
        "patch_torch_save": Opt(True, "time torch.save / dcp.save while watched, and see checkpoint restores "
                                             "through torch.load (hooks/resume.py)"),
        "checkpoint_dir": Opt("", "checkpoint directory reported to the agent (disk watch)"),
        "log_dir": Opt("", "log directory reported to the agent (disk watch)"),
        "stack_after_seconds": Opt(15.0, "no progress for this long: send the main thread's stack to the agent "
                                         "(RanksightRankStalled's place; half the agent's stall floor; 0: never)", 0, 1e6),
        "stack_every_seconds": Opt(5.0, "... again when it changes, at most this often", 0.1, 1e6),
        "protocol": Opt(5, "datagram protocol version the hooks send: 5, or 4 (3, 2) for node agents older than "
                           "version 5 (4, 3): they reject newer ones; 4 and older carry no memory peaks, pipeline "
                           "stage measurements, resume or total steps, 3 and 2 no samples or tokens either", 2, 5),
        "tokens_per_sample": Opt(0, "tokens in one sample of a batch, for ranksight_tokens_total: 0 reads it from "
                                    "the batch's token tensor (input_ids, or its first integer tensor of 2+ "
                                    "dimensions); 1 for a model without a sequence (each sample one token)", 0, 1e9),
        "flops_per_token": Opt(0, "model FLOPs per trained token, forward and backward, for "
                                  "the model FLOPs-per-token gauge and MFU: 0 estimates it once from the model "
                                  "(6 x trainable parameters, + 12 x layers x hidden size x sequence length "
                                  "with a Hugging Face config; hooks/flops.py)", 0, 1e18),
        "total_steps": Opt(0, "the optimizer steps the whole run is to take, across restarts (watch(total_steps=) "
                              "wins; a Hugging Face or Lightning callback reads its trainer's): the ETA and the cost "
                              "to finish; 0: unknown", 0, 1e15),
        "step_detail": Opt(False, "send every step's phase times (data, fwd, bwd, ...) in the steps records, "
                                  "not only their totals: for tools that read each step (the agent does not)"),
    },
    "lints": {
        "io_amplification": Opt(True, "lint: every rank reads the whole dataset"),
        "sampler_epoch": Opt(True, "lint: DistributedSampler.set_epoch never called"),
        "rank_disagreement": Opt(True, "lint: ranks disagree on sampler seed or initial parameters"),
        "dataloader_workers_rss": Opt(True, "lint: DataLoader workers eat host memory"),
        "numa_binding": Opt(True, "lint: rank bound to the wrong NUMA node"),
        "uneven_last_batch": Opt(True, "lint: drop_last=False with an uneven last batch"),
        "incomplete_checkpoint": Opt(True, "lint: checkpoint lacks optimizer/scheduler/RNG/data/step state"),
        "global_batch_lr": Opt(True, "lint: one info line with global batch and LR"),
        "disk_headroom": Opt(True, "lint: too little free disk at start"),
        "partial_resume": Opt(True, "lint: a checkpoint restore left the optimizer, LR scheduler or sampler epoch "
                                    "fresh"),
    },
}

SCHEMA["cost"] = {  # the run's cost (ranksight/triage/efficiency.py run_rules, the triage board, ranksight report)
    "gpu_hour_price": Opt(0.0, "price of one GPU-hour (one rank's device for an hour): records "
                               "job:ranksight_cost_spent:sum and job:ranksight_cost_to_finish:sum, the triage "
                               "board's cost panels and the report's cost lines; 0: GPU-hours only, no cost", 0, 1e9),
    "currency": Opt("USD", "the unit of gpu_hour_price, shown with every cost"),
}
SCHEMA["alerting"] = {  # `ranksight rules`: alerts/alertmanager.yml and runbook_url
    "webhook_url": Opt("http://127.0.0.1:9947/alerts", "URL of the built-in `webhook` receiver (http:// or https://); "
                                                       "every alert goes there when no receivers are configured"),
    "runbook_base_url": Opt("https://github.com/ranksight/ranksight/blob/main/alerts/runbooks",
                            "absolute URL prefix of the runbooks: runbook_url = <this>/<alert id>.md"),
    # on-call (ranksight/oncall.py): receivers, severity routes, the dashboard link of each page
    "receivers": Opt({}, "on-call receivers: name -> {type: slack|pagerduty|email|opsgenie|webhook, ...}, "
                         "secrets in files (ranksight/oncall.py); none: everything to webhook_url"),
    "routes": Opt({}, "severity -> receiver name(s) or none: critical, warning, info, lint (setup lints); "
                      "unset ones default to critical: pager, warning: chat, info: none, lint: chat"),
    "grafana_url": Opt("http://localhost:3000", "Grafana base URL for the triage-dashboard link in every page"),
}

ACT_MODES = ("off", "propose", "auto")  # act.mode and the values of act.modes
ACT_ENGINES = ("none", "slurm", "kubernetes")  # act.engine
SCHEMA["act"] = {  # `ranksight act` (ranksight/tools/act.py): the action each verdict's triage entry names
    "listen": Opt("127.0.0.1:9948", "HTTP listen address of `ranksight act` (Alertmanager posts to /alerts)"),
    "mode": Opt("propose", "mode of every verdict with an action: off | propose (log the exact command, wait for "
                           "`ranksight act approve ID`) | auto"),
    "modes": Opt({}, "alert name -> off|propose|auto, overriding act.mode for that verdict"),
    "dry_run": Opt(True, "log and count each approved or auto action as dry_run instead of running it"),
    "max_drains_per_hour": Opt(2, "at most this many node drains per hour across the cluster (K)", 0, 1000),
    "job_min_nodes": Opt(1, "never drain a node when fewer than this many undrained nodes of its job would stay",
                         0, 100000),
    "token_file": Opt("", "file holding the bearer token every request must carry (Alertmanager's "
                          "http_config.authorization.credentials_file); a web config with client certificates "
                          "may replace it"),
    "web_config_file": Opt("", "exporter-toolkit web config (TLS, client certificates) for `ranksight act`"),
    "engine": Opt("none", "where the jobs run, for drains: none | slurm | kubernetes"),
    "agent_url": Opt("http://127.0.0.1:9945", "the culprit node's agent, which lists the job's ranks and ends them: "
                                              "https://{instance} (the alert's instance label: the agent Prometheus "
                                              "scraped), or one fixed URL for a one-node setup; plain http only to a "
                                              "loopback host"),
    "agent_token_file": Opt("", "file holding the bearer token sent to the agents (their agent.act_token_file)"),
    "agent_ca_file": Opt("", "CA file that verifies the agents' HTTPS certificates (empty: the system's CAs)"),
    "agent_cert_file": Opt("", "client certificate `ranksight act` presents to the agents (their agent.act_client_sans)"),
    "agent_key_file": Opt("", "the private key of agent_cert_file"),
    "kill_grace_seconds": Opt(5.0, "restart_workers: the agent sends SIGTERM, then SIGKILL after this many seconds",
                              0, 600),
    "kube_pod_selector": Opt("", "kubernetes: label selector of the training pods to evict from a drained node"),
    "ledger_file": Opt("", "JSON-lines ledger of every verdict and action (kept across restarts); empty: memory"),
}


def _act_modes(where: str, value: Any) -> Dict[str, str]:
    """act.modes: alert name -> off|propose|auto (names are checked against the triage table by `ranksight act`)."""
    value = oncall._load_yaml_string(where, value)
    if value is None:
        return {}
    if isinstance(value, Mapping):  # YAML 1.1 reads an unquoted off as false
        value = {k: "off" if v is False else v for k, v in value.items()}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and v in ACT_MODES for k, v in value.items()):
        raise ConfigError(f"config {where}: expected alert name -> {' | '.join(ACT_MODES)}, got {value!r}")
    return dict(value)


# The test profile shortens durations and windows, nothing else.
PROFILES: Dict[str, Dict[str, Dict[str, Any]]] = {
    "default": {},
    "test": {
        "durations": {k: ("0m" if v.default == "0m" else "10s") for k, v in SCHEMA["durations"].items()},
        "windows": {"rate": "30s", "heartbeat": "1m", "disk_predict": "5m", "creep_offset": "2m",
                    "checkpoint_share": "30s", "step_smooth": "1m", "step_baseline": "10m", "goodput_min_wall": "5m",
                    "mfu_drop_offset": "5m", "loss_short": "1m", "loss_long": "5m",
                    "loss_resume": "2m", "loss_resume_lookback": "10m"},
    },
}


PEAK_DTYPES = ("bf16", "fp16", "tf32", "fp8")  # agent.peak_flops_dtype


AGENT_URL_FIELD = re.compile(r"\{([^{}]*)\}")  # act.agent_url: {instance} from the alert's labels
AGENT_URL_FIELDS = ("instance",)  # set by Prometheus (the scraped agent's address), not by the training job


def loopback_host(host: str) -> bool:
    """``host`` (a URL's hostname) is this machine's loopback: localhost or a loopback address."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _agent_url(where: str, value: Any) -> str:
    """act.agent_url: http(s)://host[:port] with {instance}, the alert's label Prometheus sets to the agent
    it scraped; plain http only to a fixed loopback host."""
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        raise ConfigError(f"config {where}: expected a URL, got {value!r}")
    fields = AGENT_URL_FIELD.findall(value)
    probe = AGENT_URL_FIELD.sub("x", value)
    if "{" in probe or "}" in probe:
        raise ConfigError(f"config {where}: {value!r}: a field is {{instance}}")
    if any(f not in AGENT_URL_FIELDS for f in fields):
        raise ConfigError(f"config {where}: {value!r}: the only field is {{instance}}, the agent's address as "
                          "Prometheus scraped it; a rank's node and job labels are what the training process "
                          "says, so they must not choose where act sends its token")
    u = urlsplit(probe)
    if u.scheme not in ("http", "https") or not u.hostname or u.query or u.fragment:
        raise ConfigError(f"config {where}: expected http(s)://HOST:PORT or https://{{instance}}, got {value!r}")
    if u.scheme == "http" and (fields or not loopback_host(u.hostname)):
        raise ConfigError(f"config {where}: {value!r}: plain http only to a loopback host; use https:// "
                          "(act.agent_ca_file) to reach another node's agent")
    return value


def _peak_by_name(where: str, value: Any) -> Dict[str, float]:
    """agent.peak_tflops_by_name: a mapping (or "name=tflops,name=tflops") of NVML device names to
    positive dense TFLOPS."""
    if isinstance(value, str):
        try:
            value = dict((k.strip(), float(v)) for k, v in (p.rsplit("=", 1) for p in value.split(",") if p.strip()))
        except ValueError:
            value = None
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and k and not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v < 1e6
        for k, v in value.items())
    if not ok:
        raise ConfigError(f"config {where}: expected NVML device name -> peak dense TFLOPS (a number above 0), "
                          f"got {value!r}")
    return {k: float(v) for k, v in value.items()}


def _rdma_counters(where: str, value: Any) -> Any:
    """agent.rdma_counters: 'curated' | 'all' | a list (or comma-separated string) of counter names."""
    import re

    if isinstance(value, str) and value.strip() in ("curated", "all"):
        return value.strip()
    names = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
    if isinstance(names, list) and len(names) == 1 and names[0] in ("curated", "all"):
        return names[0]
    if (not isinstance(names, list) or not names or "curated" in names or "all" in names
            or not all(isinstance(n, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", n) for n in names)):
        raise ConfigError(f"config {where}: expected curated, all or a list of RDMA counter file names, got {value!r}")
    return list(dict.fromkeys(names))


def validate(section: str, key: str, value: Any) -> Any:
    """The checked value of ``section.key`` (strings coerced to its type); ConfigError otherwise."""
    opt = SCHEMA[section][key]
    where = f"{section}.{key}"
    if (section, key) == ("agent", "rdma_counters"):
        return _rdma_counters(where, value)
    if (section, key) == ("agent", "peak_tflops_by_name"):
        return _peak_by_name(where, value)
    if (section, key) == ("agent", "peak_flops_dtype") and value not in PEAK_DTYPES:
        raise ConfigError(f"config {where}: expected one of {', '.join(PEAK_DTYPES)}, got {value!r}")
    if (section, key) == ("act", "modes"):
        return _act_modes(where, value)
    if (section, key) == ("act", "agent_url"):
        return _agent_url(where, value)
    if (section, key) == ("act", "mode") and value is False:  # YAML 1.1 reads an unquoted off as false
        value = "off"
    if (section, key) in (("act", "mode"), ("act", "engine")) and value not in (ACT_MODES if key == "mode" else ACT_ENGINES):
        raise ConfigError(f"config {where}: expected one of {', '.join(ACT_MODES if key == 'mode' else ACT_ENGINES)}, "
                          f"got {value!r}")
    if (section, key) in (("alerting", "receivers"), ("alerting", "routes")):
        return oncall.check_receivers(value) if key == "receivers" else oncall.check_routes(value)
    d = opt.default
    if isinstance(d, bool):
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        if not isinstance(value, bool):
            raise ConfigError(f"config {where}: expected true or false, got {value!r}")
        return value
    if isinstance(d, (int, float)):
        try:
            v = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            v = None
        if v is None or v != v or v in (float("inf"), float("-inf")):
            raise ConfigError(f"config {where}: expected a number, got {value!r}")
        if (opt.lo is not None and v < opt.lo) or (opt.hi is not None and v > opt.hi):
            raise ConfigError(f"config {where}: {value!r} is outside [{opt.lo:g}, {opt.hi:g}]")
        if isinstance(d, int):
            if v != int(v):
                raise ConfigError(f"config {where}: expected a whole number, got {value!r}")
            return int(v)
        return v
    if isinstance(d, list):
        if isinstance(value, str):
            value = [p for p in value.split(",") if p]
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise ConfigError(f"config {where}: expected a list of strings, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"config {where}: expected a string, got {value!r}")
    if section in ("durations", "windows") and not is_duration(value):
        raise ConfigError(f"config {where}: expected a Prometheus duration like 30s, 5m or 1h, got {value!r}")
    return value


def _merge(cfg: Dict[str, Dict[str, Any]], over: Mapping[str, Any], origin: str) -> None:
    if not isinstance(over, Mapping):
        raise ConfigError(f"config {origin}: expected a mapping of sections, got {type(over).__name__}")
    for section, vals in over.items():
        if section not in SCHEMA:
            raise ConfigError(f"config {origin}: unknown section {section!r} (known: {', '.join(SCHEMA)})")
        if not isinstance(vals, Mapping):
            raise ConfigError(f"config {origin}: section {section!r} must be a mapping")
        for key, value in vals.items():
            if key not in SCHEMA[section]:
                raise ConfigError(f"config {origin}: unknown key {section}.{key}")
            cfg[section][key] = validate(section, key, value)


class Config(dict):
    """section -> key -> value, with attribute access to sections: cfg.thresholds['comm_share']."""

    def __getattr__(self, name: str) -> Dict[str, Any]:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    profile: str = "default"


def defaults() -> Dict[str, Dict[str, Any]]:
    return {s: {k: copy.deepcopy(o.default) for k, o in keys.items()} for s, keys in SCHEMA.items()}


def load(path: Optional[str] = None, profile: str = "default", env: Optional[Mapping[str, str]] = None) -> Config:
    """Build the effective config. Raises ConfigError (one line) on any bad value."""
    env = os.environ if env is None else env
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
    cfg = defaults()
    _merge(cfg, PROFILES[profile], f"profile {profile}")
    path = path or env.get("RANKSIGHT_CONFIG") or None
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"config {path}: cannot read: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config {path}: invalid YAML{at}") from None
        if data is not None:
            _merge(cfg, data, path)
    for name, value in env.items():
        if not name.startswith("RANKSIGHT__"):
            continue
        parts = name[len("RANKSIGHT__"):].split("__")
        if len(parts) != 2:
            raise ConfigError(f"env {name}: expected RANKSIGHT__<section>__<key>")
        section, key = parts[0].lower(), parts[1].lower()
        _merge(cfg, {section: {key: value}}, f"env {name}")
    oncall.check_refs(cfg["alerting"])
    out = Config(cfg)
    out.profile = profile
    return out


def duration_seconds(s: str) -> float:
    """'1h30m' -> 5400.0"""
    return sum(float(n) * _DURATION_UNIT[u] for n, u in _DURATION_PART.findall(s))


def describe() -> Tuple[Tuple[str, str, Any, str], ...]:
    """(section, key, default, help) rows, for docs and `ranksight config`."""
    return tuple((s, k, o.default, o.help) for s, keys in SCHEMA.items() for k, o in keys.items())
