"""Bearer API keys: the key file (each key a tenant, by name), constant-time checks, the middleware and SIGHUP
reload."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from aiohttp import hdrs, web

from ...head.errors import Category, ClefError
from .body import BadHeader, header
from .context import INFO
from .routes import PATHS, PUBLIC  # with auth on, only PUBLIC answer without a key; none names a model

METRICS_PATH = PATHS["metrics"]

log = logging.getLogger("clef_bridge.auth")

CHALLENGE = 'Bearer realm="clef-bridge"'  # the WWW-Authenticate of every 401 (RFC 9110 section 11.6.1)
AZURE_KEY = "api-key"  # where Azure OpenAI's clients put the key, without Authorization


class Unauthorized(ClefError):
    category = Category.UNAUTHORIZED
    error_type = "authentication_error"


class ApiKeysError(ClefError):
    """The api_keys_file cannot be read or holds no key."""

    category = Category.CONFIG
    error_type = "api_keys_error"


@dataclass(frozen=True)
class Tenant:
    """Who a request comes from: the key that authenticated it, by its name (logs and metrics show the name, never
    the key), or one anonymous tenant when auth is off. Caches, coalescing and queues are kept apart per tenant."""

    name: str
    metrics: bool = False  # the key reads /metrics, and only that (scope=metrics)


ANONYMOUS = Tenant("anonymous")
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SCOPES = ("decisions", "metrics")  # what a key may do: decide (every model route), or read /metrics alone


class ForbiddenScope(ClefError):
    """A valid key used for what its scope does not allow."""

    category = Category.FORBIDDEN
    error_type = "permission_error"


def key_name(key: bytes) -> str:
    """An unnamed key's name: a digest prefix, stable across reloads and never the key."""
    return "key-" + hashlib.sha256(key).hexdigest()[:8]


def parse_keys(text: str, path: Path) -> tuple[tuple[bytes, Tenant], ...]:
    """api_keys_file's lines: `KEY [name=NAME] [scope=decisions|metrics]`, # comments; every problem at once."""
    keys, names, problems = [], {}, []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        # a comment starts at a field beginning with #: a key may hold # (key#1 stays whole)
        fields = fields[:next((i for i, f in enumerate(fields) if f.startswith("#")), len(fields))]
        if not fields:
            continue
        key, options = fields[0].encode(), dict(f.partition("=")[::2] for f in fields[1:])
        unknown = sorted(set(options) - {"name", "scope"}) + [f for f in fields[1:] if "=" not in f]
        name = options.get("name") or key_name(key)
        scope = options.get("scope", "decisions")
        if unknown:
            problems.append(f"line {n}: unknown field(s) {unknown}; a line is KEY [name=NAME] [scope=decisions|metrics]")
        if not NAME.fullmatch(name):
            problems.append(f"line {n}: name {name[:80]!r} must be 1 to 64 letters, digits, '_', '.' or '-'")
        if scope not in SCOPES:
            problems.append(f"line {n}: scope {scope[:40]!r} must be decisions or metrics")
        if name in names and names[name] != key:
            problems.append(f"line {n}: name {name!r} names two keys; each key's name must be its own")
        names[name] = key
        keys.append((key, Tenant(name, scope == "metrics")))
    if problems:
        raise ApiKeysError(f"{path}: " + "; ".join(problems))
    if not keys:
        raise ApiKeysError(f"{path}: no API keys in the file; add one per line or remove api_keys_file")
    return tuple(keys)


class ApiKeys:
    """Bearer keys from a file, one per line with an optional name and scope (# comments allowed); reloadable."""

    def __init__(self, path: Path | None):
        self.path = path
        self.keys: tuple[tuple[bytes, Tenant], ...] = ()
        self.reload()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def reload(self) -> None:
        if self.path is None:
            return
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiKeysError(f"api_keys_file {self.path}: cannot read: {exc}") from None
        self.keys = parse_keys(text, self.path)

    def check(self, authorization: str | None) -> Tenant:
        """The tenant whose key this Authorization carries (ANONYMOUS with auth off); 401 otherwise."""
        if not self.enabled:
            return ANONYMOUS
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():  # the scheme is case-insensitive (RFC 9110 11.1)
            raise Unauthorized("missing API key: send Authorization: Bearer YOUR_KEY")
        given = token.strip().encode()
        found = None
        for key, tenant in self.keys:  # compare with every key, in constant time each
            if hmac.compare_digest(given, key):
                found = tenant
        if found is None:
            raise Unauthorized("invalid API key")
        return found


TENANT = web.RequestKey("clef_tenant", Tenant)


def auth_middleware(keys_key: web.AppKey) -> Callable:
    """Middleware checking every non-public route against the ApiKeys stored under keys_key; the request's Tenant
    goes in request[TENANT], its name in the access log. A metrics key reads /metrics only; with auth on, a
    decision key never reads it."""
    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        keys = request.app[keys_key]
        request[TENANT] = ANONYMOUS
        if keys.enabled and request.path not in PUBLIC:
            try:
                authorization = header(request, hdrs.AUTHORIZATION)
                key = header(request, AZURE_KEY) if authorization is None else None
            except BadHeader:
                raise Unauthorized("invalid API key: the Authorization header is not valid UTF-8") from None
            if key:  # Azure OpenAI's clients (litellm's azure provider) send the key alone
                authorization = f"Bearer {key}"
            tenant = keys.check(authorization)
            if tenant.metrics != (request.path == METRICS_PATH):
                request[INFO].tenant = tenant.name
                raise ForbiddenScope(
                    f"key {tenant.name!r} reads /metrics only (scope=metrics in api_keys_file)" if tenant.metrics else
                    f"key {tenant.name!r} may not read /metrics: every tenant's traffic is there; give Prometheus a "
                    "key of its own with scope=metrics in api_keys_file")
            request[TENANT], request[INFO].tenant = tenant, tenant.name
        return await handler(request)
    return middleware


def install_sighup(keys: ApiKeys) -> None:
    """Reload the keys on SIGHUP (where the platform and thread allow signal handlers)."""
    if not keys.enabled:
        return

    def reload() -> None:
        try:
            keys.reload()
            log.info("reloaded %d API keys from %s", len(keys.keys), keys.path)
        except (OSError, ClefError) as exc:
            log.error("keeping the old API keys: %s", exc)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests) or no SIGHUP
        log.debug("SIGHUP key reload is not available in this thread")
