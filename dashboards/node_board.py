"""The node dashboard: GPUs, NICs, RDMA, disks and the agent's own health."""
from __future__ import annotations

from typing import Any, Mapping

from ranksight import catalog as C
from ranksight import triage
from ranksight.catalog import Metric
from ranksight.triage import Entry
from .panels import (Board, K, NODE_OF_AGENT, Q, Threshold, bottom, heatmap_panel, one_node, rate, sel,
                     signal_description, table_panel, timeline, top, ts, worst)


# ---------------------------------------------------------------- node dashboard
# Counters the RDMA error panel names: each must be one the agent exposes (its curated allowlist).
RDMA_ERRORS_NAMED = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                     "port_xmit_discards", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err",
                     "rnr_nak_retry_err", "out_of_buffer")
RDMA_CONGESTION_NAMED = ("port_xmit_wait", "np_cnp_sent", "rp_cnp_handled")


def node_board(cfg: Mapping[str, Any]) -> Board:
    by = {e.id: e for e in triage.table(cfg)}  # triage entries by id
    b = Board("ranksight-node", "ranksight / Node",
              "Per-node view: the GPU utilization waveform, GPU health, PCIe, network, RDMA and disk of the "
              f"selected nodes, from the ranksight agent. Across many nodes each panel draws the {K} worst GPUs, "
              "devices or nodes, or only the abnormal ones; select nodes with the $node variable to see theirs.",
              node_query=NODE_OF_AGENT)
    _gpu_rows(b, cfg, by)
    _rank_memory_row(b, by)
    _pcie_row(b)
    _network_row(b, cfg, by)
    _rdma_row(b, cfg)
    _disk_and_agent_rows(b, by)
    return b


R = triage.REC
GPU = "{{node}} gpu {{gpu}}"  # the legend of a GPU's line
NODES = "select nodes with the $node variable to see those"


def _slow(cfg: Mapping[str, Any]) -> str:
    return cfg["durations"]["slow_rule_interval"]  # evaluation interval of the node-counter rules


