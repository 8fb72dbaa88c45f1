"""The metric catalog: every ranksight metric name, type, unit, labels and help.

This is the only place a metric name is written as a string. The exporter
exposes from it; rules, dashboards and the triage command build PromQL from it
(``str(STEP_DURATION)`` is the full name, ``STEP_DURATION.bucket`` etc. give the
histogram series).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Tuple

PREFIX = "ranksight_"

# Label sets. Rank series also carry `node` (constant per rank, so no extra
# cardinality) so that inhibition and dashboards can join rank and node views.
RANK_LABELS: Tuple[str, ...] = ("job", "node", "rank", "local_rank")
NODE_LABELS: Tuple[str, ...] = ("node",)
GPU_LABELS: Tuple[str, ...] = ("node", "gpu")

# Histogram buckets (seconds). Few, to keep per-node series low at 1,024 nodes:
# 12 buckets cover 1 ms .. 2 min of step time.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
UTIL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class Metric:
    short: str
    type: str  # counter | gauge | histogram
    unit: str  # seconds | bytes | ratio | count | info | celsius | watts | hertz | bool
    labels: Tuple[str, ...]
    help: str
    buckets: Tuple[float, ...] = field(default=())
    source: str = "agent"  # what exposes it: the node agent, or "act" (`ranksight act`'s /metrics)

    @property
    def name(self) -> str:
        return PREFIX + self.short

    def __str__(self) -> str:  # so f"rate({M}[5m])" reads naturally
        return self.name

    # Histogram series names, for PromQL.
    @property
    def bucket(self) -> str:
        return self.name + "_bucket"

    @property
    def sum(self) -> str:
        return self.name + "_sum"

    @property
    def count(self) -> str:
        return self.name + "_count"


CATALOG: Dict[str, Metric] = {}


def _m(short: str, type: str, unit: str, labels: Tuple[str, ...], help: str, buckets: Tuple[float, ...] = (),
       source: str = "agent") -> Metric:
    if type == "counter" and not short.endswith("_total"):
        raise ValueError(f"counter {short} must end in _total")
    if short in CATALOG:
        raise ValueError(f"duplicate metric {short}")
    m = Metric(short, type, unit, labels, help, buckets, source)
    CATALOG[short] = m
    return m


R = RANK_LABELS
N = NODE_LABELS
G = GPU_LABELS

# ---------------------------------------------------------------- per rank
STEP_DURATION = _m("step_duration_seconds", "histogram", "seconds", R,
                   "Optimizer step duration, step boundary to step boundary.", STEP_BUCKETS)
STEP_QUANTILE = _m("step_duration_quantile_seconds", "gauge", "seconds", R + ("quantile",),
                   "Step duration quantile over the agent's sliding window (default 5 min).")
STEPS = _m("steps_total", "counter", "count", R, "Optimizer steps completed.")
MICROBATCHES = _m("microbatches_total", "counter", "count", R,
                  "Micro-batches (forward passes) seen; above steps_total under gradient accumulation.")
SAMPLES = _m("samples_total", "counter", "count", R,
             "Samples the rank's optimizer steps trained on: the first dimension of each batch the watched "
             "loader yielded.")
TOKENS = _m("tokens_total", "counter", "count", R,
            "Tokens the rank's optimizer steps trained on: each batch's samples times its tokens per sample "
            "(hooks.tokens_per_sample, or the batch's sequence length read from its shape).")
MODEL_FLOPS_PER_TOKEN = _m("model_flops_per_token", "gauge", "count", R,
                           "Model FLOPs per trained token, forward and backward (no recomputation): "
                           "hooks.flops_per_token, or estimated once from the model as 6*N + 12*L*H*T "
                           "(hooks/flops.py). Times the tokens rate: the rank's achieved FLOP/s.")
LOSS_SUM = _m("loss_sum_total", "counter", "loss", R,
              "Sum of the finite training losses the rank recorded (ranksight.loss); over loss_readings_total, "
              "the mean loss. A loss outside [0, 604800] is not summed.")
LOSS_READINGS = _m("loss_readings_total", "counter", "count", R, "Finite training losses in loss_sum_total.")
LOSS_NONFINITE = _m("loss_nonfinite_total", "counter", "count", R, "Training losses that were NaN or infinite.")
LOSS_FIRST_NONFINITE_STEP = _m("loss_first_nonfinite_step", "gauge", "count", R,
                               "The optimizer step whose training loss was the rank's first NaN or infinity "
                               "(0: none yet).")
# a pipeline-parallel stage (hooks/pipeline.py): exposed only for ranks watched as one (pipeline_stages > 0);
# the counters carry the rank's stage index (pipeline_stage) as the label "stage"
PIPELINE_BUSY = _m("pipeline_busy_seconds_total", "counter", "seconds", R + ("stage",),
                   "Pipeline stage compute: time in the stage's forward and backward micro-batch chunks (CUDA "
                   "events on CUDA, host time on CPU). Over pipeline_step_seconds_total: 1 - the bubble share.")
PIPELINE_STEP = _m("pipeline_step_seconds_total", "counter", "seconds", R + ("stage",),
                   "Time in the pipeline schedule's step(): the stage's micro-batches, computing or waiting.")
PIPELINE_WAIT_PREV = _m("pipeline_wait_prev_seconds_total", "counter", "seconds", R + ("stage",),
                        "Time the stage blocked on P2P work with the stage before it: receiving its activations, "
                        "sending it gradients.")
PIPELINE_WAIT_NEXT = _m("pipeline_wait_next_seconds_total", "counter", "seconds", R + ("stage",),
                        "Time the stage blocked on P2P work with the stage after it: receiving its gradients, "
                        "sending it activations.")
PIPELINE_STAGE = _m("pipeline_stage", "gauge", "count", R,
                    "The rank's index in its pipeline group (0: the first stage).")
PIPELINE_STAGES = _m("pipeline_stages", "gauge", "count", R, "Ranks in the rank's pipeline group (p).")
PIPELINE_MICROBATCHES = _m("pipeline_microbatches", "gauge", "count", R,
                           "Micro-batch forwards the rank's stages run per schedule step: the schedule's "
                           "micro-batches times the rank's stages (m, or v*m interleaved). The ideal bubble "
                           "share is (p-1)/(this+p-1).")
LAST_RESUME = _m("last_resume_timestamp_seconds", "gauge", "seconds", R,
                 "Wall time (Unix seconds) at which the rank's process restored its model from a checkpoint "
                 "(hooks/resume.py), or its Trainer reported starting past step 0; 0: no resume in this process.")
RESUME_STEP = _m("resume_step", "gauge", "count", R,
                 "The step the rank's process resumed from: the restored checkpoint's step counter, or the "
                 "framework's step at the start of training (0: none known).")
TOTAL_STEPS = _m("total_steps", "gauge", "count", R,
                 "The optimizer steps the whole run is to take, across restarts: watch(total_steps=), "
                 "hooks.total_steps or the framework's (Trainer max_steps); 0: unknown.")
STEP_SECONDS = _m("step_seconds_total", "counter", "seconds", R, "Sum of step durations.")
DATALOADER_WAIT = _m("dataloader_wait_seconds_total", "counter", "seconds", R,
                     "Time the training loop spent waiting in next() on the data loader.")
DATALOADER_WAIT_HIST = _m("dataloader_wait_seconds", "histogram", "seconds", R,
                          "Data loader wait per step.", WAIT_BUCKETS)
FORWARD_SECONDS = _m("forward_seconds_total", "counter", "seconds", R,
                     "Forward time (GPU events on CUDA, host time on CPU).")
BACKWARD_SECONDS = _m("backward_seconds_total", "counter", "seconds", R,
                      "Backward time (GPU events on CUDA, host time on CPU).")
OPTIMIZER_SECONDS = _m("optimizer_seconds_total", "counter", "seconds", R,
                       "optimizer.step() time (GPU events on CUDA, host time on CPU).")
BACKWARD_TO_OPTIMIZER = _m("backward_to_optimizer_seconds", "histogram", "seconds", R,
                           "Backward start to optimizer.step() start, per step.", STEP_BUCKETS)
COMM_SECONDS = _m("comm_seconds_total", "counter", "seconds", R,
                  "Collective communication time (launch to completion).")
EXPOSED_COMM_SECONDS = _m("exposed_comm_seconds_total", "counter", "seconds", R,
                          "Communication not overlapped with compute: time blocked waiting on collectives.")
CHECKPOINT_SECONDS = _m("checkpoint_seconds_total", "counter", "seconds", R,
                        "Time checkpoint saves blocked the training steps: a blocking save's write, an async "
                        "save's staging. Each write's own duration is checkpoint_write_seconds.")
CHECKPOINT_WRITE = _m("checkpoint_write_seconds", "histogram", "seconds", R,
                      "Checkpoint write duration.", CHECKPOINT_BUCKETS)
CHECKPOINT_BYTES = _m("checkpoint_bytes_total", "counter", "bytes", R, "Checkpoint bytes written.")
CHECKPOINT_FAILURES = _m("checkpoint_failures_total", "counter", "count", R, "Checkpoint writes that raised.")
LAST_CHECKPOINT = _m("last_checkpoint_timestamp_seconds", "gauge", "seconds", R,
                     "Unix time of the last successful checkpoint write.")
LAST_CHECKPOINT_DURATION = _m("last_checkpoint_duration_seconds", "gauge", "seconds", R,
                              "Duration of the last checkpoint write.")
LAST_STEP = _m("last_step_timestamp_seconds", "gauge", "seconds", R, "Unix time of the last completed step.")
HEARTBEAT_MISSES = _m("heartbeat_misses_total", "counter", "count", R,
                      "Heartbeat intervals that passed with no heartbeat.")
RANK_UP = _m("rank_up", "gauge", "bool", R, "1 while the rank heartbeats; 0 after 3 missed heartbeats.")
RANK_STALLED = _m("rank_stalled", "gauge", "bool", R + ("reason",),
                  "1 when the rank is alive but makes no progress. reason=no_progress: likely culprit; "
                  "reason=waiting_in_collective: blocked on a peer.")
RANK_STALL_WHERE = _m("rank_stall_where", "gauge", "seconds", R + ("where", "phase"),
                      "Seconds the stalled rank had made no progress when its stack was read, labelled with where "
                      "it is stuck: the innermost frame outside the Python stdlib, torch and ranksight "
                      "(\"train.py:53 in load_batch <- time.sleep\") and its phase. One series per stalled rank, "
                      "only while it is stalled; its frames are on the agent's /api/v1/ranks.")
RANK_COLLECTIVE_SEQ = _m("rank_collective_seq", "gauge", "count", R + ("op", "pg"),
                         "While the rank is stalled inside a collective: that collective's sequence number in its "
                         "process group (op: all_reduce, broadcast, ...; pg: the group's name). Ranks of one group at "
                         "different numbers or ops are desynchronized. One series per blocked rank.")
RANK_COLLECTIVE_WAIT = _m("rank_collective_wait_seconds", "gauge", "seconds", R + ("op", "pg"),
                          "While the rank is stalled inside a collective: how long it has waited in it.")
RANK_RESTARTS = _m("rank_restarts", "gauge", "count", R, "Restart count reported by the launcher.")
CUDA_ALLOC_RETRIES = _m("cuda_alloc_retries_total", "counter", "count", R,
                        "CUDA caching allocator retries (cudaMalloc failed, cache flushed, retried): fragmentation.")
CUDA_OOMS = _m("cuda_ooms_total", "counter", "count", R, "CUDA out-of-memory errors seen by the allocator.")
CUDA_RESERVED = _m("cuda_memory_reserved_bytes", "gauge", "bytes", R, "CUDA caching allocator reserved bytes.")
CUDA_ALLOCATED = _m("cuda_memory_allocated_bytes", "gauge", "bytes", R, "CUDA caching allocator allocated bytes.")
CUDA_ALLOCATED_PEAK = _m("cuda_memory_allocated_peak_bytes", "gauge", "bytes", R,
                         "Highest CUDA caching allocator allocated bytes of the rank: the process's high-water mark, or "
                         "over its last two peak windows with hooks.memory_peak_seconds set (read on the host, no "
                         "device sync): a spike inside a step that current readings miss.")
CUDA_RESERVED_PEAK = _m("cuda_memory_reserved_peak_bytes", "gauge", "bytes", R,
                        "Highest CUDA caching allocator reserved bytes of the rank (the high-water mark, or its last "
                        "two peak windows: hooks.memory_peak_seconds): what the rank held of its GPU at its worst.")
HOOK_ERRORS = _m("hook_errors_total", "counter", "count", R, "Exceptions caught inside ranksight hooks.")
HOOK_DROPPED_EVENTS = _m("hook_dropped_events_total", "counter", "count", R,
                         "GPU timing events dropped because the pending-event queue was full.")
LINT_ACTIVE = _m("lint_active", "gauge", "bool", R + ("lint",), "1 while a setup lint applies to the rank.")
STEP_RECORDS_LOST = _m("step_records_lost_total", "counter", "count", R,
                       "Step records the rank sent that never reached the agent (its totals count more steps than "
                       "records arrived): datagram loss. The counters stay exact regardless.")
RANK_FINISHED = _m("rank_finished", "gauge", "bool", R,
                   "1 after the rank exited cleanly, while the agent keeps its final series (agent.rank_linger_seconds); "
                   "no series otherwise.")
PROCESS_START = _m("process_start_time_seconds", "gauge", "seconds", R,
                   "Unix time the rank's process started (startup = first step minus this).")
RANK_GPU_INFO = _m("rank_gpu_info", "gauge", "info", R + ("gpu", "uuid"),
                   "The GPU a rank runs on (gpu: the agent's NVML index label, uuid: the device UUID); always 1. "
                   "Join GPU series to ranks with on(node, gpu).")
RANK_VERSIONS = _m("rank_versions_info", "gauge", "info", R + ("torch", "cuda", "nccl"),
                   "The rank's torch, CUDA runtime and NCCL versions, from its hello (empty: none, e.g. a CPU "
                   "build); always 1. Ranks of one job with different values run mixed builds.")
RANK_PARALLEL = _m("rank_parallel_info", "gauge", "info", R + ("strategy", "zero_stage"),
                   "How the rank's model is parallelized, from its hello: strategy (one of PARALLEL_STRATEGIES: "
                   "none, ddp, fsdp, deepspeed, pipeline; other for a value outside them) and zero_stage (DeepSpeed's "
                   "ZeRO stage 0-3, empty for the other strategies); always 1. No series until the rank knows its "
                   "model (watch() finds it at the end of the first step).")
GPU_TIMING_EVERY = _m("gpu_timing_every_steps", "gauge", "count", R,
                      "Steps per step timed with CUDA events, from the rank's hello (hooks.gpu_timing_every, or with "
                      "0 the mean gap the rank chose, sent again when it moves), for a rank that samples: one step in N on average (and at least one each "
                      "hooks.gpu_timing_seconds) is timed, and every step's forward, backward, optimizer, comm, "
                      "exposed comm and pipeline busy seconds are the shares of the GPU time over the timed steps "
                      "of the last 30 s (at most 1,024) times its own step time (estimates). No series for a rank that times every "
                      "step or has no CUDA; with hooks.gpu_timing_every 0 at a gap of 1 every step is timed but its "
                      "phases are still the timed steps' shares.")
DATALOADER_WORKERS_RSS = _m("dataloader_workers_rss_bytes", "gauge", "bytes", R,
                            "Total RSS of the rank's DataLoader worker processes.")

# ---------------------------------------------------------------- per node: GPU
GPU_UTILIZATION = _m("gpu_utilization_ratio", "gauge", "ratio", G + ("stat",),
                     "GPU utilization over the sampling window; stat=mean|min|max.")
GPU_UTILIZATION_SAMPLES = _m("gpu_utilization_samples", "histogram", "ratio", G,
                             "Raw NVML utilization samples (about 5 Hz on H200): a heatmap of the waveform.",
                             UTIL_BUCKETS)
GPU_SWINGS = _m("gpu_utilization_swings_total", "counter", "count", G,
                "High-to-low utilization crossings (sawtooth detector).")
GPU_BUSY_SECONDS = _m("gpu_busy_seconds_total", "counter", "seconds", G,
                      "Utilization integrated over time; rate() is the exact mean utilization.")
GPU_MEMORY_USED = _m("gpu_memory_used_bytes", "gauge", "bytes", G, "GPU memory used.")
GPU_MEMORY_TOTAL = _m("gpu_memory_total_bytes", "gauge", "bytes", G, "GPU memory total.")
GPU_TEMPERATURE = _m("gpu_temperature_celsius", "gauge", "celsius", G, "GPU temperature.")
GPU_POWER = _m("gpu_power_watts", "gauge", "watts", G, "GPU power draw.")
GPU_SM_CLOCK = _m("gpu_sm_clock_hertz", "gauge", "hertz", G, "GPU SM clock.")
GPU_CLOCKS_EVENT = _m("gpu_clocks_event_active", "gauge", "bool", G + ("reason",),
                      "1 while an NVML clocks-event (throttle) reason is active.")
GPU_PCIE_GEN = _m("gpu_pcie_link_generation", "gauge", "count", G + ("state",),
                  "PCIe link generation; state=current|max.")
GPU_PCIE_WIDTH = _m("gpu_pcie_link_width", "gauge", "count", G + ("state",), "PCIe link width; state=current|max.")
GPU_XID_ERRORS = _m("gpu_xid_errors_total", "counter", "count", G + ("xid",), "NVML XID critical errors by xid.")
GPU_SM_ACTIVE = _m("gpu_sm_active_ratio", "gauge", "ratio", G, "GPM SM activity (Hopper and newer).")
GPU_TENSOR_ACTIVE = _m("gpu_tensor_active_ratio", "gauge", "ratio", G, "GPM tensor-core activity (Hopper and newer).")
GPU_UP = _m("gpu_up", "gauge", "bool", G, "1 while NVML answers for this GPU.")
GPU_PEAK_FLOPS = _m("gpu_peak_flops", "gauge", "count", G + ("dtype",),
                    "Peak dense tensor-core FLOP/s of the GPU for dtype (agent.peak_flops_dtype), from the "
                    "agent's table by device name or its config; absent for a device it does not know.")
GPU_INFO = _m("gpu_info", "gauge", "info", G + ("name", "uuid", "driver"), "GPU identity; always 1.")

# ---------------------------------------------------------------- per node: network
NET_TCP_RETRANS = _m("net_tcp_retransmitted_segments_total", "counter", "count", N,
                     "TCP segments retransmitted (/proc/net/snmp Tcp RetransSegs).")
NET_TCP_SENT = _m("net_tcp_sent_segments_total", "counter", "count", N,
                  "TCP segments sent (/proc/net/snmp Tcp OutSegs).")
NET_TCP_IN_ERRORS = _m("net_tcp_in_errors_total", "counter", "count", N, "TCP segments received in error (InErrs).")
NET_TCP_EXT = _m("net_tcp_ext_total", "counter", "count", N + ("counter",),
                 "Selected /proc/net/netstat TcpExt counters (TCPLostRetransmit, TCPTimeouts, TCPSynRetrans).")
NET_IF_ERRORS = _m("net_interface_errors_total", "counter", "count", N + ("device", "direction"),
                   "Interface errors (/proc/net/dev); direction=receive|transmit.")
NET_IF_DROPS = _m("net_interface_drops_total", "counter", "count", N + ("device", "direction"),
                  "Interface drops (/proc/net/dev); direction=receive|transmit.")
NET_IF_BYTES = _m("net_interface_bytes_total", "counter", "bytes", N + ("device", "direction"),
                  "Interface bytes (/proc/net/dev); direction=receive|transmit.")
NET_IF_SPEED = _m("net_interface_speed_bytes", "gauge", "bytes", N + ("device",),
                  "Negotiated link speed in bytes/s (/sys/class/net/*/speed); absent when unknown.")
NET_IF_UP = _m("net_interface_up", "gauge", "bool", N + ("device",), "1 when operstate is up.")
NET_IF_CARRIER_CHANGES = _m("net_interface_carrier_changes_total", "counter", "count", N + ("device",),
                            "Link carrier up/down changes.")
RDMA_PORT_COUNTER = _m("rdma_port_counter_total", "counter", "count", N + ("device", "port", "counter"),
                       "RDMA port counters and hw_counters (/sys/class/infiniband).")
RDMA_PORT_RATE = _m("rdma_port_rate_bytes", "gauge", "bytes", N + ("device", "port"), "RDMA port rate in bytes/s.")
RDMA_PORT_UP = _m("rdma_port_up", "gauge", "bool", N + ("device", "port"), "1 when the RDMA port state is ACTIVE.")

# ---------------------------------------------------------------- per node: disk and self
DISK_FREE = _m("disk_free_bytes", "gauge", "bytes", N + ("path",), "Free bytes (available to non-root) under a watched path.")
DISK_TOTAL = _m("disk_total_bytes", "gauge", "bytes", N + ("path",), "Total bytes of the filesystem of a watched path.")
COLLECTOR_UP = _m("collector_up", "gauge", "bool", N + ("collector",), "1 when the collector's last run succeeded.")
COLLECTOR_DURATION = _m("collector_duration_seconds", "gauge", "seconds", N + ("collector",),
                        "Duration of the collector's last run.")
INGEST_DATAGRAMS = _m("ingest_datagrams_total", "counter", "count", N + ("result",),
                      "Datagrams received by the agent; result=ok|malformed|oversize|rejected|overflow.")
TRACKED_RANKS = _m("tracked_ranks", "gauge", "count", N, "Ranks currently tracked by the agent.")
END_WORKERS_REQUESTS = _m("end_workers_requests_total", "counter", "count", N + ("result",),
                          "Requests to end a job's workers on this node (POST /api/v1/ranks/end, from `ranksight "
                          "act`); result one of END_RESULTS: ok, or why nothing or not all was signalled.")
BUILD_INFO = _m("build_info", "gauge", "info", N + ("version", "python"), "ranksight agent build info; always 1.")

# ---------------------------------------------------------------- per rank: checkpoint in progress
CHECKPOINT_IN_PROGRESS = _m("checkpoint_in_progress_seconds", "gauge", "seconds", R,
                            "Seconds the rank has been inside its current checkpoint write (heartbeat phase=checkpoint); "
                            "0 when not writing. Lets RanksightCheckpointSlow fire during a long write.")

# ---------------------------------------------------------------- `ranksight act` (ranksight/tools/act.py)
ACTIONS_TOTAL = _m("actions_total", "counter", "count", ("verdict", "action", "result"),
                   "Verdicts `ranksight act` received and what came of each: verdict is the alert name, action the "
                   "triage entry's (page|restart_workers|drain_node|record_recovery), result one of ACT_RESULTS.",
                   source="act")
ACT_REJECTED = _m("act_requests_rejected_total", "counter", "count", ("reason",),
                  "Requests to `ranksight act` refused before any action: reason=unauthorized (no or a wrong bearer "
                  "token: a forged webhook)|malformed (not Alertmanager's webhook JSON).", source="act")


def by_name(name: str) -> Metric:
    short = name[len(PREFIX):] if name.startswith(PREFIX) else name
    return CATALOG[short]

# ---------------------------------------------------------------- RDMA counters exposed by default
# Values of the `counter` label of RDMA_PORT_COUNTER the agent exposes by default
# (agent.rdma_counters: curated): throughput, and the link-error and congestion
# counters the runbooks and dashboards name. Every other file under
# /sys/class/infiniband/<dev>/ports/<port>/{counters,hw_counters} stays readable on
# the node (`cat` it) or is exposed with agent.rdma_counters: all.
RDMA_CURATED_COUNTERS: Tuple[str, ...] = (
    # counters/ (IB PMA port counters)
    "link_downed", "link_error_recovery", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
    "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
    # hw_counters/ (mlx5: transport retries and RoCE congestion)
    "local_ack_timeout_err", "np_cnp_sent", "out_of_buffer", "out_of_sequence", "packet_seq_err",
    "rnr_nak_retry_err", "rp_cnp_handled",
)

# ---------------------------------------------------------------- goodput: the agent's lifecycle accounting
# (exporter/goodput.py). With the in-step counters above they split each rank's wall time; the
# recording rules of ranksight/triage/goodput.py join them per job.
GOODPUT_CATEGORIES: Tuple[str, ...] = ("productive", "data_wait", "exposed_comm", "checkpoint", "startup",
                                       "wasted_progress", "recovery", "stalled", "other")
BADPUT_AGENT_CATEGORIES: Tuple[str, ...] = ("startup", "wasted_progress", "recovery", "stalled")
OVERLAP_CATEGORIES: Tuple[str, ...] = ("productive", "data_wait", "exposed_comm")
RANK_WALL = _m("rank_wall_seconds_total", "counter", "seconds", R,
               "Wall time since the rank's first process started (across restarts of the same job and rank); "
               "stops growing when the rank finishes.")
BADPUT = _m("badput_seconds_total", "counter", "seconds", R + ("category",),
            "Lifecycle badput measured by the agent: category=startup (process start to its first step), "
            "wasted_progress (productive step time since the last checkpoint, lost at a disruption), recovery "
            "(a process's death to its successor's first step), stalled (alive, no progress).")
BADPUT_OVERLAP = _m("badput_overlap_seconds_total", "counter", "seconds", R + ("category",),
                    "The part of wasted_progress and stalled badput that also lies in an in-step counter, by that "
                    "counter: category=productive (step minus waits)|data_wait|exposed_comm. The goodput rules "
                    "subtract it so that no second counts twice.")

# ---------------------------------------------------------------- hooks label values: the parallel strategy
# strategy{} and zero_stage{} of ranksight_rank_parallel_info ("other" for a value outside them)
PARALLEL_STRATEGIES = ("none", "ddp", "fsdp", "deepspeed", "pipeline")
ZERO_STAGES = ("", "0", "1", "2", "3")

# ---------------------------------------------------------------- hooks label values: the lint ids
# lint{} of ranksight_lint_active: one module per id in ranksight.hooks.lints (the triage table's
# LINTS describes each). The stall reasons are in the exporter block below.
LINT_IO_AMPLIFICATION = "io_amplification"
LINT_SAMPLER_EPOCH = "sampler_epoch"
LINT_RANK_DISAGREEMENT = "rank_disagreement"
LINT_DATALOADER_WORKERS_RSS = "dataloader_workers_rss"
LINT_NUMA_BINDING = "numa_binding"
LINT_UNEVEN_LAST_BATCH = "uneven_last_batch"
LINT_INCOMPLETE_CHECKPOINT = "incomplete_checkpoint"
LINT_GLOBAL_BATCH_LR = "global_batch_lr"
LINT_DISK_HEADROOM = "disk_headroom"
LINT_PARTIAL_RESUME = "partial_resume"
LINT_IDS: Tuple[str, ...] = (LINT_IO_AMPLIFICATION, LINT_SAMPLER_EPOCH, LINT_RANK_DISAGREEMENT,
                             LINT_DATALOADER_WORKERS_RSS, LINT_NUMA_BINDING, LINT_UNEVEN_LAST_BATCH,
                             LINT_INCOMPLETE_CHECKPOINT, LINT_GLOBAL_BATCH_LR, LINT_DISK_HEADROOM,
                             LINT_PARTIAL_RESUME)

# ---------------------------------------------------------------- exporter label values: every value the agent's
# own labels take, spelled once (exporter/, ranksight/protocol.py and the tools use these).
INGEST_OK, INGEST_MALFORMED, INGEST_OVERSIZE, INGEST_REJECTED, INGEST_OVERFLOW = (
    "ok", "malformed", "oversize", "rejected", "overflow")
INGEST_RESULTS: Tuple[str, ...] = (INGEST_OK, INGEST_MALFORMED, INGEST_OVERSIZE, INGEST_REJECTED, INGEST_OVERFLOW)
# why a unix-socket record counted as rejected failed the sender check (exporter/ingest.py, its log line)
INGEST_FORGED_REASONS: Tuple[str, ...] = ("pid", "job", "nocred")
# collectors the agent can run, in the order it builds them (collector_up{collector}); agent.collectors
COLLECTOR_NAMES: Tuple[str, ...] = ("gpu", "network", "rdma", "disk", "ranks")
# rank_stalled{reason}: no step and no open collective (the culprit) | waiting in a collective on a peer
STALL_NO_PROGRESS, STALL_WAITING = "no_progress", "waiting_in_collective"
STALL_REASONS: Tuple[str, ...] = (STALL_NO_PROGRESS, STALL_WAITING)
# ranksight_actions_total{result}: what came of a verdict in `ranksight act`
ACT_RESULTS: Tuple[str, ...] = (
    "paged",          # an entry whose action is page, or a verdict in mode off
    "proposed",       # mode propose: the exact command logged, waiting for `ranksight act approve ID`
    "dry_run",        # approved or auto, act.dry_run on: the command logged, not run
    "done",           # the command ran and succeeded
    "failed",         # the command ran and failed
    "recovered",      # the job's ranks came back (after a restart, or a launcher's own recovery)
    "watching",       # record_recovery: the down rank is being watched until it comes back
    "duplicate",      # a repeat of a verdict the ledger already holds
    "resolved",       # the verdict's resolve arrived: nothing (more) is done for it
    "rate_limited",   # a drain over act.max_drains_per_hour
    "last_nodes",     # a drain that would leave a job fewer than act.job_min_nodes nodes
    "not_here",       # restart_workers, one fixed act.agent_url (a one-node setup): the culprit is not at that agent
)
ACT_REJECT_REASONS: Tuple[str, ...] = ("unauthorized", "malformed")
# ranksight_end_workers_requests_total{result}: the agent's answer to a request to end a job's workers
END_OK, END_UNAUTHORIZED, END_FORBIDDEN, END_DISABLED = "ok", "unauthorized", "forbidden", "disabled"
END_MALFORMED, END_NO_RANKS, END_FAILED = "malformed", "no_ranks", "failed"
END_RESULTS: Tuple[str, ...] = (
    END_OK,            # the job's workers were signalled
    END_UNAUTHORIZED,  # no or a wrong bearer token (401)
    END_FORBIDDEN,     # a client certificate without one of agent.act_client_sans, or plain HTTP from another host (403)
    END_DISABLED,      # the endpoint is not enabled on this agent (403)
    END_MALFORMED,     # not the request's JSON shape (400)
    END_NO_RANKS,      # no rank of the job on this node, or none of the requested pids is one (404, 409)
    END_FAILED,        # the signals failed (no permission, the processes already gone)
)
