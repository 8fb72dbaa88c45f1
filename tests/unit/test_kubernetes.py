"""Kubernetes manifests (`ranksight k8s`, deploy/kubernetes/): fresh, valid against the Kubernetes
schemas (kubernetes-validate) and the prometheus-operator CRDs' own schemas, built by
`kubectl kustomize`, and holding the same rules and inhibitions that promtool and amtool test
(the AlertmanagerConfig converted the way prometheus-operator converts it)."""
from __future__ import annotations

import copy
import functools
import json
import re
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ranksight import catalog, config, protocol, triage
from ranksight.tools import k8s, k8s_vm
from ranksight.alerts import generate as alerts
from ranksight.alerts import notify
from ranksight.common.plumbing import AlertmanagerAPI, free_port, set_pdeathsig, wait_until
from conftest import require_binary
from support.operator_view import BASE_AM, operator_view, unprefixed

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "deploy" / "kubernetes"
CRDS = Path(__file__).resolve().parents[1] / "data" / "prometheus-operator"
NS = k8s.NAMESPACE
# the oldest Kubernetes still in vendors' support windows, and the newest kubernetes-validate knows
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


def _tool(name: str, how: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if not path:
        pytest.fail(f"{name} not found: {how}", pytrace=False)
    return path


def _run(*cmd: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def cfg() -> config.Config:
    return config.load(None, "default", env={})


@pytest.fixture(scope="module")
def files(cfg) -> Dict[str, str]:
    return k8s.render(cfg)


@pytest.fixture(scope="module")
def docs(files) -> Dict[str, Dict[str, Any]]:
    """The prometheus-operator layout's objects (the VictoriaMetrics overlay's are vm_docs)."""
    return {p: d for p, d in k8s.manifests(files).items() if not p.startswith(k8s_vm.DIR + "/")}


@pytest.fixture(scope="module")
def vm_docs(files) -> Dict[str, Dict[str, Any]]:
    return {p: d for p, d in k8s.manifests(files).items() if p.startswith(k8s_vm.DIR + "/")}


def _kind(docs: Dict[str, Dict[str, Any]], kind: str) -> Dict[str, Any]:
    found = [d for d in docs.values() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


# ------------------------------------------------------------------ freshness and the CLI
def test_committed_manifests_equal_a_fresh_render(files):
    bad = k8s.stale(files, OUT)
    assert not bad, (f"deploy/kubernetes/ differs from a fresh render ({bad}); "
                     "run `ranksight k8s --in-place` and commit")


def test_render_is_deterministic_and_follows_namespace_and_image(cfg, files):
    assert k8s.render(cfg) == files
    other = k8s.manifests(k8s.render(cfg, namespace="gpu-monitoring", image="registry.example/ra:1"))
    for path, doc in other.items():
        if doc["kind"] != "Namespace" and path != k8s.EXAMPLE_JOB:
            assert doc["metadata"]["namespace"] == "gpu-monitoring", path
    assert any(p.startswith(k8s_vm.DIR) for p in other)
    alert_rules = [r for g in _kind(other, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert {r["labels"]["namespace"] for r in alert_rules} == {"gpu-monitoring"}
    ds = _kind(other, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert ds["image"] == "registry.example/ra:1"


def test_stale_reads_only_the_generators_layout(files, tmp_path):
    """An --out above another render (deploy/ above deploy/kubernetes/) neither counts nor removes
    that render's files."""
    for path, text in files.items():
        (tmp_path / "kubernetes" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "kubernetes" / path).write_text(text)
    assert k8s.stale(files, tmp_path) == list(files)  # every file missing here, nothing extra


@pytest.mark.slow
def test_cli_check_write_and_bad_usage(tmp_path):
    cli = [sys.executable, "-m", "ranksight", "k8s"]
    r = _run(*cli, "--check", "--out", str(tmp_path))
    assert r.returncode == 1 and f"(run `ranksight k8s --out {tmp_path}`)" in r.stdout
    r = _run(*cli, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert not k8s.stale(k8s.render(config.load(None, "default", env={})), tmp_path)
    (tmp_path / "dashboards" / "ranksight-old.yaml").write_text(k8s.HEADER.format(profile="default"))
    (tmp_path / "mine.yaml").write_text("kind: ConfigMap\n")  # not ours: left alone
    assert _run(*cli, "--check", "--out", str(tmp_path)).returncode == 1
    assert _run(*cli, "--out", str(tmp_path)).returncode == 0
    assert not (tmp_path / "dashboards" / "ranksight-old.yaml").exists() and (tmp_path / "mine.yaml").exists()
    for bad in (["--namespace", "Bad_NS"], ["--image", "a b"], ["--profile", "nope"]):
        r = _run(*cli, *bad, "--out", str(tmp_path))
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)
        assert len(r.stderr.strip().splitlines()) <= 2, r.stderr


# ------------------------------------------------------------------ Kubernetes schemas
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_manifests_validate_strictly(docs, version):
    checked = []
    for path, doc in docs.items():
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path}: {e.message} at {'/'.join(map(str, e.path))}", pytrace=False)
        checked.append(doc["kind"])
    assert sorted(checked) == sorted(["Namespace", "DaemonSet", "Service", "Job"] + ["ConfigMap"] * 4)


def test_kubernetes_validate_catches_a_misspelled_field(docs):
    bad = copy.deepcopy(_kind(docs, "DaemonSet"))
    bad["spec"]["template"]["spec"]["hostNetwrk"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


class _CrdLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The CRDs and kubectl write matchType values as a bare `=`, which YAML 1.1 reads as the value tag."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def _strict(schema: Any) -> Any:
    """The CRD's structural schema as JSON Schema, with unknown fields rejected (the API server
    prunes them, silently losing a misspelled field) except where the CRD preserves them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: {n: _strict(p) for n, p in v.items()} if k == "properties" else _strict(v)
           for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _crds() -> List[Dict[str, Any]]:
    return [yaml.load(p.read_text(), Loader=_CrdLoader) for p in sorted(CRDS.glob("monitoring.coreos.com_*.yaml"))]


def _crd_validator(kind: str, api_version: str) -> jsonschema.Draft4Validator:
    for crd in _crds():
        if crd["spec"]["names"]["kind"] != kind:
            continue
        for v in crd["spec"]["versions"]:
            if f"{crd['spec']['group']}/{v['name']}" == api_version and v.get("served"):
                return jsonschema.Draft4Validator(_strict(v["schema"]["openAPIV3Schema"]))
    pytest.fail(f"no CRD for {api_version} {kind} under {CRDS}", pytrace=False)


def test_custom_resources_validate_against_the_crds(docs):
    kinds = []
    for path, doc in docs.items():
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        v = _crd_validator(doc["kind"], doc["apiVersion"])
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]
        assert not errors, f"{path}: {errors[:5]}"
        kinds.append(doc["kind"])
        bad = copy.deepcopy(doc)
        bad["spec"]["honorLabel"] = True  # a misspelling the API server would drop
        assert list(v.iter_errors(bad)), f"{path}: the strict schema let a misspelled field through"
    assert sorted(kinds) == ["AlertmanagerConfig", "PrometheusRule", "ServiceMonitor"]
    am = copy.deepcopy(_kind(docs, "AlertmanagerConfig"))
    am["spec"]["inhibitRules"][0]["sourceMatch"][0]["matchType"] = "=="
    assert list(_crd_validator("AlertmanagerConfig", am["apiVersion"]).iter_errors(am))


# ------------------------------------------------------------------ kustomize
def test_kubectl_kustomize_builds_every_base(docs):
    kubectl = _tool("kubectl", "it comes with the project's machine image (google-cloud-sdk's kubectl, with "
                    "kustomize built in); Debian has no package for it")
    built: List[Dict[str, Any]] = []
    for base in k8s.BASES:
        r = _run(kubectl, "kustomize", str(OUT / base))
        assert r.returncode == 0, f"{base}: {r.stderr}"
        built += [d for d in yaml.load_all(r.stdout, Loader=_CrdLoader) if d]
    r = _run(kubectl, "kustomize", str(OUT))
    assert r.returncode == 0, r.stderr
    whole = [d for d in yaml.load_all(r.stdout, Loader=_CrdLoader) if d]
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    resources = [d for p, d in docs.items() if p != k8s.EXAMPLE_JOB]
    assert sorted(map(key, whole)) == sorted(map(key, resources))
    assert sorted(map(key, built)) == sorted(key(d) for d in resources if d["kind"] != "Namespace")
    for d in whole:  # kustomize changed nothing but the order
        assert d in resources, key(d)
    r = _run(kubectl, "kustomize", str(OUT / Path(k8s.EXAMPLE_OVERLAY).parent))
    assert r.returncode == 0, r.stderr
    overlay = [d for d in yaml.load_all(r.stdout, Loader=_CrdLoader) if d]
    assert sorted(map(key, overlay)) == sorted(map(key, built))
    for d in overlay:
        assert d["metadata"]["labels"]["release"] == k8s.STACK_RELEASE, key(d)
    ds = next(d for d in overlay if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].startswith("registry.example.com/")
    assert ds["spec"]["selector"] == _kind(docs, "DaemonSet")["spec"]["selector"]  # selectors untouched


NODE = "k8s-node-1"  # what the downward API's spec.nodeName gives a pod in these tests


def env_of(container: dict) -> dict:
    """A container's env as kubelet resolves it (values, and spec.nodeName from the downward API)."""
    out = {}
    for e in container["env"]:
        if "value" in e:
            out[e["name"]] = e["value"]
        else:
            assert e["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, e
            out[e["name"]] = NODE
    return out


def expand(arg: str, env: dict) -> str:
    """kubelet's $(VAR) expansion in command and args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


# ------------------------------------------------------------------ what the manifests promise
def test_daemonset_sees_the_host_without_claiming_a_gpu(docs, cfg):
    ds = _kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    (c,) = pod["containers"]
    env = env_of(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "--node=" + NODE in [expand(a, env) for a in c["args"]], "the node label is the Kubernetes node name"
    assert not any("nvidia.com" in k for part in c["resources"].values() for k in part), "claims a GPU"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for host in ("/proc", "/sys"):
        m = next(m for m in c["volumeMounts"] if volumes[m["name"]].get("hostPath", {}).get("path") == host)
        assert m.get("readOnly") is True, host
        assert f"--{host[1:]}fs={m['mountPath']}" in c["args"]
    assert volumes[mounts[k8s.SOCKET_DIR]["name"]]["hostPath"]["path"] == k8s.SOCKET_DIR
    assert f"--ingest={k8s.AGENT_ENV}" in c["args"] and k8s.AGENT_ENV.startswith(f"unix://{k8s.SOCKET_DIR}/")
    assert not any(p.get("hostPort") for p in c["ports"] if p.get("protocol") == "UDP"), "ingest opened on the node"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"] == k8s.RESOURCES and set(c["resources"]) == {"requests", "limits"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]


TRAINER = """
import torch, ranksight
m = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for x in ranksight.watch(m, opt, [torch.randn(2, 4) for _ in range(5)]):
    m(x).sum().backward(); opt.step(); opt.zero_grad()
ranksight.unwatch()
"""


def _metric(url: str, name: str, job: str) -> "float | None":
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:  # noqa: S310 - our loopback agent
        text = r.read().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get("job") == job:
                return s.value
    return None


def _send_as(uid: int, path: str, job: str) -> int:
    """From a forked child running as uid, send one step record (carrying the child's own pid, as
    the agent checks the sender's credentials) to a unix socket: the child's exit status."""
    pid = os.fork()
    if pid == 0:  # the child: no Python-level cleanup, just the send
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            rec = {"v": protocol.VERSION, "t": "step", "job": job, "rank": 0, "lr": 0, "ws": 1, "node": "n1",
                   "pid": os.getpid(), "ts": time.time(), "seq": 1, "dur": 0.1}
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(protocol.encode(rec), path)
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.slow
def test_daemonset_command_and_the_training_pods_lines_reach_the_agent_as_another_user(docs):
    """The DaemonSet's own command line (the host paths pointed at this machine) runs the agent; a
    watched loop with the training Job's RANKSIGHT_AGENT sends its steps through the socket folder,
    and so can a process of another user (uid 65534)."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to run the rank as another user than the agent (uid {os.geteuid()})")
    (c,) = _kind(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    (trainer,) = docs[k8s.EXAMPLE_JOB]["spec"]["template"]["spec"]["containers"]
    sockdir = Path(tempfile.mkdtemp(prefix="ranksight-", dir="/tmp"))
    sockdir.chmod(0o755)  # as kubelet creates a DirectoryOrCreate hostPath

    def here(arg: str) -> str:
        return arg.replace("/host/proc", "/proc").replace("/host/sys", "/sys").replace(k8s.SOCKET_DIR, str(sockdir))

    port = free_port()
    cenv = env_of(c)
    args = [here(expand(a, cenv)) for a in c["args"] if not a.startswith(("--listen=", "--collectors="))]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **cenv}
    agent = subprocess.Popen([*c["command"], *args, f"--listen=127.0.0.1:{port}", "--collectors=ranks"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig)
    url = f"http://127.0.0.1:{port}"
    try:
        probe = c["livenessProbe"]["httpGet"]["path"]
        assert wait_until(lambda: urllib.request.urlopen(url + probe, timeout=2).status == 200, 20), "no /healthz"
        sock = sockdir / Path(k8s.SOCKET).name
        assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) & 0o666 == 0o666
        tenv = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSIGHT", "TORCHELASTIC", "SLURM"))}
        tenv.update({k: here(v) for k, v in env_of(trainer).items()})
        tenv["RANKSIGHT_JOB"] = "pod-job"
        r = subprocess.run([sys.executable, "-c", TRAINER], env=tenv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        got = wait_until(lambda: _metric(url, catalog.STEPS.name, "pod-job") == 5, 10)
        assert got, (_metric(url, catalog.STEPS.name, "pod-job"), r.stderr[-2000:])
        text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        assert re.search(rf'^{catalog.STEPS.name}{{[^}}]*job="pod-job"[^}}]*node="{NODE}"', text, re.M) or \
            re.search(rf'^{catalog.STEPS.name}{{[^}}]*node="{NODE}"[^}}]*job="pod-job"', text, re.M), \
            "the rank's node label is the Kubernetes node name, as the agent's"
        assert re.search(rf'^{catalog.TRACKED_RANKS.name}{{[^}}]*node="{NODE}"', text, re.M), "the agent's node label"
        # a rank of another user (the interpreter lives under /root, so fork instead of exec)
        assert _send_as(65534, str(sock), "nobody-job") == 0, "uid 65534 could not send to the socket"
        assert wait_until(lambda: _metric(url, catalog.STEPS.name, "nobody-job") == 1, 10)
    finally:
        agent.terminate()
        out = agent.communicate(timeout=15)[0]
        shutil.rmtree(sockdir, ignore_errors=True)
    assert agent.returncode == 0, out[-2000:]


def test_scrape_job_is_the_one_the_health_alerts_select(docs, cfg):
    svc, sm = _kind(docs, "Service"), _kind(docs, "ServiceMonitor")
    assert svc["metadata"]["name"] == triage.SCRAPE_JOB  # prometheus-operator: job = the Service's name
    assert "jobLabel" not in sm["spec"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (ep,) = sm["spec"]["endpoints"]
    assert ep["honorLabels"] is True and ep["port"] == svc["spec"]["ports"][0]["name"]
    pod_labels = _kind(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_dashboards_are_configmaps_for_grafanas_sidecar(docs, cfg):
    from ranksight.dashboards import generate as dashboards

    cms = [d for p, d in docs.items() if d["kind"] == "ConfigMap" and p.startswith("dashboards/")]
    assert not [d for p, d in docs.items() if "grafana_dashboard" in d["metadata"].get("labels", {})
                and not p.startswith("dashboards/")]
    models = dashboards.render(cfg)
    assert sorted(k for cm in cms for k in cm["data"]) == sorted(models)
    for cm in cms:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (name, text), = cm["data"].items()
        assert json.loads(text) == models[name]
        assert len(text.encode()) < 256 * 1024  # fits kubectl apply's last-applied annotation


# ------------------------------------------------------------------ rules: promtool
def _rule_groups(docs) -> List[Dict[str, Any]]:
    return _kind(docs, "PrometheusRule")["spec"]["groups"]


def test_prometheusrule_holds_the_generated_rule_groups(docs, cfg):
    groups = copy.deepcopy(_rule_groups(docs))
    for g in groups:
        for r in g["rules"]:
            if "alert" in r:
                assert r["labels"].pop("namespace") == NS, r["alert"]
    assert groups == yaml.safe_load(alerts.render_rules(cfg))["groups"]


def _namespaced_tests(src: Path, dst: Path) -> int:
    """The hand-written promtool tests, expecting the alerts' namespace label too."""
    n = 0
    for path in sorted(src.glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["tests"]:
            for t in case.get("alert_rule_test", []):
                for a in t.get("exp_alerts") or []:
                    a.setdefault("exp_labels", {})["namespace"] = NS
                    n += 1
        (dst / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return n


@pytest.mark.slow
def test_promtool_checks_and_tests_the_prometheusrule(docs, cfg, tmp_path):
    promtool = require_binary("promtool")
    rules = tmp_path / "ranksight-rules.yml"
    rules.write_text(yaml.safe_dump({"groups": _rule_groups(docs)}, sort_keys=False))
    r = _run(promtool, "check", "rules", str(rules))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(triage.recording_rules(cfg)) + len(triage.table(cfg))} rules found" in r.stdout
    (tmp_path / "tests").mkdir()
    assert _namespaced_tests(ROOT / "alerts" / "tests", tmp_path / "tests") > 20
    names = sorted(p.name for p in (tmp_path / "tests").glob("*.yml"))
    r = _run(promtool, "test", "rules", *(f"tests/{n}" for n in names), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert r.stdout.count("SUCCESS") == len(names)


# ------------------------------------------------------------------ inhibition: amtool
def test_alertmanagerconfig_holds_the_generated_route_and_inhibitions(docs, cfg, tmp_path):
    view = operator_view(_kind(docs, "AlertmanagerConfig"), BASE_AM)
    nsm, prefix = f'namespace="{NS}"', f"{NS}/ranksight/"
    back = [{"source_matchers": [m for m in ir["source_matchers"] if m != nsm],
             "target_matchers": [m for m in ir["target_matchers"] if m != nsm],
             "equal": ir["equal"]} for ir in view["inhibit_rules"]]
    assert back == notify.inhibit_rules(cfg)
    assert all(nsm in ir["source_matchers"] and nsm in ir["target_matchers"] for ir in view["inhibit_rules"])
    standalone = yaml.safe_load(notify.render_alertmanager(cfg))
    sub = unprefixed(copy.deepcopy(view["route"]["routes"][0]), prefix)
    assert sub.pop("continue") is True and sub["matchers"].pop() == nsm
    assert sub == standalone["route"]["routes"][0]  # the ranksight subtree, routes by severity included
    assert [{**r, "name": r["name"][len(prefix):]} for r in view["receivers"][1:]] == standalone["receivers"]
    amtool = require_binary("amtool")
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(view, sort_keys=False))
    r = _run(amtool, "check-config", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(notify.inhibit_rules(cfg))} inhibit rules" in r.stdout
    r = _run(amtool, "config", "routes", "test", f"--config.file={path}", "alertname=RanksightCommBound",
             "severity=warning", f"namespace={NS}", "job=train")
    assert r.returncode == 0 and r.stdout.split()[0] == f"{prefix}ranksight-webhook", r.stdout + r.stderr
    r = _run(amtool, "config", "routes", "test", f"--config.file={path}", "alertname=RanksightCommBound",
             "severity=warning", "namespace=elsewhere", "job=train")
    assert r.returncode == 0 and r.stdout.split()[0] == "default", r.stdout + r.stderr


def test_on_call_receivers_convert_with_their_secrets_in_a_secret(tmp_path):
    """Slack, PagerDuty, e-mail and Opsgenie receivers: the AlertmanagerConfig names the Secret's keys
    where alertmanager.yml names files; converted back as the operator does, it is the standalone
    config again, and amtool accepts it with the template of the templates ConfigMap."""
    files = {n: tmp_path / n for n in ("slack", "pd", "mail", "og")}
    files["slack"].write_text("https://hooks.slack.example/services/T0/B0/x\n")
    for n in ("pd", "mail", "og"):
        files[n].write_text(f"{n}-secret\n")
    conf = tmp_path / "config.yml"
    conf.write_text(yaml.safe_dump({"alerting": {
        "receivers": {
            "chat": {"type": "slack", "api_url_file": str(files["slack"]), "channel": "#oncall"},
            "pager": {"type": "pagerduty", "routing_key_file": str(files["pd"])},
            "mail": {"type": "email", "to": "oncall@example.com", "from": "ranksight@example.com",
                     "smarthost": "smtp.example.com:587", "auth_username": "ranksight",
                     "auth_password_file": str(files["mail"])},
            "ops": {"type": "opsgenie", "api_key_file": str(files["og"])}},
        "routes": {"critical": ["pager", "ops"], "warning": "chat", "info": "mail", "lint": "chat"}}}))
    cfg = config.load(str(conf), "default", env={})
    docs = k8s.manifests(k8s.render(cfg))
    amc = _kind(docs, "AlertmanagerConfig")
    v = _crd_validator("AlertmanagerConfig", amc["apiVersion"])
    assert not [e.message for e in v.iter_errors(amc)]
    secrets = k8s.secret_files(cfg)
    assert secrets == {"chat-api-url": str(files["slack"]), "pager-routing-key": str(files["pd"]),
                       "mail-auth-password": str(files["mail"]), "ops-api-key": str(files["og"])}
    assert str(files["pd"]) not in json.dumps(amc) and "pd-secret" not in json.dumps(amc)
    view = operator_view(amc, BASE_AM, secrets)
    standalone = yaml.safe_load(notify.render_alertmanager(cfg))
    prefix = f"{NS}/ranksight/"
    assert [{**r, "name": r["name"][len(prefix):]} for r in view["receivers"][1:]] == standalone["receivers"]
    sub = unprefixed(copy.deepcopy(view["route"]["routes"][0]), prefix)
    sub.pop("continue"), sub["matchers"].pop()
    assert sub == standalone["route"]["routes"][0]
    (cm,) = [d for d in docs.values() if d["metadata"]["name"] == k8s.TEMPLATES]
    ((name, text),) = cm["data"].items()
    assert text == notify.render_template(cfg)
    (tmp_path / name).write_text(text)
    view["templates"] = [str(tmp_path / name)]
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(view, sort_keys=False))
    amtool = require_binary("amtool")
    r = _run(amtool, "check-config", str(path))
    assert r.returncode == 0 and f"{1 + len(standalone['receivers'])} receivers" in r.stdout, r.stdout + r.stderr
    r = _run(amtool, "config", "routes", "test", f"--config.file={path}", "alertname=RanksightRankDown",
             "severity=critical", f"namespace={NS}", "job=train")
    assert r.stdout.split()[0] == f"{prefix}ranksight-pager,{prefix}ranksight-ops", r.stdout
    r = _run(sys.executable, "-m", "ranksight", "k8s", "--config", str(conf), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert f"create secret generic {k8s.SECRET} " in r.stdout
    assert f"--from-file=chat-api-url={files['slack']}" in r.stdout


def _post_alerts(am_url: str, alerts_: List[Dict[str, str]]) -> None:
    AlertmanagerAPI(am_url).post_alerts([{"labels": a} for a in alerts_])


@pytest.mark.slow
def test_real_stack_loads_the_prometheusrule_and_inhibits_by_namespace(docs, cfg, local_stack):
    """A real Prometheus loads the PrometheusRule's groups; a real Alertmanager with the operator's
    view of the AlertmanagerConfig mutes a symptom under its cause when both carry the namespace
    label the PrometheusRule sets, and (the operator's namespace matcher) not without it."""
    view = operator_view(_kind(docs, "AlertmanagerConfig"), BASE_AM)
    rules = yaml.safe_dump({"groups": _rule_groups(docs)}, sort_keys=False)
    s = local_stack(files={"ranksight-rules.yml": rules, "alertmanager.yml": yaml.safe_dump(view)})
    want = [r.get("record") or r.get("alert") for g in _rule_groups(docs) for r in g["rules"]]
    assert sorted(s.prom.rule_names()) == sorted(want)
    cause = {"alertname": "RanksightDataloaderBound", "job": "train", "node": "n1", "rank": "0"}
    symptom = {"alertname": "RanksightCommBound", "job": "train", "node": "n1", "rank": "1"}
    _post_alerts(s.am_url, [{**cause, "namespace": NS}, {**symptom, "namespace": NS},
                            {**cause, "job": "other"}, {**symptom, "job": "other"}])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = {(a["labels"]["alertname"], a["labels"]["job"]): bool(a["status"]["inhibitedBy"])
                 for a in s.am.alerts()}
        if state.get(("RanksightCommBound", "train")):
            break
        time.sleep(0.2)
    assert state == {("RanksightDataloaderBound", "train"): False, ("RanksightCommBound", "train"): True,
                     ("RanksightDataloaderBound", "other"): False, ("RanksightCommBound", "other"): False}


# ------------------------------------------------------------------ the VictoriaMetrics overlay
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_victoriametrics_overlay_validates_strictly(vm_docs, version):
    for path, doc in vm_docs.items():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path}: {e.message} at {'/'.join(map(str, e.path))}", pytrace=False)
    assert sorted(d["kind"] for d in vm_docs.values()) == sorted(
        ["StatefulSet", "StatefulSet", "Deployment", "Service", "Service", "Service", "ServiceAccount", "Role",
         "RoleBinding", "ConfigMap", "ConfigMap"])


def test_kubectl_kustomize_builds_the_victoriametrics_overlay(docs, vm_docs, cfg):
    kubectl = _tool("kubectl", "it comes with the project's machine image")
    r = _run(kubectl, "kustomize", str(OUT / k8s_vm.DIR))
    assert r.returncode == 0, r.stderr
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.load_all(r.stdout, Loader=_CrdLoader) if d}
    kinds = {k for k, _ in built}
    assert "ServiceMonitor" not in kinds and "PrometheusRule" not in kinds  # vmagent and vmalert instead
    assert ("AlertmanagerConfig", "ranksight") in built  # the same Alertmanager routes and inhibitions
    assert ("DaemonSet", triage.SCRAPE_JOB) in built and sum(k == "ConfigMap" for k in kinds) == 1
    for d in vm_docs.values():
        assert built[(d["kind"], d["metadata"]["name"])] == d
    agent = built[("StatefulSet", k8s_vm.VMAGENT)]
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"-promscrape.cluster.membersCount={agent['spec']['replicas']}" in args
    assert "-promscrape.cluster.memberNum=$(POD_NAME)" in args  # vmagent reads the ordinal of vmagent-N
    scrape = yaml.safe_load(built[("ConfigMap", "vmagent-scrape")]["data"]["scrape.yml"])
    (job,) = scrape["scrape_configs"]
    assert job["job_name"] == triage.SCRAPE_JOB and job["honor_labels"] is True
    rules = yaml.safe_load(built[("ConfigMap", "vmalert-rules")]["data"]["ranksight-rules.yml"])
    prom = _kind(docs, "PrometheusRule")["spec"]["groups"]
    assert [g["name"] for g in rules["groups"]] == [g["name"] for g in prom]
    assert [r.get("labels") for g in rules["groups"] for r in g["rules"]] == \
        [r.get("labels") for g in prom for r in g["rules"]]  # every alert labelled with the namespace
    va = built[("Deployment", k8s_vm.VMALERT)]["spec"]["template"]["spec"]["containers"][0]["args"]
    store = f"http://{k8s_vm.STORE}.{NS}.svc:{k8s_vm.STORE_PORT}"
    assert {f"-datasource.url={store}", f"-remoteWrite.url={store}", f"-remoteRead.url={store}"} <= set(va)