def _gpu_rows(b: Board, cfg: Mapping[str, Any], by: Mapping[str, Entry]) -> None:
    """The GPU utilization waveform and GPU health rows."""
    t = cfg["thresholds"]
    gpu, gpus, slow = GPU, one_node("GPUs"), _slow(cfg)
    util = lambda s: sel(C.GPU_UTILIZATION, f'stat="{s}"')  # noqa: E731
    rows = b.row("GPU utilization waveform")
    saw = by["gpu-sawtooth"]
    rows += [
        ts(b.lay, "GPU utilization band (min / mean / max)",
           "Across the selected GPUs: the lowest window minimum, the mean and the highest window maximum of the "
           "NVML utilization samples. A wide band with a high max and a low min is a sawtooth: compute "
           "alternates with idle gaps. If wide, look at the dataloader wait share, then the exposed comm share.",
           "percentunit", [Q(f"min({util('min')})", "min"), Q(f"avg({util('mean')})", "mean"),
                           Q(f"max({util('max')})", "max")],
           band=("max", "min")),
        ts(b.lay, "GPU busy ratio by GPU",
           signal_description(saw, "The exact mean from the busy-seconds counter. "
                              + worst("GPUs", "lowest busy ratio", gpus)),
           "percentunit", [Q(bottom(sel(R["gpu_util"])), gpu)], threshold=Threshold(saw.threshold, "<")),
        heatmap_panel(b.lay, "GPU utilization samples",
                      "NVML utilization samples of the selected GPUs per second, by utilization bucket (summed "
                      f"per node by a recording rule every {slow}, so the picture lags by up to that). Two "
                      "bright bands (near 0 and near 100%) with little between is the sawtooth; one band near the "
                      "top is healthy. If two bands, look at the swings and the dataloader wait.",
                      "cps", [Q(f"sum by (le) ({sel(R['util_samples'])})", "{{le}}", fmt="heatmap")],
                      y_unit="percentunit"),
        ts(b.lay, "GPU utilization swings per minute",
           "High-to-low utilization crossings per minute, per GPU. If high together with a low busy ratio, "
           "compute is not overlapped with IO or communication (RanksightGpuSawtooth). "
           + worst("GPUs", "most swings", gpus), "cpm",
           [Q(top(sel(R["gpu_swings"])), gpu)], threshold=Threshold(t["gpu_swings_per_min"], ">")),
    ]
    rows = b.row("GPU health")
    rows += [
        ts(b.lay, "GPM SM and tensor activity",
           "GPM (Hopper and newer) SM activity and tensor-core activity. A busy ratio near 100% with low SM "
           "activity means the GPU is 'busy' with little work per kernel: look at kernel sizes and launch overhead. "
           + worst("GPUs", "lowest activity (each of SM and tensor)", gpus),
           "percentunit", [Q(bottom(sel(C.GPU_SM_ACTIVE)), gpu + " SM"),
                           Q(bottom(sel(C.GPU_TENSOR_ACTIVE)), gpu + " tensor")],
           w=8),
        timeline(b.lay, "Throttling reasons",
                 "Thermal and power clocks-event reasons active per GPU (1 = active; sw_power_cap, the power "
                 "limit, is shown but does not alert). If any is on for long, that GPU computes slower and its "
                 "rank becomes a straggler: look at cooling and power (RanksightGpuThrottling). Only active "
                 "reasons have a row.", "bool",
                 [Q(sel(R["throttled"]), gpu + " {{reason}}")], threshold=Threshold(1.0, ">"), w=8,
                 abnormal=True),
        ts(b.lay, "XID errors",
           "NVML XID critical errors per GPU and XID number in each interval, for the GPUs that had any. Any is "
           "serious: look at dmesg and NVIDIA's XID catalog (RanksightGpuXidError).", "short",
           [Q(f"{rate(C.GPU_XID_ERRORS, fn='increase')} > 0", gpu + " xid {{xid}}")],
           threshold=Threshold(1.0, ">"), w=8, abnormal=True),
        ts(b.lay, "GPU temperature", "GPU temperature. If high and throttling reasons are on, look at airflow. "
           + worst("GPUs", "highest temperature", gpus), "celsius", [Q(top(sel(C.GPU_TEMPERATURE)), gpu)], w=6),
        ts(b.lay, "GPU power", "GPU power draw. If flat at the cap with sw_power_cap active, the power limit "
           "holds clocks down. " + worst("GPUs", "highest draw", gpus), "watt",
           [Q(top(sel(C.GPU_POWER)), gpu)], w=6),
        ts(b.lay, "SM clock", "GPU SM clock. If it drops under load, look at the throttling reasons. "
           + worst("GPUs", "lowest clock", gpus), "hertz", [Q(bottom(sel(C.GPU_SM_CLOCK)), gpu)], w=6),
        ts(b.lay, "GPU memory used", "GPU memory used and total. If used is near total, expect allocator "
           "retries and OOMs. " + worst("GPUs", "most memory used (and their totals)", gpus), "bytes",
           [Q(top(sel(C.GPU_MEMORY_USED)), gpu + " used"),
            Q(f"{sel(C.GPU_MEMORY_TOTAL)} and on (node, gpu) {top(sel(C.GPU_MEMORY_USED))}", gpu + " total")],
           w=6),
    ]



def _rank_memory_row(b: Board, by: Mapping[str, Entry]) -> None:
    """Each rank's peak reserved CUDA memory against its GPU's total (RanksightMemoryNearOom)."""
    near = by["memory-near-oom"]
    who = "{{node}} rank {{rank}} ({{job}})"
    rows = b.row("GPU memory of the ranks")
    rows += [
        ts(b.lay, "Peak reserved share of each rank's GPU",
           signal_description(near, worst("ranks", "highest share", "select nodes with the $node variable (or a "
                                          "rank with $rank) to see theirs")),
           "percentunit", [Q(top(sel(R["mem_gpu_share"])), who)], threshold=Threshold(near.threshold, ">"), w=24),
    ]


