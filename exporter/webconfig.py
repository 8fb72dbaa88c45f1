"""`--web.config.file`: TLS, client certificates, basic auth and headers for /metrics and /healthz.

The file format is the Prometheus exporter-toolkit's (node_exporter, dcgm-exporter), so one file
serves every exporter on a node::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Every path is protected, /healthz too (as exporter-toolkit does): a probe must speak TLS and send
the credentials. Differences from exporter-toolkit, each refused with one line where it matters:

- the file is read once at startup; the certificate, key and client CA files are re-read when they
  change on disk (checked at each new connection), so a rotated certificate needs no restart;
- ``client_auth_type`` RequestClientCert and RequireAnyClientCert (ask for a certificate but do not
  verify it; the toolkit's docs call them insecure) cannot be expressed with Python's ssl: refused;
- ``curve_preferences`` takes one curve (Python's ssl restricts ECDHE to one curve, no list);
- ``cipher_suites`` takes Go's names (``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``) and applies them to
  TLS 1.2 and below; TLS 1.3 suites are accepted and, as in Go, not configurable;
- ``http2`` is accepted and has no effect: the agent serves HTTP/1.1.

Basic auth: a verified (user, password) pair is remembered (as an HMAC of the pair, never the
password), so a scrape every 15 s pays bcrypt once. bcrypt runs one verification at a time outside
the GIL: a flood of wrong passwords costs at most one core and never delays a scrape whose
credentials were verified before; a request that waits more than BCRYPT_WAIT for its turn is
refused (401, not remembered), so a flood holds no thread for long. Wrong pairs are remembered too
(bounded), so a client that keeps sending the same wrong password costs one verification. An unknown user is checked against a dummy
hash, so timing does not tell which users exist.
"""
from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

log = logging.getLogger("ranksight.exporter.web")


class WebConfigError(ValueError):
    """The web config cannot be used; the message is the one line for the user."""


TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
TLS_KEYS = ("cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type", "client_ca_file",
            "client_allowed_sans", "min_version", "max_version", "cipher_suites", "prefer_server_cipher_suites",
            "curve_preferences")
HTTP_KEYS = ("http2", "headers")
RATE_KEYS = ("interval", "burst")

# header -> allowed values (None: any), as exporter-toolkit allows them
HEADERS: Dict[str, Optional[Tuple[str, ...]]] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
            "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# Go's tls.CipherSuites() names -> OpenSSL names (TLS 1.2 and below)
