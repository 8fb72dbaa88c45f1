"""Collectors on fixture trees (node_exporter's real-world /proc and /sys, this machine's
/proc/net), on the live /proc, and the GPU collector on the NVML stand-in fed with real H200
traces. Every exposed value is checked against the file it came from, parsed here
independently of the collector's parser."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from ranksight import catalog as C
from ranksight.exporter.agent import Agent, AgentSettings
from ranksight.exporter.collectors import CollectorError, PartialError
from ranksight.exporter.collectors.disk import DiskCollector
from ranksight.exporter.collectors.gpu import GpuCollector
from ranksight.exporter.collectors.network import NetworkCollector
from ranksight.exporter.collectors.rdma import RdmaCollector
from ranksight.exporter.exposition import TextWriter
from support.nvml_standin import NvmlStandin
from ranksight.triage import CLOCK_EVENT_REASONS

from test_exporter_helpers import LOCAL, NE, started, agent_cmd, free_port, http_get, one, parse, scrape, series, \
    trace, wait_for

NODE = "n1"


def exposed(fams) -> Dict:
    """Render families with the agent's writer, parse them back with prometheus_client's parser."""
    return parse(TextWriter().render(fams).decode())


def collect(c) -> Tuple[Dict, bool]:
    try:
        return exposed(c.collect()), True
    except PartialError as e:
        return exposed(e.families), False


# ---------------------------------------------------------------- independent parsers
def table_file(path: Path) -> Dict[str, Dict[str, int]]:
    """'Sec: names' / 'Sec: values' line pairs, parsed with a regex (not the collector's code)."""
    out: Dict[str, Dict[str, int]] = {}
    lines = path.read_text().split("\n")
    for i in range(0, len(lines) - 1, 2):
        m1 = re.match(r"(\w+): (.*)", lines[i])
        m2 = re.match(r"(\w+): (.*)", lines[i + 1])
        if m1 and m2:
            out[m1.group(1)] = dict(zip(m1.group(2).split(" "), map(int, m2.group(2).split(" "))))
    return out


def dev_file(path: Path) -> Dict[str, List[int]]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*([^:\s]+):\s*(.*)", line)
        if m and not line.startswith("Inter") and "|" not in line:
            out[m.group(1)] = [int(x) for x in m.group(2).split()]
    return out


def sys_net(sysfs: Path) -> Dict[str, Dict[str, str]]:
    out = {}
    base = sysfs / "class" / "net"
    for entry in sorted(base.iterdir()):
        real = Path(os.path.realpath(entry))
        if not real.is_dir():
            continue
        vals = {}
        for f in ("speed", "operstate", "carrier_changes"):
            try:
                vals[f] = (real / f).read_text().strip()
            except OSError:
                pass
        out[entry.name] = vals
    return out


def expected_network(procfs: Path, sysfs: Path, exclude=re.compile(r"^(lo|veth.*|docker.*|br-.*|virbr.*)$")):
    exp: Dict = {}
    nl = ("node", NODE)
    snmp = table_file(procfs / "net" / "snmp")["Tcp"]
    exp[(C.NET_TCP_RETRANS.name, frozenset([nl]))] = snmp["RetransSegs"]
    exp[(C.NET_TCP_SENT.name, frozenset([nl]))] = snmp["OutSegs"]
    exp[(C.NET_TCP_IN_ERRORS.name, frozenset([nl]))] = snmp["InErrs"]
    ext = table_file(procfs / "net" / "netstat")["TcpExt"]
    for k in ("TCPLostRetransmit", "TCPTimeouts", "TCPSynRetrans"):
        if k in ext:
            exp[(C.NET_TCP_EXT.name, frozenset([nl, ("counter", k)]))] = ext[k]
    if (procfs / "net" / "dev").exists():
        for dev, v in dev_file(procfs / "net" / "dev").items():
            if exclude.match(dev):
                continue
            for direction, (b, err, drop) in (("receive", (0, 2, 3)), ("transmit", (8, 10, 11))):
                lab = frozenset([nl, ("device", dev), ("direction", direction)])
                exp[(C.NET_IF_BYTES.name, lab)] = v[b]
                exp[(C.NET_IF_ERRORS.name, lab)] = v[err]
                exp[(C.NET_IF_DROPS.name, lab)] = v[drop]
    for dev, v in sys_net(sysfs).items():
        if exclude.match(dev):
            continue
        lab = frozenset([nl, ("device", dev)])
        if "speed" in v and int(v["speed"]) > 0:
            exp[(C.NET_IF_SPEED.name, lab)] = int(v["speed"]) * 1_000_000 / 8
        if "operstate" in v:
            exp[(C.NET_IF_UP.name, lab)] = 1.0 if v["operstate"] == "up" else 0.0
        if "carrier_changes" in v:
            exp[(C.NET_IF_CARRIER_CHANGES.name, lab)] = int(v["carrier_changes"])
    return exp


# ---------------------------------------------------------------- network
def test_network_local_proc_and_node_exporter_sys_every_value_matches():
    c = NetworkCollector(NODE, str(LOCAL / "proc"), str(NE / "sys"))
    got, up = collect(c)
    assert up
    exp = expected_network(LOCAL / "proc", NE / "sys")
    assert got == exp
    # spot checks against literal values (tests/fixtures/local/proc/net/snmp "Tcp:" line, and
    # tests/fixtures/node_exporter/sys/class/net/*): eth0 is a symlink into sys/devices, bond0 says -1
    assert got[(C.NET_TCP_RETRANS.name, frozenset([("node", NODE)]))] == 21
    assert got[(C.NET_TCP_SENT.name, frozenset([("node", NODE)]))] == 9601
    assert one(got, C.NET_IF_SPEED.name, device="eth0") == 125_000_000
    assert not series(got, C.NET_IF_SPEED.name, device="bond0"), "speed -1 must be absent, not 0"
    assert not series(got, C.NET_IF_ERRORS.name, device="lo"), "lo is excluded by default"


def test_network_node_exporter_tree_without_net_dev_is_partial():
    c = NetworkCollector(NODE, str(NE / "proc"), str(NE / "sys"))
    got, up = collect(c)
    assert not up, "node_exporter's fixture has no proc/net/dev: the collector must say it is not whole"
    assert got == expected_network(NE / "proc", NE / "sys")
    # literal values: tests/fixtures/node_exporter/proc/net/snmp Tcp RetransSegs 227, OutSegs 54915039, InErrs 5;
    # proc/net/netstat TcpExt TCPLostRetransmit 0, TCPTimeouts 115, no TCPSynRetrans column
    assert one(got, C.NET_TCP_RETRANS.name) == 227
    assert one(got, C.NET_TCP_SENT.name) == 54915039
    assert one(got, C.NET_TCP_IN_ERRORS.name) == 5
    assert one(got, C.NET_TCP_EXT.name, counter="TCPTimeouts") == 115
    assert one(got, C.NET_TCP_EXT.name, counter="TCPLostRetransmit") == 0
    assert not series(got, C.NET_TCP_EXT.name, counter="TCPSynRetrans")
    assert set(dict(k)["device"] for k in series(got, C.NET_IF_UP.name)) == {"bond0", "dmz", "eth0", "int"}


def test_network_interface_filter_from_config():
    got, _ = collect(NetworkCollector(NODE, str(LOCAL / "proc"), str(NE / "sys"), include=r"^(eth|dmz)", exclude=r"^dmz$"))
    devices = {dict(k)["device"] for n, k in got if n in (C.NET_IF_UP.name, C.NET_IF_ERRORS.name)}
    assert devices == {"eth0"}


def test_network_on_live_proc():
    """The live /proc: counters only grow, so the exposed value lies between two reads of the file."""
    proc = Path("/proc")
    before = table_file(proc / "net" / "snmp")["Tcp"]
    got, up = collect(NetworkCollector(NODE, "/proc", "/sys"))
    after = table_file(proc / "net" / "snmp")["Tcp"]
    assert up
    for m, k in ((C.NET_TCP_SENT, "OutSegs"), (C.NET_TCP_RETRANS, "RetransSegs")):
        assert before[k] <= one(got, m.name) <= after[k]
    for dev in dev_file(proc / "net" / "dev"):
        if dev != "lo":
            assert series(got, C.NET_IF_BYTES.name, device=dev, direction="receive")
    assert not series(got, C.NET_IF_BYTES.name, device="lo")


def test_network_missing_everything_is_down_not_a_crash(tmp_path):
    got, up = collect(NetworkCollector(NODE, str(tmp_path), str(tmp_path)))
    assert not up
    assert not [k for k in got if k[0] != C.NET_TCP_EXT.name]


# ---------------------------------------------------------------- rdma
def expected_rdma(sysfs: Path) -> Dict:
    """Every numeric counters/ and hw_counters/ file of every port, plus rate and state, read here
    independently of the collector (a hw_counters file named like a counters file is hw_<name>)."""
    base = sysfs / "class" / "infiniband"
    exp = {}
    for dev in base.iterdir():
        for port in (dev / "ports").iterdir():
            lab = [("node", NODE), ("device", dev.name), ("port", port.name)]
            plain = {f.name for f in (port / "counters").iterdir()} if (port / "counters").is_dir() else set()
            for sub in ("counters", "hw_counters"):
                if (port / sub).is_dir():
                    for f in (port / sub).iterdir():
                        text = f.read_text().strip()
                        if text.isdigit():  # "N/A (no PMA)" files are skipped
                            name = "hw_" + f.name if sub == "hw_counters" and f.name in plain else f.name
                            exp[(C.RDMA_PORT_COUNTER.name, frozenset(lab + [("counter", name)]))] = int(text)
            m = re.match(r"(\d+) Gb/sec", (port / "rate").read_text())
            exp[(C.RDMA_PORT_RATE.name, frozenset(lab))] = int(m.group(1)) * 1e9 / 8
            exp[(C.RDMA_PORT_UP.name, frozenset(lab))] = 1.0 if "ACTIVE" in (port / "state").read_text() else 0.0
    return exp


def only_counters(exp: Dict, names) -> Dict:
    """``exp`` without the counter series whose counter label is not in ``names``."""
    return {k: v for k, v in exp.items() if k[0] != C.RDMA_PORT_COUNTER.name or dict(k[1])["counter"] in names}


def counter_names(got: Dict, **match: str) -> Dict[str, float]:
    return {dict(k)["counter"]: v for k, v in series(got, C.RDMA_PORT_COUNTER.name, **match).items()}


def mlx5_tree(root: Path, ports: int = 2) -> Path:
    """An mlx5 HCA as the kernel lays it out (counters: the IB PMA port counters; hw_counters:
    drivers/infiniband/hw/mlx5/counters.c), every file a distinct value."""
    from ranksight.tools.bench import load
    scale = load("scale")

    n = 0
    for i in range(ports):
        port = root / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        for sub, names in (("counters", scale.IB_PORT_COUNTERS), ("hw_counters", scale.MLX5_HW_COUNTERS)):
            (port / sub).mkdir(parents=True)
            for name in names:
                n += 1
                (port / sub / name).write_text(f"{1000 + n}\n")
        (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
        (port / "state").write_text("4: ACTIVE\n")
    return root


def test_rdma_node_exporter_tree_every_value_matches():
    exp = expected_rdma(NE / "sys")
    got, up = collect(RdmaCollector(NODE, str(NE / "sys"), counters="all"))
    assert up
    assert got == exp
    # literal values from tests/fixtures/node_exporter/sys/class/infiniband/mlx4_0/ports/1/{rate,counters/...}
    assert one(got, C.RDMA_PORT_RATE.name, device="mlx4_0", port="1") == 5e9  # "40 Gb/sec (4X QDR)"
    assert one(got, C.RDMA_PORT_COUNTER.name, device="mlx4_0", port="1", counter="port_xmit_wait") == 4294967295
    assert one(got, C.RDMA_PORT_COUNTER.name, device="mlx4_0", port="1", counter="unicast_rcv_packets") == 61148
    assert one(got, C.RDMA_PORT_RATE.name, device="i40iw0", port="1") == 1.25e9  # "10 Gb/sec (4X)"
    assert not series(got, C.RDMA_PORT_COUNTER.name, counter="port_rcv_data_64"), "counters_ext is not read"
    # the default (agent.rdma_counters: curated): the same values, only the allowlisted counters
    cur, up = collect(RdmaCollector(NODE, str(NE / "sys")))
    assert up
    assert cur == only_counters(exp, C.RDMA_CURATED_COUNTERS)
    assert set(counter_names(cur, device="mlx4_0", port="1")) == {
        "link_downed", "link_error_recovery", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
        "port_xmit_data", "port_xmit_discards", "port_xmit_packets", "port_xmit_wait"}
    assert len(series(cur, C.RDMA_PORT_COUNTER.name)) < len(series(got, C.RDMA_PORT_COUNTER.name))


def test_rdma_curated_all_and_a_list_on_mlx5_ports(tmp_path, caplog):
    root = mlx5_tree(tmp_path)
    exp = expected_rdma(root)
    got, up = collect(RdmaCollector(NODE, str(root), counters="all"))
    assert up and got == exp
    for dev in ("mlx5_0", "mlx5_1"):
        assert len(counter_names(got, device=dev)) == 51  # 21 counters + 30 hw_counters, no collisions on mlx5
    cur, up = collect(RdmaCollector(NODE, str(root), counters="curated"))
    assert up and cur == only_counters(exp, C.RDMA_CURATED_COUNTERS)
    for dev in ("mlx5_0", "mlx5_1"):
        assert set(counter_names(cur, device=dev)) == set(C.RDMA_CURATED_COUNTERS)  # every one exists on mlx5
    assert len(C.RDMA_CURATED_COUNTERS) == 17
    # the dashboards' RDMA packets panel and the error/congestion panel still have their inputs
    assert {"port_rcv_packets", "port_xmit_packets", "symbol_error", "np_cnp_sent"} <= set(counter_names(cur))
    pick = ["np_ecn_marked_roce_packets", "symbol_error", "no_such_counter"]
    c = RdmaCollector(NODE, str(root), counters=pick)
    with caplog.at_level(logging.WARNING, logger="ranksight.exporter.rdma"):
        lst, up = collect(c)
        collect(c)
    assert up and lst == only_counters(exp, pick)
    typo = [r.getMessage() for r in caplog.records if "rdma_counters" in r.getMessage()]
    assert typo == ["agent.rdma_counters names counters no RDMA port has: no_such_counter"]  # once, not per scrape
    assert set(counter_names(lst)) == {"np_ecn_marked_roce_packets", "symbol_error"}
    assert one(lst, C.RDMA_PORT_COUNTER.name, device="mlx5_1", counter="symbol_error") == \
        int((root / "class/infiniband/mlx5_1/ports/1/counters/symbol_error").read_text())


def test_rdma_hw_counters_and_odd_files(tmp_path):
    """A tree written from the kernel's documented layout (Documentation/ABI/stable/sysfs-class-infiniband)."""
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    (port / "rate").write_text("100 Gb/sec (4X EDR)\n")
    (port / "state").write_text("1: DOWN\n")
    (port / "counters" / "symbol_error").write_text("7\n")
    (port / "counters" / "link_downed").write_text("3\n")
    (port / "counters" / "unsupported").write_text("N/A\n")
    (port / "counters" / "port_rcv_errors").write_text("N/A (no PMA)\n")
    (port / "hw_counters" / "out_of_buffer").write_text("11\n")
    (port / "hw_counters" / "link_downed").write_text("4\n")  # collides with counters/link_downed
    (port / "hw_counters" / "port_rcv_errors").write_text("9\n")  # collides with an unreadable counters file
    got, up = collect(RdmaCollector(NODE, str(tmp_path), counters="all"))
    assert up
    # the label depends on the file names, not on what a file holds: hw_port_rcv_errors even though
    # counters/port_rcv_errors is N/A
    assert counter_names(got) == {"symbol_error": 7, "link_downed": 3, "out_of_buffer": 11, "hw_link_downed": 4,
                                  "hw_port_rcv_errors": 9}
    assert one(got, C.RDMA_PORT_RATE.name) == 12.5e9
    assert one(got, C.RDMA_PORT_UP.name) == 0.0
    cur, _ = collect(RdmaCollector(NODE, str(tmp_path)))
    assert counter_names(cur) == {"symbol_error": 7, "link_downed": 3, "out_of_buffer": 11}
    lst, _ = collect(RdmaCollector(NODE, str(tmp_path), counters=["hw_link_downed", "unsupported"]))
    assert counter_names(lst) == {"hw_link_downed": 4}
    assert one(lst, C.RDMA_PORT_UP.name) == 0.0  # rate and state whatever the allowlist
    with pytest.raises(ValueError, match="expected curated, all or a list"):
        RdmaCollector(NODE, str(tmp_path), counters="some")


def _run_agent(args, env=None):
    e = dict(os.environ, **(env or {}))
    r = subprocess.run(agent_cmd(*args), capture_output=True, text=True, timeout=30, env=e)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return r.returncode, lines, r.stderr


def test_rdma_counters_bad_values_exit_2(tmp_path):
    """`ranksight exporter` refuses a bad agent.rdma_counters with one line and exit 2, from a file or the env."""
    cfg = tmp_path / "agent.yml"
    for text in ("agent:\n  rdma_counters: port rcv data\n", "agent:\n  rdma_counters: curated,all\n", "agent:\n  rdma_counters: [symbol_error, 5]\n",
                 "agent:\n  rdma_counters: []\n", "agent:\n  rdma_counters: [all, symbol_error]\n",
                 "agent:\n  rdma_counters: {symbol_error: 1}\n"):
        cfg.write_text(text)
        rc, lines, err = _run_agent(["--config", str(cfg), "--listen", "127.0.0.1:0", "--ingest", "udp://127.0.0.1:0"])
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (text, err)
        assert "agent.rdma_counters" in lines[0] and "expected curated, all or a list" in lines[0], lines
    rc, lines, err = _run_agent(["--listen", "127.0.0.1:0", "--ingest", "udp://127.0.0.1:0"],
                                {"RANKSIGHT__agent__rdma_counters": "symbol_error,port rcv"})
    assert rc == 2 and len(lines) == 1 and "agent.rdma_counters" in lines[0], err


def test_rdma_counters_config_values():
    from ranksight import config as cfgmod

    assert cfgmod.load(env={})["agent"]["rdma_counters"] == "curated"
    assert cfgmod.load(env={"RANKSIGHT__agent__rdma_counters": "all"})["agent"]["rdma_counters"] == "all"
    got = cfgmod.load(env={"RANKSIGHT__agent__rdma_counters": " symbol_error, hw_link_downed,symbol_error"})
    assert got["agent"]["rdma_counters"] == ["symbol_error", "hw_link_downed"]


def test_real_agent_exposes_the_curated_rdma_counters(tmp_path):
    """The real agent process, scraped over HTTP, on an mlx5 tree: the default exposes the allowlist only."""
    root = mlx5_tree(tmp_path / "sys", ports=3)
    port = free_port()
    p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", "udp://127.0.0.1:0", "--collectors", "rdma",
                       "--sysfs", str(root), "--node", NODE), tmp_path / "agent.log")
    try:
        got = wait_for(lambda: (lambda g: g if series(g, C.RDMA_PORT_COUNTER.name) else None)(
            parse(http_get(f"http://127.0.0.1:{port}/metrics"))), 20, "RDMA series on /metrics")
    finally:
        p.stop()
    assert one(got, C.COLLECTOR_UP.name, collector="rdma") == 1
    exp = only_counters(expected_rdma(root), C.RDMA_CURATED_COUNTERS)
    rdma = {k: v for k, v in got.items() if k[0].startswith("ranksight_rdma_")}
    assert rdma == exp and len(series(rdma, C.RDMA_PORT_COUNTER.name)) == 3 * 17


