"""prometheus-operator's conversion of an AlertmanagerConfig into alertmanager.yml, written again
in Python for tests/unit/test_kubernetes.py (a Kubernetes API server and the operator cannot run here):
the receivers, routes and inhibit rules as the operator's pkg/alertmanager/amcfg.go builds them
with Alertmanager >= 0.22 matchers and its default matcher strategy (OnNamespace)."""
from __future__ import annotations

import copy
import json
from typing import Any, Dict, Optional

from ranksight.tools import k8s


def _matcher(m: Dict[str, str]) -> str:
    return f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}'


_ROUTE_KEYS = (("groupBy", "group_by"), ("groupWait", "group_wait"), ("groupInterval", "group_interval"),
               ("repeatInterval", "repeat_interval"), ("continue", "continue"))


def _operator_route(r: Dict[str, Any], prefix: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {"receiver": prefix + r["receiver"]}
    out.update({dst: r[src] for src, dst in _ROUTE_KEYS if src in r})
    if r.get("matchers"):
        out["matchers"] = [_matcher(m) for m in r["matchers"]]
    if r.get("routes"):
        out["routes"] = [_operator_route(c, prefix) for c in r["routes"]]
    return out


# How prometheus-operator writes each receiver field of an AlertmanagerConfig into alertmanager.yml
# (pkg/alertmanager/amcfg.go): CRD field -> (Alertmanager field, how). "secret": the Secret key's
# value; the operator inlines it, here it stays in the file it came from (the same content).
OPERATOR_RECEIVERS = {
    "webhookConfigs": ("webhook_configs", {"url": ("url", ""), "sendResolved": ("send_resolved", "")}),
    "slackConfigs": ("slack_configs", {"apiURL": ("api_url_file", "secret"), "channel": ("channel", ""),
                                       "sendResolved": ("send_resolved", ""), "title": ("title", ""),
                                       "titleLink": ("title_link", ""), "text": ("text", "")}),
    "pagerdutyConfigs": ("pagerduty_configs", {"routingKey": ("routing_key_file", "secret"), "url": ("url", ""),
                                               "sendResolved": ("send_resolved", ""),
                                               "description": ("description", ""), "severity": ("severity", ""),
                                               "details": ("details", "kv"),
                                               "pagerDutyLinkConfigs": ("links", "links")}),
    "emailConfigs": ("email_configs", {"authPassword": ("auth_password_file", "secret"),
                                       "authUsername": ("auth_username", ""), "from": ("from", ""),
                                       "smarthost": ("smarthost", ""), "to": ("to", ""),
                                       "requireTLS": ("require_tls", ""), "sendResolved": ("send_resolved", ""),
                                       "headers": ("headers", "kv"), "text": ("text", ""), "html": ("html", "")}),
    "opsgenieConfigs": ("opsgenie_configs", {"apiKey": ("api_key_file", "secret"), "apiURL": ("api_url", ""),
                                             "sendResolved": ("send_resolved", ""), "message": ("message", ""),
                                             "description": ("description", ""), "priority": ("priority", ""),
                                             "source": ("source", "")}),
}


def _operator_receiver(rc: Dict[str, Any], prefix: str, secrets: Dict[str, str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"name": prefix + rc["name"]}
    for crd_key, confs in rc.items():
        if crd_key == "name":
            continue
        am_key, fields = OPERATOR_RECEIVERS[crd_key]
        out[am_key] = []
        for c in confs:
            conv: Dict[str, Any] = {}
            for f, v in c.items():
                dst, how = fields[f]
                if how == "secret":
                    assert v["name"] == k8s.SECRET, v
                    v = secrets[v["key"]]
                elif how == "kv":
                    v = {kv["key"]: kv["value"] for kv in v}
                elif how == "links":
                    v = [{"href": link["href"], "text": link["alt"]} for link in v]
                conv[dst] = v
            out[am_key].append(conv)
    return out


def operator_view(amc: Dict[str, Any], base: Dict[str, Any],
                  secrets: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """An Alertmanager config as prometheus-operator (>= 0.22 matchers, default OnNamespace strategy)
    builds it from a base config and this AlertmanagerConfig: every receiver name prefixed with
    "<namespace>/<name>/", the route a first child route of the base's with continue: true and a
    namespace matcher, and namespace="<namespace>" appended to both sides of every inhibit rule.
    ``secrets``: the Secret's keys -> the files holding their values."""
    ns, name, spec = amc["metadata"]["namespace"], amc["metadata"]["name"], amc["spec"]
    prefix = f"{ns}/{name}/"
    nsm = f'namespace="{ns}"'
    out = copy.deepcopy(base)
    route = _operator_route(spec["route"], prefix)
    route["matchers"] = route.get("matchers", []) + [nsm]
    route["continue"] = True
    out["route"]["routes"] = [route] + out["route"].get("routes", [])
    for rc in spec["receivers"]:
        out["receivers"].append(_operator_receiver(rc, prefix, secrets or {}))
    out["inhibit_rules"] = out.get("inhibit_rules", []) + [
        {"source_matchers": [_matcher(m) for m in ir["sourceMatch"]] + [nsm],
         "target_matchers": [_matcher(m) for m in ir["targetMatch"]] + [nsm],
         "equal": ir["equal"]}
        for ir in spec["inhibitRules"]]
    return out


BASE_AM = {"route": {"receiver": "default"}, "receivers": [{"name": "default"}]}


def unprefixed(route: Dict[str, Any], prefix: str) -> Dict[str, Any]:
    out = {**route, "receiver": route["receiver"][len(prefix):] if route["receiver"].startswith(prefix) else "?"}
    if "routes" in route:
        out["routes"] = [unprefixed(c, prefix) for c in route["routes"]]
    return out