CIPHERS = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
TLS13_CIPHERS = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
GO_DURATION = re.compile(r"(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
SUCCESS_CACHE = 64  # verified (user, password) pairs remembered
FAILURE_CACHE = 256  # wrong pairs remembered (a client repeating one wrong password costs one bcrypt)
BCRYPT_MAX_PASSWORD = 72  # bcrypt uses the first 72 bytes, as htpasswd and Go hash them
BCRYPT_WAIT = 2.0  # seconds a request waits for its turn at bcrypt before it is refused (not remembered)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (Go's yaml.UnmarshalStrict does too)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
    seen = set()
    for k, _ in node.value:
        key = loader.construct_object(k, deep=deep)
        if key in seen:
            raise WebConfigError(f"duplicate key {key!r}")
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


@dataclass
class TLSSettings:
    """tls_server_config, with paths made absolute (relative ones are relative to the web config)."""

    cert_file: str = ""
    key_file: str = ""
    cert: str = ""
    key: str = ""
    client_ca_file: str = ""
    client_ca: str = ""
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: Optional[List[str]] = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: List[str] = field(default_factory=list)
    prefer_server_cipher_suites: bool = True
    curve: str = ""  # the one of curve_preferences

    def files(self) -> Tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def context(self) -> ssl.SSLContext:
        """A server SSLContext from the files as they are now. Raises WebConfigError with one line."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = VERSIONS[self.min_version]
        ctx.maximum_version = VERSIONS[self.max_version]
        if self.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        names = [CIPHERS[c] for c in self.cipher_suites if c in CIPHERS]
        if names:
            ctx.set_ciphers(":".join(names))
        if self.curve:
            ctx.set_ecdh_curve(CURVES[self.curve])
        _load_chain(ctx, self)
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        if self.client_ca_file:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except OSError as e:
                raise WebConfigError(f"client_ca_file {self.client_ca_file}: {_why(e)}") from None
            except ssl.SSLError as e:
                raise WebConfigError(f"client_ca_file {self.client_ca_file}: no PEM certificate ({e.reason})") from None
        elif self.client_ca:
            try:
                ctx.load_verify_locations(cadata=self.client_ca)
            except ssl.SSLError as e:
                raise WebConfigError(f"client_ca: no PEM certificate ({e.reason})") from None
        elif ctx.verify_mode != ssl.CERT_NONE:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # Go verifies against the system roots then
        return ctx


def _why(e: OSError) -> str:
    return (e.strerror or str(e)).lower()


def _load_chain(ctx: ssl.SSLContext, t: TLSSettings) -> None:
    """load_cert_chain takes files only: an inline cert or key goes through a private temp file."""
    tmp: List[str] = []
    try:
        paths = []
        for name, path, inline in (("cert_file", t.cert_file, t.cert), ("key_file", t.key_file, t.key)):
            if path:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as e:
                    raise WebConfigError(f"{name} {path}: {_why(e)}") from None
                paths.append(path)
            else:
                fd, p = tempfile.mkstemp(prefix="ranksight-web-", suffix=".pem")  # mode 0600
                tmp.append(p)
                with os.fdopen(fd, "w") as f:
                    f.write(inline)
                paths.append(p)
        try:
            ctx.load_cert_chain(paths[0], paths[1])
        except ssl.SSLError as e:
            raise WebConfigError(f"certificate and key do not load as a PEM pair ({e.reason or e})") from None
        except OSError as e:
            raise WebConfigError(f"certificate and key: {_why(e)}") from None
    finally:
        for p in tmp:
            os.unlink(p)


@dataclass
class WebConfig:
    path: str
    tls: Optional[TLSSettings] = None
    users: Dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Dict[str, str] = field(default_factory=dict)
    rate_interval: float = 0.0  # seconds between requests; 0: no rate limit
    rate_burst: int = 0

    def describe(self) -> str:
        parts = []
        if self.tls is not None:
            parts.append({"NoClientCert": "TLS", "VerifyClientCertIfGiven": "TLS, client certificates verified if given",
                          "RequireAndVerifyClientCert": "TLS, client certificates required"}[self.tls.client_auth_type])
        if self.users:
            parts.append(f"basic auth ({len(self.users)} user{'s' if len(self.users) != 1 else ''})")
        if self.rate_interval:
            parts.append(f"rate limit every {self.rate_interval:g} s, burst {self.rate_burst}")
        return ", ".join(parts) or "plain HTTP, no auth"


def _mapping(v: Any, where: str, keys: Tuple[str, ...]) -> Dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise WebConfigError(f"{where}: expected a mapping, got {type(v).__name__}")
    for k in v:
        if k not in keys:
            raise WebConfigError(f"{where}: unknown key {k!r} (expected one of {', '.join(keys)})")
    return v


def _string(v: Any, where: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise WebConfigError(f"{where}: expected a string, got {type(v).__name__}")
    return v


def _strings(v: Any, where: str) -> List[str]:
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise WebConfigError(f"{where}: expected a list of strings")
    return list(v)


def _duration(v: Any, where: str) -> float:
    """A Go duration ("1s", "1m30s", "250ms"); an integer is nanoseconds, as yaml.v2 reads it."""
    if type(v) is int:
        return v * 1e-9
    s = _string(v, where)
    if s in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for m in GO_DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * DURATION_UNITS[m.group(3)]
        pos = m.end()
    if pos != len(s):
        raise WebConfigError(f"{where}: {s!r} is not a duration like 1s or 250ms")
    return total


def load(path: str) -> WebConfig:
    """Read and check the web config and everything it names. Raises WebConfigError with one line
    (prefixed with the file name)."""
    try:
        return _load(path)
    except WebConfigError as e:
        raise WebConfigError(f"web config {path}: {e}") from None


def _load(path: str) -> WebConfig:
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise WebConfigError(_why(e)) from None
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise WebConfigError(f"invalid YAML{where}") from None
    top = _mapping(doc, "top level", TOP_KEYS)
    base = os.path.dirname(os.path.abspath(path))
    wc = WebConfig(path=path)
    wc.tls = _tls(_mapping(top.get("tls_server_config"), "tls_server_config", TLS_KEYS), base)
    http = _mapping(top.get("http_server_config"), "http_server_config", HTTP_KEYS)
    if "http2" in http and type(http["http2"]) is not bool:
        raise WebConfigError("http_server_config.http2: expected true or false")
    headers = _mapping(http.get("headers"), "http_server_config.headers", tuple(HEADERS))
    for k, v in headers.items():
        v = _string(v, f"http_server_config.headers.{k}")
        allowed = HEADERS[k]
        if allowed is not None and v not in allowed:
            raise WebConfigError(f"http_server_config.headers.{k}: {v!r}, expected one of {', '.join(allowed)}")
        if v:
            wc.headers[k] = v
    users = top.get("basic_auth_users")
    if users is not None and not isinstance(users, dict):
        raise WebConfigError(f"basic_auth_users: expected a mapping of user: bcrypt hash, got {type(users).__name__}")
    for user, h in (users or {}).items():
        if not isinstance(user, str) or not isinstance(h, str):
            raise WebConfigError("basic_auth_users: expected user: bcrypt hash strings")
        if not BCRYPT_HASH.fullmatch(h):
            raise WebConfigError(f"basic_auth_users.{user}: not a bcrypt hash ($2y$10$ and 53 characters; "
                                 "make one with htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        wc.users[user] = h.encode()
    if wc.users:
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise WebConfigError("basic_auth_users needs the bcrypt package (pip install bcrypt)") from None
    rate = _mapping(top.get("rate_limit"), "rate_limit", RATE_KEYS)
    wc.rate_interval = _duration(rate.get("interval", 0), "rate_limit.interval")
    burst = rate.get("burst", 0)
    if type(burst) is not int or burst < 0:
        raise WebConfigError("rate_limit.burst: expected a non-negative integer")
    if wc.rate_interval < 0:
        raise WebConfigError("rate_limit.interval: must not be negative")
    wc.rate_burst = burst
    if wc.tls is not None:
        wc.tls.context()  # every file readable, the pair loads, the CA parses
    return wc


def _tls(d: Dict[str, Any], base: str) -> Optional[TLSSettings]:
    t = TLSSettings()
    for k in ("cert", "key", "client_ca"):
        setattr(t, k, _string(d.get(k), f"tls_server_config.{k}"))
    for k in ("cert_file", "key_file", "client_ca_file"):
        p = _string(d.get(k), f"tls_server_config.{k}")
        setattr(t, k, os.path.join(base, p) if p else "")
    auth = _string(d.get("client_auth_type"), "tls_server_config.client_auth_type")
    enabled = bool(t.cert or t.key or t.client_ca or t.cert_file or t.key_file or t.client_ca_file or auth)
    if not enabled:
        return None
    if not (t.cert_file or t.cert):
        raise WebConfigError("tls_server_config: missing one of cert or cert_file")
    if not (t.key_file or t.key):
        raise WebConfigError("tls_server_config: missing one of key or key_file")
    auth = auth or "NoClientCert"
    if auth in UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth}: not supported here (it takes a client "
                             "certificate without verifying it); use RequireAndVerifyClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config.client_auth_type {auth!r}: expected one of {', '.join(CLIENT_AUTH)}")
    t.client_auth_type = auth
    if (t.client_ca_file or t.client_ca) and auth == "NoClientCert":
        raise WebConfigError("tls_server_config: a client CA is configured but client_auth_type is NoClientCert "
                             "(use RequireAndVerifyClientCert)")
    if "client_allowed_sans" in d:
        t.client_allowed_sans = _strings(d["client_allowed_sans"], "tls_server_config.client_allowed_sans")
        if auth != "RequireAndVerifyClientCert":
            raise WebConfigError("tls_server_config.client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
    for k in ("min_version", "max_version"):
        if k in d:
            v = _string(d[k], f"tls_server_config.{k}")
            if v not in VERSIONS:
                raise WebConfigError(f"tls_server_config.{k} {v!r}: expected one of {', '.join(VERSIONS)}")
            setattr(t, k, v)
    if VERSIONS[t.min_version] > VERSIONS[t.max_version]:
        raise WebConfigError(f"tls_server_config: min_version {t.min_version} is above max_version {t.max_version}")
    for c in _strings(d.get("cipher_suites"), "tls_server_config.cipher_suites"):
        if c not in CIPHERS and c not in TLS13_CIPHERS:
            raise WebConfigError(f"tls_server_config.cipher_suites: unknown cipher {c!r} (Go names, e.g. "
                                 "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)")
        t.cipher_suites.append(c)
    if "prefer_server_cipher_suites" in d:
        if type(d["prefer_server_cipher_suites"]) is not bool:
            raise WebConfigError("tls_server_config.prefer_server_cipher_suites: expected true or false")
        t.prefer_server_cipher_suites = d["prefer_server_cipher_suites"]
    curves = _strings(d.get("curve_preferences"), "tls_server_config.curve_preferences")
    for c in curves:
        if c not in CURVES:
            raise WebConfigError(f"tls_server_config.curve_preferences: unknown curve {c!r} "
                                 f"(expected one of {', '.join(CURVES)})")
    if len(curves) > 1:
        raise WebConfigError("tls_server_config.curve_preferences: this agent can restrict ECDHE to one curve only")
    t.curve = curves[0] if curves else ""
    return t


class Gate:
    """What the HTTP handler asks per connection and per request: the current SSLContext, the
    client-SAN check, the rate limit and the basic-auth verdict. Thread-safe."""

    def __init__(self, wc: WebConfig):
        self.wc = wc
        self.headers = list(wc.headers.items())
        self._lock = threading.Lock()
        self._ctx: Optional[ssl.SSLContext] = None
        self._stamp: Tuple[Any, ...] = ()
        self._reload_error = ""
        if wc.tls is not None:
            self._stamp = self._stat()
            self._ctx = wc.tls.context()
        self._key = secrets.token_bytes(32)
        self._good: "collections.OrderedDict[bytes, None]" = collections.OrderedDict()
        self._bad: "collections.OrderedDict[bytes, None]" = collections.OrderedDict()
        self._bcrypt = threading.Lock()  # one verification at a time
        self._dummy = b""
        if wc.users:
            import bcrypt

            cost = max(int(h[4:6]) for h in wc.users.values())
            self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(cost))
        self._tokens = float(max(wc.rate_burst, 1))
        self._tokens_at = time.monotonic()

    # ---------------------------------------------------------------- TLS
    @property
    def tls(self) -> bool:
        return self._ctx is not None

    def _stat(self) -> Tuple[Any, ...]:
        assert self.wc.tls is not None
        out = []
        for p in self.wc.tls.files():
            try:
                st = os.stat(p)
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def context(self) -> ssl.SSLContext:
        """The SSLContext for a new connection; rebuilt when a certificate, key or CA file changed.
        A file that no longer loads keeps the previous context (logged once per distinct error)."""
        assert self._ctx is not None and self.wc.tls is not None
        stamp = self._stat()
        if stamp == self._stamp:
            return self._ctx
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._ctx = self.wc.tls.context()
                    self._stamp = stamp
                    self._reload_error = ""
                    log.info("web config: reloaded the TLS certificate files")
                except WebConfigError as e:
                    if str(e) != self._reload_error:
                        self._reload_error = str(e)
                        log.warning("web config: keeping the previous certificates: %s", e)
            return self._ctx

    def san_ok(self, cert: Optional[Mapping[str, Any]]) -> bool:
        """client_allowed_sans: some DNS, IP, email or URI SAN of the client certificate is listed."""
        allowed = self.wc.tls.client_allowed_sans if self.wc.tls is not None else None
        return allowed is None or has_san(cert, allowed)

    # ---------------------------------------------------------------- requests
    def allow(self) -> bool:
        """rate_limit: a token bucket of ``burst`` requests refilled every ``interval``."""
        if not self.wc.rate_interval:
            return True
        with self._lock:
            now = time.monotonic()
            cap = float(max(self.wc.rate_burst, 1))
            self._tokens = min(cap, self._tokens + (now - self._tokens_at) / self.wc.rate_interval)
            self._tokens_at = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    def authorized(self, header: Optional[str]) -> bool:
        """Basic auth for one request (True when no users are configured)."""
        users = self.wc.users
        if not users:
            return True
        creds = _basic(header)
        if creds is None:
            return False
        user, password = creds
        digest = hmac.new(self._key, len(user).to_bytes(4, "big") + user + password, hashlib.sha256).digest()
        with self._lock:
            if digest in self._good:
                return True
            if digest in self._bad:
                return False
        name = user.decode("utf-8", "surrogateescape")
        hashed = users.get(name)
        verdict = self._verify(password, hashed if hashed is not None else self._dummy)
        if verdict is None:
            return False
        ok = verdict and hashed is not None
        cache, cap = (self._good, SUCCESS_CACHE) if ok else (self._bad, FAILURE_CACHE)
        with self._lock:
            cache[digest] = None
            while len(cache) > cap:
                cache.popitem(last=False)
        return ok

    def _verify(self, password: bytes, hashed: bytes) -> Optional[bool]:
        """bcrypt's verdict, or None when the turn did not come within BCRYPT_WAIT."""
        import bcrypt

        if not self._bcrypt.acquire(timeout=BCRYPT_WAIT):
            return None
        try:
            return bcrypt.checkpw(password[:BCRYPT_MAX_PASSWORD], hashed)
        except ValueError:
            return False
        finally:
            self._bcrypt.release()


def has_san(cert: Optional[Mapping[str, Any]], allowed: List[str]) -> bool:
    """Some DNS, IP, email or URI SAN of a verified peer certificate (``getpeercert()``) is in ``allowed``."""
    if not cert:
        return False
    want = set(allowed)
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                pass
        if value in want:
            return True
    return False


def _basic(header: Optional[str]) -> Optional[Tuple[bytes, bytes]]:
    """(user, password) of an ``Authorization: Basic`` header, or None (as Go's Request.BasicAuth)."""
    if not header or len(header) < 6 or header[:6].lower() != "basic ":
        return None
    try:
        raw = base64.b64decode(header[6:].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    return user, password