def test_rdma_absent_is_collector_down(tmp_path):
    with pytest.raises(CollectorError, match="no RDMA devices"):
        RdmaCollector(NODE, str(tmp_path)).collect()


# ---------------------------------------------------------------- disk
def test_disk_watched_paths_reported_dirs_and_missing_ones(tmp_path):
    ck = tmp_path / "ckpt" / "not-yet"
    c = DiskCollector(NODE, [str(tmp_path)], reported=lambda: {str(ck)})
    got, up = collect(c)
    assert up
    st = os.statvfs(tmp_path)
    for path in (str(tmp_path), str(ck)):  # ck does not exist yet: measured on its nearest parent
        assert one(got, C.DISK_TOTAL.name, path=path) == st.f_blocks * st.f_frsize
        free = one(got, C.DISK_FREE.name, path=path)
        assert abs(free - st.f_bavail * st.f_frsize) < 64 << 20  # other tests write meanwhile
    import tempfile

    assert series(got, C.DISK_FREE.name, path=tempfile.gettempdir())


# ---------------------------------------------------------------- gpu on the NVML stand-in
class FakeClock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Spy:
    """Wraps the stand-in and records every utilization sample it returned to the collector."""

    def __init__(self, nv: NvmlStandin):
        self.nv = nv
        self.returned: Dict[int, List[Tuple[int, int]]] = {}

    def __getattr__(self, name):
        return getattr(self.nv, name)

    def nvmlDeviceGetSamples(self, h, kind, ts):
        vt, samples = self.nv.nvmlDeviceGetSamples(h, kind, ts)
        self.returned.setdefault(h.index, []).extend((s.timeStamp, s.sampleValue.uiVal) for s in samples)
        return vt, samples