def _pcie_row(b: Board) -> None:
    gpu = GPU

    def below_max(metric: Metric) -> str:
        current, most = sel(metric, 'state="current"'), sel(metric, 'state="max"')
        return f"{current} < ignoring (state) {most}"

    rows = b.row("PCIe link")
    rows += [
        ts(b.lay, "PCIe link generation (current / max)",
           "Current PCIe generation of the GPUs whose link runs below its max generation. If one is listed while "
           "the GPU is busy, the link trained down: look at the riser and slot (RanksightGpuPcieDegraded). Idle "
           "GPUs downshift on purpose.", "short", [Q(below_max(C.GPU_PCIE_GEN), gpu + " {{state}}")],
           abnormal=True),
        ts(b.lay, "PCIe link width (current / max)",
           "Current PCIe lane width of the GPUs whose link has fewer lanes than its max. If one is listed, the "
           "link lost lanes: reseat the GPU (RanksightGpuPcieDegraded).", "short",
           [Q(below_max(C.GPU_PCIE_WIDTH), gpu + " {{state}}")], abnormal=True),
    ]


def _network_row(b: Board, cfg: Mapping[str, Any], by: Mapping[str, Entry]) -> None:
    t = cfg["thresholds"]
    nodes, slow = NODES, _slow(cfg)
    ret = by["tcp-retransmits"]
    rows = b.row("Network")
    rows += [
        ts(b.lay, "TCP retransmit ratio", signal_description(ret, worst("nodes", "highest ratio", nodes)),
           "percentunit", [Q(top(sel(R["retrans"])), "{{node}}")], threshold=Threshold(ret.threshold, ">"), w=8),
        ts(b.lay, "TCP segments retransmitted and sent",
           "TCP segments retransmitted and sent per second, per node. If retransmits rise with sent flat, packets "
           f"are lost on the node's links. Lines: the {K} nodes retransmitting most and the {K} sending most; "
           "select nodes with the $node variable to see both lines of each.", "pps",
           [Q(top(rate(C.NET_TCP_RETRANS)), "{{node}} retransmitted"), Q(top(rate(C.NET_TCP_SENT)), "{{node}} sent")],
           w=8),
        ts(b.lay, "TCP loss counters",
           "Selected TcpExt counters per second (lost retransmits, timeouts, SYN retransmits). If timeouts rise, "
           "collectives stall for a retransmit timeout each time. " + worst("node counters", "highest rate", nodes),
           "cps", [Q(top(rate(C.NET_TCP_EXT)), "{{node}} {{counter}}")], w=8),
        ts(b.lay, "Interface errors and drops",
           "Errors and drops per second per node and direction, summed over its interfaces (/proc/net/dev; a "
           f"recording rule every {slow}). If non-zero, look at the cable, the transceiver and the switch port; "
           "the agent's /metrics has them per interface. "
           f"Lines: the {K} node directions with the most errors and the {K} with the most drops; {nodes}.", "cps",
           [Q(top(sel(R["if_errors"])), "{{node}} {{direction}} errors"),
            Q(top(sel(R["if_drops"])), "{{node}} {{direction}} drops")], w=8),
        ts(b.lay, "Interface throughput",
           "Bytes per second per node and direction, summed over its interfaces (a recording rule every "
           f"{slow}). If near the link speed, the link is saturated. "
           + worst("node directions", "most traffic", nodes), "Bps",
           [Q(top(sel(R["if_bytes"])), "{{node}} {{direction}}")], w=8),
        ts(b.lay, "NIC link speed",
           f"Negotiated link speed per interface. If low (below {t['nic_min_speed_bytes'] / 1e9:g} GB/s or below "
           "the highest seen), the link negotiated down: look at the cable and port (RanksightNicSpeedLow). "
           + worst("interfaces", "lowest speed", one_node("interfaces")), "Bps",
           [Q(bottom(sel(C.NET_IF_SPEED)), "{{node}} {{device}}")],
           threshold=Threshold(t["nic_min_speed_bytes"], "<"), w=8),
    ]


