"""One `ranksight act` for the cluster, acting through each node's agent over authenticated HTTPS.

Real parts: two real node agents (`ranksight exporter`, nodes n1 and n2) serving HTTPS with a
throwaway CA (made with the openssl CLI, test_exporter_webconfig's ``pki``), requiring verified client
certificates, their end-workers endpoint enabled by a bearer token file and a client SAN; real worker
processes that register as ranks by sending their hello (with their own pid and start time) to their
agent; a real `ranksight act` server (one for both nodes, ``act.agent_url: https://{instance}``) posted
Alertmanager's webhook JSON; the proposed curl line run by a real shell. Asserted: the authorized act
ends exactly the culprit job's pids on the culprit's node and nothing else; a request without the
token, with a wrong one or with a certificate without the listed SAN does nothing, is answered 401 or
403 and is counted; a pid that is not the job's rank is never signalled; an agent without the endpoint
configured refuses; act's failures (401, no such job, an unreachable agent) are one line in the ledger
and a counted ``failed``.
"""
from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from ranksight import catalog as C
from ranksight import config
from ranksight.tools.act import ActServer
from support.alertmanager_webhook import TOKEN, am_alert, am_webhook, post
from test_exporter_helpers import agent_cmd, free_port, one, parse, started, wait_for
from test_exporter_webconfig import _cert, _hash, _write, pki  # noqa: F401  (the test CA and certificates)

pytestmark = pytest.mark.slow
END = "/api/v1/ranks/end"

# a worker: sends its hello (its own pid and start time, as the hooks do) every 0.3 s until killed
# (with ignore-term FILE: until SIGKILL; a SIGTERM only makes FILE)
WORKER = textwrap.dedent("""
    import os, signal, socket, sys, time
    import psutil
    from ranksight import protocol
    job, rank, node, port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    if sys.argv[5:6] == ["ignore-term"]:  # note the SIGTERM in the file argv[6], and go on
        signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[6], "w").close())
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rec = {"v": 2, "t": "hello", "job": job, "rank": rank, "lr": rank, "ws": 4, "node": node, "pid": os.getpid(),
           "info": {}, "dirs": {}, "pstart": psutil.Process().create_time(), "gpu": ""}
    while True:
        s.sendto(protocol.encode(dict(rec, ts=time.time())), ("127.0.0.1", port))
        time.sleep(0.3)
""")


