"""`ranksight exporter --web.config.file`: the exporter-toolkit web config, on a real agent.

A CA, a server certificate and client certificates are made at test time with the openssl CLI.
A real agent serves /metrics over TLS with client certificates and bcrypt basic auth; a real
HTTPS client gets 200 with good credentials, 401 with bad ones, and no answer without a client
certificate; a real Prometheus scrapes it (up == 1). Bad files give one line and exit 2.
"""
from __future__ import annotations

import base64
import http.client
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Dict, Optional, Tuple

import bcrypt
import pytest
import yaml

from ranksight import catalog as C
from ranksight import triage
from ranksight.exporter import webconfig
from ranksight.exporter.webconfig import Gate, WebConfigError

from test_exporter_helpers import Proc, started, agent_cmd, free_port, one, parse, wait_for

PASSWORD = "s3cret-scrape"
USER = "prometheus"


def _openssl(*args: str, cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _cert(d: Path, name: str, ca: Optional[str], ext: str) -> None:
    """name.key + name.crt signed by ca (ca.crt/ca.key), or self-signed when ca is None."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(ext + "\n")
    if ca is None:
        _openssl("x509", "-req", "-in", f"{name}.csr", "-signkey", f"{name}.key", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", f"{name}.ext", cwd=d)
    else:
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl CLI is missing: apt-get install openssl", pytrace=False)
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "2", "-subj", "/CN=ranksight-test-ca", cwd=d)
    _cert(d, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1")
    _cert(d, "client", "ca", "subjectAltName=DNS:prometheus\nextendedKeyUsage=clientAuth")
    _cert(d, "stranger", None, "subjectAltName=DNS:prometheus\nextendedKeyUsage=clientAuth")  # not from our CA
    return d


def _hash(password: str, cost: int = 10) -> str:
    h = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
    return "$2y$" + h[4:]  # htpasswd writes $2y$; the agent takes it as Go's bcrypt does


def _write(d: Path, name: str, doc) -> Path:
    p = d / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return p


def _mtls_config(pki: Path) -> Dict:
    return {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",  # relative to the file
                                  "client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca.crt",
                                  "min_version": "TLS12"},
            "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "deny"}},
            "basic_auth_users": {USER: _hash(PASSWORD)}}


def _client(pki: Path, cert: Optional[str] = "client") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


def _get(port: int, path: str, ctx: ssl.SSLContext, user: Optional[str] = USER,
         password: str = PASSWORD) -> Tuple[int, Dict[str, str], str]:
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        headers = {}
        if user is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        c.request("GET", path, headers=headers)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read().decode()
    finally:
        c.close()


def _start(tmp_path: Path, web: Path) -> Tuple[Proc, int]:
    port = free_port()
    p = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", "udp://127.0.0.1:0", "--collectors", "ranks",
                       "--web.config.file", str(web)), tmp_path / "agent.log")
    try:
        wait_for(lambda: "serving https://" in p.text() or p.popen.poll() is not None, 20, "the agent serving https")
        assert p.popen.poll() is None, p.text()
    except BaseException:
        p.stop()
        raise
    return p, port


@pytest.mark.slow
def test_tls_client_certs_and_basic_auth(pki, tmp_path):
    web = _write(pki, "web-mtls.yml", _mtls_config(pki))
    p, port = _start(tmp_path, web)
    try:
        good = _client(pki)
        code, headers, body = _get(port, "/metrics", good)
        assert code == 200
        assert one(parse(body), C.INGEST_DATAGRAMS.name, result="ok") == 0
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "deny"
        assert _get(port, "/healthz", good)[:3:2] == (200, "ok\n")
        for user, password in ((USER, "wrong"), ("nobody", PASSWORD), (USER, "")):
            code, headers, _ = _get(port, "/metrics", good, user, password)
            assert code == 401 and headers["WWW-Authenticate"] == "Basic", (user, password)
        assert _get(port, "/metrics", good, user=None)[0] == 401
        assert _get(port, "/healthz", good, user=None)[0] == 401  # every path is protected, as exporter-toolkit does
        for ctx in (_client(pki, cert=None), _client(pki, cert="stranger")):  # no client cert / one from another CA
            with pytest.raises((ssl.SSLError, ConnectionError)):
                _get(port, "/metrics", ctx)
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # plain HTTP to the TLS port
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            plain.request("GET", "/metrics")
            plain.getresponse().read()
        plain.close()
        assert _get(port, "/metrics", good)[0] == 200  # still serving after all of that
        assert "Traceback" not in p.text()
    finally:
        p.stop()


@pytest.mark.slow
def test_prometheus_scrapes_the_tls_auth_agent(pki, tmp_path, local_stack):
    web = _write(pki, "web-prom.yml", _mtls_config(pki))
    p, port = _start(tmp_path, web)
    try:
        stack = local_stack(targets=[f"127.0.0.1:{port}"], scrape_options={
            "scheme": "https",
            "tls_config": {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "client.crt"),
                           "key_file": str(pki / "client.key")},
            "basic_auth": {"username": USER, "password": PASSWORD}})
        expr = f'up{{job="{triage.SCRAPE_JOB}"}}'
        wait_for(lambda: stack.prom.value(expr) == 1.0, 30, f"{expr} == 1 ({stack.prom.targets()})")
        assert stack.prom.value(f'{C.INGEST_DATAGRAMS.name}{{result="ok"}}') == 0.0
        assert "Traceback" not in p.text()
    finally:
        p.stop()


def test_basic_auth_cache_and_dummy_hash(pki, monkeypatch):
    """A verified pair costs bcrypt once; a flood of wrong passwords does not push it out."""
    wc = webconfig.WebConfig(path="mem", users={USER: _hash(PASSWORD, cost=4).encode()})
    gate = Gate(wc)
    calls = []
    real = gate._verify
    monkeypatch.setattr(gate, "_verify", lambda pw, h: calls.append(h) or real(pw, h))

    def auth(user: str, password: str) -> bool:
        return gate.authorized("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())

    assert auth(USER, PASSWORD) and len(calls) == 1
    assert auth(USER, PASSWORD) and len(calls) == 1  # cached
    for i in range(webconfig.FAILURE_CACHE + 20):
        assert not auth(USER, f"guess{i}")
    assert auth(USER, PASSWORD) and len(calls) == webconfig.FAILURE_CACHE + 21  # still cached
    n = len(calls)
    assert not auth(USER, f"guess{webconfig.FAILURE_CACHE + 19}") and len(calls) == n  # a repeated wrong pair: remembered
    assert not auth("nobody", PASSWORD) and calls[-1] == gate._dummy  # unknown user: checked against a dummy hash
    assert not gate.authorized(None) and not gate.authorized("Bearer x") and not gate.authorized("Basic !!!")


def test_certificate_files_reload_when_they_change(pki, tmp_path):
    d = tmp_path / "certs"
    d.mkdir()
    for f in ("server.crt", "server.key"):
        shutil.copy(pki / f, d / f)
    wc = webconfig.load(str(_write(d, "web.yml", {"tls_server_config": {"cert_file": "server.crt",
                                                                      "key_file": "server.key"}})))
    gate = Gate(wc)
    first = gate.context()
    assert gate.context() is first
    shutil.copy(pki / "client.crt", d / "server.crt")  # a rotated file that does not match the key: kept the old
    assert gate.context() is first
    shutil.copy(pki / "server.crt", d / "server.crt.new")
    (d / "server.crt.new").replace(d / "server.crt")  # rotated back (a new inode): reloaded
    assert gate.context() is not first


BAD = [  # (web config, text the one line must contain)
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "bogus": 1}}, "unknown key 'bogus'"),
    ({"tls_config": {}}, "unknown key 'tls_config'"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "server.key"}}, "no such file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "client.key"}}, "do not load as a PEM pair"),
    ({"tls_server_config": {"cert_file": "server.crt"}}, "missing one of key or key_file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "client_auth_type": "Sometimes"}},
     "client_auth_type"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAnyClientCert"}}, "use RequireAndVerifyClientCert"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "client_ca_file": "ca.crt"}},
     "client_auth_type is NoClientCert"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "client_auth_type":
                            "RequireAndVerifyClientCert", "client_ca_file": "server.key"}}, "client_ca_file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "min_version": "TLS14"}},
     "min_version"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "cipher_suites": ["RC4"]}},
     "unknown cipher"),
    ({"tls_server_config": {"cert_file": ["server.crt"], "key_file": "server.key"}}, "expected a string"),
    ({"basic_auth_users": {"u": "plaintext"}}, "not a bcrypt hash"),
    ({"basic_auth_users": ["u"]}, "expected a mapping"),
    ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "X-Frame-Options"),
    ({"http_server_config": {"headers": {"X-Powered-By": "me"}}}, "unknown key 'X-Powered-By'"),
    ({"rate_limit": {"interval": "often", "burst": 1}}, "not a duration"),
    ("tls_server_config:\n  cert_file: a\n  cert_file: b\n", "duplicate key 'cert_file'"),
    ("tls_server_config: [unclosed\n", "invalid YAML"),
    ("- just\n- a list\n", "top level: expected a mapping"),
]


@pytest.mark.parametrize("doc,why", BAD, ids=[w for _, w in BAD])
def test_bad_web_configs_are_one_clear_error(pki, doc, why):
    path = _write(pki, "bad.yml", doc)
    with pytest.raises(WebConfigError) as e:
        webconfig.load(str(path))
    msg = str(e.value)
    assert why in msg and msg.startswith(f"web config {path}: ") and "\n" not in msg


def test_good_web_configs_load(pki):
    assert webconfig.load(str(_write(pki, "empty.yml", ""))).describe() == "plain HTTP, no auth"
    wc = webconfig.load(str(_write(pki, "full.yml", {
        "tls_server_config": {"cert": (pki / "server.crt").read_text(), "key": (pki / "server.key").read_text(),
                              "client_ca": (pki / "ca.crt").read_text(), "client_auth_type": "VerifyClientCertIfGiven",
                              "min_version": "TLS12", "max_version": "TLS13", "prefer_server_cipher_suites": True,
                              "cipher_suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"],
                              "curve_preferences": ["CurveP256"]},
        "http_server_config": {"http2": True, "headers": {"Strict-Transport-Security": "max-age=31536000"}},
        "basic_auth_users": {"a": _hash("x", 4), "b": _hash("y", 4)},
        "rate_limit": {"interval": "100ms", "burst": 20}})))
    assert wc.describe() == ("TLS, client certificates verified if given, basic auth (2 users), "
                             "rate limit every 0.1 s, burst 20")


@pytest.mark.slow
def test_cli_bad_web_config_exit_2(pki, tmp_path):
    cases = [
        (["--web.config.file", str(tmp_path / "nowhere.yml")], "no such file"),
        (["--web.config.file", str(_write(pki, "cli-key.yml", BAD[0][0]))], "unknown key 'bogus'"),
        (["--web.config.file", str(_write(pki, "cli-hash.yml", {"basic_auth_users": {"u": "$2y$10$short"}}))],
         "not a bcrypt hash"),
        (["--config", str(_write(tmp_path, "agent.yml", {"agent": {"web_config_file": str(pki / "cli-missing.yml")}}))],
         "cli-missing.yml: no such file"),
    ]
    (pki / "cli-missing.yml").unlink(missing_ok=True)
    for args, why in cases:
        r = subprocess.run(agent_cmd("--listen", "127.0.0.1:0", "--collectors", "ranks", *args), capture_output=True,
                           text=True, timeout=60)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0], (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_a_request_waiting_too_long_for_bcrypt_is_refused_and_not_remembered(monkeypatch):
    wc = webconfig.WebConfig(path="mem", users={USER: _hash(PASSWORD, cost=4).encode()})
    gate = Gate(wc)
    monkeypatch.setattr(webconfig, "BCRYPT_WAIT", 0.05)
    header = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    gate._bcrypt.acquire()  # another request is verifying
    try:
        assert not gate.authorized(header)
    finally:
        gate._bcrypt.release()
    assert gate.authorized(header)  # the refusal was not remembered