def run_gpu(seconds: int, traces=("steady", "sawtooth", "idle"), state_seconds: float = 1.0):
    clock = FakeClock()
    spy = Spy(NvmlStandin(count=len(traces), traces=traces, clock=clock))
    gc = GpuCollector(NODE, poll_seconds=1.0, window_seconds=15.0, swing_high=0.8, swing_low=0.5, nvml=spy,
                      state_seconds=state_seconds, clock=clock)
    gc.start(threads=False)
    for _ in range(seconds):
        clock.t += 1.0
        gc.poll()
    return gc, spy, clock


def test_gpu_waveform_matches_the_samples_nvml_returned():
    gc, spy, clock = run_gpu(40)
    got = exposed(gc.collect())
    for i in range(3):
        samples = spy.returned[i]
        ts = [t for t, _ in samples]
        assert ts == sorted(set(ts)), "each sample once, in order"
        utils = [v / 100 for _, v in samples]
        lab = {"gpu": str(i)}
        # histogram of every raw sample
        counts = series(got, C.GPU_UTILIZATION_SAMPLES.name + "_bucket", **lab)
        for labels, v in counts.items():
            le = float(dict(labels)["le"])
            assert v == sum(1 for u in utils if u <= le)
        assert one(got, C.GPU_UTILIZATION_SAMPLES.name + "_count", **lab) == len(utils)
        assert one(got, C.GPU_UTILIZATION_SAMPLES.name + "_sum", **lab) == pytest.approx(sum(utils))
        # busy seconds: each sample's utilization times the time since the previous one
        busy = sum(u * (t2 - t1) / 1e6 for (t1, _), (t2, u) in zip(samples, [(t, v / 100) for t, v in samples][1:]))
        assert one(got, C.GPU_BUSY_SECONDS.name, **lab) == pytest.approx(busy)
        # window: the samples within 15 s of the newest
        last = ts[-1]
        win = [v / 100 for t, v in samples if t > last - 15_000_000]
        assert one(got, C.GPU_UTILIZATION.name, stat="mean", **lab) == pytest.approx(sum(win) / len(win))
        assert one(got, C.GPU_UTILIZATION.name, stat="min", **lab) == min(win)
        assert one(got, C.GPU_UTILIZATION.name, stat="max", **lab) == max(win)
        # swings: >= 0.8 arms, a later <= 0.5 counts
        swings, armed = 0, False
        for u in utils:
            if u >= 0.8:
                armed = True
            elif armed and u <= 0.5:
                swings, armed = swings + 1, False
        assert one(got, C.GPU_SWINGS.name, **lab) == swings


