"""The files ``ranksight stack`` renders from the checkout and the triage table, for both of its
layouts (stack.py's Prometheus, vmstack.py's VictoriaMetrics): deploy/ of the checkout, deploy/prometheus.yml
with the local targets, and the generated rules, alertmanager.yml and templates. stack.py re-exports them."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import yaml

from .. import config, triage
from ..common.servers import ServerError as StackError

ALERTMANAGER_FILE = "alertmanager.yml"
TEMPLATES_DIR = "templates"  # Alertmanager notification templates, beside alertmanager.yml


def deploy_dir() -> Path:
    """deploy/ of this checkout (next to the ranksight/ package), else ./deploy."""
    here = Path(__file__).resolve().parents[2] / "deploy"
    for d in (here, Path.cwd() / "deploy"):
        if (d / "prometheus.yml").is_file():
            return d
    raise StackError("deploy/prometheus.yml not found: run from a ranksight checkout "
                     "(pip install -e . keeps deploy/ next to the package)")


def render_prometheus_config(template: str, targets: Sequence[str], alertmanager: str, rule_glob: str,
                             scrape_interval: Optional[str] = None,
                             evaluation_interval: Optional[str] = None,
                             scrape_options: Optional[Mapping[str, Any]] = None) -> str:
    """deploy/prometheus.yml with the ranksight-agent targets, the Alertmanager address and
    the rules path replaced; everything else (honor_labels, timeouts) is kept. ``scrape_options``
    are Prometheus scrape_config keys (scheme, tls_config, basic_auth) set on the agents' job."""
    try:
        doc = yaml.safe_load(template)
    except yaml.YAMLError as e:
        raise StackError(f"deploy/prometheus.yml: invalid YAML ({e.__class__.__name__})") from None
    jobs = [j for j in doc.get("scrape_configs") or [] if j.get("job_name") == triage.SCRAPE_JOB]
    if len(jobs) != 1:
        raise StackError(f"deploy/prometheus.yml: expected one scrape job named {triage.SCRAPE_JOB!r}")
    jobs[0]["static_configs"] = [{"targets": list(targets)}]
    jobs[0].update(dict(scrape_options or {}))
    doc["rule_files"] = [rule_glob]
    doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    g = doc.setdefault("global", {})
    if scrape_interval:
        g["scrape_interval"] = scrape_interval
        if config.duration_seconds(g.get("scrape_timeout", "10s")) > config.duration_seconds(scrape_interval):
            g["scrape_timeout"] = scrape_interval
    if evaluation_interval:
        g["evaluation_interval"] = evaluation_interval
    head = "# Rendered by `ranksight stack` from deploy/prometheus.yml. Do not edit: edit that file.\n"
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def render_alert_files(cfg: Mapping[str, Any]) -> Dict[str, str]:
    """Rules, alertmanager.yml and its templates for cfg, from ranksight.alerts.generate.render
    (not the fragment for merging into another Alertmanager, nor the runbooks)."""
    try:
        from ranksight.alerts import generate
    except ImportError as e:
        raise StackError(f"cannot render the rules: ranksight.alerts.generate is not importable ({e})") from None
    return {k: v for k, v in generate.render(cfg).items()
            if ("/" not in k and k != generate.notify.FRAGMENT_FILE) or k.startswith(TEMPLATES_DIR + "/")}


def rules_prometheus(d: Path, targets: Sequence[str], binary: Optional[str] = None, profile: str = "test",
                     interval: str = "1s") -> Any:
    """A Prometheus (``servers.Server``, not started) in ``d`` that scrapes ``targets`` and evaluates
    ``profile``'s generated rules every ``interval``, its alerts sent nowhere: the checks that read
    a rule's value from a real run (tests/gpu, bench/multigpu)."""
    from ..common import servers

    (d / "rules").mkdir(parents=True, exist_ok=True)
    for name, text in render_alert_files(config.load(None, profile)).items():
        if name.endswith((".yml", ".yaml")) and name != "alertmanager.yml":
            (d / "rules" / name).write_text(text)
    (d / "prometheus.yml").write_text(render_prometheus_config(
        (deploy_dir() / "prometheus.yml").read_text(), list(targets), "127.0.0.1:9", str(d / "rules" / "*.yml"),
        interval, interval))
    return servers.prometheus(d / "prometheus.yml", d / "data", d / "prometheus.log", binary=binary)