def _rdma_row(b: Board, cfg: Mapping[str, Any]) -> None:
    nodes, slow = NODES, _slow(cfg)
    rows = b.row("RDMA")
    rows += [
        ts(b.lay, "RDMA packets",
           "Packets received and transmitted per second per node, summed over its RDMA ports (port_rcv_packets, "
           f"port_xmit_packets; a recording rule every {slow}). If one node carries far less than its peers, "
           "traffic is falling back to another path. " + worst("node counters", "most packets", nodes), "pps",
           [Q(top(sel(R["rdma_packets"])), "{{node}} {{counter}}")], w=8),
        ts(b.lay, "RDMA error and congestion counters",
           "Every RDMA port and hardware counter that is not traffic, per second per node, summed over its "
           f"ports (a recording rule every {slow}): errors ({', '.join(RDMA_ERRORS_NAMED)}) and congestion "
           f"({', '.join(RDMA_CONGESTION_NAMED)}). If an error counter rises, look at the cable and the switch; "
           "CNPs and transmit wait mean congestion. " + worst("node counters", "highest rate", nodes), "cps",
           [Q(top(sel(R["rdma_errors"])), "{{node}} {{counter}}")], w=8),
        ts(b.lay, "RDMA port rate", "Port rate (bytes/s) per RDMA port. If below its peers, the port "
           "trained down. " + worst("ports", "lowest rate", one_node("ports")), "Bps",
           [Q(bottom(sel(C.RDMA_PORT_RATE)), "{{node}} {{device}}/{{port}}")], w=8),
    ]


def _disk_and_agent_rows(b: Board, by: Mapping[str, Entry]) -> None:
    """The disk row, and the ranks and agent row."""
    disk = by["disk-filling"]
    rows = b.row("Disk")
    rows += [
        ts(b.lay, "Disk free", "Free bytes of each watched path (tmp, log and checkpoint directories). If "
           "falling fast, checkpoints will fail: look at old checkpoints and caches. "
           + worst("paths", "least free space", one_node("paths")), "bytes",
           [Q(bottom(sel(C.DISK_FREE)), "{{node}} {{path}}")]),
        ts(b.lay, "Disk free share", signal_description(disk, worst("paths", "lowest free share",
                                                                    one_node("paths"))),
           "percentunit", [Q(bottom(sel(R["disk_free"])), "{{node}} {{path}}")],
           threshold=Threshold(disk.threshold, "<")),
    ]
    rows = b.row("Ranks and agent")
    rows += [
        table_panel(b.lay, "Ranks on these nodes",
                    "Ranks of the selected jobs on the selected nodes that are down now (0: three heartbeats "
                    "missed). If a rank is listed, look at the triage dashboard's row 6.", "bool",
                    [Q(f"max without () ({sel(C.RANK_UP)}) == 0", instant=True, fmt="table")],
                    columns=[("Value", "up", "bool")], hide=("Time", "instance"), w=8, abnormal=True),
        timeline(b.lay, "Collectors up",
                 "Each agent collector's lowest state across the selected nodes (1 = its last run succeeded on "
                 "every node). If one is down, its signals are missing: select nodes with the $node variable to "
                 "find where, and the agent's log says why (RanksightCollectorDown).", "bool",
                 [Q(f"min by (collector) ({sel(C.COLLECTOR_UP)})", "{{collector}}")],
                 threshold=Threshold(1.0, "<"), w=8),
        ts(b.lay, "Agent ingest",
           "Datagrams per second the agents of the selected nodes received, by result (a recording rule per "
           "node). If anything but ok is non-zero, hooks and agent disagree (version) or the rank cap is hit "
           "(RanksightIngestDropping): select nodes with the $node variable to find where.", "cps",
           [Q(f"sum by (result) ({sel(R['ingest'])})", "{{result}}")], w=8),
    ]