def test_gpu_steady_and_sawtooth_tell_apart():
    """The recorded H200 loads, judged with the triage thresholds: sawtooth = mean < 0.8 and
    >= 6 swings/min; steady has neither."""
    gc, spy, clock = run_gpu(60)
    got = exposed(gc.collect())
    span = {i: (spy.returned[i][-1][0] - spy.returned[i][0][0]) / 60e6 for i in range(3)}  # minutes
    steady_rate = one(got, C.GPU_BUSY_SECONDS.name, gpu="0") / (span[0] * 60)
    saw_rate = one(got, C.GPU_BUSY_SECONDS.name, gpu="1") / (span[1] * 60)
    assert steady_rate > 0.95
    assert saw_rate < 0.8
    assert one(got, C.GPU_SWINGS.name, gpu="0") == 0
    assert one(got, C.GPU_SWINGS.name, gpu="1") / span[1] >= 6
    assert one(got, C.GPU_SWINGS.name, gpu="2") == 0
    assert one(got, C.GPU_UTILIZATION.name, gpu="2", stat="max") <= 0.01


def test_gpu_device_state_matches_the_trace():
    gc, spy, clock = run_gpu(3)
    got = exposed(gc.collect())
    st = trace()["static"]
    for i in range(3):
        lab = {"gpu": str(i)}
        assert one(got, C.GPU_UP.name, **lab) == 1
        assert one(got, C.GPU_MEMORY_TOTAL.name, **lab) == st["memory_total_bytes"]
        assert one(got, C.GPU_TEMPERATURE.name, **lab) == st["temperature_c"]
        assert one(got, C.GPU_POWER.name, **lab) == st["power_mw"] / 1000
        assert one(got, C.GPU_SM_CLOCK.name, **lab) == st["sm_clock_mhz"] * 1e6
        assert one(got, C.GPU_PCIE_GEN.name, state="current", **lab) == st["pcie_gen_current"]
        assert one(got, C.GPU_PCIE_GEN.name, state="max", **lab) == st["pcie_gen_max"]
        assert one(got, C.GPU_PCIE_WIDTH.name, state="current", **lab) == st["pcie_width_current"]
        assert one(got, C.GPU_PCIE_WIDTH.name, state="max", **lab) == st["pcie_width_max"]
        reasons = series(got, C.GPU_CLOCKS_EVENT.name, **lab)
        assert {dict(k)["reason"]: v for k, v in reasons.items()} == {
            r: float(bool(st["clocks_event_reasons"] & bit)) for bit, r in CLOCK_EVENT_REASONS.items()}
        info = series(got, C.GPU_INFO.name, **lab)
        assert {dict(k)["name"] for k in info} == {trace()["gpu"]}
        assert {dict(k)["driver"] for k in info} == {trace()["driver"]}
    # GPM: recorded under the steady load only (GPU 0 plays "steady"); absent elsewhere
    assert one(got, C.GPU_SM_ACTIVE.name, gpu="0") == pytest.approx(st["gpm_steady"]["sm_util"] / 100)
    assert one(got, C.GPU_TENSOR_ACTIVE.name, gpu="0") == pytest.approx(st["gpm_steady"]["tensor_util"] / 100)
    assert not series(got, C.GPU_SM_ACTIVE.name, gpu="1")


