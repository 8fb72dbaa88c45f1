"""The scale benchmark's scenario: the fleet shape, the label values a DGX-class node's agent exposes, the job."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

from ranksight import catalog as C


log = logging.getLogger(__name__)

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
AGENT_PORT = 9945

BACKFILL_CPU_S_PER_SAMPLE = 4.5e-6  # generation + promtool (reads its input twice), per sample, one core
TARGET_QUERY_S = 1.0
TARGET_RULE_GROUP_S = 5.0
TARGET_SERIES_PER_NODE = 1550  # 8 ranks x ~111 series (the memory peaks, resume, total steps and strategy included), 8 GPUs, the node

# Label values the agent's collectors produce: the catalog's sets; the TCP counters are the
# network collector's (tests/integration/test_scale.py checks them against it).
STALL_REASONS = C.STALL_REASONS
INGEST_RESULTS = C.INGEST_RESULTS
TCP_EXT_COUNTERS = ("TCPLostRetransmit", "TCPTimeouts", "TCPSynRetrans")
COLLECTORS = C.COLLECTOR_NAMES
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
    lint applies); all-series: every RDMA counter file (agent.rdma_counters: all) and a 0/1 series
    per lint checked, 1,747 series per node."""
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


