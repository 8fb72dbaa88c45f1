"""On-call receivers and severity routes: the ``alerting.receivers`` and ``alerting.routes``
config keys, validated here; ``ranksight rules`` turns them into Alertmanager receivers
(ranksight.alerts.generate).

    alerting:
      receivers:
        pager: {type: pagerduty, routing_key_file: /etc/ranksight/pagerduty-key}
        chat:  {type: slack, api_url_file: /etc/ranksight/slack-url, channel: "#train-oncall"}
      routes: {critical: pager, warning: chat, info: none, lint: chat}   # the defaults

Secrets are never written in the config: each receiver names a file that Alertmanager
reads itself (its ``*_file`` fields, all accepted by Alertmanager 0.25). A webhook's URL
is plain, because 0.25 has no ``url_file`` for webhooks.

With no receivers and no routes configured, every ranksight alert goes to the built-in
``webhook`` receiver (``alerting.webhook_url``). Otherwise each route (``critical``,
``warning``, ``info``, and ``lint`` for the setup lints, whatever their severity) names a
receiver, a list of them, ``none`` (dropped) or ``webhook``; unset routes take
``DEFAULT_ROUTES``.

Structure is checked when the config loads (``check_receivers``, ``check_routes``,
``check_refs``). That the secret files exist and hold what they should is checked when
the Alertmanager config is rendered (``check_secrets``): agents on other nodes load the
same config without those files.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Tuple, Union

from .errors import ConfigError

NONE = "none"  # route target: drop
WEBHOOK = "webhook"  # route target: the built-in receiver at alerting.webhook_url
ROUTE_KEYS = ("critical", "warning", "info", "lint")
DEFAULT_ROUTES: Dict[str, Union[str, List[str]]] = {"critical": "pager", "warning": "chat", "info": NONE,
                                                    "lint": "chat"}

_URL = re.compile(r"https?://[^\s/]+(/\S*)?")
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_ADDRS = re.compile(r"[^@\s,]+@[^@\s,]+(\s*,\s*[^@\s,]+@[^@\s,]+)*")
_HOSTPORT = re.compile(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})")

# type -> field -> kind. kind: "secret-url" / "secret": a file path whose content Alertmanager
# reads (an http(s) URL / a non-empty token); "url"; "str"; "addrs" (mail addresses);
# "hostport"; "bool". REQUIRED names the fields each type must have.
FIELDS: Dict[str, Dict[str, str]] = {
    "slack": {"api_url_file": "secret-url", "channel": "str", "send_resolved": "bool"},
    "pagerduty": {"routing_key_file": "secret", "url": "url", "send_resolved": "bool"},
    "email": {"to": "addrs", "from": "addrs", "smarthost": "hostport", "auth_username": "str",
              "auth_password_file": "secret", "require_tls": "bool", "send_resolved": "bool"},
    "opsgenie": {"api_key_file": "secret", "api_url": "url", "send_resolved": "bool"},
    "webhook": {"url": "url", "send_resolved": "bool", "credentials_file": "secret"},
}
REQUIRED: Dict[str, Tuple[str, ...]] = {
    "slack": ("api_url_file",),
    "pagerduty": ("routing_key_file",),
    "email": ("to", "from", "smarthost"),
    "opsgenie": ("api_key_file",),
    "webhook": ("url",),
}
SECRET_KINDS = ("secret", "secret-url")


def _load_yaml_string(where: str, value: Any) -> Any:
    """Env overrides arrive as strings: RANKSIGHT__alerting__receivers='{chat: {type: slack, ...}}'."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        return yaml.safe_load(value) if value.strip() else {}
    except yaml.YAMLError:
        raise ConfigError(f"config {where}: expected a YAML mapping, got {value!r}") from None


def _field(where: str, kind: str, value: Any) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"config {where}: expected true or false, got {value!r}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"config {where}: expected a non-empty string, got {value!r}")
    if kind in SECRET_KINDS and not value.startswith("/"):
        raise ConfigError(f"config {where}: expected an absolute path to a file that Alertmanager reads, got {value!r}")
    if kind == "url" and not _URL.fullmatch(value):
        raise ConfigError(f"config {where}: expected an absolute http:// or https:// URL, got {value!r}")
    if kind == "addrs" and not _ADDRS.fullmatch(value.strip()):
        raise ConfigError(f"config {where}: expected mail addresses like oncall@example.com, got {value!r}")
    if kind == "hostport":
        m = _HOSTPORT.fullmatch(value)
        if not m or not 0 < int(m.group(2)) < 65536:
            raise ConfigError(f"config {where}: expected host:port of the SMTP server, got {value!r}")
    return value


