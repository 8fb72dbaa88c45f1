"""The keys that let one `ranksight act` reach every node's agent (act.agent_url with {label} fields,
act.agent_token_file, act.agent_ca_file, act.agent_cert_file, act.agent_key_file) and that enable the
agent's end-workers endpoint (agent.act_token_file, agent.act_client_sans): each bad value is one
``ranksight: error:`` line and exit 2. The agent's request parsing and its choice of pids
(exporter/workers.py) on real processes."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ranksight import catalog as C
from ranksight import config
from ranksight.cli import main
from ranksight.exporter import workers
from ranksight.exporter.workers import EndError
from ranksight.tools.act_engines import ActError, Workers
from test_exporter_webconfig import _write, pki  # noqa: F401  (the test CA and certificates)


@pytest.fixture
def clean_env(monkeypatch):
    for k in [k for k in os.environ if k.startswith("RANKSIGHT")]:
        monkeypatch.delenv(k)
    return monkeypatch


def one_error(capsys, argv, env, monkeypatch) -> str:
    with monkeypatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ranksight: error: "), err
    return err


@pytest.mark.parametrize("url, want", [
    ("http://node-3:9945", "plain http only to a loopback host"),
    ("http://{node}:9945", "plain http only to a loopback host"),
    ("https://{no-de}:9945", "a field is {label}"),
    ("https://{node:9945", "a field is {label}"),
    ("ftp://{node}", "expected http(s)://HOST:PORT"),
    ("https://{node}:9945/?x=1", "expected http(s)://HOST:PORT"),
])
def test_a_bad_agent_url_is_one_line(url, want):
    with pytest.raises(config.ConfigError, match=r"config act\.agent_url: .*" + want.replace("(", r"\(")
                       .replace(")", r"\)").replace("{", r"\{").replace("}", r"\}")):
        config.validate("act", "agent_url", url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9945", "http://localhost:9945", "http://[::1]:9945",
                                 "https://{node}:9945", "https://{instance}", "https://agents.example/{node}"])
def test_good_agent_urls(url):
    assert config.validate("act", "agent_url", url) == url


def test_the_agent_url_of_an_alert(pki):
    w = Workers("https://{node}:9945", ca_file=str(pki / "ca.crt"))
    assert not w.fixed and w.url({"node": "gpu-017", "job": "j"}) == "https://gpu-017:9945"
    assert Workers("https://{instance}").url({"instance": "10.0.0.7:9945"}) == "https://10.0.0.7:9945"
    assert Workers("https://[{node}]:9945").url({"node": "fd00::7"}) == "https://[fd00::7]:9945"
    assert Workers("http://127.0.0.1:9945").fixed  # one agent: a one-node setup
    with pytest.raises(ActError, match="the alert's label node is missing"):
        w.url({"job": "j"})
    for evil in ("evil.example/x", "a@b", "n1?x", "n 1"):  # a label value never adds a path, user or query
        with pytest.raises(ActError, match="no host or port"):
            w.url({"node": evil})


def test_bad_act_agent_keys_are_one_line(clean_env, capsys, tmp_path, pki):
    tok = tmp_path / "token"
    tok.write_text("t\n")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    base = {"RANKSIGHT__act__token_file": str(tok), "RANKSIGHT__act__listen": "127.0.0.1:0"}
    for env, want in [
        ({"RANKSIGHT__act__agent_url": "http://n1:9945"}, "config act.agent_url: 'http://n1:9945': plain http only"),
        ({"RANKSIGHT__act__agent_token_file": str(tmp_path / "nope")}, "config act.agent_token_file: cannot read"),
        ({"RANKSIGHT__act__agent_token_file": str(empty)}, "config act.agent_token_file: " + str(empty) + " is empty"),
        ({"RANKSIGHT__act__agent_ca_file": str(tmp_path / "nope.crt")}, "config act.agent_ca_file: cannot load"),
        ({"RANKSIGHT__act__agent_ca_file": str(tok)}, "config act.agent_ca_file: cannot load"),
        ({"RANKSIGHT__act__agent_cert_file": str(pki / "client.crt")}, "act.agent_key_file: set both or neither"),
        ({"RANKSIGHT__act__agent_cert_file": str(pki / "client.crt"), "RANKSIGHT__act__agent_key_file": str(pki / "ca.key")},
         "config act.agent_cert_file: cannot load"),
        ({"RANKSIGHT__act__kill_grace_seconds": "601"}, "config act.kill_grace_seconds: '601' is outside [0, 600]"),
    ]:
        assert want in one_error(capsys, ["act"], {**base, **env}, clean_env)


def test_bad_agent_endpoint_keys_are_one_line(clean_env, capsys, tmp_path, pki):
    empty = tmp_path / "empty"
    empty.write_text("")
    plain_tls = _write(pki, "web-tls-only.yml", {"tls_server_config": {"cert_file": "server.crt",
                                                                       "key_file": "server.key"}})
    argv = ["exporter", "--collectors", "ranks", "--listen", "127.0.0.1:0", "--ingest", "udp://127.0.0.1:0"]
    for env, extra, want in [
        ({"RANKSIGHT__agent__act_token_file": str(tmp_path / "nope")}, [], "config agent.act_token_file: cannot read"),
        ({"RANKSIGHT__agent__act_token_file": str(empty)}, [], f"config agent.act_token_file: {empty} is empty"),
        ({"RANKSIGHT__agent__act_client_sans": "ranksight-act"}, [], "config agent.act_client_sans: needs "
                                                                     "--web.config.file"),
        ({"RANKSIGHT__agent__act_client_sans": "ranksight-act"}, ["--web.config.file", str(plain_tls)],
         "client_auth_type RequireAndVerifyClientCert"),
    ]:
        assert want in one_error(capsys, argv + extra, env, clean_env)


def test_describe_lists_the_keys():
    keys = {(s, k) for s, k, _, _ in config.describe()}
    assert {("act", "agent_token_file"), ("act", "agent_ca_file"), ("act", "agent_cert_file"), ("act", "agent_key_file"),
            ("agent", "act_token_file"), ("agent", "act_client_sans")} <= keys


def test_a_request_body_that_is_not_the_shape_is_refused():
    for body in (b"", b"{", b"[]", b'{"job": ""}', b'{"job": 1}', b'{"job": "j", "pids": [0]}',
                 b'{"job": "j", "pids": ["1"]}', b'{"job": "j", "pids": 5}', b'{"job": "j", "grace": 601}',
                 b'{"job": "j", "grace": true}', b'{"job": "j", "node": 3}'):
        with pytest.raises(EndError) as e:
            workers.parse(body)
        assert (e.value.code, e.value.result) == (400, C.END_MALFORMED), body
    assert workers.parse(b'{"job": "j"}') == ("j", "", None, 5.0)
    assert workers.parse(b'{"job": "j", "node": "n1", "pids": [7, 8], "grace": 1}') == ("j", "n1", [7, 8], 1.0)


def test_only_the_jobs_live_ranks_on_the_node_are_chosen():
    import psutil

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        born = psutil.Process(p.pid).create_time()
        ranks = [{"job": "j", "node": "n1", "pid": p.pid, "local_pid": p.pid, "pstart": born},
                 {"job": "j", "node": "n1", "pid": 11, "finished": True},      # exited cleanly: never signalled
                 {"job": "j", "node": "n2", "pid": 12},                        # another node
                 {"job": "k", "node": "n1", "pid": 13}]                        # another job
        assert workers.choose(ranks, "j", "n1", None) == ([p.pid], [])
        assert workers.choose(ranks, "j", "n1", [p.pid, 12, 13, 1]) == ([p.pid], [1, 12, 13])
        with pytest.raises(EndError, match=r"no rank of job j on node n3 at this agent"):
            workers.choose(ranks, "j", "n3", None)
        with pytest.raises(EndError, match=r"pids \[13\] are no longer ranks of job j on node n1") as e:
            workers.choose(ranks, "j", "n1", [13])
        assert e.value.code == 409
        # the pid now belongs to a process that started at another time than the rank's: a reused pid
        ranks[0]["pstart"] = born - 3600
        with pytest.raises(EndError, match="no longer ranks"):
            workers.choose(ranks, "j", "n1", None)
        # a unix-socket sender in a container: the pid the agent sees is the one signalled
        ranks[0].update(pid=7, pstart=born)
        assert workers.choose(ranks, "j", "n1", [7]) == ([p.pid], [])
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()
