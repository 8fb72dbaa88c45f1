"""`ranksight act` drains a Kubernetes node: cordon, then evict the job's pods on it, through the official
`kubernetes` Python client (``KubeApi``). No API server runs here, so the client talks to a loopback
HTTP server that records each request and answers with the API's JSON; every call is also checked
against the real ``CoreV1Api`` method's signature (the client itself validates the arguments' types).
Asserted: the exact REST calls (PATCH the node with ``spec.unschedulable``, POST an Eviction per pod of
the job on that node, none for other nodes' pods or other jobs'), and the last-nodes rule reading the
job's pods and the cordoned nodes."""
from __future__ import annotations

import inspect
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Tuple
from urllib.parse import parse_qs, urlsplit

import pytest

try:
    from kubernetes import client
except ImportError:  # a missing dependency fails, as a missing binary does
    pytest.fail("the kubernetes Python client is missing: pip install kubernetes (the test extra lists it)",
                pytrace=False)

from ranksight import config
from ranksight.tools.act import ActServer
from ranksight.tools.act_engines import KubeApi, KubeEngine
from support.alertmanager_webhook import TOKEN, am_alert, am_webhook, post

PODS = [("train", "llm-worker-0", "gpu-1", "llm"), ("train", "llm-worker-1", "gpu-2", "llm"),
        ("train", "llm-worker-2", "gpu-3", "llm"), ("other", "etl-0", "gpu-1", "etl"), ("other", "etl-1", "gpu-2", "etl"),
        ("other", "etl-2", "gpu-3", "etl")]


class ApiServer:
    """Records every request; answers pods (by fieldSelector and labelSelector), nodes, patch and eviction."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, str, Dict[str, List[str]], Any]] = []
        self.cordoned: set = set()
        owner = self

        class H(BaseHTTPRequestHandler):
            def _reply(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                u = urlsplit(self.path)
                q = parse_qs(u.query)
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                owner.calls.append((self.command, u.path, q, body))
                self._reply(*owner.answer(self.command, u.path, q, body))

            do_GET = do_POST = do_PATCH = _handle  # noqa: N815

            def log_message(self, *a: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def answer(self, method: str, path: str, q: Dict[str, List[str]], body: Any) -> Tuple[int, Any]:
        if method == "GET" and path == "/api/v1/pods":
            node = (q.get("fieldSelector") or [""])[0].replace("spec.nodeName=", "")
            sel = (q.get("labelSelector") or [""])[0]
            items = [{"metadata": {"name": n, "namespace": ns, "labels": {"ranksight.io/job": job}},
                      "spec": {"nodeName": nd, "containers": []}}
                     for ns, n, nd, job in PODS if (not node or nd == node)
                     and (not sel or sel == f"ranksight.io/job={job}" or sel == "ranksight.io/job")]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        if method == "GET" and path == "/api/v1/nodes":
            items = [{"metadata": {"name": f"gpu-{i}"}, "spec": {"unschedulable": f"gpu-{i}" in self.cordoned}}
                     for i in (1, 2, 3)]
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}
        if method == "PATCH" and path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            if body == {"spec": {"unschedulable": True}}:
                self.cordoned.add(name)
            return 200, {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name}, "spec": body["spec"]}
        if method == "POST" and path.endswith("/eviction"):
            return 201, dict(body, kind="Eviction", apiVersion="policy/v1")
        return 404, {"kind": "Status", "code": 404}


class Checked:
    """A real CoreV1Api whose every call is recorded and bound to the real method's signature first."""

    def __init__(self, core: Any) -> None:
        self.core, self.calls = core, []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.core, name)

        def call(*args: Any, **kw: Any) -> Any:
            inspect.signature(getattr(client.CoreV1Api, name)).bind(self.core, *args, **kw)  # TypeError if wrong
            self.calls.append((name, args, kw))
            return real(*args, **kw)
        return call


@pytest.fixture
def kube():
    srv = ApiServer()
    conf = client.Configuration(host=srv.url)
    checked = Checked(client.CoreV1Api(client.ApiClient(conf)))
    yield srv, checked
    srv.http.shutdown()


def test_cordon_and_evict_the_jobs_pods_through_the_client(kube, tmp_path):
    srv, checked = kube
    tok = tmp_path / "token"
    tok.write_text(TOKEN)
    cfg = config.load(None, "test", env={"RANKSIGHT__act__listen": "127.0.0.1:0", "RANKSIGHT__act__token_file": str(tok),
                                         "RANKSIGHT__act__mode": "auto", "RANKSIGHT__act__dry_run": "false",
                                         "RANKSIGHT__act__engine": "kubernetes", "RANKSIGHT__act__job_min_nodes": "2"})
    engine = KubeEngine(KubeApi(checked), "ranksight.io/job")
    s = ActServer(cfg, engine=engine).start()
    try:
        code, body = post(s, am_webhook(am_alert("RanksightGpuXidError", node="gpu-1", gpu="3", xid="79")))
        assert code == 200 and body["results"][0]["state"] == "done", (body, srv.calls)
        # gpu-1 drained: llm and etl keep gpu-2 and gpu-3; draining gpu-2 would leave them one node, below 2
        code, body = post(s, am_webhook(am_alert("RanksightNicSpeedLow", node="gpu-2", device="eth0")))
        assert body["results"][0]["state"] == "last_nodes", body
    finally:
        s.stop()
    writes = [(m, p, b) for m, p, _, b in srv.calls if m != "GET"]
    assert writes == [
        ("PATCH", "/api/v1/nodes/gpu-1", {"spec": {"unschedulable": True}}),
        ("POST", "/api/v1/namespaces/train/pods/llm-worker-0/eviction",
         {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "llm-worker-0", "namespace": "train"}}),
        ("POST", "/api/v1/namespaces/other/pods/etl-0/eviction",
         {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "etl-0", "namespace": "other"}}),
    ], writes
    gets = [(p, {k: v[0] for k, v in q.items()}) for m, p, q, _ in srv.calls if m == "GET"]
    assert ("/api/v1/pods", {"fieldSelector": "spec.nodeName=gpu-1", "labelSelector": "ranksight.io/job"}) in gets
    names = [c[0] for c in checked.calls]
    assert names[-1] == "list_node" and "patch_node" in names and "create_namespaced_pod_eviction" in names
    assert srv.cordoned == {"gpu-1"}