def test_gpu_state_is_read_every_state_seconds_and_the_samples_every_poll():
    calls: Dict[str, int] = {}

    class Counting(Spy):
        def __getattr__(self, name):
            fn = getattr(self.nv, name)
            if not (name.startswith("nvmlDevice") and callable(fn)):
                return fn

            def counted(*a, **k):
                calls[name] = calls.get(name, 0) + 1
                return fn(*a, **k)
            return counted

        def nvmlDeviceGetSamples(self, h, kind, ts):
            calls["nvmlDeviceGetSamples"] = calls.get("nvmlDeviceGetSamples", 0) + 1
            return super().nvmlDeviceGetSamples(h, kind, ts)

    clock = FakeClock()
    spy = Counting(NvmlStandin(count=1, traces=("steady",), clock=clock))
    gc = GpuCollector(NODE, poll_seconds=1.0, nvml=spy, state_seconds=5.0, clock=clock)
    gc.start(threads=False)  # its first pass reads everything
    calls.clear()
    for _ in range(20):
        clock.t += 1.0
        gc.poll()
    assert calls["nvmlDeviceGetSamples"] == 20
    assert calls["nvmlDeviceGetTemperature"] == calls["nvmlDeviceGetCurrPcieLinkWidth"] == 4  # at 5, 10, 15, 20 s
    assert "nvmlDeviceGetMaxPcieLinkWidth" not in calls, "the link's maximum is read once"
    got = exposed(gc.collect())
    st = trace()["static"]
    assert one(got, C.GPU_PCIE_WIDTH.name, state="max", gpu="0") == st["pcie_width_max"]
    assert one(got, C.GPU_TEMPERATURE.name, gpu="0") == st["temperature_c"]
    assert one(got, C.GPU_SM_ACTIVE.name, gpu="0") == pytest.approx(st["gpm_steady"]["sm_util"] / 100)
    # the waveform still sees every sample: 20 s of the steady trace's ~5 samples a second
    assert len(spy.returned[0]) >= 90


