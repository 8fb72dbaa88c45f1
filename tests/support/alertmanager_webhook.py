"""Alertmanager's webhook JSON (version 4, as Alertmanager 0.25 posts it to a webhook receiver) and a
poster with the bearer token, for the tests of `ranksight act`."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Tuple

TOKEN = "s3cret-token-for-act"


def am_alert(name: str, status: str = "firing", fp: str = "", starts: str = "2026-12-06T11:00:00.000Z",
           **labels: str) -> Dict[str, Any]:
    lb = {"alertname": name, "severity": "critical", **labels}
    return {"status": status, "labels": lb,
            "annotations": {"summary": "s", "runbook_url": "https://example.com/rb.md"},
            "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-12-06T11:05:00Z",
            "generatorURL": "http://prom:9090/graph?g0.expr=x", "fingerprint": fp or f"{abs(hash(str(lb))):016x}"[:16]}


def am_webhook(*alerts: Dict[str, Any]) -> Dict[str, Any]:
    """Alertmanager's webhook body (version 4) for one group."""
    return {"receiver": "ranksight-act", "status": alerts[0]["status"], "alerts": list(alerts),
            "groupLabels": {"job": alerts[0]["labels"].get("job", "")},
            "commonLabels": {"alertname": alerts[0]["labels"]["alertname"]}, "commonAnnotations": {},
            "externalURL": "http://am:9093", "version": "4",
            "groupKey": '{}/{alertname=~"Ranksight.*"}:{job="j"}', "truncatedAlerts": 0}


def post(s, doc: Any, token: str = TOKEN, path: str = "/alerts") -> Tuple[int, Any]:
    data = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    req = urllib.request.Request(s.url + path, data=data, method="POST", headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
