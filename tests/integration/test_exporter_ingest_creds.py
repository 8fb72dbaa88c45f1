"""The unix-socket ingest takes its senders' credentials from the kernel: two real users, one agent.

The test (root, as in CI) creates two users with useradd and removes them after. Each sends real
datagrams to a real agent's unix socket from its own process (setpriv). A user speaking into the
other's job, or under another process's pid, is rejected and counted; each one's own records
count; root may speak for any job but not under a pid not its own.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from ranksight import catalog as C

from test_exporter_helpers import ROOT, started, agent_cmd, dgram, free_port, http_get, ident, one, parse, series, step, \
    wait_for

SENDER = """
import os, socket, sys
sys.path.insert(0, sys.argv[1])
from test_exporter_helpers import dgram, ident, step
path, job, rank, pid, first, n = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # blocking: a full queue waits, nothing is dropped
for seq in range(first, first + n):
    s.sendto(dgram(ident(job=job, rank=rank, ws=4, pid=os.getpid() if pid == "self" else int(pid)), step(seq=seq)), path)
print(os.getpid())
"""

HOOKS = """
import torch, ranksight
m = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(5)]
for x, y in ranksight.watch(m, opt, data, config={"hooks": {"heartbeat_seconds": 0.05, "table_every_steps": 0,
                                                             "table_every_seconds": 0}}):
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.step()
ranksight.unwatch()
"""


def _run(*argv: str) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{argv}: {r.stderr}"


@pytest.fixture
def two_users() -> Iterator[Tuple[str, str]]:
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.fail("needs root with useradd and setpriv (util-linux) to create two real users", pytrace=False)
    names: List[str] = []
    try:
        for _ in range(2):
            name = f"rsq{secrets.token_hex(4)}"
            _run("useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name)
            names.append(name)
        yield names[0], names[1]
    finally:
        for name in names:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)


def send_as(user: str, path: str, job: str, rank: int, pid: str = "self", first: int = 1, n: int = 1) -> int:
    """Send n step records from a process of ``user`` (None: this root process's child); returns its pid."""
    pre = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user else []
    r = subprocess.run([*pre, sys.executable, "-c", SENDER, str(ROOT / "tests" / "unit"), path, job, str(rank), pid, str(first),
                        str(n)], capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.mark.slow
def test_a_user_cannot_speak_for_another_users_ranks(two_users, tmp_path):
    alice, bob = two_users
    shared = tempfile.mkdtemp(prefix="ranksight-creds-")  # pytest's tmp dirs are root-only
    os.chmod(shared, 0o755)
    sock = os.path.join(shared, "ingest.sock")
    port = free_port()
    p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", f"unix://{sock}", "--collectors", "ranks"),
                tmp_path / "agent.log")
    url = f"http://127.0.0.1:{port}/metrics"

    def counts(ok: int, rejected: int):
        def check():
            got = parse(http_get(url))
            if (one(got, C.INGEST_DATAGRAMS.name, result="ok"), one(got, C.INGEST_DATAGRAMS.name, result="rejected")) \
                    == (ok, rejected):
                return got
            return None
        return wait_for(check, 15, f"ok == {ok} and rejected == {rejected}")

    def steps(got, job: str, rank: int):
        s = series(got, C.STEPS.name, job=job, rank=str(rank))
        return next(iter(s.values())) if s else None

    try:
        wait_for(lambda: http_get(url), 20, "the agent serving /metrics")
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o666  # every local user's ranks can send

        alice_pid = send_as(alice, sock, "train-alice", 0, n=3)
        got = counts(ok=3, rejected=0)
        assert steps(got, "train-alice", 0) == 3

        send_as(bob, sock, "train-alice", 1, n=2)  # bob, in alice's job, under his own pid
        got = counts(ok=3, rejected=2)
        assert steps(got, "train-alice", 1) is None

        send_as(bob, sock, "train-bob", 0, pid=str(alice_pid), n=2)  # bob under a pid not his own
        got = counts(ok=3, rejected=4)
        assert steps(got, "train-bob", 0) is None

        send_as(bob, sock, "train-bob", 0, n=2)  # bob's own job, his own pid
        got = counts(ok=5, rejected=4)
        assert steps(got, "train-bob", 0) == 2

        send_as(alice, sock, "train-bob", 1)  # and alice cannot speak into bob's job either
        counts(ok=5, rejected=5)

        send_as("", sock, "train-alice", 2)  # root may speak for any job ...
        got = counts(ok=6, rejected=5)
        assert steps(got, "train-alice", 2) == 1
        send_as("", sock, "train-alice", 3, pid="1")  # ... but not under another process's pid
        counts(ok=6, rejected=6)

        send_as(alice, sock, "train-alice", 0, first=4, n=2)  # alice's own records still count
        got = counts(ok=8, rejected=6)
        assert steps(got, "train-alice", 0) == 5

        # the real hooks, run by alice: the pid they send is the one the kernel reports
        env = {"PATH": os.environ.get("PATH", ""), "HOME": shared, "RANKSIGHT_JOB": "alice-hooks",
               "RANKSIGHT_AGENT": f"unix://{sock}"}
        r = subprocess.run(["setpriv", f"--reuid={alice}", f"--regid={alice}", "--clear-groups", sys.executable, "-c",
                            HOOKS], capture_output=True, text=True, timeout=120, cwd="/", env=env)
        assert r.returncode == 0, r.stderr
        got = wait_for(lambda: (lambda g: g if steps(g, "alice-hooks", 0) == 5 else None)(parse(http_get(url))), 15,
                       "the hooks' 5 steps")
        assert one(got, C.INGEST_DATAGRAMS.name, result="rejected") == 6
        log = p.text()
        assert "the job belongs to another user" in log and "its pid is not the sender's" in log
        assert "Traceback" not in log
    finally:
        p.stop()
        shutil.rmtree(shared, ignore_errors=True)


def test_ingest_checks_in_process(tmp_path):
    """Ingest.handle with hand-made credentials: ownership outlives nothing but the job."""
    import struct

    from ranksight.exporter.ingest import Ingest
    from ranksight.exporter.ranks import RankSettings, RankTable

    table = RankTable(RankSettings())
    ingest = Ingest(table)

    def cred(pid: int, uid: int):
        return [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", pid, uid, uid))]

    me = os.getpid()
    rec = lambda job, rank, pid=me, seq=1: dgram(ident(job=job, rank=rank, ws=4, pid=pid), step(seq=seq))  # noqa: E731
    assert ingest.handle(rec("j", 0), 0.0, cred(me, 1000)) == "ok"
    assert ingest.handle(rec("j", 1), 0.0, cred(me, 1001)) == "rejected"  # another uid owns j
    assert ingest.handle(rec("j", 1), 0.0, cred(me, 0)) == "ok"  # root speaks for any job
    assert ingest.handle(rec("j", 2, pid=me + 1), 0.0, cred(me, 1000)) == "rejected"  # not the sender's pid
    assert ingest.handle(rec("j", 2), 0.0, cred(0, 1000)) == "rejected"  # a sender the agent cannot see
    assert ingest.handle(rec("j", 2), 0.0, []) == "rejected"  # no credentials at all
    assert ingest.handle(b"{nope", 0.0, cred(me, 1000)) == "malformed"
    table.check(1e9)  # the job's ranks are silent past the TTL and forgotten: its name is free again
    assert "j" not in table.jobs
    assert ingest.handle(rec("j", 0), 0.0, cred(me, 1001)) == "ok"
    assert ingest.handle(rec("j", 1), 0.0, cred(me, 1000)) == "rejected"
    assert ingest.counts["rejected"] == 5 and ingest.counts["ok"] == 3


def test_job_owners_stay_bounded():
    """A sender inventing job names cannot grow the job -> uid map, nor free a live job's name."""
    import struct

    from ranksight.exporter.ingest import Ingest
    from ranksight.exporter.ranks import RankSettings, RankTable

    ingest = Ingest(RankTable(RankSettings(max_jobs=4)))
    me = os.getpid()
    cred = lambda uid: [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", me, uid, uid))]  # noqa: E731
    assert ingest.handle(dgram(ident(job="live", pid=me), step()), 0.0, cred(1000)) == "ok"
    for i in range(ingest.max_owners + 500):
        ingest.handle(dgram(ident(job=f"junk{i}", pid=me), step()), 0.0, cred(1001))
    assert len(ingest.owners) <= ingest.max_owners
    assert ingest.owners["live"] == 1000
    assert ingest.handle(dgram(ident(job="live", rank=1, pid=me), step()), 0.0, cred(1001)) == "rejected"


@pytest.mark.slow
def test_a_rank_in_its_own_pid_namespace(tmp_path):
    """A containerized rank sends the pid it sees (1 here); the agent matches it with NSpid."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root with unshare (util-linux) to start a process in a new PID namespace", pytrace=False)
    sock = str(tmp_path / "ingest.sock")
    port = free_port()
    p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", f"unix://{sock}", "--collectors", "ranks"),
                tmp_path / "agent.log")
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(lambda: http_get(url), 20, "the agent serving /metrics")
        for job, pid in (("contained", "self"), ("contained-forged", "2")):
            r = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", SENDER, str(ROOT / "tests" / "unit"), sock,
                                job, "0", pid, "1", "3"], capture_output=True, text=True, timeout=60, cwd="/")
            assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr  # pid 1 in its namespace
        got = wait_for(lambda: (lambda g: g if one(g, C.INGEST_DATAGRAMS.name, result="rejected") == 3 else None)(
            parse(http_get(url))), 15, "the forged records rejected")
        assert one(got, C.INGEST_DATAGRAMS.name, result="ok") == 3
        assert next(iter(series(got, C.STEPS.name, job="contained").values())) == 3
        assert not series(got, C.STEPS.name, job="contained-forged")
    finally:
        p.stop()
