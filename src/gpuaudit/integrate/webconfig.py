"""Prometheus' standard web configuration file (``--web.config.file``) for the exporter.

The same YAML the Prometheus server and every official exporter read (prometheus/exporter-
toolkit, ``docs/web-configuration.md``)::

    tls_server_config:
      cert_file: server.crt
      key_file: server.key
    basic_auth_users:
      prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

TLS wraps each connection (the handshake runs in the connection's own thread, under the read
timeout, so a client that never completes it holds nothing else up). Basic auth checks the
bcrypt hash once per distinct credential and remembers a success (bcrypt costs ~50-100 ms by
design; a scrape every 15 s must not pay it each time), as the exporter-toolkit does. Other
keys of the format (client certificates, HTTP/2, headers) are refused by name rather than
silently ignored. PyYAML and bcrypt load only when a file is given (``gpuaudit[exporter-auth]``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuaudit.errors import InputError, MissingExtraError

__all__ = ["WebConfig", "load_web_config"]

_KNOWN_TOP = {"tls_server_config", "basic_auth_users"}
_KNOWN_TLS = {"cert_file", "key_file", "min_version"}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}


@dataclass
class WebConfig:
    """What a web configuration file asks for: a TLS context and the allowed users."""

    path: str
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    _ok: set[bytes] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def authorised(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header passes (always, without users)."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode(
                "utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(hashed + b"\0" + password.encode("utf-8")).digest()
        with self._lock:
            if any(hmac.compare_digest(key, k) for k in self._ok):
                return True
        import bcrypt

        if not bcrypt.checkpw(password.encode("utf-8"), hashed):
            return False
        with self._lock:
            self._ok.add(key)
        return True


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check a web configuration file; every mistake names the key and the fix."""
    p = Path(path)
    try:
        import yaml
    except ImportError as exc:
        raise MissingExtraError("--web.config.file needs PyYAML and bcrypt",
                                extra="exporter-auth") from exc
    try:
        doc = yaml.safe_load(p.read_text("utf-8")) or {}
    except OSError as exc:
        raise InputError(f"cannot read the web config: {exc.strerror or exc}", where=str(p),
                         fix="give a readable YAML file (docs/dashboards-and-alerts.md)"
                         ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"the web config is not valid YAML: {exc}", where=str(p),
                         fix="see Prometheus' web configuration format") from None
    if not isinstance(doc, dict):
        raise InputError("the web config must be a mapping", where=str(p),
                         fix="top-level keys: tls_server_config, basic_auth_users")
    unknown = sorted(set(doc) - _KNOWN_TOP)
    if unknown:
        raise InputError(f"unsupported web config key(s) {unknown}", where=str(p),
                         fix=f"gpuaudit's exporter supports {sorted(_KNOWN_TOP)}")
    cfg = WebConfig(path=str(p))
    tls = doc.get("tls_server_config")
    if tls is not None:
        cfg.tls = _tls_context(tls, p)
    users = doc.get("basic_auth_users")
    if users is not None:
        cfg.users = _users(users, p)
    return cfg


def _tls_context(tls: Any, p: Path) -> ssl.SSLContext:
    where = f"{p}: tls_server_config"
    if not isinstance(tls, dict):
        raise InputError("tls_server_config must be a mapping", where=where,
                         fix="give cert_file and key_file")
    unknown = sorted(set(tls) - _KNOWN_TLS)
    if unknown:
        raise InputError(f"unsupported TLS key(s) {unknown}", where=where,
                         fix=f"supported: {sorted(_KNOWN_TLS)}")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise InputError("tls_server_config needs cert_file and key_file", where=where,
                         fix="give the server certificate and its key (PEM)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _TLS_VERSIONS.get(str(tls.get("min_version", "TLS12")),
                                            ssl.TLSVersion.TLSv1_2)
    base = p.parent  # relative paths are relative to the config file, as Prometheus does
    cert, key = (base / str(tls["cert_file"]), base / str(tls["key_file"]))
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"cannot load the certificate or key: {exc}", where=where,
                         fix="give PEM files the exporter can read (cert_file, key_file)"
                         ) from None
    return ctx


def _users(users: Any, p: Path) -> dict[str, bytes]:
    where = f"{p}: basic_auth_users"
    if not isinstance(users, dict) or not users:
        raise InputError("basic_auth_users must map user names to bcrypt hashes", where=where,
                         fix="prometheus: $2y$10$... (htpasswd -nBC 10 '' | tr -d ':\\n')")
    out = {}
    for user, hashed in users.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")):
            raise InputError(f"the password of {user!r} is not a bcrypt hash (content not "
                             "shown)", where=where,
                             fix="store bcrypt hashes, never passwords: htpasswd -nBC 10 ''")
        out[str(user)] = text.encode("ascii")
    return out
