"""The agent address at the start (hooks/transport.py): an agent that is not there is said once,
in one warning line, on real sockets: UDP to a closed loopback port (the kernel's ECONNREFUSED at
a later send), a unix socket path with no file, a stale socket file nobody reads. A live agent, or
one that binds within the grace, is not reported; nothing raises."""
from __future__ import annotations

import logging
import socket
import time

import pytest

from ranksight.address import parse_address
from ranksight.common.plumbing import free_port
from ranksight.hooks import transport as T

LOG = "ranksight.hooks"
GRACE = 0.2


@pytest.fixture(autouse=True)
def short_grace(monkeypatch):
    monkeypatch.setattr(T, "GRACE_SECONDS", GRACE)


def dead_udp_port() -> int:
    """A UDP port with nobody listening on it."""
    return free_port(udp=True)


def no_agent_lines(caplog, level=logging.WARNING):
    return [r.getMessage() for r in caplog.records if r.levelno == level and "no agent at" in r.getMessage()]


def pump(tr: T.Transport, seconds: float, every: float = 0.02) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tr.send(b"{}")  # never raises
        time.sleep(every)


def test_udp_with_no_agent_is_one_warning(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG)
    port = dead_udp_port()
    t0 = time.monotonic()
    tr = T.Transport(parse_address(f"udp://127.0.0.1:{port}"), announce=True)
    pump(tr, GRACE / 2)
    assert tr.errors >= 1 and tr.absent == "connection refused"
    if time.monotonic() - t0 < GRACE:
        assert no_agent_lines(caplog) == []  # within the grace: the agent may still be starting
    pump(tr, 2 * GRACE)
    tr.close()
    assert no_agent_lines(caplog) == [f"ranksight: no agent at udp://127.0.0.1:{port} (connection refused): records "
                                      "are dropped; start `ranksight exporter` or set RANKSIGHT_AGENT=off"]


def test_unix_socket_missing_or_stale_is_one_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOG)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody reads it
    for path, why in ((tmp_path / "missing.sock", "no such socket file"), (stale, "connection refused")):
        caplog.clear()
        tr = T.Transport(parse_address(f"unix://{path}"), announce=True)
        pump(tr, 2 * GRACE)
        tr.close()
        assert no_agent_lines(caplog) == [f"ranksight: no agent at unix://{path} ({why}): records are dropped; start "
                                          "`ranksight exporter` or set RANKSIGHT_AGENT=off"]


def test_a_live_agent_is_not_reported(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG)
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    try:
        tr = T.Transport(parse_address(f"udp://127.0.0.1:{rx.getsockname()[1]}"), announce=True)
        pump(tr, 2 * GRACE)
        tr.close()
        assert tr.errors == 0 and tr.sent > 0 and tr.absent is None
        assert no_agent_lines(caplog) == [] and no_agent_lines(caplog, logging.DEBUG) == []
    finally:
        rx.close()


def test_an_agent_that_binds_within_the_grace_is_not_reported(caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger=LOG)
    monkeypatch.setattr(T, "GRACE_SECONDS", 0.6)  # room for a slow machine between the refusals and the bind
    port = dead_udp_port()
    tr = T.Transport(parse_address(f"udp://127.0.0.1:{port}"), announce=True)
    pump(tr, 0.05, every=0.01)
    assert tr.absent == "connection refused"
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", port))
    try:
        time.sleep(0.02)
        tr.send(b"{}")  # a refusal left pending by the last datagram before the bind
        pump(tr, 0.7)
        tr.close()
    finally:
        rx.close()
    assert no_agent_lines(caplog) == []


def test_a_run_shorter_than_the_grace_says_it_at_close(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger=LOG)
    monkeypatch.setattr(T, "GRACE_SECONDS", 30.0)
    tr = T.Transport(parse_address(f"unix://{tmp_path}/missing.sock"), announce=True)
    assert tr.send(b"{}") is False and tr.send(b"{}") is False
    assert no_agent_lines(caplog) == []
    tr.close()
    assert len(no_agent_lines(caplog)) == 1


def test_only_node_local_rank_0_warns(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger=LOG)
    monkeypatch.setenv("LOCAL_RANK", "3")
    tr = T.Transport(parse_address(f"unix://{tmp_path}/missing.sock"))
    pump(tr, 2 * GRACE)
    tr.close()
    assert no_agent_lines(caplog) == [] and len(no_agent_lines(caplog, logging.DEBUG)) == 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    caplog.clear()
    tr = T.Transport(parse_address(f"unix://{tmp_path}/missing.sock"))
    pump(tr, 2 * GRACE)
    tr.close()
    assert len(no_agent_lines(caplog)) == 1


def test_an_agent_gone_after_the_start_is_not_a_start_up_warning(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.WARNING, logger=LOG)
    monkeypatch.setattr(T, "STARTUP_SECONDS", 0.1)
    tr = T.Transport(parse_address(f"unix://{tmp_path}/missing.sock"), announce=True)
    time.sleep(0.15)
    pump(tr, 2 * GRACE)
    tr.close()
    assert tr.errors > 0 and no_agent_lines(caplog) == []


def test_off_sends_nothing_and_says_nothing(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG)
    tr = T.Transport(parse_address("off"), announce=True)
    assert not tr.enabled and tr.send(b"{}") is False
    tr.close()
    assert not caplog.records


@pytest.mark.slow
def test_watch_with_no_agent_warns_once_and_trains_on(caplog):
    torch = pytest.importorskip("torch")
    import ranksight

    caplog.set_level(logging.WARNING, logger=LOG)
    port = dead_udp_port()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fast = {"hooks": {"heartbeat_seconds": 0.05, "table_every_steps": 0, "table_every_seconds": 0}}
    loader = ranksight.watch(model, opt, [torch.randn(3, 4) for _ in range(20)], agent=f"udp://127.0.0.1:{port}",
                             config=fast)
    w = ranksight.hooks.current()
    try:
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.05)  # 1 s of training: past the grace
        st = w.stats()
    finally:
        ranksight.unwatch()
    assert st["steps"] == 20 and st["herr"] == 0 and st["send_errors"] >= 2
    assert no_agent_lines(caplog) == [f"ranksight: no agent at udp://127.0.0.1:{port} (connection refused): records "
                                      "are dropped; start `ranksight exporter` or set RANKSIGHT_AGENT=off"]


def test_a_socket_this_user_may_not_write_is_said_so(tmp_path, caplog):
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes to any socket file")
    caplog.set_level(logging.WARNING, logger=LOG)
    path = tmp_path / "agent.sock"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(path))
    path.chmod(0o400)
    try:
        tr = T.Transport(parse_address(f"unix://{path}"), announce=True)
        pump(tr, 2 * GRACE)
        tr.close()
    finally:
        rx.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"ranksight: cannot send to the agent at unix://{path} (permission denied): records are dropped; give "
        "this user access to it or set RANKSIGHT_AGENT=off"]
