"""The VictoriaMetrics layout as a kustomize overlay of ``ranksight k8s`` (examples/victoriametrics/):
the agent, the AlertmanagerConfig (the same Alertmanager, routes and inhibitions) and the dashboards
of the bases, with the ServiceMonitor and the PrometheusRule taken out, and

  vmagent-*.yaml        a StatefulSet of ``SHARDS`` vmagent scrape shards (each pod's ordinal is its
                        ``-promscrape.cluster.memberNum``; one target per node, so a node's series stay
                        on one shard), its headless Service, ServiceAccount and the Role to discover the
                        agents' endpoints; the scrape config in a ConfigMap
  victoria-metrics-*.yaml the single-node store (StatefulSet with a volume, Service): remote-write
                        receiver and the Prometheus query API (Grafana's datasource URL)
  vmalert-*.yaml        vmalert evaluating ``ranksight rules --engine victoriametrics`` (a ConfigMap,
                        every alert labelled with the namespace, as the PrometheusRule's are) against
                        the store, writing records and alert state back, sending to ``ALERTMANAGER``

``render(cfg, namespace, labels, app, rule_groups) -> {path: object}``: one object a file under examples/victoriametrics/,
with their kustomization.yaml. docs/SCALING.md says when to use it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping

import yaml

from ranksight import triage

DIR = "examples/victoriametrics"
SHARDS = 2
VM_VERSION = "v1.79.5"  # Debian's victoria-metrics, which the tests run
STORE, VMAGENT, VMALERT = "victoria-metrics", "vmagent", "vmalert"
STORE_PORT, VMAGENT_PORT, VMALERT_PORT = 8428, 8429, 8880
# prometheus-operator's Alertmanager of kube-prometheus-stack (its Service in the monitoring namespace)
ALERTMANAGER = "http://alertmanager-operated.monitoring.svc:9093"


class _Base:
    """What the overlay takes from k8s.py's render: its labels, the agent's Service name, the rule groups."""

    labels: Callable[[str], Dict[str, str]]
    app: str = ""
    rule_groups: List[Dict[str, Any]] = []


_base = _Base()


def _meta(name: str, namespace: str, component: str) -> Dict[str, Any]:
    labels = {**_base.labels(component), "app.kubernetes.io/name": name}
    return {"name": name, "namespace": namespace, "labels": labels}


def _selector(name: str) -> Dict[str, Any]:
    return {"matchLabels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "ranksight"}}


def _container(name: str, args: List[str], port: int, mounts: List[Dict[str, Any]], env=None) -> Dict[str, Any]:
    c: Dict[str, Any] = {
        "name": name, "image": f"victoriametrics/{name}:{VM_VERSION}", "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "volumeMounts": mounts,
    }
    if env:
        c["env"] = env
    return c


def _service(name: str, namespace: str, port: int, headless: bool = False) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"selector": _selector(name)["matchLabels"],
                            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace, "metrics"), "spec": spec}


def scrape_config(cfg: Mapping[str, Any], namespace: str) -> str:
    """The agents' scrape job for vmagent: the ServiceMonitor's (the agent Service's endpoints,
    honor_labels, job = the Service name) in Prometheus' scrape_config terms."""
    job = {"job_name": triage.SCRAPE_JOB, "honor_labels": True, "scrape_interval": "15s", "scrape_timeout": "10s",
           "kubernetes_sd_configs": [{"role": "endpoints", "namespaces": {"names": [namespace]}}],
           "relabel_configs": [
               {"source_labels": ["__meta_kubernetes_service_name", "__meta_kubernetes_endpoint_port_name"],
                "regex": f"{_base.app};metrics", "action": "keep"},
               {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
               {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]}
    return yaml.safe_dump({"scrape_configs": [job]}, sort_keys=False)


def vmalert_rules(rule_groups: List[Dict[str, Any]]) -> str:
    """The PrometheusRule's groups (every alert labelled with the namespace) rewritten for vmalert."""
    from ranksight.alerts import engines

    return engines.victoriametrics(yaml.safe_dump({"groups": rule_groups}, sort_keys=False, width=100000))


def render(cfg: Mapping[str, Any], namespace: str, labels: Callable[[str], Dict[str, str]], app: str,
           rule_groups: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """``labels(component)``: k8s.py's object labels; ``app``: the agent Service's name; ``rule_groups``:
    the PrometheusRule's groups."""
    _base.labels, _base.app, _base.rule_groups = labels, app, rule_groups
    store_url = f"http://{STORE}.{namespace}.svc:{STORE_PORT}"
    pod_name = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    agent_args = ["-promscrape.config=/config/scrape.yml", f"-remoteWrite.url={store_url}/api/v1/write",
                  "-remoteWrite.tmpDataPath=/buffer", f"-httpListenAddr=:{VMAGENT_PORT}",
                  f"-promscrape.cluster.membersCount={SHARDS}", "-promscrape.cluster.memberNum=$(POD_NAME)",
                  "-promscrape.suppressScrapeErrors"]
    vmagent = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(VMAGENT, namespace, "metrics"),
        "spec": {"serviceName": VMAGENT, "replicas": SHARDS, "selector": _selector(VMAGENT),
                 "template": {"metadata": {"labels": _meta(VMAGENT, namespace, "metrics")["labels"]},
                              "spec": {"serviceAccountName": VMAGENT, "containers": [_container(
                                  VMAGENT, agent_args, VMAGENT_PORT,
                                  [{"name": "config", "mountPath": "/config", "readOnly": True},
                                   {"name": "buffer", "mountPath": "/buffer"}], pod_name)],
                                       "volumes": [{"name": "config", "configMap": {"name": f"{VMAGENT}-scrape"}},
                                                   {"name": "buffer", "emptyDir": {}}]}}}}
    store = {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(STORE, namespace, "metrics"),
        "spec": {"serviceName": STORE, "replicas": 1, "selector": _selector(STORE),
                 "template": {"metadata": {"labels": _meta(STORE, namespace, "metrics")["labels"]},
                              "spec": {"containers": [_container(
                                  STORE, ["-storageDataPath=/storage", "-retentionPeriod=1y",
                                          "-search.latencyOffset=1s", f"-httpListenAddr=:{STORE_PORT}"],
                                  STORE_PORT, [{"name": "storage", "mountPath": "/storage"}])]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "storage"}, "spec": {
                     "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}}}]}}
    alert_args = ["-rule=/rules/*.yml", f"-datasource.url={store_url}", f"-remoteWrite.url={store_url}",
                  f"-remoteRead.url={store_url}", f"-notifier.url={ALERTMANAGER}", "-evaluationInterval=15s",
                  f"-httpListenAddr=:{VMALERT_PORT}"]
    vmalert = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(VMALERT, namespace, "rules"),
        "spec": {"replicas": 1, "selector": _selector(VMALERT),
                 "template": {"metadata": {"labels": _meta(VMALERT, namespace, "rules")["labels"]},
                              "spec": {"containers": [_container(
                                  VMALERT, alert_args, VMALERT_PORT,
                                  [{"name": "rules", "mountPath": "/rules", "readOnly": True}])],
                                       "volumes": [{"name": "rules", "configMap": {"name": f"{VMALERT}-rules"}}]}}}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(VMAGENT, namespace, "metrics"),
            "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods"],
                       "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": _meta(VMAGENT, namespace, "metrics"),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": VMAGENT},
               "subjects": [{"kind": "ServiceAccount", "name": VMAGENT, "namespace": namespace}]}
    scrape = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{VMAGENT}-scrape", namespace, "metrics"),
              "data": {"scrape.yml": scrape_config(cfg, namespace)}}
    rules = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{VMALERT}-rules", namespace, "rules"),
             "data": {"ranksight-rules.yml": vmalert_rules(rule_groups)}}
    docs = {
        "vmagent-statefulset.yaml": vmagent, "vmagent-service.yaml": _service(VMAGENT, namespace, VMAGENT_PORT, True),
        "vmagent-serviceaccount.yaml": {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": _meta(VMAGENT, namespace, "metrics")},
        "vmagent-role.yaml": role, "vmagent-rolebinding.yaml": binding, "vmagent-scrape.yaml": scrape,
        "victoria-metrics-statefulset.yaml": store, "victoria-metrics-service.yaml": _service(STORE, namespace, STORE_PORT),
        "vmalert-deployment.yaml": vmalert, "vmalert-service.yaml": _service(VMALERT, namespace, VMALERT_PORT),
        "vmalert-rules.yaml": rules,
    }
    out = {f"{DIR}/{name}": doc for name, doc in docs.items()}
    out[f"{DIR}/kustomization.yaml"] = kustomization(namespace, app, sorted(docs))
    return out


def kustomization(namespace: str, app: str, files: List[str]) -> Dict[str, Any]:
    delete = [("monitoring.coreos.com/v1", "ServiceMonitor", app), ("monitoring.coreos.com/v1", "PrometheusRule", "ranksight")]
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            # the bases, not ../.. (a kustomization may not include the folder it lives in): create the namespace first
            "resources": ["../../agent", "../../monitoring", "../../dashboards", *files],
            "patches": [{"patch": yaml.safe_dump({"$patch": "delete", "apiVersion": api, "kind": kind,
                                                  "metadata": {"name": name, "namespace": namespace}},
                                                 sort_keys=False)} for api, kind, name in delete]}
