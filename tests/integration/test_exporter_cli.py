"""`ranksight exporter` as a real process: usage errors and ports in use give one line and
exit 2, SIGTERM stops it cleanly, /healthz answers, a slow client does not block scrapes,
flags override the config, and the agent runs without torch."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ranksight import catalog as C

from test_exporter_helpers import NE, LOCAL, started, agent_cmd, dgram, free_port, hb, http_get, ident, one, parse, step, \
    wait_for


ROOT = Path(__file__).resolve().parents[2]


def run_fail(args, **kw):
    r = subprocess.run(agent_cmd(*args), capture_output=True, text=True, timeout=60, **kw)
    return r.returncode, r.stdout, r.stderr


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_bad_flag_bad_values_and_bad_config_exit_2(tmp_path):
    rc, _, err = run_fail(["--no-such-flag"])
    assert rc == 2 and "unrecognized arguments" in one_line(err)
    rc, _, err = run_fail(["--listen", "nonsense"])
    assert rc == 2 and "listen address" in one_line(err)
    rc, _, err = run_fail(["--ingest", "tcp://127.0.0.1:1"])
    assert rc == 2 and "ingest address" in one_line(err)
    rc, _, err = run_fail(["--collectors", "gpu,bogus"])
    assert rc == 2 and "collectors" in one_line(err)
    rc, _, err = run_fail(["--procfs", str(tmp_path / "nowhere")])
    assert rc == 2 and "procfs" in one_line(err)
    bad = tmp_path / "bad.yml"
    bad.write_text("agent:\n  max_ranks: -5\n")
    rc, _, err = run_fail(["--config", str(bad)])
    assert rc == 2 and "agent.max_ranks" in one_line(err)
    bad.write_text("agent: [unclosed\n")
    rc, _, err = run_fail(["--config", str(bad)])
    assert rc == 2 and "invalid YAML" in one_line(err)
    bad.write_text("agent:\n  nic_exclude: '(unclosed'\n")
    rc, _, err = run_fail(["--config", str(bad)])
    assert rc == 2 and "nic_exclude" in one_line(err)


def test_ports_in_use_exit_2():
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    held_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    held_udp.bind(("127.0.0.1", 0))
    uport = held_udp.getsockname()[1]
    try:
        rc, _, err = run_fail(["--listen", f"127.0.0.1:{port}", "--ingest", "udp://127.0.0.1:0", "--collectors", "ranks"])
        assert rc == 2 and "address already in use" in one_line(err)
        rc, _, err = run_fail(["--listen", "127.0.0.1:0", "--ingest", f"udp://127.0.0.1:{uport}", "--collectors", "ranks"])
        assert rc == 2 and "address already in use" in one_line(err) and "ingest" in err
    finally:
        held.close()
        held_udp.close()


def test_serves_flags_override_config_and_stops_on_sigterm(tmp_path):
    cfg = tmp_path / "agent.yml"
    port, uport = free_port(), free_port(udp=True)
    # the config names other ports and collectors; the flags win
    cfg.write_text("agent:\n  listen: 127.0.0.1:1\n  collectors: gpu\n  max_ranks: 7\n")
    sock = tmp_path / "ingest.sock"
    p = started(agent_cmd("--config", str(cfg), "--listen", f"127.0.0.1:{port}", "--ingest", f"unix://{sock}",
                       "--collectors", "network,disk,ranks", "--procfs", str(LOCAL / "proc"), "--sysfs", str(NE / "sys"),
                       "--watch-path", str(tmp_path), "--node", "nodeX"), tmp_path / "agent.log")
    try:
        url = f"http://127.0.0.1:{port}"
        text = wait_for(lambda: http_get(url + "/metrics"), 20, "the agent serving /metrics")
        assert http_get(url + "/healthz") == "ok\n"
        got = parse(text)
        assert one(got, C.COLLECTOR_UP.name, collector="network", node="nodeX") == 1
        assert not [k for k in got if k[0] == C.COLLECTOR_UP.name and dict(k[1])["collector"] == "gpu"]
        assert one(got, C.NET_TCP_SENT.name) == 9601  # tests/fixtures/local/proc/net/snmp: --procfs reached it
        assert one(got, C.DISK_FREE.name, path=str(tmp_path)) > 0
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for r in range(9):  # max_ranks 7 from the config: two overflow
            s.sendto(dgram(ident(rank=r, ws=9, pid=os.getpid()), step()), str(sock))  # the unix socket checks the pid
        s.close()
        got = wait_for(lambda: (lambda g: g if one(g, C.INGEST_DATAGRAMS.name, result="overflow") == 2 else None)(
            parse(http_get(url + "/metrics"))), 10, "overflow counted")
        assert one(got, C.TRACKED_RANKS.name) == 7
        p.signal(signal.SIGTERM)
        assert p.wait(10) == 0
        assert not sock.exists()
        assert "Traceback" not in p.text()
    finally:
        p.stop()


def test_slow_client_does_not_block_scrapes(tmp_path):
    port = free_port()
    p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", "udp://127.0.0.1:0", "--collectors", "ranks"),
                tmp_path / "agent.log")
    slow = []
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/metrics"), 20, "agent up")
        for _ in range(5):  # connections that send half a request line and stall
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(b"GET /metr")
            slow.append(c)
        t0 = time.monotonic()
        for _ in range(3):
            http_get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert time.monotonic() - t0 < 10  # would hang until the stalled clients time out if serialized
    finally:
        for c in slow:
            c.close()
        p.stop()


def test_agent_never_imports_torch(tmp_path):
    code = ("import sys, ranksight.cli as c; sys.argv=['ranksight','exporter','--help']\n"
            "try:\n  c.main(sys.argv[1:])\nexcept SystemExit: pass\n"
            "import ranksight.exporter.agent, ranksight.exporter.main, runpy\n"
            f"runpy.run_path({str(ROOT / 'bench' / 'bench_exporter.py')!r})\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().splitlines()[-1] == "False", r.stderr


def test_heartbeats_over_real_udp_into_the_cli_agent(tmp_path):
    """A process-level check of the checker thread: a sender that stops heartbeating is
    counted as missing within a few intervals, then down."""
    port, uport = free_port(), free_port(udp=True)
    p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", f"udp://127.0.0.1:{uport}", "--collectors", "ranks"),
                tmp_path / "agent.log")
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: http_get(url), 20, "agent up")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        i = ident()
        for k in range(5):
            s.sendto(dgram(i, hb(seq=k, every=0.2)), ("127.0.0.1", uport))
            time.sleep(0.2)
        assert one(parse(http_get(url)), C.RANK_UP.name) == 1
        got = wait_for(lambda: (lambda g: g if one(g, C.RANK_UP.name) == 0 else None)(parse(http_get(url))), 10,
                       "rank_up 0 after 3 missed 0.2 s heartbeats")
        assert one(got, C.HEARTBEAT_MISSES.name) >= 3
        s.sendto(dgram(i, {"t": "bye"}), ("127.0.0.1", uport))
        wait_for(lambda: not [k for k in parse(http_get(url)) if k[0] == C.RANK_UP.name], 10, "bye removes the rank")
        s.close()
    finally:
        p.stop()