class Node:
    """A real agent on 127.0.0.1 (https://localhost:PORT) and the workers that registered with it."""

    def __init__(self, name: str, tmp: Path, web: Optional[Path], env: Dict[str, str], host: str = "127.0.0.1") -> None:
        self.name, self.port, self.udp = name, free_port(), free_port(udp=True)
        args = ["--listen", f"{host}:{self.port}", "--ingest", f"udp://127.0.0.1:{self.udp}",
                "--collectors", "ranks", "--node", name] + (["--web.config.file", str(web)] if web else [])
        self.proc = started(agent_cmd(*args), tmp / f"agent-{name}.log", env)
        self.scheme = "https" if web else "http"
        self.workers: List[subprocess.Popen] = []
        wait_for(lambda: f"serving {self.scheme}://" in self.proc.text() or self.proc.popen.poll() is not None, 20,
                 f"agent {name} serving")
        assert self.proc.popen.poll() is None, self.proc.text()

    @property
    def instance(self) -> str:
        return f"localhost:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.instance}"

    def worker(self, job: str, rank: int, *extra: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", WORKER, job, str(rank), self.name, str(self.udp), *extra])
        self.workers.append(p)
        return p

    def stop(self) -> None:
        for p in self.workers:
            p.kill()
            p.wait()
        self.proc.stop()


def request(url: str, ctx: Optional[ssl.SSLContext], token: Optional[str] = None,
            body: Optional[dict] = None) -> Tuple[int, dict]:
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if e.headers.get("Content-Type") == "application/json" else {"error": text}


def client(pki: Path, cert: Optional[str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


def listed(node: Node, ctx: ssl.SSLContext, job: str, n: int) -> Dict[int, int]:
    """rank -> pid of ``job``'s ranks at the agent, once it lists ``n`` of them."""
    got: Dict[int, int] = {}

    def ready() -> bool:
        got.clear()
        doc = request(node.url + "/api/v1/ranks", ctx, TOKEN)[1]
        got.update({r["rank"]: r["pid"] for r in doc["ranks"] if r["job"] == job})
        return len(got) == n
    wait_for(ready, 20, f"{n} ranks of {job} at agent {node.name}")
    return dict(got)


def end_counts(node: Node, ctx: ssl.SSLContext) -> Dict[str, float]:
    text = urllib.request.urlopen(urllib.request.Request(node.url + "/metrics", headers={
        "Authorization": f"Bearer {TOKEN}"}), timeout=10, context=ctx).read().decode()
    return {r: one(parse(text), C.END_WORKERS_REQUESTS.name, result=r) for r in C.END_RESULTS}


@pytest.fixture(scope="module")
def cluster(pki, tmp_path_factory) -> Iterator[Tuple[Dict[str, Node], Path]]:
    _cert(pki, "act", "ca", "subjectAltName=DNS:ranksight-act\nextendedKeyUsage=clientAuth")
    tok = pki / "agent-token"
    tok.write_text(TOKEN + "\n")
    web = _write(pki, "agent-web.yml", {"tls_server_config": {
        "cert_file": "server.crt", "key_file": "server.key", "client_auth_type": "RequireAndVerifyClientCert",
        "client_ca_file": "ca.crt"}})
    tmp = tmp_path_factory.mktemp("cluster")
    env = {"RANKSIGHT__agent__act_token_file": str(tok), "RANKSIGHT__agent__act_client_sans": "ranksight-act"}
    nodes: Dict[str, Node] = {}
    try:
        for name in ("n1", "n2"):
            nodes[name] = Node(name, tmp, web, env)
        yield nodes, tok
    finally:
        for n in nodes.values():
            n.stop()


def act_server(pki: Path, tok: Path, tmp: Path, **over: str) -> ActServer:
    (tmp / "act-token").write_text(TOKEN + "\n")
    env = {"RANKSIGHT__act__listen": "127.0.0.1:0", "RANKSIGHT__act__token_file": str(tmp / "act-token"),
           "RANKSIGHT__act__agent_url": "https://{instance}", "RANKSIGHT__act__agent_token_file": str(tok),
           "RANKSIGHT__act__agent_ca_file": str(pki / "ca.crt"),
           "RANKSIGHT__act__agent_cert_file": str(pki / "act.crt"), "RANKSIGHT__act__agent_key_file": str(pki / "act.key"),
           "RANKSIGHT__act__modes": "{RanksightRankStalled: auto}", "RANKSIGHT__act__dry_run": "false",
           "RANKSIGHT__act__kill_grace_seconds": "2"}
    env.update({f"RANKSIGHT__act__{k}": v for k, v in over.items()})
    return ActServer(config.load(None, "test", env=env)).start()


def stalled(node: Node, job: str, rank: int, fp: str) -> dict:
    """RanksightRankStalled as Prometheus fires it over the agent's series: the rank's labels, the scrape's
    instance."""
    return am_webhook(am_alert("RanksightRankStalled", fp=fp, job=job, rank=str(rank), local_rank=str(rank),
                               node=node.name, instance=node.instance, reason="no_progress"))


def test_one_act_ends_the_culprit_jobs_workers_on_its_node_through_that_nodes_agent(cluster, pki, tmp_path):
    nodes, tok = cluster
    n1, n2 = nodes["n1"], nodes["n2"]
    ctx = client(pki, "act")
    j1 = [n1.worker("train", r) for r in (0, 1)]
    other = n1.worker("other", 0)
    j2 = [n2.worker("train", r) for r in (2, 3)]
    assert listed(n1, ctx, "train", 2) == {0: j1[0].pid, 1: j1[1].pid}
    listed(n1, ctx, "other", 1)
    listed(n2, ctx, "train", 2)
    s = act_server(pki, tok, tmp_path)
    try:
        code, body = post(s, stalled(n1, "train", 1, "f1"))
        assert code == 200 and body["results"][0]["state"] == "done", (body, list(s.actor.ledger.records.values()))
        assert [p.wait(10) for p in j1] == [-15, -15]  # SIGTERM, through n1's agent
        assert other.poll() is None and all(p.poll() is None for p in j2)  # another job, another node: untouched
        (rec,) = s.actor.ledger.records.values()
        assert (rec.node, rec.agent_url, rec.pids) == ("n1", n1.url, sorted(p.pid for p in j1)), rec
        assert rec.detail == f"SIGTERM to {sorted(p.pid for p in j1)}", rec.detail
        assert end_counts(n1, ctx)[C.END_OK] == 1 and end_counts(n2, ctx)[C.END_OK] == 0

        # act's failures are one line in the ledger and a counted failed, never a traceback
        post(s, stalled(n2, "nojob", 0, "f2"))
        gone = am_alert("RanksightRankStalled", fp="f3", job="train", rank="9", node="n9",
                        instance=f"localhost:{free_port()}")
        post(s, am_webhook(gone))
        fails = {r.labels["node"]: r for r in s.actor.ledger.records.values() if r.state == "failed"}
        assert fails["n2"].detail == f"no rank of job nojob on node n2 at the agent {n2.url}", fails
        assert fails["n9"].detail.startswith("cannot reach the agent at https://localhost:"), fails["n9"].detail
        assert s.actor.counters.actions[("RanksightRankStalled", "restart_workers", "failed")] == 2
    finally:
        s.stop()
    # a receiver with a wrong token: the agent answers 401, act records one line, nothing is signalled
    bad = tmp_path / "bad-token"
    bad.write_text("not-the-token\n")
    w = act_server(pki, bad, tmp_path)
    try:
        post(w, stalled(n2, "train", 2, "f4"))
        (rec,) = w.actor.ledger.records.values()
        assert rec.state == "failed" and rec.detail == f"agent {n2.url}{END} answered 401: no or a wrong bearer token", rec
    finally:
        w.stop()
    assert all(p.poll() is None for p in j2) and other.poll() is None


def test_without_the_token_or_the_listed_certificate_nothing_is_signalled_and_it_is_counted(cluster, pki):
    nodes, _ = cluster
    n2 = nodes["n2"]
    workers = [n2.worker("guarded", r) for r in (0, 1)]
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # no rank of anyone
    try:
        good = client(pki, "act")
        pids = listed(n2, good, "guarded", 2)
        before = end_counts(n2, good)
        body = {"job": "guarded", "node": "n2", "grace": 1}
        assert request(n2.url + END, good, None, body)[0] == 401  # no token
        assert request(n2.url + END, good, "wrong", body)[0] == 401
        code, doc = request(n2.url + END, client(pki, "client"), TOKEN, body)  # the CA's, but SAN prometheus
        assert code == 403 and "act_client_sans" in doc["error"], doc
        for cert in (None, "stranger"):  # no client certificate, one from another CA: no TLS session at all
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                request(n2.url + END, client(pki, cert), TOKEN, body)
        after = end_counts(n2, good)
        assert after[C.END_UNAUTHORIZED] - before[C.END_UNAUTHORIZED] == 2
        assert after[C.END_FORBIDDEN] - before[C.END_FORBIDDEN] == 1
        assert all(p.poll() is None for p in workers) and stray.poll() is None

        # a pid that is not the job's rank is never signalled: alone it is refused, with a rank it is left out
        code, doc = request(n2.url + END, good, TOKEN, dict(body, pids=[stray.pid]))
        assert code == 409 and doc["error"] == f"pids [{stray.pid}] are no longer ranks of job guarded on node n2"
        code, doc = request(n2.url + END, good, TOKEN, dict(body, pids=[pids[0], stray.pid]))
        assert code == 200 and doc["terminated"] == [pids[0]] and doc["refused"] == [stray.pid], doc
        assert workers[0].wait(10) == -15 and workers[1].poll() is None and stray.poll() is None
        assert end_counts(n2, good)[C.END_NO_RANKS] - before[C.END_NO_RANKS] == 1
    finally:
        stray.kill()
        stray.wait()


def test_the_grace_holds_only_its_own_connection_never_ingest_or_scrapes(cluster, pki, tmp_path):
    """A worker that ignores SIGTERM: the request waits out its grace, then SIGKILL. Meanwhile the agent
    keeps receiving datagrams and answering scrapes."""
    nodes, _ = cluster
    n1 = nodes["n1"]
    ctx = client(pki, "act")
    termed = tmp_path / "sigterm"
    w = n1.worker("stubborn", 0, "ignore-term", str(termed))
    listed(n1, ctx, "stubborn", 1)
    answer: List[Tuple[int, dict]] = []
    t = threading.Thread(target=lambda: answer.append(request(n1.url + END, ctx, TOKEN, {"job": "stubborn", "grace": 4})))

    def datagrams() -> float:
        text = urllib.request.urlopen(n1.url + "/metrics", timeout=10, context=ctx).read().decode()
        return one(parse(text), C.INGEST_DATAGRAMS.name, result="ok")
    t.start()
    try:
        wait_for(termed.exists, 10, "the SIGTERM (ignored)")
        seen = [datagrams()]
        wait_for(lambda: seen.append(datagrams()) or seen[-1] > seen[0], 10, "ingest while the request waits")
        assert not answer and t.is_alive() and w.poll() is None  # the request still waits out its grace
    finally:
        t.join(30)
    assert answer and answer[0][0] == 200 and answer[0][1]["killed"] == [w.pid], answer
    assert w.wait(10) == -9


def test_propose_shows_the_curl_line_that_ends_the_workers(cluster, pki, tmp_path):
    nodes, tok = cluster
    n1 = nodes["n1"]
    workers = [n1.worker("proposed", r) for r in (0, 1)]
    listed(n1, client(pki, "act"), "proposed", 2)
    s = act_server(pki, tok, tmp_path, modes="{}")
    try:
        assert post(s, stalled(n1, "proposed", 0, "p1"))[1]["results"][0]["state"] == "proposed"
        (rec,) = s.actor.ledger.records.values()
        assert rec.command.startswith(f"curl -sS --fail-with-body --cacert {pki / 'ca.crt'} --cert {pki / 'act.crt'} "
                                      f"--key {pki / 'act.key'} -H \"Authorization: Bearer $(cat {tok})\""), rec.command
        assert rec.command.endswith(f"{n1.url}{END}") and not any(p.poll() is not None for p in workers)
        r = subprocess.run(["sh", "-c", rec.command], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["terminated"] == sorted(p.pid for p in workers)
        assert [p.wait(10) for p in workers] == [-15, -15]
    finally:
        s.stop()


def test_an_agent_without_the_endpoint_configured_refuses(pki, tmp_path):
    plain = Node("n3", tmp_path, None, {})  # no act_token_file, no act_client_sans
    try:
        w = plain.worker("train", 0)
        wait_for(lambda: any(r["pid"] == w.pid for r in request(plain.url + "/api/v1/ranks", None)[1]["ranks"]), 20,
                 "the worker listed")
        for token in (None, TOKEN):
            code, doc = request(plain.url + END, None, token, {"job": "train"})
            assert code == 403 and "not enabled" in doc["error"], doc
        text = urllib.request.urlopen(plain.url + "/metrics", timeout=10).read().decode()
        assert one(parse(text), C.END_WORKERS_REQUESTS.name, result=C.END_DISABLED) == 2
        assert w.poll() is None
    finally:
        plain.stop()


def test_the_token_stands_in_for_basic_auth(pki, tmp_path):
    """An agent whose web config asks for basic auth: act's bearer token reads its ranks and ends workers;
    without either, 401."""
    tok = tmp_path / "t"
    tok.write_text(TOKEN)
    web = _write(pki, "agent-basic.yml", {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
                                          "basic_auth_users": {"prometheus": _hash("scrape-pw", 4)}})
    n = Node("n5", tmp_path, web, {"RANKSIGHT__agent__act_token_file": str(tok)})
    try:
        ctx = client(pki, None)
        w = n.worker("train", 0)
        assert request(n.url + "/api/v1/ranks", ctx)[0] == 401
        assert request(n.url + "/api/v1/ranks", ctx, "wrong")[0] == 401
        listed(n, ctx, "train", 1)  # with the token
        assert request(n.url + END, ctx, None, {"job": "train"})[0] == 401 and w.poll() is None
        assert request(n.url + END, ctx, TOKEN, {"job": "train", "grace": 1})[0] == 200
        assert w.wait(10) == -15
    finally:
        n.stop()


def test_plain_http_from_another_host_is_refused(tmp_path):
    """A token over plain HTTP is only taken from a loopback client: the agent refuses the same request
    from one of this machine's other addresses."""
    tok = tmp_path / "t"
    tok.write_text(TOKEN)
    host = next((a for a in _addresses() if not a.startswith("127.")), None)
    if host is None:
        pytest.fail("this machine has no non-loopback IPv4 address to send from", pytrace=False)
    n = Node("n4", tmp_path, None, {"RANKSIGHT__agent__act_token_file": str(tok)}, host="0.0.0.0")
    try:
        w = n.worker("train", 0)
        wait_for(lambda: request(f"http://127.0.0.1:{n.port}/api/v1/ranks", None)[1]["ranks"], 20, "the worker")
        code, doc = request(f"http://{host}:{n.port}{END}", None, TOKEN, {"job": "train"})
        assert code == 403 and "plain HTTP" in doc["error"], doc
        assert w.poll() is None
        assert request(f"http://127.0.0.1:{n.port}{END}", None, TOKEN, {"job": "train", "grace": 1})[0] == 200
        assert w.wait(10) == -15
    finally:
        n.stop()


def _addresses() -> List[str]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # no packet is sent: the kernel picks the source address of that route
        return [s.getsockname()[0]]
    except OSError:
        return []
    finally:
        s.close()