def test_gpu_lost_marks_only_that_gpu():
    gc, spy, clock = run_gpu(2)
    spy.nv.lose(1)
    clock.t += 1
    gc.poll()
    got = exposed(gc.collect())
    assert one(got, C.GPU_UP.name, gpu="1") == 0
    assert not series(got, C.GPU_TEMPERATURE.name, gpu="1")
    assert series(got, C.GPU_BUSY_SECONDS.name, gpu="1"), "counters stay"
    assert one(got, C.GPU_UP.name, gpu="0") == 1 and one(got, C.GPU_UP.name, gpu="2") == 1
    spy.nv.restore(1)
    clock.t += 1
    gc.poll()
    assert one(exposed(gc.collect()), C.GPU_UP.name, gpu="1") == 1


def test_gpu_xid_thread_counts_and_stops_cleanly():
    nv = NvmlStandin(count=2)
    gc = GpuCollector(NODE, poll_seconds=0.2, nvml=nv)
    gc.start()
    try:
        nv.inject_xid(1, 79)
        nv.inject_xid(1, 79)
        nv.inject_xid(0, 48)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = exposed(gc.collect())
            if series(got, C.GPU_XID_ERRORS.name, gpu="0"):
                break
            time.sleep(0.05)
        assert one(got, C.GPU_XID_ERRORS.name, gpu="1", xid="79") == 2
        assert one(got, C.GPU_XID_ERRORS.name, gpu="0", xid="48") == 1
    finally:
        threads = list(gc._threads)
        gc.stop()
    assert not any(t.is_alive() for t in threads)
    assert nv.calls.get("nvmlEventSetFree") == 1 and nv.calls.get("nvmlShutdown") == 1