def check_receivers(value: Any) -> Dict[str, Dict[str, Any]]:
    """alerting.receivers: name -> {type, fields}. Raises ConfigError naming the bad key."""
    value = _load_yaml_string("alerting.receivers", value)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"config alerting.receivers: expected a mapping of receiver names, got {value!r}")
    out: Dict[str, Dict[str, Any]] = {}
    for name, spec in value.items():
        where = f"alerting.receivers.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (NONE, WEBHOOK):
            raise ConfigError(f"config {where}: a receiver name is lower-case letters, digits, - and _ "
                              f"(and not {NONE} or {WEBHOOK}), got {name!r}")
        if not isinstance(spec, Mapping):
            raise ConfigError(f"config {where}: expected a mapping with a type, got {spec!r}")
        kind = spec.get("type")
        if kind not in FIELDS:
            raise ConfigError(f"config {where}.type: unknown receiver type {kind!r} "
                              f"(known: {', '.join(FIELDS)})")
        fields = FIELDS[kind]
        checked: Dict[str, Any] = {"type": kind}
        for key, v in spec.items():
            if key == "type":
                continue
            if key not in fields:
                raise ConfigError(f"config {where}.{key}: unknown key for a {kind} receiver "
                                  f"(known: {', '.join(fields)})")
            checked[key] = _field(f"{where}.{key}", fields[key], v)
        for key in REQUIRED[kind]:
            if key not in checked:
                raise ConfigError(f"config {where}.{key}: a {kind} receiver needs {key}")
        if "auth_password_file" in checked and "auth_username" not in checked:
            raise ConfigError(f"config {where}.auth_username: auth_password_file needs auth_username")
        out[name] = checked
    return out


def check_routes(value: Any) -> Dict[str, List[str]]:
    """alerting.routes: severity (or lint) -> receiver names. Only the keys given; the
    defaults are applied by effective_routes."""
    value = _load_yaml_string("alerting.routes", value)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"config alerting.routes: expected a mapping like {{critical: pager}}, got {value!r}")
    out: Dict[str, List[str]] = {}
    for key, v in value.items():
        where = f"alerting.routes.{key}"
        if key not in ROUTE_KEYS:
            raise ConfigError(f"config {where}: unknown route (known: {', '.join(ROUTE_KEYS)})")
        names = [v] if isinstance(v, str) else v
        if (not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names)
                or len(set(names)) != len(names)):
            raise ConfigError(f"config {where}: expected a receiver name or a list of distinct names, got {v!r}")
        if NONE in names and len(names) > 1:
            raise ConfigError(f"config {where}: {NONE} cannot be combined with receivers, got {v!r}")
        out[key] = list(names)
    return out


def effective_routes(alerting: Mapping[str, Any]) -> Dict[str, List[str]]:
    """route key -> receiver names ([] for none). Everything to the webhook when nothing is configured."""
    receivers, routes = alerting.get("receivers") or {}, alerting.get("routes") or {}
    if not receivers and not routes:
        return {k: [WEBHOOK] for k in ROUTE_KEYS}
    merged = {k: ([v] if isinstance(v, str) else list(v)) for k, v in DEFAULT_ROUTES.items()}
    merged.update(routes)
    return {k: [] if merged[k] == [NONE] else merged[k] for k in ROUTE_KEYS}


def check_refs(alerting: Mapping[str, Any]) -> None:
    """Every route names a defined receiver, none or webhook."""
    receivers = alerting.get("receivers") or {}
    for key, names in effective_routes(alerting).items():
        for n in names:
            if n != WEBHOOK and n not in receivers:
                defined = ", ".join(receivers) or "no receivers"
                given = "" if key in (alerting.get("routes") or {}) else " (the default route)"
                raise ConfigError(f"config alerting.routes.{key}: no receiver named {n!r}{given}; "
                                  f"alerting.receivers defines {defined}; {NONE} and {WEBHOOK} are built in")


def check_secrets(alerting: Mapping[str, Any]) -> None:
    """Each secret file exists and holds what Alertmanager will read from it. The content is
    never printed."""
    for name, spec in (alerting.get("receivers") or {}).items():
        for key, kind in FIELDS[spec["type"]].items():
            if key not in spec or kind not in SECRET_KINDS:
                continue
            where = f"alerting.receivers.{name}.{key}"
            try:
                text = Path(spec[key]).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise ConfigError(f"config {where}: cannot read {spec[key]}: {e.strerror or e}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"config {where}: {spec[key]} is not a UTF-8 text file") from None
            if not text:
                raise ConfigError(f"config {where}: {spec[key]} is empty")
            if kind == "secret-url" and not _URL.fullmatch(text):
                raise ConfigError(f"config {where}: {spec[key]} does not hold an absolute http:// or https:// URL")