def test_gpu_scrapes_never_call_nvml():
    gc, spy, clock = run_gpu(2)
    before = dict(spy.nv.calls)
    for _ in range(20):
        gc.collect()
    assert spy.nv.calls == before


def test_no_nvml_is_collector_down_and_the_rest_works(caplog, tmp_path):
    """The real pynvml on this GPU-less machine: nvmlInit fails; one log line, collector_up 0."""
    s = AgentSettings(node=NODE, listen="127.0.0.1:0", ingest="udp://127.0.0.1:0", procfs=str(LOCAL / "proc"),
                      sysfs=str(NE / "sys"), collectors=("gpu", "network", "ranks"))
    a = Agent(s)  # no nvml given: the real library
    with caplog.at_level(logging.INFO, logger="ranksight"):
        a.start()
        try:
            for _ in range(3):
                got = scrape(a)
        finally:
            a.stop()
    assert one(got, C.COLLECTOR_UP.name, collector="gpu") == 0
    assert one(got, C.COLLECTOR_UP.name, collector="network") == 1
    assert series(got, C.NET_TCP_SENT.name)
    assert not series(got, C.GPU_UP.name)
    lines = [r for r in caplog.records if "gpu" in r.getMessage() and "NVML" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


def test_writer_is_byte_identical_to_prometheus_client():
    from prometheus_client import generate_latest

    s = AgentSettings(node=NODE, listen="127.0.0.1:0", ingest="udp://127.0.0.1:0", procfs=str(LOCAL / "proc"),
                      sysfs=str(NE / "sys"))
    a = Agent(s, nvml=NvmlStandin(count=2))
    a.start()
    try:
        from test_exporter_helpers import dgram, hb, ident, step

        now = time.monotonic()
        for r in range(2):
            i = ident(job='we"ird\\job\nname', rank=r)
            a.ingest.handle(dgram(i, hb()), now)
            a.ingest.handle(dgram(i, step(seq=1, dur=1234567.5)), now)
        fams = list(a.collect_all())
    finally:
        a.stop()

    class Reg:
        def collect(self):
            return fams

    assert TextWriter().render(fams) == generate_latest(Reg())
    w = TextWriter()
    assert w.render(fams) == w.render(fams)  # cached label sets render the same


def test_gpu_second_recording_idle_values_power_cap_and_sawtooth_gpm():
    """tests/fixtures/nvml/h200_nvml_trace_2026-11-29.json records idle values (<key>_idle), the
    power-capped steady state (reason 0x4) and GPM under the sawtooth too."""
    from test_exporter_helpers import FIXTURES
    import json as _json

    path = FIXTURES / "nvml" / "h200_nvml_trace_2026-11-29.json"
    st = _json.loads(path.read_text())["static"]
    clock = FakeClock()
    nv = NvmlStandin(count=3, traces=("steady", "sawtooth", "idle"), path=path, clock=clock)
    gc = GpuCollector(NODE, nvml=nv, clock=clock)
    gc.start(threads=False)
    clock.t += gc.state_seconds  # the next device state read (GPM needs two)
    gc.poll()
    got = exposed(gc.collect())
    assert one(got, C.GPU_POWER.name, gpu="0") == st["power_mw"] / 1000
    assert one(got, C.GPU_POWER.name, gpu="2") == st["power_mw_idle"] / 1000
    assert one(got, C.GPU_TEMPERATURE.name, gpu="2") == st["temperature_c_idle"]
    assert one(got, C.GPU_SM_CLOCK.name, gpu="2") == st["sm_clock_mhz_idle"] * 1e6
    assert one(got, C.GPU_CLOCKS_EVENT.name, gpu="0", reason="sw_power_cap") == 1  # 0x4 under load
    assert one(got, C.GPU_CLOCKS_EVENT.name, gpu="2", reason="sw_power_cap") == 0
    assert one(got, C.GPU_SM_ACTIVE.name, gpu="0") == pytest.approx(st["gpm_steady"]["sm_util"] / 100)
    assert one(got, C.GPU_TENSOR_ACTIVE.name, gpu="1") == pytest.approx(st["gpm_sawtooth"]["tensor_util"] / 100)
    assert not series(got, C.GPU_SM_ACTIVE.name, gpu="2")
    gc.stop()

def test_real_agent_rdma_counters_from_config(tmp_path):
    """agent.rdma_counters reaches the real agent: all -> every file, a list -> exactly those."""
    root = mlx5_tree(tmp_path / "sys", ports=2)
    exp = expected_rdma(root)
    for value, want in (("all", exp),
                        ("symbol_error,np_ecn_marked_roce_packets",
                         only_counters(exp, ("symbol_error", "np_ecn_marked_roce_packets")))):
        port = free_port()
        p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", "udp://127.0.0.1:0", "--collectors", "rdma",
                           "--sysfs", str(root), "--node", NODE), tmp_path / "agent.log",
                    env={"RANKSIGHT__agent__rdma_counters": value})
        try:
            got = wait_for(lambda: (lambda g: g if series(g, C.RDMA_PORT_COUNTER.name) else None)(
                parse(http_get(f"http://127.0.0.1:{port}/metrics"))), 20, "RDMA series on /metrics")
        finally:
            p.stop()
        assert {k: v for k, v in got.items() if k[0].startswith("ranksight_rdma_")} == want, value
